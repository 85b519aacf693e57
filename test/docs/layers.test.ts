// lib/'s rooms and their layers. A room is a folder directly under lib/ (`ops`, `distributed`, ...) or a
// file directly in lib/ (`tensor.ts`, `index.ts`, ...). LAYERS lists them from the lowest layer to the
// highest; a file may import from its own room and from rooms of LOWER layers only: two rooms of one
// layer never import each other. Every import of every lib/**/*.ts is read with the TypeScript parser
// (static imports and re-exports, `import type`, dynamic `import()`, `import('…')` types, and
// `require()` of a relative path), and an upward or sideways import fails naming the file and the
// import. There is no list of exceptions: a room that must reach higher gets its code moved instead.
// docs/architecture.md states the same order (its "Layers of lib/" block is checked against LAYERS),
// and a cycle check over the room graph runs on its own, independent of the order.
// Files have one job each, and a file of lib/ stays under MAX_LINES lines: a longer one is split into
// files with one job each (a public entry re-exporting them where others import it).
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const libDir = join(root, 'lib');

/** lib/'s rooms from the lowest layer to the highest (folders without a slash, files with `.ts`). */
const LAYERS: readonly (readonly string[])[] = [
  ['errors.ts', 'kernel-codes.ts', 'elf.ts'],
  ['native.ts', 'dtype.ts', 'shape.ts', 'random.ts'],
  ['device.ts', 'version.ts'],
  ['memory.ts', 'info.ts'],
  ['tensor.ts'],
  ['creation.ts', 'cuda'],
  ['observe', 'io', 'cmdline', 'amp.ts'],
  ['autograd', 'distributed'],
  ['ops', 'data', 'launch', 'testing'],
  ['nn', 'optim'],
  ['parallel', 'interop', 'step.ts'],
  ['ckpt', 'plan'],
  ['train', 'cli'],
  ['index.ts', 'internal.ts'],
  ['bench'],
  ['cli.ts'],
];

/** The most lines a file of lib/ may have. */
const MAX_LINES = 600;

/**
 * Files of lib/ still over MAX_LINES while they are being split, each with its line count when listed:
 * it may shrink but not grow, and an entry whose file is back under the ceiling fails until it is
 * removed. This list must be emptied; nothing new goes on it.
 */
const OVER_MAX_LINES: ReadonlyMap<string, number> = new Map<string, number>([]);

const layerOf = new Map<string, number>(LAYERS.flatMap((rooms, i) => rooms.map((r) => [r, i] as const)));

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((e) => {
    const p = join(dir, e);
    return statSync(p).isDirectory() ? tsFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** The room of a path inside lib/. */
function roomOf(path: string): string {
  return relative(libDir, path).split(sep)[0]!;
}

interface Import { file: string; spec: string; line: number; dynamic: 'literal' | 'prefix' | 'computed' }

/** Every module a file names: static imports and re-exports, import() calls and types, require() calls. */
function importsOf(file: string): Import[] {
  const text = readFileSync(file, 'utf8');
  const src = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const out: Import[] = [];
  const add = (node: ts.Node, spec: string, dynamic: Import['dynamic'] = 'literal') =>
    out.push({ file: relative(root, file), spec, line: src.getLineAndCharacterOfPosition(node.getStart(src)).line + 1, dynamic });
  const visit = (node: ts.Node): void => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      add(node, node.moduleSpecifier.text);
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference) && ts.isStringLiteral(node.moduleReference.expression)) {
      add(node, node.moduleReference.expression.text);
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) {
      add(node, node.argument.literal.text);
    } else if (ts.isCallExpression(node) && (node.expression.kind === ts.SyntaxKind.ImportKeyword || (ts.isIdentifier(node.expression) && node.expression.text === 'require'))) {
      const arg = node.arguments[0];
      const isImport = node.expression.kind === ts.SyntaxKind.ImportKeyword;
      if (arg && ts.isStringLiteralLike(arg)) add(node, arg.text);
      else if (arg && ts.isTemplateExpression(arg)) add(node, arg.head.text, 'prefix');
      // require() with a computed path loads a native addon (.node), never a module of lib/.
      else if (isImport) add(node, arg ? arg.getText(src) : '', 'computed');
    }
    ts.forEachChild(node, visit);
  };
  visit(src);
  return out;
}

/** The room a relative import lands in (null for packages and node: modules). */
function targetRoom(imp: Import): string | null {
  if (!imp.spec.startsWith('.')) return null;
  const target = resolve(root, dirname(imp.file), imp.spec);
  if (!target.startsWith(libDir + sep)) return `outside lib/ (${relative(root, target)})`;
  const room = roomOf(target);
  // `./x.js` names lib/x.ts; a template's prefix names a folder.
  return room.endsWith('.js') ? room.replace(/\.js$/, '.ts') : room;
}

