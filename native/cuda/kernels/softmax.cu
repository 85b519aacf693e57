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

// dloss[r * dlossStride] * scale is row r's loss gradient (stride 0: one gradient of the reduced loss).
template <typename T, typename G>
__global__ void crossEntropyBackwardKernel(const T* logits, const int32_t* targets, const float* lse, const G* dloss,
                                           T* dlogits, int64_t vocab, int32_t ignoreIndex, int64_t dlossStride, float scale) {
  int64_t r = blockIdx.x;
  int32_t t = targets[r];
  float g = t == ignoreIndex ? 0.0f : toF32(dloss[r * dlossStride]) * scale;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    float p = expf(toF32(logits[r * vocab + j]) - lse[r]);
    dlogits[r * vocab + j] = fromF32<T>(g * (p - (j == t ? 1.0f : 0.0f)));
  }
}

static unsigned rowThreads(int64_t cols) { return cols >= 1024 ? 1024 : cols >= 256 ? 256 : 64; }

// Row r of [batch·tq, tk] scores: query i = r mod tq (aligned to the last tq keys) sees keys [lo, hi);
// probs = softmax(scale · scores) there and 0 elsewhere (rows that see no key are all 0).
template <typename T>
__global__ void attentionSoftmaxKernel(const T* scores, T* probs, int64_t tq, int64_t tk, float scale, bool causal, int64_t window) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x, i = r % tq, shift = tk - tq;
  int64_t hi = causal ? (i + shift + 1 < tk ? i + shift + 1 : tk) : tk;
  int64_t lo = window > 0 && i + shift - window + 1 > 0 ? i + shift - window + 1 : 0;
  const T* x = scores + r * tk;
  T* y = probs + r * tk;
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) mx = fmaxf(mx, toF32(x[j]) * scale);
  mx = blockMax(mx, scratch);
  float s = 0.0f;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) s += expf(toF32(x[j]) * scale - mx);
  s = blockSum(s, scratch);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < tk; j += blockDim.x)
    y[j] = fromF32<T>(j >= lo && j < hi ? expf(toF32(x[j]) * scale - mx) * inv : 0.0f);
}

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
                    crossEntropyBackwardKernel<T, float><<<unsigned(rows), rowThreads(vocab), 0, st>>>(
                        static_cast<const T*>(logits), targets, lse, dloss, static_cast<T*>(dlogits), vocab, ignore, 1, 1.0f));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("crossEntropyBackward", CrossEntropyBackward);

// ---- the cpu backend's signatures (lib/ops calls both backends the same way) ----------------------

