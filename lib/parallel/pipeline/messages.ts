// The point-to-point messages of a pipeline step and, for groups without message tags (NCCL), the
// order and batches in which each rank posts them. Untagged, a pair's messages match in issue order,
// so both sides must post them in the same order; and an NCCL send or receive holds the
// communication stream until its partner runs, so operations that wait on each other must share one
// group call. untaggedPlans lays the step out in rounds and gives every rank one batch per round in
// which it sends or receives (see there); simulateUntagged plays plans under that stream model (every
// operation waits for its partner, batches run one after the other on each rank) and finds any
// deadlock. (Posting, after each action, its send with the next action's receives, as 1F1B runners
// do, deadlocks interleaved 1F1B and ZB-V under that model; the rounds do not.)
import { StateError } from '../../errors.js';
import { rankOfVirtualStage, virtualStageOf, type ChunkPlacement } from './placement.js';
import type { PipelineAction } from './tables.js';

/** One message from the point of view of one side: the other rank, and the receiving action it feeds. */
export interface PipelineMessage {
  /** The other rank (the receiver of a send, the sender of a receive). */
  readonly peer: number;
  /** The receiving action: F (its input activation) or B (its output's gradient). */
  readonly op: 'F' | 'B';
  /** The micro-batch. */
  readonly micro: number;
  /** The receiving rank's chunk. */
  readonly chunk: number;
}

/** One batch of a rank's untagged plan: the sends and receives issued together (one NCCL group call). */
export interface MessageBatch {
  /** The sends (at most one: the message the rank's action of that round made). */
  readonly sends: PipelineMessage[];
  /** The receives (at most one per peer: the messages the peers sent this rank that round). */
  readonly recvs: PipelineMessage[];
}

/** The shape a plan is made for. */
export interface MessageShape {
  /** Pipeline ranks p. */
  stages: number;
  /** Model chunks per rank. */
  chunks: number;
  /** How chunks map to virtual stages. */
  placement: ChunkPlacement;
}

const keyOf = (m: Pick<PipelineMessage, 'op' | 'micro' | 'chunk'>): string => `${m.op}${m.micro}:${m.chunk}`;

/** The message action `a` of rank `rank` sends (null: none, or a hand-over between two chunks of the rank). */
export function messageSent(a: PipelineAction, rank: number, s: MessageShape): PipelineMessage | null {
  const V = s.stages * s.chunks, vs = virtualStageOf(rank, a.chunk, s.stages, s.placement);
  if (a.op === 'W' || (a.op === 'F' && vs === V - 1) || (a.op === 'B' && vs === 0)) return null;
  const to = rankOfVirtualStage(a.op === 'F' ? vs + 1 : vs - 1, s.stages, s.placement);
  return to.rank === rank ? null : { peer: to.rank, op: a.op, micro: a.micro, chunk: to.chunk };
}

/** The message action `a` of rank `rank` waits for (null: none, or a hand-over between two chunks of the rank). */
export function messageNeeded(a: PipelineAction, rank: number, s: MessageShape): PipelineMessage | null {
  const V = s.stages * s.chunks, vs = virtualStageOf(rank, a.chunk, s.stages, s.placement);
  if (a.op === 'W' || (a.op === 'F' && vs === 0) || (a.op === 'B' && vs === V - 1)) return null;
  const from = rankOfVirtualStage(a.op === 'F' ? vs - 1 : vs + 1, s.stages, s.placement);
  return from.rank === rank ? null : { peer: from.rank, op: a.op, micro: a.micro, chunk: a.chunk };
}

/** One step of a rank's untagged plan: run its table's next action, or issue a batch of messages. */
export type PlanStep = { readonly action: number } | { readonly batch: MessageBatch };

/**
 * Every rank's steps for untagged point-to-point (index = rank; see the file's comment). The step runs
 * in rounds: in round t each rank runs its next action if the messages it needs were sent in earlier
 * rounds (a schedule's tables always progress so); after round t every rank that sent or is sent a
 * message in round t issues one batch: its send of round t and its receives of the messages sent to
 * it in round t. Each batch's operations match the same round's batches of its peers, a rank sends at
 * most one message a round, and a rank's batches follow its rounds: so a pair's messages are posted in
 * the same order on both sides, and by induction over the rounds every batch completes, however long
 * the actions take. A receive is posted at the latest in the round its message is sent, its buffer held
 * until its action runs (as Gloo's receives posted ahead are).
 */
