// One pipeline stage of a decoder-only model (the GPT, nt.nn.Llama: any CausalLM): the blocks [start, end)
// of partitionLayers(nLayer, stages) — or, with virtual stages (interleaved 1F1B), several non-adjacent
// chunks of blocks — plus the embeddings on the first stage and the final norm with the head on the last
// (the model names them: CausalLM.stageModules).
import { ArgumentError, ShapeError } from '../../errors.js';
import { Module, type Parameter } from '../../nn/module.js';
import type { CausalLM } from '../../nn/gpt.js';
import type { Tensor } from '../../tensor.js';
import { chunkLayers, type ChunkPlacement } from './schedules.js';
import { cast } from '../../ops/autocast.js';

/** What the parallel trainer runs: a model, or one pipeline stage of it, that ends in a loss on the last stage. */
export interface PipelineModule extends Module {
  /** Whether this is the first pipeline stage (it takes token ids). */
  readonly isFirstStage: boolean;
  /** Whether this is the last pipeline stage (it computes the loss). */
  readonly isLastStage: boolean;
  /** Model chunks this stage holds (interleaved 1F1B's virtual stages, zb-v's 2; absent: 1). */
  readonly chunks?: number;
  /** How the chunks map to virtual stages (absent: 'loop'; 'v' under zb-v, where the first stage also computes the loss). */
  readonly placement?: ChunkPlacement;
  /**
   * Token ids i32 [B, T] on the first stage's chunk 0, the previous (virtual) stage's activation
   * elsewhere → the activation for the next one, or on the last stage's last chunk the mean loss over
   * targets i32 [B, T].
   */
  forwardStage(input: Tensor, targets: Tensor | null, chunk?: number): Tensor;
  /** Shape of the activation a stage (not the first) receives for B sequences of T tokens. */
  activationShape(batch: number, seqLen: number): number[];
  /**
   * Parameters of which another stage holds a copy (the tied token embedding on the first and the
   * last stage): their gradients are summed over the mesh's embedding group.
   */
  readonly tiedParameters: readonly Parameter[];
  /** Of the tied parameters, those whose gradient the other copy counts in the gradient norm. */
  readonly tiedCountedElsewhere: readonly Parameter[];
}

/**
 * A stage built from a whole model (a GPT or a Llama): the stage keeps the modules it owns and frees
 * every other parameter, so its weights are exactly those of the single-process model of the same
 * seed. With stages = 1 it is the whole model. Parameter names are the model's (`h.3.attn.qkv.weight`
 * or `layers.3.selfAttn.qProj.weight` on whichever stage holds layer 3), in the model's order.
 */
export class GPTStage extends Module implements PipelineModule {
  /** This stage's index. */
  readonly stage: number;
  /** Number of pipeline stages. */
  readonly stages: number;
  /** The global layer range [start, end) this stage runs (its first chunk's, with virtual stages). */
  readonly layers: readonly [number, number];
  /** Model chunks (virtual stages) this stage holds: chunk k is virtual stage k·stages + stage ('loop'), or stage and 2·stages − 1 − stage ('v'). */
  readonly chunks: number;
  /** How the chunks map to virtual stages: 'loop' (interleaved 1F1B) or 'v' (zb-v). */
  readonly placement: ChunkPlacement;
  /** Each chunk's global layer range [start, end). */
  readonly chunkLayers: readonly (readonly [number, number])[];
  /** Whether this is the first stage (it holds the embeddings). */
  readonly isFirstStage: boolean;
  /** Whether this is the last stage (it holds the final LayerNorm and the tied head). */
  readonly isLastStage: boolean;
  readonly tiedParameters: readonly Parameter[];
  readonly tiedCountedElsewhere: readonly Parameter[];
  readonly #model: CausalLM;
  readonly #owned: [string, Module][];

