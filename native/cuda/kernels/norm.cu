// LayerNorm and RMSNorm on the cuda backend (forward and backward; the forward kernel also fuses
// the residual add of add_layernorm_forward), one block per row; statistics in f32. Weight/bias gradients are column sums
// over 64-row blocks added in block order (launchColumnSums, as the cpu backend), so they are deterministic.
#include "common.cuh"

namespace nt::cuda {

// Forward of one row, walked in packs of W (common.cuh's row kernels). residual != nullptr: the row
// is x + residual, also written to `sum`. rms: y = x * rstd * w (no mean, no bias),
// rstd = 1 / sqrt(mean(x^2) + eps).
template <typename T, bool kRms, int W>
__global__ void normForwardKernel(const T* x, const T* residual, T* sum, const T* w, const T* b, T* y, float* mean,
                                  float* rstd, int64_t cols, float eps) {
  using P = Pack<T, W>;
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float s = 0.0f, ss = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    P v = loadPack<W>(xr, j);
    if (residual) {
      P rv = loadPack<W>(residual + r * cols, j);
#pragma unroll
      for (int k = 0; k < W; k++) v.v[k] = fromF32<T>(toF32(v.v[k]) + toF32(rv.v[k]));
      storePack<W>(sum + r * cols, j, v);  // normalize what was stored, as the cpu path does
    }
#pragma unroll
    for (int k = 0; k < W; k++) {
      float f = toF32(v.v[k]);
      s += f;
      ss += f * f;
    }
  }
  s = blockSum(s, scratch);
  float m = kRms ? 0.0f : s / float(cols);
  const T* src = (residual ? sum : x) + r * cols;
  if (!kRms) {  // a second pass over (x - mean): E[x^2] - mean^2 loses digits when |mean| >> std
    __syncthreads();  // the row sum was written by this block's own threads (fused path)
    ss = 0.0f;
    for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
      P v = loadPack<W>(src, j);
#pragma unroll
      for (int k = 0; k < W; k++) {
        float d = toF32(v.v[k]) - m;
        ss += d * d;
      }
    }
  }
  ss = blockSum(ss, scratch);
  float rs = rsqrtf(ss / float(cols) + eps);
  if (threadIdx.x == 0) {
    if (mean) mean[r] = m;
    rstd[r] = rs;
  }
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    P v = loadPack<W>(src, j), wv{}, bv{}, out;
    if (w) wv = loadPack<W>(w, j);
    if (b) bv = loadPack<W>(b, j);
#pragma unroll
    for (int k = 0; k < W; k++) {
      float o = (toF32(v.v[k]) - m) * rs;
      if (w) o *= toF32(wv.v[k]);
      if (b) o += toF32(bv.v[k]);
      out.v[k] = fromF32<T>(o);
    }
    storePack<W>(y + r * cols, j, out);
  }
}

// dx of one row: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (rms: no mean(g) term).
template <typename T, bool kRms, int W>
__global__ void normBackwardKernel(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, int64_t cols) {
  using P = Pack<T, W>;
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T *dyr = dy + r * cols, *xr = x + r * cols;
  float m = kRms ? 0.0f : mean[r], rs = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    P gv = loadPack<W>(dyr, j), xv = loadPack<W>(xr, j), wv{};
    if (w) wv = loadPack<W>(w, j);
#pragma unroll
    for (int k = 0; k < W; k++) {
      float g = toF32(gv.v[k]) * (w ? toF32(wv.v[k]) : 1.0f);
      float xh = (toF32(xv.v[k]) - m) * rs;
      sg += g;
      sgx += g * xh;
    }
  }
  sg = blockSum(sg, scratch) / float(cols);
  sgx = blockSum(sgx, scratch) / float(cols);
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    P gv = loadPack<W>(dyr, j), xv = loadPack<W>(xr, j), wv{}, out;
    if (w) wv = loadPack<W>(w, j);
#pragma unroll
    for (int k = 0; k < W; k++) {
      float g = toF32(gv.v[k]) * (w ? toF32(wv.v[k]) : 1.0f);
      float xh = (toF32(xv.v[k]) - m) * rs;
      out.v[k] = fromF32<T>(rs * (g - (kRms ? 0.0f : sg) - xh * sgx));
    }
    storePack<W>(dx + r * cols, j, out);
  }
}

// Launch helpers over [rows, cols]; true when the kernel ran with 16-byte packs.
template <typename T, bool kRms>
bool launchNormForward(cudaStream_t st, const T* x, const T* residual, T* sum, const T* w, const T* b, T* y, float* mean, float* rstd,
                       int64_t rows, int64_t cols, float eps) {
  constexpr int N = vecWidth<T>();
  bool vec = rowVectorizable<T>(cols, {x, residual, sum, w, b, y});
  if (vec)
    normForwardKernel<T, kRms, N><<<unsigned(rows), rowThreads(cols / N), 0, st>>>(x, residual, sum, w, b, y, mean, rstd, cols, eps);
  else
    normForwardKernel<T, kRms, 1><<<unsigned(rows), rowThreads(cols), 0, st>>>(x, residual, sum, w, b, y, mean, rstd, cols, eps);
  return vec;
}

