// LayerNorm and RMSNorm on the cuda backend (forward and backward; the forward kernel also fuses
// the residual add of add_layernorm_forward), one block per row; statistics in f32. Weight/bias gradients are column sums
// over 64-row blocks added in block order (launchColumnSums, as the cpu backend), so they are deterministic.
#include "common.cuh"

namespace nt::cuda {

// Forward of one row. residual != nullptr: the row is x + residual, also written to `sum`.
// rms: y = x * rstd * w (no mean, no bias), rstd = 1 / sqrt(mean(x^2) + eps).
template <typename T, bool kRms>
__global__ void normForwardKernel(const T* x, const T* residual, T* sum, const T* w, const T* b, T* y, float* mean,
                                  float* rstd, int64_t cols, float eps) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float s = 0.0f, ss = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = toF32(xr[j]);
    if (residual) {
      v += toF32(residual[r * cols + j]);
      sum[r * cols + j] = fromF32<T>(v);
      v = toF32(sum[r * cols + j]);  // normalize what was stored, as the cpu path does
    }
    s += v;
    ss += v * v;
  }
  s = blockSum(s, scratch);
  float m = kRms ? 0.0f : s / float(cols);
  const T* src = residual ? sum : x;
  if (!kRms) {  // a second pass over (x - mean): E[x^2] - mean^2 loses digits when |mean| >> std
    __syncthreads();  // the row sum was written by this block's own threads (fused path)
    ss = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float d = toF32(src[r * cols + j]) - m;
      ss += d * d;
    }
  }
  ss = blockSum(ss, scratch);
  float rs = rsqrtf(ss / float(cols) + eps);
  if (threadIdx.x == 0) {
    if (mean) mean[r] = m;
    rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = (toF32(src[r * cols + j]) - m) * rs;
    if (w) v *= toF32(w[j]);
    if (b) v += toF32(b[j]);
    y[r * cols + j] = fromF32<T>(v);
  }
}

// dx of one row: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (rms: no mean(g) term).
template <typename T, bool kRms>
__global__ void normBackwardKernel(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, int64_t cols) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  float m = kRms ? 0.0f : mean[r], rs = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float g = toF32(dy[r * cols + j]) * (w ? toF32(w[j]) : 1.0f);
    float xh = (toF32(x[r * cols + j]) - m) * rs;
    sg += g;
    sgx += g * xh;
  }
  sg = blockSum(sg, scratch) / float(cols);
  sgx = blockSum(sgx, scratch) / float(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float g = toF32(dy[r * cols + j]) * (w ? toF32(w[j]) : 1.0f);
    float xh = (toF32(x[r * cols + j]) - m) * rs;
    dx[r * cols + j] = fromF32<T>(rs * (g - (kRms ? 0.0f : sg) - xh * sgx));
  }
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

static unsigned rowThreads(int64_t cols) { return cols >= 1024 ? 1024 : cols >= 256 ? 256 : 64; }


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
                    normForwardKernel<T, kRms><<<unsigned(rows), rowThreads(cols), 0, st>>>(
                        static_cast<const T*>(x), nullptr, nullptr, static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(y),
                        mean, rstd, cols, eps));
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
      normBackwardKernel<T, kRms><<<unsigned(rows), rowThreads(cols), 0, st>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), mean, rstd, static_cast<T*>(dx), cols);
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
                    normForwardKernel<T, false><<<unsigned(rows), rowThreads(cols), 0, st>>>(
                        static_cast<const T*>(x), static_cast<const T*>(res), static_cast<T*>(sum), static_cast<const T*>(w),
                        static_cast<const T*>(b), static_cast<T*>(y), mean, rstd, cols, eps));
}

}  // namespace nt::cuda
