// `nodetron dashboard [DIR] [--port P]`: a small web page over the per-step metrics a job writes
// (NODETRON_TRACE=DIR or NODETRON_METRICS=DIR; lib/observe/metrics.ts), live while the job runs
// (the page polls) or afterwards: loss and throughput curves, a rank × step heat-map of compute time
// with the slowest ranks named by their straggler score, memory per rank. node:http only; the page
// is one self-contained HTML document (inline script and SVG, nothing fetched from elsewhere) that
// renders from the data embedded in it, then refreshes from /api/data.
import { createServer, type Server } from 'node:http';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { ArgumentError, UsageError } from '../errors.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';
import { METRIC_LABEL, readMetrics, stragglerScores, type StepMetrics, type StragglerMetric, type StragglerReport } from '../observe/metrics.js';

/** What the page shows (also the JSON of /api/data). */
export interface DashboardData {
  /** The directory read. */
  dir: string;
  /** When the data was read (ms since the epoch). */
  readAt: number;
  /** Ranks with metrics, ascending. */
  ranks: number[];
  /** Steps present on some rank, ascending. */
  steps: number[];
  /** Loss per step (the first rank's record; the loss is the global batch's, the same on every rank). */
  loss: Array<[number, number]>;
  /** Global tokens per second per step (the first rank's record). */
  throughput: Array<[number, number]>;
  /** The scored time (ms; `stragglers.metric`) per rank (rows, in `ranks` order) and step (columns, in `steps` order); null where missing. */
  scoredMs: Array<Array<number | null>>;
  /** How the scored time is named. */
  scoredLabel: string;
  /** Step time (ms), the same layout. */
  stepMs: Array<Array<number | null>>;
  /** Straggler scores of the ranks. */
  stragglers: StragglerReport;
  /** Per rank, its latest memory: device bytes allocated and peak, process RSS. */
  memory: Array<{ rank: number; device: string; allocatedBytes: number; peakBytes: number; rssBytes: number }>;
  /** Per-rank trace files present (written at each rank's exit). */
  traceFiles: number;
}

/** Reads `dir` into what the dashboard shows; a directory without metrics yet gives empty series. */
export function dashboardData(dir: string, opts: { threshold?: number; skip?: number } = {}): DashboardData {
  const metrics = existsSync(dir) ? readMetrics(dir) : new Map<number, StepMetrics[]>();
  const ranks = [...metrics.keys()];
  const stepSet = new Set<number>();
  for (const rows of metrics.values()) for (const r of rows) stepSet.add(r.step);
  const steps = [...stepSet].sort((a, b) => a - b);
  const col = new Map(steps.map((s, i) => [s, i]));
  const grid = (key: StragglerMetric) => ranks.map((rank) => {
    const row: Array<number | null> = steps.map(() => null);
    for (const r of metrics.get(rank)!) row[col.get(r.step)!] = r[key];
    return row;
  });
  const first = ranks.length > 0 ? metrics.get(ranks[0]!)! : [];
  const memory = ranks.flatMap((rank) => {
    const last = metrics.get(rank)!.at(-1);
    return last ? [{ rank, device: last.device, allocatedBytes: last.allocatedBytes, peakBytes: last.peakBytes, rssBytes: last.rssBytes }] : [];
  });
  const stragglers = stragglerScores(metrics, opts);
  const traceFiles = existsSync(dir) ? readdirSync(dir).filter((f) => /^rank-\d+\.trace\.json$/.test(f)).length : 0;
  return {
    dir: resolve(dir), readAt: Date.now(), ranks, steps,
    loss: first.map((r) => [r.step, r.loss]), throughput: first.map((r) => [r.step, r.tokensPerSec]),
    scoredMs: grid(stragglers.metric), scoredLabel: METRIC_LABEL[stragglers.metric].replace('median ', ''), stepMs: grid('stepMs'), stragglers, memory, traceFiles,
  };
}

/** The page, with `data` embedded so it renders without a request (and as a saved file). */
export function dashboardHtml(data: DashboardData, opts: { live?: boolean } = {}): string {
  // JSON inside <script>: '<' escaped so no '</script>' can close it early.
  const embedded = JSON.stringify(data).replace(/</g, '\\u003c');
  return PAGE.replace('__DATA__', embedded).replace('__LIVE__', opts.live ? 'true' : 'false');
}

/** A running dashboard server. */
export interface DashboardServer {
  /** Where the page is served (http://host:port/). */
  url: string;
  /** The port (the one chosen when 0 was asked). */
  port: number;
  /** Stops the server. */
  close(): Promise<void>;
}

