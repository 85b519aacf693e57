// nodetron/internal: what ops and layers written inside nodetron, or by a library author extending it,
// build on, the plumbing nodetron's own commands and tests reach for, and the layout planner behind
// `nodetron plan`. Not the public API (lib/index.ts is; test/docs/public-api.test.ts checks the two share
// no value): these names may change between versions without notice, and typedoc does not document them.
export { needsGrad, record, save, own, alias, Node, collectLeaves, registerGradAllocator, type BackwardFn, type SplitBackward, type GradAllocator } from './autograd/engine.js';
export { planMatmul, gemmInto, matmulForward, geluMlp, EPILOGUE, type GemmPlan } from './ops/matmul.js';
export { FlatLayout, copyElements } from './parallel/flat.js';
export { viewOf } from './tensor.js';
export { NcclBackend, createNcclBackend, loadNcclAddon, NCCL_PENDING, type NcclAddon, type NcclEndpoint, type NcclNativeComm } from './distributed/nccl-backend.js';
// Helpers of the public ops and autocast that the package's tests pin.
export { errorFromCode } from './errors.js';
export { linearCrossEntropyChunkRows } from './ops/linear-cross-entropy.js';
export { AUTOCAST_LOW_PRECISION_OPS, AUTOCAST_F32_OPS } from './amp.js';
// nt.parallel's plumbing: the mesh's Megatron-style accessors, the pipeline schedules' placement, checks
// and simulation (the planner's and the trainer's), the seams tensor- and context-parallel layers are
// built from, and the ZeRO stages ZeroOptimizer builds.
export { tpRank, tpSize, tpGroup, ppRank, ppSize, ppGroup, dpRank, dpSize, dpGroup } from './parallel/mesh.js';
export {
  chunkLayers, schedulePlacement, virtualStageOf, rankOfVirtualStage, SCHEDULE_KINDS, splitsBackward, checkSchedule,
  simulateSchedule, formulaBubble, type VirtualStagePlace, type ActionCosts, type ScheduleSimulation,
} from './parallel/pipeline/schedules.js';
export {
  tensorParallelLinearFactory, vocabParallelLayout, sequenceParallelLayout, tensorParallelParameters,
} from './parallel/tensor-parallel/gpt.js';
export { sequenceGatheredLinear } from './parallel/tensor-parallel/layers.js';
export { vocabRange } from './parallel/tensor-parallel/vocab.js';
export { SEQUENCE_DIM } from './parallel/tensor-parallel/mappings.js';
export { contextChunks } from './parallel/context-parallel/gpt.js';
export { ZeroStage12Optimizer, ZeroStage3Optimizer } from './parallel/zero/optimizer.js';
export { defaultUnits } from './parallel/zero/stage3.js';
// nt.train's flag tables (the CLI and the planner read them).
export { LAYOUT_FLAGS, LAYOUT_ENV } from './train/flags.js';
// The layout planner behind `nodetron plan`: per-rank memory and step time of layouts, the ranked
// candidates for a model on N devices, published reference formulas, calibration (docs/planning.md).
export * as plan from './plan/index.js';
// A model family of one's own (docs/architecture.md, "Adding a model family"): the contract's check, the
// count arithmetic, and the Hugging Face registry importHF/exportHF and the planner read.
export { isCausalLM, causalLMProblems } from './nn/causal-lm.js';
export { decoderFlopsPerToken, type DecoderShape } from './nn/counts.js';
export { gptDecoderShape } from './nn/gpt.js';
export { llamaDecoderShape } from './nn/llama.js';
export { registerHFFamily, type HFFamily } from './interop/hf-common.js';
