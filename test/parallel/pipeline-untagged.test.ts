// The untagged message plans of the pipeline schedules (lib/parallel/pipeline/messages.ts), which the
// runner follows on groups whose point-to-point has no tags (NCCL): for every schedule over a grid
// of shapes, each rank runs its table in order, every action's message is received in a batch before
// the action, each pair's k-th send and k-th receive are the same message, and under NCCL's stream
// model at its strictest (no message buffered: an operation completes only when its partner's batch
// runs) no plan deadlocks. The simulator is shown to find a deadlock (the per-action batching 1F1B
// runners use, on interleaved 1F1B) and a misordered pair. The runner itself runs these plans over the
// file-based fake NCCL in nccl-only-equivalence.test.ts.
import { describe, expect, it } from 'vitest';
import { scheduleTables, SCHEDULE_KINDS, schedulePlacement, type PipelineAction } from '../../lib/parallel/pipeline/schedules.js';
import { messageNeeded, messageSent, simulateUntagged, untaggedPlans, type MessageBatch, type MessageShape, type PipelineMessage } from '../../lib/parallel/pipeline/messages.js';

const batchesOf = (steps: ReturnType<typeof untaggedPlans>[number]): MessageBatch[] => steps.flatMap((s) => ('batch' in s ? [s.batch] : []));
const key = (m: PipelineMessage) => `${m.op}${m.micro}:${m.chunk}`;

function shapes(): { kind: (typeof SCHEDULE_KINDS)[number]; p: number; m: number; v: number }[] {
  const out = [];
  for (const kind of SCHEDULE_KINDS) {
    for (let p = 2; p <= 6; p++) {
      for (let m = 1; m <= 10; m++) {
        for (const v of kind === 'interleaved' ? [2, 3] : kind === 'zb-v' ? [2] : [1]) {
          if (kind === 'interleaved' && m % p !== 0) continue;
          out.push({ kind, p, m, v });
        }
      }
    }
  }
  return out;
}

describe('untagged pipeline message plans', () => {
  it('every schedule: actions in table order, each message received before its action, pairs in the same order, no deadlock', () => {
    let checked = 0;
    // Problems found, one line each (one expect at the end: hundreds of shapes are checked).
    const problems: string[] = [];
    const check = (ok: boolean, what: string) => { if (!ok) problems.push(what); };
    for (const { kind, p, m, v } of shapes()) {
      const what = `${kind} p${p} m${m} v${v}`;
      const tables = scheduleTables(kind, { stages: p, microBatches: m, chunks: v });
      const s: MessageShape = { stages: p, chunks: v, placement: schedulePlacement(kind) };
      const plans = untaggedPlans(tables, s);
      plans.forEach((steps, r) => {
        const received = new Set<string>();
        let next = 0, sent = 0;
        for (const step of steps) {
          if ('batch' in step) {
            for (const msg of step.batch.recvs) received.add(`${msg.peer}/${key(msg)}`);
            sent += step.batch.sends.length;
            continue;
          }
          check(step.action === next++, `${what}: rank ${r} runs action ${step.action} out of order`);
          const need = messageNeeded(tables[r]![step.action]!, r, s);
          if (need) check(received.has(`${need.peer}/${key(need)}`), `${what}: rank ${r} action ${step.action} runs before its message arrives`);
        }
        check(next === tables[r]!.length, `${what}: rank ${r} runs ${next} of ${tables[r]!.length} actions`);
        // Every message the table sends goes out in a batch (and only those).
        check(sent === tables[r]!.filter((a) => messageSent(a, r, s)).length, `${what}: rank ${r} sends ${sent} messages`);
      });
      const sim = simulateUntagged(plans.map(batchesOf));
      check(sim.stuck === null, `${what}: ${sim.stuck}`);
      checked++;
    }
    expect(problems).toEqual([]);
    expect(checked).toBeGreaterThan(200);
  });

  it('evaluation (forwardOnly: every rank runs every micro-batch through its chunks in order) cannot deadlock either', () => {
    for (let p = 2; p <= 4; p++) {
      for (let v = 1; v <= 3; v++) {
        for (let m = 1; m <= 4; m++) {
          const table: PipelineAction[] = [];
          for (let i = 0; i < m; i++) for (let c = 0; c < v; c++) table.push({ op: 'F', micro: i, chunk: c });
          const plans = untaggedPlans(Array.from({ length: p }, () => table), { stages: p, chunks: v, placement: 'loop' });
          expect(simulateUntagged(plans.map(batchesOf)).stuck, `p${p} v${v} m${m}`).toBeNull();
          // Every boundary between virtual stages is a message (loop placement: all cross ranks).
          expect(plans.flat().reduce((n, st) => n + ('batch' in st ? st.batch.sends.length : 0), 0)).toBe(m * (p * v - 1));
        }
      }
    }
  });

  it('the simulator finds a deadlock: each action\'s send batched with the next action\'s receives deadlocks interleaved 1F1B', () => {
    const p = 2, m = 4, v = 2;
    const tables = scheduleTables('interleaved', { stages: p, microBatches: m, chunks: v });
    const s: MessageShape = { stages: p, chunks: v, placement: 'loop' };
    // Receives from a peer in the order it sends them, each posted with the batch before its action.
    const perAction = tables.map((table, r) => {
      const order = new Map<number, string[]>();
      tables.forEach((t, q) => t.forEach((a: PipelineAction) => {
        const msg = messageSent(a, q, s);
        if (msg && msg.peer === r) order.set(q, [...(order.get(q) ?? []), key(msg)]);
      }));
      const posted = new Map<number, number>();
      const recvs = (a: PipelineAction | undefined): PipelineMessage[] => {
        const need = a && messageNeeded(a, r, s);
        if (!need) return [];
        const list = order.get(need.peer)!, from = posted.get(need.peer) ?? 0, at = list.indexOf(key(need));
        if (at < from) return [];
        posted.set(need.peer, at + 1);
        return list.slice(from, at + 1).map((k) => ({ peer: need.peer, op: k[0] as 'F' | 'B', micro: Number(k.slice(1).split(':')[0]), chunk: Number(k.split(':')[1]) }));
      };
      const out: MessageBatch[] = [{ sends: [], recvs: recvs(table[0]) }];
      table.forEach((a, i) => { const sent = messageSent(a, r, s); out.push({ sends: sent ? [sent] : [], recvs: recvs(table[i + 1]) }); });
      return out;
    });
    expect(simulateUntagged(perAction).stuck).toMatch(/^rank \d waits in batch \d+ of \d+$/);
  });

  it('the simulator finds a pair whose k-th send and k-th receive are different messages', () => {
    const tables = scheduleTables('gpipe', { stages: 2, microBatches: 2 });
    const plans = untaggedPlans(tables, { stages: 2, chunks: 1, placement: 'loop' }).map(batchesOf);
    // Rank 1's first two receives (F of micro-batches 0 and 1) swapped.
    const recvs = plans[1]!.flatMap((b, i) => b.recvs.map((msg) => ({ i, msg }))).filter((x) => x.msg.op === 'F');
    const [a, b] = recvs;
    const swapped = plans.map((bs, r) => bs.map((batch, i) => r !== 1 ? batch : {
      sends: batch.sends,
      recvs: batch.recvs.map((msg) => (i === a!.i && msg === a!.msg ? b!.msg : i === b!.i && msg === b!.msg ? a!.msg : msg)),
    }));
    expect(simulateUntagged(swapped).stuck).toMatch(/rank 0's message 0 to rank 1 is F0:0, but that rank receives F1:0 as it/);
  });
});
