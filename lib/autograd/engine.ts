// The tape: graph nodes that ops record, and backward(), which walks them in reverse topological
// order, accumulates gradients into leaves, runs the leaves' grad-ready hooks as each leaf's gradient
// becomes final, and frees each node's saved tensors. Weight-gradient work that deferWeightGrads()
// holds back (zero-bubble pipelines' W) lives in deferred.ts; backward() asks it where each node's work goes.
import { dtypeCode, isFloating } from '../dtype.js';
import { BINARY } from '../kernel-codes.js';
import { ArgumentError, AutogradError, ShapeError } from '../errors.js';
import { keep } from '../memory.js';
import { fmtShape, sameShape } from '../shape.js';
import { checkTensor, checkTensorList, emptyOn, Tensor, type GradNode } from '../tensor.js';
import { isGradEnabled, noGrad } from './grad-mode.js';
import { BackwardRegions, gradRegion, traceEnabled } from '../observe/trace.js';
import { absorbable, activeDeferral, consumerCounts, deferralPlan, dropItem, type DeferredGroup } from './deferred.js';
import { addToLeaf, allocatedGrad, GradTargets, noTarget, type GradTarget, type RemovableHandle } from './grad-homes.js';

export { registerGradAllocator, type GradAllocator, type GradTarget, type RemovableHandle } from './grad-homes.js';

/**
 * Computes the gradients of an op's inputs from the gradient of its output (null: no gradient).
 * `target(i)` offers a tensor to write input i's gradient into ({@link GradTarget}; may be ignored).
 */
export type BackwardFn = (gradOut: Tensor, target: GradTarget) => (Tensor | null)[];

/**
 * An op's backward in two parts (zero-bubble pipelines' B and W): `inputs(g)` computes the
 * gradients of the inputs that are not at `weights` positions now (null at those positions) and
 * returns, as `weightGrads`, a closure computing the rest later (null at the other positions). The
 * two parts must make the same tensors, with the same kernels, as the op's whole backward.
 */
export interface SplitBackward {
  /** The input positions whose gradients the second part computes (a linear layer's weight and bias). */
  readonly weights: readonly number[];
  /**
   * The first part; its closure owns whatever it kept for the second (and frees it when run; `drop`,
   * when given, frees it when the second part is dropped instead).
   */
  inputs(gradOut: Tensor): { grads: (Tensor | null)[]; weightGrads: (target: GradTarget) => (Tensor | null)[]; drop?: () => void };
}

