// Layer normalization and RMS normalization over the last dimension on the cpu backend.
// Forward saves per-row statistics (mean, 1/std) in f32 for the backward.
#include "util.h"

namespace nt::cpu {

// One row of LayerNorm: mean and 1/std of x (two passes: centered variance), then
// o = (x − mean)·rstd·w (+ b).
NT_SIMD_BODY void layerNormRowBody(const float* __restrict x, const float* __restrict w, const float* __restrict b,
                                  float* __restrict o, float* mean, float* rstd, int64_t cols, float eps) {
  float m = sumLanes(cols, [&](int64_t j) { return x[j]; }) / float(cols);
  float v = sumLanes(cols, [&](int64_t j) { float d = x[j] - m; return d * d; });
  float rs = 1.0f / std::sqrt(v / float(cols) + eps);
  *mean = m;
  *rstd = rs;
  if (b) for (int64_t j = 0; j < cols; j++) o[j] = (x[j] - m) * rs * w[j] + b[j];
  else for (int64_t j = 0; j < cols; j++) o[j] = (x[j] - m) * rs * w[j];
}
NT_SIMD(layerNormRow, (const float* __restrict x, const float* __restrict w, const float* __restrict b, float* __restrict o, float* mean,
                       float* rstd, int64_t cols, float eps),
        (x, w, b, o, mean, rstd, cols, eps))

NT_SIMD_BODY void addRowBody(const float* __restrict x, const float* __restrict r, float* __restrict s, int64_t cols) {
  for (int64_t j = 0; j < cols; j++) s[j] = x[j] + r[j];
}
NT_SIMD(addRow, (const float* __restrict x, const float* __restrict r, float* __restrict s, int64_t cols), (x, r, s, cols))

// layernorm_forward(x, weight, bias|null, out, mean: f32, rstd: f32, rows, cols, eps, dtype)
//   out = (x − mean)·rstd·weight + bias per row of [rows, cols]
NT_KERNEL("layernorm_forward", LayerNormForward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  float eps = float(a.number("eps"));
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  bool hasBias = a.given("bias");
  F32View X(a, "x", dt, n, true), W(a, "weight", dt, cols, true);
  F32View B(a, "bias", dt, cols, true, hasBias);
  F32View O(a, "out", dt, n, false);
  float* mean = reinterpret_cast<float*>(storageData(info, a.at("mean", "so"), call, DType::F32, rows));
  float* rstd = reinterpret_cast<float*>(storageData(info, a.at("rstd", "so"), call, DType::F32, rows));
  const float *x = X.data(), *w = W.data(), *bb = B.data();
  float* o = O.data();
  parallelRows(rows, cols * 3, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) layerNormRow(x + r * cols, w, hasBias ? bb : nullptr, o + r * cols, mean + r, rstd + r, cols, eps);
  });
  O.commit();
}

// add_layernorm_forward(x, residual, weight, bias|null, sum, out, mean: f32, rstd: f32, rows, cols, eps, dtype)
//   sum = x + residual and out = layerNorm(sum) in one pass over each row (the pre-LayerNorm block's
//   residual add and the next norm): the norm reads the sum as stored, as layernorm_forward would.
NT_KERNEL("add_layernorm_forward", AddLayerNormForward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  float eps = float(a.number("eps"));
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  bool hasBias = a.given("bias");
  F32View X(a, "x", dt, n, true), R(a, "residual", dt, n, true), W(a, "weight", dt, cols, true);
  F32View B(a, "bias", dt, cols, true, hasBias);
  F32View S(a, "sum", dt, n, false), O(a, "out", dt, n, false);
  float* mean = reinterpret_cast<float*>(storageData(info, a.at("mean", "so"), call, DType::F32, rows));
  float* rstd = reinterpret_cast<float*>(storageData(info, a.at("rstd", "so"), call, DType::F32, rows));
  const float *x = X.data(), *res = R.data(), *w = W.data(), *bb = B.data();
  float *sum = S.data(), *o = O.data();
  parallelRows(rows, cols * 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      float* sr = sum + r * cols;
      addRow(x + r * cols, res + r * cols, sr, cols);
      roundThrough(sr, cols, dt);
      layerNormRow(sr, w, hasBias ? bb : nullptr, o + r * cols, mean + r, rstd + r, cols, eps);
    }
  });
  S.commit();
  O.commit();
}

