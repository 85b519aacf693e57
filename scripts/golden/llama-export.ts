// Exports the golden tiny Llama (test/golden/llama/hf-tiny, read by nodetron) back to a Hugging Face
// directory, for scripts/golden/llama.py --verify DIR to load in transformers and compare logits:
//   npx tsx scripts/golden/llama-export.ts /tmp/nt-llama [--dtype bf16] [--shard-bytes 20000] [--from hf-tiny]
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/cmdline/args.js';

const args = process.argv.slice(2);
const dir = args.find((a) => !a.startsWith('--') && !/^\d+$/.test(a) && !['bf16', 'f16', 'f32'].includes(a));
if (!dir) throw new nt.ArgumentError('usage: llama-export.ts DIR [--dtype f32|bf16|f16] [--shard-bytes N] [--from hf-tiny]');
const o = parseOptions(args.filter((a) => a !== dir), { dtype: 'string', 'shard-bytes': 'number', from: 'string' });
const model = nt.interop.importLlamaHF(join(import.meta.dirname, '..', '..', 'test', 'golden', 'llama', (o.from as string | undefined) ?? 'hf-tiny'));
nt.interop.exportLlamaHF(model, dir, {
  ...(o.dtype ? { dtype: o.dtype as nt.interop.HFDType } : {}), ...(o['shard-bytes'] ? { maxShardBytes: o['shard-bytes'] as number } : {}),
});
console.log(`wrote ${dir}`);
