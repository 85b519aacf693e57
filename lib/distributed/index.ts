// The distributed API: rendezvous stores, the launch environment, and (from other modules) communicators.
export * from './store.js';
export * from './env.js';
export * from './redis-store.js';
export { init, isInitialized, world, rank, worldSize, newGroup, destroy, DEFAULT_COMM_TIMEOUT_MS, type InitOptions } from './init.js';
export { ProcessGroup, NonMemberGroup, type Group, type CollectiveOptions, type ReduceOptions, type AllReduceOptions, type RootOptions, type P2POptions } from './group.js';
export { Work } from './work.js';
export { REDUCE_OP_CODES, type ReduceOp } from './collectives.js';
export { type CommBackend, type GlooEndpoint, createGlooBackend } from './backend.js';
export { verifyCollective, describeCollective, type CollectiveDescription } from './check.js';