/** A recorded op: its backward, the edges to its inputs and the tensors it saved. */
export class Node implements GradNode {
  /** Per input: the node that produced it, the leaf to accumulate into, or nothing. */
  readonly edges: (Node | Tensor | null)[];
  #backward: BackwardFn | null;
  #saved: Tensor[];
  // Live holders of this node: its output tensor and the nodes that consume it. At zero nobody can
  // reach it any more (the output was disposed without backward), so its saved tensors go.
  #refs = 0;
  /**
   * Leaves the node's backward accumulates into without them being edges: the parameters a
   * recompute() block closes over, whose gradients come from the block's re-run. backward() counts
   * them so their grad-ready hooks wait for this node.
   */
  hiddenLeaves: readonly Tensor[] = [];
  /** The traced layer whose forward recorded this node (NODETRON_TRACE; null otherwise). */
  readonly region: string | null = gradRegion;
  /** The op's backward in two parts, when it has one (see {@link SplitBackward}); null otherwise. */
  split: SplitBackward | null = null;
  /**
   * Records an op. Takes a hold on each input's node.
   * @param name The op's name (in error messages).
   * @param inputs The op's inputs; each becomes an edge to its node, to itself as a leaf requiring grad, or null.
   * @param backward Computes the inputs' gradients.
   * @param saved Tensors backward needs; disposed when the node is released.
   */
  constructor(readonly name: string, inputs: readonly Tensor[], backward: BackwardFn, saved: Tensor[]) {
    this.edges = inputs.map((t) => (t.gradFn instanceof Node ? t.gradFn : t.requiresGrad ? t : null));
    for (const e of this.edges) if (e instanceof Node) e.#refs++;
    this.#backward = backward;
    this.#saved = saved;
  }
  /** Adds one holder (an output tensor or a consuming node); see unref(). */
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
  /** Whether release() has run (the saved tensors are gone; apply() throws). */
  get released(): boolean { return this.#backward === null; }
  /**
   * Runs the backward function: the gradients of the inputs (null for an input that needs none) given the output's
   * gradient, `target` offering where a leaf's gradient may be written. Throws AutogradError once the node was released.
   */
  apply(gradOut: Tensor, target: GradTarget = noTarget): (Tensor | null)[] {
    if (this.#backward === null) {
      throw new AutogradError(`backward through '${this.name}' a second time: its saved tensors were freed by the first backward (pass { retainGraph: true } to the first call)`);
    }
    return this.#backward(gradOut, target);
  }
  /** Frees the saved tensors; a later apply() throws. */
  release(): void {
    for (const t of this.#saved) t.dispose();
    this.#saved = [];
    this.#backward = null;
    this.hiddenLeaves = [];
    this.split = null;
  }
}

// Leaves that ops see while a recompute() block runs its forward without a graph (null: nobody
// is collecting). Every op calls needsGrad with its inputs, so this is where they can be seen.
let leafCollector: Set<Tensor> | null = null;

/**
 * Runs fn and returns, besides its result, the leaves requiring grad that its ops took as inputs
 * (with or without grad mode): what recompute() needs to know which parameters its re-run feeds.
 */
export function collectLeaves<T>(fn: () => T): {
  /** What fn returned. */
  result: T;
  /** The leaves requiring grad that fn's ops took as inputs. */
  leaves: Set<Tensor>;
} {
  const outer = leafCollector, leaves = new Set<Tensor>();
  leafCollector = leaves;
  try {
    return { result: fn(), leaves };
  } finally {
    leafCollector = outer;
    if (outer) for (const t of leaves) outer.add(t);
  }
}

/** Whether an op with these inputs must be recorded. */
export function needsGrad(...inputs: (Tensor | null | undefined)[]): boolean {
  if (leafCollector !== null) for (const t of inputs) if (t && t.requiresGrad && t.gradFn === null) leafCollector.add(t);
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
export function record(name: string, out: Tensor, inputs: readonly Tensor[], backward: BackwardFn, saved: Tensor[] = [], split?: SplitBackward): Tensor {
  const node = new Node(name, inputs, backward, saved);
  if (split) node.split = split;
  node.ref();
  out.gradFn = node;
  out.requiresGrad = true;
  return out;
}

/** Called with the leaf once its gradient of a backward() call is complete (PyTorch's post-accumulate-grad hook). */
export type PostAccumulateGradHook = (leaf: Tensor) => void;

const gradHooks = new WeakMap<Tensor, PostAccumulateGradHook[]>();
// Leaves with at least one hook: at zero, backward() skips all bookkeeping for hooks.
let hookedLeafCount = 0;

/**
 * Runs `hook(leaf)` once per backward() call that gives `leaf` a gradient, right after that call's
 * last accumulation into `leaf.grad` (every edge reaching the leaf counted up front, those inside
 * recompute() blocks included). The hook may read, move or dispose `leaf.grad`; backward() does
 * not touch it again in that call. Hooks run in registration order.
 */
export function registerPostAccumulateGradHook(leaf: Tensor, hook: PostAccumulateGradHook): RemovableHandle {
  checkTensor(leaf, 'registerPostAccumulateGradHook', 'leaf');
  if (typeof hook !== 'function') throw new ArgumentError(`registerPostAccumulateGradHook: hook must be a function, got ${typeof hook}`);
  if (leaf.gradFn !== null) throw new AutogradError(`registerPostAccumulateGradHook: ${leaf.describe()} is computed by '${(leaf.gradFn as Node).name}'; post-accumulate-grad hooks go on leaves (tensors whose gradient is accumulated into .grad)`);
  if (!leaf.requiresGrad) throw new AutogradError(`registerPostAccumulateGradHook: ${leaf.describe()} does not require grad, so it never gets a gradient`);
  return addToLeaf(gradHooks, leaf, hook, (d) => { hookedLeafCount += d; });
}

/**
 * From inside a post-accumulate-grad hook: runs `fn` once when the backward() call in progress
 * (the outermost one) has run every hook, before it returns (PyTorch's queue_callback). What a
 * gradient reducer needs to launch what the pass left incomplete. Not run when backward() throws.
 */
export function queueBackwardCallback(fn: () => void): void {
  if (typeof fn !== 'function') throw new ArgumentError(`queueBackwardCallback: fn must be a function, got ${typeof fn}`);
  if (!activePass) throw new AutogradError('queueBackwardCallback: no backward() with post-accumulate-grad hooks is running (call it from such a hook)');
  activePass.endCallbacks.push(fn);
}

/**
 * The hook bookkeeping of one outermost backward() call: how many edges (and recompute() blocks)
 * still lead to each hooked leaf, which leaves received a gradient, and which hooks have run.
 * Backward calls nested in it (a recompute() block's re-run) only report the leaves they accumulate into.
 */
export class HookPass {
  readonly #remaining = new Map<Tensor, number>();
  readonly #received = new Set<Tensor>();
  readonly #done = new Set<Tensor>();
  /** Callbacks queued by hooks (queueBackwardCallback), run once the pass's last hook has run. */
  readonly endCallbacks: (() => void)[] = [];

  constructor(order: readonly Node[]) {
    for (const node of order) this.#forEachHookedLeaf(node, (leaf) => this.#remaining.set(leaf, (this.#remaining.get(leaf) ?? 0) + 1));
  }

  #forEachHookedLeaf(node: Node, fn: (leaf: Tensor) => void): void {
    for (const e of node.edges) if (e instanceof Tensor && gradHooks.has(e)) fn(e);
    for (const leaf of node.hiddenLeaves) if (gradHooks.has(leaf)) fn(leaf);
  }

  received(leaf: Tensor): void {
    if (this.#done.has(leaf)) {
      throw new AutogradError(`backward: ${leaf.describe()} received more gradient after its post-accumulate-grad hooks ran in this backward() (it is reached by a path the pass did not count, e.g. a nested backward() inside an op)`);
    }
    this.#received.add(leaf);
  }

  /** Called when a node is finished (or skipped for want of a gradient): runs the hooks of leaves it completed. */
  nodeDone(node: Node): void {
    const completed: Tensor[] = [];
    this.#forEachHookedLeaf(node, (leaf) => {
      const n = this.#remaining.get(leaf)! - 1;
      this.#remaining.set(leaf, n);
      if (n === 0) completed.push(leaf);
    });
    for (const leaf of completed) this.#fire(leaf);
  }

