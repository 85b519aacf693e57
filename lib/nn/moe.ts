// Mixture of experts (Mixtral, Qwen-MoE, DeepSeek-MoE): a router (linear → softmax → top-k, the k
// weights renormalized), experts that are SwiGLU MLPs run as a grouped GEMM (one GEMM per expert over
// the rows sorted by expert: a gather by index, the experts, a scatter back, all with gradients),
// optional shared experts every token goes through (Qwen2-MoE's gated by a sigmoid per token), dropless routing or a capacity factor that
// drops overflow, and the auxiliary losses (Switch's load balancing, the router z-loss).
//
// The auxiliary losses reach the training objective on every path (one process, recomputed blocks,
// pipeline stages) the way Megatron-core does it: the layer's output passes through an identity whose
// backward also seeds the auxiliary loss's graph with `coefficient · moeAuxLossScale()`, so a block's
// backward (re-run or not, on whichever stage) differentiates loss + aux. The scale is the factor the
// trainer applied to the loss before backward: a layer's step context when its trainer gives it one
// (ParallelTrainer passes 1/m for m micro-batches to its own model's layers, for its step only), else
// the process default (1 for loss.backward(); a loop of its own sets it with setMoEAuxLossScale). The
// value of the auxiliary loss is reported beside the LM loss (stats).
//
// Where experts live: every expert in this process by default; an MoEParallel (lib/parallel's
// expert parallelism) holds a contiguous range of them here and moves rows to the ranks holding
// their experts and back. The routing statistics that feed the load-balancing loss (tokens per
// expert) can be summed over the data-parallel ranks, so a data- or expert-parallel job has the loss
// of one process running the whole batch.
import { alias, inBackward, needsGrad, record } from '../autograd/engine.js';
import { noGrad } from '../autograd/grad-mode.js';
import { full, tensor, zeros } from '../creation.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { add, cat, embedding, exp, linear, log, max, mean, mul, scale, softmax, sub, sum, swiglu, tanh } from '../ops/index.js';
import { emptyLike } from '../ops/common.js';
import { residualStream } from '../ops/autocast.js';
import { dtypeSize } from '../dtype.js';
import { checkTensor, type Tensor } from '../tensor.js';
import { normal } from './init.js';
import { newParameter, type LayerOptions } from './layers.js';
import { Module, type Parameter } from './module.js';

/** The shape and options of a mixture-of-experts layer (in a GPTConfig, `moe`). */
export interface MoEConfig {
  /** Routed experts (>= 1). */
  experts: number;
  /** Experts per token (1 <= topK <= experts). */
  topK: number;
  /** Width of each expert's SwiGLU hidden layer (default 4 · nEmbd, the dense MLP's). */
  hidden?: number;
  /** Shared experts every token goes through (DeepSeek-MoE, Qwen2-MoE), as one SwiGLU MLP of sharedExperts · hidden (default 0). */
  sharedExperts?: number;
  /** Width of the shared experts' SwiGLU MLP (default sharedExperts · hidden; Qwen2-MoE's shared_expert_intermediate_size). Needs sharedExperts >= 1. */
  sharedHidden?: number;
  /** Scale the shared experts' output per token by sigmoid(x · sharedGate), a [1, C] weight (Qwen2-MoE's shared_expert_gate); default false. Needs sharedExperts >= 1. */
  sharedGate?: boolean;
  /** Renormalize the k chosen probabilities to sum to 1 (Mixtral; default true; Qwen2-MoE's norm_topk_prob false keeps them). */
  normalizeTopK?: boolean;
  /** Capacity factor: each expert takes at most ceil(factor · tokens · topK / experts) rows, the rest are dropped (counted); undefined: dropless. */
  capacityFactor?: number;
  /** Coefficient of the load-balancing loss (default 0.01). */
  auxLossCoef?: number;
  /** Coefficient of the router z-loss (default 0.001; 0 turns it off). */
  zLossCoef?: number;
  /** In a GPT: every n-th block (blocks n-1, 2n-1, ...) gets the MoE in its MLP slot (default 1: all blocks). */
  every?: number;
}

