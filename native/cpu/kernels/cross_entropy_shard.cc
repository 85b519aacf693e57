// Backward of a cross-entropy whose vocabulary is split across processes (vocabulary-parallel
// cross-entropy): each process holds a slice of every row's logits and the row's global logsumexp.
#include "util.h"

namespace nt::cpu {

// Per row: grad = k·(exp(x − lse) − [j == target]); a target outside [0, vocab) lives in another
// shard (softmax only), a target equal to `ignore` zeroes the row.
NT_SIMD_CLONES static void shardGradRows(const float* x, const int32_t* t, const float* lse, float* o, float k, int64_t begin,
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

// cross_entropy_shard_backward(logits, localTargets: i32, lse: f32, gradLoss, gradLogits, rows, vocab, ignoreIndex, scale, dtype)
//   logits [rows, vocab] is this shard's slice; lse [rows] the logsumexp over the whole vocabulary;
//   localTargets[r] is the target's column in this shard, or any other value outside [0, vocab)
//   when another shard owns it, or ignoreIndex for a row without loss.
//   gradLogits[r, j] = gradLoss[0]·scale·(exp(logits[r, j] − lse[r]) − [j == localTargets[r]]).
static Napi::Value CrossEntropyShardBackward(const Napi::CallbackInfo& info) {
  const char* call = "cross_entropy_shard_backward";
  Args a{info, call};
  a.count(10);
  int64_t rows = a.size(5), vocab = a.size(6), ignore = a.int64(7);
  float scale = float(a.number(8));
  DType dt = a.dtype(9);
  int64_t n = rows * vocab;
  F32View X(storageData(info, 0, call, dt, n), dt, n, true);
  const int32_t* t = reinterpret_cast<const int32_t*>(storageData(info, 1, call, DType::I32, rows));
  const float* lse = reinterpret_cast<const float*>(storageData(info, 2, call, DType::F32, rows));
  F32View GL(storageData(info, 3, call, dt, 1), dt, 1, true);
  F32View O(storageData(info, 4, call, dt, n), dt, n, false);
  float k = GL.data()[0] * scale;
  const float* x = X.data();
  float* o = O.data();
  parallelRows(rows, vocab * 2, [&](int64_t b, int64_t e) { shardGradRows(x, t, lse, o, k, b, e, vocab, ignore); });
  O.commit();
  return info.Env().Undefined();
}
NT_EXPORT("cross_entropy_shard_backward", CrossEntropyShardBackward);

}  // namespace nt::cpu
