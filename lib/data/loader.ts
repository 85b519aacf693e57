// TokenLoader: training windows from token shards for any data-parallel layout, in a seeded order,
// resumable. The windows are the seqLen + 1 tokens starting at every multiple of seqLen in each
// shard (targets are the inputs shifted by one); an epoch is a permutation of all of them drawn from
// the seed and the epoch number. Global batch k is windows [k·G, (k+1)·G) of the permutation (G =
// rows per rank × data-parallel ranks) and data-parallel rank d takes rows [d·B, (d+1)·B) of it, so
// the ranks read disjoint windows and together see exactly what one process with batch G would.
// Only tensor-parallel rank 0 reads; it broadcasts the batch to its group (MegaScale's dedup).
// state() is the position (epoch, batch), which checkpoints keep.
import { basename } from 'node:path';
import { ArgumentError } from '../errors.js';
import { tensor } from '../creation.js';
import { emptyOn, type Tensor } from '../tensor.js';
import { parseDevice } from '../device.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { traceSpan } from '../observe/trace.js';
import { TokenShard } from './shards.js';

/** Options of {@link TokenLoader}. */
export interface TokenLoaderOptions {
  /** Shard files (llm.c's format), in order. */
  files: string[];
  /** Rows per data-parallel rank per batch. */
  batchSize: number;
  /** Tokens per row; each row reads a window of seqLen + 1 tokens. */
  seqLen: number;
  /** Seed of the order (default 0). */
  seed?: number;
  /** This rank's data-parallel rank (default 0). */
  dpRank?: number;
  /** Number of data-parallel ranks (default 1). */
  dpSize?: number;
  /** The tensor-parallel group: its rank 0 reads and broadcasts the batch to the others. */
  tpGroup?: CollectiveGroup | null;
  /** Shuffle the windows each epoch (default true); false: in file order every epoch. */
  shuffle?: boolean;
  /** Device of the batches (default cpu). */
  device?: string;
}

/** A loader's position: JSON, saved in checkpoints. */
export interface LoaderState {
  /** Format version of the state. */
  version: 1;
  /** Seed of the order. */
  seed: number;
  /** Epochs completed (0 during the first). */
  epoch: number;
  /** Global batches already taken from this epoch. */
  batch: number;
  /** Tokens per row. */
  seqLen: number;
  /** Rows per global batch (rows per rank × data-parallel ranks). */
  globalBatch: number;
  /** Whether windows are shuffled each epoch. */
  shuffle: boolean;
  /** The shards, by file name and token count; loadState() requires the same. */
  files: Array<{
    /** File name (without directory). */
    name: string;
    /** Tokens in the shard. */
    tokens: number;
  }>;
}
/** One batch: int32 [batchSize, seqLen] tokens and the same tokens shifted by one. */
export interface TokenBatch {
  /** Input tokens, int32 [batchSize, seqLen]. */
  inputs: Tensor;
  /** Next-token targets: the inputs shifted by one, int32 [batchSize, seqLen]. */
  targets: Tensor;
}


/**
 * Training windows from token shards for any data-parallel layout, in a seeded order, resumable. Rank d of dpSize
 * takes rows [d·B, (d+1)·B) of each global batch, so the ranks read disjoint windows and together see what one process
 * with batch B·dpSize would; with a tensor-parallel group only its rank 0 reads and broadcasts. Throws ArgumentError
 * for bad options or shards too small for one global batch.
 */
export class TokenLoader {
  /** Rows per data-parallel rank per batch. */
  readonly batchSize: number;
  /** Tokens per row. */
  readonly seqLen: number;
  /** Seed of the order. */
  readonly seed: number;
  /** This rank's data-parallel rank. */
  readonly dpRank: number;
  /** Number of data-parallel ranks. */
  readonly dpSize: number;
  /** Whether the windows are shuffled each epoch. */
  readonly shuffle: boolean;
  /** Canonical device name of the batches. */
  readonly device: string;
  /** The tensor-parallel group the batch is broadcast over (null when none, or of size 1). */
  readonly tpGroup: CollectiveGroup | null;
  /** Windows in each shard, and where each shard's windows start in the global numbering. */
  readonly #windows: number[];
  readonly #firstWindow: number[];
  readonly #shards: TokenShard[] | null;
  readonly #files: Array<{ name: string; tokens: number }>;
  #epoch = 0;
  #batch = 0;
  #order: Uint32Array | null = null;

