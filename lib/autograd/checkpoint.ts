// Activation recomputation: run a block without recording its graph, keep only its inputs, and
// rebuild the graph in backward to get the gradients (trading compute for memory).
import { scope } from '../memory.js';
import { defaultGenerator } from '../random.js';
import type { Tensor } from '../tensor.js';
import { alias, backward, collectLeaves, needsGrad, Node, record, save } from './engine.js';
import { enableGrad, isGradEnabled, noGrad } from './grad-mode.js';

/**
 * out = fn(...inputs), without keeping fn's intermediate tensors: backward re-runs fn with grad on
 * and differentiates it. Parameters fn closes over get their gradients in the re-run. The default
 * generator is rewound for the re-run, so dropout inside fn draws the same mask.
 */
export function checkpoint(fn: (...inputs: Tensor[]) => Tensor, ...inputs: Tensor[]): Tensor {
  if (!isGradEnabled()) return fn(...inputs);
  const offset = defaultGenerator.offsetBlocks;
  // Scopes release fn's intermediates at once, in the forward and in the re-run. The leaves fn's
  // ops see are the parameters the re-run will accumulate into (grad-ready hooks wait for them).
  const { result: out, leaves } = collectLeaves(() => noGrad(() => scope(() => fn(...inputs))));
  const wants = inputs.map((t) => needsGrad(t));
  const saved = inputs.map(save);
  for (const t of inputs) leaves.delete(t);
  const recorded = record('checkpoint', out, inputs, (g) => enableGrad(() => scope(() => {
    const xs = saved.map((s, i) => { const a = alias(s); a.requiresGrad = wants[i]!; return a; });
    const resume = defaultGenerator.offsetBlocks;
    defaultGenerator.offsetBlocks = offset;
    let y: Tensor;
    try {
      y = fn(...xs);
    } finally {
      defaultGenerator.offsetBlocks = resume;
    }
    backward(y, g);
    y.dispose();
    return xs.map((x) => {
      const grad = x.grad;
      x.grad = null;
      x.dispose();
      return grad;
    });
  })), saved);
  (recorded.gradFn as Node).hiddenLeaves = [...leaves];
  return recorded;
}
