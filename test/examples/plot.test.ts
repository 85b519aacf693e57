// examples/gpt/plot.ts, the example's loss curves: the terminal plot's shape and the dots it draws
// (decoded back from braille), markers and reference lines where their values put them; the SVG is
// well-formed XML with one polyline per series, circles at a marked series' points, escaped text, and
// coordinates in the plot's order; round ticks.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { lineChartSvg, niceTicks, terminalPlot } from '../../examples/gpt/plot.js';

/** Dots (x, y) of a braille plot area: rows of characters → 2×4 dots per character. */
function brailleDots(rows: string[]): Array<[number, number]> {
  const bits = [[0x01, 0x02, 0x04, 0x40], [0x08, 0x10, 0x20, 0x80]];
  const dots: Array<[number, number]> = [];
  rows.forEach((row, r) => [...row].forEach((ch, c) => {
    const code = ch.codePointAt(0)! - 0x2800;
    if (code <= 0 || code > 0xff) return;
    for (let dx = 0; dx < 2; dx++) for (let dy = 0; dy < 4; dy++) if (code & bits[dx]![dy]!) dots.push([2 * c + dx, 4 * r + dy]);
  }));
  return dots;
}

/** The plot area of terminalPlot's output (the characters right of the axis, one string per row). */
function plotArea(text: string, height: number): string[] {
  const lines = text.split('\n');
  const first = lines.findIndex((l) => /[┤│]/.test(l));
  return lines.slice(first, first + height).map((l) => [...l].slice([...l].findIndex((ch) => ch === '┤' || ch === '│') + 1).join(''));
}

