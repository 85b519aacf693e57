// Data movement for shape ops on the cpu backend: one strided copy serves permute/transpose (src
// strides permuted), slice/split (src offset), cat and slice backward (dst offset and strides).
#include "util.h"

namespace nt::cpu {

// copy_strided(src, dst, dtype, shape: Int32Array, srcStrides: Int32Array, srcOffset, dstStrides: Int32Array, dstOffset)
//   dst[dstOffset + Σ idx·dstStrides] = src[srcOffset + Σ idx·srcStrides] for idx over shape
//   (element offsets and strides; bytes copied as they are, no conversion).
NT_KERNEL("copy_strided", CopyStrided) {
  DType dt = a.dtype("dtype");
  auto shape = a.ints("shape");
  auto ss = a.ints("srcStrides", int64_t(shape.size()));
  int64_t so = a.size("srcOffset");
  auto ds = a.ints("dstStrides", int64_t(shape.size()));
  int64_t dOff = a.size("dstOffset");
  int64_t n = product(shape);
  if (n == 0) return;
  uint8_t* src = storageData(info, a.at("src", "so"), call, dt, so + stridedExtent(shape, ss, call));
  uint8_t* dst = storageData(info, a.at("dst", "so"), call, dt, dOff + stridedExtent(shape, ds, call));
  size_t es = dtypeSize(dt);
  size_t rank = shape.size();
  if (rank == 0) { std::memcpy(dst + dOff * es, src + so * es, es); return; }
  int64_t inner = shape[rank - 1], si = ss[rank - 1], di = ds[rank - 1];
  forEachStridedRow<2>(shape, {&ss, &ds}, {so, dOff}, [&](int64_t, const std::array<int64_t, 2>& off) {
    int64_t offS = off[0], offD = off[1];
    if (si == 1 && di == 1) {
      std::memcpy(dst + offD * es, src + offS * es, size_t(inner) * es);
    } else if (es == 4) {
      const uint32_t* s = reinterpret_cast<const uint32_t*>(src) + offS;
      uint32_t* d = reinterpret_cast<uint32_t*>(dst) + offD;
      for (int64_t j = 0; j < inner; j++) d[j * di] = s[j * si];
    } else {
      for (int64_t j = 0; j < inner; j++) std::memcpy(dst + (offD + j * di) * es, src + (offS + j * si) * es, es);
    }
  });
}

}  // namespace nt::cpu
