// Softmax and log-softmax over rows on the cuda backend (native/cpu/kernels/softmax.cc is the
// reference); the shared row pieces are in softmax.cuh.
#include "softmax.cuh"

namespace nt::cuda {

template <typename T>
__global__ void softmaxForwardKernel(const T* x, T* y, int64_t cols, bool logSoftmax) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  float lse = rowLogSumExp(x + r * cols, cols, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = toF32(x[r * cols + j]) - lse;
    y[r * cols + j] = fromF32<T>(logSoftmax ? v : expf(v));
  }
}


// ---- the cpu backend's signatures (lib/ops calls both backends the same way) ----------------------

// softmax_forward(inp, out, rows, cols, dtype, log)
static Napi::Value SoftmaxForwardAbi(const Napi::CallbackInfo& info) {
  const char* call = "softmax_forward";
  KernelCall k(info, call);
  int64_t rows = k.args.size(2), cols = k.args.size(3);
  DType dt = k.args.dtype(4);
  bool log = k.args.boolean(5);
  void* x = k.data(0, dt, rows * cols);
  void* y = k.data(1, dt, rows * cols);
  if (rows * cols == 0) return info.Env().Undefined();
  NT_LAUNCH_FLOAT(k, dt, softmaxForwardKernel, unsigned(rows), rowThreads(cols), static_cast<const T*>(x), static_cast<T*>(y), cols, log);
  return info.Env().Undefined();
}
NT_EXPORT("softmax_forward", SoftmaxForwardAbi);

// softmax_backward(out, gradOut, gradIn, rows, cols, dtype, log)
static Napi::Value SoftmaxBackwardAbi(const Napi::CallbackInfo& info) {
  const char* call = "softmax_backward";
  KernelCall k(info, call);
  int64_t rows = k.args.size(3), cols = k.args.size(4);
  DType dt = k.args.dtype(5);
  bool log = k.args.boolean(6);
  void* y = k.data(0, dt, rows * cols);
  void* dy = k.data(1, dt, rows * cols);
  void* dx = k.data(2, dt, rows * cols);
  if (rows * cols == 0) return info.Env().Undefined();
  NT_LAUNCH_FLOAT(k, dt, softmaxBackwardKernel, unsigned(rows), rowThreads(cols),
                  static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), cols, log);
  return info.Env().Undefined();
}
NT_EXPORT("softmax_backward", SoftmaxBackwardAbi);

}  // namespace nt::cuda
