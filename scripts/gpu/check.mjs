// One step of scripts/gpu/run.mjs, in its own process: node scripts/gpu/check.mjs <step id> <json file>.
// Runs the step's function from scripts/gpu/stages/<file>.mjs with a Recorder that rewrites <json file>
// after every check. Exits 0 when the step passed or was skipped (no GPU), 1 when a check failed. The
// step's function gets the reason nodetron cannot use a GPU, or null: "no GPU: ..." (none here) or
// "cuda unusable: ..." (a GPU the cuda addon cannot use: the steps with a PyTorch part run that part).
import { PLAN, Recorder, simulatedFate, unusableReason } from './common.mjs';

const [id, file] = [process.argv[2], process.argv[3]];
const step = PLAN.find((s) => s.id === id);
if (!step || !file) {
  console.error(`usage: check.mjs <step> <json file>; steps: ${PLAN.map((s) => s.id).join(', ')}`);
  process.exit(2);
}
const rec = new Recorder(file, id, step.phase);

// Test hook: NODETRON_GPU_RUN_SIMULATE="nccl:hang,gemm:crash" (before anything else, so it works without a GPU).
const sim = simulatedFate(id);
if (sim) {
  rec.check({ name: `simulated ${sim}: a check recorded before it`, ok: true });
  if (sim === 'hang') setInterval(() => {}, 1 << 30);
  else if (sim === 'crash') process.kill(process.pid, 'SIGSEGV');
  else if (sim === 'throw') throw new Error('simulated failure');
  else if (sim === 'fail') { rec.check({ name: 'simulated failing check', ok: false, error: 'simulated' }); process.exit(rec.finish() === 'failed' ? 1 : 0); }
} else {
  const mod = await import(`./stages/${step.file}.mjs`);
  let nt, reason = null;
  try {
    nt = await import('../../dist/index.js');
    if (!nt.cuda.isAvailable()) reason = unusableReason(nt.cuda.unavailableReason());
  } catch (e) {
    reason = unusableReason(`nodetron did not load (${String(e?.message ?? e).split('\n')[0]}; run \`npx tsc\` and the build first)`);
  }
  try {
    await mod[step.fn ?? 'run'](rec, nt, reason, { sections: step.sections, args: step.args ?? {}, work: process.env.NODETRON_GPU_RUN_WORK });
  } catch (e) {
    rec.check({ name: `${id} threw`, ok: false, error: String(e?.stack ?? e) });
  }
  // A step that ran no check and measured nothing passed nothing (benchmark steps record only rows).
  if (rec.data.status === 'running' && rec.data.checks.length === 0 && rec.data.bench.length === 0) rec.skip(reason ?? 'ran no checks and measured nothing');
  const status = rec.data.status === 'skipped' ? 'skipped' : rec.finish();
  process.exit(status === 'failed' ? 1 : 0);
}
