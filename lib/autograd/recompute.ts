// Activation recomputation (`nt.recompute`; PyTorch calls it activation checkpointing): run a block without recording its graph, keep only its inputs, and rebuild the
// graph in backward to get the gradients (trading compute for memory). Saving a run is `nt.ckpt`.
import { autocast, autocastState } from '../amp.js';
import { scope } from '../memory.js';
import { defaultGenerator } from '../random.js';
import { ArgumentError } from '../errors.js';
import { checkTensor, Tensor } from '../tensor.js';
import { alias, backward, collectLeaves, needsGrad, Node, record, save } from './engine.js';
import { enableGrad, isGradEnabled, noGrad } from './grad-mode.js';

/**
 * out = fn(...inputs), without keeping fn's intermediate tensors: backward re-runs fn with grad on
 * and differentiates it. Parameters fn closes over get their gradients in the re-run. The default
 * generator is rewound for the re-run, so dropout inside fn draws the same mask.
 */
export function recompute(fn: (...inputs: Tensor[]) => Tensor, ...inputs: Tensor[]): Tensor {
  if (typeof fn !== 'function') throw new ArgumentError(`recompute: fn must be a function of the input tensors returning one Tensor, got ${fn === null ? 'null' : typeof fn}`);
  inputs.forEach((t, i) => checkTensor(t, 'recompute', `input ${i}`));
  if (!isGradEnabled()) return fn(...inputs);
  const offset = defaultGenerator.offsetBlocks;
  // The re-run computes in the dtypes the forward did: it re-enters the forward's autocast state
  // (backward may run outside the autocast region, or inside one the forward was not in).
  const ac = autocastState();
  const asForward = <T>(f: () => T): T => autocast(ac.enabled ? { dtype: ac.dtype!, enabled: true, lowPrecisionResidual: ac.lowPrecisionResidual } : { enabled: false }, f);
  // Scopes release fn's intermediates at once, in the forward and in the re-run. The leaves fn's
  // ops see are the parameters the re-run will accumulate into (grad-ready hooks wait for them).
  const { result: out, leaves } = collectLeaves(() => noGrad(() => scope(() => fn(...inputs))));
  checkResult(out, inputs);
  const wants = inputs.map((t) => needsGrad(t));
  const saved = inputs.map(save);
  for (const t of inputs) leaves.delete(t);
  const recorded = record('recompute', out, inputs, (g) => enableGrad(() => scope(() => {
    const xs = saved.map((s, i) => { const a = alias(s); a.requiresGrad = wants[i]!; return a; });
    const resume = defaultGenerator.offsetBlocks;
    defaultGenerator.offsetBlocks = offset;
    let y: Tensor;
    try {
      y = asForward(() => fn(...xs));
      checkResult(y, xs);
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

/** fn's result must be one new Tensor (its graph node is the recomputation's); anything else is disposed and reported. */
function checkResult(out: unknown, inputs: readonly Tensor[]): asserts out is Tensor {
  if (out instanceof Tensor && !inputs.includes(out)) return;
  const what = out instanceof Tensor ? 'one of its inputs' : Array.isArray(out) ? 'an array' : out === null ? 'null' : typeof out;
  // Tensors in a returned array or object survived fn's scope: free them.
  if (Array.isArray(out)) for (const t of out) if (t instanceof Tensor) t.dispose();
  if (out instanceof Tensor && !inputs.includes(out)) out.dispose();
  if (out instanceof Tensor) {
    throw new ArgumentError('recompute: fn returned one of its inputs; it must return a new Tensor computed from them (return x.mul(1) or a view if you mean identity)');
  }
  throw new ArgumentError(`recompute: fn must return a Tensor, it returned ${what}`);
}

