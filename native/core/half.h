// bf16 and f16 bit conversions to and from f32, written once for both backends (__host__ __device__
// under nvcc), so the cpu and cuda kernels store identical bits: round to nearest even, NaN stays NaN,
// f16 subnormals and overflow to infinity.
#pragma once
#include <cstdint>
#include <cstring>

#include "hd.h"

namespace nt {

NT_HD uint32_t floatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
NT_HD float bitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

NT_HD float bf16ToF32(uint16_t h) { return bitsFloat(uint32_t(h) << 16); }

NT_HD uint16_t f32ToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN: quiet, keep the sign
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

NT_HD float f16ToF32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return bitsFloat(sign);
    exp = 127 - 15 + 1;  // subnormal: normalize
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      exp--;
    }
    return bitsFloat(sign | (exp << 23) | ((mant & 0x3ff) << 13));
  }
  if (exp == 31) return bitsFloat(sign | 0x7f800000u | (mant << 13));
  return bitsFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

NT_HD uint16_t f32ToF16(float f) {
  uint32_t u = floatBits(f), sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {                                   // subnormal or zero in f16
    if (absu < 0x33000000u) return uint16_t(sign);
    uint32_t exp = absu >> 23, mant = (absu & 0x7fffffu) | 0x800000u, shift = 126 - exp;
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) half++;
    return uint16_t(sign | half);
  }
  uint32_t rounded = absu + 0xfffu + ((absu >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace nt
