// nt.parallel.zero: ZeRO — ZeroOptimizer, one entry point for stages 1 and 2 (optimizer state and
// gradients sharded over the data-parallel group) and 3 (parameters too), and the published formula of
// its model-state memory per rank. The stages' classes are built by ZeroOptimizer: here as types, as
// values (with defaultUnits, ZeRO-3's default gather units) in nodetron/internal.
export {
  ZeroOptimizer, zeroMemoryFormula, type ZeroStage12Optimizer, type ZeroStage3Optimizer, type ShardedOptimizer, type ZeroOptimizerConstructor,
  type ZeroStage12Options, type ZeroStage3Options, type ZeroStepOptions, type ZeroStage, type ZeroOptions, type ZeroParamGroup, type ZeroMemoryBytes,
  type InnerOptimizerFactory, type ZeroAttachOptions, type GradNormScope,
} from './optimizer.js';
export type { ReduceStats } from './stage1-2.js';
export type { GatherStats } from './stage3.js';
