// GELU (tanh approximation, as GPT-2) on the cpu backend: forward and backward.
#include "util.h"

namespace nt::cpu {

static constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

// tanh through the vectorizable exp: tanh(u) = 1 - 2 / (exp(2u) + 1).
static inline float tanhFast(float u) { return 1.0f - 2.0f / (fastExp(2.0f * u) + 1.0f); }

NT_SIMD_BODY void geluRangeBody(const float* x, float* o, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i++) {
    float v = x[i];
    o[i] = 0.5f * v * (1.0f + tanhFast(kGeluC * (v + 0.044715f * v * v * v)));
  }
}
NT_SIMD(geluRange, (const float* x, float* o, int64_t begin, int64_t end), (x, o, begin, end))

NT_SIMD_BODY void geluBackwardRangeBody(const float* x, const float* g, float* o, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i++) {
    float v = x[i];
    float t = tanhFast(kGeluC * (v + 0.044715f * v * v * v));
    float du = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    o[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}
NT_SIMD(geluBackwardRange, (const float* x, const float* g, float* o, int64_t begin, int64_t end), (x, g, o, begin, end))

// gelu_forward(inp, out, n, dtype): out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
NT_KERNEL("gelu_forward", GeluForward) {
  int64_t n = a.size("n");
  DType dt = a.dtype("dtype");
  F32View I(a, "inp", dt, n, true), O(a, "out", dt, n, false);
  const float* x = I.data();
  float* o = O.data();
  parallelRows(n, 20, [&](int64_t b, int64_t e) { geluRange(x, o, b, e); });
  O.commit();
}

// gelu_backward(inp, gradOut, gradIn, n, dtype): gradIn = gradOut · gelu'(inp)
NT_KERNEL("gelu_backward", GeluBackward) {
  int64_t n = a.size("n");
  DType dt = a.dtype("dtype");
  F32View I(a, "inp", dt, n, true), G(a, "gradOut", dt, n, true);
  F32View O(a, "gradIn", dt, n, false);
  const float *x = I.data(), *g = G.data();
  float* o = O.data();
  parallelRows(n, 30, [&](int64_t b, int64_t e) { geluBackwardRange(x, g, o, b, e); });
  O.commit();
}

// y[j] = gelu(x[j] + b[j]) over one row, x updated to x + b (b may be null).
NT_SIMD_BODY void biasGeluRowBody(float* __restrict x, const float* __restrict b, float* __restrict y, int64_t cols, DType dt) {
  if (b) for (int64_t j = 0; j < cols; j++) x[j] += b[j];
  roundThrough(x, cols, dt);  // gelu reads the pre-activation as stored (what backward reads)
  for (int64_t j = 0; j < cols; j++) {
    float v = x[j];
    y[j] = 0.5f * v * (1.0f + tanhFast(kGeluC * (v + 0.044715f * v * v * v)));
  }
}
NT_SIMD(biasGeluRow, (float* __restrict x, const float* __restrict b, float* __restrict y, int64_t cols, DType dt), (x, b, y, cols, dt))

// bias_gelu_forward(pre, bias|null, out, rows, cols, dtype)
//   pre [rows, cols] (a GEMM's output) += bias per column, in place; out = gelu(pre): the bias add
//   and the activation in one pass (linearGelu's forward after its GEMM).
NT_KERNEL("bias_gelu_forward", BiasGeluForward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  bool hasBias = a.given("bias");
  F32View X(a, "pre", dt, n, true), B(a, "bias", dt, cols, true, hasBias);
  F32View O(a, "out", dt, n, false);
  float *x = X.data(), *o = O.data();
  const float* bb = B.data();
  parallelRows(rows, cols * 24, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) biasGeluRow(x + r * cols, bb, o + r * cols, cols, dt);
  });
  if (hasBias) X.commit();
  O.commit();
}

// gradPre row = gradOut · gelu'(pre), rounded as stored.
NT_SIMD_BODY void geluGradRowBody(const float* __restrict x, const float* __restrict g, float* __restrict o, int64_t cols, DType dt) {
  geluBackwardRangeBody(x, g, o, 0, cols);
  roundThrough(o, cols, dt);
}
NT_SIMD(geluGradRow, (const float* __restrict x, const float* __restrict g, float* __restrict o, int64_t cols, DType dt), (x, g, o, cols, dt))

// bias_gelu_backward(pre, gradOut, gradPre, gradBias|null, rows, cols, dtype)
//   gradPre = gradOut · gelu'(pre); gradBias (overwritten) = Σ_rows gradPre, summed in double over
//   fixed row blocks in a fixed order (the same on any thread count).
NT_KERNEL("bias_gelu_backward", BiasGeluBackward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  bool hasBias = a.given("gradBias");
  F32View X(a, "pre", dt, n, true), G(a, "gradOut", dt, n, true);
  F32View O(a, "gradPre", dt, n, false), DB(a, "gradBias", dt, cols, false, hasBias);
  const float *x = X.data(), *g = G.data();
  float* o = O.data();
  auto row = [&](int64_t r) { geluGradRow(x + r * cols, g + r * cols, o + r * cols, cols, dt); };
  if (hasBias) {
    blockColumnSums<1>(rows, cols, cols * 32, [&](int64_t r, const std::array<double*, 1>& acc) {
      row(r);
      const float* orow = o + r * cols;
      for (int64_t j = 0; j < cols; j++) acc[0][j] += double(orow[j]);
    }, {DB.data()});
  } else {
    parallelRows(rows, cols * 32, [&](int64_t b, int64_t e) { for (int64_t r = b; r < e; r++) row(r); });
  }
  O.commit();
  DB.commit();
}

}  // namespace nt::cpu
