// What a rank saves and loads: its training state as parts of global tensors. A model's parameters
// are `model/<name>` (a tensor-parallel slice says where it sits through Parameter.partOf), the
// optimizer's state `optim/<state>/<name>` (same shape as the parameter); under ZeRO both come from
// the masters, each rank holding a flat range of every parameter. Replicas (data-parallel copies,
// tensor-parallel copies of norms and biases, the tied embedding's second copy) load everything; of
// data-parallel replicas each saves a contiguous share of the state, of the other copies one saves.
import { ArgumentError } from '../errors.js';
import { dtypeSize } from '../dtype.js';
import type { Module, Parameter, TensorSplit } from '../nn/module.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Tensor } from '../tensor.js';
import type { LocalChunk } from '../parallel/zero/chunks.js';
import type { TrainerHoldings } from '../parallel/trainer.js';

/** `count` elements at `offset` of `tensor` are elements [start, start + count) of the (split) global tensor `key`. */
export interface StatePart {
  /** Name of the global tensor: `model/<name>` or `optim/<state>/<name>`. */
  key: string;
  /** The global tensor's shape. */
  fullShape: number[];
  /** The tensor-parallel split this part is a slice of, or null for the whole tensor. */
  split: TensorSplit | null;
  /** First element of the (split) global tensor held here. */
  start: number;
  /** Number of elements. */
  count: number;
  /** The local tensor holding the elements. */
  tensor: Tensor;
  /** Element offset of the part in `tensor`. */
  offset: number;
  /** This rank writes the part (false for a replica another rank writes). */
  save: boolean;
}

/** An optimizer state's step count, per parameter name. */
export interface StepCounter {
  /** The parameter's name. */
  name: string;
  /** The state's step count, or null when the parameter has no state yet. */
  get(): number | null;
  /** Sets the step count (creating the state if needed). */
  set(step: number): void;
}

/** A rank's training state for a checkpoint. */
export interface RankState {
  /** The tensors saved and loaded. */
  parts: StatePart[];
  /** The step counts of the optimizer state, per parameter. */
  steps: StepCounter[];
  /** The optimizer whose group hyperparameters are saved and restored (group by group). */
  optimizer: Optimizer<{ lr: number }> | null;
}

const fullShapeOf = (p: Tensor) => ((p as Parameter).partOf ? [...(p as Parameter).partOf!.fullShape] : [...p.shape]);
const splitOf = (p: Tensor) => (p as Parameter).partOf ?? null;

/**
 * Cuts the saved parts between `share.count` identical replicas: the parts laid end to end (in bytes,
 * in their order, which is the same on every replica) are split into `count` even, contiguous byte
 * ranges, and replica `index` keeps what falls in its range (element boundaries: a cut inside an
 * element goes to the nearer boundary, the same for both neighbours). So the replicas write one copy
 * between them, each about 1/count of the bytes, in about parts + count pieces in all (not parts × count).
 */
function shareParts(parts: StatePart[], share: { index: number; count: number }): StatePart[] {
  const saved = parts.filter((p) => p.save);
  const total = saved.reduce((s, p) => s + p.count * dtypeSize(p.tensor.dtype), 0);
  const lo = (total * share.index) / share.count, hi = (total * (share.index + 1)) / share.count;
  let at = 0;
  return parts.map((p) => {
    if (!p.save) return p;
    const size = dtypeSize(p.tensor.dtype), bytes = p.count * size, first = at;
    at += bytes;
    const boundary = (cut: number) => Math.min(p.count, Math.max(0, Math.round((cut - first) / size)));
    const from = boundary(lo), to = boundary(hi);
    return { ...p, start: p.start + from, count: to - from, offset: p.offset + from };
  });
}

/**
 * A whole model and (optionally) its optimizer in one process, or one rank of a model-parallel job
 * without ZeRO. `skip`: parameters another rank saves. `share`: this rank is replica `index` of `count`
 * identical copies (the data-parallel group) and saves only its share of the state (a contiguous 1/count
 * of the saved bytes), so the replicas write one copy between them, in parallel. With `forLoad`,
 * every part is the whole tensor (a load fills everything; `share` is ignored) and the optimizer's state
 * is created where missing (zero-filled).
 */