  /** Leaves reached only through paths the pass did not count run their hooks when it is over. */
  finish(): void {
    for (const leaf of this.#received) this.#fire(leaf);
  }

  #fire(leaf: Tensor): void {
    if (!this.#received.has(leaf) || this.#done.has(leaf)) return;
    this.#done.add(leaf);
    for (const hook of [...(gradHooks.get(leaf) ?? [])]) hook(leaf);
  }
}

// The hook bookkeeping of the backward() call in progress (null when none, or when no hook exists).
let activePass: HookPass | null = null;
let backwardDepth = 0;

/** Whether a backward() is running (e.g. a recompute() block re-running its forward inside it). */
export function inBackward(): boolean { return backwardDepth > 0; }

/** Options of {@link backward}. */
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
  if (a.dtype !== b.dtype) {
    // Every op hands back gradients in its inputs' dtypes; convert anything else rather than add raw bytes.
    using c = b.to(a.dtype);
    accumulateInto(a, c);
    return;
  }
  a.backend.binary(BINARY.add, a.storage, b.storage, a.storage, dtypeCode(a.dtype), new Int32Array([a.size]), new Int32Array([1]), new Int32Array([1]));
}

/**
 * Reverse-mode differentiation from `t`: adds d(t)/d(leaf) · grad to the .grad of every leaf that
 * requires grad. `grad` defaults to 1 for a one-element t. Frees the graph unless retainGraph.
 */
