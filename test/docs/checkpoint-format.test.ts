// docs/checkpoint-format.md must name every field the code writes: a real checkpoint is saved (a model
// and its optimizer after one step, a loader, a schedule, a loss scaler, extra, a layout and a random
// generator, so every optional field is present), and every key of its manifest.json, of a rank's
// record and of a rank file's safetensors metadata, at every fixed place, must appear in a code span of
// the page. Keys that are names (tensor keys, parameter names, generator names, user state) are not fields.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const work = mkdtempSync(join(tmpdir(), 'nt-ckpt-doc-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Every identifier inside a `code span` of the page. */
function codeWords(text: string): Set<string> {
  const words = new Set<string>();
  for (const m of text.matchAll(/`([^`]+)`/g)) for (const w of m[1]!.match(/[A-Za-z_][A-Za-z0-9_]*/g) ?? []) words.add(w);
  return words;
}

/** The safetensors header's JSON, read by hand: 8-byte little-endian length, then the JSON. */
function safetensorsHeader(path: string): Record<string, unknown> {
  const bytes = readFileSync(path);
  const n = Number(bytes.readBigUInt64LE(0));
  return JSON.parse(bytes.subarray(8, 8 + n).toString('utf8')) as Record<string, unknown>;
}

type Obj = Record<string, unknown>;
const keys = (where: string, o: unknown): Array<[string, string]> => {
  expect(o, `${where} is an object`).toBeTypeOf('object');
  return Object.keys(o as Obj).map((k) => [where, k]);
};

describe('docs/checkpoint-format.md', () => {
  it('names every field of the manifest, the rank records and the rank files\' metadata', async () => {
    const model = new nt.nn.Linear(3, 4, { seed: 1 });
    const optimizer = new nt.optim.AdamW(model.parameters(), { lr: 1e-2 });
    {
      using x = nt.randn([2, 3], { seed: 2 });
      using y = model.forward(x);
      using loss = nt.sum(y);
      loss.backward();
      optimizer.step();
      optimizer.zeroGrad();
    }
    const stateful = (s: unknown) => ({ state: () => s, loadState: () => {} });
    const saved = await nt.ckpt.save(work, 3, {
      model, optimizer, loader: stateful({ position: 5 }), scheduler: stateful({ step: 3 }), scaler: new nt.GradScaler(),
      rng: { model: new nt.Generator(7) }, extra: { note: 'x' }, layout: { tp: 1 },
    });
    const m = JSON.parse(readFileSync(join(saved.dir, 'manifest.json'), 'utf8')) as Obj;
    const record = JSON.parse(readFileSync(join(saved.dir, 'rank-00000.json'), 'utf8')) as Obj;
    const header = safetensorsHeader(join(saved.dir, 'rank-00000.safetensors'));
    const tensors = m.tensors as Record<string, Obj>;
    const anyTensor = Object.values(tensors)[0]!;
    const rankRng = (m.ranks as Array<{ rng: Record<string, Obj> }>)[0]!.rng;
    const fields = [
      ...keys('manifest', m),
      ...keys('manifest.files[]', (m.files as Obj[])[0]),
      ...keys('manifest.tensors[key]', anyTensor),
      ...keys('manifest.tensors[key].parts[]', (anyTensor.parts as Obj[])[0]),
      ...keys('manifest.optimizer', m.optimizer),
      ...keys('manifest.state', m.state),
      ...keys('manifest.state.scaler', (m.state as Obj).scaler),
      ...keys('manifest.ranks[]', (m.ranks as Obj[])[0]),
      ...keys('manifest.ranks[].rng[name]', rankRng.model),
      ...keys('rank record', record),
      ...keys('rank record parts[]', (record.parts as Obj[])[0]),
      ...keys('rank record rng[name]', (record.rng as Record<string, Obj>).model),
      ...keys('rank file __metadata__', header.__metadata__),
    ];
    // Every optional field was written (the save above fills them all).
    expect(Object.keys(m.state as Obj).sort()).toEqual(['extra', 'loader', 'scaler', 'scheduler']);
    expect(Object.keys(tensors).some((k) => k.startsWith('optim/expAvg/'))).toBe(true);
    expect(fields.length).toBeGreaterThan(40);

    const doc = readFileSync(join(root, 'docs', 'checkpoint-format.md'), 'utf8');
    const words = codeWords(doc);
    expect(words.has('notAFieldOfTheFormat')).toBe(false);
    expect(fields.filter(([, k]) => !words.has(k)).map(([where, k]) => `${where}: ${k}`)).toEqual([]);
    // The fixed values a reader checks are written down as they are.
    expect(doc).toContain(`\`"${String(m.format)}"\``);
    expect(m.version).toBe(1);
    expect(doc).toContain(`# nodetron checkpoint format (version ${String(m.version)})`);
    expect(doc).toContain(`\`"${String((header.__metadata__ as Obj).format)}"\``);
    expect(Object.keys(header).filter((k) => k !== '__metadata__').every((k) => /^(model|optim)\/.+@\d+$/.test(k))).toBe(true);
  });
});
