// Deferred weight gradients (deferWeightGrads): inside it, each backward() computes now the gradients
// that flow on to other ops and to the leaves named `now`, and holds back the weights' (a linear
// layer's weight GEMM, an op all of whose inputs are weights, a weight's transform that only that op
// consumes) as closures that DeferredWeightGrads.run() computes later with the same kernels, then
// firing the weights' post-accumulate-grad hooks: a zero-bubble pipeline's B and W. backward()
// (engine.ts) asks deferralPlan where each node's work goes and hands the held-back work here.
import { ArgumentError, AutogradError } from '../errors.js';
import { Tensor } from '../tensor.js';
import { noGrad } from './grad-mode.js';
import { accumulateLeaf, inBackward, Node, runPass, type HookPass } from './engine.js';
import { GradTargets, type GradTarget } from './grad-homes.js';

/**
 * Where a node's gradient work goes inside deferWeightGrads(): 'split' (input part now, weight part
 * later: the op has a split and every weight position is a deferrable leaf, a weight's transform or
 * nothing), 'all' (every gradient goes to deferrable leaves or their transforms: the whole node waits)
 * or 'now'. A weight's transform is a node between an op and a weight (a gradient scale such as expert
 * parallelism's 1/ep, a cast) whose only consumer in the graph is that op and whose gradients all go to
 * deferrable leaves: the deferred work runs it too (absorbs it), so the weight GEMM behind it waits.
 */
export function deferralPlan(node: Node, now: ReadonlySet<Tensor>, consumers: ReadonlyMap<Node, number>): 'now' | 'split' | 'all' {
  if (node.hiddenLeaves.length > 0) return 'now';
  const leaf = (e: Node | Tensor | null) => e instanceof Tensor && !now.has(e);
  const deferrable = (e: Node | Tensor | null) => leaf(e) || absorbable(e, now, consumers);
  const split = node.split;
  if (split && split.weights.some((i) => deferrable(node.edges[i] ?? null)) && split.weights.every((i) => (node.edges[i] ?? null) === null || deferrable(node.edges[i]!))) return 'split';
  const live = node.edges.filter((e) => e !== null);
  return live.length > 0 && live.every(deferrable) ? 'all' : 'now';
}

/** Whether edge e is a weight's transform that deferred work can absorb (see {@link deferralPlan}). */
export function absorbable(e: Node | Tensor | null, now: ReadonlySet<Tensor>, consumers: ReadonlyMap<Node, number>): e is Node {
  if (!(e instanceof Node) || consumers.get(e) !== 1 || e.hiddenLeaves.length > 0) return false;
  const live = e.edges.filter((x) => x !== null);
  return live.length > 0 && live.every((x) => x instanceof Tensor && !now.has(x));
}

/** The nodes of `order` other nodes feed their gradients into, with how many edges lead to each. */
export function consumerCounts(order: readonly Node[]): Map<Node, number> {
  const counts = new Map<Node, number>();
  for (const node of order) for (const e of node.edges) if (e instanceof Node) counts.set(e, (counts.get(e) ?? 0) + 1);
  return counts;
}

/** One node's weight-gradient work held back by deferWeightGrads(). */
export interface DeferredItem {
  readonly node: Node;
  /** The gradient of the node's output (the work reads it; freed once it ran). */
  readonly gradOut: Tensor;
  /** Computes the gradients of the node's deferred inputs (null elsewhere), into the leaves' homes where `target` offers them. */
  readonly compute: (target: GradTarget) => (Tensor | null)[];
  /** Frees what compute would have used, when it never runs. */
  readonly drop?: () => void;
  /** The weights' transforms among the node's edges that this work runs too (kept alive until then). */
  readonly absorbed: readonly Node[];
}

/** Frees a deferred item without running it. */
export function dropItem(item: DeferredItem, retainGraph: boolean): void {
  item.drop?.();
  item.gradOut.dispose();
  // As if the work had run: backward() frees a node's saved tensors once done with it.
  for (const node of [item.node, ...item.absorbed]) {
    if (!retainGraph) node.release();
    node.unref();
  }
}

/** The deferred work of one backward() call, with its hook bookkeeping (left open until the work runs). */
export interface DeferredGroup {
  readonly pass: HookPass | null;
  readonly items: DeferredItem[];
  readonly retainGraph: boolean;
}

/** The deferWeightGrads() call in progress: the leaves computed at once, and the backward() calls' held-back work. */
export interface Deferral {
  readonly now: ReadonlySet<Tensor>;
  readonly groups: DeferredGroup[];
}

// The deferWeightGrads() call in progress (null when none).
let deferral: Deferral | null = null;

/** The deferWeightGrads() call in progress, or null: backward() holds weight-gradient work back while there is one. */
export function activeDeferral(): Deferral | null { return deferral; }

/**
 * Weight-gradient work held back by {@link deferWeightGrads}: run() computes it (the same kernels on
 * the same tensors as an ordinary backward), accumulates it into the leaves' .grad and then runs
 * what the backward() calls left open: the leaves' post-accumulate-grad hooks and the callbacks they
 * queued (gradient buckets launch there). dispose() drops it without computing.
 */
