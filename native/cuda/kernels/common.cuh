// Shared pieces of the cuda kernel files: element types with the cpu backend's exact rounding
// (bf16/f16 bit conversions from native/core/half.h, so both backends store identical bits), dtype
// dispatch and launch sizes.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
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
// Sum over the warp in a fixed butterfly order, in float or (for the deterministic reductions) double.
template <typename T>
__device__ __forceinline__ T warpSum(T v) {
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

// ---- 16-byte vector access ------------------------------------------------------------------------
// N elements of T loaded or stored as one access of sizeof(T)·N bytes (one 128-bit load/store when
// that is 16). The pointer must be aligned to that size: callers check with alignedTo() at run time
// and fall back to scalar code otherwise.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
// Elements of T in 16 bytes.
template <typename T>
__host__ __device__ constexpr int vecWidth() { return int(16 / sizeof(T)); }
// True for nullptr too (an absent optional input is never read).
inline bool alignedTo(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// ---- row kernels with 16-byte loads (LayerNorm/RMSNorm, softmax, cross-entropy) -------------------
// A row kernel templated on a width W walks its row in packs of W elements: thread t takes packs
// t, t + blockDim.x, ... (W = 1: the scalar kernel, element by element). W = vecWidth<T>() loads and
// stores 16 bytes at a time; it needs every row of every array it touches 16-byte aligned, i.e. the
// base pointers aligned and the row length a multiple of W (rowVectorizable). Sums then run in
// another order than the scalar kernel's (each thread adds W neighbours in turn), so results may
// differ from it in the last bits of f32, deterministically for a given alignment and shape.
template <int W, typename T>
__device__ __forceinline__ Pack<T, W> loadPack(const T* p, int64_t j) {
  return *reinterpret_cast<const Pack<T, W>*>(p + j);
}
template <int W, typename T>
__device__ __forceinline__ void storePack(T* p, int64_t j, const Pack<T, W>& v) {
  *reinterpret_cast<Pack<T, W>*>(p + j) = v;
}

// NODETRON_CUDA_VECTOR=0 (or false/no/off), read once when the addon loads (runtime.cc): the row
// kernels above keep to their scalar form everywhere.
bool rowVectorLoads();

// Whether a row kernel over rows of `cols` elements may run with W = vecWidth<T>() for these
// arrays (null ones are not read): the switch is on, cols is a multiple of the width, and every
// pointer is 16-byte aligned.
template <typename T>
inline bool rowVectorizable(int64_t cols, std::initializer_list<const void*> arrays) {
  if (!rowVectorLoads() || cols % vecWidth<T>() != 0) return false;
  for (const void* p : arrays)
    if (!alignedTo(p, 16)) return false;
  return true;
}

// Threads for a row of `units` (elements or packs): a multiple of 32 for the block reductions.
inline unsigned rowThreads(int64_t units) { return units >= 1024 ? 1024 : units >= 256 ? 256 : 64; }

// out[i] = f(a[i], b[i], c[i]) over n contiguous elements (f takes and returns f32; a null input reads
// as 0). vec: every non-null pointer is 16-byte aligned, so packs of vecWidth<T>() elements are
// loaded and stored whole, and the n % vecWidth<T>() last elements go through the scalar loop. out
// may alias an input (each element is read and written by the same thread).
template <typename T, class F>
__global__ void map3Kernel(F f, const T* a, const T* b, const T* c, T* out, int64_t n, bool vec) {
  constexpr int N = vecWidth<T>();
  using P = Pack<T, N>;
  int64_t done = 0;
  if (vec) {
    int64_t packs = n / N;
    NT_GRID_STRIDE(i, packs) {
      P pa{}, pb{}, pc{}, po;
      if (a) pa = reinterpret_cast<const P*>(a)[i];
      if (b) pb = reinterpret_cast<const P*>(b)[i];
      if (c) pc = reinterpret_cast<const P*>(c)[i];
#pragma unroll
      for (int k = 0; k < N; k++) po.v[k] = fromF32<T>(f(toF32(pa.v[k]), toF32(pb.v[k]), toF32(pc.v[k])));
      reinterpret_cast<P*>(out)[i] = po;
    }
    done = packs * N;
  }
  NT_GRID_STRIDE(t, n - done) {
    int64_t i = done + t;
    out[i] = fromF32<T>(f(a ? toF32(a[i]) : 0.0f, b ? toF32(b[i]) : 0.0f, c ? toF32(c[i]) : 0.0f));
  }
}

// Launches map3Kernel on `st` (vector path when every pointer is 16-byte aligned).
template <typename T, class F>
inline void launchMap3(cudaStream_t st, F f, const T* a, const T* b, const T* c, T* out, int64_t n) {
  if (n <= 0) return;
  bool vec = alignedTo(a, 16) && alignedTo(b, 16) && alignedTo(c, 16) && alignedTo(out, 16);
  int64_t units = vec ? (n + vecWidth<T>() - 1) / vecWidth<T>() : n;
  map3Kernel<T, F><<<gridFor(units), kThreads, 0, st>>>(f, a, b, c, out, n, vec);
}

// ---- deterministic reductions ----------------------------------------------------------------------
// Every sum below is accumulated in double in an order fixed by the shape alone (never by timing or
// atomics), so a result is the same on every run.

// Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed tree; valid in thread 0.
// `scratch` holds 32 doubles; safe to call again in a loop (it syncs before reusing scratch).
__device__ __forceinline__ double blockSumD(double v, double* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) v = warpSum(lane < warps ? scratch[lane] : 0.0);
  return v;
}

// A sum written to its destination: rounded to f32 then to T (the cpu backend's rounding), or kept
// in double.
template <typename T>
__device__ __forceinline__ void storeSum(T* out, double s) { *out = fromF32<T>(float(s)); }
__device__ __forceinline__ void storeSum(double* out, double s) { *out = s; }

// Sums of the rows of a contiguous [rows, cols] array (cols >= 1), or of their squares (kSquare).
// Stage 1: gridDim.x = parts blocks per row, block p summing elements p·blockDim.x + t (t its
// thread) in strides of parts·blockDim.x, then a block tree; parts == 1 stores the row's sum
// directly, else stage 2 (rowPartialsFinalizeKernel) adds the parts of each row in a block tree.
// Rows are walked by blockIdx.y in strides of gridDim.y.
template <typename T, bool kSquare, typename O>
__global__ void rowSumKernel(const T* x, int64_t rows, int64_t cols, double* partial, O* out) {
  __shared__ double scratch[32];
  int64_t parts = gridDim.x, stride = parts * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * cols;
    double acc = 0.0;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += stride) {
      double v = double(toF32(xr[j]));
      acc += kSquare ? v * v : v;
    }
    acc = blockSumD(acc, scratch);
    if (threadIdx.x == 0) {
      if (parts == 1) storeSum(out + r, acc);
      else partial[r * parts + blockIdx.x] = acc;
    }
  }
}
template <typename O>
__global__ void rowPartialsFinalizeKernel(const double* partial, int64_t rows, int64_t parts, O* out) {
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double acc = 0.0;
    for (int64_t p = threadIdx.x; p < parts; p += blockDim.x) acc += partial[r * parts + p];
    acc = blockSumD(acc, scratch);
    if (threadIdx.x == 0) storeSum(out + r, acc);
  }
}

