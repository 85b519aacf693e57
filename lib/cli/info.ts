// `nodetron info [--json]`: what this installation can do, and why not where it cannot.
import { info } from '../info.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';

/** `nodetron info [--json]`; returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { json: 'boolean', help: 'boolean' }, { h: 'help' });
  if (o.help) {
    console.log('usage: nodetron info [--json]');
    return 0;
  }
  expectPositionals(o, 'nothing', 0);
  const i = info();
  if (o.json) {
    console.log(JSON.stringify(i, null, 2));
    return 0;
  }
  const c = i.backends.cpu;
  const lines = [
    `nodetron ${i.version} (node ${i.node}, ${i.platform})`,
    `cpu:   ${i.cpu.model}, ${i.cpu.cores} cores${i.cpu.avx512 ? ', AVX-512' : ''}`,
    `  kernels: SIMD level ${i.cpu.isa.active} (best here: ${i.cpu.isa.best}; supported: ${i.cpu.isa.supported.join(', ')}` +
      `${i.cpu.isa.env ? `; NODETRON_CPU_ISA=${i.cpu.isa.env}` : ''})`,
    `  bf16 GEMM: ${i.cpu.bf16Gemm.kernel} (mode ${i.cpu.bf16Gemm.mode}; AVX512_BF16 ${i.cpu.bf16Gemm.supported ? 'supported' : 'not supported'} here` +
      `${i.cpu.bf16Gemm.env ? `; NODETRON_BF16_GEMM=${i.cpu.bf16Gemm.env}` : ''})`,
    `  blas:  ${c.blasConfig}`,
    `         core type ${c.blasCoreType} (${c.blasCoreChoice}), ${c.blasThreads} threads`,
    `cuda:  ${i.backends.cuda.available ? 'available' : 'unavailable'}`,
  ];
  const cuda = i.backends.cuda;
  if (cuda.available) {
    for (const [k, v] of Object.entries(cuda)) if (k !== 'available') lines.push(`  ${k}: ${typeof v === 'object' ? JSON.stringify(v) : String(v)}`);
  } else {
    lines.push(`  why:   ${cuda.reason}`);
  }
  const g = i.collectives.gloo;
  lines.push(`gloo:  ${g.available ? `available${g.version ? ` (${String(g.version)})` : ''}` : `unavailable: ${g.reason}`}`);
  const n = i.collectives.nccl;
  lines.push(`nccl:  ${n.available ? `available${n.version ? ` (${String(n.version)})` : ''}` : 'unavailable (needs the cuda backend)'}`);
  console.log(lines.join('\n'));
  return 0;
}
