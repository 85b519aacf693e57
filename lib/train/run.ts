// nt.train's TrainingRun: one rank's run as setup() assembled it. A step (this replica's rows of the
// global batch or the next batch of its data, the learning rate of the step, a progress line with
// tokens/s, MFU and memory, a validation loss, a checkpoint), evaluation, save and resume, and the
// whole model for sampling and export; close releases everything set-up built.
import * as dist from '../distributed/init.js';
import { tensor } from '../creation.js';
import { ArgumentError, StateError } from '../errors.js';
import { memoryStats } from '../memory.js';
import { slice } from '../ops/index.js';
import type { CausalLM, GenerateOptions, GPT } from '../nn/gpt.js';
import type { Llama } from '../nn/llama.js';
import type { MoEStats } from '../nn/moe.js';
import { cosineWithWarmup } from '../optim/schedule.js';
import { describeLayout, type TrainingLayout } from '../parallel/layout.js';
import type { ParallelState } from '../parallel/mesh.js';
import type { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import type { ParallelTrainer } from '../parallel/trainer.js';
import { Checkpointer, type SaveResult } from '../ckpt/checkpoint.js';
import type { CheckpointItems } from '../ckpt/items.js';
import type { LoadResult } from '../ckpt/load.js';
import { TokenLoader } from '../data/loader.js';
import { exportHF } from '../interop/hf-auto.js';
import type { Tensor } from '../tensor.js';
import type { ParallelParts } from './assembly.js';
import type { LayoutArgs } from './flags.js';
import { Teardown } from './teardown.js';
import { planShrink, type ReshapePlan } from './shrink.js';
import { shrinkMemoryLimit, shrinkMemoryOf } from './shrink-memory.js';
import type { ProcessGroup } from '../distributed/group.js';
import { isInt, type Batch, type ModelShard, type TrainSetupOptions } from './options.js';
import { MemoryRecovery } from './recovery.js';
import { detectPeakFlops, formatProgress, modelFlopsPerToken, type MoEProgress } from './progress.js';

/** A run's losses so far ({@link TrainingRun.history}). */
export interface RunHistory {
  /** [step, loss] of every step the run did (1-based steps). */
  readonly train: ReadonlyArray<readonly [number, number]>;
  /** [step, loss] of every validation of the run's own data (step 0: before training). */
  readonly val: ReadonlyArray<readonly [number, number]>;
}

/** What one step did. */
export interface StepResult {
  /** Steps done after this one (1-based number of the step). */
  step: number;
  /** The loss of the global batch (the same on every rank). */
  loss: number;
  /** The global gradient norm before clipping (when maxGradNorm is set). */
  gradNorm?: number;
  /** The learning rate used (when the run sets one). */
  lr?: number;
  /** The validation loss, when this step evaluated (TokenData.evalEvery). */
  valLoss?: number;
  /** The checkpoint saved after this step, if any. */
  saved?: SaveResult;
  /** MoE routing of the step on this rank (models with MoE layers; see ParallelTrainer's step result). */
  moe?: MoEStats;
}

export interface RunParts<H extends { lr: number }> extends ParallelParts<H> {
  /** The layout flags the parts were built from. */
  flags: LayoutArgs;
  layout: TrainingLayout;
  rank: number;
  worldSize: number;
  loader: TokenLoader | null;
  rows: { start: number; count: number };
  /** Releases these parts (trainer, loader, model, mesh). */
  teardown: Teardown;
  /** Builds the parts of another layout over another world (in-job recovery's reshape). */
  rebuild(flags: LayoutArgs, layout: TrainingLayout, worldSize: number, world: ProcessGroup | null): Promise<RunParts<H>>;
}

/**
 * A training run as {@link setup} built it, on one rank. Every method that trains, evaluates, saves
 * or gathers is collective: every rank calls it in the same order.
 */
export class TrainingRun<H extends { lr: number }> {
  // This rank's parts (mesh, model, trainer, loader, layout): replaced when in-job recovery reshapes
  // the job (a shrink to fewer data-parallel replicas, or the grow back).
  #p: RunParts<H>;
  /** The checked layout. */
  get layout(): TrainingLayout { return this.#p.layout; }
  /** This process's rank in the job (0 without a launcher). */
  get rank(): number { return this.#p.rank; }
  /** Processes in the job. */
  get worldSize(): number { return this.#p.worldSize; }
  /** The mesh (null in one process). */
  get mesh(): ParallelState | null { return this.#p.mesh; }
  /** This rank's part of the model: its pipeline stage (of its tensor-parallel slices). */
  get model(): GPTStage { return this.#p.stage; }
  /** The model the factory built, a GPT or a Llama (the stage holds its parameters; its generator is checkpointed). */
  get gpt(): CausalLM { return this.#p.full; }
  /** The trainer of the layout. */
  get trainer(): ParallelTrainer<H> { return this.#p.trainer; }
  /** The training data loader (null without token shards). */
  get loader(): TokenLoader | null { return this.#p.loader; }
  /** Tokens per sequence. */
  get seqLen(): number { return this.#p.seqLen; }
  /** Sequences per step, over all data-parallel ranks. */
  readonly batchSize: number;
  /** Total steps, when known. */
  readonly steps: number | undefined;
  /** Device of the model and batches. */
  readonly device: string;
  /** Model FLOPs per trained token ({@link modelFlopsPerToken}). */
  readonly flopsPerToken: number;
  /** This data-parallel replica's rows [start, start + count) of each global batch. */
  get rows(): {
    /** The first row. */
    start: number;
    /** Rows per step (batchSize / dp). */
    count: number;
  } { return this.#p.rows; }
  readonly #options: TrainSetupOptions<H>;
  /** The options the model factory received (seed, device, tensor-parallel layers, recomputation). */
  get #shard(): ModelShard { return this.#p.shard; }
  /** Releases the checkpointer and the recovery, then the current parts: on close. */
  readonly #teardown = new Teardown();
  readonly #checkpointer: Checkpointer | null;
  readonly #scheduler: { state(): unknown; loadState(st: never): void };
  readonly #log: (line: string) => void;
  readonly #every: number;
  readonly #peakFlops: number | undefined;
  #step = 0;
  // Whether a step's forward, backward or update is under way (in-job recovery counts it among the steps lost).
  #inStep = false;
  #avg: number | undefined;
  #timing: { t0: number; from: number } | null = null;
  #closed = false;
  #recovery: MemoryRecovery | null = null;
  #history: { train: Array<[number, number]>; val: Array<[number, number]> } = { train: [], val: [] };

  /** @internal Built by {@link setup}. */
  constructor(options: TrainSetupOptions<H>, parts: RunParts<H>) {
    this.#options = options;
    this.#p = parts;
    this.#teardown.add(() => this.#p.teardown.run());
    this.device = parts.shard.device;
    this.batchSize = options.batchSize; this.steps = options.steps;
    this.flopsPerToken = modelFlopsPerToken(this.gpt, this.seqLen);
    const progress = options.progress;
    const print = progress === false ? () => {} : progress?.log ?? ((line: string) => console.log(line));
    // The rank that prints is the world's rank 0, whichever process that is after a reshape.
    this.#log = (line) => { if (this.rank === 0) print(line); };
    this.#every = progress ? progress.every ?? 10 : 10;
    this.#peakFlops = (progress ? progress.peakFlops : undefined) ?? detectPeakFlops(this.device);
    const ck = options.checkpoint;
    const checkpointer = this.#checkpointer = ck?.dir ? new Checkpointer(ck.dir, { keep: ck.keep ?? 3 }) : null;
    // Released first: the checkpoint in flight finishes before the model it was taken from goes.
    if (checkpointer) this.#teardown.add(() => checkpointer.close());
    // The schedule's position is the step; under in-job recovery it also carries the loss history, so a
    // replacement of rank 0 still writes the whole record (the history goes back with the state).
    const scheduler = this.#scheduler = {
      state: () => ({ step: this.#step, ...(this.#recovery ? { history: { train: [...this.#history.train], val: [...this.#history.val] } } : {}) }),
      loadState: (st: { history?: { train: Array<[number, number]>; val: Array<[number, number]> } }) => {
        if (st.history) this.#history = { train: [...st.history.train], val: [...st.history.val] };
      },
    };
    const c = this.gpt.shape;
    const heads = c.nKvHead === c.nHead ? `${c.nHead} heads` : `${c.nHead} heads (${c.nKvHead} kv)`;
    this.log(`${this.gpt.constructor.name || this.gpt.family}: ${c.nLayer} layers, ${heads}, width ${c.nEmbd}, ctx ${this.seqLen}, vocab ${c.vocabSize}; ` +
      `${(this.model.numParameters() / 1e6).toFixed(2)}M parameters${this.layout.tp * this.layout.pp > 1 ? ' on rank 0 (its part of the model)' : ''} on ${this.device}`);
    this.log(`layout ${describeLayout(this.layout)}: ${this.worldSize} process(es), ${this.rows.count} sequences per replica per step` +
      (this.layout.pp > 1 ? `, layers ${this.model.layers[0]}..${this.model.layers[1] - 1} on rank 0` : ''));
  }

  /** What a checkpoint or an in-memory image of this run holds (of its current parts): the trainer's state, the data position, the schedule, the generator. */
  get #items(): CheckpointItems {
    const p = this.#p;
    return { model: p.trainer, ...(p.loader ? { loader: p.loader } : {}), scheduler: this.#scheduler, rng: { model: p.full.generator }, layout: p.layout };
  }

  /**
   * In-job recovery's reshape: releases this rank's parts (trainer, loader, model, mesh), leaves its
   * world and joins the next one as rank `rank` of `plan.members.length` in `generation`, and builds
   * the parts of `plan.layout` there with unconnected groups (the caller regroups, then restores the
   * state from the old world's images). The run object stays the caller's.
   */
  async #reshape(plan: ReshapePlan, generation: number, rank: number): Promise<void> {
    const old = this.#p;
    // The old world's communicators go first (aborted: a collective still on the old buffers ends),
    // then the old parts' buffers.
    const world = await dist.rejoinAs(generation, rank, plan.members.length);
    await old.teardown.run();
    this.#p = await old.rebuild(plan.flags as LayoutArgs, plan.layout, plan.members.length, world);
    this.#timing = null;
    this.log(`generation ${generation}: reshaped to ${describeLayout(plan.layout)} over ${plan.members.length} process(es)`);
  }

  /** @internal Releases what set-up built without leaving the job (a set-up that failed after the run existed). */
  async release(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#teardown.run();
  }

  /**
   * The losses so far: `train` as [step, loss] of every step this run did, `val` as [step, loss] of
   * every validation of the run's own data (evaluate() without batches). Under in-job recovery the
   * history is part of the recovered state, so a replacement rank holds the whole run's.
   */
  get history(): RunHistory { return this.#history; }

  /** Whether this process took a lost rank's place in a running job (in-job recovery): it skips what the others did before it came. */
  get joined(): boolean { return this.#recovery?.joined ?? false; }

  /** Steps done (the next step's 0-based index): 0 at the start, the checkpoint's step after a resume. */
  get stepsDone(): number { return this.#step; }

  /** Whether this rank prints (rank 0, unless progress is off). */
  get isLogger(): boolean { return this.rank === 0; }

  /** Prints a line on rank 0 (through the progress log; nothing when progress is off). */
  log(line: string): void { this.#log(line); }

  /** The learning rate of step `step` (0-based), or undefined when the run leaves it to the optimizer. */
  lrAt(step: number): number | undefined {
    const lr = this.#options.lr;
    if (lr === undefined) return undefined;
    if (typeof lr === 'number') return lr;
    if (typeof lr === 'function') return lr(step);
    return cosineWithWarmup(step, { ...lr, maxSteps: lr.maxSteps ?? this.steps! });
  }

  /** This replica's rows of a global batch (the caller owns the returned tensors when they are new). */
  #rowsOf(batch: Batch, release: Tensor[]): Batch {
    const { inputs, targets } = batch;
    if (!inputs || !targets || typeof inputs.shape !== 'object' || typeof targets.shape !== 'object') throw new ArgumentError('TrainingRun: a batch is { inputs, targets }, two int32 [batchSize, seqLen] tensors');
    if (inputs.ndim !== 2 || inputs.shape[0] !== this.batchSize || targets.ndim !== 2 || targets.shape[0] !== this.batchSize || targets.shape[1] !== inputs.shape[1]) {
      throw new ArgumentError(`TrainingRun: a batch must be the global batch, [${this.batchSize}, T] inputs and targets (every rank passes the same one; the run takes this replica's rows), got ${inputs.describe()} and ${targets.describe()}`);
    }
    if (this.layout.dp === 1) return { inputs, targets };
    const { start, count } = this.rows;
    const mine = { inputs: slice(inputs, 0, start, start + count), targets: slice(targets, 0, start, start + count) };
    release.push(mine.inputs, mine.targets);
    return mine;
  }

  /**
   * One optimizer step. With a batch: the global batch ([batchSize, seqLen] on every rank; the run
   * trains this replica's rows). Without: the next batch of the run's data. Then, as configured:
   * the learning rate of the step, a progress line, a validation loss, a checkpoint.
   */
  async step(batch?: Batch): Promise<StepResult> {
    if (this.#closed) throw new StateError('TrainingRun.step: the run is closed');
    const rec = this.#recovery;
    if (!rec) return this.#stepOnce(batch, false);
    // In-job recovery: the state before the step is held (in memory here, and at the holder) before the
    // step runs; a lost rank rolls every rank back to the newest step all of them hold, and the steps
    // since are redone (quietly) before this one, so the caller sees each step once.
    const target = this.#step;
    this.#inStep = false;
    for (;;) {
      try {
        for (;;) {
          const moved = await rec.beforeStep(this.#step);
          if (moved !== undefined) {
            // The job grew back at this step boundary (another layout: a save in flight of the shrunk world is given up).
            this.#checkpointer?.abandonInFlight('the job grew back to its own layout');
            if (moved === null) await this.#fallBackToDisk(rec);
            else this.#step = moved;
            continue;
          }
          if (this.#step >= target) break;
          if (batch) throw new StateError(`TrainingRun.step: recovery rolled back to step ${this.#step}, and steps before ${target} must be redone from the run's own data; a run given batches by the caller cannot redo them`);
          this.#inStep = true;
          await this.#stepOnce(undefined, true);
          this.#inStep = false;
        }
        this.#inStep = true;
        const r = await this.#stepOnce(batch, false);
        this.#inStep = false;
        await rec.snapshot(this.#step);
        return r;
      } catch (e) {
        if (this.#closed || !rec.recoverable(e)) throw e;
        // (The steps to redo: those done since the step restored, and the one in progress if any.)
        const step = await rec.recover(e, this.#step + (this.#inStep ? 1 : 0));
        this.#inStep = false;
        // A save in flight waits for files a lost rank will never write: every rank rolled back past it.
        // (Saves of steps up to the rollback go on when every rank's part will come; a reshape gives them up.)
        this.#checkpointer?.abandonInFlight('in-job recovery rolled the run back', step === null || rec.lastLost === null ? undefined : { through: step, lost: rec.lastLost });
        if (step === null) await this.#fallBackToDisk(rec);
        else this.#step = step;
      }
    }
  }

  // Both copies of some rank were lost: every rank (regrouped) loads the newest checkpoint, and says so.
  async #fallBackToDisk(rec: MemoryRecovery): Promise<void> {
    const dir = this.#options.checkpoint?.dir ?? null;
    rec.fellBack(dir);
    if (!dir) throw new StateError('in-job recovery: no step is held in memory by every rank (both copies of a lost rank were lost), and the run has no checkpoint directory to fall back to');
    this.log(`in-job recovery: no step is held in memory by every rank; falling back to the newest checkpoint under ${dir}`);
    const loaded = await this.#resumeFrom(dir);
    if (!loaded) throw new StateError(`in-job recovery: no step is held in memory by every rank, and ${dir} has no complete checkpoint`);
  }

  /**
   * @internal Turns on in-job recovery from peers' memory (setup, with `recover: 'memory'`). A
   * replacement process restores the lost rank's state from the holder here; returns whether it did
   * (then a checkpoint resume is skipped).
   */
  async startRecovery(every = 1): Promise<boolean> {
    // The job's own layout (the grow back returns to it), as this rank set up.
    const job = { flags: this.#p.flags, layout: this.#p.layout, worldSize: this.#p.worldSize };
    shrinkMemoryLimit(); // (a bad NODETRON_SHRINK_MEMORY_LIMIT fails here, not at the first fault)
    const shape = { ...this.gpt.shape, blockSize: this.seqLen };
    // (`run` for the getter: private fields are read through the class's own object.)
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const run = this;
    const rec = this.#recovery = await MemoryRecovery.start({
      get items() { return run.#items; },
      abandonStep: () => this.trainer.abandonStep(),
      log: (l) => this.log(l),
      every,
      planShrink: (members, lost, memory) => planShrink({ layout: this.layout, flags: this.#p.flags, members, lost, shape, globalBatch: this.batchSize, memory }),
      shrinkMemory: (measured) => shrinkMemoryOf({ device: this.device, trainer: this.trainer as ParallelTrainer<{ lr: number }>, layout: this.layout, stage: this.mesh?.ppRank ?? 0, measured }),
      memoryNow: () => { const m = memoryStats(this.device); return { peak: m.peak, held: m.allocated }; },
      jobPlan: () => ({ members: Array.from({ length: job.worldSize }, (_, r) => r), layout: job.layout, flags: job.flags }),
      reshape: (plan, generation, rank) => this.#reshape(plan, generation, rank),
    });
    this.#teardown.add(() => rec.close());
    if (!rec.joined) return false;
    if (rec.joinedStep === null) await this.#fallBackToDisk(rec);
    else this.#step = rec.joinedStep;
    return true;
  }

  async #stepOnce(batch: Batch | undefined, replay: boolean): Promise<StepResult> {
    const index = this.#step;
    // Tensors this step made (slices, loaded batches), released after it.
    const release: Tensor[] = [];
    let local: Batch;
    if (batch) local = this.#rowsOf(batch, release);
    else if (this.loader) { local = await this.loader.next(); release.push(local.inputs, local.targets); }
    else if (typeof this.#options.data === 'function') {
      const global = await this.#options.data(index);
      release.push(global.inputs, global.targets);
      local = this.#rowsOf(global, release);
    } else throw new ArgumentError('TrainingRun.step: no batch given and the run has no data (give setup a data option, or pass step({ inputs, targets }))');
    this.#timing ??= { t0: performance.now(), from: index };
    const lr = this.lrAt(index);
    let r;
    try {
      r = await this.trainer.step(local.inputs, local.targets, lr === undefined ? {} : { lr });
    } finally {
      for (const t of release) t.dispose();
    }
    this.#step = index + 1;
    // (The optimizer step is done: a loss from here on, in a validation or a checkpoint, costs the steps since the copy restored, not one more.)
    this.#inStep = false;
    const result: StepResult = { step: this.#step, loss: r.loss, ...(r.gradNorm !== undefined ? { gradNorm: r.gradNorm } : {}), ...(lr !== undefined ? { lr } : {}), ...(r.moe ? { moe: r.moe } : {}) };
    this.#history.train.push([this.#step, r.loss]);
    this.#avg = this.#avg === undefined ? r.loss : 0.9 * this.#avg + 0.1 * r.loss;
    const last = this.steps !== undefined && this.#step === this.steps;
    // A step redone after a rollback prints nothing, but validates and saves as its step number says:
    // every rank redoes the same steps (some the caller has seen, some not), and those are collectives.
    if (!replay && (index % this.#every === 0 || last)) this.log(this.#progressLine(result));
    const data = this.#options.data;
    if (data && typeof data === 'object' && data.val && data.evalEvery && (this.#step % data.evalEvery === 0 || last)) {
      result.valLoss = await this.evaluate();  // (recorded in the history by evaluate)
      if (!replay) this.log(`step ${this.#step}: val loss ${result.valLoss.toFixed(4)}`);
    }
    const every = this.#options.checkpoint?.every ?? 50;
    if (this.#checkpointer && (this.#step % every === 0 || last)) result.saved = await this.save();
    return result;
  }

  #progressLine(r: StepResult): string {
    const elapsed = (performance.now() - this.#timing!.t0) / 1000;
    const done = r.step - this.#timing!.from;
    const tokensPerSecond = (done * this.batchSize * this.seqLen) / elapsed;
    const mfu = this.#peakFlops ? (tokensPerSecond * this.flopsPerToken) / (this.#peakFlops * this.worldSize) : undefined;
    return formatProgress({
      step: r.step, ...(this.steps !== undefined ? { steps: this.steps, etaSeconds: (elapsed / done) * (this.steps - r.step) } : {}),
      loss: r.loss, avgLoss: this.#avg!, ...(r.gradNorm !== undefined ? { gradNorm: r.gradNorm } : {}), ...(r.lr !== undefined ? { lr: r.lr } : {}),
      tokensPerSecond, ...(mfu !== undefined ? { mfu } : {}), peakBytes: memoryStats(this.device).peak, ...(r.moe ? { moe: moeProgress(r.moe) } : {}),
    });
  }

  /**
   * The mean loss over validation batches without gradients, on every rank. With no argument: the
   * data's `val` shards, the same windows every time (`evalBatches` of them). Or a number of batches
   * from there, or global batches to evaluate.
   */
  async evaluate(batches?: number | Batch[]): Promise<number> {
    if (Array.isArray(batches)) {
      if (batches.length === 0) throw new ArgumentError('TrainingRun.evaluate: no batches');
      let total = 0;
      for (const b of batches) {
        const release: Tensor[] = [];
        try {
          const local = this.#rowsOf(b, release);
          total += await this.trainer.evaluate(local.inputs, local.targets);
        } finally { for (const t of release) t.dispose(); }
      }
      return total / batches.length;
    }
    const data = this.#options.data;
    if (!data || typeof data !== 'object' || !data.val) throw new ArgumentError('TrainingRun.evaluate: the run has no validation shards (data.val); pass batches to evaluate');
    const n = batches ?? data.evalBatches ?? 4;
    if (!isInt(n, 1)) throw new ArgumentError(`TrainingRun.evaluate: the number of batches must be an integer >= 1, got ${n}`);
    const val = new TokenLoader({
      batchSize: this.rows.count, seqLen: this.seqLen, dpRank: this.mesh?.dpRank ?? 0, dpSize: this.layout.dp,
      tpGroup: this.mesh?.tpGroup ?? null, device: this.device, files: data.val, seed: data.evalSeed ?? 7,
    });
    try {
      let total = 0;
      for (let i = 0; i < n; i++) {
        const { inputs, targets } = await val.next();
        try { total += await this.trainer.evaluate(inputs, targets); } finally { inputs.dispose(); targets.dispose(); }
      }
      const v = total / n;
      const h = this.#history.val;
      if (h.length > 0 && h[h.length - 1]![0] === this.#step) h[h.length - 1] = [this.#step, v];
      else h.push([this.#step, v]);
      return v;
    } finally { val.close(); }
  }

  /**
   * Saves a checkpoint of the current step (model, optimizer, data position, schedule, random
   * generators, layout) under checkpoint.dir, written in the background; the line goes to the log.
   */
  async save(): Promise<SaveResult> {
    if (!this.#checkpointer) throw new ArgumentError('TrainingRun.save: the run has no checkpoint directory (setup({ checkpoint: { dir } }))');
    const saved = await this.#checkpointer.save(this.#step, this.#items);
    this.log(`checkpoint step ${this.#step}: training held ${saved.stallMs.toFixed(1)} ms, writing ${saved.dir} in the background`);
    return saved;
  }

  /**
   * Loads the newest complete checkpoint under `dir` (any layout's) and continues from its step;
   * returns null (and starts from where it is) when there is none.
   */
  async resume(dir: string): Promise<LoadResult | null> {
    if (this.#recovery?.joined) {
      this.log(`rank ${this.rank} joined the running job from its peers' memory at step ${this.#step}: no checkpoint read`);
      return null;
    }
    return this.#resumeFrom(dir);
  }

  async #resumeFrom(dir: string): Promise<LoadResult | null> {
    const loaded = await new Checkpointer(dir).loadLatest(this.#items);
    if (loaded) {
      this.#step = loaded.step;
      this.#timing = null;
      this.log(`resumed from ${loaded.dir} (step ${loaded.step}${loaded.optimizerLoaded ? '' : ', no optimizer state'})`);
    } else this.log(`no complete checkpoint under ${dir}: starting from step ${this.#step}`);
    return loaded;
  }

  /**
   * Runs `fn` with the whole model on every rank that can hold it: with one pipeline stage, the GPT
   * (its tensor-parallel slices); under ZeRO 3 a copy gathered from the shards (collective over the
   * data-parallel group, disposed after `fn`). Returns fn's result, or null with pipeline stages
   * (no rank holds every layer; fn is not called). Every rank calls it.
   */
  async withFullModel<T>(fn: (model: CausalLM) => T | Promise<T>): Promise<T | null> {
    const whole = this.model.model;
    if (!whole) return null;
    if (this.layout.zero !== 3) return await fn(whole);
    const values = await this.trainer.fullParameters();
    const copy = this.gpt.rebuild(this.#shard);
    try {
      copy.loadStateDict(Object.fromEntries(this.model.namedParameters().map(([n], i) => [n, values[i]!])));
      for (const v of values) v.dispose();
      return await fn(copy);
    } finally { copy.dispose(); }
  }

  /**
   * Samples `maxNewTokens` tokens after `prompt` (token ids). Collective: every rank calls it; a
   * tensor-parallel group samples together. Returns the prompt and the new tokens on the ranks that
   * sampled (rank 0, and every rank when tp > 1), null elsewhere and with pipeline stages.
   */
  async generate(prompt: readonly number[], maxNewTokens: number, opts: GenerateOptions = {}): Promise<number[] | null> {
    if (!Array.isArray(prompt) || prompt.length === 0) throw new ArgumentError('TrainingRun.generate: prompt must be a non-empty array of token ids');
    return this.withFullModel((gpt) => {
      // MoE layers communicate over the data-parallel ranks (router counts, expert parallelism's
      // all-to-all), so there every rank samples along and rank 0 returns the tokens.
      const together = gpt.shape.moeExperts !== undefined && this.layout.dp > 1;
      if (this.rank !== 0 && this.layout.tp === 1 && !together) return null;
      using idx = tensor(Int32Array.from(prompt), [1, prompt.length], { device: this.device });
      if (!gpt.contextLayout) {
        const tokens = gpt.generate(idx, maxNewTokens, { seed: this.#shard.seed, ...opts })[0]!;
        return together && this.rank !== 0 && this.layout.tp === 1 ? null : tokens;
      }
      // Under context parallelism each rank samples from a copy without it (the same parameters).
      const plain = gpt.rebuild({ ...this.#shard, contextLayout: undefined });
      try {
        plain.loadStateDict(Object.fromEntries(gpt.namedParameters()));
        return plain.generate(idx, maxNewTokens, { seed: this.#shard.seed, ...opts })[0]!;
      } finally { plain.dispose(); }
    });
  }

  /**
   * Writes the model as a Hugging Face directory (GPT-2, or LlamaForCausalLM / MixtralForCausalLM / Qwen2MoeForCausalLM for a Llama) from rank 0 (collective under ZeRO 3).
   * Returns false, writing nothing, when the layout splits the model (tp > 1, pp > 1 or ep > 1).
   */
  async exportHF(dir: string): Promise<boolean> {
    if (this.layout.tp > 1 || this.layout.pp > 1 || (this.layout.ep ?? 1) > 1) return false;
    // A GPT-2 directory for the GPT, a LlamaForCausalLM one for a Llama.
    await this.withFullModel((model) => { if (this.rank === 0) exportHF(model, dir); });
    return true;
  }

  /** Finishes the checkpoint in flight, releases the loader, trainer and model, and leaves the job. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    try {
      await this.#teardown.run();
    } finally {
      if (dist.isInitialized()) await dist.destroy();
    }
  }
}

/** A step's MoE statistics as the progress line shows them. */
function moeProgress(s: MoEStats): MoEProgress {
  const total = s.tokensPerExpert.reduce((a, b) => a + b, 0);
  const mean = total / Math.max(1, s.tokensPerExpert.length);
  return { auxLoss: s.auxLoss, droppedShare: s.routed > 0 ? s.dropped / s.routed : 0, imbalance: mean > 0 ? Math.max(...s.tokensPerExpert) / mean : 0 };
}
