// `nodetron dashboard`: the data it reads from a metrics directory (a fixture of 4 ranks where rank 1
// computes 40% longer), the server's JSON and page (self-contained: nothing fetched from elsewhere),
// live updates as a job appends steps, and the page rendered by a real headless browser (Debian's
// chromium: the DOM names the slow rank, and a screenshot is taken). The browser test is skipped,
// saying so, when no chromium is installed (`apt-get install -y chromium`).
import { execFile, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { dashboardData, main as dashboardMain, startDashboard, type DashboardData, type DashboardServer } from '../../lib/cli/dashboard.js';
import { ArgumentError } from '../../lib/errors.js';
import type { StepMetrics } from '../../lib/observe/metrics.js';

const root = mkdtempSync(join(tmpdir(), 'nodetron-dashboard-test-'));
const dir = join(root, 'metrics');
const STEPS = 10, SLOW = 1;

function line(rank: number, step: number): StepMetrics {
  const cpu = 40 * (rank === SLOW ? 1.4 : 1) + (step % 3);
  return {
    step, rank, time: 1_700_000_000_000 + step * 100, stepMs: 100 + (step % 2), computeMs: 2 * cpu, cpuMs: cpu, loss: 5 - step * 0.1, tokens: 4096,
    tokensPerSec: 4096 / ((100 + (step % 2)) / 1000), allocatedBytes: (rank + 1) * 2 ** 20, peakBytes: (rank + 2) * 2 ** 20, rssBytes: (rank + 100) * 2 ** 20, device: 'cpu',
  };
}

beforeAll(() => {
  mkdirSync(dir, { recursive: true });
  for (let r = 0; r < 4; r++) writeFileSync(join(dir, `rank-${r}.metrics.jsonl`), Array.from({ length: STEPS }, (_, i) => JSON.stringify(line(r, i + 1))).join('\n') + '\n');
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('dashboard data', () => {
  it('reads every rank, the curves, the heat-map grid, the scores and memory', () => {
    const d = dashboardData(dir);
    expect(d.ranks).toEqual([0, 1, 2, 3]);
    expect(d.steps).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
    expect(d.loss[2]).toEqual([3, 5 - 0.3]);
    expect(d.throughput[0]![1]).toBeCloseTo(4096 / 0.101, 6);
    expect(d.stragglers.metric).toBe('cpuMs');
    expect(d.scoredLabel).toBe('compute CPU ms');
    expect(d.scoredMs[SLOW]![4]).toBe(line(SLOW, 5).cpuMs);
    expect(d.stepMs[3]![0]).toBe(101);
    expect(d.stragglers.stragglers).toEqual([SLOW]);
    expect(d.stragglers.ranks[SLOW]!.score).toBeCloseTo(1.4, 1);
    expect(d.memory.map((m) => m.peakBytes)).toEqual([2, 3, 4, 5].map((x) => x * 2 ** 20));
    expect(d.traceFiles).toBe(0);
  });

  it('gives empty series for a directory a job has not written to yet', () => {
    const d = dashboardData(join(root, 'not-yet'));
    expect(d.ranks).toEqual([]);
    expect(d.steps).toEqual([]);
    expect(d.stragglers.stragglers).toEqual([]);
  });
});

describe('dashboard server', () => {
  let server: DashboardServer;
  beforeAll(async () => { server = await startDashboard(dir, { port: 0 }); });
  afterAll(async () => { await server.close(); });

  it('serves the JSON and a self-contained page with the data embedded', async () => {
    const api = await fetch(new URL('api/data', server.url));
    expect(api.headers.get('content-type')).toBe('application/json');
    const d = (await api.json()) as DashboardData;
    expect(d.stragglers.stragglers).toEqual([SLOW]);
    expect(d.ranks).toEqual([0, 1, 2, 3]);
    const page = await (await fetch(server.url)).text();
    expect(page).toContain('<script id="data" type="application/json">');
    expect(page).toContain('"stragglers":[1]');
    // No external resource: the only URL is the SVG namespace.
    expect(page.match(/https?:\/\/[^\s'"]+/g)).toEqual(['http://www.w3.org/2000/svg']);
    expect((await fetch(new URL('nope', server.url))).status).toBe(404);
    expect((await fetch(server.url, { method: 'POST' })).status).toBe(405);
  });

  it('follows the directory as steps are appended (a torn last line is skipped)', async () => {
    const extra = join(root, 'live');
    mkdirSync(extra);
    const live = await startDashboard(extra, { port: 0 });
    try {
      const get = async () => (await (await fetch(new URL('api/data', live.url))).json()) as DashboardData;
      expect((await get()).steps).toEqual([]);
      appendFileSync(join(extra, 'rank-0.metrics.jsonl'), `${JSON.stringify(line(0, 1))}\n${JSON.stringify(line(0, 2)).slice(0, 20)}`);
      expect((await get()).steps).toEqual([1]);
      appendFileSync(join(extra, 'rank-0.metrics.jsonl'), `${JSON.stringify(line(0, 2)).slice(20)}\n`);
      expect((await get()).steps).toEqual([1, 2]);
    } finally {
      await live.close();
    }
  });

  it('rejects a port in use and bad options with ArgumentErrors', async () => {
    await expect(startDashboard(dir, { port: server.port })).rejects.toThrow(/in use/);
    await expect(dashboardMain([dir, '--port', 'x'])).rejects.toThrow(ArgumentError);
    await expect(dashboardMain([dir, '--bogus', '1'])).rejects.toThrow(/unknown option --bogus/);
  });

  it('the page script is valid JavaScript (checked without a browser too)', async () => {
    const page = await (await fetch(server.url)).text();
    const script = /<script>\n([\s\S]*?)<\/script>/.exec(page)![1]!;
    expect(() => new Function(script)).not.toThrow();
  });

  it('--html writes the page once', async () => {
    const file = join(root, 'page.html');
    const log = vi.spyOn(console, 'log').mockImplementation(() => {});
    try { expect(await dashboardMain([dir, '--html', file])).toBe(0); } finally { log.mockRestore(); }
    expect(readFileSync(file, 'utf8')).toContain('"stragglers":[1]');
  });
});

function findChromium(): string | undefined {
  for (const c of ['chromium', 'chromium-browser', 'google-chrome']) {
    const r = spawnSync('sh', ['-c', `command -v ${c}`], { encoding: 'utf8' });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  return undefined;
}
const chromium = findChromium();
if (!chromium) console.warn('[dashboard test] SKIPPED the headless-browser test: no chromium (apt-get install -y chromium)');

describe.skipIf(!chromium)('dashboard in a headless browser (chromium)', () => {
  let server: DashboardServer;
  beforeAll(async () => { server = await startDashboard(dir, { port: 0 }); });
  afterAll(async () => { await server.close(); });
  // Asynchronously: the server answers from this process.
  const browser = async (args: string[]) => (await promisify(execFile)(chromium!, ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
    `--user-data-dir=${mkdtempSync(join(root, 'chrome-'))}`, ...args], { encoding: 'utf8', timeout: 120_000, maxBuffer: 64 * 2 ** 20 })).stdout;

  it('renders the page: the DOM names the slow rank; a screenshot is taken', async () => {
    const dom = await browser(['--virtual-time-budget=3000', '--dump-dom', server.url]);
    expect(dom).toMatch(/<div id="verdict" class="bad" data-stragglers="1">Slowest: rank 1 \(score 1\.\d\d\)/);
    expect(dom).toMatch(/<tr class="straggler" id="score-rank-1">/);
    expect(dom.match(/class="straggler"/g)!.length).toBe(1);
    // The heat-map drew every rank × step cell, the curves their lines.
    expect(dom.match(/<rect [^>]*height=/g)!.length).toBeGreaterThanOrEqual(4 * STEPS);
    expect(dom.match(/<polyline /g)!.length).toBe(2);
    const png = join(root, 'dashboard.png');
    await browser(['--window-size=1280,900', `--screenshot=${png}`, server.url]);
    expect(existsSync(png)).toBe(true);
    const bytes = readFileSync(png);
    expect(bytes.subarray(1, 4).toString()).toBe('PNG');
    expect([bytes.readUInt32BE(16), bytes.readUInt32BE(20)]).toEqual([1280, 900]);
    expect(statSync(png).size).toBeGreaterThan(20_000);
  }, 300_000);
});
