// nodetron: distributed LLM training for TypeScript. The public API, re-exported from its modules, its
// top-level names each listed here; test/docs/public-api.test.ts pins its count of values (at most 330).
// What the package's own commands and tests build on (the planner `plan` included) is nodetron/internal
// (lib/internal.ts); the in-process test groups are nodetron/testing.
export {
  NodetronError, ArgumentError, UsageError, ShapeError, DTypeError, DeviceError, DisposedError, OutOfMemoryError, BackendUnavailableError,
  NativeError, GraphCaptureError, CommError, TimeoutError, AutogradError, StateError, type ErrorCode,
} from './errors.js';
export { type DType, DTYPES, dtypeSize, isFloating } from './dtype.js';
export { type Device, type DeviceLike, parseDevice, setCudaDevice } from './device.js';
export { Tensor, type TensorOptions, empty } from './tensor.js';
export { tensor, zeros, ones, full, arange, rand, randn, randomShard, type RandomOptions } from './creation.js';
export { Generator, manualSeed, defaultGenerator } from './random.js';
export { scope, keep, memoryStats, resetPeakMemory, emptyCache, type MemoryStats } from './memory.js';
export {
  add, sub, mul, div, neg, exp, log, sqrt, tanh, pow, scale, sum, mean, max, matmul, linear, linearGelu, gelu, silu, swiglu, softmax, logSoftmax,
  dropout, rope, layerNorm, rmsNorm, addLayerNorm, attention, attentionPacked, groupedQueryAttention, embedding, cast, crossEntropy,
  linearCrossEntropy, LINEAR_CE_CHUNK_BYTES, reshape, view, squeeze, unsqueeze, permute, transpose, slice, split, chunk, cat,
  type Operand, type ReduceOptions, type MatmulOptions, type DropoutOptions, type RopeOptions, type AddLayerNormResult, type AttentionOptions,
  type CrossEntropyOptions, type LinearCrossEntropyOptions,
} from './ops/index.js';
export { backward, detach, zeroGrad, noGrad, enableGrad, isGradEnabled, recompute, registerPostAccumulateGradHook, queueBackwardCallback, deferWeightGrads, type DeferredWeightGrads, type DeferWeightGradsOptions, type DeferredBackward, type BackwardOptions, type PostAccumulateGradHook, type RemovableHandle } from './autograd/index.js';
export { info, type Info } from './info.js';
export * as cuda from './cuda/index.js';
export {
  autocast, type AutocastOptions, autocastDtypeFor, autocastState, autocastStats, resetAutocastStats, type AutocastStats, GradScaler, type GradScalerOptions, MasterWeights, type LowPrecision,
} from './amp.js';
export { version } from './version.js';
export * as distributed from './distributed/index.js';
export * as nn from './nn/index.js';
export * as optim from './optim/index.js';
export { trainStep, evaluate, captureTrainStep, type CapturedTrainStep, type CaptureTrainStepOptions, type CapturedStepResult, type CapturableModel, type LossModel, type TrainStepOptions, type TrainStepResult } from './step.js';
export * as parallel from './parallel/index.js';
export * as ckpt from './ckpt/index.js';
export * as interop from './interop/index.js';
export * as data from './data/index.js';
export * as train from './train/index.js';
