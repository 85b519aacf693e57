// The tape: graph nodes that ops record, and backward(), which walks them in reverse topological
// order, accumulates gradients into leaves and frees each node's saved tensors.
import { dtypeCode, isFloating } from '../dtype.js';
import { BINARY } from '../ops/codes.js';
import { AutogradError, ShapeError } from '../errors.js';
import { keep } from '../memory.js';
import { fmtShape, sameShape } from '../shape.js';
import { checkTensor, emptyOn, Tensor } from '../tensor.js';
import { isGradEnabled, noGrad } from './grad-mode.js';

/** Computes the gradients of an op's inputs from the gradient of its output (null: no gradient). */
export type BackwardFn = (gradOut: Tensor) => (Tensor | null)[];

/** A recorded op: its backward, the edges to its inputs and the tensors it saved. */
export class Node {
  /** Per input: the node that produced it, the leaf to accumulate into, or nothing. */
  readonly edges: (Node | Tensor | null)[];
  #backward: BackwardFn | null;
  #saved: Tensor[];
  // Live holders of this node: its output tensor and the nodes that consume it. At zero nobody can
  // reach it any more (the output was disposed without backward), so its saved tensors go.
  #refs = 0;
  constructor(readonly name: string, inputs: readonly Tensor[], backward: BackwardFn, saved: Tensor[]) {
    this.edges = inputs.map((t) => (t.gradFn instanceof Node ? t.gradFn : t.requiresGrad ? t : null));
    for (const e of this.edges) if (e instanceof Node) e.#refs++;
    this.#backward = backward;
    this.#saved = saved;
  }
  ref(): void { this.#refs++; }
  /** Drops one holder; releases this node, and transitively its inputs, when none is left. */
  unref(): void {
    const stack: Node[] = [this];
    while (stack.length) {
      const n = stack.pop()!;
      if (--n.#refs > 0) continue;
      n.release();
      for (const e of n.edges) if (e instanceof Node) stack.push(e);
    }
  }
  get released(): boolean { return this.#backward === null; }
  apply(gradOut: Tensor): (Tensor | null)[] {
    if (this.#backward === null) {
      throw new AutogradError(`backward through '${this.name}' a second time: its saved tensors were freed by the first backward (pass { retainGraph: true } to the first call)`);
    }
    return this.#backward(gradOut);
  }
  /** Frees the saved tensors; a later apply() throws. */
  release(): void {
    for (const t of this.#saved) t.dispose();
    this.#saved = [];
    this.#backward = null;
  }
}

/** Whether an op with these inputs must be recorded. */
export function needsGrad(...inputs: (Tensor | null | undefined)[]): boolean {
  if (!isGradEnabled()) return false;
  for (const t of inputs) if (t && (t.requiresGrad || t.gradFn !== null)) return true;
  return false;
}

/**
 * Saves a tensor for backward: a handle on the same storage that survives the caller disposing
 * the original and the scope it was made in; freed when the graph is.
 */
export function save(t: Tensor): Tensor {
  return keep(alias(t));
}

/** A new tensor object over t's storage (shape kept), outside any graph. */
export function alias(t: Tensor, shape: readonly number[] = t.shape): Tensor {
  const ref = t.storageRef;
  ref.refs++;
  return new Tensor(ref, shape, t.dtype);
}

/** Hands a tensor the op created (statistics, masks) to the graph: scopes leave it alone. */
export function own(t: Tensor): Tensor {
  return keep(t);
}

/**
 * Records `out` as produced by an op over `inputs`. `saved` lists the tensors the backward closure
 * holds (made with save() or created by the op); they are disposed when the graph is freed.
 */
export function record(name: string, out: Tensor, inputs: readonly Tensor[], backward: BackwardFn, saved: Tensor[] = []): Tensor {
  const node = new Node(name, inputs, backward, saved);
  node.ref();
  out.gradFn = node;
  out.requiresGrad = true;
  return out;
}

export interface BackwardOptions {
  /** Keep the graph (and its saved tensors) for another backward. */
  retainGraph?: boolean;
}

function topoOrder(root: Node): Node[] {
  // Iterative DFS: deep graphs (long sequences of ops) must not overflow the JS stack.
  const order: Node[] = [];
  const seen = new Set<Node>([root]);
  const stack: [Node, number][] = [[root, 0]];
  while (stack.length) {
    const top = stack[stack.length - 1]!;
    const [node, i] = top;
    if (i < node.edges.length) {
      top[1]++;
      const e = node.edges[i];
      if (e instanceof Node && !seen.has(e)) { seen.add(e); stack.push([e, 0]); }
    } else {
      stack.pop();
      order.push(node);
    }
  }
  return order.reverse();
}

/** In-place a += b for same-shape tensors (the accumulation of gradients). */
export function accumulateInto(a: Tensor, b: Tensor): void {
  a.backend.binary(BINARY.add, a.storage, b.storage, a.storage, dtypeCode(a.dtype), new Int32Array([a.size]), new Int32Array([1]), new Int32Array([1]));
}

/**
 * Reverse-mode differentiation from `t`: adds d(t)/d(leaf) · grad to the .grad of every leaf that
 * requires grad. `grad` defaults to 1 for a one-element t. Frees the graph unless retainGraph.
 */
export function backward(t: Tensor, grad?: Tensor, opts: BackwardOptions = {}): void {
  checkTensor(t, 'backward', 'tensor');
  if (!isFloating(t.dtype)) throw new AutogradError(`backward: ${t.describe()} is not a floating-point tensor; only f32, bf16 and f16 have gradients`);
  if (!(t.gradFn instanceof Node)) {
    if (t.requiresGrad) {
      const seed = seedGrad(t, grad), claimed = new Set<Tensor>();
      accumulateLeaf(t, seed, claimed);
      if (!claimed.has(seed)) seed.dispose();
      return;
    }
    throw new AutogradError(`backward: ${t.describe()} does not require grad and has no graph (was it computed under noGrad(), or from tensors without requiresGrad?)`);
  }
  const root = t.gradFn;
  const order = topoOrder(root);
  const grads = new Map<Node, Tensor>([[root, seedGrad(t, grad)]]);
  const claimed = new Set<Tensor>();
  try {
    for (const node of order) {
      const g = grads.get(node);
      if (!g) continue;
      grads.delete(node);
      const inputGrads = noGrad(() => node.apply(g));
      const owned = new Set<Tensor>([g]);
      node.edges.forEach((edge, i) => {
        const ig = inputGrads[i];
        if (!ig) return;
        owned.add(ig);
        if (!edge) return;
        if (edge instanceof Node) {
          const prev = grads.get(edge);
          if (prev) accumulateInto(prev, ig);
          else grads.set(edge, claim(ig, claimed, g));
        } else {
          accumulateLeaf(edge, ig, claimed, g);
        }
      });
      claimed.delete(g);
      for (const x of owned) if (!claimed.has(x)) x.dispose();
      if (!opts.retainGraph) node.release();
    }
  } finally {
    for (const g of grads.values()) g.dispose();
  }
}

// A gradient tensor may be handed to several inputs (add's backward passes its gradient through);
// each destination must own a distinct tensor, so a second claim gets a copy.
function claim(g: Tensor, claimed: Set<Tensor>, gradOut?: Tensor): Tensor {
  if (claimed.has(g) || g === gradOut) {
    const c = g.clone();
    claimed.add(c);
    return c;
  }
  claimed.add(g);
  return g;
}

function accumulateLeaf(leaf: Tensor, g: Tensor, claimed: Set<Tensor>, gradOut?: Tensor): void {
  if (leaf.disposed) return;
  if (!sameShape(leaf.shape, g.shape)) throw new ShapeError(`backward: gradient ${fmtShape(g.shape)} does not match ${leaf.describe()}`);
  if (leaf.grad && !leaf.grad.disposed) {
    accumulateInto(leaf.grad, g);
  } else {
    const own = claim(g, claimed, gradOut);
    leaf.grad = keep(own.dtype === leaf.dtype ? own : convert(own, leaf, claimed));
  }
}

function convert(g: Tensor, leaf: Tensor, claimed: Set<Tensor>): Tensor {
  const c = g.to(leaf.dtype);
  claimed.add(c);
  return c;
}

function seedGrad(t: Tensor, grad: Tensor | undefined): Tensor {
  if (grad === undefined) {
    if (t.size !== 1) throw new AutogradError(`backward: ${t.describe()} has ${t.size} elements; pass the gradient of the output (only one-element outputs default to 1)`);
    const one = emptyOn(t.shape, t.dtype, t.deviceInfo);
    one.backend.fill(one.storage, dtypeCode(t.dtype), 1, 1);
    return one;
  }
  checkTensor(grad, 'backward', 'grad');
  if (!sameShape(grad.shape, t.shape)) throw new ShapeError(`backward: grad ${fmtShape(grad.shape)} does not match output ${t.describe()}`);
  if (grad.device !== t.device) throw new AutogradError(`backward: grad is on ${grad.device}, output on ${t.device}`);
  return grad.dtype === t.dtype ? grad.clone() : grad.to(t.dtype);
}

/** A tensor sharing t's data with no graph and requiresGrad false. */
export function detach(t: Tensor): Tensor {
  checkTensor(t, 'detach', 'tensor');
  return alias(t);
}

/** Clears the gradients of the given tensors (disposes them). */
export function zeroGrad(params: Iterable<Tensor>): void {
  for (const p of params) {
    if (p.grad) { p.grad.dispose(); p.grad = null; }
  }
}

// Disposing an op's output drops its hold on the graph, so forward passes that never reach
// backward (evaluation without noGrad) free their saved tensors too.
const disposeStorage = Tensor.prototype.dispose;
Tensor.prototype.dispose = function (this: Tensor) {
  if (this.disposed) return;
  const fn = this.gradFn;
  disposeStorage.call(this);
  if (fn instanceof Node) fn.unref();
};

declare module '../tensor.js' {
  interface Tensor {
    backward(grad?: Tensor, opts?: BackwardOptions): void;
    detach(): Tensor;
  }
}
Tensor.prototype.backward = function (this: Tensor, grad?: Tensor, opts?: BackwardOptions) { backward(this, grad, opts); };
Tensor.prototype.detach = function (this: Tensor) { return detach(this); };
