// Layer normalization and RMS normalization over the last dimension on the cpu backend.
// Forward saves per-row statistics (mean, 1/std) in f32 for the backward.
#include "util.h"

namespace nt::cpu {

// layernorm_forward(x, weight, bias|null, out, mean: f32, rstd: f32, rows, cols, eps, dtype)
//   out = (x − mean)·rstd·weight + bias per row of [rows, cols]
NT_KERNEL("layernorm_forward", LayerNormForward) {
  int64_t rows = a.size(6), cols = a.size(7);
  float eps = float(a.number(8));
  DType dt = a.dtype(9);
  int64_t n = rows * cols;
  bool hasBias = !info[2].IsNull() && !info[2].IsUndefined();
  F32View X(info, 0, call, dt, n, true), W(info, 1, call, dt, cols, true);
  F32View B(info, 2, call, dt, cols, true, hasBias);
  F32View O(info, 3, call, dt, n, false);
  float* mean = reinterpret_cast<float*>(storageData(info, 4, call, DType::F32, rows));
  float* rstd = reinterpret_cast<float*>(storageData(info, 5, call, DType::F32, rows));
  const float *x = X.data(), *w = W.data(), *bb = B.data();
  float* o = O.data();
  parallelRows(rows, cols * 3, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      const float* xr = x + r * cols;
      float* orow = o + r * cols;
      float s = 0;
      for (int64_t j = 0; j < cols; j++) s += xr[j];
      float m = s / float(cols);
      float v = 0;
      for (int64_t j = 0; j < cols; j++) { float d = xr[j] - m; v += d * d; }
      float rs = 1.0f / std::sqrt(v / float(cols) + eps);
      mean[r] = m;
      rstd[r] = rs;
      if (hasBias) for (int64_t j = 0; j < cols; j++) orow[j] = (xr[j] - m) * rs * w[j] + bb[j];
      else for (int64_t j = 0; j < cols; j++) orow[j] = (xr[j] - m) * rs * w[j];
    }
  });
  O.commit();
}

// Shared backward of both norms: dx = rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂)) (LayerNorm,
// centered) or without the first mean (RMSNorm); dW = Σ_rows g·x̂, dB = Σ_rows g.
static void normBackward(const float* x, const float* w, const float* mean, const float* rstd, const float* g,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols, bool centered) {
  std::vector<double> accW(static_cast<size_t>(cols), 0.0), accB(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols, *gr = g + r * cols;
    float m = centered ? mean[r] : 0.0f, rs = rstd[r];
    float sumGw = 0, sumGwX = 0;
    for (int64_t j = 0; j < cols; j++) {
      float xh = (xr[j] - m) * rs, gw = gr[j] * w[j];
      sumGw += gw;
      sumGwX += gw * xh;
      accW[size_t(j)] += double(gr[j] * xh);
      accB[size_t(j)] += double(gr[j]);
    }
    float mg = centered ? sumGw / float(cols) : 0.0f, mgx = sumGwX / float(cols);
    float* dxr = dx + r * cols;
    for (int64_t j = 0; j < cols; j++) {
      float xh = (xr[j] - m) * rs;
      dxr[j] = rs * (gr[j] * w[j] - mg - xh * mgx);
    }
  }
  for (int64_t j = 0; j < cols; j++) {
    dw[j] = float(accW[size_t(j)]);
    if (db) db[j] = float(accB[size_t(j)]);
  }
}

// layernorm_backward(x, weight, mean, rstd, gradOut, gradX, gradW, gradB|null, rows, cols, dtype)
//   gradW and gradB are overwritten (not accumulated).
NT_KERNEL("layernorm_backward", LayerNormBackward) {
  int64_t rows = a.size(8), cols = a.size(9);
  DType dt = a.dtype(10);
  int64_t n = rows * cols;
  bool hasBias = !info[7].IsNull() && !info[7].IsUndefined();
  F32View X(info, 0, call, dt, n, true), W(info, 1, call, dt, cols, true);
  const float* mean = reinterpret_cast<const float*>(storageData(info, 2, call, DType::F32, rows));
  const float* rstd = reinterpret_cast<const float*>(storageData(info, 3, call, DType::F32, rows));
  F32View G(info, 4, call, dt, n, true), DX(info, 5, call, dt, n, false);
  F32View DW(info, 6, call, dt, cols, false);
  F32View DB(info, 7, call, dt, cols, false, hasBias);
  normBackward(X.data(), W.data(), mean, rstd, G.data(), DX.data(), DW.data(), hasBias ? DB.data() : nullptr, rows, cols, true);
  DX.commit();
  DW.commit();
  DB.commit();
}

// rmsnorm_forward(x, weight, out, rstd: f32, rows, cols, eps, dtype): out = x·rstd·weight,
//   rstd = 1/√(mean(x²) + eps)
NT_KERNEL("rmsnorm_forward", RmsNormForward) {
  int64_t rows = a.size(4), cols = a.size(5);
  float eps = float(a.number(6));
  DType dt = a.dtype(7);
  int64_t n = rows * cols;
  F32View X(info, 0, call, dt, n, true), W(info, 1, call, dt, cols, true);
  F32View O(info, 2, call, dt, n, false);
  float* rstd = reinterpret_cast<float*>(storageData(info, 3, call, DType::F32, rows));
  const float *x = X.data(), *w = W.data();
  float* o = O.data();
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = x + r * cols;
    float s = 0;
    for (int64_t j = 0; j < cols; j++) s += xr[j] * xr[j];
    float rs = 1.0f / std::sqrt(s / float(cols) + eps);
    rstd[r] = rs;
    for (int64_t j = 0; j < cols; j++) o[r * cols + j] = xr[j] * rs * w[j];
  }
  O.commit();
}

// rmsnorm_backward(x, weight, rstd, gradOut, gradX, gradW, rows, cols, dtype); gradW overwritten
NT_KERNEL("rmsnorm_backward", RmsNormBackward) {
  int64_t rows = a.size(6), cols = a.size(7);
  DType dt = a.dtype(8);
  int64_t n = rows * cols;
  F32View X(info, 0, call, dt, n, true), W(info, 1, call, dt, cols, true);
  const float* rstd = reinterpret_cast<const float*>(storageData(info, 2, call, DType::F32, rows));
  F32View G(info, 3, call, dt, n, true), DX(info, 4, call, dt, n, false);
  F32View DW(info, 5, call, dt, cols, false);
  normBackward(X.data(), W.data(), nullptr, rstd, G.data(), DX.data(), DW.data(), nullptr, rows, cols, false);
  DX.commit();
  DW.commit();
}

}  // namespace nt::cpu
