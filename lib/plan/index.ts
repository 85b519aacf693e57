// The planner (`nodetron plan`; `plan` in nodetron/internal): per-rank memory and step time of training layouts, the ranked candidates for a model on
// N devices, published reference formulas (DeepSpeed, Megatron) and calibration on this machine.
export { PLAN_MODELS, resolveModel, modelFromConfig, layerParams, stageLayers, vStageLayers, stageParams, totalParams, largestLayerParams, moeLayerCount, expertParams, activeParams, stageExpertParams, type PlanModel, type PlanMoE, type StageParams } from './models.js';
export {
  estimateMemory, estimateStageMemory, estimateStages, korthikantiLayerBytes, inFlightMicroBatches, sizeClass, cpuBf16Path,
  F32_BLOCK_REPLICATED, F32_BLOCK_SPLIT, F32_SCORES, F32_EMBEDDING, F32_STAGE_OUTSIDE, F32_DEFERRED_REPLICATED, F32_DEFERRED_SPLIT, scheduleStates,
  type PlanLayout, type ScheduleState, type PlanDType, type Bf16GemmPath, type Recompute, type MemoryOptions, type MemoryEstimate,
} from './memory.js';
export { PLAN_DEVICES, resolveDevice, gemmFlopsFromJson, busBwFromJson, stepFlops, predictStepTime, predictBubble, expertParallelSeconds, type PlanDevice, type TimeOptions, type StepTime } from './time.js';
export { planLayouts, layoutProblem, launchCommand, exampleScriptPath, exampleProblem, EXAMPLE_SCRIPT, type PlanOptions, type PlanCandidate } from './planner.js';
export { deepspeedZero2Estimate, deepspeedZero3Estimate, megatronWeightAndOptimizerBytes, megatronActivationBytes, type MegatronArgs } from './reference.js';
export { calibrateLayout, checkCalibrationLayout, parseLayoutSpec, calibrationModel, CALIBRATION_SHAPE, DEFAULT_CALIBRATION_LAYOUTS, type CalibrationShape, type CalibrationRow, type CalibrationRank, type CalibrateOptions } from './calibrate.js';
export type { CalibrationRankResult, CalibrationRankError } from './calibrate-rank.js';