export function plainState(model: Module, optimizer: Optimizer<{ lr: number }> | null,
  opts: { skip?: ReadonlySet<Tensor>; share?: { index: number; count: number }; forLoad?: boolean; include?: (p: Tensor) => boolean } = {}): RankState {
  if ('saveReplicas' in opts) throw new ArgumentError('checkpoint: plainState\'s saveReplicas option is gone: pass share { index, count } (data-parallel replicas save a share each)');
  const share = opts.forLoad ? undefined : opts.share;
  if (share && !(Number.isInteger(share.count) && share.count >= 1 && Number.isInteger(share.index) && share.index >= 0 && share.index < share.count)) {
    throw new ArgumentError(`checkpoint: replica share ${share.index} of ${share.count} is not a valid share`);
  }
  const include = opts.include;
  const named = include ? model.namedParameters().filter(([, p]) => include(p)) : model.namedParameters();
  const write = (p: Tensor) => !opts.skip?.has(p);
  const part = (key: string, p: Tensor, t: Tensor): StatePart =>
    ({ key, fullShape: fullShapeOf(p), split: splitOf(p), start: 0, count: p.size, tensor: t, offset: 0, save: write(p) });
  const parts: StatePart[] = named.map(([name, p]) => part(`model/${name}`, p, p));
  const steps: StepCounter[] = [];
  if (optimizer) {
    const inOptimizer = new Set(optimizer.paramGroups.flatMap((g) => g.params));
    for (const [name, p] of named) {
      if (!inOptimizer.has(p)) continue;
      if (opts.forLoad) optimizer.ensureState(p);
      const s = optimizer.state.get(p);
      steps.push({ name, get: () => optimizer.state.get(p)?.step ?? null, set: (n) => { optimizer.ensureState(p).step = n; } });
      if (!s) continue;
      for (const [stateName, t] of Object.entries(s.tensors)) {
        parts.push(part(`optim/${stateName}/${name}`, p, t));
      }
    }
  }
  return { parts: share && share.count > 1 ? shareParts(parts, share) : parts, steps, optimizer };
}

/**
 * One rank of a ZeRO-sharded job: parameters and optimizer state from the masters (this rank's flat
 * chunk of every parameter). At stages 1 and 2 the parameters themselves are whole on every rank,
 * so a load fills them too (from the checkpoint: no collective needed).
 */
export function zeroState(model: Module, zero: { stage: number; inner: Optimizer<{ lr: number }>; masters: readonly Tensor[]; params: readonly Tensor[]; localChunks(): LocalChunk[] },
  opts: { skip?: ReadonlySet<Tensor>; forLoad?: boolean } = {}): RankState {
  const names = new Map<Tensor, string>(model.namedParameters().map(([n, p]) => [p, n]));
  const parts: StatePart[] = [];
  const steps: StepCounter[] = [];
  const inner = zero.inner;
  if (opts.forLoad) for (const m of zero.masters) inner.ensureState(m);
  for (const c of zero.localChunks()) {
    const name = names.get(c.param);
    if (name === undefined) throw new ArgumentError(`checkpoint: a parameter of the ZeRO optimizer (${c.param.describe()}) is not one of the model's`);
    const base = { fullShape: fullShapeOf(c.param), split: splitOf(c.param), start: c.start, count: c.count, offset: c.masterOffset, save: !opts.skip?.has(c.param) };
    const master = zero.masters[c.master]!;
    parts.push({ ...base, key: `model/${name}`, tensor: master });
    const s = inner.state.get(master);
    steps.push({ name, get: () => inner.state.get(master)?.step ?? null, set: (n) => { inner.ensureState(master).step = n; } });
    if (s) for (const [stateName, t] of Object.entries(s.tensors)) parts.push({ ...base, key: `optim/${stateName}/${name}`, tensor: t });
  }
  if (opts.forLoad && zero.stage !== 3) {
    // The whole parameters this optimizer shards (under expert parallelism two optimizers share the model).
    for (const p of zero.params) parts.push({ key: `model/${names.get(p)!}`, fullShape: fullShapeOf(p), split: splitOf(p), start: 0, count: p.size, tensor: p, offset: 0, save: false });
  }
  return { parts, steps, optimizer: inner };
}

/**
 * The training state of one rank of a trainer, from what it says it holds (ParallelTrainer.checkpointHoldings):
 * ZeRO's chunks, or the whole parameters and optimizer state with this rank's share of the replicas'.
 * Under expert parallelism the experts are a second holding: their copies are the expert-data-parallel
 * group (ZeRO's chunks over it, or each copy saving its share), everything else the data-parallel group's.
 */
export function trainerState(holdings: TrainerHoldings<{ lr: number }>, opts: { forLoad?: boolean } = {}): RankState {
  const skip = holdings.savedElsewhere;
  const experts = holdings.experts;
  const dense = (include?: (p: Tensor) => boolean): RankState => (holdings.zero ? zeroState(holdings.model, holdings.zero, { skip, ...opts })
    : plainState(holdings.model, holdings.optimizer, { skip, ...(holdings.replica ? { share: holdings.replica } : {}), ...(include ? { include } : {}), ...opts }));
  if (!experts) return dense();
  const isExpert = (p: Tensor) => experts.params.has(p);
  const d = dense((p) => !isExpert(p));
  const e = experts.zero ? zeroState(holdings.model, experts.zero, { skip, ...opts })
    : plainState(holdings.model, experts.optimizer, { skip, include: isExpert, ...(experts.replica ? { share: experts.replica } : {}), ...opts });
  return { parts: [...d.parts, ...e.parts], steps: [...d.steps, ...e.steps], optimizer: d.optimizer ?? e.optimizer };
}