export function untaggedPlans(tables: readonly (readonly PipelineAction[])[], s: MessageShape): PlanStep[][] {
  const p = tables.length;
  const next = new Array<number>(p).fill(0);
  const sentIn = new Map<string, number>(); // `${receiver}/${key}` -> round
  const rounds: { rank: number; action: number; sent: PipelineMessage | null }[][] = [];
  let remaining = tables.reduce((n, t) => n + t.length, 0);
  for (let t = 0; remaining > 0; t++) {
    const round: { rank: number; action: number; sent: PipelineMessage | null }[] = [];
    for (let r = 0; r < p; r++) {
      const a = tables[r]![next[r]!];
      if (!a) continue;
      const need = messageNeeded(a, r, s);
      const at = need ? sentIn.get(`${r}/${keyOf(need)}`) : -1;
      if (at === undefined || at >= t) continue;
      round.push({ rank: r, action: next[r]!, sent: messageSent(a, r, s) });
      next[r]!++;
      remaining--;
    }
    if (round.length === 0) throw new StateError(`pipeline: the schedule's tables cannot progress (round ${t}: every rank waits for a message)`);
    for (const x of round) if (x.sent) sentIn.set(`${x.sent.peer}/${keyOf(x.sent)}`, t);
    rounds.push(round);
  }
  const plans: PlanStep[][] = tables.map(() => []);
  for (const round of rounds) {
    const sends = new Map<number, PipelineMessage[]>(), recvs = new Map<number, PipelineMessage[]>();
    for (const x of round) {
      plans[x.rank]!.push({ action: x.action });
      if (!x.sent) continue;
      sends.set(x.rank, [x.sent]);
      const list = recvs.get(x.sent.peer) ?? [];
      list.push({ ...x.sent, peer: x.rank });
      recvs.set(x.sent.peer, list);
    }
    for (let r = 0; r < p; r++) {
      const b = { sends: sends.get(r) ?? [], recvs: recvs.get(r) ?? [] };
      if (b.sends.length + b.recvs.length > 0) plans[r]!.push({ batch: b });
    }
  }
  return plans;
}

/**
 * Plays every rank's untagged plan under NCCL's stream model, at its strictest (no message buffered):
 * a rank's batches run one after the other; a send and the receive it matches (the k-th message from
 * one rank to another on both sides) complete together once both their batches run; a batch ends when
 * all its operations have. Returns the number of batches each rank finished: all of them unless the
 * plan deadlocks (then `stuck` names a rank and its waiting batch) or a pair's k-th send and k-th
 * receive are different messages (`stuck` says which).
 */
export function simulateUntagged(plans: readonly (readonly MessageBatch[])[]): { finished: number[]; stuck: string | null } {
  const p = plans.length;
  // For each op: its rank, batch and index among the pair's messages in its direction.
  interface Op { rank: number; batch: number; peer: number; send: boolean; k: number; key: string; done: boolean }
  const ops: Op[][][] = plans.map(() => []);
  const partner = new Map<string, Op>();
  const counter = new Map<string, number>();
  plans.forEach((batches, r) => batches.forEach((b, i) => {
    const list: Op[] = [];
    for (const [send, msgs] of [[true, b.sends], [false, b.recvs]] as const) {
      for (const m of msgs) {
        const dir = send ? `${r}>${m.peer}` : `${m.peer}>${r}`, ck = `${dir}/${send ? 's' : 'r'}`;
        const k = counter.get(ck) ?? 0;
        counter.set(ck, k + 1);
        const op: Op = { rank: r, batch: i, peer: m.peer, send, k, key: keyOf(m), done: false };
        list.push(op);
        partner.set(`${dir}#${k}/${send ? 's' : 'r'}`, op);
      }
    }
    ops[r]!.push(list);
  }));
  // Untagged matching pairs the k-th send with the k-th receive: they must be the same message.
  for (const [id, op] of partner) {
    if (!op.send) continue;
    const other = partner.get(id.replace(/\/s$/, '/r'));
    if (other && other.key !== op.key) return { finished: new Array<number>(p).fill(0), stuck: `rank ${op.rank}'s message ${op.k} to rank ${op.peer} is ${op.key}, but that rank receives ${other.key} as it` };
  }
  const at = new Array<number>(p).fill(0);
  for (let progress = true; progress;) {
    progress = false;
    for (let r = 0; r < p; r++) {
      if (at[r]! >= plans[r]!.length) continue;
      for (const op of ops[r]![at[r]!]!) {
        if (op.done) continue;
        const dir = op.send ? `${r}>${op.peer}` : `${op.peer}>${r}`;
        const other = partner.get(`${dir}#${op.k}/${op.send ? 'r' : 's'}`);
        if (other && at[other.rank] === other.batch) { op.done = other.done = true; progress = true; }
      }
      while (at[r]! < plans[r]!.length && ops[r]![at[r]!]!.every((o) => o.done)) { at[r]!++; progress = true; }
    }
  }
  const r = at.findIndex((a, i) => a < plans[i]!.length);
  return { finished: at, stuck: r < 0 ? null : `rank ${r} waits in batch ${at[r]} of ${plans[r]!.length}` };
}
