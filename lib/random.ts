// Seeded random numbers from a counter-based Philox generator. A draw is addressed by
// (seed, base block, element index), so a shard can draw exactly its part of the single-process draw.

import { ArgumentError } from './errors.js';

/** Default seed, as fixed as PyTorch's, so unseeded runs are reproducible too. */
const DEFAULT_SEED = 67280421310721n;

/** A generator: a 64-bit seed and an offset in Philox blocks (4 x 32-bit outputs each). */
export class Generator {
  /** The 64-bit seed. */
  seed: bigint;
  /** Philox blocks (4 x 32-bit outputs each) consumed since seeding. */
  offsetBlocks: number;
  constructor(seed: number | bigint = DEFAULT_SEED) {
    this.seed = toSeed(seed);
    this.offsetBlocks = 0;
  }
  /** Reseeds and rewinds to offset 0; returns this. */
  manualSeed(seed: number | bigint): this {
    this.seed = toSeed(seed);
    this.offsetBlocks = 0;
    return this;
  }
  /** Reserves the blocks of a draw of `count` elements and returns its base block. */
  reserve(count: number, elementsPerBlock: number): number {
    const base = this.offsetBlocks;
    this.offsetBlocks += Math.ceil(count / elementsPerBlock);
    return base;
  }
  /** The generator's position, JSON-serializable (checkpoints save it). */
  state(): {
    /** The seed as a decimal string (a bigint does not survive JSON). */
    seed: string;
    /** Philox blocks consumed since seeding. */
    offsetBlocks: number;
  } {
    return { seed: this.seed.toString(), offsetBlocks: this.offsetBlocks };
  }
  /** Restores a position that state() returned. */
  loadState(s: { seed: string; offsetBlocks: number }): this {
    if (!s || typeof s.seed !== 'string' || !/^\d+$/.test(s.seed) || !Number.isSafeInteger(s.offsetBlocks) || s.offsetBlocks < 0) {
      throw new ArgumentError(`Generator.loadState: expected { seed: decimal string, offsetBlocks: integer >= 0 }, got ${JSON.stringify(s)}`);
    }
    this.seed = toSeed(BigInt(s.seed));
    this.offsetBlocks = s.offsetBlocks;
    return this;
  }
  /** Seed as the two 32-bit halves the native kernels take. */
  seedHalves(): [number, number] {
    return [Number(this.seed >> 32n), Number(this.seed & 0xffffffffn)];
  }
}

function toSeed(seed: number | bigint): bigint {
  if (typeof seed === 'number') {
    if (!Number.isSafeInteger(seed) || seed < 0) throw new ArgumentError(`seed must be a non-negative safe integer, got ${seed}`);
    return BigInt(seed);
  }
  if (typeof seed !== 'bigint' || seed < 0n || seed >= 1n << 64n) throw new ArgumentError(`seed must be a 64-bit unsigned integer`);
  return seed;
}

/** The generator behind calls that pass no seed. */
export const defaultGenerator = new Generator();

/** Reseeds the default generator (like torch.manual_seed). */
export function manualSeed(seed: number | bigint): void {
  defaultGenerator.manualSeed(seed);
}

/** Kinds of draw, with the elements each Philox block yields. */
export const DRAW = {
  uniform: { kind: 0, perBlock: 4 },
  normal: { kind: 1, perBlock: 2 },
  bernoulli: { kind: 2, perBlock: 4 },
} as const;
