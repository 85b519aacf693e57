// nodetron/internal: what ops and layers written inside nodetron, or by a library author extending it,
// build on, and what nodetron's own tests reach for. Not the public API (lib/index.ts is): these names
// may change between versions without notice, and typedoc does not document them.
export { needsGrad, record, save, own, alias, Node, collectLeaves, type BackwardFn } from './autograd/engine.js';
export { planMatmul, gemmInto, matmulForward, geluMlp, EPILOGUE, type GemmPlan } from './ops/matmul.js';
export { FlatLayout, copyElements } from './parallel/flat.js';
export { NcclBackend, createNcclBackend, loadNcclAddon, NCCL_PENDING, type NcclAddon, type NcclEndpoint, type NcclNativeComm } from './distributed/nccl-backend.js';