/** Checks an MoE config (calls name the caller); returns it with defaults filled in. */
export function checkMoEConfig(c: MoEConfig, call = 'MoE'): Required<Omit<MoEConfig, 'capacityFactor' | 'hidden' | 'sharedHidden' | 'sharedGate'>> & Pick<MoEConfig, 'capacityFactor' | 'hidden' | 'sharedHidden' | 'sharedGate'> {
  if (c === null || typeof c !== 'object') throw new ArgumentError(`${call}: the MoE config must be an object { experts, topK, ... }, got ${c === null ? 'null' : typeof c}`);
  const int = (v: unknown, what: string, min: number) => {
    if (!Number.isInteger(v) || (v as number) < min) throw new ArgumentError(`${call}: ${what} must be an integer >= ${min}, got ${String(v)}`);
  };
  int(c.experts, 'experts', 1);
  int(c.topK, 'topK', 1);
  if (c.topK > c.experts) throw new ArgumentError(`${call}: topK (${c.topK}) must not exceed the number of experts (${c.experts})`);
  if (c.hidden !== undefined) int(c.hidden, 'hidden', 1);
  if (c.sharedExperts !== undefined) int(c.sharedExperts, 'sharedExperts', 0);
  if (c.every !== undefined) int(c.every, 'every', 1);
  if (c.sharedHidden !== undefined) int(c.sharedHidden, 'sharedHidden', 1);
  if (c.sharedGate !== undefined && typeof c.sharedGate !== 'boolean') throw new ArgumentError(`${call}: sharedGate must be a boolean`);
  if ((c.sharedHidden !== undefined || c.sharedGate) && !((c.sharedExperts ?? 0) >= 1)) {
    throw new ArgumentError(`${call}: sharedHidden and sharedGate shape the shared experts, so sharedExperts must be >= 1 (got ${String(c.sharedExperts ?? 0)})`);
  }
  if (c.capacityFactor !== undefined && !(typeof c.capacityFactor === 'number' && c.capacityFactor > 0 && Number.isFinite(c.capacityFactor))) {
    throw new ArgumentError(`${call}: capacityFactor must be a finite number > 0 (or undefined for dropless routing), got ${String(c.capacityFactor)}`);
  }
  for (const k of ['auxLossCoef', 'zLossCoef'] as const) {
    const v = c[k];
    if (v !== undefined && !(typeof v === 'number' && v >= 0 && Number.isFinite(v))) throw new ArgumentError(`${call}: ${k} must be a finite number >= 0, got ${String(v)}`);
  }
  if (c.normalizeTopK !== undefined && typeof c.normalizeTopK !== 'boolean') throw new ArgumentError(`${call}: normalizeTopK must be a boolean`);
  return {
    experts: c.experts, topK: c.topK, hidden: c.hidden, sharedExperts: c.sharedExperts ?? 0, normalizeTopK: c.normalizeTopK ?? true,
    capacityFactor: c.capacityFactor, auxLossCoef: c.auxLossCoef ?? 0.01, zLossCoef: c.zLossCoef ?? 0.001, every: c.every ?? 1,
    ...(c.sharedHidden !== undefined ? { sharedHidden: c.sharedHidden } : {}), ...(c.sharedGate ? { sharedGate: true } : {}),
  };
}

// --- the auxiliary losses' gradient scale -------------------------------------------------------------

let auxLossScale = 1;

/**
 * What a trainer tells the MoE layers of the model it steps, for that step (MoE.stepContext): the
 * factor it multiplied the loss by before backward, which the auxiliary losses' gradient carries too.
 */
export interface MoEStepContext {
  /** The loss's scale (ParallelTrainer: 1/m for m micro-batches). */
  readonly auxLossScale: number;
}

/** The process default of the factor the loss was multiplied by before backward, for layers without a step context (default 1). */
export function moeAuxLossScale(): number { return auxLossScale; }

/** Sets the process default of the auxiliary losses' gradient scale (a training loop of its own; ParallelTrainer passes its scale to its layers instead); returns the previous value. */
export function setMoEAuxLossScale(s: number): number {
  if (typeof s !== 'number' || !Number.isFinite(s)) throw new ArgumentError(`setMoEAuxLossScale: the scale must be a finite number, got ${String(s)}`);
  const prev = auxLossScale;
  auxLossScale = s;
  return prev;
}

/** out unchanged; backward passes the gradient on and seeds aux (a scalar) with the scale `scaleOf` gives then. */
function attachAuxLoss(out: Tensor, aux: Tensor, scaleOf: () => number): Tensor {
  if (!needsGrad(out, aux)) return out;
  const y = alias(out);
  return record('moeAuxLoss', y, [out, aux], (g) => [g, full(aux.shape, scaleOf(), { device: g.device, dtype: aux.dtype })]);
}