/** Serves the page on `/` and the data on `/api/data`, read from `dir` at each request. */
export async function startDashboard(dir: string, opts: { port?: number; host?: string; threshold?: number; skip?: number } = {}): Promise<DashboardServer> {
  const host = opts.host ?? '127.0.0.1', port = opts.port ?? 8050;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ArgumentError(`dashboard: port must be an integer in [0, 65535], got ${port}`);
  const scoring = { ...(opts.threshold !== undefined ? { threshold: opts.threshold } : {}), ...(opts.skip !== undefined ? { skip: opts.skip } : {}) };
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    try {
      if (req.method !== 'GET') { res.writeHead(405, { allow: 'GET' }).end('only GET\n'); return; }
      if (path === '/api/data') {
        res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(dashboardData(dir, scoring)));
      } else if (path === '/' || path === '/index.html') {
        res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' }).end(dashboardHtml(dashboardData(dir, scoring), { live: true }));
      } else {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found (the page is at /, its data at /api/data)\n');
      }
    } catch (e) {
      res.writeHead(500, { 'content-type': 'text/plain' }).end(`${(e as Error).message}\n`);
    }
  });
  await new Promise<void>((ok, fail) => {
    server.once('error', (e: NodeJS.ErrnoException) => fail(e.code === 'EADDRINUSE' ? new ArgumentError(`dashboard: port ${port} is in use (choose another with --port, or 0 for any)`) : e));
    server.listen(port, host, () => ok());
  });
  const actual = (server.address() as AddressInfo).port;
  return {
    url: `http://${host.includes(':') ? `[${host}]` : host}:${actual}/`,
    port: actual,
    close: () => new Promise<void>((ok) => { server.closeAllConnections(); server.close(() => ok()); }),
  };
}

const usage = `usage: nodetron dashboard [DIR] [--port P (8050; 0: any)] [--host H (127.0.0.1)] [--threshold X (1.15)] [--skip N (1)]
                          [--html FILE]
  serves a page over the per-step metrics of a job run with NODETRON_TRACE=DIR or NODETRON_METRICS=DIR (DIR defaults
  to those variables): loss and throughput, a rank × step heat-map of compute time naming the slowest ranks (straggler
  score: the median over steps of a rank's compute time over the step's median rank; named at X and above), memory
  per rank. It reads DIR at every refresh, so it can run beside the job. --html FILE writes the page once,
  self-contained, and exits.`;

