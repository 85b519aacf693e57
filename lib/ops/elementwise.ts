// Elementwise ops with NumPy broadcasting and their gradients: add, sub, mul, div (tensor or
// number operands), neg, exp, log, sqrt, tanh, pow, scale. Backward sums broadcast dims away.
import { needsGrad, record, save } from '../autograd/engine.js';
import { ArgumentError } from '../errors.js';
import { broadcastShapes, sameShape } from '../shape.js';
import { Tensor } from '../tensor.js';
import { isFloating } from '../dtype.js';
import { BINARY, UNARY, type UnaryName } from '../kernel-codes.js';
import { autocastRun, promoteTypes, runCast } from './autocast.js';
import { checkFloats, code, contiguousStrides, emptyLike } from './common.js';

/** A tensor or a number (numbers broadcast as scalars of the tensor's dtype). */
export type Operand = Tensor | number;

/** Strides that read `shape` broadcast to `outShape` (0 on broadcast dims). */
function broadcastStrides(shape: readonly number[], outShape: readonly number[]): Int32Array {
  const own = contiguousStrides(shape);
  const out = new Int32Array(outShape.length);
  const lead = outShape.length - shape.length;
  for (let i = 0; i < outShape.length; i++) {
    const d = i - lead;
    out[i] = d < 0 || shape[d] === 1 ? 0 : own[d]!;
  }
  return out;
}

// Same-shape operands (the common case) run as one flat dimension; the kernel call is synchronous,
// so one scratch shape array serves every call and the per-op allocations of broadcasting go away.
const flatShape = new Int32Array(1);
const unitStride = new Int32Array([1]);

/** Internal: a op b with broadcasting, no autograd. */
export function binaryRaw(op: number, a: Tensor, b: Tensor, call: string): Tensor {
  if (sameShape(a.shape, b.shape) && a.size <= 0x7fffffff) {
    const out = emptyLike(a, a.shape);
    flatShape[0] = a.size;
    a.backend.binary(op, a.storage, b.storage, out.storage, code(a), flatShape, unitStride, unitStride);
    return out;
  }
  const outShape = broadcastShapes(a.shape, b.shape, call);
  const out = emptyLike(a, outShape);
  a.backend.binary(op, a.storage, b.storage, out.storage, code(a), new Int32Array(outShape),
    broadcastStrides(a.shape, outShape), broadcastStrides(b.shape, outShape));
  return out;
}

/** Internal: a unary kernel, no autograd. */
export function unaryRaw(op: UnaryName, x: Tensor, p = 0): Tensor {
  const out = emptyLike(x);
  x.backend.unary(UNARY[op], x.storage, out.storage, x.size, code(x), p);
  return out;
}

/**
 * Internal: sums a gradient down to `shape` (the reverse of broadcasting). Returns g itself when
 * the shapes already match.
 */
export function sumTo(g: Tensor, shape: readonly number[]): Tensor {
  if (sameShape(g.shape, shape)) return g;
  const own = contiguousStrides(shape);
  const lead = g.shape.length - shape.length;
  const outStrides = new Int32Array(g.shape.length);
  for (let i = 0; i < g.shape.length; i++) {
    const d = i - lead;
    outStrides[i] = d < 0 || (shape[d] === 1 && g.shape[i] !== 1) ? 0 : own[d]!;
  }
  const out = emptyLike(g, shape);
  g.backend.sum_to(g.storage, out.storage, code(g), new Int32Array(g.shape), outStrides, out.size);
  return out;
}

function unaryOp(name: string, op: UnaryName, x: Tensor, p: number, saveInput: boolean, saveOutput: boolean): Tensor {
  const cast = autocastRun(name, [x] as const, (x2) => unaryOp(name, op, x2, p, saveInput, saveOutput));
  if (cast) return cast;
  checkFloats(name, { x });
  if (!Number.isFinite(p)) throw new ArgumentError(`${name}: the scalar must be a finite number, got ${p}`);
  const out = unaryRaw(op, x, p);
  if (!needsGrad(x)) return out;
  const xs = saveInput ? save(x) : null;
  const ys = saveOutput ? save(out) : null;
  return record(name, out, [x], (g) => {
    const gi = emptyLike(g);
    g.backend.unary_backward(UNARY[op], (xs ?? g).storage, (ys ?? g).storage, g.storage, gi.storage, g.size, code(g), p);
    return [gi];
  }, [xs, ys].filter((t): t is Tensor => t !== null));
}

function asTensorPair(call: string, a: Operand, b: Operand): void {
  if (typeof a === 'number' && typeof b === 'number') throw new ArgumentError(`${call}: at least one operand must be a Tensor`);
  if (typeof a === 'number' && !Number.isFinite(a)) throw new ArgumentError(`${call}: scalar operand must be finite, got ${a}`);
  if (typeof b === 'number' && !Number.isFinite(b)) throw new ArgumentError(`${call}: scalar operand must be finite, got ${b}`);
}

