// The deterministic token batches the training fixtures use: the same global batch on every rank for
// a step (a fixed LCG seeded by the step), so each rank's slice of it is well defined.

/** Global batch `step`: inputs and next-token targets, [batch, ctx] each, ids below `vocab`. */
export function lcgGlobalBatch(step: number, batch: number, ctx: number, vocab: number): { x: Int32Array; y: Int32Array } {
  let s = (step + 1) * 7919;
  const seq = new Int32Array(batch * (ctx + 1)).map(() => { s = (s * 1103515245 + 12345) % 2147483648; return s % vocab; });
  const x = new Int32Array(batch * ctx), y = new Int32Array(batch * ctx);
  for (let b = 0; b < batch; b++) {
    x.set(seq.subarray(b * (ctx + 1), b * (ctx + 1) + ctx), b * ctx);
    y.set(seq.subarray(b * (ctx + 1) + 1, (b + 1) * (ctx + 1)), b * ctx);
  }
  return { x, y };
}