export function backward(t: Tensor, grad?: Tensor, opts: BackwardOptions = {}): void {
  checkTensor(t, 'backward', 'tensor');
  if (opts === null || typeof opts !== 'object') throw new ArgumentError(`backward: options must be an object like { retainGraph }, got ${opts === null ? 'null' : typeof opts}`);
  if (opts.retainGraph !== undefined && typeof opts.retainGraph !== 'boolean') throw new ArgumentError(`backward: retainGraph must be a boolean, got ${typeof opts.retainGraph}`);
  if (!isFloating(t.dtype)) throw new AutogradError(`backward: ${t.describe()} is not a floating-point tensor; only f32, bf16 and f16 have gradients`);
  if (!(t.gradFn instanceof Node)) {
    if (t.requiresGrad) {
      const seed = seedGrad(t, grad), claimed = new Set<Tensor>();
      const pass = backwardDepth === 0 && hookedLeafCount > 0 ? new HookPass([]) : null;
      runPass(pass, () => {
        accumulateLeaf(t, seed, claimed);
        if (!claimed.has(seed)) seed.dispose();
      });
      return;
    }
    throw new AutogradError(`backward: ${t.describe()} does not require grad and has no graph (was it computed under noGrad(), or from tensors without requiresGrad?)`);
  }
  const root = t.gradFn;
  const order = topoOrder(root);
  // Only the outermost backward() runs hooks; a nested one (a recompute() block's re-run) reports to it.
  const pass = backwardDepth === 0 && hookedLeafCount > 0 ? new HookPass(order) : null;
  // Inside deferWeightGrads(): the outermost call keeps the weight-gradient work of its nodes for later.
  const deferral = activeDeferral();
  const group: DeferredGroup | null = deferral !== null && backwardDepth === 0 ? { pass, items: [], retainGraph: !!opts.retainGraph } : null;
  const grads = new Map<Node, Tensor>([[root, seedGrad(t, grad)]]);
  const claimed = new Set<Tensor>();
  // Weights' transforms whose backward waits with the deferred work that feeds them (deferralPlan).
  const consumers = group ? consumerCounts(order) : null;
  const absorbed = new Set<Node>();
  const absorb = (node: Node, positions: readonly number[]): Node[] => {
    const out = positions.map((i) => node.edges[i] ?? null).filter((e): e is Node => absorbable(e, deferral!.now, consumers!));
    for (const n of out) { n.ref(); absorbed.add(n); }
    return out;
  };
  // Tracing: per-layer backward spans of the outermost call (a recompute() block's re-run is inside its node's span).
  const regions = traceEnabled && backwardDepth === 0 ? new BackwardRegions() : null;
  try {
    runPass(pass, () => {
      for (const node of order) {
        const g = grads.get(node);
        if (!g) {
          // An absorbed transform reports to the hooks when its deferred work runs it.
          if (!absorbed.has(node)) pass?.nodeDone(node);
          continue;
        }
        grads.delete(node);
        regions?.at(node.region);
        const plan = group ? deferralPlan(node, deferral!.now, consumers!) : 'now';
        if (plan === 'all') {
          // Every gradient of this node goes to a weight: the whole node waits, holding its output's gradient.
          claimed.delete(g);
          node.ref(); // the graph's owner may dispose the output before the work runs
          group!.items.push({ node, gradOut: keep(g), compute: (target) => node.apply(g, target), absorbed: absorb(node, node.edges.map((_, i) => i)) });
          continue;
        }
        let inputGrads: (Tensor | null)[];
        // Leaves' gradient homes the op may write into (not for a split's input part: its leaves are activations).
        const targets = new GradTargets(node.edges);
        if (plan === 'split') {
          const part = noGrad(() => node.split!.inputs(g));
          inputGrads = part.grads;
          claimed.delete(g);
          node.ref();
          group!.items.push({ node, gradOut: keep(g), compute: part.weightGrads, absorbed: absorb(node, node.split!.weights), ...(part.drop ? { drop: part.drop } : {}) });
        } else {
          try { inputGrads = noGrad(() => node.apply(g, targets.target)); } catch (e) { targets.abandon(); throw e; }
        }
        const owned = new Set<Tensor>(plan === 'split' ? [] : [g]);
        node.edges.forEach((edge, i) => {
          const ig = inputGrads[i], home = targets.at(i);
          if (!ig) { if (home) targets.abandon(i); return; }
          if (ig !== home) owned.add(ig);
          if (!edge) return;
          if (edge instanceof Node) {
            const prev = grads.get(edge);
            if (prev) accumulateInto(prev, ig);
            else grads.set(edge, claim(ig, claimed, g));
          } else {
            accumulateLeaf(edge, ig, claimed, g, home);
          }
        });
        claimed.delete(g);
        for (const x of owned) if (!claimed.has(x)) x.dispose();
        if (plan === 'split') continue; // done (hooks, release) when its weight part runs
        // Hooks run after the node is done with its gradients: a hook may dispose the leaf's .grad.
        if (pass) pass.nodeDone(node);
        if (!opts.retainGraph) node.release();
      }
      regions?.end();
    }, group);
  } catch (e) {
    if (group) for (const item of group.items) dropItem(item, group.retainGraph);
    // A backward that failed midway (a collective of a lost rank): the nodes it never reached let go of their saved tensors.
    if (!opts.retainGraph) for (const node of order) if (!node.released && !absorbed.has(node)) node.release();
    throw e;
  } finally {
    for (const g of grads.values()) g.dispose();
  }
}

