// Dropout on the cuda backend with the shared Philox stream: element i is dropped when
// uniform(seed, baseBlock, i) < p, so the backward (and the cpu backend) regenerate the same mask.
#include "../../core/philox.h"
#include "common.cuh"

namespace nt::cuda {

template <typename T>
__global__ void dropoutKernel(const T* x, T* y, uint8_t* mask, int64_t n, float p, uint64_t seed, uint64_t base) {
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  NT_GRID_STRIDE(i, n) {
    bool keep = philox::uniform(seed, base, uint64_t(i)) >= p;
    if (mask) mask[i] = keep ? 1 : 0;
    y[i] = fromF32<T>(keep ? toF32(x[i]) * scale : 0.0f);
  }
}

// dropout(x, y, mask (u8)|null, dtype, n, p, seedHi, seedLo, baseBlock): y = x * keep / (1 - p).
// The backward is the same call on the output gradient with the same seed and block.
static Napi::Value Dropout(const Napi::CallbackInfo& info) {
  KernelCall k(info, "dropout");
  k.args.count(9);
  DType dt = k.args.dtype(3);
  int64_t n = k.args.size(4);
  float p = float(k.args.number(5));
  if (!(p >= 0.0f && p <= 1.0f)) fail(Err::Argument, "dropout: p must lie in [0, 1]");
  uint64_t seed = (uint64_t(k.args.size(6)) << 32) | uint64_t(k.args.size(7));
  uint64_t base = uint64_t(k.args.size(8));
  void* x = k.data(0, dt, n);
  void* y = k.data(1, dt, n);
  uint8_t* mask = k.optional<uint8_t>(2, DType::U8, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "dropout", T,
                    dropoutKernel<T><<<gridFor(n), kThreads, 0, st>>>(static_cast<const T*>(x), static_cast<T*>(y), mask, n, p,
                                                                      seed, base));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("dropout", Dropout);

}  // namespace nt::cuda
