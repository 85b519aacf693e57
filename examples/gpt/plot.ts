// The example's loss curves, without dependencies: a line chart as a standalone SVG document (lineChartSvg) and as
// text for a terminal (terminalPlot: Unicode braille dots, 2×4 per character cell, so a 60-column plot
// has 120 horizontal positions). Both take the same series and horizontal reference lines (e.g. the
// unigram level a language model must beat), and share one choice of axis ranges and ticks.
import { ArgumentError } from '../../lib/index.js';

/** One curve: (x, y) points in x order, e.g. (step, loss). */
export interface PlotSeries {
  /** Legend name. */
  name: string;
  /** The points; non-finite ones are skipped. */
  points: ReadonlyArray<readonly [number, number]>;
  /**
   * In the terminal: draw each point as this character instead of a braille line (for sparse series,
   * e.g. validation losses every N steps). The SVG draws circles at the points of such a series.
   */
  marker?: string;
  /** SVG stroke color (default: from a fixed palette by position). */
  color?: string;
}

/** A horizontal reference line across the plot. */
export interface PlotReference {
  /** Its y value. */
  y: number;
  /** Its label (legend in the terminal, text beside the line in the SVG). */
  label: string;
}

/** What both renderers accept besides the series. */
export interface PlotOptions {
  /** A title line above the plot. */
  title?: string;
  /** Label of the x axis (e.g. 'step'). */
  xLabel?: string;
  /** Label of the y axis (e.g. 'loss (nats)'). */
  yLabel?: string;
  /** Horizontal reference lines. */
  references?: readonly PlotReference[];
  /** Fixed y range; default: the data's and the references' range, padded by 5%. */
  yRange?: readonly [number, number];
}

/** Options of {@link terminalPlot}. */
export interface TerminalPlotOptions extends PlotOptions {
  /** Character columns of the plotting area (default 60; the y labels take a few more). */
  width?: number;
  /** Character rows of the plotting area (default 15). */
  height?: number;
}

/** Options of {@link lineChartSvg}. */
export interface SvgPlotOptions extends PlotOptions {
  /** Width of the SVG in pixels (default 720). */
  width?: number;
  /** Height of the SVG in pixels (default 400). */
  height?: number;
}

const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];

interface Frame { x0: number; x1: number; y0: number; y1: number; series: Array<{ s: PlotSeries; pts: Array<[number, number]> }> }

function frame(series: readonly PlotSeries[], opts: PlotOptions, fn: string): Frame {
  if (!Array.isArray(series) || series.length === 0) throw new ArgumentError(`${fn}: give at least one series`);
  const clean = series.map((s, i) => {
    if (!s || typeof s.name !== 'string' || !Array.isArray(s.points)) throw new ArgumentError(`${fn}: series ${i} must be { name: string, points: [x, y][] }`);
    if (s.marker !== undefined && [...s.marker].length !== 1) throw new ArgumentError(`${fn}: series ${JSON.stringify(s.name)}: marker must be one character, got ${JSON.stringify(s.marker)}`);
    const points = s.points as ReadonlyArray<readonly [number, number]>;
    return { s, pts: points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1])).map((p): [number, number] => [p[0], p[1]]) };
  });
  const all = clean.flatMap((c) => c.pts);
  if (all.length === 0) throw new ArgumentError(`${fn}: no finite points in any series`);
  const refs = (opts.references ?? []).filter((r) => Number.isFinite(r.y));
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  let y0: number, y1: number;
  if (opts.yRange) {
    [y0, y1] = opts.yRange;
    if (!(Number.isFinite(y0) && Number.isFinite(y1) && y1 > y0)) throw new ArgumentError(`${fn}: yRange must be [low, high] with low < high, got [${y0}, ${y1}]`);
  } else {
    const ys = [...all.map((p) => p[1]), ...refs.map((r) => r.y)];
    y0 = Math.min(...ys); y1 = Math.max(...ys);
    const pad = y1 > y0 ? 0.05 * (y1 - y0) : 1;
    y0 -= pad; y1 += pad;
    // Out to the round ticks around the padded range, so the axis starts and ends on labeled values.
    const step = tickStep(y0, y1, 5);
    y0 = Number((Math.floor(y0 / step) * step).toPrecision(12)); y1 = Number((Math.ceil(y1 / step) * step).toPrecision(12));
  }
  return { x0, x1, y0, y1, series: clean };
}

function tickStep(lo: number, hi: number, count: number): number {
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  return ([1, 2, 5, 10].find((m) => m * mag >= raw) ?? 10) * mag;
}