const files = tsFiles(libDir);
const imports = files.flatMap(importsOf);

describe("lib/'s layers", () => {
  it('reads the imports of every file of lib/', () => {
    expect(files.length).toBeGreaterThan(100);
    // The parser sees what a regular expression would miss: multi-line imports, `import type`, import() types.
    expect(imports.filter((i) => i.spec.startsWith('.')).length).toBeGreaterThan(500);
    expect(imports.some((i) => i.file === join('lib', 'observe', 'trace.ts') && i.spec === '../tensor.js')).toBe(true);
  });

  it('names every room of lib/ once in LAYERS', () => {
    const rooms = [...new Set(files.map(roomOf))].sort();
    const listed = LAYERS.flat();
    expect(listed.length).toBe(new Set(listed).size);
    expect([...listed].sort()).toEqual(rooms);
  });

  it('has no import whose room it cannot tell', () => {
    const unknown = imports.filter((i) => i.dynamic === 'computed' || (i.dynamic === 'prefix' && !i.spec.includes('/')));
    expect(unknown.map((i) => `${i.file}:${i.line} imports ${i.spec || '(nothing)'}`)).toEqual([]);
  });

  it('imports only downward: a room imports its own files and rooms of lower layers', () => {
    const wrong: string[] = [];
    for (const imp of imports) {
      const to = targetRoom(imp);
      if (to === null) continue;
      const from = roomOf(join(root, imp.file));
      if (to === from) continue;
      const a = layerOf.get(from), b = layerOf.get(to);
      if (a === undefined || b === undefined || b >= a) {
        const why = b === undefined ? `${to} is not a room of LAYERS` : b === a ? `${to} is in the same layer as ${from}` : `${to} is above ${from}`;
        wrong.push(`${imp.file}:${imp.line} imports ${imp.spec} (${why})`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it('has no cycle among rooms', () => {
    const graph = new Map<string, Set<string>>();
    for (const imp of imports) {
      const to = targetRoom(imp), from = roomOf(join(root, imp.file));
      if (to === null || to === from) continue;
      if (!graph.has(from)) graph.set(from, new Set());
      graph.get(from)!.add(to);
    }
    // Depth-first search; a room met again while on the stack closes a cycle.
    const cycles: string[] = [];
    const state = new Map<string, 'open' | 'done'>();
    const walk = (room: string, stack: string[]): void => {
      state.set(room, 'open');
      for (const next of graph.get(room) ?? []) {
        if (state.get(next) === 'open') cycles.push([...stack.slice(stack.indexOf(next)), room, next].join(' -> '));
        else if (!state.has(next)) walk(next, [...stack, room]);
      }
      state.set(room, 'done');
    };
    for (const room of [...graph.keys()].sort()) if (!state.has(room)) walk(room, []);
    expect(cycles).toEqual([]);
  });

  it(`keeps every file under ${MAX_LINES} lines (but the files still being split, which only shrink)`, () => {
    const wrong: string[] = [];
    const seen = new Set<string>();
    for (const file of files) {
      const name = relative(root, file).split(sep).join('/');
      const text = readFileSync(file, 'utf8');
      // Lines as an editor numbers them: a final newline ends the last line, it does not start another.
      const lines = text.length === 0 ? 0 : text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
      const listed = OVER_MAX_LINES.get(name);
      if (listed !== undefined) seen.add(name);
      if (listed === undefined && lines > MAX_LINES) wrong.push(`${name} has ${lines} lines (at most ${MAX_LINES}): split it into files with one job each`);
      else if (listed !== undefined && lines <= MAX_LINES) wrong.push(`${name} has ${lines} lines, under the ceiling: remove it from OVER_MAX_LINES`);
      else if (listed !== undefined && lines > listed) wrong.push(`${name} grew to ${lines} lines from the ${listed} it had when listed in OVER_MAX_LINES: it may only shrink`);
    }
    for (const name of OVER_MAX_LINES.keys()) if (!seen.has(name)) wrong.push(`${name} is listed in OVER_MAX_LINES but is not a file of lib/: remove it`);
    expect(wrong).toEqual([]);
  });

  it('docs/architecture.md states the same layers', () => {
    const text = readFileSync(join(root, 'docs', 'architecture.md'), 'utf8');
    const block = /### Layers of lib\/[\s\S]*?```\n([\s\S]*?)```/.exec(text);
    expect(block, 'docs/architecture.md has a "### Layers of lib/" section with a fenced block').not.toBeNull();
    // One line per layer, lowest first: `<n>  room room ...`, folders written `name/`.
    const stated = block![1]!.split('\n').filter((l) => /^\s*\d+\s/.test(l))
      .map((l) => l.trim().split(/\s+/).slice(1).map((r) => r.replace(/\/$/, '')));
    expect(stated).toEqual(LAYERS.map((l) => [...l]));
  });
});
