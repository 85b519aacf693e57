// Softmax and log-softmax over the last dimension on the cpu backend.
#include "softmax.h"

namespace nt::cpu {

NT_SIMD_BODY void softmaxRowsBody(const float* x, float* y, int64_t begin, int64_t end, int64_t cols, bool log) {
  for (int64_t r = begin; r < end; r++) softmaxRow(x + r * cols, y + r * cols, cols, log);
}
NT_SIMD(softmaxRows, (const float* x, float* y, int64_t begin, int64_t end, int64_t cols, bool log), (x, y, begin, end, cols, log))

NT_SIMD_BODY void softmaxRowsBackwardBody(const float* y, const float* g, float* gi, int64_t begin, int64_t end, int64_t cols, bool log) {
  for (int64_t r = begin; r < end; r++) softmaxRowBackward(y + r * cols, g + r * cols, gi + r * cols, cols, log);
}
NT_SIMD(softmaxRowsBackward, (const float* y, const float* g, float* gi, int64_t begin, int64_t end, int64_t cols, bool log),
        (y, g, gi, begin, end, cols, log))

// softmax_forward(inp, out, rows, cols, dtype, log): each row of [rows, cols] → (log-)softmax
NT_KERNEL("softmax_forward", SoftmaxForward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  DType dt = a.dtype("dtype");
  bool log = a.boolean("log");
  int64_t n = rows * cols;
  F32View I(a, "inp", dt, n, true), O(a, "out", dt, n, false);
  const float* x = I.data();
  float* o = O.data();
  parallelRows(rows, cols * 4, [&](int64_t b, int64_t e) {
    softmaxRows(x, o, b, e, cols, log);
  });
  O.commit();
}

// softmax_backward(out, gradOut, gradIn, rows, cols, dtype, log): from the forward's output
NT_KERNEL("softmax_backward", SoftmaxBackward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  DType dt = a.dtype("dtype");
  bool log = a.boolean("log");
  int64_t n = rows * cols;
  F32View Y(a, "out", dt, n, true), G(a, "gradOut", dt, n, true);
  F32View O(a, "gradIn", dt, n, false);
  const float *y = Y.data(), *g = G.data();
  float* o = O.data();
  parallelRows(rows, cols * 4, [&](int64_t b, int64_t e) {
    softmaxRowsBackward(y, g, o, b, e, cols, log);
  });
  O.commit();
}

}  // namespace nt::cpu
