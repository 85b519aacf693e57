// Parallel Llama training through the real launcher and Gloo: a tiny Llama (4 heads, 2 or 1 key/value
// heads, untied or tied head) trained 3 steps under DP, ZeRO 1-3, PP, TP (key/value heads split, and
// replicated when the ranks outnumber them), SP, context parallelism (ring and Ulysses), recomputation and their combinations matches the plain
// single-process run step by step (losses, gradient norms) and in its final parameters, compared per
// parameter on the ranks that hold it. The fixture is the GPT's (test/fixtures/parallel/gpt-train.ts
// with --model llama).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type Trained, equivalenceRunner, expectReferenceTrains, maxAbs, maxDiff, relDiff, root } from '../helpers/equivalence.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

const script = join(root, 'test', 'fixtures', 'parallel', 'gpt-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-llama-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const launchRun = equivalenceRunner({ script, work, leadingArgs: ['--model', 'llama'] });

const HEAD_DIM = 8;
/**
 * Tensor-parallel rank r's part of a full Llama parameter, written out independently of the library:
 * q, gate, up and the vocabulary tables by output rows; k and v by output rows when tp divides the
 * key/value heads, else whole (each rank holds them all and uses one); o and down by input columns;
 * the norms whole.
 */
function tensorParallelSlice(name: string, full: Float32Array, shape: number[], tp: number, r: number, kvHeads: number): Float32Array {
  if (tp === 1) return full;
  const rows = (local: number) => full.slice(r * local * shape[1]!, (r + 1) * local * shape[1]!);
  if (/selfAttn\.[kv]Proj\.weight$/.test(name)) return kvHeads % tp === 0 ? rows((kvHeads * HEAD_DIM) / tp) : full;
  if (/(selfAttn\.qProj|mlp\.gateProj|mlp\.upProj)\.weight$/.test(name) || name === 'embedTokens.weight' || name === 'lmHead.weight') return rows(shape[0]! / tp);
  if (/(selfAttn\.oProj|mlp\.downProj)\.weight$/.test(name)) {
    const [n, cols] = shape as [number, number], local = cols / tp;
    return Float32Array.from({ length: n * local }, (_, i) => full[Math.floor(i / local) * cols + r * local + (i % local)]!);
  }
  return full;
}

// Each family of runs (kv heads, tied head) has its own single-process reference.
const refs = {
  kv2: launchRun('ref-kv2', 1, ['--reference', '--kv', '2']),
  kv1: launchRun('ref-kv1', 1, ['--reference', '--kv', '1']),
  tied: launchRun('ref-tied', 1, ['--reference', '--kv', '2', '--tie']),
  // 4 layers, for interleaved 1F1B's 2 stages × 2 model chunks (one process, no launcher).
  l4: launchRun('ref-l4', 0, ['--reference', '--kv', '2', '--layers', '4']),
};
type Ref = keyof typeof refs;
const layouts: Record<string, { ref: Ref; kv: number; run: Promise<Trained> }> = {};
const add = (name: string, ref: Ref, kv: number, nproc: number, flags: string[]) => {
  const extra = ['--kv', String(kv), ...(ref === 'tied' ? ['--tie'] : []), ...(ref === 'l4' ? ['--layers', '4'] : [])];
  layouts[name] = { ref, kv, run: launchRun(name.replace(/[^A-Za-z0-9]+/g, '-'), nproc, [...extra, ...flags]) };
};
add('DP2, 2 micro-batches', 'kv2', 2, 2, ['--dp', '2', '--micro-batches', '2']);
add('ZeRO-1 DP2', 'kv2', 2, 2, ['--zero', '1']);
add('ZeRO-2 DP2 recompute', 'kv2', 2, 2, ['--zero', '2', '--recompute']);
add('ZeRO-3 DP2', 'kv2', 2, 2, ['--zero', '3']);
add('PP2 1F1B, 4 micro-batches, recompute', 'kv2', 2, 2, ['--pp', '2', '--micro-batches', '4', '--recompute']);
add('PP2 GPipe, tied head, 2 micro-batches', 'tied', 2, 2, ['--pp', '2', '--micro-batches', '2', '--schedule', 'gpipe']);
add('TP2 (kv heads split)', 'kv2', 2, 2, ['--tp', '2']);
add('TP2 multi-query (kv head replicated)', 'kv1', 1, 2, ['--tp', '2']);
add('TP4 (2 kv heads replicated over 4 ranks) SP', 'kv2', 2, 4, ['--tp', '4', '--sp']);
add('TP2 SP tied head', 'tied', 2, 2, ['--tp', '2', '--sp']);
add('TP2×PP2 SP 1F1B, 2 micro-batches, recompute', 'kv2', 2, 4, ['--tp', '2', '--pp', '2', '--sp', '--micro-batches', '2', '--recompute']);
add('TP2×DP2 multi-query ZeRO-3', 'kv1', 1, 4, ['--tp', '2', '--dp', '2', '--zero', '3']);
// Context parallelism: rope at each token's global position (the ring's load-balanced chunks, Ulysses'
// contiguous ones), attention over the group with the key/value heads repeated to the query heads.
add('CP2 ring', 'kv2', 2, 2, ['--cp', '2']);
add('CP2 Ulysses multi-query', 'kv1', 1, 2, ['--cp', '2', '--cp-mode', 'ulysses']);
add('CP2×DP2 ring ZeRO-1 recompute', 'kv2', 2, 4, ['--cp', '2', '--dp', '2', '--zero', '1', '--recompute']);
add('CP2×TP2 SP ring (kv heads split)', 'kv2', 2, 4, ['--cp', '2', '--tp', '2', '--sp']);
// The other pipeline schedules: interleaved 1F1B (rank 0 holds layers 0 and 2, rank 1 layers 1 and 3)
// and ZB-H1 (the projections' weight GEMMs deferred to the W pass).
add('PP2 interleaved (2 virtual stages), 4 layers, 2 micro-batches', 'l4', 2, 2, ['--pp', '2', '--virtual-stages', '2', '--micro-batches', '2']);
add('PP2 ZB-H1, 4 layers, 4 micro-batches', 'l4', 2, 2, ['--pp', '2', '--schedule', 'zb-h1', '--micro-batches', '4']);

const TOLERANCE = 1e-5;
const PARAM_TOLERANCE = 5e-5;

describe('parallel Llama equivalence (launcher + Gloo)', () => {
  it('the single-process references train', async () => {
    for (const ref of Object.values(refs)) expectReferenceTrains(await ref);
    // The tied model has one table fewer.
    const [untied, tied] = [await refs.kv2, await refs.tied];
    expect(untied.ranks[0]!.params.has('lmHead.weight')).toBe(true);
    expect(tied.ranks[0]!.params.has('lmHead.weight')).toBe(false);
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const { ref: refName, kv, run: pending } = layouts[name]!;
    const [ref, run] = await Promise.all([refs[refName], pending]);
    expect(run.code, run.output).toBe(0);
    const expected = ref.ranks[0]!;
    const scale = Math.max(...[...expected.params.values()].map(maxAbs));
    const held = new Set<string>();
    const tp = Math.max(...run.ranks.map((r) => r.coords.tp)) + 1;
    const isSplit = (n: string) => tensorParallelSlice(n, expected.params.get(n)!, expected.shapes.get(n)!, tp, 0, kv).length < expected.params.get(n)!.length;
    for (const r of run.ranks) {
      expect(relDiff(r.losses, expected.losses)).toBeLessThan(TOLERANCE);
      expect(relDiff(r.gradNorms, expected.gradNorms)).toBeLessThan(TOLERANCE);
      for (const [n, values] of r.params) {
        const want = expected.params.get(n);
        expect(want, `${n} on rank ${r.rank}`).toBeDefined();
        const slice = tensorParallelSlice(n, want!, expected.shapes.get(n)!, tp, r.coords.tp, kv);
        held.add(isSplit(n) ? `${n} [tp ${r.coords.tp}]` : n);
        expect(maxDiff(values, slice) / scale, `${n} on rank ${r.rank}`).toBeLessThan(PARAM_TOLERANCE);
        for (const other of run.ranks) {
          const copy = other.params.get(n);
          if (copy && (!isSplit(n) || other.coords.tp === r.coords.tp)) expect(maxDiff(values, copy), `${n}: rank ${r.rank} vs rank ${other.rank}`).toBe(0);
        }
      }
    }
    const wanted = [...expected.params.keys()].flatMap((n) => (isSplit(n) ? Array.from({ length: tp }, (_, t) => `${n} [tp ${t}]`) : [n]));
    expect([...held].sort()).toEqual(wanted.sort());
    expect(expected.paramChange).toBeGreaterThan(100 * PARAM_TOLERANCE);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('pipeline stages hold their own layers: the table first; the final norm and the untied head (or the tied table) last; interleaved chunks', async () => {
    for (const [name, lastExtra] of [['PP2 1F1B, 4 micro-batches, recompute', ['norm.weight', 'lmHead.weight']], ['PP2 GPipe, tied head, 2 micro-batches', ['embedTokens.weight', 'norm.weight']]] as const) {
      const run = await layouts[name]!.run;
      expect(run.code, run.output).toBe(0);
      const [first, last] = [...run.ranks].sort((a, b) => a.coords.pp - b.coords.pp).map((r) => [...r.params.keys()]);
      expect(first!.filter((n) => !/^layers\.[01]\./.test(n))).toEqual(['embedTokens.weight']);
      expect(last!.filter((n) => !n.startsWith('layers.2.'))).toEqual(lastExtra);
    }
    // Interleaved: each rank holds two non-adjacent model chunks.
    const interleaved = await layouts['PP2 interleaved (2 virtual stages), 4 layers, 2 micro-batches']!.run;
    expect(interleaved.code, interleaved.output).toBe(0);
    const layersOf = (r: Trained['ranks'][number]) => [...new Set([...r.params.keys()].map((n) => /^layers\.(\d+)\./.exec(n)?.[1]).filter((x) => x !== undefined))];
    const [first, last] = [...interleaved.ranks].sort((a, b) => a.coords.pp - b.coords.pp);
    expect(layersOf(first!)).toEqual(['0', '2']);
    expect(layersOf(last!)).toEqual(['1', '3']);
  }, QUEUED_TEST_TIMEOUT_MS);

  const bad = launchRun('bad-kv', 2, ['--kv', '3', '--tp', '2']);
  it('rejects key/value heads that do not divide the heads on every rank', async () => {
    const r = await bad;
    expect(r.code, r.output).not.toBe(0);
    expect(r.output).toMatch(/numKeyValueHeads \(3\) must divide numAttentionHeads \(4\)/);
  }, QUEUED_TEST_TIMEOUT_MS);
});
