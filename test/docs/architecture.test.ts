// docs/architecture.md is the map of the repository: every path it names in backquotes must exist
// (a glob segment such as `*.ts` or `<family>` must match at least one file), so the map cannot
// drift from the tree. Also: no file the repository tracks points outside it.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Whether `pattern` (a repository path, possibly with `*` or `<name>` in its last segment) names something. */
function exists(pattern: string): boolean {
  const clean = pattern.replace(/\/$/, '');
  if (!/[*<]/.test(clean)) return existsSync(join(root, clean));
  const dir = dirname(clean), last = clean.slice(dir.length + 1);
  if (/[*<]/.test(dir) || !existsSync(join(root, dir)) || !statSync(join(root, dir)).isDirectory()) return false;
  const re = new RegExp(`^${last.split(/(\*|<[^>]+>)/).map((s) => (s === '*' || s.startsWith('<') ? '[^/]+' : s.replace(/[.+?^${}()|[\]\\]/g, '\\$&'))).join('')}$`);
  return readdirSync(join(root, dir)).some((e) => re.test(e));
}

describe('docs/architecture.md', () => {
  const text = readFileSync(join(root, 'docs', 'architecture.md'), 'utf8');
  const paths = [...text.matchAll(/`([^`\s]+)`/g)].map((m) => m[1]!)
    .filter((p) => /^(lib|native|scripts|test|examples|bench|docs|bin)\//.test(p) || /^[\w.-]+\.(json|txt|gyp|md)$/.test(p) && !p.startsWith('nodetron'));

  it('names many repository paths', () => {
    expect(paths.length).toBeGreaterThan(40);
  });

  it('names only paths that exist', () => {
    const missing = paths.filter((p) => !exists(p));
    expect(missing).toEqual([]);
  });

  it('is linked from the README', () => {
    expect(readFileSync(join(root, 'README.md'), 'utf8')).toContain('docs/architecture.md');
  });
});

describe('the repository speaks of itself only', () => {
  it('no tracked file names a path outside the repository', () => {
    let files: string[];
    try {
      files = execFileSync('git', ['ls-files'], { cwd: root, encoding: 'utf8' }).split('\n').filter(Boolean);
    } catch {
      throw new Error('git ls-files failed: this test needs a git checkout');
    }
    const outside = /\.\.\/shared|\bshared\/(gpu|DESIGN|STYLE)|\/work\/|DESIGN\.md|steering repository/;
    const offenders = files
      .filter((f) => !/\.(json|svg|lock)$/.test(f) && f !== 'test/docs/architecture.test.ts' && existsSync(join(root, f)))
      .filter((f) => outside.test(readFileSync(join(root, f), 'utf8')));
    expect(offenders).toEqual([]);
  });
});
