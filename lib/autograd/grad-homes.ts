// Where a leaf's gradient lives: the gradient allocators that give a leaf's first gradient a home
// (a data-parallel bucket's view), and the targets that let an op's backward write that gradient
// straight into its home instead of into a tensor of its own that backward() then copies in.
import { AutogradError, ArgumentError } from '../errors.js';
import { sameShape } from '../shape.js';
import { checkTensor, Tensor } from '../tensor.js';

/** What a hook registration returns: `remove()` unregisters it (a second call does nothing). */
export interface RemovableHandle {
  /** Unregisters the hook; later calls do nothing. */
  remove(): void;
}

/**
 * Appends item to leaf's list in lists; the handle takes it out again (once). onLeaves(+1) runs
 * when leaf's list is made, onLeaves(-1) when it empties and goes.
 */
export function addToLeaf<T>(lists: WeakMap<Tensor, T[]>, leaf: Tensor, item: T, onLeaves?: (delta: 1 | -1) => void): RemovableHandle {
  let list = lists.get(leaf);
  if (!list) { list = []; lists.set(leaf, list); onLeaves?.(1); }
  list.push(item);
  let removed = false;
  return {
    remove() {
      if (removed) return;
      removed = true;
      const l = lists.get(leaf)!;
      l.splice(l.indexOf(item), 1);
      if (l.length === 0) { lists.delete(leaf); onLeaves?.(-1); }
    },
  };
}

/**
 * Gives a leaf's gradient a home: called when backward() has a gradient for `leaf` and `leaf.grad`
 * is empty (or, for an op that can write its gradient where it is told, just before that op computes
 * it: {@link GradTarget}); returns an uninitialized tensor of the leaf's shape and dtype that the
 * gradient is written or copied into and that becomes `leaf.grad` (later gradients accumulate into
 * it in place), or null to let backward keep the gradient it computed. A data-parallel gradient
 * buffer hands out views of its flat buckets this way (Megatron's main_grad), so gradients are never
 * copied into buckets.
 */
export type GradAllocator = (leaf: Tensor) => Tensor | null;

const gradAllocators = new WeakMap<Tensor, GradAllocator[]>();

/**
 * Registers where `leaf`'s gradient is allocated when it has none ({@link GradAllocator}). With
 * several allocators the first registered that returns a tensor wins.
 */
export function registerGradAllocator(leaf: Tensor, allocate: GradAllocator): RemovableHandle {
  checkTensor(leaf, 'registerGradAllocator', 'leaf');
  if (typeof allocate !== 'function') throw new ArgumentError(`registerGradAllocator: allocate must be a function, got ${typeof allocate}`);
  if (leaf.gradFn !== null) throw new AutogradError(`registerGradAllocator: ${leaf.describe()} is computed by '${(leaf.gradFn as { name?: string }).name}'; only leaves have a .grad to allocate`);
  return addToLeaf(gradAllocators, leaf, allocate);
}

/** The tensor a registered allocator gives leaf's gradient, checked, or null. */
export function allocatedGrad(leaf: Tensor): Tensor | null {
  for (const allocate of gradAllocators.get(leaf) ?? []) {
    const t = allocate(leaf);
    if (t === null) continue;
    if (!(t instanceof Tensor) || t.disposed || t.dtype !== leaf.dtype || t.device !== leaf.device || !sameShape(t.shape, leaf.shape)) {
      throw new AutogradError(`backward: the gradient allocator of ${leaf.describe()} returned ${t instanceof Tensor ? t.toString() : String(t)}, not a live tensor of its shape, dtype and device`);
    }
    return t;
  }
  return null;
}

/**
 * Where an op's backward may write the gradient of its input `i` itself. The op calls it right
 * before it computes that gradient; it returns an uninitialized tensor of the input's shape, dtype
 * and device (the leaf's home from its {@link GradAllocator}) that the op overwrites completely and
 * returns at position `i`, or null: the op makes its own tensor as usual. An op may ignore it; one
 * that takes a tensor must return it at that position (or throw).
 */
export type GradTarget = (i: number) => Tensor | null;

/** A GradTarget that never hands out a tensor. */
export const noTarget: GradTarget = () => null;

/**
 * The homes handed to one op's backward through its GradTarget. Only a leaf edge gets one, when its
 * gradient is empty, an allocator places it and it sits at one position of the op only (a leaf at
 * two positions receives two gradients that add up; they go the ordinary way).
 */
export class GradTargets {
  readonly #edges: readonly unknown[];
  readonly #handed = new Map<number, Tensor>();
  /** What the op's backward receives. */
  readonly target: GradTarget = (i) => {
    const leaf = this.#edges[i];
    if (!(leaf instanceof Tensor) || this.#handed.has(i) || !gradAllocators.has(leaf) || leaf.disposed || (leaf.grad && !leaf.grad.disposed)) return null;
    if (this.#edges.indexOf(leaf) !== i || this.#edges.lastIndexOf(leaf) !== i) return null;
    const home = allocatedGrad(leaf);
    if (home) this.#handed.set(i, home);
    return home;
  };

  constructor(edges: readonly unknown[]) { this.#edges = edges; }

  /** The home handed out for input `i`, if any. */
  at(i: number): Tensor | undefined { return this.#handed.get(i); }

  /**
   * The op threw, or gave no gradient at a position it took a home for: that leaf does not keep the
   * unwritten home as its gradient (an allocator may have made it `.grad` already). Every position when `i` is omitted.
   */
  abandon(i?: number): void {
    for (const [j, home] of this.#handed) {
      if (i !== undefined && j !== i) continue;
      const leaf = this.#edges[j] as Tensor;
      if (leaf.grad === home) leaf.grad = null;
      this.#handed.delete(j);
    }
  }
}
