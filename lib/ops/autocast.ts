// Autocast's side of the ops: a differentiable cast (gradient cast back to the input's dtype), and the
// casts an op applies to its inputs under nt.autocast (lib/amp.ts holds the policy and the weight-cast
// cache). Ops in AUTOCAST_LOW_PRECISION_OPS cast their floating inputs to bf16/f16, ops in
// AUTOCAST_F32_OPS to f32; then they run as usual on the cast inputs.
import { autocastDtypeForInput, autocastResidualDtype, autocastWeightCast, countActivationCast } from '../amp.js';
import { needsGrad, Node, record } from '../autograd/engine.js';
import { isGradEnabled } from '../autograd/grad-mode.js';
import { type DType, dtypeCode, isFloating, parseDType } from '../dtype.js';
import { DTypeError } from '../errors.js';
import { checkTensor, Tensor } from '../tensor.js';

/**
 * x converted to `dtype` (a new tensor, a copy even when the dtype is x's), differentiably: the
 * gradient flows back converted to x's dtype. Between floating dtypes only (DTypeError otherwise).
 */
export function cast(x: Tensor, dtype: DType | string): Tensor {
  checkTensor(x, 'cast', 'x');
  const to = parseDType(dtype, 'cast');
  if (!isFloating(x.dtype) || !isFloating(to)) throw new DTypeError(`cast: converts between floating dtypes (f32, bf16, f16); got ${x.describe()} to ${to}`);
  const out = x.to(to);
  if (!needsGrad(x)) return out;
  const from = x.dtype;
  // The gradient is cast straight into x's gradient home when backward hands one (a weight's bucket
  // view): an elementwise cast, so any alignment serves, and no converted copy sits beside the home.
  return record('cast', out, [x], (g, target) => {
    const home = target(0);
    if (home === null || home.dtype !== from || home.device !== g.device || home.size !== g.size) return [g.to(from)];
    home.backend.cast(g.storage, dtypeCode(g.dtype), home.storage, dtypeCode(from), g.size);
    return [home];
  });
}

// A cached weight copy serves an op only if it can carry the gradient the op needs: made with a
// graph when grad mode is on now, and that graph not yet freed by a backward.
function usableCast(t: Tensor): boolean {
  if (!isGradEnabled()) return true;
  return t.gradFn instanceof Node && !t.gradFn.released;
}

/**
 * t in `dtype` for an op under autocast: leaf tensors that require grad (weights) come from the
 * region's cache (cast once per region and version), other tensors get a new cast that the caller
 * frees after the op (pushed on `temps`).
 */
function castInput(t: Tensor, dtype: DType, temps: Tensor[]): Tensor {
  if (t.requiresGrad && t.gradFn === null) return autocastWeightCast(t, dtype, () => cast(t, dtype), usableCast);
  countActivationCast();
  const c = cast(t, dtype);
  temps.push(c);
  return c;
}

/** Floating tensors of another dtype than `dtype` among `inputs` (anything else is left to the op's checks). */
function needsCast(x: unknown, dtype: DType): x is Tensor {
  return x instanceof Tensor && !x.disposed && isFloating(x.dtype) && x.dtype !== dtype;
}

/**
 * Runs `fn` on `inputs` cast as autocast wants them for `op`, and returns its result; returns
 * undefined (without calling fn) when autocast is off for the op or no input needs a cast, so the
 * op goes on with its inputs as they are. The activation casts are freed after fn (the graph keeps
 * what it saved of them).
 */
export function autocastRun<A extends readonly unknown[], R>(op: string, inputs: A, fn: (...cast: A) => R): R | undefined {
  const first = inputs[0];
  const dtype = autocastDtypeForInput(op, first instanceof Tensor && !first.disposed ? first.dtype : undefined);
  if (dtype === undefined || !inputs.some((x) => needsCast(x, dtype))) return undefined;
  return runCast(dtype, inputs, fn);
}

/** Runs fn on `inputs` with every floating tensor of another dtype cast to `dtype` (activation casts freed after). */
export function runCast<A extends readonly unknown[], R>(dtype: DType, inputs: A, fn: (...cast: A) => R): R {
  const temps: Tensor[] = [];
  try {
    const cast = inputs.map((x) => (needsCast(x, dtype) ? castInput(x, dtype, temps) : x)) as unknown as A;
    return fn(...cast);
  } finally {
    for (const t of temps) t.dispose();
  }
}

/**
 * x as the residual stream of a decoder's blocks: under autocast with lowPrecisionResidual, an f32 x
 * (the embeddings' output, or a pipeline stage's received activation) cast to the autocast dtype,
 * differentiably; otherwise x itself.
 */
export function residualStream(x: Tensor): Tensor {
  const dtype = autocastResidualDtype();
  return dtype === undefined || x.dtype === dtype || !isFloating(x.dtype) ? x : cast(x, dtype);
}

/**
 * The dtype two floating operands of an elementwise op compute in: the wider of the two (as
 * PyTorch promotes): f32 with anything, and f32 for bf16 with f16 (neither holds the other).
 */
export function promoteTypes(a: DType, b: DType): DType {
  return a === b ? a : 'f32';
}
