// Rank script of test/distributed/regroup.test.ts (argv[2] picks the case); prints what it observed as
// JSON lines: 'joined' once init returned, then the outcome with the time (Date.now()) it happened.
import * as dist from '../../lib/distributed/init.ts';
import { tensor } from '../../lib/creation.ts';
import { CommError } from '../../lib/errors.ts';
import { NotConnectedError } from '../../lib/distributed/pending.ts';

const mode = process.argv[2];
const report = (o) => console.log(JSON.stringify(o));
const describe = (e) => ({ name: e?.constructor?.name, code: e?.code, call: e?.call, comm: e instanceof CommError, message: String(e?.message) });

// A replacement (NODETRON_JOIN=1) whose peer never comes: init builds unconnected groups, regroup waits.
if (mode === 'join-never') {
  const { world } = await dist.init({ timeoutMs: 60_000 });
  try {
    await world.allReduce(tensor(new Float32Array(4), [4]));
    report({ pending: 'no error' });
  } catch (e) {
    report({ pending: describe(e), notConnected: e instanceof NotConnectedError });
  }
  report({ joined: true, at: Date.now() });
  const t0 = Date.now();
  try {
    await dist.regroup(Number(process.env.NODETRON_GENERATION));
    report({ regrouped: true, at: Date.now() });
  } catch (e) {
    report({ error: describe(e), at: Date.now(), ms: Date.now() - t0 });
  }
  process.exit(0);
}

// Check mode (NODETRON_COMM_CHECK=1) across a regroup: the sequence numbers restart at 0 in the new
// generation, where a different collective runs at #0 than in the old one.
if (mode === 'check') {
  const { world, rank } = await dist.init({ timeoutMs: 60_000 });
  const t = tensor(new Float32Array([rank + 1, 2, 3, 4]), [4]);
  await world.allReduce(t);
  await world.allReduce(t);
  await dist.regroup(1);
  const out = [];
  try {
    const b = tensor(new Float32Array([rank + 10]), [1]);
    await world.broadcast(b, { root: 0 });
    out.push(Array.from(b.toArraySync()));
    report({ ok: true, generation: dist.generation(), seq: world.seq, out });
  } catch (e) {
    report({ error: describe(e) });
  }
  await dist.destroy();
  process.exit(0);
}
throw new Error(`unknown mode ${mode}`);