// Launches the row sums of a contiguous [rows, cols] array into out[rows] (cols >= 1) on `st`:
// parts = ceil(cols / (32·threads)) blocks per row (each thread takes about 32 elements; 1 up to
// 8192 columns), at most 1024. The split depends on the shape only.
template <typename T, bool kSquare, typename O>
inline void launchRowSums(int device, cudaStream_t st, const T* x, int64_t rows, int64_t cols, O* out, const char* call) {
  if (rows <= 0 || cols <= 0) return;
  unsigned threads = cols >= 256 ? 256 : 32;
  int64_t parts = (cols + int64_t(threads) * 32 - 1) / (int64_t(threads) * 32);
  parts = parts < 1 ? 1 : parts > 1024 ? 1024 : parts;
  dim3 grid(unsigned(parts), unsigned(rows < 65535 ? rows : 65535));
  if (parts == 1) {
    rowSumKernel<T, kSquare, O><<<grid, threads, 0, st>>>(x, rows, cols, nullptr, out);
    return;
  }
  DeviceScratch partial(device, size_t(rows * parts) * sizeof(double), call);
  rowSumKernel<T, kSquare, O><<<grid, threads, 0, st>>>(x, rows, cols, partial.as<double>(), out);
  rowPartialsFinalizeKernel<O><<<unsigned(rows < 65535 ? rows : 65535), 256, 0, st>>>(partial.as<double>(), rows, parts, out);
}