export class DeferredWeightGrads {
  #groups: DeferredGroup[];
  /** @internal */
  constructor(groups: DeferredGroup[]) { this.#groups = groups; }

  /** The number of ops whose weight gradients wait. */
  get pending(): number { return this.#groups.reduce((n, g) => n + g.items.length, 0); }

  /** Computes every deferred weight gradient, in the order backward() reached them; a second call does nothing. */
  run(): void {
    const groups = this.#groups;
    this.#groups = [];
    for (let gi = 0; gi < groups.length; gi++) {
      const group = groups[gi]!;
      try {
        runPass(group.pass, () => {
          const claimed = new Set<Tensor>();
          while (group.items.length > 0) {
            const item = group.items.shift()!;
            const { node, gradOut, compute } = item;
            let out: (Tensor | null)[];
            const targets = new GradTargets(node.edges);
            try {
              out = noGrad(() => compute(targets.target));
            } catch (e) {
              targets.abandon();
              gradOut.dispose();
              for (const n of [node, ...item.absorbed]) n.unref();
              throw e;
            }
            const owned = new Set<Tensor>([gradOut]);
            const transforms: [Node, Tensor][] = [];
            node.edges.forEach((edge, i) => {
              const ig = out[i], home = targets.at(i);
              if (!ig) { if (home) targets.abandon(i); return; }
              if (ig !== home) owned.add(ig);
              if (edge instanceof Tensor) accumulateLeaf(edge, ig, claimed, gradOut, home);
              else if (edge instanceof Node && item.absorbed.includes(edge)) transforms.push([edge, ig]);
            });
            // A weight's transform: its backward on the gradient just computed, into its leaves.
            for (const [t, g] of transforms) {
              const tg = noGrad(() => t.apply(g));
              t.edges.forEach((edge, i) => {
                const x = tg[i];
                if (!x) return;
                owned.add(x);
                if (edge instanceof Tensor) accumulateLeaf(edge, x, claimed, g);
              });
            }
            for (const x of owned) if (!claimed.has(x)) x.dispose();
            if (group.pass) group.pass.nodeDone(node);
            if (!group.retainGraph) node.release();
            node.unref();
            for (const t of item.absorbed) {
              if (group.pass) group.pass.nodeDone(t);
              if (!group.retainGraph) t.release();
              t.unref();
            }
          }
        });
      } catch (e) {
        // The rest is dropped: its gradients would be incomplete anyway.
        for (const g of groups.slice(gi)) for (const item of g.items) dropItem(item, g.retainGraph);
        throw e;
      }
    }
  }

  /** Frees the held work without computing it (the weights keep the gradients they had). */
  dispose(): void {
    for (const g of this.#groups) for (const item of g.items) dropItem(item, g.retainGraph);
    this.#groups = [];
  }

  /** Same as dispose() (for `using`). */
  [Symbol.dispose](): void { this.dispose(); }
}

/** What {@link deferWeightGrads} returns. */
export interface DeferredBackward<T> {
  /** What fn returned. */
  result: T;
  /** The held-back weight-gradient work: run() it (the W pass), or dispose() it. */
  weightGrads: DeferredWeightGrads;
}

/** Options of {@link deferWeightGrads}. */
export interface DeferWeightGradsOptions {
  /** Leaves whose gradients are computed at once all the same (a pipeline stage's received activation, which the previous stage waits for). */
  now?: Iterable<Tensor>;
}

/**
 * Runs `fn` (synchronous) with weight-gradient work deferred: every backward() it calls computes
 * the gradients that flow on to other ops and to the leaves in `now` (the input-gradient pass, a
 * zero-bubble pipeline's B), and holds back the gradients of the other leaves — the weights: the
 * weight GEMMs of linear layers (their input-gradient GEMM runs now), and whole ops all of whose
 * inputs are such leaves (an embedding's scatter). The returned handle's run() does that work
 * later (the W pass) and only then fires the weights' post-accumulate-grad hooks, so gradient
 * buckets and ZeRO see each gradient once it is final. The gradients equal an ordinary backward's
 * (same kernels on the same tensors). A node between an op and a weight that only that op consumes
 * and whose gradients go to weights alone (a gradient scale, an autocast cast) is absorbed: it runs
 * with the op's deferred work, so the weight GEMM behind it waits too. Ops inside recompute() blocks,
 * and ops without a split whose inputs mix weights and activations (LayerNorm), compute everything at once.
 */
export function deferWeightGrads<T>(fn: () => T, opts: DeferWeightGradsOptions = {}): DeferredBackward<T> {
  if (typeof fn !== 'function') throw new ArgumentError(`deferWeightGrads: fn must be a function, got ${typeof fn}`);
  if (deferral !== null) throw new AutogradError('deferWeightGrads: already inside deferWeightGrads() (they do not nest)');
  if (inBackward()) throw new AutogradError('deferWeightGrads: called inside a backward() (from a hook or an op\'s backward)');
  const ctx = { now: new Set(opts.now ?? []), groups: [] as DeferredGroup[] };
  deferral = ctx;
  let result: T;
  try {
    result = fn();
    if (result instanceof Promise) throw new ArgumentError('deferWeightGrads: fn must be synchronous (backward() is)');
  } catch (e) {
    new DeferredWeightGrads(ctx.groups).dispose();
    throw e;
  } finally {
    deferral = null;
  }
  return { result, weightGrads: new DeferredWeightGrads(ctx.groups) };
}
