// Fused softmax + cross-entropy over a vocabulary on the cuda backend (native/cpu/kernels/
// cross_entropy.cc is the reference): the forward keeps one log-sum-exp per row instead of the
// probability matrix; the backward recomputes softmax(logits) - onehot(target) on the fly.
#include "softmax.cuh"

namespace nt::cuda {

template <typename T, int W>
__global__ void crossEntropyForwardKernel(const T* logits, const int32_t* targets, float* losses, float* lse, int64_t vocab,
                                          int32_t ignoreIndex) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x;
  const T* row = logits + r * vocab;
  float l = rowLogSumExp<T, W>(row, vocab, scratch);
  if (threadIdx.x == 0) {
    int32_t t = targets[r];
    lse[r] = l;
    // Targets outside [0, vocab) other than ignoreIndex read as NaN loss rather than out of bounds.
    losses[r] = t == ignoreIndex ? 0.0f : (t < 0 || t >= vocab) ? NAN : l - toF32(row[t]);
  }
}

// dloss[r * dlossStride] * scale is row r's loss gradient (stride 0: one gradient of the reduced loss).
template <typename T, typename G, int W>
__global__ void crossEntropyBackwardKernel(const T* logits, const int32_t* targets, const float* lse, const G* dloss,
                                           T* dlogits, int64_t vocab, int32_t ignoreIndex, int64_t dlossStride, float scale) {
  int64_t r = blockIdx.x;
  int32_t t = targets[r];
  float g = t == ignoreIndex ? 0.0f : toF32(dloss[r * dlossStride]) * scale;
  float l = lse[r];
  const T* row = logits + r * vocab;
  T* drow = dlogits + r * vocab;
  for (int64_t j = int64_t(threadIdx.x) * W; j < vocab; j += int64_t(blockDim.x) * W) {
    Pack<T, W> v = loadPack<W>(row, j), out;
#pragma unroll
    for (int k = 0; k < W; k++) {
      float p = expf(toF32(v.v[k]) - l);
      out.v[k] = fromF32<T>(g * (p - (j + k == t ? 1.0f : 0.0f)));
    }
    storePack<W>(drow, j, out);
  }
}

// Launch helpers over [rows, vocab]; true when the kernel ran with 16-byte packs.
template <typename T>
bool launchCrossEntropyForward(cudaStream_t st, const T* logits, const int32_t* targets, float* losses, float* lse, int64_t rows,
                               int64_t vocab, int32_t ignoreIndex) {
  constexpr int N = vecWidth<T>();
  bool vec = rowVectorizable<T>(vocab, {logits});
  if (vec)
    crossEntropyForwardKernel<T, N><<<unsigned(rows), rowThreads(vocab / N), 0, st>>>(logits, targets, losses, lse, vocab, ignoreIndex);
  else
    crossEntropyForwardKernel<T, 1><<<unsigned(rows), rowThreads(vocab), 0, st>>>(logits, targets, losses, lse, vocab, ignoreIndex);
  return vec;
}

template <typename T, typename G>
bool launchCrossEntropyBackward(cudaStream_t st, const T* logits, const int32_t* targets, const float* lse, const G* dloss, T* dlogits,
                                int64_t rows, int64_t vocab, int32_t ignoreIndex, int64_t dlossStride, float scale) {
  constexpr int N = vecWidth<T>();
  bool vec = rowVectorizable<T>(vocab, {logits, dlogits});
  if (vec)
    crossEntropyBackwardKernel<T, G, N><<<unsigned(rows), rowThreads(vocab / N), 0, st>>>(logits, targets, lse, dloss, dlogits, vocab,
                                                                                           ignoreIndex, dlossStride, scale);
  else
    crossEntropyBackwardKernel<T, G, 1><<<unsigned(rows), rowThreads(vocab), 0, st>>>(logits, targets, lse, dloss, dlogits, vocab,
                                                                                           ignoreIndex, dlossStride, scale);
  return vec;
}


// ---- the cpu backend's signatures (lib/ops calls both backends the same way) ----------------------

// cross_entropy_forward(logits, targets: i32, losses: f32 [rows], lse: f32 [rows], rows, vocab, ignoreIndex, dtype)
//   Targets outside the vocabulary give a NaN loss (the cpu kernel throws; a kernel cannot without a sync).
NT_CUDA_KERNEL("cross_entropy_forward", CrossEntropyForwardAbi) {
  int64_t rows = k.args.size("rows"), vocab = k.args.size("vocab"), ignore = k.args.int64("ignoreIndex");
  DType dt = k.args.dtype("dtype");
  if (vocab == 0) fail(Err::Shape, "cross_entropy_forward: empty vocabulary");
  void* x = k.data("logits", dt, rows * vocab);
  int32_t* t = k.data<int32_t>("targets", DType::I32, rows);
  float* loss = k.data<float>("losses", DType::F32, rows);
  float* lse = k.data<float>("lse", DType::F32, rows);
  if (rows == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T, launchCrossEntropyForward<T>(st, static_cast<const T*>(x), t, loss, lse, rows, vocab, int32_t(ignore)));
}

// cross_entropy_backward(logits, targets: i32, lse: f32, gradLoss (1 element, logits' dtype), gradLogits,
//   rows, vocab, ignoreIndex, scale, dtype), and cross_entropy_shard_backward with the same arguments for a
//   vocabulary slice (vocabulary-parallel cross-entropy): lse is over the whole vocabulary and a target outside
//   [0, vocab) belongs to another slice, which the kernel's j == t test already leaves as softmax only.
static void crossEntropyBackward(KernelCall& k, const char* call) {
  int64_t rows = k.args.size("rows"), vocab = k.args.size("vocab"), ignore = k.args.int64("ignoreIndex");
  float scale = float(k.args.number("scale"));
  DType dt = k.args.dtype("dtype");
  void* x = k.data("logits", dt, rows * vocab);
  int32_t* t = k.data<int32_t>("targets", DType::I32, rows);
  float* lse = k.data<float>("lse", DType::F32, rows);
  void* gl = k.data("gradLoss", dt, 1);
  void* gx = k.data("gradLogits", dt, rows * vocab);
  if (rows * vocab == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    (launchCrossEntropyBackward<T, T>(st, static_cast<const T*>(x), t, lse, static_cast<const T*>(gl), static_cast<T*>(gx), rows,
                                                      vocab, int32_t(ignore), 0, scale)));
}
NT_CUDA_KERNEL("cross_entropy_backward", CrossEntropyBackward) { crossEntropyBackward(k, call); }
NT_CUDA_KERNEL("cross_entropy_shard_backward", CrossEntropyShardBackward) { crossEntropyBackward(k, call); }

}  // namespace nt::cuda
