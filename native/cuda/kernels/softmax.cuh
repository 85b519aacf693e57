// Row softmax pieces shared by the softmax, cross-entropy and attention kernel families on the cuda
// backend (as native/cpu/kernels/softmax.h is on the cpu side): a row's log-sum-exp, the softmax
// backward over rows, and the block size for a row length.
#pragma once
#include "common.cuh"

namespace nt::cuda {

template <typename T>
__device__ float rowLogSumExp(const T* row, int64_t cols, float* scratch) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, toF32(row[j]));
  mx = blockMax(mx, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(toF32(row[j]) - mx);
  s = blockSum(s, scratch);
  return mx + logf(s);
}

// softmax: dx = scale * y * (dy - sum(dy * y)); log-softmax: dx = scale * (dy - exp(y) * sum(dy))
template <typename T>
__global__ void softmaxBackwardKernel(const T* y, const T* dy, T* dx, int64_t cols, bool logSoftmax, float scale = 1.0f) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    s += logSoftmax ? toF32(dy[r * cols + j]) : toF32(dy[r * cols + j]) * toF32(y[r * cols + j]);
  s = blockSum(s, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float yv = toF32(y[r * cols + j]), g = toF32(dy[r * cols + j]);
    dx[r * cols + j] = fromF32<T>(scale * (logSoftmax ? g - expf(yv) * s : yv * (g - s)));
  }
}

inline unsigned rowThreads(int64_t cols) { return cols >= 1024 ? 1024 : cols >= 256 ? 256 : 64; }

}  // namespace nt::cuda
