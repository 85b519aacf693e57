// Fused cross-entropy over a vocabulary on the cpu backend: forward keeps one logsumexp per row;
// backward recomputes softmax row by row straight into the gradient (no probability matrix).
#include "util.h"

namespace nt::cpu {

static void checkTargets(const int32_t* t, int64_t rows, int64_t vocab, int64_t ignore, const char* call) {
  for (int64_t r = 0; r < rows; r++)
    if (t[r] != ignore && (t[r] < 0 || t[r] >= vocab))
      fail(Err::Argument, std::string(call) + ": target " + std::to_string(t[r]) + " at row " + std::to_string(r) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// Per row: lse = log Σ exp(x), loss = lse − x[target] (0 when ignored).
NT_SIMD_BODY void lossRowsBody(const float* x, const int32_t* t, float* loss, float* lse, int64_t begin, int64_t end,
                              int64_t vocab, int64_t ignore) {
  for (int64_t r = begin; r < end; r++) {
    const float* xr = x + r * vocab;
    float mx = maxLanes(xr, vocab);
    float s = sumLanes(vocab, [&](int64_t j) { return fastExp(xr[j] - mx); });
    lse[r] = mx + std::log(s);
    loss[r] = t[r] == ignore ? 0.0f : lse[r] - xr[t[r]];
  }
}
NT_SIMD(lossRows, (const float* x, const int32_t* t, float* loss, float* lse, int64_t begin, int64_t end, int64_t vocab, int64_t ignore),
        (x, t, loss, lse, begin, end, vocab, ignore))

// Per row: grad = k·(exp(x − lse) − [j == target]). A target outside [0, vocab) only happens in a
// vocabulary shard (another process owns it: softmax only); a target equal to `ignore` zeroes the row.
NT_SIMD_BODY void gradRowsBody(const float* x, const int32_t* t, const float* lse, float* o, float k, int64_t begin,
                              int64_t end, int64_t vocab, int64_t ignore) {
  for (int64_t r = begin; r < end; r++) {
    const float* xr = x + r * vocab;
    float* orow = o + r * vocab;
    if (t[r] == ignore) { std::fill(orow, orow + vocab, 0.0f); continue; }
    float l = lse[r];
    for (int64_t j = 0; j < vocab; j++) orow[j] = k * fastExp(xr[j] - l);
    if (t[r] >= 0 && t[r] < vocab) orow[t[r]] -= k;
  }
}
NT_SIMD(gradRows, (const float* x, const int32_t* t, const float* lse, float* o, float k, int64_t begin, int64_t end, int64_t vocab,
                   int64_t ignore),
        (x, t, lse, o, k, begin, end, vocab, ignore))

// cross_entropy_forward(logits, targets: i32, losses: f32 [rows], lse: f32 [rows], rows, vocab, ignoreIndex, dtype)
//   lse[r] = log Σ_j exp(logits[r, j]); losses[r] = lse[r] − logits[r, target[r]] (0 for ignored rows)
NT_KERNEL("cross_entropy_forward", CrossEntropyForward) {
  int64_t rows = a.size("rows"), vocab = a.size("vocab"), ignore = a.int64("ignoreIndex");
  DType dt = a.dtype("dtype");
  int64_t n = rows * vocab;
  if (vocab == 0) fail(Err::Shape, "cross_entropy_forward: empty vocabulary");
  const int32_t* t = reinterpret_cast<const int32_t*>(storageData(info, a.at("targets", "so"), call, DType::I32, rows));
  float* loss = reinterpret_cast<float*>(storageData(info, a.at("losses", "so"), call, DType::F32, rows));
  float* lse = reinterpret_cast<float*>(storageData(info, a.at("lse", "so"), call, DType::F32, rows));
  checkTargets(t, rows, vocab, ignore, call);
  if (dt != DType::F32) {
    // 16-bit logits (the head's bf16 chunks): each row widened into a buffer of the thread, not the whole block.
    const uint8_t* raw = storageData(info, a.at("logits", "so"), call, dt, n);
    const size_t es = dtypeSize(dt);
    parallelRows(rows, vocab * 2, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(vocab));
      for (int64_t r = b; r < e; r++) {
        toF32(raw + size_t(r * vocab) * es, dt, row.data(), vocab);
        lossRows(row.data(), t + r, loss + r, lse + r, 0, 1, vocab, ignore);
      }
    });
    return;
  }
  F32View X(a, "logits", dt, n, true);
  const float* x = X.data();
  parallelRows(rows, vocab * 2, [&](int64_t b, int64_t e) { lossRows(x, t, loss, lse, b, e, vocab, ignore); });
}

// Both backward bindings take (logits, targets: i32, lse: f32, gradLoss, gradLogits, rows, vocab, ignoreIndex,
// scale, dtype): gradLogits[r, j] = gradLoss[0]·scale·(exp(logits[r, j] − lse[r]) − [j == target[r]]), ignored
// rows 0. gradLoss is the one-element gradient of the reduced loss (dtype of logits); scale is 1 (sum) or
// 1/count (mean). `whole` binds check every target against the vocabulary.
static void crossEntropyBackwardBody(const Napi::CallbackInfo& info, const Args& a, const char* call, bool whole) {
  int64_t rows = a.size("rows"), vocab = a.size("vocab"), ignore = a.int64("ignoreIndex");
  float scale = float(a.number("scale"));
  DType dt = a.dtype("dtype");
  int64_t n = rows * vocab;
  const int32_t* t = reinterpret_cast<const int32_t*>(storageData(info, a.at("targets", "s"), call, DType::I32, rows));
  const float* lse = reinterpret_cast<const float*>(storageData(info, a.at("lse", "s"), call, DType::F32, rows));
  F32View GL(a, "gradLoss", dt, 1, true);
  if (whole) checkTargets(t, rows, vocab, ignore, call);
  float k = GL.data()[0] * scale;
  if (dt != DType::F32) {
    // 16-bit logits: row by row through a buffer of the thread (logits and gradient may be one storage).
    const uint8_t* in = storageData(info, a.at("logits", "s"), call, dt, n);
    uint8_t* out = storageData(info, a.at("gradLogits", "s"), call, dt, n);
    const size_t es = dtypeSize(dt);
    parallelRows(rows, vocab * 2, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(vocab));
      for (int64_t r = b; r < e; r++) {
        toF32(in + size_t(r * vocab) * es, dt, row.data(), vocab);
        gradRows(row.data(), t + r, lse + r, row.data(), k, 0, 1, vocab, ignore);
        fromF32(row.data(), out + size_t(r * vocab) * es, dt, vocab);
      }
    });
    return;
  }
  F32View X(a, "logits", dt, n, true);
  F32View O(a, "gradLogits", dt, n, false);
  const float* x = X.data();
  float* o = O.data();
  parallelRows(rows, vocab * 2, [&](int64_t b, int64_t e) { gradRows(x, t, lse, o, k, b, e, vocab, ignore); });
  O.commit();
}

// cross_entropy_backward: logits [rows, vocab] is the whole vocabulary; lse from cross_entropy_forward.
NT_KERNEL("cross_entropy_backward", CrossEntropyBackward) { crossEntropyBackwardBody(info, a, call, true); }

// cross_entropy_shard_backward: vocabulary-parallel cross-entropy. logits [rows, vocab] is this process's
// slice of the vocabulary, lse [rows] the logsumexp over the whole vocabulary, targets[r] the target's
// column in this slice or any value outside [0, vocab) when another slice owns it (or ignoreIndex).
NT_KERNEL("cross_entropy_shard_backward", CrossEntropyShardBackward) { crossEntropyBackwardBody(info, a, call, false); }

}  // namespace nt::cpu
