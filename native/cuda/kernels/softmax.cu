// Softmax and log-softmax over rows on the cuda backend (native/cpu/kernels/softmax.cc is the
// reference); the shared row pieces are in softmax.cuh.
#include "softmax.cuh"

namespace nt::cuda {

template <typename T, int W>
__global__ void softmaxForwardKernel(const T* x, T* y, int64_t cols, bool logSoftmax) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  T* yr = y + r * cols;
  float lse = rowLogSumExp<T, W>(xr, cols, scratch);
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    Pack<T, W> v = loadPack<W>(xr, j), out;
#pragma unroll
    for (int k = 0; k < W; k++) {
      float d = toF32(v.v[k]) - lse;
      out.v[k] = fromF32<T>(logSoftmax ? d : expf(d));
    }
    storePack<W>(yr, j, out);
  }
}

// Launches softmaxForwardKernel over [rows, cols]; true when it ran with 16-byte packs.
template <typename T>
bool launchSoftmaxForward(cudaStream_t st, const T* x, T* y, int64_t rows, int64_t cols, bool logSoftmax) {
  constexpr int N = vecWidth<T>();
  bool vec = rowVectorizable<T>(cols, {x, y});
  if (vec)
    softmaxForwardKernel<T, N><<<unsigned(rows), rowThreads(cols / N), 0, st>>>(x, y, cols, logSoftmax);
  else
    softmaxForwardKernel<T, 1><<<unsigned(rows), rowThreads(cols), 0, st>>>(x, y, cols, logSoftmax);
  return vec;
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
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T, launchSoftmaxForward<T>(st, static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log));
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
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    launchSoftmaxBackward<T>(st, static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), rows, cols, log));
}

}  // namespace nt::cuda