// softmax_forward(inp, out, rows, cols, dtype, log)
static Napi::Value SoftmaxForwardAbi(const Napi::CallbackInfo& info) {
  const char* call = "softmax_forward";
  KernelCall k(info, call);
  k.args.count(6);
  int64_t rows = k.args.size(2), cols = k.args.size(3);
  DType dt = k.args.dtype(4);
  bool log = k.args.boolean(5);
  void* x = k.data(0, dt, rows * cols);
  void* y = k.data(1, dt, rows * cols);
  if (rows * cols == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    softmaxForwardKernel<T><<<unsigned(rows), rowThreads(cols), 0, st>>>(static_cast<const T*>(x), static_cast<T*>(y), cols, log));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("softmax_forward", SoftmaxForwardAbi);

// softmax_backward(out, gradOut, gradIn, rows, cols, dtype, log)
static Napi::Value SoftmaxBackwardAbi(const Napi::CallbackInfo& info) {
  const char* call = "softmax_backward";
  KernelCall k(info, call);
  k.args.count(7);
  int64_t rows = k.args.size(3), cols = k.args.size(4);
  DType dt = k.args.dtype(5);
  bool log = k.args.boolean(6);
  void* y = k.data(0, dt, rows * cols);
  void* dy = k.data(1, dt, rows * cols);
  void* dx = k.data(2, dt, rows * cols);
  if (rows * cols == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    softmaxBackwardKernel<T><<<unsigned(rows), rowThreads(cols), 0, st>>>(
                        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), cols, log));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("softmax_backward", SoftmaxBackwardAbi);

// cross_entropy_forward(logits, targets: i32, losses: f32 [rows], lse: f32 [rows], rows, vocab, ignoreIndex, dtype)
//   Targets outside the vocabulary give a NaN loss (the cpu kernel throws; a kernel cannot without a sync).
static Napi::Value CrossEntropyForwardAbi(const Napi::CallbackInfo& info) {
  const char* call = "cross_entropy_forward";
  KernelCall k(info, call);
  k.args.count(8);
  int64_t rows = k.args.size(4), vocab = k.args.size(5), ignore = k.args.int64(6);
  DType dt = k.args.dtype(7);
  if (vocab == 0) fail(Err::Shape, "cross_entropy_forward: empty vocabulary");
  void* x = k.data(0, dt, rows * vocab);
  int32_t* t = k.data<int32_t>(1, DType::I32, rows);
  float* loss = k.data<float>(2, DType::F32, rows);
  float* lse = k.data<float>(3, DType::F32, rows);
  if (rows == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    crossEntropyForwardKernel<T><<<unsigned(rows), rowThreads(vocab), 0, st>>>(static_cast<const T*>(x), t, loss, lse,
                                                                                              vocab, int32_t(ignore)));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("cross_entropy_forward", CrossEntropyForwardAbi);

// cross_entropy_backward(logits, targets: i32, lse: f32, gradLoss (1 element, logits' dtype), gradLogits,
//   rows, vocab, ignoreIndex, scale, dtype), and cross_entropy_shard_backward with the same arguments for a
//   vocabulary slice (vocabulary-parallel cross-entropy): lse is over the whole vocabulary and a target outside
//   [0, vocab) belongs to another slice, which the kernel's j == t test already leaves as softmax only.
static Napi::Value crossEntropyBackwardBody(const Napi::CallbackInfo& info, const char* call) {
  KernelCall k(info, call);
  k.args.count(10);
  int64_t rows = k.args.size(5), vocab = k.args.size(6), ignore = k.args.int64(7);
  float scale = float(k.args.number(8));
  DType dt = k.args.dtype(9);
  void* x = k.data(0, dt, rows * vocab);
  int32_t* t = k.data<int32_t>(1, DType::I32, rows);
  float* lse = k.data<float>(2, DType::F32, rows);
  void* gl = k.data(3, dt, 1);
  void* gx = k.data(4, dt, rows * vocab);
  if (rows * vocab == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    crossEntropyBackwardKernel<T, T><<<unsigned(rows), rowThreads(vocab), 0, st>>>(
                        static_cast<const T*>(x), t, lse, static_cast<const T*>(gl), static_cast<T*>(gx), vocab, int32_t(ignore), 0, scale));
  k.launched();
  return info.Env().Undefined();
}
static Napi::Value CrossEntropyBackwardAbi(const Napi::CallbackInfo& info) { return crossEntropyBackwardBody(info, "cross_entropy_backward"); }
NT_EXPORT("cross_entropy_backward", CrossEntropyBackwardAbi);
static Napi::Value CrossEntropyShardBackward(const Napi::CallbackInfo& info) {
  return crossEntropyBackwardBody(info, "cross_entropy_shard_backward");
}
NT_EXPORT("cross_entropy_shard_backward", CrossEntropyShardBackward);

// attention_softmax_forward(scores, probs, batch, tq, tk, scale, causal, window, dtype): see attentionSoftmaxKernel.
static Napi::Value AttentionSoftmaxForward(const Napi::CallbackInfo& info) {
  const char* call = "attention_softmax_forward";
  KernelCall k(info, call);
  k.args.count(9);
  int64_t batch = k.args.size(2), tq = k.args.size(3), tk = k.args.size(4);
  float scale = float(k.args.number(5));
  bool causal = k.args.boolean(6);
  int64_t window = k.args.size(7);
  DType dt = k.args.dtype(8);
  if (tq > tk && causal) fail(Err::Shape, "attention_softmax_forward: causal attention needs tq <= tk");
  int64_t n = batch * tq * tk;
  void* s = k.data(0, dt, n);
  void* p = k.data(1, dt, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    attentionSoftmaxKernel<T><<<unsigned(batch * tq), rowThreads(tk), 0, st>>>(static_cast<const T*>(s), static_cast<T*>(p),
                                                                                              tq, tk, scale, causal, window));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("attention_softmax_forward", AttentionSoftmaxForward);

// attention_softmax_backward(probs, gradProbs, gradScores, batch, tq, tk, scale, dtype): masked entries (probs 0) get 0.
static Napi::Value AttentionSoftmaxBackward(const Napi::CallbackInfo& info) {
  const char* call = "attention_softmax_backward";
  KernelCall k(info, call);
  k.args.count(8);
  int64_t batch = k.args.size(3), tq = k.args.size(4), tk = k.args.size(5);
  float scale = float(k.args.number(6));
  DType dt = k.args.dtype(7);
  int64_t n = batch * tq * tk;
  void* p = k.data(0, dt, n);
  void* g = k.data(1, dt, n);
  void* o = k.data(2, dt, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    softmaxBackwardKernel<T><<<unsigned(batch * tq), rowThreads(tk), 0, st>>>(
                        static_cast<const T*>(p), static_cast<const T*>(g), static_cast<T*>(o), tk, false, scale));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("attention_softmax_backward", AttentionSoftmaxBackward);

}  // namespace nt::cuda
