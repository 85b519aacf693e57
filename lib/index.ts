// nodetron: distributed LLM training for TypeScript. The public API, re-exported from its modules.
export * from './errors.js';
export { type DType, DTYPES, dtypeSize, isFloating } from './dtype.js';
export { type Device, type DeviceLike, parseDevice, setCudaDevice } from './device.js';
export { Tensor, type TensorOptions, empty } from './tensor.js';
export { tensor, zeros, ones, full, arange, rand, randn, randomShard, type RandomOptions } from './creation.js';
export { Generator, manualSeed, defaultGenerator } from './random.js';
export { scope, keep, memoryStats, resetPeakMemory, emptyCache, type MemoryStats } from './memory.js';
export * from './ops/index.js';
export { backward, detach, zeroGrad, noGrad, enableGrad, isGradEnabled, recompute, checkpoint, registerPostAccumulateGradHook, queueBackwardCallback, deferWeightGrads, DeferredWeightGrads, type DeferWeightGradsOptions, type DeferredBackward, type BackwardOptions, type PostAccumulateGradHook, type RemovableHandle } from './autograd/index.js';
export { info, type Info } from './info.js';
export * as cuda from './cuda/index.js';
export {
  autocast, autocastDtypeFor, autocastState, autocastStats, resetAutocastStats, type AutocastStats, GradScaler, type GradScalerOptions, MasterWeights, type LowPrecision,
  AUTOCAST_LOW_PRECISION_OPS, AUTOCAST_F32_OPS,
} from './amp.js';
export { version } from './version.js';
export * as distributed from './distributed/index.js';
export * as nn from './nn/index.js';
export * as optim from './optim/index.js';
export { trainStep, evaluate, type LossModel, type TrainStepOptions, type TrainStepResult } from './step.js';
export * as parallel from './parallel/index.js';
export * as ckpt from './ckpt/index.js';
export * as interop from './interop/index.js';
export * as data from './data/index.js';
export * as plan from './plan/index.js';
export * as train from './train/index.js';