// Rows per block of the column sums, as the cpu backend's blockColumnSums (native/cpu/kernels/util.h):
// each block's partial is the double sum of its rows' f32 contributions in row order, and the partials
// are added in block order, so both backends add the same terms in the same order (up to the grouping
// of very tall inputs, below).
constexpr int64_t kSumBlockRows = 64;
// At most this many groups of row blocks: a column's partials of more blocks than this are first added
// in order by one thread per group (scratch stays at most kMaxRowGroups·S·cols doubles).
constexpr int64_t kMaxRowGroups = 1024;

// Stage 1 of S column sums over a [rows, cols] view: thread (column c, group g) computes, for each
// row block of its group in order, the block's partial (f.add(col, r, acc) adds row r's
// contributions to acc[0..S)) and adds it to the group's double sum, stored at
// partial[(k·groups + g)·cols + c]. f.column(c) gives the per-column state `col`.
template <int S, class F>
__global__ void columnPartialKernel(F f, int64_t rows, int64_t cols, int64_t blocksPerGroup, int64_t groups, double* partial) {
  int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  auto col = f.column(c);
  for (int64_t g = blockIdx.y; g < groups; g += gridDim.y) {
    double group[S];
#pragma unroll
    for (int k = 0; k < S; k++) group[k] = 0.0;
    for (int64_t blk = g * blocksPerGroup; blk < (g + 1) * blocksPerGroup; blk++) {
      int64_t r0 = blk * kSumBlockRows, r1 = r0 + kSumBlockRows < rows ? r0 + kSumBlockRows : rows;
      if (r0 >= r1) break;
      double acc[S];
#pragma unroll
      for (int k = 0; k < S; k++) acc[k] = 0.0;
      for (int64_t r = r0; r < r1; r++) f.add(col, r, acc);
#pragma unroll
      for (int k = 0; k < S; k++) group[k] += acc[k];
    }
#pragma unroll
    for (int k = 0; k < S; k++) partial[(k * groups + g) * cols + c] = group[k];
  }
}
// Stage 2: out_k[c] = Σ_g partial[(k·groups + g)·cols + c] in group order (out_k null: skipped).
template <int S, typename O>
__global__ void columnFinalizeKernel(const double* partial, int64_t groups, int64_t cols, O* out0, O* out1) {
  NT_GRID_STRIDE(c, cols) {
#pragma unroll
    for (int k = 0; k < S; k++) {
      O* o = k == 0 ? out0 : out1;
      if (!o) continue;
      double s = 0.0;
      for (int64_t g = 0; g < groups; g++) s += partial[(k * groups + g) * cols + c];
      storeSum(o + c, s);
    }
  }
}

// Launches S (1 or 2) column sums of a [rows, cols] view on `st` into out0/out1 (cols elements each;
// null ones skipped); rows == 0 writes zeros. Scratch comes from the caching allocator (stream-ordered).
template <int S, class F, typename O>
inline void launchColumnSums(int device, cudaStream_t st, F f, int64_t rows, int64_t cols, O* out0, O* out1, const char* call) {
  static_assert(S == 1 || S == 2, "one or two column sums");
  if (cols <= 0 || (!out0 && !out1)) return;
  if (rows <= 0) {
    if (out0) check(cudaMemsetAsync(out0, 0, size_t(cols) * sizeof(O), st), "cudaMemsetAsync");
    if (S == 2 && out1) check(cudaMemsetAsync(out1, 0, size_t(cols) * sizeof(O), st), "cudaMemsetAsync");
    return;
  }
  int64_t blocks = (rows + kSumBlockRows - 1) / kSumBlockRows;
  int64_t blocksPerGroup = (blocks + kMaxRowGroups - 1) / kMaxRowGroups;
  int64_t groups = (blocks + blocksPerGroup - 1) / blocksPerGroup;
  DeviceScratch partial(device, size_t(S * groups * cols) * sizeof(double), call);
  unsigned threads = cols >= 256 ? 256 : unsigned((cols + 31) / 32 * 32);
  dim3 grid(unsigned((cols + threads - 1) / threads), unsigned(groups));
  columnPartialKernel<S, F><<<grid, threads, 0, st>>>(f, rows, cols, blocksPerGroup, groups, partial.as<double>());
  columnFinalizeKernel<S, O><<<gridFor(cols), kThreads, 0, st>>>(partial.as<double>(), groups, cols, out0, out1);
}

// dst[i] = src[i] rounded to T (f32 accumulators written back in a tensor's dtype).
template <typename T>
__global__ void storeF32Kernel(const float* src, T* dst, int64_t n) {
  NT_GRID_STRIDE(i, n) dst[i] = fromF32<T>(src[i]);
}

}  // namespace nt::cuda
