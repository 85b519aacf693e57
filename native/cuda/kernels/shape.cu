// Data movement for shape ops on the cuda backend (the cpu backend's copy_strided): permute/transpose,
// slice/split, cat and slice backward are all one strided copy; bytes are moved as they are.
#include "../../core/arg_lists.h"
#include "common.cuh"

namespace nt::cuda {

template <typename E>
__global__ void copyStridedKernel(const E* src, E* dst, int64_t n, Strides s, int64_t srcOffset, int64_t dstOffset) {
  NT_GRID_STRIDE(i, n) {
    int64_t is, id;
    s.offsets(i, is, id);
    dst[dstOffset + id] = src[srcOffset + is];
  }
}

// copy_strided(src, dst, dtype, shape: Int32Array, srcStrides: Int32Array, srcOffset, dstStrides: Int32Array, dstOffset)
//   dst[dstOffset + Σ idx·dstStrides] = src[srcOffset + Σ idx·srcStrides] for idx over shape (elements).
NT_CUDA_KERNEL("copy_strided", CopyStrided) {
  DType dt = k.args.dtype("dtype");
  std::vector<int64_t> shape = k.args.ints("shape");
  std::vector<int64_t> ss = k.args.ints("srcStrides", int64_t(shape.size()));
  int64_t so = k.args.size("srcOffset");
  std::vector<int64_t> ds = k.args.ints("dstStrides", int64_t(shape.size()));
  int64_t dOff = k.args.size("dstOffset");
  int64_t n = product(shape);
  Strides s = Strides::of(shape, ss, ds, call);
  if (n == 0) return;
  void* src = k.data("src", dt, so + stridedExtent(shape, ss, call));
  void* dst = k.data("dst", dt, dOff + stridedExtent(shape, ds, call));
  cudaStream_t st = k.stream();
  switch (dtypeSize(dt)) {
    case 1: copyStridedKernel<<<gridFor(n), kThreads, 0, st>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n, s, so, dOff); break;
    case 2: copyStridedKernel<<<gridFor(n), kThreads, 0, st>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), n, s, so, dOff); break;
    default: copyStridedKernel<<<gridFor(n), kThreads, 0, st>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), n, s, so, dOff);
  }
}

}  // namespace nt::cuda