  /**
   * Takes ownership of `model`: after this, use the stage (the model's other parameters are
   * disposed). `chunks` > 1: the stage holds chunks stage, stage + stages, ... of stages·chunks
   * (interleaved 1F1B); with placement 'v' (zb-v, chunks = 2) chunks stage and 2·stages − 1 − stage,
   * so stage 0 holds the embeddings, the first and the last layers and the head.
   */
  constructor(model: CausalLM, stage: number, stages: number, chunks = 1, placement: ChunkPlacement = 'loop') {
    super();
    if (!Number.isInteger(stage) || stage < 0 || stage >= stages) throw new ArgumentError(`GPTStage: stage ${stage} is outside [0, ${stages})`);
    if (placement !== 'loop' && placement !== 'v') throw new ArgumentError(`GPTStage: placement must be 'loop' or 'v', got ${String(placement)}`);
    const ranges = chunkLayers(model.shape.nLayer, stages, stage, chunks, placement);
    this.stage = stage; this.stages = stages; this.chunks = chunks; this.placement = placement;
    this.chunkLayers = ranges;
    this.layers = ranges[0]!;
    this.isFirstStage = stage === 0;
    this.isLastStage = placement === 'v' ? stage === 0 : stage === stages - 1;
    this.#model = model;
    const { before, after } = model.stageModules(this.isFirstStage, this.isLastStage);
    const owned: [string, Module][] = [...before];
    for (const [start, end] of ranges) model.blocks.slice(start, end).forEach((block, i) => owned.push([`${model.blockPrefix}.${start + i}`, block]));
    owned.push(...after);
    this.#owned = owned;
    const keep = new Set(this.parameters());
    for (const p of model.parameters()) if (!keep.has(p)) p.dispose();
    // A tied token table is both the first stage's input table and the last stage's output head (one
    // copy when one stage is both, as under the V placement).
    const tied = model.tiedWeight, twoCopies = stages > 1 && placement === 'loop';
    this.tiedParameters = tied && twoCopies && (this.isFirstStage || this.isLastStage) ? [tied] : [];
    this.tiedCountedElsewhere = tied && twoCopies && this.isLastStage ? [tied] : [];
  }

  /** Also switches the model's own mode (recomputation) and its embedding dropout. */
  override train(mode = true): this {
    this.#model.train(mode);
    return super.train(mode);
  }

  // Modules are named explicitly (not by field) so that layer i keeps its model's name (h.i, layers.i) on every stage.
  override *namedChildren(): Generator<[string, Module]> { yield* this.#owned; }

  forwardStage(input: Tensor, targets: Tensor | null, chunk = 0): Tensor {
    const m = this.#model;
    if (!Number.isInteger(chunk) || chunk < 0 || chunk >= this.chunks) throw new ArgumentError(`GPTStage.forwardStage: chunk ${chunk} is outside [0, ${this.chunks})`);
    let x = this.isFirstStage && chunk === 0 ? m.embed(input) : input;
    const [start, end] = this.chunkLayers[chunk]!;
    x = m.forwardBlocks(x, start, end);
    // The pipeline moves f32 activations (its receives are f32): a 16-bit residual stream is cast back
    // for the next stage, which casts it again as its blocks start.
    if (!this.isLastStage || chunk !== this.chunks - 1) return x.dtype === 'f32' ? x : cast(x, 'f32');
    if (targets === null) throw new ArgumentError('GPTStage.forwardStage: the last stage needs targets to compute the loss');
    return m.head(x, targets).loss!;
  }

  /**
   * This stage's parameters in an order whose reverse is the order their gradients are final in the
   * step's last backward pass, the one that synchronizes: with several chunks that pass is chunk 0's
   * (interleaved 1F1B and zb-v end with it), so chunk 0's blocks come last, then the embeddings, the
   * other chunks, the head. Gradient buckets fixed at construction (ZeRO 1/2) are laid out by it, so
   * their reduce-scatters start during that pass. One chunk: the parameters' own order.
   */
  gradientReadyOrder(): Parameter[] {
    if (this.chunks === 1) return this.parameters();
    const m = this.#model;
    const { before, after } = m.stageModules(this.isFirstStage, this.isLastStage);
    const paramsOf = (mods: Array<[string, Module]>) => mods.flatMap(([, mod]) => mod.parameters());
    const blocksOf = (chunk: number) => { const [start, end] = this.chunkLayers[chunk]!; return m.blocks.slice(start, end).flatMap((b) => b.parameters()); };
    const order = [...paramsOf(after)];
    for (let c = this.chunks - 1; c >= 1; c--) order.push(...blocksOf(c));
    order.push(...paramsOf(before), ...blocksOf(0));
    return [...new Set(order)];
  }

  /** [B, T, C], or under sequence parallelism this rank's chunk [B, T/tp, C]. */
  activationShape(batch: number, seqLen: number): number[] {
    const { blockSize, nEmbd } = this.#model.shape;
    if (seqLen > blockSize) throw new ShapeError(`GPTStage: sequence length ${seqLen} exceeds the model's context ${blockSize}`);
    return [batch, this.#model.sequenceLayout.chunk(seqLen).count, nEmbd];
  }

  /** The whole model, when this stage is all of it (stages = 1); null otherwise. */
  get model(): CausalLM | null { return this.stages === 1 ? this.#model : null; }
}
