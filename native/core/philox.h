// Philox4x32-10 counter-based generator, shared by the cpu and cuda backends so that both draw the
// same numbers: element e of a draw depends only on (seed, base block, e), never on the device or
// on how the tensor is split across ranks (a shard passes the index of its first element).
#pragma once
#include <cmath>
#include <cstdint>

#include "hd.h"

namespace nt::philox {

struct U4 {
  uint32_t x, y, z, w;
};

NT_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// One 128-bit block of output for the 128-bit counter (block, 0) under the 64-bit key seed.
NT_HD U4 block(uint64_t seed, uint64_t counter) {
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

NT_HD uint32_t lane(const U4& b, unsigned i) { return i == 0 ? b.x : i == 1 ? b.y : i == 2 ? b.z : b.w; }

// A draw starts at block `base` (the generator's offset, counted in blocks so that consecutive
// draws never share a block) and element e of the draw lives in block base + e / perBlock.

// Uniform in [0, 1) with 24 bits, four elements per block.
NT_HD float uniform(uint64_t seed, uint64_t base, uint64_t e) {
  U4 b = block(seed, base + (e >> 2));
  return float(lane(b, unsigned(e & 3)) >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller, two elements per block: element e uses lanes (2(e&1), 2(e&1)+1).
// nvcc contracts products into sums (FMA) by default, and a build with --use_fast_math (the cuda
// backend no longer uses it) would turn logf/cosf/sqrtf into approximations (__logf loses all
// relative accuracy near u1 = 1, i.e. for normals near 0). Device code therefore takes log and cos
// in double rounded once to float, and the IEEE round-to-nearest intrinsics for sqrt and products:
// each step then matches the cpu's float step to within its libm's rounding (<= 1 ulp) whatever the
// flags, so the two streams agree to a few ulp. The host code is unchanged (the cpu stream is the reference).
NT_HD float normal(uint64_t seed, uint64_t base, uint64_t e) {
  U4 b = block(seed, base + (e >> 1));
  unsigned h = unsigned(e & 1) * 2;
  float u1 = (float(lane(b, h) >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1], exact
  float u2 = float(lane(b, h + 1) >> 8) * (1.0f / 16777216.0f);           // [0, 1), exact
#ifdef __CUDA_ARCH__
  float logU1 = float(::log(double(u1)));
  float angle = __fmul_rn(6.283185307179586f, u2);
  float c = float(::cos(double(angle)));
  return __fmul_rn(__fsqrt_rn(__fmul_rn(-2.0f, logU1)), c);
#else
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
#endif
}

}  // namespace nt::philox