/** Identity forward; backward multiplies the gradient by s (expert weights under expert parallelism). */
export function scaleGrad(x: Tensor, s: number): Tensor {
  if (s === 1 || !needsGrad(x)) return x;
  return record('scaleGrad', alias(x), [x], (g) => [scale(g, s)]);
}

// --- SwiGLU ---------------------------------------------------------------------------------------------

/** A SwiGLU MLP without biases (Llama's, Mixtral's experts): down(silu(gate(x)) · up(x)). */
export class SwiGLUExpert extends Module {
  /** gate [hidden, C] (Mixtral's w1). */
  readonly gate: Parameter;
  /** up [hidden, C] (Mixtral's w3). */
  readonly up: Parameter;
  /** down [C, hidden] (Mixtral's w2). */
  readonly down: Parameter;
  /**
   * Weights N(0, std) for gate and up and N(0, downStd) for down, drawn in that order from layer.generator.
   * @param c Input and output width.
   * @param hidden Hidden width.
   */
  constructor(readonly c: number, readonly hidden: number, layer: LayerOptions, std: number, downStd: number) {
    super();
    this.gate = normal(newParameter([hidden, c], layer, 'MoE'), 0, std, layer.generator) as Parameter;
    this.up = normal(newParameter([hidden, c], layer, 'MoE'), 0, std, layer.generator) as Parameter;
    this.down = normal(newParameter([c, hidden], layer, 'MoE'), 0, downStd, layer.generator) as Parameter;
  }
  /** x [..., C] → [..., C]; gradScale multiplies the weights' gradients (expert parallelism's 1/ep). */
  forward(x: Tensor, gradScale = 1): Tensor {
    const w = (p: Parameter) => scaleGrad(p, gradScale);
    return linear(swiglu(linear(x, w(this.gate)), linear(x, w(this.up))), w(this.down));
  }
}

// --- routing (on the host) ------------------------------------------------------------------------------

/** Where each token's k slots go: the host side of routing (exported for tests). */
export interface Routing {
  /** Chosen experts, [N·k] (token-major; each token's experts in descending probability). */
  experts: Int32Array;
  /** Rows routed to each expert before drops [E]. */
  counts: number[];
  /** Rows each expert computes (after capacity drops) [E]. */
  kept: number[];
  /** Token of each computed row, rows sorted by expert (stable in token order) [Σ kept]. */
  gather: Int32Array;
  /** For each slot (token-major [N·k]): its row among the computed ones, or Σ kept (a zero row) when dropped. */
  combine: Int32Array;
  /** Slots dropped by the capacity. */
  dropped: number;
}

/** Top-k of each row of probs [N, E] (ties to the lower expert), sorted by expert, with capacity drops. */
export function routeTopK(probs: ArrayLike<number>, n: number, e: number, k: number, capacity?: number): Routing {
  const experts = new Int32Array(n * k);
  const counts = new Array<number>(e).fill(0);
  const idx = Array.from({ length: e }, (_, i) => i);
  for (let t = 0; t < n; t++) {
    const row = (a: number) => probs[t * e + a]!;
    const order = idx.slice().sort((a, b) => row(b) - row(a) || a - b);
    for (let j = 0; j < k; j++) { experts[t * k + j] = order[j]!; counts[order[j]!]!++; }
  }
  const kept = counts.map((c) => (capacity === undefined ? c : Math.min(c, capacity)));
  const start: number[] = [];
  let total = 0;
  for (let x = 0; x < e; x++) { start.push(total); total += kept[x]!; }
  const gather = new Int32Array(total), combine = new Int32Array(n * k);
  const filled = new Array<number>(e).fill(0);
  let dropped = 0;
  for (let t = 0; t < n; t++) {
    for (let j = 0; j < k; j++) {
      const x = experts[t * k + j]!;
      if (filled[x]! < kept[x]!) {
        const row = start[x]! + filled[x]!++;
        gather[row] = t;
        combine[t * k + j] = row;
      } else {
        combine[t * k + j] = total;
        dropped++;
      }
    }
  }
  return { experts, counts, kept, gather, combine, dropped };
}

// --- the layer ------------------------------------------------------------------------------------------

