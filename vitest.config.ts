import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

// Test files run NODETRON_TEST_WORKERS at a time (default: the core count, at least 2). Most files
// spend much of their time waiting on child processes, sockets and timers, so two files share two
// cores well (vitest's own default, cores - 1, runs them one at a time on a 2-core machine). Files
// whose assertions time processes against each other or against a wall-clock bound (stragglers; a
// failure surfacing within the collective timeout) run afterwards, one at a time.
const workers = Math.max(1, Number(process.env.NODETRON_TEST_WORKERS) || Math.max(2, availableParallelism()));
const SERIAL = ['test/launch/stragglers.test.ts', 'test/distributed/failures.test.ts'];

// The files that take longest (a quiet 2-core run: 30-90 s each, most launching many processes) start
// first. vitest orders files by its results cache (longest first), but a fresh clone has none and falls
// back to file size, which started the pack test and the 4-rank collectives last, running alone at the
// end. The rest keep vitest's order.
const LONG_FIRST = [
  'test/parallel/gpt-equivalence.test.ts', 'test/ckpt/sharded.test.ts', 'test/install/pack.test.ts', 'test/plan/calibration.test.ts',
  'test/cuda/gpu-run.test.ts', 'test/parallel/cp-equivalence.test.ts', 'test/launch/launch.test.ts', 'test/parallel/llama-equivalence.test.ts',
  'test/parallel/moe-equivalence.test.ts', 'test/distributed/collectives.test.ts', 'test/bench/checkpoint.test.ts', 'test/parallel/tp-gpt.test.ts',
  'test/launch/flight.test.ts', 'test/ops/simd.test.ts', 'test/distributed/bench-comm.test.ts', 'test/ckpt/moe.test.ts',
  'test/parallel/llama-moe-equivalence.test.ts',
];
class LongFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const rank = (f: TestSpecification) => {
      const i = LONG_FIRST.findIndex((p) => f.moduleId.endsWith(`/${p}`));
      return i < 0 ? LONG_FIRST.length : i;
    };
    // Stable: projects (groupOrder) stay apart, and within one the listed files come first.
    return sorted.map((f, i) => ({ f, i })).sort((a, b) => (a.f.project.config.sequence.groupOrder - b.f.project.config.sequence.groupOrder)
      || (rank(a.f) - rank(b.f)) || (a.i - b.i)).map(({ f }) => f);
  }
}

const shared = {
  // Native addons and child processes: forks isolate a crash to one file's worker.
  pool: 'forks' as const,
  // Generous: the suite must stay green on a loaded machine (two files at once, a busy loop on each core;
  // at a load average of 35 the 4-rank collectives test ran past runRanks' old 60 s limit).
  testTimeout: 180_000,
  hookTimeout: 180_000,
  // Launched processes run compiled code (test/helpers/node-script.ts) without source maps: parsing them
  // costs each process start about 0.04 CPU-s, some 5% of a multi-process file's CPU. The flight
  // recorder's test, which reads .ts names in stack traces, turns them on for its own processes; set
  // NODE_OPTIONS=--enable-source-maps to have them everywhere while debugging.
  env: { NODETRON_WARN_LEAKS: '0' },
  // Transpiles the rank fixtures once, so launched processes skip tsx (test/helpers/node-script.ts).
  globalSetup: ['test/helpers/global-setup.ts'],
};

export default defineConfig({
  test: {
    maxWorkers: workers,
    sequence: { sequencer: LongFirstSequencer },
    projects: [
      { test: { ...shared, name: 'parallel', include: ['test/**/*.test.ts'], exclude: SERIAL, maxWorkers: workers, sequence: { groupOrder: 0 } } },
      { test: { ...shared, name: 'serial', include: SERIAL, maxWorkers: 1, sequence: { groupOrder: 1 } } },
    ],
  },
});