/** About `count` round tick values (steps of 1, 2 or 5 × 10^k) inside [lo, hi]. */
export function niceTicks(lo: number, hi: number, count = 5): number[] {
  if (!(Number.isFinite(lo) && Number.isFinite(hi)) || hi < lo) throw new ArgumentError(`niceTicks: need finite lo <= hi, got ${lo}, ${hi}`);
  if (hi === lo) return [lo];
  const step = tickStep(lo, hi, count);
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

const fmt = (v: number) => {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
};

// Braille: dot (col c in 0..1, row r in 0..3) of a cell is bit BRAILLE_BITS[c][r] of U+2800 + bits.
const BRAILLE_BITS = [[0x01, 0x02, 0x04, 0x40], [0x08, 0x10, 0x20, 0x80]];

/**
 * The series as a text plot: braille lines (or one marker character per point for series with a
 * `marker`), reference lines dashed, y labels on the left, the x range below and a legend. Returns
 * the lines joined by '\n' (no trailing newline); every plot row has the same width.
 */
export function terminalPlot(series: readonly PlotSeries[], opts: TerminalPlotOptions = {}): string {
  const width = opts.width ?? 60, height = opts.height ?? 15;
  if (!Number.isInteger(width) || width < 10 || !Number.isInteger(height) || height < 3) {
    throw new ArgumentError(`terminalPlot: width must be an integer >= 10 and height >= 3, got ${width} × ${height}`);
  }
  const f = frame(series, opts, 'terminalPlot');
  const W = width * 2, H = height * 4;
  const px = (x: number) => Math.round(((x - f.x0) / (f.x1 - f.x0)) * (W - 1));
  const py = (y: number) => Math.round(((f.y1 - y) / (f.y1 - f.y0)) * (H - 1));
  const dots = Array.from({ length: height }, () => new Array<number>(width).fill(0));
  const chars: (string | null)[][] = Array.from({ length: height }, () => new Array<string | null>(width).fill(null));
  const set = (x: number, y: number) => {
    if (x < 0 || x >= W || y < 0 || y >= H) return;
    dots[y >> 2]![x >> 1]! |= BRAILLE_BITS[x & 1]![y & 3]!;
  };
  for (const ref of opts.references ?? []) {
    if (!Number.isFinite(ref.y)) continue;
    const row = py(ref.y) >> 2;
    if (row < 0 || row >= height) continue;
    for (let c = 0; c < width; c += 2) chars[row]![c] = '╌';
  }
  for (const { s, pts } of f.series) {
    if (s.marker) continue;
    for (let i = 0; i < pts.length; i++) {
      const [ax, ay] = [px(pts[i]![0]), py(pts[i]![1])];
      if (i === 0) { set(ax, ay); continue; }
      const [bx, by] = [px(pts[i - 1]![0]), py(pts[i - 1]![1])];
      const n = Math.max(Math.abs(ax - bx), Math.abs(ay - by), 1);
      for (let k = 0; k <= n; k++) set(Math.round(bx + ((ax - bx) * k) / n), Math.round(by + ((ay - by) * k) / n));
    }
  }
  // Braille dots win over the dashes of a reference line; markers win over both.
  for (let r = 0; r < height; r++) for (let c = 0; c < width; c++) if (dots[r]![c]) chars[r]![c] = String.fromCharCode(0x2800 + dots[r]![c]!);
  for (const { s, pts } of f.series) {
    if (!s.marker) continue;
    for (const [x, y] of pts) {
      const c = px(x) >> 1, r = py(y) >> 2;
      if (r >= 0 && r < height && c >= 0 && c < width) chars[r]![c] = s.marker;
    }
  }
  // y labels at the top, bottom, and the rows of the ticks in between.
  const labels = new Array<string>(height).fill('');
  labels[0] = fmt(f.y1); labels[height - 1] = fmt(f.y0);
  for (const t of niceTicks(f.y0, f.y1, Math.max(2, Math.floor(height / 4)))) {
    const r = py(t) >> 2;
    if (r > 0 && r < height - 1 && !labels[r - 1] && !labels[r + 1]) labels[r] = fmt(t);
  }
  const lw = Math.max(...labels.map((l) => l.length));
  const out: string[] = [];
  if (opts.title) out.push(opts.title);
  if (opts.yLabel) out.push(`${' '.repeat(lw)} ${opts.yLabel}`);
  for (let r = 0; r < height; r++) out.push(`${labels[r]!.padStart(lw)} ${labels[r] ? '┤' : '│'}${chars[r]!.map((ch) => ch ?? ' ').join('')}`);
  out.push(`${' '.repeat(lw)} └${'─'.repeat(width)}`);
  const left = fmt(f.x0), right = fmt(f.x1), mid = opts.xLabel ?? '';
  const gap = Math.max(1, width - left.length - right.length - mid.length);
  out.push(`${' '.repeat(lw + 2)}${left}${' '.repeat(Math.floor(gap / 2))}${mid}${' '.repeat(Math.ceil(gap / 2))}${right}`);
  const legend = [
    ...f.series.map(({ s }) => `${s.marker ?? '⠤'} ${s.name}`),
    ...(opts.references ?? []).map((r) => `╌ ${r.label} (${fmt(r.y)})`),
  ];
  out.push(`${' '.repeat(lw + 2)}${legend.join('   ')}`);
  return out.join('\n');
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/**
 * The series as a standalone SVG document (axes with round ticks, grid, one polyline per series,
 * circles for series with a `marker`, dashed reference lines with their labels, a legend), as text
 * to write to a `.svg` file.
 */
export function lineChartSvg(series: readonly PlotSeries[], opts: SvgPlotOptions = {}): string {
  const width = opts.width ?? 720, height = opts.height ?? 400;
  if (!(width >= 200 && height >= 150)) throw new ArgumentError(`lineChartSvg: width must be >= 200 and height >= 150 pixels, got ${width} × ${height}`);
  const f = frame(series, opts, 'lineChartSvg');
  const m = { l: 64, r: 20, t: opts.title ? 36 : 16, b: 64 };
  const pw = width - m.l - m.r, ph = height - m.t - m.b;
  const sx = (x: number) => m.l + ((x - f.x0) / (f.x1 - f.x0)) * pw;
  const sy = (y: number) => m.t + ((f.y1 - y) / (f.y1 - f.y0)) * ph;
  const n = (v: number) => v.toFixed(1);
  const parts: string[] = [];
  parts.push(`<?xml version="1.0" encoding="UTF-8"?>`);
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect x="0" y="0" width="${width}" height="${height}" fill="white"/>`);
  if (opts.title) parts.push(`<text x="${width / 2}" y="22" text-anchor="middle" font-size="15">${esc(opts.title)}</text>`);
  parts.push('<g stroke="#e5e5e5" stroke-width="1">');
  const xt = niceTicks(f.x0, f.x1, 8), yt = niceTicks(f.y0, f.y1, 6);
  for (const t of xt) parts.push(`<line x1="${n(sx(t))}" y1="${m.t}" x2="${n(sx(t))}" y2="${m.t + ph}"/>`);
  for (const t of yt) parts.push(`<line x1="${m.l}" y1="${n(sy(t))}" x2="${m.l + pw}" y2="${n(sy(t))}"/>`);
  parts.push('</g>');
  parts.push(`<rect x="${m.l}" y="${m.t}" width="${pw}" height="${ph}" fill="none" stroke="#333"/>`);
  parts.push('<g fill="#333">');
  for (const t of xt) parts.push(`<text x="${n(sx(t))}" y="${m.t + ph + 16}" text-anchor="middle">${esc(fmt(t))}</text>`);
  for (const t of yt) parts.push(`<text x="${m.l - 6}" y="${n(sy(t) + 4)}" text-anchor="end">${esc(fmt(t))}</text>`);
  if (opts.xLabel) parts.push(`<text x="${m.l + pw / 2}" y="${m.t + ph + 34}" text-anchor="middle">${esc(opts.xLabel)}</text>`);
  if (opts.yLabel) parts.push(`<text x="16" y="${m.t + ph / 2}" text-anchor="middle" transform="rotate(-90 16 ${m.t + ph / 2})">${esc(opts.yLabel)}</text>`);
  parts.push('</g>');
  for (const r of opts.references ?? []) {
    if (!Number.isFinite(r.y) || r.y < f.y0 || r.y > f.y1) continue;
    parts.push(`<line x1="${m.l}" y1="${n(sy(r.y))}" x2="${m.l + pw}" y2="${n(sy(r.y))}" stroke="#777" stroke-dasharray="6 4"/>`);
    // Labelled at the left, under the line: a falling curve is well above it there.
    parts.push(`<text x="${m.l + 6}" y="${n(sy(r.y) + 15)}" fill="#555">${esc(`${r.label} (${fmt(r.y)})`)}</text>`);
  }
  f.series.forEach(({ s, pts }, i) => {
    const color = esc(s.color ?? PALETTE[i % PALETTE.length]!);
    const inside = pts.filter(([, y]) => y >= f.y0 && y <= f.y1);
    if (s.marker) {
      parts.push(`<polyline fill="none" stroke="${color}" stroke-width="1.5" points="${inside.map(([x, y]) => `${n(sx(x))},${n(sy(y))}`).join(' ')}"/>`);
      for (const [x, y] of inside) parts.push(`<circle cx="${n(sx(x))}" cy="${n(sy(y))}" r="3.5" fill="${color}"/>`);
    } else {
      parts.push(`<polyline fill="none" stroke="${color}" stroke-width="1.5" points="${inside.map(([x, y]) => `${n(sx(x))},${n(sy(y))}`).join(' ')}"/>`);
    }
    const ly = height - 14, lx = m.l + i * 190;
    parts.push(`<line x1="${lx}" y1="${ly - 4}" x2="${lx + 24}" y2="${ly - 4}" stroke="${color}" stroke-width="2"/>`);
    parts.push(`<text x="${lx + 30}" y="${ly}">${esc(s.name)}</text>`);
  });
  (opts.references ?? []).forEach((r, k) => {
    const ly = height - 14, lx = m.l + (f.series.length + k) * 190;
    parts.push(`<line x1="${lx}" y1="${ly - 4}" x2="${lx + 24}" y2="${ly - 4}" stroke="#777" stroke-dasharray="6 4"/>`);
    parts.push(`<text x="${lx + 30}" y="${ly}">${esc(r.label)}</text>`);
  });
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}
