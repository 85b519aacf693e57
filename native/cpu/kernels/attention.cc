// Attention on the cpu backend: the masked, scaled softmax between the two per-head GEMMs
// (scores = q·kᵀ and out = probs·v run through gemm; lib/ops/attention.ts composes them).
#include "softmax.h"

namespace nt::cpu {

// One query's probabilities: zeros outside the visible keys [lo, hi), softmax of scale·x inside
// (`row` is scratch of tk floats). One copy per SIMD level (NT_SIMD).
NT_SIMD_BODY void attentionRowForwardBody(const float* __restrict x, float* __restrict y, float* __restrict row, int64_t tk, int64_t lo,
                                          int64_t hi, float scale) {
  for (int64_t j = 0; j < tk; j++) y[j] = 0.0f;
  if (hi <= lo) return;
  for (int64_t j = lo; j < hi; j++) row[j] = x[j] * scale;
  softmaxRow(row + lo, y + lo, hi - lo, false);
}
NT_SIMD(attentionRowForward, (const float* __restrict x, float* __restrict y, float* __restrict row, int64_t tk, int64_t lo, int64_t hi,
                              float scale),
        (x, y, row, tk, lo, hi, scale))

// One query's score gradients: scale·softmax'(p)·g (masked entries have p = 0 and get 0).
NT_SIMD_BODY void attentionRowBackwardBody(const float* __restrict p, const float* __restrict g, float* __restrict o, int64_t tk, float scale) {
  softmaxRowBackward(p, g, o, tk, false);
  for (int64_t j = 0; j < tk; j++) o[j] *= scale;
}
NT_SIMD(attentionRowBackward, (const float* __restrict p, const float* __restrict g, float* __restrict o, int64_t tk, float scale),
        (p, g, o, tk, scale))

// attention_softmax_forward(scores, probs, batch, tq, tk, scale, causal, window, dtype)
//   scores/probs [batch, tq, tk]; query i (aligned to the last tq keys) sees key j iff
//   (!causal || j <= i + tk - tq) and (window == 0 || j > i + tk - tq - window). Masked → 0.
NT_KERNEL("attention_softmax_forward", AttentionSoftmaxForward) {
  int64_t batch = a.size("batch"), tq = a.size("tq"), tk = a.size("tk");
  float scale = float(a.number("scale"));
  bool causal = a.boolean("causal");
  int64_t window = a.size("window");
  DType dt = a.dtype("dtype");
  if (tq > tk && causal) fail(Err::Shape, "attention_softmax_forward: causal attention needs tq <= tk");
  int64_t n = batch * tq * tk;
  F32View S(a, "scores", dt, n, true), P(a, "probs", dt, n, false);
  const float* s = S.data();
  float* p = P.data();
  int64_t shift = tk - tq;
  parallelRows(batch * tq, tk * 4, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(tk));
    for (int64_t r = b; r < e; r++) {
      int64_t i = r % tq;
      int64_t hi = causal ? std::min(tk, i + shift + 1) : tk;
      int64_t lo = window > 0 ? std::max<int64_t>(0, i + shift - window + 1) : 0;
      attentionRowForward(s + r * tk, p + r * tk, row.data(), tk, lo, hi, scale);
    }
  });
  P.commit();
}

// attention_softmax_backward(probs, gradProbs, gradScores, batch, tq, tk, scale, dtype)
//   gradScores = scale · softmax'(probs)·gradProbs; masked entries (probs 0) get 0.
NT_KERNEL("attention_softmax_backward", AttentionSoftmaxBackward) {
  int64_t batch = a.size("batch"), tq = a.size("tq"), tk = a.size("tk");
  float scale = float(a.number("scale"));
  DType dt = a.dtype("dtype");
  int64_t n = batch * tq * tk;
  F32View P(a, "probs", dt, n, true), G(a, "gradProbs", dt, n, true);
  F32View O(a, "gradScores", dt, n, false);
  const float *p = P.data(), *g = G.data();
  float* o = O.data();
  parallelRows(batch * tq, tk * 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) attentionRowBackward(p + r * tk, g + r * tk, o + r * tk, tk, scale);
  });
  O.commit();
}

}  // namespace nt::cpu
