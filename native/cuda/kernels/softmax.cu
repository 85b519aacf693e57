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
NT_CUDA_KERNEL("softmax_forward", SoftmaxForwardAbi) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols");
  DType dt = k.args.dtype("dtype");
  bool log = k.args.boolean("log");
  void* x = k.data("inp", dt, rows * cols);
  void* y = k.data("out", dt, rows * cols);
  if (rows * cols == 0) return;
  NT_LAUNCH_FLOAT(k, dt, softmaxForwardKernel, unsigned(rows), rowThreads(cols), static_cast<const T*>(x), static_cast<T*>(y), cols, log);
}

// softmax_backward(out, gradOut, gradIn, rows, cols, dtype, log)
NT_CUDA_KERNEL("softmax_backward", SoftmaxBackwardAbi) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols");
  DType dt = k.args.dtype("dtype");
  bool log = k.args.boolean("log");
  void* y = k.data("out", dt, rows * cols);
  void* dy = k.data("gradOut", dt, rows * cols);
  void* dx = k.data("gradIn", dt, rows * cols);
  if (rows * cols == 0) return;
  NT_LAUNCH_FLOAT(k, dt, softmaxBackwardKernel, unsigned(rows), rowThreads(cols),
                  static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), cols, log);
}

}  // namespace nt::cuda