  constructor(opts: TokenLoaderOptions) {
    if (opts === null || typeof opts !== 'object') throw new ArgumentError(`TokenLoader: options must be an object { files, batchSize, seqLen, ... }, got ${opts === null ? 'null' : typeof opts}`);
    const { files, batchSize, seqLen } = opts;
    this.seed = opts.seed ?? 0;
    this.dpRank = opts.dpRank ?? 0;
    this.dpSize = opts.dpSize ?? 1;
    this.shuffle = opts.shuffle ?? true;
    this.tpGroup = opts.tpGroup && opts.tpGroup.size > 1 ? opts.tpGroup : null;
    this.device = parseDevice(opts.device ?? 'cpu', 'TokenLoader').name;
    if (!Array.isArray(files) || files.length === 0) throw new ArgumentError('TokenLoader: files must list at least one token shard');
    if (!(Number.isInteger(batchSize) && batchSize >= 1)) throw new ArgumentError(`TokenLoader: batchSize must be an integer >= 1, got ${batchSize}`);
    if (!(Number.isInteger(seqLen) && seqLen >= 1)) throw new ArgumentError(`TokenLoader: seqLen must be an integer >= 1, got ${seqLen}`);
    if (!(Number.isSafeInteger(this.seed) && this.seed >= 0)) throw new ArgumentError(`TokenLoader: seed must be an integer >= 0, got ${this.seed}`);
    if (!(Number.isInteger(this.dpSize) && this.dpSize >= 1 && Number.isInteger(this.dpRank) && this.dpRank >= 0 && this.dpRank < this.dpSize)) {
      throw new ArgumentError(`TokenLoader: dpRank ${this.dpRank} is not a rank of dpSize ${this.dpSize}`);
    }
    this.batchSize = batchSize;
    this.seqLen = seqLen;
    // Every rank opens the shards (their sizes fix the order); only the reader reads tokens.
    const shards = files.map((f) => TokenShard.open(f));
    this.#files = shards.map((s, i) => ({ name: basename(files[i]!), tokens: s.tokens }));
    this.#windows = shards.map((s) => Math.max(0, Math.floor((s.tokens - 1) / seqLen)));
    let at = 0;
    this.#firstWindow = this.#windows.map((n) => { const first = at; at += n; return first; });
    if (at < this.globalBatch) {
      for (const s of shards) s.close();
      throw new ArgumentError(`TokenLoader: the shards hold ${at} windows of ${seqLen + 1} tokens, fewer than one global batch of ${this.globalBatch}`);
    }
    const reads = !this.tpGroup || this.tpGroup.rank === 0;
    if (!reads) for (const s of shards) s.close();
    this.#shards = reads ? shards : null;
  }

