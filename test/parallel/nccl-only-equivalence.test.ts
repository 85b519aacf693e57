// The layout-equivalence fixtures once more with NCCL-only groups (NODETRON_TEST_NCCL_ONLY): every
// group of every rank is an NcclBackend over the file-based fake NCCL (test/helpers/file-nccl.ts),
// filed under cpu, with no Gloo communicator — as `init({ backend: 'nccl' })` leaves a job on GPUs.
// Every collective of training then goes through the NCCL path (stream-ordered waits, group calls,
// send/recv pairs for uneven all-to-alls); the trainer's totals go through reduceTotals on each
// group's agreement device (test/distributed/totals.test.ts checks they go to cuda:0 where the group
// communicates there). A representative set of layouts, each dimension at least once: plain DP
// (bucketed all-reduce) with micro-batches, TP with SP and ZeRO 1, ZeRO 2 with micro-batches, ZeRO 3
// with recomputation, CP ring with ZeRO 1 and CP Ulysses with uneven ignored targets (token counts
// reduced), MoE under EP with DP and ZeRO 1 (dense and expert families) and EP with TP, and pipeline
// parallelism — 1F1B, GPipe, 1F1B×DP2, interleaved, ZB-H1 and ZB-V — whose untagged messages follow
// the round plan of lib/parallel/pipeline/messages.ts in NCCL group calls (each pair's in the same
// order on both sides). Each matches the single-process run as the Gloo suites check it. The full
// grids run NCCL-only too with NODETRON_TEST_NCCL_ONLY=<empty directory> set for gpt-equivalence /
// cp-equivalence / llama-equivalence / moe-equivalence.
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { equivalenceRunner, expectMatchesReference, root } from '../helpers/equivalence.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

