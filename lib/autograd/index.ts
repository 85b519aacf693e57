// Autograd: the tape (engine), grad mode switches and activation recomputation (recompute; its old name checkpoint).
// The tape's own pieces (record, save, own, alias, Node, needsGrad, collectLeaves) are for ops written
// inside nodetron or against it: they come from 'nodetron/internal', not from here.
export {
  backward, detach, zeroGrad, registerPostAccumulateGradHook, queueBackwardCallback,
  type BackwardOptions, type PostAccumulateGradHook, type RemovableHandle,
} from './engine.js';
export { deferWeightGrads, DeferredWeightGrads, type DeferWeightGradsOptions, type DeferredBackward } from './deferred.js';
export { isGradEnabled, noGrad, enableGrad } from './grad-mode.js';
export { recompute } from './recompute.js';
