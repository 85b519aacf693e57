// What a training run built, released by one path, last built first (lib/train/assembly.ts's set-up,
// lib/train/run.ts's close and in-job recovery's reshape).

/**
 * What set-up has built so far, released by one path, last built first: a set-up that fails after
 * building anything runs it, and so does TrainingRun.close (lib/train/run.ts). Every release runs even when one
 * throws; the first error is thrown after the rest.
 */
export class Teardown {
  #releases: Array<() => void | Promise<void>> = [];

  /** Registers a release (run before the ones registered earlier). */
  add(release: () => void | Promise<void>): void { this.#releases.push(release); }

  /** Runs every release once, last registered first. */
  async run(): Promise<void> {
    const releases = this.#releases.reverse();
    this.#releases = [];
    let failure: { error: unknown } | null = null;
    for (const release of releases) {
      try { await release(); } catch (e) { failure ??= { error: e }; }
    }
    if (failure) throw failure.error;
  }
}
