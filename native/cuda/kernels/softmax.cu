// Softmax over rows and the fused softmax + cross-entropy on the cuda backend. Cross-entropy keeps
// one log-sum-exp per row instead of the probability matrix; its backward recomputes
// softmax(logits) - onehot(target) on the fly.
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

// softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy)
template <typename T>
__global__ void softmaxBackwardKernel(const T* y, const T* dy, T* dx, int64_t cols, bool logSoftmax) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    s += logSoftmax ? toF32(dy[r * cols + j]) : toF32(dy[r * cols + j]) * toF32(y[r * cols + j]);
  s = blockSum(s, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float yv = toF32(y[r * cols + j]), g = toF32(dy[r * cols + j]);
    dx[r * cols + j] = fromF32<T>(logSoftmax ? g - expf(yv) * s : yv * (g - s));
  }
}

template <typename T>
__global__ void crossEntropyForwardKernel(const T* logits, const int32_t* targets, float* losses, float* lse, int64_t vocab,
                                          int32_t ignoreIndex) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T* row = logits + r * vocab;
  float l = rowLogSumExp(row, vocab, scratch);
  if (threadIdx.x == 0) {
    int32_t t = targets[r];
    lse[r] = l;
    // Targets outside [0, vocab) other than ignoreIndex read as NaN loss rather than out of bounds.
    losses[r] = t == ignoreIndex ? 0.0f : (t < 0 || t >= vocab) ? NAN : l - toF32(row[t]);
  }
}

template <typename T>
__global__ void crossEntropyBackwardKernel(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                                           T* dlogits, int64_t vocab, int32_t ignoreIndex) {
  int64_t r = blockIdx.x;
  int32_t t = targets[r];
  float g = t == ignoreIndex ? 0.0f : dloss[r];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    float p = expf(toF32(logits[r * vocab + j]) - lse[r]);
    dlogits[r * vocab + j] = fromF32<T>(g * (p - (j == t ? 1.0f : 0.0f)));
  }
}

static unsigned rowThreads(int64_t cols) { return cols >= 1024 ? 1024 : cols >= 256 ? 256 : 64; }

// softmaxForward(x, y, dtype, rows, cols, log)
static Napi::Value SoftmaxForward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "softmaxForward");
  k.args.count(6);
  DType dt = k.args.dtype(2);
  int64_t rows = k.args.size(3), cols = k.args.size(4);
  bool logSoftmax = k.args.boolean(5);
  void* x = k.data(0, dt, rows * cols);
  void* y = k.data(1, dt, rows * cols);
  if (rows == 0 || cols == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "softmaxForward", T,
                    softmaxForwardKernel<T><<<unsigned(rows), rowThreads(cols), 0, st>>>(static_cast<const T*>(x),
                                                                                         static_cast<T*>(y), cols, logSoftmax));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("softmaxForward", SoftmaxForward);

// softmaxBackward(y, dy, dx, dtype, rows, cols, log): y is the forward output
static Napi::Value SoftmaxBackward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "softmaxBackward");
  k.args.count(7);
  DType dt = k.args.dtype(3);
  int64_t rows = k.args.size(4), cols = k.args.size(5);
  bool logSoftmax = k.args.boolean(6);
  void* y = k.data(0, dt, rows * cols);
  void* dy = k.data(1, dt, rows * cols);
  void* dx = k.data(2, dt, rows * cols);
  if (rows == 0 || cols == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "softmaxBackward", T,
                    softmaxBackwardKernel<T><<<unsigned(rows), rowThreads(cols), 0, st>>>(
                        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), cols, logSoftmax));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("softmaxBackward", SoftmaxBackward);

// crossEntropyForward(logits, targets (i32), losses (f32 [rows]), lse (f32 [rows]), dtype, rows, vocab, ignoreIndex)
static Napi::Value CrossEntropyForward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "crossEntropyForward");
  k.args.count(8);
  DType dt = k.args.dtype(4);
  int64_t rows = k.args.size(5), vocab = k.args.size(6);
  int32_t ignore = int32_t(k.args.int64(7));
  void* logits = k.data(0, dt, rows * vocab);
  int32_t* targets = k.data<int32_t>(1, DType::I32, rows);
  float* losses = k.data<float>(2, DType::F32, rows);
  float* lse = k.data<float>(3, DType::F32, rows);
  if (rows == 0) return info.Env().Undefined();
  if (vocab == 0) fail(Err::Shape, "crossEntropyForward: vocabulary of size 0");
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "crossEntropyForward", T,
                    crossEntropyForwardKernel<T><<<unsigned(rows), rowThreads(vocab), 0, st>>>(
                        static_cast<const T*>(logits), targets, losses, lse, vocab, ignore));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("crossEntropyForward", CrossEntropyForward);

// crossEntropyBackward(logits, targets, lse, dloss (f32 [rows]), dlogits, dtype, rows, vocab, ignoreIndex)
static Napi::Value CrossEntropyBackward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "crossEntropyBackward");
  k.args.count(9);
  DType dt = k.args.dtype(5);
  int64_t rows = k.args.size(6), vocab = k.args.size(7);
  int32_t ignore = int32_t(k.args.int64(8));
  void* logits = k.data(0, dt, rows * vocab);
  int32_t* targets = k.data<int32_t>(1, DType::I32, rows);
  float* lse = k.data<float>(2, DType::F32, rows);
  float* dloss = k.data<float>(3, DType::F32, rows);
  void* dlogits = k.data(4, dt, rows * vocab);
  if (rows == 0 || vocab == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "crossEntropyBackward", T,
                    crossEntropyBackwardKernel<T><<<unsigned(rows), rowThreads(vocab), 0, st>>>(
                        static_cast<const T*>(logits), targets, lse, dloss, static_cast<T*>(dlogits), vocab, ignore));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("crossEntropyBackward", CrossEntropyBackward);

}  // namespace nt::cuda