const work = mkdtempSync(join(tmpdir(), 'nt-nccl-only-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Each run's communicators meet in a directory of their own, so the test sees that run's NCCL traffic. */
const fabric = (name: string) => join(work, 'fabric', name);
const ncclOnly = (name: string): NodeJS.ProcessEnv => {
  mkdirSync(fabric(name), { recursive: true });
  return { ...process.env, NODETRON_TEST_NCCL_ONLY: fabric(name) };
};
const gpt = equivalenceRunner({ script: join(root, 'test', 'fixtures', 'parallel', 'gpt-train.ts'), work, env: ncclOnly });
const moe = equivalenceRunner({ script: join(root, 'test', 'fixtures', 'parallel', 'moe-train.ts'), work, env: ncclOnly });

const refs = {
  gpt: gpt('single', 1, ['--reference']),
  gptIgnored: gpt('single-ignored', 1, ['--reference', '--ignore-targets']),
  // Interleaved and ZB-V layouts need pp × chunks <= layers: a 4-layer model and its own reference.
  gpt4: gpt('single4', 1, ['--reference', '--layers', '4']),
  moe: moe('moe-ref', 0, ['--reference']),
};
type Runner = typeof gpt;
/** A layout: its reference, the fixture's run (named for its output and fabric directories) and its result. */
const layout = (ref: keyof typeof refs, fixture: Runner, run: string, nproc: number, flags: string[], p2p = 0) => ({ ref, run, trained: fixture(run, nproc, flags), p2p });
// A pipeline layout's point-to-point messages over its 3 steps: an activation and its gradient per
// micro-batch and boundary between virtual stages on different ranks, in each pipeline group.
const messages = (o: { microBatches: number; crossings: number; pipelines?: number }) => 3 * 2 * o.microBatches * o.crossings * (o.pipelines ?? 1);
const layouts: Record<string, ReturnType<typeof layout>> = {
  'DP2, 2 micro-batches (bucketed all-reduce)': layout('gpt', gpt, 'dp2-m2', 2, ['--dp', '2', '--micro-batches', '2']),
  'TP2×DP2 SP ZeRO-1': layout('gpt', gpt, 'tp2-dp2-sp-zero1', 4, ['--tp', '2', '--dp', '2', '--sp', '--zero', '1']),
  'ZeRO-2 DP2, 2 micro-batches': layout('gpt', gpt, 'zero2-m2', 2, ['--zero', '2', '--micro-batches', '2']),
  'ZeRO-3 DP2, 2 micro-batches, recompute': layout('gpt', gpt, 'zero3-m2', 2, ['--zero', '3', '--micro-batches', '2', '--recompute']),
  'CP2×DP2 ring ZeRO-1': layout('gpt', gpt, 'cp2-dp2', 4, ['--cp', '2', '--dp', '2', '--zero', '1']),
  'CP2 Ulysses, uneven ignored targets': layout('gptIgnored', gpt, 'cp2-ulysses-ignored', 2, ['--cp', '2', '--cp-mode', 'ulysses', '--ignore-targets']),
  'MoE EP2×DP2 ZeRO 1 (dense and expert families sharded)': layout('moe', moe, 'ep2-dp2-zero1', 4, ['--ep', '2', '--dp', '4', '--zero', '1']),
  'MoE EP2 with TP2 attention': layout('moe', moe, 'ep2-tp2', 4, ['--ep', '2', '--tp', '2']),
  'PP2 1F1B, 4 micro-batches': layout('gpt', gpt, 'pp2-1f1b', 2, ['--pp', '2', '--micro-batches', '4', '--schedule', '1f1b'], messages({ microBatches: 4, crossings: 1 })),
  'PP2 GPipe, 2 micro-batches': layout('gpt', gpt, 'pp2-gpipe', 2, ['--pp', '2', '--micro-batches', '2', '--schedule', 'gpipe'], messages({ microBatches: 2, crossings: 1 })),
  'PP2×DP2 1F1B ZeRO-1, 2 micro-batches': layout('gpt', gpt, 'pp2-dp2', 4, ['--pp', '2', '--dp', '2', '--zero', '1', '--micro-batches', '2'], messages({ microBatches: 2, crossings: 1, pipelines: 2 })),
  'PP2 interleaved (2 virtual stages), 4 micro-batches': layout('gpt4', gpt, 'pp2-interleaved', 2, ['--layers', '4', '--pp', '2', '--virtual-stages', '2', '--schedule', 'interleaved', '--micro-batches', '4'], messages({ microBatches: 4, crossings: 3 })),
  'PP3 ZB-H1, 4 micro-batches (a middle stage)': layout('gpt', gpt, 'pp3-zb', 3, ['--pp', '3', '--schedule', 'zb-h1', '--micro-batches', '4'], messages({ microBatches: 4, crossings: 2 })),
  'PP2 ZB-V, 4 micro-batches': layout('gpt4', gpt, 'pp2-zbv', 2, ['--layers', '4', '--pp', '2', '--schedule', 'zb-v', '--micro-batches', '4'], messages({ microBatches: 4, crossings: 2 })),
};
// As the Gloo suites (gpt-equivalence.test.ts): losses and norms to f32 agreement of the whole vector;
// parameters after 3 AdamW steps at 5e-5 of the model's scale (Adam magnifies the rounding noise of
// near-zero gradients; the fake NCCL adds in float64 and rounds once, Gloo in f32, both within it).
const TOLERANCE = 1e-5, PARAM_TOLERANCE = 5e-5;

describe('layout equivalence with NCCL-only groups (fake NCCL, no Gloo)', () => {
  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const { ref: refName, run: runName, trained, p2p } = layouts[name]!;
    const [ref, run] = await Promise.all([refs[refName], trained]);
    expect(ref.code, ref.output).toBe(0);
    expect(run.code, run.output).toBe(0);
    expectMatchesReference(ref.ranks[0]!, run.ranks, TOLERANCE, PARAM_TOLERANCE);
    // The run's collectives went through the fake NCCL: a communicator per group met in its fabric
    // directory (the world and the mesh's groups), and they moved data (collective or p2p files).
    const comms = readdirSync(fabric(runName));
    expect(comms.length, 'NCCL communicators').toBeGreaterThanOrEqual(3);
    const traffic = comms.flatMap((c) => readdirSync(join(fabric(runName), c)).filter((f) => /^(c\d+|p\d+-\d+)\./.test(f)));
    // Pipeline layouts: every activation and gradient went through NCCL send/recv (one file each;
    // ZB-V's turn of the V on the last rank is handed over, not sent). Pure pipelines have few
    // collectives. (CP's ring and uneven all-to-alls send point to point too: not counted there.)
    if (p2p > 0) expect(traffic.filter((f) => f.startsWith('p')).length, 'NCCL point-to-point messages').toBe(p2p);
    expect(traffic.length, 'NCCL ops').toBeGreaterThan(p2p > 0 ? p2p : 50);
  }, QUEUED_TEST_TIMEOUT_MS);
});
