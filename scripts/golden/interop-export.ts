// The nodetron half of the by-hand check of scripts/golden/interop.py --verify: builds a seeded GPT-2
// (sizes unlike the golden model's, every parameter perturbed so no LayerNorm is (1, 0) and no bias is
// zero), exports it with nt.interop.exportHF into DIR, and writes DIR/nodetron_logits.json (its
// logits for a fixed batch) for the Python side to compare with GPT2LMHeadModel.from_pretrained(DIR).
// Run: npx tsx scripts/golden/interop-export.ts DIR [--dtype f32|bf16|f16]
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as nt from '../../lib/index.js';

const args = process.argv.slice(2);
const dir = args[0];
const at = args.indexOf('--dtype');
const dtype = (at >= 0 ? args[at + 1] : 'f32') as nt.interop.HFDType;
if (!dir || dir.startsWith('--')) {
  console.error('usage: npx tsx scripts/golden/interop-export.ts DIR [--dtype f32|bf16|f16]');
  process.exit(2);
}

const config = { vocabSize: 97, blockSize: 40, nLayer: 3, nHead: 4, nEmbd: 64, dropout: 0.1, bias: true };
const model = new nt.nn.GPT(config, { seed: 11 });
nt.noGrad(() => {
  for (const [i, [name, p]] of model.namedParameters().entries()) {
    using noise = nt.randn(p.shape, { seed: 1000 + i, std: name.startsWith('ln') || name.includes('.ln') ? 0.1 : 0.02 });
    using sum = nt.add(p, noise);
    p.backend.copy(p.storage, 0, sum.storage, 0, p.nbytes);
  }
});
nt.interop.exportHF(model, dir, { dtype });
// The logits of the weights as exported: a bf16 or f16 export is read back first.
const exported = dtype === 'f32' ? model : nt.interop.importHF(dir);
exported.eval();
const batch = 2, seq = 40;
const idx = Array.from({ length: batch * seq }, (_, i) => (i * 37 + 11) % config.vocabSize);
const logits = nt.noGrad(() => exported.forward(nt.tensor(Int32Array.from(idx), [batch, seq])).logits.toArraySync() as Float32Array);
writeFileSync(join(dir, 'nodetron_logits.json'), JSON.stringify({
  batch, seq, idx, logits: Buffer.from(logits.buffer, logits.byteOffset, logits.byteLength).toString('base64'),
}));
console.log(`exported a ${config.nLayer}-layer GPT-2 (${dtype}) to ${dir} with its logits in nodetron_logits.json`);