  /** Whether this rank reads the shards (false: a tensor-parallel rank > 0, which receives the batch). */
  get isReader(): boolean { return this.#shards !== null; }
  /** Rows of one global batch: rows per rank × data-parallel ranks. */
  get globalBatch(): number { return this.batchSize * this.dpSize; }
  /** Windows over all shards. */
  get windows(): number { return this.#windows.reduce((a, b) => a + b, 0); }
  /** Global batches per epoch (the remainder of an epoch is dropped). */
  get batchesPerEpoch(): number { return Math.floor(this.windows / this.globalBatch); }
  /** Epochs completed (0 during the first). */
  get epoch(): number { return this.#epoch; }
  /** Global batches taken in this epoch. */
  get batch(): number { return this.#batch; }

  /** The next batch: int32 [batchSize, seqLen] inputs and targets. Collective over tpGroup when given. */
  async next(): Promise<TokenBatch> {
    return traceSpan('load batch', () => this.#next(), 'data');
  }

  async #next(): Promise<TokenBatch> {
    if (this.#batch >= this.batchesPerEpoch) { this.#epoch++; this.#batch = 0; this.#order = null; }
    const first = this.#batch * this.globalBatch + this.dpRank * this.batchSize;
    this.#batch++;
    const { batchSize: B, seqLen: T } = this;
    if (this.#shards) {
      const x = new Int32Array(B * T), y = new Int32Array(B * T);
      const window = new Uint16Array(T + 1);
      for (let row = 0; row < B; row++) {
        const [shard, offset] = this.#locate(this.#windowAt(first + row));
        this.#shards[shard]!.read(offset, T + 1, window);
        for (let t = 0; t < T; t++) { x[row * T + t] = window[t]!; y[row * T + t] = window[t + 1]!; }
      }
      const batch = { inputs: tensor(x, [B, T], { device: this.device }), targets: tensor(y, [B, T], { device: this.device }) };
      return this.tpGroup ? this.#broadcast(batch) : batch;
    }
    const device = parseDevice(this.device, 'TokenLoader');
    return this.#broadcast({ inputs: emptyOn([B, T], 'i32', device), targets: emptyOn([B, T], 'i32', device) });
  }

  /**
   * Broadcasts a batch from tensor-parallel rank 0 to its group. When a broadcast fails (a lost peer:
   * in-job recovery goes on in this process) the batch is released before the error is rethrown, once
   * the collective has settled, so a failed step leaves no batch behind.
   */
  async #broadcast(batch: TokenBatch): Promise<TokenBatch> {
    try {
      await this.tpGroup!.broadcast(batch.inputs, { root: 0 });
      await this.tpGroup!.broadcast(batch.targets, { root: 0 });
      return batch;
    } catch (e) {
      batch.inputs.dispose();
      batch.targets.dispose();
      throw e;
    }
  }

  /** The global window number at position `i` of this epoch's order. */
  #windowAt(i: number): number {
    if (!this.shuffle) return i;
    this.#order ??= permutation(this.windows, this.seed, this.#epoch);
    return this.#order[i]!;
  }

  /** Shard and first token of a global window. */
  #locate(w: number): [number, number] {
    let lo = 0, hi = this.#firstWindow.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.#firstWindow[mid]! <= w) lo = mid; else hi = mid - 1;
    }
    return [lo, (w - this.#firstWindow[lo]!) * this.seqLen];
  }

  /** The position (epoch, batch) and what fixes the order, for checkpoints. */
  state(): LoaderState {
    return { version: 1, seed: this.seed, epoch: this.#epoch, batch: this.#batch, seqLen: this.seqLen, globalBatch: this.globalBatch, shuffle: this.shuffle, files: this.#files.map((f) => ({ ...f })) };
  }

  /**
   * Resumes at a position state() returned. The same shards, sequence length, seed and global batch
   * are required; the split of the global batch over data-parallel ranks may differ.
   */
  loadState(s: LoaderState): void {
    const problems: string[] = [];
    if (s?.version !== 1) throw new ArgumentError(`TokenLoader.loadState: not a loader state (version ${String(s?.version)})`);
    if (s.seqLen !== this.seqLen) problems.push(`seqLen ${s.seqLen} (this loader: ${this.seqLen})`);
    if (s.globalBatch !== this.globalBatch) problems.push(`a global batch of ${s.globalBatch} rows (this loader: ${this.batchSize} × ${this.dpSize} = ${this.globalBatch})`);
    if (s.seed !== this.seed || s.shuffle !== this.shuffle) problems.push(`seed ${s.seed}${s.shuffle ? '' : ' unshuffled'} (this loader: ${this.seed}${this.shuffle ? '' : ' unshuffled'})`);
    const same = s.files.length === this.#files.length && s.files.every((f, i) => f.name === this.#files[i]!.name && f.tokens === this.#files[i]!.tokens);
    if (!same) problems.push(`shards ${s.files.map((f) => `${f.name} (${f.tokens})`).join(', ')} (this loader: ${this.#files.map((f) => `${f.name} (${f.tokens})`).join(', ')})`);
    if (problems.length) throw new ArgumentError(`TokenLoader.loadState: the state was saved with ${problems.join('; ')}; the order would differ`);
    if (!(Number.isInteger(s.epoch) && s.epoch >= 0 && Number.isInteger(s.batch) && s.batch >= 0 && s.batch <= this.batchesPerEpoch)) {
      throw new ArgumentError(`TokenLoader.loadState: bad position epoch ${s.epoch}, batch ${s.batch}`);
    }
    if (s.epoch !== this.#epoch) this.#order = null;
    this.#epoch = s.epoch;
    this.#batch = s.batch;
  }

  /** Closes the shard files. */
  close(): void { for (const s of this.#shards ?? []) s.close(); }
}

/** A seeded permutation of [0, n) (Fisher–Yates over a 32-bit mixing generator of seed and epoch). */
export function permutation(n: number, seed: number, epoch: number): Uint32Array {
  if (!Number.isSafeInteger(n) || n < 0 || n >= 2 ** 32) throw new ArgumentError(`permutation: n must be an integer in [0, 2^32), got ${String(n)}`);
  if (!Number.isSafeInteger(seed) || seed < 0) throw new ArgumentError(`permutation: seed must be an integer >= 0, got ${String(seed)}`);
  if (!Number.isSafeInteger(epoch) || epoch < 0) throw new ArgumentError(`permutation: epoch must be an integer >= 0, got ${String(epoch)}`);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = i;
  let state = (Math.imul(seed ^ 0x5bd1e995, 0x9e3779b1) ^ Math.imul(epoch + 1, 0x85ebca6b) ^ Math.floor(seed / 2 ** 32)) >>> 0;
  const next = () => {
    // mulberry32
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    const tmp = out[i]!; out[i] = out[j]!; out[j] = tmp;
  }
  return out;
}
