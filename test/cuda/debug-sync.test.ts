// NODETRON_CUDA_SYNC=1 (docs/operations.md, "Errors"): the cuda addon synchronizes after every call that used a
// device, so an asynchronous fault is a typed error under the op that caused it. Without a GPU
// only the flag's parsing and the addon's reading of it are checked.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { cudaAddonLoadable, packageRoot } from '../../lib/native.js';
import { testingAddon } from '../../lib/testing/native.js';

describe('on/off environment flags (envFlag)', () => {
  it.each([
    ['1', true], ['true', true], ['TRUE', true], ['yes', true], ['on', true], ['On', true],
    ['0', false], ['', false], ['false', false], ['no', false], ['off', false], ['2', false], [' 1', false],
  ])('%j -> %s', (v, expected) => {
    expect(testingAddon().envFlag(v)).toBe(expected);
  });
  it('unset is off', () => {
    expect(testingAddon().envFlag(undefined)).toBe(false);
  });
});

const loadable = cudaAddonLoadable();
describe.skipIf(!loadable.ok)('the cuda addon reads NODETRON_CUDA_SYNC when it loads', () => {
  const debugSync = (value: string | undefined): string => {
    const env = { ...process.env };
    delete env.NODETRON_CUDA_SYNC;
    if (value !== undefined) env.NODETRON_CUDA_SYNC = value;
    const script = `import(${JSON.stringify(join(packageRoot, 'dist', 'native.js'))}).then((m) => console.log(m.cuda().debugSync()))`;
    const r = spawnSync(process.execPath, ['-e', script], { env, encoding: 'utf8', timeout: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    return r.stdout.trim();
  };
  it('on with 1, off when unset or 0', () => {
    expect(debugSync('1')).toBe('true');
    expect(debugSync(undefined)).toBe('false');
    expect(debugSync('0')).toBe('false');
  });
});

describe.skipIf(!loadable.ok)('the cuda addon reads NODETRON_CUDA_EPILOGUES and NODETRON_CUDA_VECTOR when it loads (both on by default)', () => {
  const switches = (vars: Record<string, string>): { sync: boolean; epilogues: boolean; vector: boolean } => {
    const env = { ...process.env };
    for (const k of ['NODETRON_CUDA_EPILOGUES', 'NODETRON_CUDA_VECTOR', 'NODETRON_CUDA_SYNC']) delete env[k];
    Object.assign(env, vars);
    const script = `import(${JSON.stringify(join(packageRoot, 'dist', 'native.js'))}).then((m) => console.log(JSON.stringify(m.cuda().switches())))`;
    const r = spawnSync(process.execPath, ['-e', script], { env, encoding: 'utf8', timeout: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    return JSON.parse(r.stdout.trim());
  };
  it('off with 0 (or false/no/off), on when unset or anything else', () => {
    expect(switches({})).toEqual({ sync: false, epilogues: true, vector: true });
    expect(switches({ NODETRON_CUDA_EPILOGUES: '0', NODETRON_CUDA_VECTOR: 'off' })).toEqual({ sync: false, epilogues: false, vector: false });
    for (const v of ['false', 'OFF', 'no']) expect(switches({ NODETRON_CUDA_EPILOGUES: v }).epilogues).toBe(false);
    expect(switches({ NODETRON_CUDA_EPILOGUES: '1', NODETRON_CUDA_VECTOR: 'yes' })).toEqual({ sync: false, epilogues: true, vector: true });
  });
  it('nt.info() reports the switches under backends.cuda', async () => {
    const nt = await import('../../lib/index.js');
    const { cuda } = await import('../../lib/native.js');
    expect(nt.info().backends.cuda.switches).toEqual(cuda().switches());
  });
});
