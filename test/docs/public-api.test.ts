// The public face (`import * as nt from 'nodetron'`, lib/index.ts) holds a pinned number of values, at
// most 330. A public value is an own enumerable key of the module namespace object, where a key whose
// value is itself a module namespace (nt.nn, nt.parallel.tp, …) counts as the values it holds, recursively,
// and anything else (a class, a function, a constant) counts as one; types are not values and do not
// count. Adding or removing a value changes a pinned count: update it here on purpose. What the package's
// own commands and tests build on is nodetron/internal, disjoint from the public face; tsx, which runs
// `.ts` scripts under `nodetron launch`, is an optional peer, not a dependency.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import * as internal from '../../lib/internal.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** The ceiling of issue #38: the public face holds at most this many values. */
const MAX_PUBLIC_VALUES = 330;

/** Values per namespace ('' is the top level), each namespace's own values only (not its sub-namespaces'). */
const PINNED: Record<string, number> = {
  '': 105,
  cuda: 16,
  distributed: 45,
  nn: 40,
  'nn.init': 3,
  optim: 10,
  parallel: 14,
  'parallel.tp': 16,
  'parallel.pp': 10,
  'parallel.cp': 6,
  'parallel.ep': 3,
  'parallel.zero': 2,
  ckpt: 14,
  interop: 19,
  data: 10,
  train: 10,
};

const isNamespace = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && (v as Record<symbol, unknown>)[Symbol.toStringTag] === 'Module';

/** Every namespace of `ns` by its dotted path ('' for `ns` itself) with the names of its own values. */
function valuesByNamespace(ns: Record<string, unknown>, path = '', out: Record<string, string[]> = {}): Record<string, string[]> {
  out[path] = [];
  for (const key of Object.keys(ns)) {
    const v = ns[key];
    if (isNamespace(v)) valuesByNamespace(v, path ? `${path}.${key}` : key, out);
    else out[path]!.push(key);
  }
  return out;
}

/** Every function or object reachable from `ns` through its namespaces (primitives are left out: equal by value, not identity). */
function reachableObjects(ns: Record<string, unknown>, out = new Set<unknown>()): Set<unknown> {
  for (const v of Object.values(ns)) {
    if (isNamespace(v)) reachableObjects(v, out);
    else if ((typeof v === 'object' && v !== null) || typeof v === 'function') out.add(v);
  }
  return out;
}

describe('the public API', () => {
  const byNamespace = valuesByNamespace(nt as unknown as Record<string, unknown>);
  const total = Object.values(byNamespace).reduce((n, names) => n + names.length, 0);

  it(`holds at most ${MAX_PUBLIC_VALUES} values`, () => {
    expect(total).toBeLessThanOrEqual(MAX_PUBLIC_VALUES);
  });

  it('holds the pinned number of values in each namespace (update PINNED on purpose)', () => {
    expect(Object.keys(byNamespace).sort()).toEqual(Object.keys(PINNED).sort());
    for (const [path, names] of Object.entries(byNamespace)) {
      expect(names.length, `nt${path ? `.${path}` : ''} holds ${names.length} values: ${names.join(', ')}`).toBe(PINNED[path]);
    }
    expect(total).toBe(Object.values(PINNED).reduce((a, b) => a + b, 0));
  });

  it('gives nt.parallel one namespace per kind of parallelism', () => {
    for (const sub of ['tp', 'pp', 'cp', 'ep', 'zero']) expect(isNamespace((nt.parallel as Record<string, unknown>)[sub]), sub).toBe(true);
  });

  it('shares no value with nodetron/internal, and the planner is internal', () => {
    const pub = reachableObjects(nt as unknown as Record<string, unknown>);
    const shared = Object.entries(internal).filter(([, v]) => pub.has(v)).map(([k]) => k);
    expect(shared).toEqual([]);
    expect('plan' in nt).toBe(false);
    expect(isNamespace(internal.plan)).toBe(true);
    expect([...reachableObjects(internal.plan)].filter((v) => pub.has(v))).toEqual([]);
  });
});

describe('package.json', () => {
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as Record<string, Record<string, unknown> | undefined>;

  it('makes tsx an optional peer, not a dependency (the checkout keeps it as a dev dependency)', () => {
    expect(pkg.dependencies?.tsx).toBeUndefined();
    expect(pkg.peerDependencies?.tsx).toBeTypeOf('string');
    expect(pkg.peerDependenciesMeta?.tsx).toEqual({ optional: true });
    expect(pkg.devDependencies?.tsx).toBe(pkg.peerDependencies?.tsx);
  });

  it("exports './internal' from the compiled lib/internal.ts", () => {
    expect(pkg.exports?.['./internal']).toEqual({ types: './dist/internal.d.ts', import: './dist/internal.js' });
  });
});
