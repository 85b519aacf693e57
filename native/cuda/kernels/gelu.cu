// Bias + GELU (tanh approximation, as GPT-2 uses) on the cuda backend: forward y = gelu(x + bias)
// and backward dx = dy * gelu'(x + bias); bias is per column of a [rows, cols] view and optional.
#include "common.cuh"

namespace nt::cuda {

__device__ __forceinline__ float geluTanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float geluTanhGrad(float x) {
  const float c = 0.7978845608028654f;
  float u = c * (x + 0.044715f * x * x * x), t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename T>
__global__ void geluForwardKernel(const T* x, const T* bias, T* y, int64_t n, int64_t cols) {
  NT_GRID_STRIDE(i, n) {
    float v = toF32(x[i]) + (bias ? toF32(bias[i % cols]) : 0.0f);
    y[i] = fromF32<T>(geluTanh(v));
  }
}
template <typename T>
__global__ void geluBackwardKernel(const T* dy, const T* x, const T* bias, T* dx, int64_t n, int64_t cols) {
  NT_GRID_STRIDE(i, n) {
    float v = toF32(x[i]) + (bias ? toF32(bias[i % cols]) : 0.0f);
    dx[i] = fromF32<T>(toF32(dy[i]) * geluTanhGrad(v));
  }
}


// gelu_forward(inp, out, n, dtype) and gelu_backward(inp, gradOut, gradIn, n, dtype): the cpu
// backend's signatures (no bias) over the same kernels.
static Napi::Value GeluForwardAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "gelu_forward");
  int64_t n = k.args.size(2);
  DType dt = k.args.dtype(3);
  void* x = k.data(0, dt, n);
  void* y = k.data(1, dt, n);
  if (n == 0) return info.Env().Undefined();
  NT_LAUNCH_FLOAT(k, dt, geluForwardKernel, gridFor(n), kThreads, static_cast<const T*>(x), nullptr, static_cast<T*>(y), n, 1);
  return info.Env().Undefined();
}
NT_EXPORT("gelu_forward", GeluForwardAbi);

static Napi::Value GeluBackwardAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "gelu_backward");
  int64_t n = k.args.size(3);
  DType dt = k.args.dtype(4);
  void* x = k.data(0, dt, n);
  void* dy = k.data(1, dt, n);
  void* dx = k.data(2, dt, n);
  if (n == 0) return info.Env().Undefined();
  NT_LAUNCH_FLOAT(k, dt, geluBackwardKernel, gridFor(n), kThreads,
                  static_cast<const T*>(dy), static_cast<const T*>(x), nullptr, static_cast<T*>(dx), n, 1);
  return info.Env().Undefined();
}
NT_EXPORT("gelu_backward", GeluBackwardAbi);

// pre += bias per column (stored in pre's dtype), out = gelu(pre as stored).
template <typename T>
__global__ void biasGeluForwardKernel(T* pre, const T* bias, T* y, int64_t n, int64_t cols) {
  NT_GRID_STRIDE(i, n) {
    float v = toF32(pre[i]);
    if (bias) {
      T stored = fromF32<T>(v + toF32(bias[i % cols]));
      pre[i] = stored;
      v = toF32(stored);
    }
    y[i] = fromF32<T>(geluTanh(v));
  }
}

// gradBias[j] = Σ_rows gradPre[r, j] (one thread per column, rows in order: deterministic).
template <typename T>
__global__ void columnSumKernel(const T* g, T* out, int64_t rows, int64_t cols) {
  NT_GRID_STRIDE(j, cols) {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s += toF32(g[r * cols + j]);
    out[j] = fromF32<T>(s);
  }
}

// bias_gelu_forward(pre, bias|null, out, rows, cols, dtype): pre += bias in place, out = gelu(pre).
static Napi::Value BiasGeluForwardAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "bias_gelu_forward");
  int64_t rows = k.args.size(3), cols = k.args.size(4), n = rows * cols;
  DType dt = k.args.dtype(5);
  void* pre = k.data(0, dt, n);
  void* bias = k.optional(1, dt, cols);
  void* y = k.data(2, dt, n);
  if (n == 0) return info.Env().Undefined();
  NT_LAUNCH_FLOAT(k, dt, biasGeluForwardKernel, gridFor(n), kThreads, static_cast<T*>(pre), static_cast<const T*>(bias),
                  static_cast<T*>(y), n, cols);
  return info.Env().Undefined();
}
NT_EXPORT("bias_gelu_forward", BiasGeluForwardAbi);

// bias_gelu_backward(pre, gradOut, gradPre, gradBias|null, rows, cols, dtype): gradPre = gradOut · gelu'(pre),
// gradBias (overwritten) = column sums of gradPre as stored.
static Napi::Value BiasGeluBackwardAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "bias_gelu_backward");
  int64_t rows = k.args.size(4), cols = k.args.size(5), n = rows * cols;
  DType dt = k.args.dtype(6);
  void* pre = k.data(0, dt, n);
  void* dy = k.data(1, dt, n);
  void* dpre = k.data(2, dt, n);
  void* dbias = k.optional(3, dt, cols);
  if (cols == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "bias_gelu_backward", T, {
    if (n > 0)
      geluBackwardKernel<T><<<gridFor(n), kThreads, 0, st>>>(static_cast<const T*>(dy), static_cast<const T*>(pre), nullptr,
                                                            static_cast<T*>(dpre), n, cols);
    if (dbias) columnSumKernel<T><<<gridFor(cols), kThreads, 0, st>>>(static_cast<const T*>(dpre), static_cast<T*>(dbias), rows, cols);
  });
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("bias_gelu_backward", BiasGeluBackwardAbi);

}  // namespace nt::cuda
