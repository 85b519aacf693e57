// One stage of scripts/gpu/run.mjs, in its own process: node scripts/gpu/stage.mjs <id> <json file>.
// Exits 0 when the stage passed or was skipped (no GPU), 1 when a check failed.
import { Recorder } from './common.mjs';

const [id, file] = [Number(process.argv[2]), process.argv[3]];
const NAMES = ['preflight', 'correctness', 'parallel', 'performance'];
const rec = new Recorder(file, id, NAMES[id]);

// Test hook: NODETRON_GPU_RUN_SIMULATE="1:hang,2:crash" (before anything else, so it works without a GPU).
const sim = (process.env.NODETRON_GPU_RUN_SIMULATE ?? '').split(',').map((p) => p.split(':')).find(([s]) => Number(s) === id)?.[1];
if (sim) {
  rec.check({ name: `simulated ${sim}: a check recorded before it`, ok: true });
  if (sim === 'hang') setInterval(() => {}, 1 << 30);
  else if (sim === 'crash') process.kill(process.pid, 'SIGSEGV');
  else if (sim === 'throw') throw new Error('simulated failure');
} else {
  const { run } = await import(`./stages/${NAMES[id]}.mjs`);
  let nt, reason = null;
  try {
    nt = await import('../../dist/index.js');
    if (!nt.cuda.isAvailable()) reason = `no GPU: ${nt.cuda.unavailableReason()}`;
  } catch (e) {
    reason = `no GPU: nodetron did not load (${String(e?.message ?? e).split('\n')[0]}; run \`npx tsc\` and the build first)`;
  }
  try {
    await run(rec, nt, reason);
  } catch (e) {
    rec.check({ name: `stage ${NAMES[id]} threw`, ok: false, error: String(e?.stack ?? e) });
  }
  const status = rec.data.status === 'skipped' ? 'skipped' : rec.finish();
  process.exit(status === 'failed' ? 1 : 0);
}