function binaryOp(call: string, op: number, a: Tensor, b: Tensor): Tensor {
  // Floating operands of two dtypes compute in the wider one (PyTorch's promotion): under autocast a
  // bf16 branch meets the f32 residual stream. The cast is differentiable, so each gradient comes
  // back in its operand's dtype.
  if (a instanceof Tensor && b instanceof Tensor && !a.disposed && !b.disposed && a.dtype !== b.dtype && isFloating(a.dtype) && isFloating(b.dtype)) {
    return runCast(promoteTypes(a.dtype, b.dtype), [a, b] as const, (a2, b2) => binaryOp(call, op, a2, b2));
  }
  checkFloats(call, { a, b });
  const out = binaryRaw(op, a, b, call);
  if (!needsGrad(a, b)) return out;
  const aShape = a.shape, bShape = b.shape;
  const needA = a.requiresGrad || a.gradFn !== null, needB = b.requiresGrad || b.gradFn !== null;
  const saved: Tensor[] = [];
  const keepT = (t: Tensor) => { const s = save(t); saved.push(s); return s; };
  const as = op === BINARY.mul && needB ? keepT(a) : null;
  const bs = op === BINARY.mul || op === BINARY.div ? keepT(b) : null;
  const os = op === BINARY.div && needB ? keepT(out) : null;
  return record(call, out, [a, b], (g) => {
    let ga: Tensor | null = null, gb: Tensor | null = null;
    if (op === BINARY.add) {
      ga = needA ? sumTo(g, aShape) : null;
      gb = needB ? sumTo(g, bShape) : null;
    } else if (op === BINARY.sub) {
      ga = needA ? sumTo(g, aShape) : null;
      if (needB) { const n = unaryRaw('neg', g); gb = sumTo(n, bShape); if (gb !== n) n.dispose(); }
    } else if (op === BINARY.mul) {
      if (needA) ga = reduceDispose(binaryRaw(BINARY.mul, g, bs!, call), aShape);
      if (needB) gb = reduceDispose(binaryRaw(BINARY.mul, g, as!, call), bShape);
    } else {
      if (needA) ga = reduceDispose(binaryRaw(BINARY.div, g, bs!, call), aShape);
      if (needB) {
        // d(a/b)/db = −(a/b)/b = −out/b
        const t = binaryRaw(BINARY.mul, g, os!, call);
        const q = binaryRaw(BINARY.div, t, bs!, call);
        t.dispose();
        q.backend.unary(UNARY.neg, q.storage, q.storage, q.size, code(q), 0);
        gb = reduceDispose(q, bShape);
      }
    }
    return [ga, gb];
  }, saved);
}

function reduceDispose(full: Tensor, shape: readonly number[]): Tensor {
  const r = sumTo(full, shape);
  if (r !== full) full.dispose();
  return r;
}

// a op b for the four arithmetic ops: two tensors go through the binary kernel; a number operand
// through a unary op instead, numberB(a, b) when b is the number, numberA(b, a) when a is.
function arithmetic(call: 'add' | 'sub' | 'mul' | 'div', a: Operand, b: Operand,
  numberB: (t: Tensor, s: number) => Tensor, numberA: (t: Tensor, s: number) => Tensor): Tensor {
  asTensorPair(call, a, b);
  if (typeof b === 'number') return numberB(a as Tensor, b);
  if (typeof a === 'number') return numberA(b, a);
  return binaryOp(call, BINARY[call], a, b);
}

/** a + b (broadcasting; either may be a number). */
export function add(a: Operand, b: Operand): Tensor {
  const addScalar = (t: Tensor, s: number) => unaryOp('add', 'addScalar', t, s, false, false);
  return arithmetic('add', a, b, addScalar, addScalar);
}

/** a − b (broadcasting; either may be a number). */
export function sub(a: Operand, b: Operand): Tensor {
  return arithmetic('sub', a, b, (t, s) => unaryOp('sub', 'addScalar', t, -s, false, false),
    (t, s) => unaryOp('sub', 'rsub', t, s, false, false));
}

/** a · b elementwise (broadcasting; either may be a number). */
export function mul(a: Operand, b: Operand): Tensor {
  const scaleBy = (t: Tensor, s: number) => unaryOp('mul', 'scale', t, s, false, false);
  return arithmetic('mul', a, b, scaleBy, scaleBy);
}

/** a / b elementwise (broadcasting; either may be a number). */
export function div(a: Operand, b: Operand): Tensor {
  return arithmetic('div', a, b, (t, s) => {
    if (s === 0) throw new ArgumentError('div: division by the number 0');
    return unaryOp('div', 'scale', t, 1 / s, false, false);
  }, (t, s) => unaryOp('div', 'rdiv', t, s, true, false));
}

/** x · s for a number s. */
export function scale(x: Tensor, s: number): Tensor { return unaryOp('scale', 'scale', x, s, false, false); }
/** −x */
export function neg(x: Tensor): Tensor { return unaryOp('neg', 'neg', x, 0, false, false); }
/** eˣ */
export function exp(x: Tensor): Tensor { return unaryOp('exp', 'exp', x, 0, false, true); }
/** Natural logarithm. */
export function log(x: Tensor): Tensor { return unaryOp('log', 'log', x, 0, true, false); }
/** Square root. */
export function sqrt(x: Tensor): Tensor { return unaryOp('sqrt', 'sqrt', x, 0, false, true); }
/** Hyperbolic tangent. */
export function tanh(x: Tensor): Tensor { return unaryOp('tanh', 'tanh', x, 0, false, true); }
/** xᵖ for a number p. */
export function pow(x: Tensor, p: number): Tensor {
  if (typeof p !== 'number') throw new ArgumentError('pow: the exponent must be a number');
  return unaryOp('pow', 'pow', x, p, true, false);
}
