// Embedding lookup on the cpu backend: gather rows forward, scatter-add rows backward.
#include "util.h"

namespace nt::cpu {

static void checkIds(const int32_t* ids, int64_t n, int64_t vocab, const char* call) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      fail(Err::Argument, std::string(call) + ": index " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                              " is outside [0, " + std::to_string(vocab) + ")");
}

// embedding_forward(ids: i32 [n], weight [vocab, dim], out [n, dim], n, vocab, dim, dtype)
NT_KERNEL("embedding_forward", EmbeddingForward) {
  int64_t n = a.size("n"), vocab = a.size("vocab"), dim = a.size("dim");
  DType dt = a.dtype("dtype");
  const int32_t* ids = reinterpret_cast<const int32_t*>(storageData(info, a.at("ids", "so"), call, DType::I32, n));
  uint8_t* w = storageData(info, a.at("weight", "so"), call, dt, vocab * dim);
  uint8_t* o = storageData(info, a.at("out", "so"), call, dt, n * dim);
  checkIds(ids, n, vocab, call);
  size_t rowBytes = size_t(dim) * dtypeSize(dt);
  for (int64_t i = 0; i < n; i++) std::memcpy(o + size_t(i) * rowBytes, w + size_t(ids[i]) * rowBytes, rowBytes);
}

// embedding_backward(ids: i32 [n], gradOut [n, dim], gradWeight [vocab, dim], n, vocab, dim, dtype)
//   gradWeight is overwritten: zero, then gradOut rows added at their ids.
NT_KERNEL("embedding_backward", EmbeddingBackward) {
  int64_t n = a.size("n"), vocab = a.size("vocab"), dim = a.size("dim");
  DType dt = a.dtype("dtype");
  const int32_t* ids = reinterpret_cast<const int32_t*>(storageData(info, a.at("ids", "so"), call, DType::I32, n));
  F32View G(a, "gradOut", dt, n * dim, true);
  F32View W(a, "gradWeight", dt, vocab * dim, false);
  checkIds(ids, n, vocab, call);
  float* w = W.data();
  const float* g = G.data();
  parallelRows(vocab, dim, [&](int64_t b, int64_t e) { std::fill(w + b * dim, w + e * dim, 0.0f); });
  // The scatter-add split by columns: each element still adds its rows in position order, so the
  // result does not depend on the thread count (ids repeat, so rows cannot be split).
  int64_t parts = std::max<int64_t>(1, std::min<int64_t>(kernelThreads(), dim / 16));
  parallelBlocks(parts, n * dim / parts, [&](int64_t p) {
    int64_t j0 = p * dim / parts, j1 = (p + 1) * dim / parts;
    for (int64_t i = 0; i < n; i++) {
      float* row = w + int64_t(ids[i]) * dim;
      const float* gr = g + i * dim;
      for (int64_t j = j0; j < j1; j++) row[j] += gr[j];
    }
  });
  W.commit();
}

}  // namespace nt::cpu
