import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Native addons and child processes: forks isolate a crash to one file's worker.
    pool: 'forks',
    testTimeout: 60_000,
    env: { NODETRON_WARN_LEAKS: '0' },
    hookTimeout: 60_000,
  },
});
