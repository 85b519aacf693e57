import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

// Test files run NODETRON_TEST_WORKERS at a time (default: the core count, at least 2). Most files
// spend much of their time waiting on child processes, sockets and timers, so two files share two
// cores well (vitest's own default, cores - 1, runs them one at a time on a 2-core machine). Files
// whose assertions time processes against each other or against a wall-clock bound (stragglers; a
// failure surfacing within the collective timeout) run afterwards, one at a time.
const workers = Math.max(1, Number(process.env.NODETRON_TEST_WORKERS) || Math.max(2, availableParallelism()));
const SERIAL = ['test/launch/stragglers.test.ts', 'test/distributed/failures.test.ts'];

const shared = {
  // Native addons and child processes: forks isolate a crash to one file's worker.
  pool: 'forks' as const,
  // Generous: the suite must stay green on a loaded machine (two files at once, a busy loop on each core;
  // at a load average of 35 the 4-rank collectives test ran past runRanks' old 60 s limit).
  testTimeout: 180_000,
  hookTimeout: 180_000,
  env: { NODETRON_WARN_LEAKS: '0' },
  // Transpiles the rank fixtures once, so launched processes skip tsx (test/helpers/node-script.ts).
  globalSetup: ['test/helpers/global-setup.ts'],
};

export default defineConfig({
  test: {
    maxWorkers: workers,
    projects: [
      { test: { ...shared, name: 'parallel', include: ['test/**/*.test.ts'], exclude: SERIAL, maxWorkers: workers, sequence: { groupOrder: 0 } } },
      { test: { ...shared, name: 'serial', include: SERIAL, maxWorkers: 1, sequence: { groupOrder: 1 } } },
    ],
  },
});
