// Random fills on the cuda backend from the shared Philox generator (native/core/philox.h): the same
// (seed, block, element) gives the same number as the cpu backend, whatever the launch shape.
#include "../../core/philox.h"
#include "common.cuh"

namespace nt::cuda {

template <typename T>
__global__ void randomKernel(T* out, int64_t n, int kind, uint64_t seed, uint64_t base, uint64_t first, float p0, float p1) {
  NT_GRID_STRIDE(i, n) {
    uint64_t e = first + uint64_t(i);
    float v;
    // Rounded products and sums, as on the cpu: nvcc would otherwise fuse them (FMA, its default).
    if (kind == 0) v = __fadd_rn(p0, __fmul_rn(__fsub_rn(p1, p0), philox::uniform(seed, base, e)));
    else if (kind == 1) v = __fadd_rn(p0, __fmul_rn(p1, philox::normal(seed, base, e)));
    else v = philox::uniform(seed, base, e) < p0 ? 1.0f : 0.0f;
    out[i] = fromF32<T>(v);
  }
}

// random_fill(storage, dtype, n, kind, seedHi, seedLo, baseBlock, firstElement, a, b): see the cpu one.
NT_CUDA_KERNEL("random_fill", RandomFill) {
  DType dt = k.args.dtype("dtype");
  int64_t n = k.args.size("n");
  int64_t kind = k.args.int64("kind");
  uint64_t seed = (uint64_t(k.args.size("seedHi")) << 32) | uint64_t(k.args.size("seedLo"));
  uint64_t base = uint64_t(k.args.size("baseBlock")), first = uint64_t(k.args.size("firstElement"));
  float p0 = float(k.args.number("a")), p1 = float(k.args.number("b"));
  if (kind < 0 || kind > 2) fail(Err::Argument, "random_fill: unknown distribution " + std::to_string(kind));
  void* d = k.data("storage", dt, n);
  if (n == 0) return;
  cudaStream_t s = k.stream();
  NT_DISPATCH_ALL(dt, "random_fill", T,
                  randomKernel<T><<<gridFor(n), kThreads, 0, s>>>(static_cast<T*>(d), n, int(kind), seed, base, first, p0, p1));
}

}  // namespace nt::cuda
