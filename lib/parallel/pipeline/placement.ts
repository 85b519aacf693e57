// Pipeline placement: which layers each pipeline rank holds (an even partition, and under virtual
// stages its model chunks), and how chunks map to virtual stages ('loop' for interleaved 1F1B, 'v'
// for ZB-V) and back.
import { ArgumentError } from '../../errors.js';

/** Layers [start, end) of each of `stages` stages, as even as possible (earlier stages take the remainder). */
export function partitionLayers(numLayers: number, stages: number): [number, number][] {
  if (!Number.isInteger(stages) || stages < 1) throw new ArgumentError(`partitionLayers: stages must be an integer >= 1, got ${stages}`);
  if (!Number.isInteger(numLayers) || numLayers < stages) throw new ArgumentError(`partitionLayers: ${numLayers} layers cannot fill ${stages} pipeline stages (pp must be <= the number of layers)`);
  const base = Math.floor(numLayers / stages), extra = numLayers % stages;
  const out: [number, number][] = [];
  let start = 0;
  for (let s = 0; s < stages; s++) { const n = base + (s < extra ? 1 : 0); out.push([start, start + n]); start += n; }
  return out;
}

/**
 * The layers of each model chunk of pipeline rank `stage` when `stages` ranks hold `chunks` chunks
 * each (interleaved 1F1B's virtual stages): chunk k of rank r is virtual stage k·stages + r of
 * partitionLayers(numLayers, stages·chunks), so a rank holds non-adjacent slices of the model.
 */
export function chunkLayers(numLayers: number, stages: number, stage: number, chunks = 1, placement: ChunkPlacement = 'loop'): [number, number][] {
  if (!Number.isInteger(chunks) || chunks < 1) throw new ArgumentError(`chunkLayers: virtual stages (chunks per rank) must be an integer >= 1, got ${chunks}`);
  if (!Number.isInteger(stage) || stage < 0 || stage >= stages) throw new ArgumentError(`chunkLayers: stage ${stage} is outside [0, ${stages})`);
  if (chunks > 1 && Number.isInteger(numLayers) && numLayers < stages * chunks) {
    throw new ArgumentError(`chunkLayers: ${numLayers} layers cannot fill ${stages} stages × ${chunks} virtual stages = ${stages * chunks} chunks of at least one layer (--virtual-stages must be <= layers / pp)`);
  }
  if (placement === 'v' && chunks !== 2) throw new ArgumentError(`chunkLayers: the V placement (zb-v) holds exactly 2 chunks per rank, got ${chunks}`);
  const all = partitionLayers(numLayers, stages * chunks);
  return Array.from({ length: chunks }, (_, k) => all[virtualStageOf(stage, k, stages, placement)]!);
}

/**
 * How a rank's model chunks map to virtual stages: 'loop' (interleaved 1F1B: chunk k of rank r is
 * virtual stage k·p + r, so the activations go around the ring v times) or 'v' (ZB-V: rank r holds
 * virtual stages r and 2p − 1 − r, so the first chunk goes down the pipeline and the second comes
 * back; the last rank hands its first chunk's output to its own second chunk, and the first rank
 * holds both the embeddings and the head).
 */
export type ChunkPlacement = 'loop' | 'v';

/** The chunk placement a schedule runs on: 'v' for zb-v, 'loop' for the others. */
export function schedulePlacement(kind: string): ChunkPlacement { return kind === 'zb-v' ? 'v' : 'loop'; }

/** The virtual stage of chunk `chunk` of rank `rank` among `stages` ranks. */
export function virtualStageOf(rank: number, chunk: number, stages: number, placement: ChunkPlacement = 'loop'): number {
  if (placement === 'v') return chunk === 0 ? rank : 2 * stages - 1 - rank;
  return chunk * stages + rank;
}

/** Where a virtual stage runs. */
export interface VirtualStagePlace {
  /** The pipeline rank. */
  rank: number;
  /** The rank's model chunk. */
  chunk: number;
}

/** The rank and chunk that run virtual stage `vs` (the inverse of {@link virtualStageOf}). */
export function rankOfVirtualStage(vs: number, stages: number, placement: ChunkPlacement = 'loop'): VirtualStagePlace {
  if (placement === 'v') return vs < stages ? { rank: vs, chunk: 0 } : { rank: 2 * stages - 1 - vs, chunk: 1 };
  return { rank: vs % stages, chunk: Math.floor(vs / stages) };
}
