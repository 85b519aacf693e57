// Committing a save, and what a crash mid-save or mid-prune leaves behind. Rank 0 waits for every
// rank's record, checks that the parts tile every tensor exactly once, writes the manifest last and
// renames the temporary directory into place; pruning removes a manifest before anything else; and
// recovery puts back a step's previous copy that a crash left aside.
import { existsSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { StateError, TimeoutError } from '../errors.js';
import { fsyncDir, writeAll, writeFileAtomically } from '../io/files.js';
import { coverageProblem, partIntervals } from './intervals.js';
import { listCheckpoints, MANIFEST, rankRecordName, stepDirName, type Manifest, type ManifestTensor, type RankRecord } from './format.js';

/**
 * Puts back a step's previous copy that a save moved aside (`.old-step-N-*`) when a crash came before
 * the new copy was renamed into place, so the step is not lost. Run by one rank only.
 */
export function recoverAsideCopies(root: string): void {
  if (!existsSync(root)) return;
  for (const name of readdirSync(root)) {
    // A pruned step whose deletion a crash interrupted.
    if (name.startsWith('.deleted-step-')) { rmSync(join(root, name), { recursive: true, force: true }); continue; }
    const m = /^\.old-(step-\d+)-/.exec(name);
    if (!m || existsSync(join(root, m[1]!)) || !existsSync(join(root, name, MANIFEST))) continue;
    try { renameSync(join(root, name), join(root, m[1]!)); } catch { /* another process got there first */ }
  }
}

/** Writes JSON to `${path}.tmp`, fsyncs it and renames it into place: readers see all of it or none. */
export function writeJsonDurably(path: string, value: unknown): void {
  writeFileAtomically(path, (fd) => writeAll(fd, Buffer.from(JSON.stringify(value)), 0), { tmp: `${path}.tmp` });
}

/** Rank 0: waits for every rank's record of this save, checks coverage, writes the manifest last, renames. */
export async function commit(root: string, tmp: string, dir: string,
  o: { step: number; saveId: string; worldSize: number; common: Pick<Manifest, 'optimizer' | 'state' | 'layout'>; timeoutMs: number; abandoned?: () => string | null }): Promise<void> {
  const records: RankRecord[] = [];
  const deadline = Date.now() + o.timeoutMs;
  for (let r = 0; r < o.worldSize; r++) {
    const path = join(tmp, rankRecordName(r));
    for (;;) {
      let rec: RankRecord | null = null;
      try { rec = JSON.parse(readFileSync(path, 'utf8')) as RankRecord; } catch { rec = null; }
      if (rec && rec.saveId === o.saveId) { records.push(rec); break; }
      const why = o.abandoned?.();
      if (why) throw new StateError(`checkpoint save of step ${o.step} abandoned (${why}); it stays incomplete in ${tmp}`);
      if (Date.now() > deadline) throw new TimeoutError(`checkpoint save of step ${o.step}: rank ${r} did not finish writing within ${o.timeoutMs} ms; the checkpoint stays incomplete in ${tmp}`, 'checkpoint');
      await new Promise((res) => setTimeout(res, 20));
    }
  }
  const tensors: Record<string, ManifestTensor> = {};
  const steps: Record<string, number> = {};
  for (const rec of records) {
    Object.assign(steps, rec.steps);
    for (const p of rec.parts) {
      const t = (tensors[p.key] ??= { shape: p.shape, dtype: p.dtype, parts: [] });
      if (t.shape.join() !== p.shape.join() || t.dtype !== p.dtype) {
        throw new StateError(`checkpoint save of step ${o.step}: ranks disagree on '${p.key}' ([${t.shape}] ${t.dtype} vs [${p.shape}] ${p.dtype})`);
      }
      t.parts.push({ file: rec.file, name: p.name, split: p.split, start: p.start, count: p.count });
    }
  }
  for (const [key, t] of Object.entries(tensors)) {
    const size = t.shape.reduce((a, b) => a * b, 1);
    const problem = coverageProblem(size, t.parts.flatMap((p) => partIntervals(t.shape, p)));
    if (problem) throw new StateError(`checkpoint save of step ${o.step}: the ranks' parts of '${key}' do not tile it: ${problem}`);
  }
  const manifest: Manifest = {
    format: 'nodetron-checkpoint', version: 1, step: o.step, saveId: o.saveId, worldSize: o.worldSize, createdAt: new Date().toISOString(),
    layout: o.common.layout,
    files: records.map((r) => ({ file: r.file, size: r.size, crc32: r.crc32 })),
    tensors,
    optimizer: { groups: o.common.optimizer.groups, steps },
    state: o.common.state,
    ranks: records.map((r) => ({ rng: r.rng })),
  };
  writeJsonDurably(join(tmp, MANIFEST), manifest);
  fsyncDir(tmp);
  // Saving a step again: the old copy goes aside first, so a crash never leaves the step without one.
  const old = existsSync(dir) ? join(root, `.old-${stepDirName(o.step)}-${o.saveId}`) : null;
  if (old) renameSync(dir, old);
  renameSync(tmp, dir);
  fsyncDir(root);
  if (old) rmSync(old, { recursive: true, force: true });
  // Leftovers of earlier saves that never completed (a crash mid-save) go once a later one is whole.
  for (const name of readdirSync(root)) {
    const m = /^\.(tmp|old)-step-(\d+)/.exec(name);
    if (m && Number(m[2]) <= o.step && join(root, name) !== tmp) rmSync(join(root, name), { recursive: true, force: true });
  }
}

/**
 * Keeps the checkpoint just committed and the keep - 1 newest before it. Newer steps (from a run
 * that was resumed from an older checkpoint) are left alone. The manifest goes first, so a pruned
 * directory never looks complete half-way; the directory is then renamed to `.deleted-step-N-*` and
 * returned for the caller to delete (a crash before that leaves it for recoverAsideCopies to remove).
 */
export function prune(root: string, keep: number, committed: number): string[] {
  const doomed: string[] = [];
  for (const { dir, step } of listCheckpoints(root).filter((c) => c.step < committed).slice(keep - 1)) {
    rmSync(join(dir, MANIFEST), { force: true });
    const aside = join(root, `.deleted-${stepDirName(step)}-${process.pid}-${Date.now().toString(36)}`);
    try { renameSync(dir, aside); doomed.push(aside); } catch { rmSync(dir, { recursive: true, force: true }); }
  }
  return doomed;
}
