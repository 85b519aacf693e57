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
    // A bad count would leave offsetBlocks NaN and every later draw of this generator garbage.
    if (!Number.isSafeInteger(count) || count < 0 || !Number.isSafeInteger(elementsPerBlock) || elementsPerBlock < 1) {
      throw new ArgumentError(`Generator.reserve: count must be an integer >= 0 and elementsPerBlock an integer >= 1, got ${count} and ${elementsPerBlock}`);
    }
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
    if (!Number.isSafeInteger(seed) || seed < 0) throw new ArgumentError(`seed must be an integer in [0, 2^53) or a bigint in [0, 2^64), got ${seed}`);
    return BigInt(seed);
  }
  if (typeof seed !== 'bigint' || seed < 0n || seed >= 1n << 64n) {
    throw new ArgumentError(`seed must be an integer in [0, 2^53) or a bigint in [0, 2^64), got ${typeof seed === 'bigint' ? `${seed}n` : typeof seed === 'string' ? JSON.stringify(seed) : typeof seed}`);
  }
  return seed;
}

/** Checks that a value is a Generator (an options field, a layer's argument); ArgumentError otherwise. */
export function checkGenerator(g: unknown, call: string): Generator {
  if (!(g instanceof Generator)) throw new ArgumentError(`${call}: generator must be a Generator (new nt.Generator(seed)), got ${g === null ? 'null' : typeof g}`);
  return g;
}

/** The generator of a draw: a fresh one for `seed`, else `generator`, else the default one; checks both. */
export function generatorFrom(opts: { seed?: number | bigint; generator?: Generator } | undefined, call: string): Generator {
  if (opts?.seed !== undefined) return new Generator(opts.seed);
  return opts?.generator === undefined ? defaultGenerator : checkGenerator(opts.generator, call);
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
