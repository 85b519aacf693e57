// Conversions and simple fills on the cuda backend (cast, fill, arange), with the cpu backend's
// rounding rules (native/cpu/kernels/convert.cc is the reference).
#include <cmath>

#include "common.cuh"

namespace nt::cuda {

// Elements per access of castKernel: 16 bytes of the wider of the two types.
template <typename S, typename D>
__host__ __device__ constexpr int castWidth() { return sizeof(S) > sizeof(D) ? vecWidth<S>() : vecWidth<D>(); }

// vec: src and dst aligned to their packs of castWidth elements; the n % castWidth last elements
// go through the scalar loop.
template <typename S, typename D>
__global__ void castKernel(const S* src, D* dst, int64_t n, bool vec) {
  constexpr int N = castWidth<S, D>();
  int64_t done = 0;
  if (vec) {
    int64_t packs = n / N;
    NT_GRID_STRIDE(i, packs) {
      Pack<S, N> a = reinterpret_cast<const Pack<S, N>*>(src)[i];
      Pack<D, N> o;
#pragma unroll
      for (int k = 0; k < N; k++) o.v[k] = fromF32<D>(toF32(a.v[k]));
      reinterpret_cast<Pack<D, N>*>(dst)[i] = o;
    }
    done = packs * N;
  }
  NT_GRID_STRIDE(t, n - done) dst[done + t] = fromF32<D>(toF32(src[done + t]));
}

// vec: dst 16-byte aligned (whole packs, then the scalar tail).
template <typename W>
__global__ void fillKernel(W* dst, W value, int64_t n, bool vec) {
  constexpr int N = vecWidth<W>();
  int64_t done = 0;
  if (vec) {
    int64_t packs = n / N;
    Pack<W, N> p;
#pragma unroll
    for (int k = 0; k < N; k++) p.v[k] = value;
    NT_GRID_STRIDE(i, packs) reinterpret_cast<Pack<W, N>*>(dst)[i] = p;
    done = packs * N;
  }
  NT_GRID_STRIDE(t, n - done) dst[done + t] = value;
}
template <typename W>
static void launchFill(cudaStream_t s, W* dst, W value, int64_t n) {
  bool vec = alignedTo(dst, 16);
  fillKernel<W><<<gridFor(vec ? (n + vecWidth<W>() - 1) / vecWidth<W>() : n), kThreads, 0, s>>>(dst, value, n, vec);
}

template <typename T>
__global__ void arangeKernel(T* dst, double start, double step, int64_t n) {
  NT_GRID_STRIDE(i, n) dst[i] = fromF32<T>(float(start + double(i) * step));
}
__global__ void arangeI32Kernel(int32_t* dst, double start, double step, int64_t n) {
  NT_GRID_STRIDE(i, n) dst[i] = int32_t(start + double(i) * step);
}

// cast(src, srcDtype, dst, dstDtype, n)
NT_CUDA_KERNEL("cast", Cast) {
  DType st = k.args.dtype("srcDtype"), dt = k.args.dtype("dstDtype");
  int64_t n = k.args.size("n");
  void* src = k.data("src", st, n);
  void* dst = k.data("dst", dt, n);
  if (n == 0) return;
  cudaStream_t s = k.stream();
  if (st == dt) {
    check(cudaMemcpyAsync(dst, src, size_t(n) * dtypeSize(st), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    return;
  }
  NT_DISPATCH_ALL(st, "cast", S, NT_DISPATCH_ALL(dt, "cast", D, {
    constexpr int N = castWidth<S, D>();
    bool vec = alignedTo(src, sizeof(S) * N) && alignedTo(dst, sizeof(D) * N);
    castKernel<S, D><<<gridFor(vec ? (n + N - 1) / N : n), kThreads, 0, s>>>(static_cast<const S*>(src), static_cast<D*>(dst), n, vec);
  }));
}

// fill(storage, dtype, n, value): the value is converted on the host exactly as the cpu fill does.
NT_CUDA_KERNEL("fill", Fill) {
  DType dt = k.args.dtype("dtype");
  int64_t n = k.args.size("n");
  double v = k.args.number("value");
  void* d = k.data("storage", dt, n);
  if (n == 0) return;
  cudaStream_t s = k.stream();
  switch (dt) {
    case DType::F32: {
      float f = float(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      launchFill<uint32_t>(s, static_cast<uint32_t*>(d), bits, n);
      break;
    }
    case DType::I32: {
      float f = float(v);
      int32_t x = std::isnan(f) ? 0 : f <= -2147483648.0f ? INT32_MIN : f >= 2147483648.0f ? INT32_MAX : int32_t(f);
      if (std::fabs(v) < 2147483648.0) x = int32_t(v);
      launchFill<int32_t>(s, static_cast<int32_t*>(d), x, n);
      break;
    }
    case DType::U8: {
      float f = float(v);
      uint8_t x = std::isnan(f) || f <= 0.0f ? 0 : f >= 255.0f ? 255 : uint8_t(f);
      check(cudaMemsetAsync(d, x, size_t(n), s), "cudaMemsetAsync");
      break;
    }
    default: {
      uint16_t h = dt == DType::BF16 ? f32ToBf16(float(v)) : f32ToF16(float(v));
      launchFill<uint16_t>(s, static_cast<uint16_t*>(d), h, n);
    }
  }
}

// arange(storage, dtype, n, start, step): element i = start + i * step, computed in double.
NT_CUDA_KERNEL("arange", Arange) {
  DType dt = k.args.dtype("dtype");
  int64_t n = k.args.size("n");
  double start = k.args.number("start"), step = k.args.number("step");
  void* d = k.data("storage", dt, n);
  if (n == 0) return;
  cudaStream_t s = k.stream();
  if (dt == DType::I32) {
    arangeI32Kernel<<<gridFor(n), kThreads, 0, s>>>(static_cast<int32_t*>(d), start, step, n);
  } else {
    NT_DISPATCH_ALL(dt, "arange", T, arangeKernel<T><<<gridFor(n), kThreads, 0, s>>>(static_cast<T*>(d), start, step, n));
  }
}

}  // namespace nt::cuda
