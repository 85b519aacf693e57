#!/usr/bin/env node
// Keeps a device run's results in the repository: node scripts/gpu/keep.mjs <results.json>
// -> bench/results/<date>-<gpu>.json (a second run of the same day and GPU gets -2, -3, ...). The file
// must be a scripts/gpu/run.mjs results file; it is kept as it came back, whether its checks passed or not.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { root } from './common.mjs';

const src = process.argv[2];
if (!src) { console.error('usage: node scripts/gpu/keep.mjs <results.json from the device run>'); process.exit(2); }
let r;
try { r = JSON.parse(readFileSync(src, 'utf8')); } catch (e) { console.error(`keep.mjs: cannot read ${src}: ${e.message}`); process.exit(2); }
if (r?.kind !== 'nodetron-gpu-run' || !Array.isArray(r.steps)) { console.error(`keep.mjs: ${src} is not a device run's results.json (kind ${r?.kind})`); process.exit(2); }
const gpu = String(r.machine?.gpu ?? 'nogpu').replace(/^NVIDIA\s+/i, '').replace(/[^A-Za-z0-9]+/g, '-').replace(/^-|-$/g, '').toLowerCase() || 'gpu';
const dir = join(root, 'bench', 'results');
mkdirSync(dir, { recursive: true });
let dest = join(dir, `${r.date}-${gpu}.json`);
for (let k = 2; existsSync(dest); k++) dest = join(dir, `${r.date}-${gpu}-${k}.json`);
writeFileSync(dest, JSON.stringify(r, null, 2) + '\n');
const ok = r.checks.filter((c) => c.ok).length;
console.log(`kept ${dest}: ${r.machine?.gpu ?? 'no GPU'}, commit ${r.commit}, ${ok} of ${r.checks.length} checks passed`);
