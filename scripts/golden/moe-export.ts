// Exports a golden MoE model (test/golden/moe/<name>, read by nodetron) back to a Hugging Face
// directory, for scripts/golden/moe.py --verify DIR --reference <name> to load in transformers and compare logits:
//   npx tsx scripts/golden/moe-export.ts /tmp/nt-mixtral --from mixtral [--dtype bf16] [--shard-bytes 20000]
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/cmdline/args.js';

const args = process.argv.slice(2);
const values = new Set(['bf16', 'f16', 'f32', 'mixtral', 'mixtral-bf16', 'qwen2-moe', 'qwen2-moe-step2']);
const dir = args.find((a) => !a.startsWith('--') && !/^\d+$/.test(a) && !values.has(a));
if (!dir) throw new nt.ArgumentError('usage: moe-export.ts DIR [--from mixtral|mixtral-bf16|qwen2-moe|qwen2-moe-step2] [--dtype f32|bf16|f16] [--shard-bytes N]');
const o = parseOptions(args.filter((a) => a !== dir), { dtype: 'string', 'shard-bytes': 'number', from: 'string' });
const model = nt.interop.importLlamaHF(join(import.meta.dirname, '..', '..', 'test', 'golden', 'moe', (o.from as string | undefined) ?? 'mixtral'));
nt.interop.exportLlamaHF(model, dir, {
  ...(o.dtype ? { dtype: o.dtype as nt.interop.HFDType } : {}), ...(o['shard-bytes'] ? { maxShardBytes: o['shard-bytes'] as number } : {}),
});
console.log(`wrote ${dir} (${nt.interop.llamaHFArchitecture(model.config)})`);
