// In-job recovery's shrink and grow (issue #37 item 4; docs/recovery.md "Shrink without a spare"): which
// data-parallel replicas go on when a rank is lost and no hot spare is free, under which layout, and
// which ranks of the current world become which ranks of the next. Pure arithmetic over the mesh's
// coordinates (parallel/mesh.ts) and the one layout rule book (parallel/layout.ts's
// resolveTrainingLayout): every rank computes the same plan from the same facts.
import { ArgumentError } from '../errors.js';
import { MeshLayout } from '../parallel/mesh.js';
import { resolveTrainingLayout, type LayoutFlags, type LayoutModelShape, type TrainingLayout } from '../parallel/layout.js';

/** The next world of a reshape: who is in it, in which order, under which layout. */
export interface ReshapePlan<F extends LayoutFlags = LayoutFlags> {
  /** The job ranks (the launcher's RANK slots) of the next world, by their rank in it. */
  members: number[];
  /** The layout of the next world. */
  layout: TrainingLayout;
  /** The flags that give that layout (the current flags with dp and micro-batches replaced; zero 0 for one replica). */
  flags: F;
}

/** The mesh of a training layout, as assembly's initializeParallel lays it out (default order). */
function meshOf(layout: TrainingLayout): MeshLayout {
  return new MeshLayout({ tp: layout.tp, pp: layout.pp, dp: layout.dp, ...(layout.cp ? { cp: layout.cp } : {}), ...(layout.ep ? { ep: layout.ep } : {}) });
}

/**
 * The shrunk world after losing the world ranks `lost` of a world laid out as `layout` (`members[w]`
 * is world rank w's job rank): every replica (the ranks sharing a data-parallel coordinate) that lost
 * a rank leaves, and the largest number of the intact ones that the rule book accepts goes on with the
 * same global batch, split into proportionally more micro-batches (each micro-batch keeps its rows,
 * so activation memory stays as it was). Returns the plan, or the reason there is none (dp = 1, every
 * replica hit, or no smaller dp the layout rules accept).
 */
export function planShrink<F extends LayoutFlags>(o: {
  layout: TrainingLayout; flags: F; members: readonly number[]; lost: readonly number[];
  shape: LayoutModelShape; globalBatch: number;
  /**
   * What each surviving job rank said of its memory (shrinkMemoryOf): a smaller world one of whose
   * members would pass its device's limit is not chosen. Absent: memory is not checked.
   */
  memory?: ReadonlyMap<number, ShrinkMemory>;
}): ReshapePlan<F> | { refused: string } {
  const { layout } = o;
  const mesh = meshOf(layout);
  if (o.members.length !== mesh.worldSize) throw new ArgumentError(`planShrink: the world has ${o.members.length} ranks, the layout ${mesh.worldSize}`);
  if (layout.dp === 1) return { refused: 'the layout has one data-parallel replica (dp 1): nothing to shrink to' };
  const hit = new Set(o.lost.map((w) => {
    if (!Number.isInteger(w) || w < 0 || w >= mesh.worldSize) throw new ArgumentError(`planShrink: lost rank ${w} is outside the world`);
    return mesh.coords(w).dp;
  }));
  const intact = Array.from({ length: layout.dp }, (_, i) => i).filter((i) => !hit.has(i));
  if (intact.length === 0) return { refused: 'every data-parallel replica lost a rank' };
  const problems: string[] = [];
  for (let d = intact.length; d >= 1; d--) {
    const total = layout.microBatches * layout.dp;
    if (total % d !== 0) { problems.push(`dp ${d}: ${total} micro-batches of the global batch do not split over ${d} replicas`); continue; }
    const worldSize = mesh.worldSize / layout.dp * d;
    // One replica has nothing to shard ZeRO's state over: it holds the whole state, as zero 0 does.
    const flags: F = { ...o.flags, dp: d, microBatches: total / d, ...(d === 1 && layout.zero > 0 ? { zero: 0, offload: false } : {}) };
    let next: TrainingLayout;
    try {
      next = resolveTrainingLayout(flags, o.shape, worldSize, o.globalBatch);
    } catch (e) {
      if (!(e instanceof ArgumentError)) throw e;
      problems.push(`dp ${d}: ${e.message}`);
      continue;
    }
    const nextMesh = meshOf(next);
    const kept = intact.slice(0, d);
    const members = Array.from({ length: worldSize }, (_, r) => {
      const c = nextMesh.coords(r);
      return o.members[mesh.rankOf({ tp: c.tp, pp: c.pp, cp: c.cp, dp: kept[c.dp]! })]!;
    });
    const tight = o.memory ? tooFull(o.memory, members, d) : undefined;
    if (tight) { problems.push(`dp ${d}: ${tight}`); continue; }
    return { members, layout: next, flags };
  }
  return { refused: `no smaller data-parallel layout fits (${problems.join('; ')})` };
}

/** What a rank says of its memory when the job may shrink (every survivor publishes its own; the plan reads them all). */
export interface ShrinkMemory {
  /** The most its training device can hold (bytes): the GPU's memory, NODETRON_MEMORY_LIMIT on the cpu; 0 when none is known (then not checked). */
  limit: number;
  /** Its predicted peak (bytes) with d data-parallel replicas, by d (1 .. dp − 1). */
  peaks: Record<string, number>;
}

const MiB = 2 ** 20;

// The first member of a d-replica world whose predicted peak passes its limit, as a refusal.
function tooFull(memory: ReadonlyMap<number, ShrinkMemory>, members: readonly number[], d: number): string | undefined {
  for (const j of members) {
    const m = memory.get(j);
    const peak = m?.peaks[String(d)];
    if (!m || !(m.limit > 0) || peak === undefined) continue;
    if (peak > m.limit) return `job rank ${j} would need about ${(peak / MiB).toFixed(1)} MiB, above its device's ${(m.limit / MiB).toFixed(1)} MiB`;
  }
  return undefined;
}
