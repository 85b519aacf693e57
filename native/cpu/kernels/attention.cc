// Attention on the cpu backend: the masked, scaled softmax between the two per-head GEMMs
// (scores = q·kᵀ and out = probs·v run through gemm; lib/ops/attention.ts composes them).
#include "softmax.h"

namespace nt::cpu {

// attention_softmax_forward(scores, probs, batch, tq, tk, scale, causal, window, dtype)
//   scores/probs [batch, tq, tk]; query i (aligned to the last tq keys) sees key j iff
//   (!causal || j <= i + tk - tq) and (window == 0 || j > i + tk - tq - window). Masked → 0.
NT_KERNEL("attention_softmax_forward", AttentionSoftmaxForward) {
  int64_t batch = a.size(2), tq = a.size(3), tk = a.size(4);
  float scale = float(a.number(5));
  bool causal = a.boolean(6);
  int64_t window = a.size(7);
  DType dt = a.dtype(8);
  if (tq > tk && causal) fail(Err::Shape, "attention_softmax_forward: causal attention needs tq <= tk");
  int64_t n = batch * tq * tk;
  F32View S(info, 0, call, dt, n, true), P(info, 1, call, dt, n, false);
  const float* s = S.data();
  float* p = P.data();
  int64_t shift = tk - tq;
  parallelRows(batch * tq, tk * 4, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(tk));
    for (int64_t r = b; r < e; r++) {
      int64_t i = r % tq;
      int64_t hi = causal ? std::min(tk, i + shift + 1) : tk;
      int64_t lo = window > 0 ? std::max<int64_t>(0, i + shift - window + 1) : 0;
      const float* x = s + r * tk;
      float* y = p + r * tk;
      for (int64_t j = 0; j < tk; j++) y[j] = 0.0f;
      if (hi <= lo) continue;
      for (int64_t j = lo; j < hi; j++) row[size_t(j)] = x[j] * scale;
      softmaxRow(row.data() + lo, y + lo, hi - lo, false);
    }
  });
  P.commit();
}

// attention_softmax_backward(probs, gradProbs, gradScores, batch, tq, tk, scale, dtype)
//   gradScores = scale · softmax'(probs)·gradProbs; masked entries (probs 0) get 0.
NT_KERNEL("attention_softmax_backward", AttentionSoftmaxBackward) {
  int64_t batch = a.size(3), tq = a.size(4), tk = a.size(5);
  float scale = float(a.number(6));
  DType dt = a.dtype(7);
  int64_t n = batch * tq * tk;
  F32View P(info, 0, call, dt, n, true), G(info, 1, call, dt, n, true);
  F32View O(info, 2, call, dt, n, false);
  const float *p = P.data(), *g = G.data();
  float* o = O.data();
  parallelRows(batch * tq, tk * 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      softmaxRowBackward(p + r * tk, g + r * tk, o + r * tk, tk, false);
      for (int64_t j = 0; j < tk; j++) o[r * tk + j] *= scale;
    }
  });
  O.commit();
}

}  // namespace nt::cpu
