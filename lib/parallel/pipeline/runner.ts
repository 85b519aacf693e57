// The pipeline runner: one rank executes its schedule table. Activations go forward and their
// gradients backward by tagged point-to-point send/recv in the pipeline group (or are handed over
// between two chunks of one rank); receives are posted ahead; under ZB-H1 and ZB-V each backward's
// weight gradients are deferred to the table's W. On a group whose point-to-point has no tags (NCCL)
// the messages follow untaggedPlans (messages.ts) instead: in batches (NCCL group calls), each pair's
// in the same order on both sides. runSchedule and the named schedules drive it.
import { backward, deferWeightGrads, detach, noGrad, type DeferredWeightGrads } from '../../autograd/index.js';
import { ArgumentError, StateError } from '../../errors.js';
import { scope } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import { parseDevice, type Device } from '../../device.js';
import type { CollectiveGroup, CollectiveWork } from '../../distributed/group.js';
import { rankOfVirtualStage, schedulePlacement, virtualStageOf, type ChunkPlacement, type VirtualStagePlace } from './placement.js';
import { checkSchedule, scheduleTables, type PipelineAction, type ScheduleKind } from './tables.js';
import { untaggedPlans, type PipelineMessage, type PlanStep } from './messages.js';

/** One rank's stage as the pipeline schedules run it. */
export interface PipelineStage {
  /** The pipeline group; its rank is the stage index. Absent: a single stage (no communication). */
  group?: CollectiveGroup;
  /** Model chunks this rank holds (interleaved 1F1B's virtual stages, zb-v's 2; default 1). */
  chunks?: number;
  /** How the chunks map to virtual stages (default 'loop'; zb-v's 'v'): forwardOnly follows it, runSchedule checks it against the schedule's. */
  placement?: ChunkPlacement;
  /**
   * Runs this stage's chunk `chunk` on micro-batch `m`. `input` is null on the first virtual stage
   * (it reads its own data) and the received activation (a leaf that requires grad) elsewhere. The
   * last virtual stage returns the micro-batch's scalar loss, already divided by the number of
   * micro-batches if a mean is wanted.
   */
  forwardStep(m: number, input: Tensor | null, chunk: number): Tensor;
  /** Shape of the activation chunk `chunk` receives (not called on the first virtual stage). */
  inputShape(m: number, chunk: number): readonly number[];
  /** Dtype of the activations received (default f32). */
  dtype?: Tensor['dtype'];
  /** Device of the activations received (default cpu). */
  device?: Device;
  /**
   * Runs one micro-batch's backward on one chunk (`run`; under ZB-H1 its input-gradient part B, or
   * its weight-gradient part W: `phase`); `final` is true for the schedule's last backward on this
   * stage (under ZB-H1 the last B and the last W). Default: just run it. A data-parallel gradient
   * buffer runs all but the final ones with communication off (GradBuffer.noSync), so gradients
   * accumulate locally.
   */
  runBackward?(m: number, final: boolean, run: () => void, info: { chunk: number; phase: 'backward' | 'input' | 'weight' }): void | Promise<void>;
}

interface InFlight { input: Tensor | null; output: Tensor }

const TAG_LIMIT = 1 << 24;

/** Drives one rank through its table: holds micro-batches between forward and backward, pre-posts receives, keeps the sends. */
class StageRunner {
  readonly inFlight = new Map<string, InFlight>();
  readonly deferred = new Map<string, DeferredWeightGrads>();
  readonly sends: CollectiveWork[] = [];
  readonly losses: number[] = [];
  readonly rank: number;
  readonly size: number;
  readonly chunks: number;
  readonly #posted = new Map<string, { buf: Tensor; work: CollectiveWork }>();
  /** Hand-offs between two chunks of this rank (zb-v's turn of the V on the last rank): activations ('F…') and gradients ('B…') by receiving action. */
  readonly #local = new Map<string, Tensor>();
  /** Untagged (NCCL): sends an action made, issued with its round's batch (aliases that keep the tensors' storage). */
  readonly #outbox: { t: Tensor; to: number }[] = [];
  /** Whether the group's point-to-point has no tags on the activations' device (NCCL): the messages then follow untaggedPlans. */
  readonly untagged: boolean;
  constructor(readonly stage: PipelineStage, readonly numMicroBatches: number, readonly placement: ChunkPlacement = 'loop') {
    this.rank = stage.group?.rank ?? 0; this.size = stage.group?.size ?? 1;
    this.untagged = this.size > 1 && stage.group?.p2pTagged?.((stage.device ?? parseDevice('cpu')).name) === false;
    this.chunks = stage.chunks ?? 1;
    if (this.chunks > 1 && this.size < 2) throw new ArgumentError(`pipeline: ${this.chunks} model chunks need a pipeline group of at least 2 stages`);
    const tags = 2 * numMicroBatches * this.size * this.chunks;
    if (tags > TAG_LIMIT) throw new ArgumentError(`pipeline: ${numMicroBatches} micro-batches × ${this.size * this.chunks} virtual stages exceed the ${TAG_LIMIT} message tags`);
  }

