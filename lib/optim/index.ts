// Optimizers, gradient clipping and learning-rate schedules.
export { Optimizer, type ParamGroup, type ParamsInput, type ParamState, type OptimizerStateDict } from './optimizer.js';
export { AdamW, type AdamWOptions } from './adamw.js';
export { Lamb, type LambOptions } from './lamb.js';
export { SGD, type SGDOptions } from './sgd.js';
export { clipGradNorm, clipGradNormOnDevice, clipFactor, gradSumSquares, scaleGrads } from './clip.js';
export { cosineWithWarmup, type CosineWithWarmupOptions } from './schedule.js';