/** Routing statistics summed over the forwards since the last takeStats(). */
export interface MoEStats {
  /** Forwards counted (micro-batches × layers when summed over a model). */
  forwards: number;
  /** Rows routed to each expert before drops (summed over the data-parallel ranks when the layer sums its counts). */
  tokensPerExpert: number[];
  /** Routed slots (tokens · topK) and dropped slots. */
  routed: number;
  /** Routed slots dropped by the capacity factor. */
  dropped: number;
  /** Sum of the load-balancing losses' values (unscaled by the coefficient) and of the z-losses'. */
  loadBalanceLoss: number;
  /** Sum of the z-losses' values (unscaled). */
  zLoss: number;
  /** Sum of the auxiliary losses as added to the objective (coefficients applied). */
  auxLoss: number;
}

/** What expert parallelism (lib/parallel/expert-parallel.ts) gives an MoE layer. */
export interface MoEParallel {
  /** The experts [expertStart, expertEnd) of the global list are held in this process. */
  readonly expertStart: number;
  /** One past the last expert held here. */
  readonly expertEnd: number;
  /** Multiplies the local experts' weight gradients (1/ep: each expert sees ep ranks' tokens, each rank's loss a local mean). */
  readonly expertGradScale: number;
  /** The rows routed to each expert summed over the ranks that split the batch (the load-balancing loss then equals one process's). */
  sumCounts?(counts: number[]): number[];
  /**
   * xs [S, C]: rows sorted by global expert, counts[e] of them for expert e (every expert). Sends them
   * to the ranks holding their experts, runs `local` on the rows received (sorted by local expert,
   * localCounts[j] for local expert j), returns the results in xs's order.
   */
  dispatch?(xs: Tensor, counts: number[], local: (rows: Tensor, localCounts: number[]) => Tensor): Tensor;
}

/** Options of {@link MoE}. */
export interface MoEOptions extends LayerOptions {
  /** Std of the router, gate and up weights (default 0.02). */
  std?: number;
  /** Std of the down projections (default std). */
  downStd?: number;
  /** Expert parallelism and router count sums (default: every expert here, counts local). */
  parallel?: MoEParallel;
}

/** The mixture-of-experts layer: x [..., C] → [..., C]; see the file's comment. */
export class MoE extends Module {
  /** The router's weight [experts, C] (no bias). */
  readonly router: Parameter;
  /** The routed experts held here: global experts expertStart .. expertStart + experts.length - 1. */
  readonly experts: SwiGLUExpert[];
  /** The shared experts as one SwiGLU MLP, or null. */
  readonly shared: SwiGLUExpert | null;
  /** The shared experts' gate [1, C] (config.sharedGate: their output times sigmoid(x · sharedGate)), or null. */
  readonly sharedGate: Parameter | null;
  /** The checked config. */
  readonly config: ReturnType<typeof checkMoEConfig>;
  /** The first global expert held here. */
  readonly expertStart: number;
  /**
   * The step context of the trainer stepping this layer (ParallelTrainer sets it for its step and
   * clears it after); null: the auxiliary losses' gradient takes the process default (setMoEAuxLossScale).
   */
  stepContext: MoEStepContext | null = null;
  readonly #parallel: MoEParallel | null;
  #stats: MoEStats;

  /**
   * Draws the router, then every expert (gate, up, down) in global order, then the shared experts and
   * their gate, from layer.generator; under expert parallelism the experts held elsewhere are drawn and
   * discarded, so every layout starts from the same weights.
   */
  /**
   * @param nEmbd The input and output width (C).
   * @param config Experts, top-k, capacity, auxiliary-loss coefficients.
   * @param opts Device, dtype, generator, init stds, expert parallelism.
   */
  constructor(readonly nEmbd: number, config: MoEConfig, opts: MoEOptions = {}) {
    super();
    if (!Number.isInteger(nEmbd) || nEmbd < 1) throw new ArgumentError(`MoE: nEmbd must be a positive integer, got ${nEmbd}`);
    const cfg = checkMoEConfig(config);
    this.config = cfg;
    const hidden = cfg.hidden ?? 4 * nEmbd;
    const std = opts.std ?? 0.02, downStd = opts.downStd ?? std;
    const layer: LayerOptions = { device: opts.device, dtype: opts.dtype, generator: opts.generator };
    const par = opts.parallel ?? null;
    const start = par?.expertStart ?? 0, end = par?.expertEnd ?? cfg.experts;
    if (!(Number.isInteger(start) && Number.isInteger(end) && start >= 0 && end <= cfg.experts && start < end)) {
      throw new ArgumentError(`MoE: the experts held here [${start}, ${end}) must be a non-empty range of the ${cfg.experts} experts`);
    }
    this.#parallel = par;
    this.expertStart = start;
    this.router = normal(newParameter([cfg.experts, nEmbd], layer, 'MoE'), 0, std, layer.generator) as Parameter;
    this.experts = [];
    for (let e = 0; e < cfg.experts; e++) {
      const expert = new SwiGLUExpert(nEmbd, hidden, layer, std, downStd);
      if (e >= start && e < end) this.experts.push(expert);
      else expert.dispose();
    }
    this.shared = cfg.sharedExperts > 0 ? new SwiGLUExpert(nEmbd, cfg.sharedHidden ?? cfg.sharedExperts * hidden, layer, std, downStd) : null;
    this.sharedGate = cfg.sharedGate ? normal(newParameter([1, nEmbd], layer, 'MoE'), 0, std, layer.generator) as Parameter : null;
    this.#stats = emptyStats(cfg.experts);
  }