  get group(): CollectiveGroup { return this.stage.group!; }
  #vs(chunk: number): number { return virtualStageOf(this.rank, chunk, this.size, this.placement); }
  /** The rank and chunk of a virtual stage. */
  #at(vs: number): VirtualStagePlace { return rankOfVirtualStage(vs, this.size, this.placement); }
  isFirst(chunk: number): boolean { return this.#vs(chunk) === 0; }
  isLast(chunk: number): boolean { return this.#vs(chunk) === this.size * this.chunks - 1; }
  #key(m: number, chunk: number): string { return `${m}:${chunk}`; }
  // One tag per message: (micro-batch, receiving virtual stage, direction), so that activations and
  // gradients between the same two ranks never match each other whatever order they are posted in.
  #tag(m: number, vs: number, grad: boolean): number { return (m * this.size * this.chunks + vs) * 2 + (grad ? 1 : 0); }

  /**
   * Posts now (a look-ahead) the receive action `a` will wait for: F(m, chunk)'s input, or B(m,
   * chunk)'s output gradient (shaped as the next virtual stage's input), so that its sender's send
   * can complete.
   */
  prepost(a: PipelineAction): void {
    if (this.untagged) return; // the plan's batches post the receives
    if (a.op === 'W' || (a.op === 'F' && this.isFirst(a.chunk)) || (a.op === 'B' && this.isLast(a.chunk))) return;
    const k = `${a.op}${this.#key(a.micro, a.chunk)}`;
    if (this.#posted.has(k)) return;
    const g = this.group, vs = this.#vs(a.chunk);
    const from = this.#at(a.op === 'F' ? vs - 1 : vs + 1);
    if (from.rank === this.rank) return; // handed over locally
    this.#postRecv(k, a, from.rank, this.#tag(a.micro, vs, a.op === 'B'));
  }

  // Posts the receive of action a's message from `peer` under key k.
  #postRecv(k: string, a: { readonly op: PipelineAction['op']; readonly micro: number; readonly chunk: number }, peer: number, tag: number): void {
    // The gradient of this chunk's output has the shape of the next virtual stage's input.
    const shape = a.op === 'F' ? this.stage.inputShape(a.micro, a.chunk) : this.stage.inputShape(a.micro, this.#at(this.#vs(a.chunk) + 1).chunk);
    const buf = emptyOn([...shape], this.stage.dtype ?? 'f32', this.stage.device ?? parseDevice('cpu'));
    let work: CollectiveWork;
    try { work = this.group.recv(buf, peer, { tag }); } catch (e) { buf.dispose(); throw e; }
    this.#posted.set(k, { buf, work });
  }

  // A message out: tagged, sent now; untagged, kept (an alias) for the round's batch.
  #send(t: Tensor, to: number, tag: number): void {
    if (this.untagged) this.#outbox.push({ t: detach(t), to });
    else this.sends.push(this.group.send(t, to, { tag }));
  }

  /** Untagged: issues one batch of the plan (one NCCL group call): the round's send, then its receives. */
  #issueBatch(b: { sends: readonly PipelineMessage[]; recvs: readonly PipelineMessage[] }): void {
    const out = this.#outbox.splice(0);
    if (out.length !== b.sends.length || out.some((o, i) => o.to !== b.sends[i]!.peer)) {
      for (const o of out) o.t.dispose();
      throw new StateError(`pipeline: rank ${this.rank} made sends to ${JSON.stringify(out.map((o) => o.to))} where its plan sends to ${JSON.stringify(b.sends.map((m) => m.peer))}`);
    }
    const g = this.group;
    const issue = () => {
      try {
        for (const o of out) this.sends.push(g.send(o.t, o.to));
      } finally {
        for (const o of out) o.t.dispose(); // the sends pin the storage
      }
      for (const m of b.recvs) this.#postRecv(`${m.op}${this.#key(m.micro, m.chunk)}`, m, m.peer, 0);
    };
    if (g.batch) g.batch(issue); else issue();
  }

  /** The buffer of a receive posted by prepost(), once it has arrived. */
  async #received(a: PipelineAction): Promise<Tensor> {
    const k = `${a.op}${this.#key(a.micro, a.chunk)}`;
    const local = this.#local.get(k);
    if (local) { this.#local.delete(k); return local; }
    this.prepost(a);
    const posted = this.#posted.get(k);
    if (!posted) throw new StateError(`pipeline: ${a.op} of micro-batch ${a.micro} (chunk ${a.chunk}) found nothing to receive (its chunk on this rank has not run)`);
    const { buf, work } = posted;
    this.#posted.delete(k);
    try { await work; } catch (e) { buf.dispose(); throw e; }
    return buf;
  }

  /** Forward of micro-batch m on a chunk; with keepForBackward false (evaluation) nothing is held afterwards. */
  async forward(m: number, chunk: number, keepForBackward = true): Promise<void> {
    let input: Tensor | null = null;
    if (!this.isFirst(chunk)) {
      input = await this.#received({ op: 'F', micro: m, chunk });
      input.requiresGrad = keepForBackward;
    }
    // The micro-batch's intermediate tensors go when its forward ends: what backward needs the graph
    // holds (saved aliases), and the rest would otherwise live until the step's scope closes, so every
    // micro-batch's activations would pile up and 1F1B would hold as much as GPipe.
    const output = scope(() => this.stage.forwardStep(m, input, chunk));
    if (this.isLast(chunk)) {
      if (output.size !== 1) throw new StateError(`pipeline: the last stage must return a scalar loss, got ${output.describe()}`);
      this.losses[m] = output.item();
    } else {
      const to = this.#at(this.#vs(chunk) + 1);
      if (to.rank === this.rank) {
        // The next virtual stage is this rank's other chunk: it takes an alias of the output.
        this.#local.set(`F${this.#key(m, to.chunk)}`, detach(output));
      } else {
        // A send pins its tensor's storage until it completes; sends are awaited at the end of the schedule.
        this.#send(output, to.rank, this.#tag(m, this.#vs(chunk) + 1, false));
      }
    }
    if (keepForBackward) this.inFlight.set(this.#key(m, chunk), { input, output });
    else { output.dispose(); input?.dispose(); }
  }

  /** Backward of micro-batch m on a chunk; with `split` only its input gradient (the weights' part is kept for weight()). */
  async backward(m: number, chunk: number, final: boolean, split: boolean): Promise<void> {
    const key = this.#key(m, chunk), f = this.inFlight.get(key);
    if (!f) throw new StateError(`pipeline: backward of micro-batch ${m} (chunk ${chunk}) before its forward`);
    this.inFlight.delete(key);
    const run = this.stage.runBackward?.bind(this.stage) ?? ((_m: number, _final: boolean, go: () => void) => go());
    const info = { chunk, phase: split ? 'input' as const : 'backward' as const };
    let grad: Tensor | null = null;
    if (!this.isLast(chunk)) grad = await this.#received({ op: 'B', micro: m, chunk });
    try {
      const go = () => {
        if (!split) { grad ? backward(f.output, grad) : backward(f.output); return; }
        const { weightGrads } = deferWeightGrads(() => (grad ? backward(f.output, grad) : backward(f.output)), { now: f.input ? [f.input] : [] });
        this.deferred.set(key, weightGrads);
      };
      await run(m, final, go, info);
    } finally {
      grad?.dispose();
    }
    f.output.dispose();
    if (f.input) {
      if (!f.input.grad) throw new StateError(`pipeline: micro-batch ${m}'s input received no gradient (does the stage's output depend on its input?)`);
      const to = this.#at(this.#vs(chunk) - 1);
      if (to.rank === this.rank) {
        // The previous virtual stage is this rank's other chunk: the gradient is handed over (not freed with the input).
        this.#local.set(`B${this.#key(m, to.chunk)}`, f.input.grad);
        f.input.grad = null;
      } else {
        this.#send(f.input.grad, to.rank, this.#tag(m, this.#vs(chunk) - 1, true));
      }
      f.input.dispose();
    }
  }

  /** The weight-gradient part of micro-batch m's backward on a chunk (ZB-H1's W). */
  async weight(m: number, chunk: number, final: boolean): Promise<void> {
    const key = this.#key(m, chunk), w = this.deferred.get(key);
    if (!w) throw new StateError(`pipeline: weight gradient of micro-batch ${m} (chunk ${chunk}) before its backward`);
    this.deferred.delete(key);
    const run = this.stage.runBackward?.bind(this.stage) ?? ((_m: number, _final: boolean, go: () => void) => go());
    await run(m, final, () => w.run(), { chunk, phase: 'weight' });
  }

  /**
   * Runs a table: each action in order, the receives of the next `lookahead` actions posted ahead
   * (Infinity: the whole table's at the start).
   */
  async runTable(table: readonly PipelineAction[], lookahead: number, keepForBackward = true, plan?: readonly PlanStep[]): Promise<number[]> {
    const lastB = table.findLastIndex((a) => a.op === 'B'), lastW = table.findLastIndex((a) => a.op === 'W');
    const split = lastW >= 0;
    const act = async (i: number) => {
      const a = table[i]!;
      if (a.op === 'F') await this.forward(a.micro, a.chunk, keepForBackward);
      else if (a.op === 'B') await this.backward(a.micro, a.chunk, i === lastB, split);
      else await this.weight(a.micro, a.chunk, i === lastW);
    };
    if (this.untagged && !plan) throw new StateError(`pipeline: group '${this.group.name}' matches point-to-point messages in issue order (no tags) and this run has no message plan`);
    try {
      if (plan) {
        let done = 0;
        for (const step of plan) {
          if ('batch' in step) { this.#issueBatch(step.batch); continue; }
          if (step.action !== done) throw new StateError(`pipeline: rank ${this.rank}'s plan runs action ${step.action} after ${done} of its table`);
          await act(done++);
        }
        if (done !== table.length) throw new StateError(`pipeline: rank ${this.rank}'s plan runs ${done} of its table's ${table.length} actions`);
      } else {
        for (let i = 0; i < table.length; i++) {
          if (i === 0 || lookahead !== Infinity) for (let j = i; j < Math.min(table.length, i + lookahead); j++) this.prepost(table[j]!);
          await act(i);
        }
      }
      for (const w of this.sends) await w;
    } finally {
      for (const { t } of this.#outbox.splice(0)) t.dispose();
      for (const { buf } of this.#posted.values()) buf.dispose();
      for (const t of this.#local.values()) t.dispose();
      this.#local.clear();
      for (const w of this.deferred.values()) w.dispose();
    }
    return this.losses;
  }
}

function checkMicroBatches(n: number, call: string): void {
  if (!Number.isInteger(n) || n < 1) throw new ArgumentError(`${call}: numMicroBatches must be an integer >= 1, got ${n}`);
}

/**
 * Runs schedule `kind` on this rank's stage: its table from {@link scheduleTables}, gradients
 * accumulating in the stage's parameters. Returns the last virtual stage's per-micro-batch losses
 * (empty elsewhere). Every rank of the pipeline group must run the same kind and shape.
 */
export async function runSchedule(kind: ScheduleKind, stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, kind);
  const size = stage.group?.size ?? 1, chunks = stage.chunks ?? 1;
  checkSchedule(kind, { stages: size, microBatches: numMicroBatches, chunks }, kind);
  const placement = schedulePlacement(kind);
  if (stage.placement !== undefined && stage.placement !== placement) throw new ArgumentError(`${kind}: the stage's chunks are placed '${stage.placement}', but the schedule runs them '${placement}' (build the model for the schedule it runs)`);
  const run = new StageRunner(stage, numMicroBatches, placement);
  const table = scheduleTables(kind, { stages: size, microBatches: numMicroBatches, chunks })[run.rank]!;
  // Gloo completes a send when its receiver posts the receive, and a rank's point-to-point waits run
  // one after the other: interleaving's messages around the ring (the last rank feeds the first)
  // could leave two ranks each waiting behind a send to the other. Posting every receive of the step
  // first rules that out (2·m·v boundary-sized buffers). ZB-V's messages go both ways between the same
  // ranks (activations down and back up the V, gradients likewise): its receives are posted first too
  // (but for the last rank's local hand-offs). The other schedules' chains post each receive when its
  // action starts (no buffer allocated early: the planner's memory model counts none).
  // Untagged (NCCL) the messages follow every rank's plan instead (messages.ts).
  const tables = run.untagged ? scheduleTables(kind, { stages: size, microBatches: numMicroBatches, chunks }) : [];
  const plan = run.untagged ? untaggedPlans(tables, { stages: size, chunks, placement })[run.rank] : undefined;
  return run.runTable(table, kind === 'interleaved' || kind === 'zb-v' ? Infinity : 1, true, plan);
}

/**
 * GPipe: every micro-batch forward, then every micro-batch backward (in reverse). Peak memory holds
 * all micro-batches' activations. Gradients accumulate in the stage's parameters. Returns the
 * last stage's per-micro-batch losses (empty elsewhere).
 */
export function gpipe(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('gpipe', stage, numMicroBatches);
}

/**
 * 1F1B (PipeDream-Flush): at most (stages - stage index) micro-batches in flight, so activation
 * memory no longer grows with the number of micro-batches. Same results as GPipe.
 */
export function oneForwardOneBackward(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('1f1b', stage, numMicroBatches);
}

/**
 * Interleaved 1F1B (Megatron-LM's virtual pipeline stages): each rank holds `stage.chunks` (v >= 2)
 * non-adjacent model chunks; the bubble falls from (p − 1)/m to (p − 1)/(v·m) of the ideal time at
 * the price of p·v point-to-point messages per micro-batch and about (1 + (p − 1)/(p·v))·p
 * micro-batch chunks in flight on the first rank. Needs the micro-batches to be a multiple of p.
 */
export function interleaved1F1B(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('interleaved', stage, numMicroBatches);
}

/**
 * ZB-H1 (zero bubble, Qi et al. 2024): 1F1B with each backward split into its input gradient B,
 * which the previous stage waits for, and its weight gradient W (deferWeightGrads), which fills
 * the time a stage would wait; at most p micro-batches hold activations (1F1B's first stage's peak).
 */
export function zeroBubbleH1(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('zb-h1', stage, numMicroBatches);
}

/**
 * ZB-V (zero bubble with a V-shaped placement, Qi et al. 2024): each rank holds 2 chunks
 * (`stage.chunks` = 2), virtual stages r and 2p − 1 − r, so the first rank holds both ends of the
 * model; B and W split as in ZB-H1. With equal F, B and W per chunk the bubble is half ZB-H1's,
 * with 1F1B's first-stage activation peak on every rank.
 */
export function zeroBubbleV(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('zb-v', stage, numMicroBatches);
}

/**
 * Evaluation: every micro-batch forward without autograd through every chunk, each stage passing its
 * activation on and keeping nothing. Returns the last stage's per-micro-batch losses (empty elsewhere).
 */
export async function forwardOnly(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, 'forwardOnly');
  const run = new StageRunner(stage, numMicroBatches, stage.placement ?? 'loop');
  const table: PipelineAction[] = [];
  for (let m = 0; m < numMicroBatches; m++) for (let c = 0; c < run.chunks; c++) table.push({ op: 'F', micro: m, chunk: c });
  // With chunks the activations go around the ring: every receive is posted first, as in training.
  // Untagged (NCCL): every rank runs the same table, and the messages follow the plan.
  const plan = run.untagged ? untaggedPlans(Array.from({ length: run.size }, () => table), { stages: run.size, chunks: run.chunks, placement: run.placement })[run.rank] : undefined;
  return noGrad(() => run.runTable(table, run.chunks > 1 ? Infinity : 1, false, plan));
}