// One row of the norms' backward: dx (see normBackward), and the row's g·x̂ and g added to the
// block's double partials of dW and dB.
NT_SIMD_BODY void normBackwardRowBody(const float* __restrict xr, const float* __restrict gr, const float* __restrict w, float m, float rs,
                                      double* __restrict aw, double* __restrict ab, float* __restrict dxr, int64_t cols, bool centered) {
  float sumGw = sumLanes(cols, [&](int64_t j) { return gr[j] * w[j]; });
  float sumGwX = sumLanes(cols, [&](int64_t j) { return gr[j] * w[j] * ((xr[j] - m) * rs); });
  for (int64_t j = 0; j < cols; j++) {
    float xh = (xr[j] - m) * rs;
    aw[j] += double(gr[j] * xh);
    ab[j] += double(gr[j]);
  }
  float mg = centered ? sumGw / float(cols) : 0.0f, mgx = sumGwX / float(cols);
  for (int64_t j = 0; j < cols; j++) {
    float xh = (xr[j] - m) * rs;
    dxr[j] = rs * (gr[j] * w[j] - mg - xh * mgx);
  }
}
NT_SIMD(normBackwardRow, (const float* __restrict xr, const float* __restrict gr, const float* __restrict w, float m, float rs,
                          double* __restrict aw, double* __restrict ab, float* __restrict dxr, int64_t cols, bool centered),
        (xr, gr, w, m, rs, aw, ab, dxr, cols, centered))

// rmsnorm_forward's row: rstd = 1/√(mean(x²) + eps), o = x·rstd·w.
NT_SIMD_BODY void rmsNormRowBody(const float* __restrict xr, const float* __restrict w, float* __restrict o, float* rstd, int64_t cols,
                                 float eps) {
  float s = sumLanes(cols, [&](int64_t j) { return xr[j] * xr[j]; });
  float rs = 1.0f / std::sqrt(s / float(cols) + eps);
  *rstd = rs;
  for (int64_t j = 0; j < cols; j++) o[j] = xr[j] * rs * w[j];
}
NT_SIMD(rmsNormRow, (const float* __restrict xr, const float* __restrict w, float* __restrict o, float* rstd, int64_t cols, float eps),
        (xr, w, o, rstd, cols, eps))

// Shared backward of both norms: dx = rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂)) (LayerNorm,
// centered) or without the first mean (RMSNorm); dW = Σ_rows g·x̂, dB = Σ_rows g.
static void normBackward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols, bool centered) {
  // dx row by row over the pool; dW and dB from per-block double partials added in block order, so
  // the result is the same on any thread count.
  blockColumnSums<2>(rows, cols, cols * 8, [&](int64_t r, const std::array<double*, 2>& acc) {
    normBackwardRow(x + r * cols, g + r * cols, w, centered ? mean[r] : 0.0f, rstd[r], acc[0], acc[1], dx + r * cols, cols, centered);
  }, {dw, db});
}

// layernorm_backward(x, weight, mean, rstd, gradOut, gradX, gradW, gradB|null, rows, cols, dtype)
//   gradW and gradB are overwritten (not accumulated).
NT_KERNEL("layernorm_backward", LayerNormBackward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  bool hasBias = a.given("gradB");
  F32View X(a, "x", dt, n, true), W(a, "weight", dt, cols, true);
  const float* mean = reinterpret_cast<const float*>(storageData(info, a.at("mean", "so"), call, DType::F32, rows));
  const float* rstd = reinterpret_cast<const float*>(storageData(info, a.at("rstd", "so"), call, DType::F32, rows));
  F32View G(a, "gradOut", dt, n, true), DX(a, "gradX", dt, n, false);
  F32View DW(a, "gradW", dt, cols, false);
  F32View DB(a, "gradB", dt, cols, false, hasBias);
  normBackward(X.data(), W.data(), mean, rstd, G.data(), DX.data(), DW.data(), hasBias ? DB.data() : nullptr, rows, cols, true);
  DX.commit();
  DW.commit();
  DB.commit();
}

// rmsnorm_forward(x, weight, out, rstd: f32, rows, cols, eps, dtype): out = x·rstd·weight,
//   rstd = 1/√(mean(x²) + eps)
NT_KERNEL("rmsnorm_forward", RmsNormForward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  float eps = float(a.number("eps"));
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  F32View X(a, "x", dt, n, true), W(a, "weight", dt, cols, true);
  F32View O(a, "out", dt, n, false);
  float* rstd = reinterpret_cast<float*>(storageData(info, a.at("rstd", "so"), call, DType::F32, rows));
  const float *x = X.data(), *w = W.data();
  float* o = O.data();
  parallelRows(rows, cols * 3, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) rmsNormRow(x + r * cols, w, o + r * cols, rstd + r, cols, eps);
  });
  O.commit();
}

// rmsnorm_backward(x, weight, rstd, gradOut, gradX, gradW, rows, cols, dtype); gradW overwritten
NT_KERNEL("rmsnorm_backward", RmsNormBackward) {
  int64_t rows = a.size("rows"), cols = a.size("cols");
  DType dt = a.dtype("dtype");
  int64_t n = rows * cols;
  F32View X(a, "x", dt, n, true), W(a, "weight", dt, cols, true);
  const float* rstd = reinterpret_cast<const float*>(storageData(info, a.at("rstd", "so"), call, DType::F32, rows));
  F32View G(a, "gradOut", dt, n, true), DX(a, "gradX", dt, n, false);
  F32View DW(a, "gradW", dt, cols, false);
  normBackward(X.data(), W.data(), nullptr, rstd, G.data(), DX.data(), DW.data(), nullptr, rows, cols, false);
  DX.commit();
  DW.commit();
}

}  // namespace nt::cpu
