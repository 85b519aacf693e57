// nodetron/testing: process groups for tests, kept out of the main API (as PyTorch keeps its fake
// process group under torch.testing). localWorld/runLocalRanks simulate N ranks as async tasks in
// one process; fileWorld meets ranks of separate processes through files in a shared directory and
// completes collectives synchronously (waitSync), which tensor-parallel backward needs. Both follow
// the CollectiveGroup interface the parallel layer runs over; for real jobs use nt.distributed.
//   import { runLocalRanks, fileWorld } from 'nodetron/testing';
// testingAddon() reaches the test-only native code (a checkout's build only, never the package).
export { localWorld, runLocalRanks, LOCAL_TIMEOUT_MS } from './local-group.js';
export { fileWorld } from './file-group.js';
export { testingAddon } from './native.js';
