// `nodetron bench head`: the GPT's LM head and loss (forward + backward, and forward alone as in
// evaluation) for the training benches' shapes: the unfused linear + crossEntropy beside the fused
// linearCrossEntropy at several chunk sizes, in interleaved rounds (a loaded machine slows every
// variant alike), with each variant's peak memory above its inputs. What chose LINEAR_CE_CHUNK_BYTES.
import { randn, tensor } from '../creation.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { noGrad } from '../autograd/index.js';
import { crossEntropy, linear, linearCrossEntropy, linearCrossEntropyChunkRows } from '../ops/index.js';
import type { Tensor } from '../tensor.js';
import { selectConfigs } from './configs.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { parseOptions } from '../cmdline/args.js';

const usage = `usage: nodetron bench head [--config tiny|small|all] [--rows 64,128,256,512,1024] [--rounds N (5)] [--json F]
  LM head + cross-entropy of the bench configs' shapes (N = batch·ctx rows, width C, vocabulary V):
  unfused linear + crossEntropy against linearCrossEntropy with the default chunking and with --rows rows per chunk;
  min and median ms of forward + backward (and its least CPU time, all threads: steadier on a loaded machine)
  and of forward alone (no grad), peak MiB above the inputs`;

interface Variant { name: string; rows: number | null }
interface Result { variant: string; chunkRows: number | null; trainMs: number[]; trainCpuMs: number[]; evalMs: number[]; trainPeak: number; evalPeak: number; loss: number }

export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { json: 'string', config: 'string', rows: 'string', rounds: 'number', help: 'boolean' });
  if (o.help) { console.log(usage); return 0; }
  const configs = selectConfigs(o.config as string | undefined);
  const rounds = (o.rounds as number | undefined) ?? 5;
  const rowList = ((o.rows as string | undefined) ?? '64,128,256,512,1024').split(',').map(Number);
  console.log(`# nodetron bench head — ${rounds} interleaved rounds after one warm-up, f32 on cpu\n`);
  const out: Record<string, unknown>[] = [];
  const table: (string | number)[][] = [];
  for (const c of configs) {
    const N = c.batch * c.ctx, C = c.width, V = c.vocab;
    const x = randn([N, C], { seed: 1 }), w = randn([V, C], { seed: 2, std: 0.02 });
    x.requiresGrad = true; w.requiresGrad = true;
    const targets = tensor(Int32Array.from({ length: N }, (_, i) => (i * 7919) % V), [N], { dtype: 'i32' });
    const variants: Variant[] = [{ name: 'unfused', rows: null }, { name: `fused (default ${linearCrossEntropyChunkRows(N, V, 4)} rows)`, rows: 0 },
      ...rowList.filter((r) => Number.isInteger(r) && r > 0).map((r) => ({ name: `fused ${r} rows`, rows: r }))];
    const head = (v: Variant): Tensor => (v.rows === null ? crossEntropy(linear(x, w), targets)
      : linearCrossEntropy(x, w, targets, v.rows === 0 ? {} : { chunkRows: v.rows }));
    const results: Result[] = variants.map((v) => ({ variant: v.name, chunkRows: v.rows, trainMs: [], trainCpuMs: [], evalMs: [], trainPeak: 0, evalPeak: 0, loss: NaN }));
    const once = (v: Variant, r: Result, train: boolean, timed: boolean) => {
      x.grad?.dispose(); w.grad?.dispose(); x.grad = null; w.grad = null;
      const before = memoryStats().allocated;
      resetPeakMemory();
      const t0 = performance.now(), cpu0 = process.cpuUsage();
      if (train) {
        const loss = head(v);
        loss.backward();
        r.loss = loss.item();
        loss.dispose();
      } else {
        noGrad(() => head(v)).dispose();
      }
      const ms = performance.now() - t0, cpu = process.cpuUsage(cpu0);
      const peak = memoryStats().peak - before;
      if (!timed) return;
      (train ? r.trainMs : r.evalMs).push(ms);
      if (train) r.trainCpuMs.push((cpu.user + cpu.system) / 1000);
      if (train) r.trainPeak = Math.max(r.trainPeak, peak); else r.evalPeak = Math.max(r.evalPeak, peak);
    };
    for (let round = 0; round <= rounds; round++) {
      variants.forEach((v, i) => { once(v, results[i]!, true, round > 0); once(v, results[i]!, false, round > 0); });
    }
    x.grad?.dispose(); w.grad?.dispose();
    x.dispose(); w.dispose(); targets.dispose();
    const mib = (b: number) => (b / 2 ** 20).toFixed(1);
    const stat = (a: number[]) => { const s = [...a].sort((p, q) => p - q); return { min: s[0]!, median: s[s.length >> 1]! }; };
    for (const r of results) {
      const t = stat(r.trainMs), e = stat(r.evalMs);
      const cpu = stat(r.trainCpuMs);
      table.push([c.name, r.variant, t.min.toFixed(1), t.median.toFixed(1), cpu.min.toFixed(1), mib(r.trainPeak), e.min.toFixed(1), e.median.toFixed(1), mib(r.evalPeak), r.loss.toFixed(5)]);
      out.push({ config: c, ...r, train: t, trainCpu: cpu, eval: e });
    }
  }
  printTable(['config', 'head', 'fwd+bwd min ms', 'median', 'min CPU ms', 'peak MiB', 'fwd min ms', 'median', 'peak MiB', 'loss'], table);
  writeJson(o.json as string | undefined, { bench: 'head', machine: machineRecord(), rounds, results: out });
  return 0;
}
