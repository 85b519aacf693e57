// The distributed API: rendezvous stores, the launch environment, and (from other modules) communicators.
export * from './store.js';
export * from './env.js';
export * from './redis-store.js';
export { init, isInitialized, world, rank, worldSize, newGroup, destroy, selectBackends, DEFAULT_COMM_TIMEOUT_MS, type InitOptions, type BackendChoice } from './init.js';
export {
  ProcessGroup, NonMemberGroup, type Group, type CollectiveGroup, type CollectiveWork, type WorldGroup, type CollectiveOptions, type ReduceOptions, type AllReduceOptions, type RootOptions, type P2POptions,
} from './group.js';
export { Work } from './work.js';
export { agree, agreeAll, agreeMax, agreementDevice, formatRanks, rangeAcrossRanks, settingsDigest, type Agreement, type AgreeAllOptions } from './agree.js';
export { REDUCE_OP_CODES, type ReduceOp } from './collectives.js';
export { type CommBackend, type CommPromise, type GlooEndpoint, createGlooBackend } from './backend.js';
export { ncclUsableDevices, NCCL_UNIQUE_ID_KEY } from './nccl-backend.js';
export { verifyCollective, describeCollective, type CollectiveDescription } from './check.js';
export {
  recordStepMetrics, readMetrics, stragglerScores, formatStragglers, METRICS_DIR, metricsEnabled,
  type StepMetrics, type MoEStepMetrics, type StragglerOptions, type StragglerReport, type RankScore, type StragglerMetric,
} from '../observe/metrics.js';
export { selfCheck, type SelfCheckOptions, type SelfCheckReport, type SelfCheckLink, type SelfCheckRank } from './self-check.js';