  /** Children named by global expert index (`experts.5` is expert 5 on whichever rank holds it), so names agree across layouts. */
  override *namedChildren(): Generator<[string, Module]> {
    for (const [name, child] of super.namedChildren()) {
      const m = /^experts\.(\d+)$/.exec(name);
      yield [m ? `experts.${this.expertStart + Number(m[1])}` : name, child];
    }
  }

  /** Routing statistics since the last call (then reset). */
  takeStats(): MoEStats {
    const s = this.#stats;
    this.#stats = emptyStats(this.config.experts);
    return s;
  }

  /** Runs the local experts on rows sorted by local expert (counts[j] rows for local expert j). */
  #runLocal(rows: Tensor, counts: number[]): Tensor {
    const scaleW = this.#parallel?.expertGradScale ?? 1;
    const pieces = splitRows(rows, counts);
    const outs = this.experts.map((expert, j) => expert.forward(pieces[j]!, scaleW));
    return outs.length === 1 ? outs[0]! : cat(outs, 0);
  }

  /** x [..., C] → [..., C]. */
  forward(x: Tensor): Tensor {
    checkTensor(x, 'MoE.forward', 'x');
    const c = this.nEmbd;
    if (x.ndim < 1 || x.shape[x.ndim - 1] !== c) throw new ShapeError(`MoE.forward: x must be [..., ${c}], got ${x.describe()}`);
    const { experts: e, topK: k } = this.config;
    const n = x.size / c;
    const x2 = x.reshape([n, c]);
    const logits = linear(x2, this.router);
    const probs = softmax(logits, -1);
    const host = probs.toArraySync();
    const capacity = this.config.capacityFactor === undefined ? undefined : Math.ceil((this.config.capacityFactor * n * k) / e);
    const r = routeTopK(host, n, e, k, capacity);
    const dev = { device: x.device };
    // The k chosen probabilities [N, k], renormalized.
    const picks = Int32Array.from(r.experts, (ex, s) => Math.floor(s / k) * e + ex);
    let weights = embedding(tensor(picks, [n * k], { ...dev, dtype: 'i32' }), probs.reshape([n * e, 1])).reshape([n, k]);
    if (this.config.normalizeTopK && k > 1) weights = weights.div(sum(weights, 1, { keepdim: true }));
    // Gather rows by expert, run the experts (here, or through expert parallelism), scatter back.
    const xs = embedding(tensor(r.gather, [r.gather.length], { ...dev, dtype: 'i32' }), x2);
    const par = this.#parallel;
    const ys = par?.dispatch ? par.dispatch(xs, r.kept, (rows, counts) => this.#runLocal(rows, counts)) : this.#runLocal(xs, r.kept);
    const ysz = cat([ys, zeros([1, c], { ...dev, dtype: ys.dtype })], 0);
    const slots = embedding(tensor(r.combine, [n * k], { ...dev, dtype: 'i32' }), ysz).reshape([n, k, c]);
    // Weighted in f32 (the sum over k is an f32 op under autocast), then back to a 16-bit residual stream when there is one.
    let out = residualStream(sum(mul(slots, weights.reshape([n, k, 1])), 1));
    if (this.shared) {
      const y = this.shared.forward(x2);
      // sigmoid(z) = (1 + tanh(z/2)) / 2, per token [N, 1].
      out = add(out, this.sharedGate ? mul(y, add(scale(tanh(scale(linear(x2, this.sharedGate), 0.5)), 0.5), 0.5)) : y);
    }
    // Auxiliary losses: E · Σ_e f_e · P_e with f_e the share of routed slots of expert e (over the
    // batch of every rank that sums its counts) and P_e the mean router probability; z = mean lse².
    const counts = par?.sumCounts ? par.sumCounts(r.counts) : r.counts;
    const slotsTotal = counts.reduce((a, b) => a + b, 0);
    const f = tensor(Float32Array.from(counts, (v) => (slotsTotal > 0 ? v / slotsTotal : 0)), [e], { ...dev, dtype: probs.dtype });
    const lb = scale(sum(mul(mean(probs, 0), f)), e);
    const m = noGrad(() => max(logits, 1, { keepdim: true }));
    const lse = add(m, log(sum(exp(sub(logits, m)), 1, { keepdim: true })));
    const z = mean(mul(lse, lse));
    const { auxLossCoef: ca, zLossCoef: cz } = this.config;
    const aux = cz > 0 ? add(scale(lb, ca), scale(z, cz)) : scale(lb, ca);
    if (this.training && !inBackward()) {
      const s = this.#stats;
      s.forwards++;
      counts.forEach((v, i) => { s.tokensPerExpert[i]! += v; });
      s.routed += n * k;
      s.dropped += r.dropped;
      // One read of the three values (one device synchronization on cuda).
      const [lbv, zv, auxv] = noGrad(() => cat([lb, z, aux].map((t) => t.reshape([1])), 0)).toArraySync();
      s.loadBalanceLoss += lbv!;
      s.zLoss += zv!;
      s.auxLoss += auxv!;
    }
    // The context of the step this forward belongs to (a recomputed forward's too: it runs inside the step).
    const context = this.stepContext;
    out = attachAuxLoss(out, aux, () => context?.auxLossScale ?? auxLossScale);
    return out.reshape(x.shape);
  }
}

