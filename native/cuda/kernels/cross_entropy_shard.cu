// Backward of a cross-entropy whose vocabulary is split across processes (vocabulary-parallel
// cross-entropy) on the cuda backend; the twin of native/cpu/kernels/cross_entropy_shard.cc.
#include "common.cuh"

namespace nt::cuda {

// One block per row: grad = k·(exp(x − lse) − [j == target]); a target outside [0, vocab) lives in
// another shard (softmax only), a target equal to ignoreIndex zeroes the row.
template <typename T>
__global__ void crossEntropyShardBackwardKernel(const T* logits, const int32_t* targets, const float* lse, const T* gradLoss,
                                                T* gradLogits, int64_t vocab, int32_t ignoreIndex, float scale) {
  int64_t r = blockIdx.x;
  int32_t t = targets[r];
  float k = t == ignoreIndex ? 0.0f : toF32(gradLoss[0]) * scale;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    float p = expf(toF32(logits[r * vocab + j]) - lse[r]);
    gradLogits[r * vocab + j] = fromF32<T>(k * (p - (j == t ? 1.0f : 0.0f)));
  }
}

// cross_entropy_shard_backward(logits, localTargets: i32, lse: f32, gradLoss (1 element, logits' dtype), gradLogits,
//   rows, vocab, ignoreIndex, scale, dtype): see the cpu kernel.
static Napi::Value CrossEntropyShardBackward(const Napi::CallbackInfo& info) {
  const char* call = "cross_entropy_shard_backward";
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
  unsigned threads = vocab >= 1024 ? 1024 : vocab >= 256 ? 256 : 64;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    crossEntropyShardBackwardKernel<T><<<unsigned(rows), threads, 0, st>>>(
                        static_cast<const T*>(x), t, lse, static_cast<const T*>(gl), static_cast<T*>(gx), vocab, int32_t(ignore), scale));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("cross_entropy_shard_backward", CrossEntropyShardBackward);

}  // namespace nt::cuda
