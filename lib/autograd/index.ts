// Autograd: the tape (engine), grad mode switches and activation recomputation (recompute; its old name checkpoint).
export {
  backward, detach, zeroGrad, needsGrad, record, save, own, alias, Node, collectLeaves, registerPostAccumulateGradHook, queueBackwardCallback,
  type BackwardFn, type BackwardOptions, type PostAccumulateGradHook, type RemovableHandle,
} from './engine.js';
export { isGradEnabled, noGrad, enableGrad } from './grad-mode.js';
export { recompute, checkpoint } from './recompute.js';