function emptyStats(e: number): MoEStats {
  return { forwards: 0, tokensPerExpert: new Array<number>(e).fill(0), routed: 0, dropped: 0, loadBalanceLoss: 0, zLoss: 0, auxLoss: 0 };
}

/** Sums statistics (of layers, or of steps). */
export function addMoEStats(a: MoEStats, b: MoEStats): MoEStats {
  return {
    forwards: a.forwards + b.forwards, tokensPerExpert: a.tokensPerExpert.map((v, i) => v + (b.tokensPerExpert[i] ?? 0)),
    routed: a.routed + b.routed, dropped: a.dropped + b.dropped, loadBalanceLoss: a.loadBalanceLoss + b.loadBalanceLoss,
    zLoss: a.zLoss + b.zLoss, auxLoss: a.auxLoss + b.auxLoss,
  };
}

/** The MoE layers of a module tree, in order. */
export function moeLayers(model: Module): MoE[] {
  const out: MoE[] = [];
  for (const [, m] of model.namedModules()) if (m instanceof MoE) out.push(m);
  return out;
}

/** x [S, C] split into consecutive row blocks of the given counts; backward concatenates the blocks' gradients (no full-size zeros per block). */
export function splitRows(x: Tensor, counts: readonly number[]): Tensor[] {
  const [s, c] = x.shape as [number, number];
  if (x.ndim !== 2 || counts.reduce((a, b) => a + b, 0) !== s) throw new ShapeError(`splitRows: counts ${JSON.stringify(counts)} do not add up to the rows of ${x.describe()}`);
  const pieces: Tensor[] = [];
  let at = 0;
  const grads: (Tensor | null)[] = counts.map(() => null);
  const track = needsGrad(x);
  let pending = track ? counts.length : 0;
  for (const [i, rows] of counts.entries()) {
    const piece = emptyLike(x, [rows, c]);
    if (rows > 0) piece.backend.copy(piece.storage, 0, x.storage, at * c * dtypeSize(x.dtype), rows * c * dtypeSize(x.dtype));
    at += rows;
    if (!track) { pieces.push(piece); continue; }
    // Each piece's node hands its gradient to the shared collector; the last one to arrive (the
    // pieces' backwards run in any order) returns the concatenation as x's gradient, the others nothing.
    pieces.push(record('splitRows', piece, [x], (g) => {
      grads[i] = g.clone();
      if (--pending > 0) return [null];
      const full = noGrad(() => cat(grads.map((t, j) => t ?? zeros([counts[j]!, c], { device: g.device, dtype: g.dtype })), 0));
      for (const [j, t] of grads.entries()) { t?.dispose(); grads[j] = null; }
      pending = counts.length;
      return [full];
    }));
  }
  return pieces;
}