/** A minimal XML well-formedness check: every tag closes in order, attributes are quoted, & starts an entity. */
function checkXml(xml: string): { tags: string[] } {
  const body = xml.replace(/^<\?xml[^?]*\?>\s*/, '');
  const stack: string[] = [], tags: string[] = [];
  const re = /<(\/?)([a-zA-Z][\w-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>|([^<]+)/g;
  let m: RegExpExecArray | null, at = 0;
  while ((m = re.exec(body))) {
    if (m.index !== at) throw new Error(`not well-formed at ${at}: ${body.slice(at, at + 40)}`);
    at = re.lastIndex;
    if (m[5] !== undefined) {
      if (/&(?!(amp|lt|gt|quot|apos|#\d+);)/.test(m[5])) throw new Error(`bare & in text: ${m[5]}`);
      continue;
    }
    const [, close, name, , selfClose] = m;
    if (close) { if (stack.pop() !== name) throw new Error(`</${name}> does not close the open tag`); continue; }
    tags.push(name!);
    if (!selfClose) stack.push(name!);
  }
  if (at !== body.length) throw new Error(`not well-formed at ${at}: ${body.slice(at, at + 40)}`);
  if (stack.length) throw new Error(`unclosed: ${stack.join(', ')}`);
  return { tags };
}

describe('terminalPlot', () => {
  it('has the asked size, equal-width rows, the labels and a legend', () => {
    const text = terminalPlot([{ name: 'train', points: [[0, 10], [50, 6], [100, 5]] }, { name: 'val', points: [[0, 10], [100, 5.2]], marker: '●' }],
      { width: 40, height: 12, title: 'loss', xLabel: 'step', yLabel: 'nats', references: [{ y: 7, label: 'unigram' }] });
    const lines = text.split('\n');
    // title, y label, 12 plot rows, axis, x labels, legend
    expect(lines).toHaveLength(2 + 12 + 3);
    expect(lines[0]).toBe('loss');
    const rows = lines.slice(2, 14);
    const widths = new Set(rows.map((l) => [...l].length));
    expect(widths.size).toBe(1);
    expect(plotArea(text, 12).every((r) => [...r].length === 40)).toBe(true);
    expect(lines[14]).toMatch(/└─{40}$/);
    expect(lines[15]).toMatch(/^\s+0\s+step\s+100$/);
    expect(lines[16]).toContain('● val');
    expect(lines[16]).toContain('╌ unigram (7)');
  });

  it('draws a straight line as a connected diagonal of dots, markers and references where their values are', () => {
    const width = 20, height = 5, W = 2 * width, H = 4 * height;
    const text = terminalPlot([{ name: 'up', points: [[0, 0], [1, 1]] }], { width, height, yRange: [0, 1] });
    const dots = brailleDots(plotArea(text, height));
    // One dot per column, on the line y = x (the top row is the highest value).
    const cols = new Map<number, number[]>();
    for (const [x, y] of dots) cols.set(x, [...(cols.get(x) ?? []), y]);
    expect([...cols.keys()].sort((a, b) => a - b)).toEqual(Array.from({ length: W }, (_, i) => i));
    for (const [x, ys] of cols) {
      const want = Math.round((1 - x / (W - 1)) * (H - 1));
      for (const y of ys) expect(Math.abs(y - want)).toBeLessThanOrEqual(1);
    }

    const marked = terminalPlot([{ name: 'v', points: [[0, 10], [10, 0]], marker: 'o' }], { width, height, yRange: [0, 10], references: [{ y: 5, label: 'half' }] });
    const area = plotArea(marked, height).map((r) => [...r]);
    expect(area[0]![0]).toBe('o');
    expect(area[height - 1]![width - 1]).toBe('o');
    const refRow = Math.round(0.5 * (H - 1)) >> 2;
    expect(area[refRow]!.filter((ch) => ch === '╌').length).toBe(width / 2);
    // Nothing else drawn: a marked series has no braille line.
    expect(brailleDots(plotArea(marked, height))).toEqual([]);
  });

  it('puts a falling curve from the top left to the bottom right, and rounds the y axis to ticks', () => {
    const pts = Array.from({ length: 200 }, (_, i): [number, number] => [i + 1, 5 + 6 * Math.exp(-i / 30)]);
    const text = terminalPlot([{ name: 'train', points: pts }], { width: 50, height: 10 });
    const dots = brailleDots(plotArea(text, 10));
    const left = dots.filter(([x]) => x === 0).map(([, y]) => y), right = dots.filter(([x]) => x === 99).map(([, y]) => y);
    expect(Math.max(...left)).toBeLessThan(Math.min(...right));
    const labels = text.split('\n').map((l) => /^\s*([\d.]+) ┤/.exec(l)?.[1]).filter(Boolean).map(Number);
    expect(labels[0]).toBe(12);
    expect(labels.at(-1)).toBe(4);
  });

  it('rejects what it cannot draw with ArgumentError', () => {
    expect(() => terminalPlot([])).toThrow(nt.ArgumentError);
    expect(() => terminalPlot([{ name: 'x', points: [[0, NaN]] }])).toThrow(/no finite points/);
    expect(() => terminalPlot([{ name: 'x', points: [[0, 1]] }], { width: 3 })).toThrow(/width must be an integer >= 10/);
    expect(() => terminalPlot([{ name: 'x', points: [[0, 1]], marker: 'ab' }])).toThrow(/marker must be one character/);
    expect(() => terminalPlot([{ name: 'x', points: [[0, 1]] }], { yRange: [2, 1] })).toThrow(/yRange/);
  });
});

describe('lineChartSvg', () => {
  const train = Array.from({ length: 50 }, (_, i): [number, number] => [i + 1, 10 - i / 10]);
  const val: Array<[number, number]> = [[0, 10.5], [25, 8], [50, 5.5]];
  const svg = lineChartSvg([{ name: 'train <loss> & co', points: train }, { name: 'val', points: val, marker: '●' }],
    { title: 'GPT "tiny"', xLabel: 'step', yLabel: 'nats', references: [{ y: 7, label: 'unigram' }] });

  it('is a well-formed SVG document with escaped text', () => {
    expect(svg.startsWith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    const { tags } = checkXml(svg);
    expect(tags[0]).toBe('svg');
    expect(svg).toContain('train &lt;loss&gt; &amp; co');
    expect(svg).toContain('GPT &quot;tiny&quot;');
  });

  it('draws one polyline per series in x order, circles at the marked points, the reference dashed', () => {
    const polylines = [...svg.matchAll(/<polyline [^>]*points="([^"]*)"/g)].map((m) => m[1]!.split(' ').map((p) => p.split(',').map(Number) as [number, number]));
    expect(polylines).toHaveLength(2);
    expect(polylines[0]).toHaveLength(train.length);
    expect(polylines[1]).toHaveLength(val.length);
    for (const line of polylines) for (let i = 1; i < line.length; i++) expect(line[i]![0]).toBeGreaterThan(line[i - 1]![0]);
    // Falling losses go down the page as pixels count downward: y grows along the train line.
    expect(polylines[0]![0]![1]).toBeLessThan(polylines[0]!.at(-1)![1]);
    const circles = [...svg.matchAll(/<circle cx="([\d.]+)" cy="([\d.]+)"/g)].map((m) => [Number(m[1]), Number(m[2])]);
    expect(circles).toEqual(polylines[1]);
    const dashed = /<line x1="[\d.]+" y1="([\d.]+)" x2="[\d.]+" y2="([\d.]+)" stroke="#777" stroke-dasharray/.exec(svg);
    expect(dashed).not.toBeNull();
    // y = 7 lies between the val points at 8 (step 25) and 5.5 (step 50).
    const y7 = Number(dashed![1]);
    expect(y7).toBeGreaterThan(polylines[1]![1]![1]);
    expect(y7).toBeLessThan(polylines[1]![2]![1]);
    expect(svg).toContain('unigram (7)');
  });

  it('rejects a size too small to draw', () => {
    expect(() => lineChartSvg([{ name: 'x', points: [[0, 1]] }], { width: 50 })).toThrow(nt.ArgumentError);
  });
});

describe('niceTicks', () => {
  it('gives round steps of 1, 2 or 5 × 10^k inside the range', () => {
    expect(niceTicks(0, 10, 5)).toEqual([0, 2, 4, 6, 8, 10]);
    expect(niceTicks(4.38, 11.52, 5)).toEqual([6, 8, 10]);
    expect(niceTicks(0, 1, 4)).toEqual([0, 0.5, 1]);
    expect(niceTicks(0.1, 0.35, 5)).toEqual([0.1, 0.15, 0.2, 0.25, 0.3, 0.35]);
    expect(niceTicks(3, 3)).toEqual([3]);
    expect(() => niceTicks(2, 1)).toThrow(nt.ArgumentError);
  });
});