// Runs one backward's work with `pass` as the active hook bookkeeping (when it is the outermost
// call), then the hooks of leaves only uncounted paths reached.
export function runPass(pass: HookPass | null, work: () => void, deferred: DeferredGroup | null = null): void {
  const outer = activePass;
  if (pass) activePass = pass;
  backwardDepth++;
  try {
    work();
    // Work held back: the pass stays open (its hooks and callbacks run when the work does).
    if (deferred && deferred.items.length > 0) { activeDeferral()!.groups.push(deferred); return; }
    if (pass) {
      pass.finish();
      // A callback may queue another (it runs in the same loop).
      for (let i = 0; i < pass.endCallbacks.length; i++) pass.endCallbacks[i]!();
    }
  } finally {
    backwardDepth--;
    activePass = outer;
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

/**
 * Adds g to leaf's gradient. `home`: the gradient home the op was handed for this leaf (GradTargets):
 * g is that home, written by the op, or the op's own tensor, copied in.
 */
export function accumulateLeaf(leaf: Tensor, g: Tensor, claimed: Set<Tensor>, gradOut?: Tensor, home?: Tensor): void {
  if (leaf.disposed) return;
  if (!sameShape(leaf.shape, g.shape)) throw new ShapeError(`backward: gradient ${fmtShape(g.shape)} does not match ${leaf.describe()}`);
  if (activePass !== null && gradHooks.has(leaf)) activePass.received(leaf);
  if (!home && leaf.grad && !leaf.grad.disposed) {
    accumulateInto(leaf.grad, g);
    return;
  }
  const slot = home ?? allocatedGrad(leaf);
  if (slot) {
    // Copied, not claimed: backward frees g as any gradient it does not hand on (nothing to copy when the op wrote it there).
    if (g === slot) { /* written in place */ }
    else if (g.dtype === slot.dtype) slot.backend.copy(slot.storage, 0, g.storage, 0, slot.nbytes);
    // Another dtype (autocast's 16-bit gradient of an f32 leaf) is cast straight into the home: no
    // converted copy beside it (the token table's would be a second full-size f32 gradient).
    else if (g.device === slot.device) slot.backend.cast(g.storage, dtypeCode(g.dtype), slot.storage, dtypeCode(slot.dtype), slot.size);
    else { using c = g.to({ dtype: slot.dtype, device: slot.device }); slot.backend.copy(slot.storage, 0, c.storage, 0, slot.nbytes); }
    leaf.grad = keep(slot);
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
  for (const p of checkTensorList(params, 'zeroGrad', 'params')) {
    if (p.grad) { p.grad.dispose(); p.grad = null; }
  }
}

declare module '../tensor.js' {
  interface Tensor {
    /** Reverse-mode differentiation from this tensor; see {@link backward}. */
    backward(grad?: Tensor, opts?: BackwardOptions): void;
    /** A tensor sharing this one's data, with no graph and requiresGrad false; see {@link detach}. */
    detach(): Tensor;
    /** See registerPostAccumulateGradHook. */
    registerPostAccumulateGradHook(hook: PostAccumulateGradHook): RemovableHandle;
  }
}
Tensor.prototype.backward = function (this: Tensor, grad?: Tensor, opts?: BackwardOptions) { backward(this, grad, opts); };
Tensor.prototype.detach = function (this: Tensor) { return detach(this); };
Tensor.prototype.registerPostAccumulateGradHook = function (this: Tensor, hook: PostAccumulateGradHook) { return registerPostAccumulateGradHook(this, hook); };
