// Row softmax pieces shared by the softmax, cross-entropy and attention kernel families on the cuda
// backend (as native/cpu/kernels/softmax.h is on the cpu side): a row's log-sum-exp, the softmax
// backward over rows, and the block size for a row length.
#pragma once
#include "common.cuh"

namespace nt::cuda {

// log(sum(exp(row))) over the block, walking the row in packs of W (common.cuh's row kernels).
template <typename T, int W = 1>
__device__ float rowLogSumExp(const T* row, int64_t cols, float* scratch) {
  float mx = -INFINITY;
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    Pack<T, W> v = loadPack<W>(row, j);
#pragma unroll
    for (int k = 0; k < W; k++) mx = fmaxf(mx, toF32(v.v[k]));
  }
  mx = blockMax(mx, scratch);
  float s = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    Pack<T, W> v = loadPack<W>(row, j);
#pragma unroll
    for (int k = 0; k < W; k++) s += expf(toF32(v.v[k]) - mx);
  }
  s = blockSum(s, scratch);
  return mx + logf(s);
}

// softmax: dx = scale * y * (dy - sum(dy * y)); log-softmax: dx = scale * (dy - exp(y) * sum(dy))
template <typename T, int W = 1>
__global__ void softmaxBackwardKernel(const T* y, const T* dy, T* dx, int64_t cols, bool logSoftmax, float scale = 1.0f) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T *yr = y + r * cols, *dyr = dy + r * cols;
  T* dxr = dx + r * cols;
  float s = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    Pack<T, W> yv = loadPack<W>(yr, j), gv = loadPack<W>(dyr, j);
#pragma unroll
    for (int k = 0; k < W; k++) s += logSoftmax ? toF32(gv.v[k]) : toF32(gv.v[k]) * toF32(yv.v[k]);
  }
  s = blockSum(s, scratch);
  for (int64_t j = int64_t(threadIdx.x) * W; j < cols; j += int64_t(blockDim.x) * W) {
    Pack<T, W> yv = loadPack<W>(yr, j), gv = loadPack<W>(dyr, j), out;
#pragma unroll
    for (int k = 0; k < W; k++) {
      float yk = toF32(yv.v[k]), g = toF32(gv.v[k]);
      out.v[k] = fromF32<T>(scale * (logSoftmax ? g - expf(yk) * s : yk * (g - s)));
    }
    storePack<W>(dxr, j, out);
  }
}

// Launches softmaxBackwardKernel over [rows, cols]; true when it ran with 16-byte packs.
template <typename T>
bool launchSoftmaxBackward(cudaStream_t st, const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool logSoftmax, float scale = 1.0f) {
  constexpr int N = vecWidth<T>();
  bool vec = rowVectorizable<T>(cols, {y, dy, dx});
  if (vec)
    softmaxBackwardKernel<T, N><<<unsigned(rows), rowThreads(cols / N), 0, st>>>(y, dy, dx, cols, logSoftmax, scale);
  else
    softmaxBackwardKernel<T, 1><<<unsigned(rows), rowThreads(cols), 0, st>>>(y, dy, dx, cols, logSoftmax, scale);
  return vec;
}

}  // namespace nt::cuda