/** Runs `nodetron dashboard`; returns the exit code once the server is stopped (SIGINT/SIGTERM). */
export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    port: { kind: 'count', max: 65535 }, host: 'string', threshold: { kind: 'number', min: 1 }, skip: 'count', html: 'outfile', help: 'boolean',
  }, { h: 'help' });
  if (o.help) { console.log(usage); return 0; }
  let [dir] = expectPositionals(o, 'the metrics directory DIR', 0, 1) as [string | undefined];
  const port = (o.port as number | undefined) ?? 8050, host = (o.host as string | undefined) ?? '127.0.0.1', html = o.html as string | undefined;
  const scoring: { threshold?: number; skip?: number } = {};
  if (o.threshold !== undefined) scoring.threshold = o.threshold as number;
  if (o.skip !== undefined) scoring.skip = o.skip as number;
  dir ??= process.env.NODETRON_METRICS || process.env.NODETRON_TRACE;
  if (!dir) throw new UsageError('no directory given (and neither NODETRON_METRICS nor NODETRON_TRACE is set)');
  if (html) {
    writeFileSync(html, dashboardHtml(dashboardData(dir, scoring)));
    console.log(`${html}: the dashboard of ${resolve(dir)}`);
    return 0;
  }
  const server = await startDashboard(dir, { port, host, ...scoring });
  console.log(`nodetron dashboard: ${server.url} (reading ${resolve(dir)}; Ctrl-C stops)`);
  await new Promise<void>((ok) => {
    const stop = () => { process.off('SIGINT', stop); process.off('SIGTERM', stop); ok(); };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  await server.close();
  return 0;
}

// The page: renders DATA (embedded), then, when LIVE, polls /api/data every 2 s.
const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>nodetron dashboard</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px 24px; color: #1d2330; background: #f6f7f9; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 0 0 8px; }
.sub { color: #5b6475; margin-bottom: 14px; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.card { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 12px 14px; }
.wide { grid-column: 1 / 3; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; white-space: nowrap; } th { color: #5b6475; font-weight: 600; }
tr.straggler td { color: #b3261e; font-weight: 700; }
#verdict { font-size: 15px; margin: 4px 0 10px; } #verdict.bad { color: #b3261e; } #verdict.good { color: #1e7b34; }
svg { width: 100%; height: auto; display: block; }
svg text { font: 11px system-ui, sans-serif; fill: #5b6475; }
</style></head>
<body>
<h1>nodetron dashboard</h1>
<div class="sub" id="sub"></div>
<div class="grid">
  <div class="card"><h2>Loss</h2><svg id="loss" width="560" height="220"></svg></div>
  <div class="card"><h2>Throughput (global tokens/s)</h2><svg id="tput" width="560" height="220"></svg></div>
  <div class="card wide"><h2 id="heat-title">Compute time per rank and step</h2>
    <div id="verdict"></div><svg id="heat" width="1160" height="200"></svg></div>
  <div class="card"><h2>Straggler scores</h2><table id="scores"></table></div>
  <div class="card"><h2>Memory per rank (latest step)</h2><svg id="mem" width="560" height="200"></svg></div>
</div>
<script id="data" type="application/json">__DATA__</script>
<script>
const LIVE = __LIVE__;
const NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
function size(svg, h) { const w = +svg.getAttribute('width'); svg.setAttribute('height', h); svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h); }
function fmt(v) { return Math.abs(v) >= 1000 ? Math.round(v).toLocaleString('en') : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3); }
function mib(b) { return (b / 1048576).toFixed(1); }
function lineChart(svg, points, color) {
  clear(svg);
  const W = +svg.getAttribute('width'), H = +svg.getAttribute('height'), L = 56, R = 10, T = 10, B = 26;
  size(svg, H);
  if (points.length === 0) { el('text', { x: L, y: H / 2 }, svg, 'no steps yet'); return; }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  el('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: '#aab' }, svg);
  el('line', { x1: L, y1: T, x2: L, y2: H - B, stroke: '#aab' }, svg);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    el('text', { x: L - 6, y: Y(y) + 4, 'text-anchor': 'end' }, svg, fmt(y));
    el('line', { x1: L, y1: Y(y), x2: W - R, y2: Y(y), stroke: '#eef0f3' }, svg);
  }
  el('text', { x: L, y: H - 8 }, svg, 'step ' + x0);
  el('text', { x: W - R, y: H - 8, 'text-anchor': 'end' }, svg, 'step ' + x1);
  el('polyline', { points: points.map((p) => X(p[0]) + ',' + Y(p[1])).join(' '), fill: 'none', stroke: color, 'stroke-width': 2 }, svg);
}
function heatColor(ratio) {
  // 1.0 (the step's median) white; slower towards red, faster towards blue.
  const t = Math.max(-1, Math.min(1, ratio >= 1 ? (ratio - 1) / 0.5 : (ratio - 1) / 0.3));
  const c = (a, b) => Math.round(a + (b - a) * Math.abs(t));
  return t >= 0 ? 'rgb(255,' + c(255, 60) + ',' + c(255, 50) + ')' : 'rgb(' + c(255, 70) + ',' + c(255, 130) + ',255)';
}
function median(xs) { const s = xs.slice().sort((a, b) => a - b); return s[(s.length - 1) >> 1]; }
function heatmap(svg, d) {
  clear(svg);
  const W = +svg.getAttribute('width'), L = 64, T = 6, rowH = Math.max(14, Math.min(34, 160 / Math.max(1, d.ranks.length)));
  const H = T + rowH * d.ranks.length + 28;
  size(svg, H);
  if (d.steps.length === 0) { el('text', { x: L, y: 20 }, svg, 'no steps yet'); return; }
  const cw = (W - L - 10) / d.steps.length;
  const medians = d.steps.map((_, j) => median(d.scoredMs.map((row) => row[j]).filter((v) => v !== null)));
  const named = new Set(d.stragglers.stragglers);
  d.ranks.forEach((rank, i) => {
    const label = el('text', { x: L - 8, y: T + i * rowH + rowH / 2 + 4, 'text-anchor': 'end' }, svg, 'rank ' + rank);
    if (named.has(rank)) { label.setAttribute('style', 'fill:#b3261e;font-weight:700'); }
    d.steps.forEach((step, j) => {
      const v = d.scoredMs[i][j];
      const r = el('rect', { x: L + j * cw, y: T + i * rowH, width: Math.max(1, cw - 1), height: rowH - 2, fill: v === null ? '#e5e7eb' : heatColor(v / medians[j]) }, svg);
      el('title', {}, r, 'rank ' + rank + ', step ' + step + ': ' + (v === null ? 'no record' : v.toFixed(1) + ' ms ' + d.scoredLabel + ', ' + d.stepMs[i][j].toFixed(1) + ' ms step'));
    });
  });
  const y = T + rowH * d.ranks.length + 16;
  el('text', { x: L, y }, svg, 'step ' + d.steps[0]);
  el('text', { x: W - 10, y, 'text-anchor': 'end' }, svg, 'step ' + d.steps[d.steps.length - 1]);
  el('text', { x: (L + W) / 2, y, 'text-anchor': 'middle' }, svg, 'blue: faster than the step\\'s median rank · white: median · red: slower (full red at +50%)');
}
let LABEL = '';
function scores(table, rep) {
  table.innerHTML = '';
  const head = table.insertRow();
  for (const h of ['rank', 'steps', 'median ' + LABEL, 'median step ms', 'score', '']) { const th = document.createElement('th'); th.textContent = h; head.appendChild(th); }
  for (const r of rep.ranks) {
    const tr = table.insertRow();
    if (r.straggler) tr.className = 'straggler';
    tr.id = 'score-rank-' + r.rank;
    for (const v of [r.rank, r.steps, r.medianMs.toFixed(1), r.medianStepMs.toFixed(1), r.score.toFixed(2), r.straggler ? '◀ straggler' : '']) tr.insertCell().textContent = v;
  }
}
function memory(svg, mem) {
  clear(svg);
  const W = +svg.getAttribute('width'), L = 64, rowH = Math.max(16, Math.min(36, 170 / Math.max(1, mem.length)));
  size(svg, 10 + rowH * mem.length + 24);
  if (mem.length === 0) { el('text', { x: L, y: 20 }, svg, 'no steps yet'); return; }
  const max = Math.max(...mem.map((m) => Math.max(m.rssBytes, m.peakBytes)), 1);
  const span = W - L - 150;
  mem.forEach((m, i) => {
    const y = 6 + i * rowH;
    el('text', { x: L - 8, y: y + rowH / 2 + 2, 'text-anchor': 'end' }, svg, 'rank ' + m.rank);
    el('rect', { x: L, y, width: Math.max(1, (m.rssBytes / max) * span), height: rowH / 2 - 2, fill: '#7aa2d6' }, svg);
    el('rect', { x: L, y: y + rowH / 2 - 1, width: Math.max(1, (m.peakBytes / max) * span), height: rowH / 2 - 2, fill: '#e3a04b' }, svg);
    el('text', { x: L + span + 8, y: y + rowH / 2 + 2 }, svg, mib(m.rssBytes) + ' / ' + mib(m.peakBytes) + ' MiB');
  });
  el('text', { x: L, y: 6 + rowH * mem.length + 14 }, svg, 'blue: process RSS · orange: peak ' + (mem[0].device) + ' memory (MiB: RSS / peak)');
}
function render(d) {
  const rep = d.stragglers;
  LABEL = d.scoredLabel;
  document.getElementById('heat-title').textContent = 'Per rank and step: ' + d.scoredLabel + ' (without waits in collectives; colour: against the median rank of each step)';
  document.getElementById('sub').textContent = d.dir + ' · ' + d.ranks.length + ' rank(s) · ' + d.steps.length + ' step(s)' +
    (d.loss.length ? ' · last loss ' + d.loss[d.loss.length - 1][1].toFixed(4) : '') + ' · ' + (LIVE ? 'live, read ' : 'read ') + new Date(d.readAt).toLocaleTimeString() +
    (d.traceFiles ? ' · ' + d.traceFiles + ' trace file(s): nodetron trace merge DIR' : '');
  lineChart(document.getElementById('loss'), d.loss, '#3b6fb6');
  lineChart(document.getElementById('tput'), d.throughput, '#2f8f5b');
  heatmap(document.getElementById('heat'), d);
  const v = document.getElementById('verdict');
  if (rep.ranks.length === 0) { v.textContent = 'waiting for the first steps'; v.className = ''; }
  else if (rep.stragglers.length) {
    v.textContent = 'Slowest: ' + rep.stragglers.map((r) => 'rank ' + r + ' (score ' + rep.ranks.find((x) => x.rank === r).score.toFixed(2) + ')').join(', ') +
      ' — at or above ' + rep.threshold + ' × the median rank (' + d.scoredLabel + ')';
    v.className = 'bad';
  } else {
    const slow = rep.ranks.slice().sort((a, b) => b.score - a.score)[0];
    v.textContent = 'No straggler: every score below ' + rep.threshold + ' (slowest: rank ' + slow.rank + ', ' + slow.score.toFixed(2) + ')';
    v.className = 'good';
  }
  v.setAttribute('data-stragglers', rep.stragglers.join(','));
  scores(document.getElementById('scores'), rep);
  memory(document.getElementById('mem'), d.memory);
}
render(JSON.parse(document.getElementById('data').textContent));
if (LIVE) setInterval(() => { fetch('api/data').then((r) => r.json()).then(render).catch(() => {}); }, 2000);
</script>
</body></html>
`;
