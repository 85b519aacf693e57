// The GPT shapes and batches the training benches run (`nodetron bench train`, with and without
// --layout): one list, so every bench and its tests measure the same models.
import { ArgumentError } from '../errors.js';
import type { GPTConfig } from '../nn/gpt.js';

/** A GPT shape and batch the training benches run. */
export interface TrainBenchConfig { name: string; layers: number; heads: number; width: number; ctx: number; batch: number; vocab: number }

export const TRAIN_CONFIGS: TrainBenchConfig[] = [
  { name: 'tiny', layers: 4, heads: 4, width: 128, ctx: 128, batch: 8, vocab: 50257 },
  { name: 'small', layers: 6, heads: 6, width: 384, ctx: 256, batch: 4, vocab: 50257 },
];

/** The GPT a bench config trains: its shape, biases on, no dropout (`extra` adds or overrides options, e.g. recompute). */
export function gptConfigOf(c: TrainBenchConfig, extra: Partial<GPTConfig> = {}): GPTConfig {
  return { vocabSize: c.vocab, blockSize: c.ctx, nLayer: c.layers, nHead: c.heads, nEmbd: c.width, dropout: 0, bias: true, ...extra };
}

/** The configs `--config tiny|small|all` names (default tiny); an unknown name is an ArgumentError listing the choices. */
export function selectConfigs(which = 'tiny'): TrainBenchConfig[] {
  const configs = which === 'all' ? TRAIN_CONFIGS : TRAIN_CONFIGS.filter((c) => c.name === which);
  if (configs.length === 0) throw new ArgumentError(`bench train: unknown --config ${which} (${TRAIN_CONFIGS.map((c) => c.name).join(', ')}, all)`);
  return configs;
}