template <typename T, bool kRms>
bool launchNormBackward(cudaStream_t st, const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, int64_t rows,
                        int64_t cols) {
  constexpr int N = vecWidth<T>();
  bool vec = rowVectorizable<T>(cols, {dy, x, w, dx});
  if (vec)
    normBackwardKernel<T, kRms, N><<<unsigned(rows), rowThreads(cols / N), 0, st>>>(dy, x, w, mean, rstd, dx, cols);
  else
    normBackwardKernel<T, kRms, 1><<<unsigned(rows), rowThreads(cols), 0, st>>>(dy, x, w, mean, rstd, dx, cols);
  return vec;
}

// Row r's contributions to dW[j] (dy·x̂, x̂ computed as the cpu kernel does) and dB[j] (dy), summed
// over rows by launchColumnSums (common.cuh) in the cpu backend's 64-row blocks.
template <typename T, bool kRms>
struct NormParamRows {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ __forceinline__ int64_t column(int64_t c) const { return c; }
  __device__ __forceinline__ void add(int64_t j, int64_t r, double* acc) const {
    float g = toF32(dy[r * cols + j]);
    float xh = (toF32(x[r * cols + j]) - (kRms ? 0.0f : mean[r])) * rstd[r];
    acc[0] += double(g * xh);
    acc[1] += double(g);
  }
};



// ---- the cpu backend's signatures (lib/ops calls both backends the same way) ----------------------

// layernorm_forward(x, weight, bias|null, out, mean: f32, rstd: f32, rows, cols, eps, dtype) and
// rmsnorm_forward(x, weight, out, rstd: f32, rows, cols, eps, dtype)
template <bool kRms>
static void normForward(KernelCall& k, const char* call) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols"), n = rows * cols;
  float eps = float(k.args.number("eps"));
  DType dt = k.args.dtype("dtype");
  void* x = k.data("x", dt, n);
  void* w = k.data("weight", dt, cols);
  void* b = kRms ? nullptr : k.optional("bias", dt, cols);
  void* y = k.data("out", dt, n);
  float* mean = kRms ? nullptr : k.data<float>("mean", DType::F32, rows);
  float* rstd = k.data<float>("rstd", DType::F32, rows);
  if (rows == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    (launchNormForward<T, kRms>(st, static_cast<const T*>(x), nullptr, nullptr, static_cast<const T*>(w),
                                                static_cast<const T*>(b), static_cast<T*>(y), mean, rstd, rows, cols, eps)));
}
NT_CUDA_KERNEL("layernorm_forward", LayernormForward) { normForward<false>(k, call); }
NT_CUDA_KERNEL("rmsnorm_forward", RmsnormForward) { normForward<true>(k, call); }

// layernorm_backward(x, weight, mean, rstd, gradOut, gradX, gradW, gradB|null, rows, cols, dtype) and
// rmsnorm_backward(x, weight, rstd, gradOut, gradX, gradW, rows, cols, dtype); gradW/gradB overwritten.
template <bool kRms>
static void normBackward(KernelCall& k, const char* call) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols"), n = rows * cols;
  DType dt = k.args.dtype("dtype");
  void* x = k.data("x", dt, n);
  void* w = k.data("weight", dt, cols);
  float* mean = kRms ? nullptr : k.data<float>("mean", DType::F32, rows);
  float* rstd = k.data<float>("rstd", DType::F32, rows);
  void* dy = k.data("gradOut", dt, n);
  void* dx = k.data("gradX", dt, n);
  void* dw = k.data("gradW", dt, cols);
  void* db = kRms ? nullptr : k.optional("gradB", dt, cols);
  if (cols == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T, {
    if (rows > 0)
      launchNormBackward<T, kRms>(st, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), mean, rstd,
                                  static_cast<T*>(dx), rows, cols);
    launchColumnSums<2>(k.device(), st, NormParamRows<T, kRms>{static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, cols},
                        rows, cols, static_cast<T*>(dw), static_cast<T*>(db), call);
  });
}
NT_CUDA_KERNEL("layernorm_backward", LayernormBackward) { normBackward<false>(k, call); }
NT_CUDA_KERNEL("rmsnorm_backward", RmsnormBackward) { normBackward<true>(k, call); }

// add_layernorm_forward(x, residual, weight, bias|null, sum, out, mean: f32, rstd: f32, rows, cols, eps, dtype):
// sum = x + residual and out = layerNorm(sum) by the forward kernel's fused residual path.
NT_CUDA_KERNEL("add_layernorm_forward", AddLayernormForwardAbi) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols"), n = rows * cols;
  float eps = float(k.args.number("eps"));
  DType dt = k.args.dtype("dtype");
  void* x = k.data("x", dt, n);
  void* res = k.data("residual", dt, n);
  void* w = k.data("weight", dt, cols);
  void* b = k.optional("bias", dt, cols);
  void* sum = k.data("sum", dt, n);
  void* y = k.data("out", dt, n);
  float* mean = k.data<float>("mean", DType::F32, rows);
  float* rstd = k.data<float>("rstd", DType::F32, rows);
  if (rows == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    (launchNormForward<T, false>(st, static_cast<const T*>(x), static_cast<const T*>(res), static_cast<T*>(sum),
                                                 static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(y), mean, rstd, rows,
                                                 cols, eps)));
}

}  // namespace nt::cuda
