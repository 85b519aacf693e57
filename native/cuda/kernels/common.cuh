// Shared pieces of the cuda kernel files: element types with the cpu backend's exact rounding
// (bf16/f16 bit conversions from native/core/half.h, so both backends store identical bits), dtype
// dispatch and launch sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../runtime.h"

namespace nt::cuda {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

__device__ __forceinline__ float toF32(float v) { return v; }
__device__ __forceinline__ float toF32(int32_t v) { return float(v); }
__device__ __forceinline__ float toF32(uint8_t v) { return float(v); }
__device__ __forceinline__ float toF32(bf16 v) { return ::nt::bf16ToF32(v.bits); }
__device__ __forceinline__ float toF32(f16 v) { return ::nt::f16ToF32(v.bits); }

template <typename T>
__device__ __forceinline__ T fromF32(float v);
template <>
__device__ __forceinline__ float fromF32<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 fromF32<bf16>(float f) { return bf16{::nt::f32ToBf16(f)}; }
template <>
__device__ __forceinline__ f16 fromF32<f16>(float f) { return f16{::nt::f32ToF16(f)}; }
template <>
__device__ __forceinline__ int32_t fromF32<int32_t>(float v) {  // toward zero, saturated, NaN -> 0
  if (v != v) return 0;
  if (v <= -2147483648.0f) return INT32_MIN;
  if (v >= 2147483648.0f) return INT32_MAX;
  return int32_t(v);
}
template <>
__device__ __forceinline__ uint8_t fromF32<uint8_t>(float v) {
  if (v != v || v <= 0.0f) return 0;
  if (v >= 255.0f) return 255;
  return uint8_t(v);
}

// Runs `body` with T bound to the storage type of a floating dtype (f32, bf16, f16).
#define NT_DISPATCH_FLOAT(dtype, call, T, ...)                                                              \
  switch (dtype) {                                                                                         \
    case ::nt::DType::F32: { using T = float; __VA_ARGS__; break; }                                        \
    case ::nt::DType::BF16: { using T = ::nt::cuda::bf16; __VA_ARGS__; break; }                            \
    case ::nt::DType::F16: { using T = ::nt::cuda::f16; __VA_ARGS__; break; }                              \
    default: ::nt::fail(::nt::Err::DType, std::string(call) + ": dtype " + ::nt::dtypeName(dtype) +        \
                                              " is not supported (f32, bf16, f16)");                       \
  }

// Like NT_DISPATCH_FLOAT, plus i32 and u8.
#define NT_DISPATCH_ALL(dtype, call, T, ...)                                                                \
  switch (dtype) {                                                                                         \
    case ::nt::DType::F32: { using T = float; __VA_ARGS__; break; }                                        \
    case ::nt::DType::BF16: { using T = ::nt::cuda::bf16; __VA_ARGS__; break; }                            \
    case ::nt::DType::F16: { using T = ::nt::cuda::f16; __VA_ARGS__; break; }                              \
    case ::nt::DType::I32: { using T = int32_t; __VA_ARGS__; break; }                                      \
    case ::nt::DType::U8: { using T = uint8_t; __VA_ARGS__; break; }                                       \
  }

// A row-major walk over up to 8 dimensions with two sets of element strides (a kernel argument).
constexpr int kMaxDims = 8;
struct Strides {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t a[kMaxDims];
  int64_t b[kMaxDims];

  static Strides of(const std::vector<int64_t>& shape, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb,
                    const char* call) {
    if (shape.size() > size_t(kMaxDims)) fail(Err::Shape, std::string(call) + ": at most 8 dimensions");
    Strides s{int(shape.size()), {}, {}, {}};
    for (size_t d = 0; d < shape.size(); d++) {
      s.shape[d] = shape[d];
      s.a[d] = sa[d];
      s.b[d] = sb[d];
    }
    return s;
  }
  // Element offsets of row-major index i under both stride sets.
  __device__ __forceinline__ void offsets(int64_t i, int64_t& ia, int64_t& ib) const {
    ia = 0;
    ib = 0;
    for (int d = ndim - 1; d >= 0; d--) {
      int64_t c = i % shape[d];
      i /= shape[d];
      ia += c * a[d];
      ib += c * b[d];
    }
  }
};

// Device memory for a call's intermediate results, freed stream-ordered when the call returns
// (the allocator hands it out again only to later work on the same stream).
class DeviceScratch {
 public:
  DeviceScratch(int device, size_t bytes, const char* call) : device_(device), ptr_(deviceAlloc(device, bytes, call)) {}
  ~DeviceScratch() { deviceFree(device_, ptr_); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  int device_;
  void* ptr_;
};

constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n elements (capped: each thread then takes several elements).
inline unsigned gridFor(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

#define NT_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// The launch most kernel bindings end with: on the KernelCall's current stream, `kernel<T>` over
// grid x threads with T bound to dt's storage type (f32, bf16, f16; the arguments may name T), then the
// launch checked (a failure names the call).
#define NT_LAUNCH_FLOAT(k, dt, kernel, grid, threads, ...)                                  \
  do {                                                                                        \
    cudaStream_t ntLaunchStream = (k).stream();                                               \
    NT_DISPATCH_FLOAT(dt, (k).name(), T, kernel<T><<<grid, threads, 0, ntLaunchStream>>>(__VA_ARGS__)); \
    (k).launched();                                                                           \
  } while (0)

// Warp and block sums/maxes for row kernels (block size a multiple of 32, at most 1024).
__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float blockSum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warpSum(v);
}
__device__ __forceinline__ float blockMax(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warpMax(v);
}

// dst[i] = src[i] rounded to T (f32 accumulators written back in a tensor's dtype).
template <typename T>
__global__ void storeF32Kernel(const float* src, T* dst, int64_t n) {
  NT_GRID_STRIDE(i, n) dst[i] = fromF32<T>(src[i]);
}

}  // namespace nt::cuda
