// nt.train.main: a training script's entry. It runs the script's main function and turns its outcome
// into the exit code, printing an ArgumentError (bad flags or options) on every rank as one line and
// leaving the job together when the ranks failed together.
import * as dist from '../distributed/init.js';
import { agreeMax } from '../distributed/agree.js';
import { ArgumentError } from '../errors.js';
import { destroyParallel, isParallelInitialized } from '../parallel/mesh.js';
import { collectiveErrors } from './options.js';

/**
 * Runs a training script's main function and sets the exit code: its return value (default 0); 2 for
 * an ArgumentError (bad flags or options), printed as `name: message` on every rank, which waits for
 * the others when they all failed together (so the launcher shows every rank's error) and leaves the
 * job; 1 for anything else (printed with its stack).
 */
export async function main(name: string, fn: () => Promise<number | void>): Promise<void> {
  try {
    process.exitCode = (await fn()) ?? 0;
  } catch (e) {
    if (!(e instanceof ArgumentError)) {
      console.error(e);
      process.exitCode = 1;
      // Leave the job, so the launcher sees this rank end: an open store connection or communicator
      // would keep the process alive (and its peers waiting) forever. At most 5 s for the goodbyes.
      setTimeout(() => process.exit(1), 5000).unref();
      try {
        if (isParallelInitialized()) destroyParallel();
        if (dist.isInitialized()) await Promise.race([dist.destroy(), new Promise((r) => setTimeout(r, 3000).unref())]);
      } catch { /* the first error is the one to report */ }
      return;
    }
    console.error(`${name}: ${e.message}`);
    if (dist.isInitialized()) {
      if (collectiveErrors.has(e)) {
        // Every rank failed at the same point: each has printed once all reach here.
        await Promise.race([agreeMax(dist.world(), [1]), new Promise((r) => setTimeout(r, 10_000).unref())]);
      }
      if (isParallelInitialized()) destroyParallel();
      await dist.destroy();
    }
    process.exitCode = 2;
  }
}
