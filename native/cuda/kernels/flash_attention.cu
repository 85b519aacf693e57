// Flash attention on the cuda backend (FlashAttention-2's algorithm; native/cpu/kernels/flash_attention.cc
// is the reference): softmax(scale·q·kᵀ + mask)·v without the T×T scores, q/k/v/out read and written
// through strided head layouts (native/core/attention_layout.h), the per-row log-sum-exp saved for
// backward, f32 accumulation for every storage dtype.
//
// bf16/f16 at head dims 64 and 128 run on tensor cores (flashForwardTcKernel, flashBackwardKVTcKernel,
// flashBackwardQTcKernel: nvcuda::wmma 16×16×16 fragments, f32 accumulators; NODETRON_FLASH_SIMT=1
// forces the SIMT kernels instead). The rest (f32, other head dims up to 256) is one SIMT path: a block
// of kWarps warps owns kLocal rows of one (batch, head) (kRowsPerWarp per warp, each row's D values
// spread over the lanes, D/32 per lane, in registers) and walks tiles of kRemote rows of the other side
// staged in shared memory as f32. Each (row, remote row) dot product is a warp sum. Forward: local =
// queries, remote = keys/values, online softmax one key at a time. Backward (the FA2 split, no atomics,
// deterministic): delta_i = Σ dO·O first; then local = keys (dK, dV accumulated over the queries that
// see them) and a second pass with local = queries (dQ over keys).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdlib>

#include "../../core/attention_layout.h"
#include "common.cuh"

namespace nt::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kLocal = kWarps * kRowsPerWarp;
constexpr int kRemote = 16;
constexpr int kMaxDim = 256;

struct Flash {
  int64_t B, H, tq, tk;
  int D;
  float scale;
  AttentionMask mask;
  HeadLayout q, k, v, o;
};

// Rows [t0, t0 + rows) of head (b, h) under L into dst f32 [kRemote, D] (zeros past `rows`).
template <typename T>
__device__ __forceinline__ void loadTile(const T* base, const HeadLayout& L, int64_t b, int64_t h, int64_t t0, int rows, int D, float* dst) {
  for (int e = threadIdx.x; e < kRemote * D; e += blockDim.x) {
    int r = e / D, d = e - r * D;
    dst[e] = r < rows ? toF32(base[L.at(b, h, t0 + r) + d]) : 0.0f;
  }
}

// This lane's values (d = lane + 32·c) of row t of head (b, h), 0 past D or for t outside [0, T).
template <typename T, int C>
__device__ __forceinline__ void loadRow(const T* base, const HeadLayout& L, int64_t b, int64_t h, int64_t t, int64_t T_, int D, float (&out)[C]) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; c++) {
    int d = lane + 32 * c;
    out[c] = t < T_ && d < D ? toF32(base[L.at(b, h, t) + d]) : 0.0f;
  }
}

template <typename T, int C>
__device__ __forceinline__ void storeRow(T* base, const HeadLayout& L, int64_t b, int64_t h, int64_t t, int D, const float (&x)[C], float mul) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; c++) {
    int d = lane + 32 * c;
    if (d < D) base[L.at(b, h, t) + d] = fromF32<T>(x[c] * mul);
  }
}

// Σ_d a[d]·row[d] over the warp (every lane gets it); a holds this lane's values, row is in shared memory.
template <int C>
__device__ __forceinline__ float warpDot(const float (&a)[C], const float* row, int D) {
  int lane = threadIdx.x & 31;
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < C; c++) {
    int d = lane + 32 * c;
    if (d < D) s += a[c] * row[d];
  }
  return warpSum(s);
}

template <int C>
__device__ __forceinline__ void axpy(float (&acc)[C], float alpha, const float* row, int D) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; c++) {
    int d = lane + 32 * c;
    if (d < D) acc[c] += alpha * row[d];
  }
}

// Forward: block = kLocal queries of one (batch, head); grid = B·H·tiles.
template <typename T, int C>
__global__ void __launch_bounds__(kWarps * 32) flashForwardKernel(const T* q, const T* k, const T* v, T* o, float* lse, Flash p, int64_t tiles) {
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = smem + kRemote * p.D;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t bh = blockIdx.x / tiles, b = bh / p.H, h = bh % p.H;
  int64_t r0 = (blockIdx.x % tiles) * kLocal;
  float qr[kRowsPerWarp][C], acc[kRowsPerWarp][C], m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    int64_t i = r0 + warp * kRowsPerWarp + r;
    loadRow<T, C>(q, p.q, b, h, i, p.tq, p.D, qr[r]);
#pragma unroll
    for (int c = 0; c < C; c++) acc[r][c] = 0.0f;
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  int64_t last = (r0 + kLocal < p.tq ? r0 + kLocal : p.tq) - 1;
  int64_t jlo = p.mask.lo(r0), jhi = p.mask.hi(last);
  for (int64_t j0 = jlo; j0 < jhi; j0 += kRemote) {
    int n = int(jhi - j0 < kRemote ? jhi - j0 : kRemote);
    __syncthreads();
    loadTile(k, p.k, b, h, j0, n, p.D, Ks);
    loadTile(v, p.v, b, h, j0, n, p.D, Vs);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      int64_t i = r0 + warp * kRowsPerWarp + r;
      if (i >= p.tq) continue;  // uniform over the warp
      int64_t lo = p.mask.lo(i), hi = p.mask.hi(i);
      int a = int(lo > j0 ? lo - j0 : 0), e = int(hi < j0 + n ? hi - j0 : n);
      for (int jj = a; jj < e; jj++) {
        float s = warpDot<C>(qr[r], Ks + jj * p.D, p.D) * p.scale;
        float mNew = fmaxf(m[r], s);
        float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mNew);
        float pj = expf(s - mNew);
        l[r] = l[r] * corr + pj;
#pragma unroll
        for (int c = 0; c < C; c++) acc[r][c] *= corr;
        axpy<C>(acc[r], pj, Vs + jj * p.D, p.D);
        m[r] = mNew;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    int64_t i = r0 + warp * kRowsPerWarp + r;
    if (i >= p.tq) continue;
    storeRow<T, C>(o, p.o, b, h, i, p.D, acc[r], l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    if (lane == 0) lse[bh * p.tq + i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// delta[bh, i] = Σ_d dO·O: one warp per row.
template <typename T>
__global__ void flashDeltaKernel(const T* o, const T* go, float* delta, Flash p) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.B * p.H * p.tq) return;
  int64_t bh = row / p.tq, i = row % p.tq, b = bh / p.H, h = bh % p.H;
  const T* orow = o + p.o.at(b, h, i);
  const T* grow = go + p.o.at(b, h, i);
  float s = 0.0f;
  for (int d = lane; d < p.D; d += 32) s += toF32(orow[d]) * toF32(grow[d]);
  s = warpSum(s);
  if (lane == 0) delta[row] = s;
}

// dK, dV: block = kLocal keys of one (batch, head), over the query tiles that see any of them.
template <typename T, int C>
__global__ void __launch_bounds__(kWarps * 32) flashBackwardKVKernel(const T* q, const T* k, const T* v, const T* go, const float* lse,
                                                                     const float* delta, T* gk, T* gv, Flash p, int64_t tiles) {
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Gs = smem + kRemote * p.D;
  float* Ls = Gs + kRemote * p.D;
  float* Ds = Ls + kRemote;
  int warp = threadIdx.x >> 5;
  int64_t bh = blockIdx.x / tiles, b = bh / p.H, h = bh % p.H;
  int64_t j0 = (blockIdx.x % tiles) * kLocal;
  float kr[kRowsPerWarp][C], vr[kRowsPerWarp][C], dk[kRowsPerWarp][C], dv[kRowsPerWarp][C];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    int64_t j = j0 + warp * kRowsPerWarp + r;
    loadRow<T, C>(k, p.k, b, h, j, p.tk, p.D, kr[r]);
    loadRow<T, C>(v, p.v, b, h, j, p.tk, p.D, vr[r]);
#pragma unroll
    for (int c = 0; c < C; c++) dk[r][c] = dv[r][c] = 0.0f;
  }
  int64_t shift = p.tk - p.tq, jEnd = j0 + kLocal < p.tk ? j0 + kLocal : p.tk;
  // Queries that see a key of [j0, jEnd): hi(i) > j0 and lo(i) < jEnd.
  int64_t iBegin = p.mask.causal && j0 - shift > 0 ? j0 - shift : 0;
  int64_t iEnd = p.tq;
  if (p.mask.window > 0) {
    int64_t e = jEnd - shift + p.mask.window - 1;
    iEnd = e < 0 ? 0 : e < p.tq ? e : p.tq;
  }
  for (int64_t i0 = iBegin; i0 < iEnd; i0 += kRemote) {
    int n = int(iEnd - i0 < kRemote ? iEnd - i0 : kRemote);
    __syncthreads();
    loadTile(q, p.q, b, h, i0, n, p.D, Qs);
    loadTile(go, p.o, b, h, i0, n, p.D, Gs);
    if (threadIdx.x < kRemote) {
      Ls[threadIdx.x] = int(threadIdx.x) < n ? lse[bh * p.tq + i0 + threadIdx.x] : -INFINITY;
      Ds[threadIdx.x] = int(threadIdx.x) < n ? delta[bh * p.tq + i0 + threadIdx.x] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      int64_t j = j0 + warp * kRowsPerWarp + r;
      if (j >= p.tk) continue;
      for (int ii = 0; ii < n; ii++) {
        int64_t i = i0 + ii;
        float L = Ls[ii];
        if (j < p.mask.lo(i) || j >= p.mask.hi(i) || L == -INFINITY) continue;
        float pj = expf(warpDot<C>(kr[r], Qs + ii * p.D, p.D) * p.scale - L);
        float dp = warpDot<C>(vr[r], Gs + ii * p.D, p.D);
        float ds = pj * (dp - Ds[ii]) * p.scale;
        axpy<C>(dv[r], pj, Gs + ii * p.D, p.D);
        axpy<C>(dk[r], ds, Qs + ii * p.D, p.D);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    int64_t j = j0 + warp * kRowsPerWarp + r;
    if (j >= p.tk) continue;
    storeRow<T, C>(gk, p.k, b, h, j, p.D, dk[r], 1.0f);
    storeRow<T, C>(gv, p.v, b, h, j, p.D, dv[r], 1.0f);
  }
}

// dQ: block = kLocal queries of one (batch, head), over the keys they see.
template <typename T, int C>
__global__ void __launch_bounds__(kWarps * 32) flashBackwardQKernel(const T* q, const T* k, const T* v, const T* go, const float* lse,
                                                                    const float* delta, T* gq, Flash p, int64_t tiles) {
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = smem + kRemote * p.D;
  int warp = threadIdx.x >> 5;
  int64_t bh = blockIdx.x / tiles, b = bh / p.H, h = bh % p.H;
  int64_t r0 = (blockIdx.x % tiles) * kLocal;
  float qr[kRowsPerWarp][C], gr[kRowsPerWarp][C], dq[kRowsPerWarp][C], L[kRowsPerWarp], Dl[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    int64_t i = r0 + warp * kRowsPerWarp + r;
    loadRow<T, C>(q, p.q, b, h, i, p.tq, p.D, qr[r]);
    loadRow<T, C>(go, p.o, b, h, i, p.tq, p.D, gr[r]);
#pragma unroll
    for (int c = 0; c < C; c++) dq[r][c] = 0.0f;
    L[r] = i < p.tq ? lse[bh * p.tq + i] : -INFINITY;
    Dl[r] = i < p.tq ? delta[bh * p.tq + i] : 0.0f;
  }
  int64_t last = (r0 + kLocal < p.tq ? r0 + kLocal : p.tq) - 1;
  int64_t jlo = p.mask.lo(r0), jhi = p.mask.hi(last);
  for (int64_t j0 = jlo; j0 < jhi; j0 += kRemote) {
    int n = int(jhi - j0 < kRemote ? jhi - j0 : kRemote);
    __syncthreads();
    loadTile(k, p.k, b, h, j0, n, p.D, Ks);
    loadTile(v, p.v, b, h, j0, n, p.D, Vs);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      int64_t i = r0 + warp * kRowsPerWarp + r;
      if (i >= p.tq || L[r] == -INFINITY) continue;
      int64_t lo = p.mask.lo(i), hi = p.mask.hi(i);
      int a = int(lo > j0 ? lo - j0 : 0), e = int(hi < j0 + n ? hi - j0 : n);
      for (int jj = a; jj < e; jj++) {
        float pj = expf(warpDot<C>(qr[r], Ks + jj * p.D, p.D) * p.scale - L[r]);
        float dp = warpDot<C>(gr[r], Vs + jj * p.D, p.D);
        axpy<C>(dq[r], pj * (dp - Dl[r]) * p.scale, Ks + jj * p.D, p.D);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    int64_t i = r0 + warp * kRowsPerWarp + r;
    if (i < p.tq) storeRow<T, C>(gq, p.q, b, h, i, p.D, dq[r], 1.0f);
  }
}

// Runs body with the compile-time chunk count C = ceil(D / 32) rounded up to 1, 2, 4 or 8.
#define NT_FLASH_CHUNKS(D, call, C, ...)                                                                         \
  do {                                                                                                           \
    if ((D) <= 32) { constexpr int C = 1; __VA_ARGS__; }                                                         \
    else if ((D) <= 64) { constexpr int C = 2; __VA_ARGS__; }                                                    \
    else if ((D) <= 128) { constexpr int C = 4; __VA_ARGS__; }                                                   \
    else if ((D) <= kMaxDim) { constexpr int C = 8; __VA_ARGS__; }                                               \
    else fail(Err::Shape, std::string(call) + ": head dim " + std::to_string(D) + " is not supported on cuda (at most 256)"); \
  } while (0)

Flash flashOf(const FlashProblem& fp) {
  return Flash{fp.B, fp.H, fp.tq, fp.tk, int(fp.D), fp.scale, fp.mask, fp.q, fp.k, fp.v, fp.o};
}

unsigned gridOf(int64_t blocks, const char* call) {
  if (blocks > int64_t(0x7fffffff)) fail(Err::Shape, std::string(call) + ": too many blocks");
  return unsigned(blocks);
}


// ---- tensor-core forward (bf16/f16, D = 64 or 128) -------------------------------------------------
// A block of kTcWarps warps owns 16 queries per warp; key tiles of kTcKeys rows of K and V are staged in
// shared memory in the storage type. Per tile each warp computes S = Q·Kᵀ [16, 64] with wmma into f32
// shared memory, updates its rows' running max and sum (one lane per row; the probabilities are rounded
// to the storage type for the P·V product, and the sum adds the rounded values, so the output is an
// exact weighted mean of v under the weights used), rescales its f32 output rows and adds P·V with wmma.
template <typename T>
struct MmaType;
template <>
struct MmaType<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct MmaType<f16> {
  using type = __half;
};

template <typename M>
__device__ __forceinline__ M mmaOf(float f);
template <>
__device__ __forceinline__ __nv_bfloat16 mmaOf<__nv_bfloat16>(float f) { return __float2bfloat16(f); }
template <>
__device__ __forceinline__ __half mmaOf<__half>(float f) { return __float2half(f); }
__device__ __forceinline__ float mmaToF32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float mmaToF32(__half x) { return __half2float(x); }

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcKeys = 64;

template <int D>
constexpr size_t tcSharedBytes() {
  return size_t(3 * kTcRows * D) * 2 + size_t(kTcWarps * 16 * kTcKeys) * 2 + size_t(kTcWarps * 16 * kTcKeys) * 4 + size_t(kTcWarps * 16 * D) * 4 +
         size_t(3 * kTcRows) * 4;
}

// Rows [t0, t0 + rows) of head (b, h) as raw 16-bit values into dst [kTcRows, D] (zeros past `rows`).
template <typename T, int D>
__device__ __forceinline__ void loadTileBits(const T* base, const HeadLayout& L, int64_t b, int64_t h, int64_t t0, int rows, uint16_t* dst) {
  for (int e = threadIdx.x; e < kTcRows * D; e += blockDim.x) {
    int r = e / D, d = e - r * D;
    dst[e] = r < rows ? base[L.at(b, h, t0 + r) + d].bits : uint16_t(0);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcWarps * 32) flashForwardTcKernel(const T* q, const T* k, const T* v, T* o, float* lse, Flash p, int64_t tiles) {
  using namespace nvcuda;
  using M = typename MmaType<T>::type;
  static_assert(kTcKeys == kTcRows, "one tile loader for queries and keys");
  extern __shared__ __align__(128) unsigned char flashTcSmem[];
  M* Qs = reinterpret_cast<M*>(flashTcSmem);  // [kTcRows, D]
  M* Ks = Qs + kTcRows * D;                   // [kTcKeys, D]
  M* Vs = Ks + kTcKeys * D;                   // [kTcKeys, D]
  M* Ps = Vs + kTcKeys * D;                   // per warp [16, kTcKeys]
  float* Ss = reinterpret_cast<float*>(Ps + kTcWarps * 16 * kTcKeys);  // per warp [16, kTcKeys]
  float* Os = Ss + kTcWarps * 16 * kTcKeys;                            // per warp [16, D]
  float* Ms = Os + kTcWarps * 16 * D;                                  // [kTcRows] running max
  float* Ls = Ms + kTcRows;                                            // [kTcRows] running sum
  float* As = Ls + kTcRows;                                            // [kTcRows] this tile's rescale factor
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t bh = blockIdx.x / tiles, b = bh / p.H, h = bh % p.H;
  int64_t r0 = (blockIdx.x % tiles) * kTcRows;
  int qRows = int(p.tq - r0 < kTcRows ? p.tq - r0 : kTcRows);
  loadTileBits<T, D>(q, p.q, b, h, r0, qRows, reinterpret_cast<uint16_t*>(Qs));
  M* Pw = Ps + warp * 16 * kTcKeys;
  float* Sw = Ss + warp * 16 * kTcKeys;
  float* Ow = Os + warp * 16 * D;
  for (int e = lane; e < 16 * D; e += 32) Ow[e] = 0.0f;
  if (lane < 16) {
    Ms[warp * 16 + lane] = -INFINITY;
    Ls[warp * 16 + lane] = 0.0f;
  }
  int64_t jlo = p.mask.lo(r0), jhi = p.mask.hi(r0 + qRows - 1);
  for (int64_t j0 = jlo; j0 < jhi; j0 += kTcKeys) {
    int n = int(jhi - j0 < kTcKeys ? jhi - j0 : kTcKeys);
    __syncthreads();  // the previous tile's K and V are no longer read (and Q is loaded)
    loadTileBits<T, D>(k, p.k, b, h, j0, n, reinterpret_cast<uint16_t*>(Ks));
    loadTileBits<T, D>(v, p.v, b, h, j0, n, reinterpret_cast<uint16_t*>(Vs));
    __syncthreads();
    // S = Q_w · Kᵀ (K stored [key, d] row-major is Kᵀ column-major).
#pragma unroll
    for (int nb = 0; nb < kTcKeys / 16; nb++) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, Qs + warp * 16 * D + kk * 16, D);
        wmma::load_matrix_sync(fb, Ks + nb * 16 * D + kk * 16, D);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(Sw + nb * 16, c, kTcKeys, wmma::mem_row_major);
    }
    __syncwarp();
    if (lane < 16) {
      int row = warp * 16 + lane;
      int64_t i = r0 + row;
      float* srow = Sw + lane * kTcKeys;
      M* prow = Pw + lane * kTcKeys;
      float alpha = 1.0f;
      int a = 0, e = 0;
      if (i < p.tq) {
        int64_t lo = p.mask.lo(i), hi = p.mask.hi(i);
        a = int(lo > j0 ? (lo - j0 < n ? lo - j0 : n) : 0);
        e = int(hi > j0 ? (hi - j0 < n ? hi - j0 : n) : 0);
        if (e < a) e = a;
      }
      float mx = -INFINITY;
      for (int c = a; c < e; c++) mx = fmaxf(mx, srow[c] * p.scale);
      float mOld = Ms[row], mNew = fmaxf(mOld, mx);
      if (mNew == -INFINITY) {
        for (int c = 0; c < kTcKeys; c++) prow[c] = mmaOf<M>(0.0f);
      } else {
        alpha = mOld == -INFINITY ? 0.0f : expf(mOld - mNew);
        float sum = 0.0f;
        for (int c = 0; c < kTcKeys; c++) {
          M pc = mmaOf<M>(c >= a && c < e ? expf(srow[c] * p.scale - mNew) : 0.0f);
          prow[c] = pc;
          sum += mmaToF32(pc);
        }
        Ls[row] = Ls[row] * alpha + sum;
        Ms[row] = mNew;
      }
      As[row] = alpha;
    }
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32) Ow[e] *= As[warp * 16 + e / D];
    __syncwarp();
    // O_w += P_w · V.
#pragma unroll
    for (int db = 0; db < D / 16; db++) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::load_matrix_sync(c, Ow + db * 16, D, wmma::mem_row_major);
#pragma unroll
      for (int kb = 0; kb < kTcKeys / 16; kb++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, Pw + kb * 16, kTcKeys);
        wmma::load_matrix_sync(fb, Vs + kb * 16 * D + db * 16, D);
        wmma::mma_sync(c, fa, fb, c);
      }
      wmma::store_matrix_sync(Ow + db * 16, c, D, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  for (int e = lane; e < 16 * D; e += 32) {
    int r = e / D, d = e - r * D;
    int64_t i = r0 + warp * 16 + r;
    float l = Ls[warp * 16 + r];
    if (i < p.tq) o[p.o.at(b, h, i) + d] = fromF32<T>(l > 0.0f ? Ow[e] / l : 0.0f);
  }
  if (lane < 16) {
    int64_t i = r0 + warp * 16 + lane;
    float l = Ls[warp * 16 + lane];
    if (i < p.tq) lse[bh * p.tq + i] = l > 0.0f ? Ms[warp * 16 + lane] + logf(l) : -INFINITY;
  }
}

template <typename T, int D>
void launchForwardTc(const void* q, const void* k, const void* v, void* o, float* lse, const Flash& p, cudaStream_t s, const char* call) {
  constexpr size_t bytes = tcSharedBytes<D>();
  cudaError_t err = cudaFuncSetAttribute(flashForwardTcKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err != cudaSuccess) fail(Err::Native, std::string(call) + ": " + cudaGetErrorString(err));
  int64_t tiles = (p.tq + kTcRows - 1) / kTcRows;
  flashForwardTcKernel<T, D><<<gridOf(p.B * p.H * tiles, call), kTcWarps * 32, bytes, s>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse, p, tiles);
}

// ---- tensor-core backward (bf16/f16, D = 64 or 128), the FA2 split --------------------------------
// dK/dV: a block owns 64 keys (16 per warp) with their dK and dV in wmma accumulator fragments, and walks
// the query tiles of 64 that see them: Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ into f32 shared memory, then per
// element Pᵀ = exp(scale·Sᵀ − lse) and dSᵀ = scale·Pᵀ∘(dPᵀ − delta) rounded to the storage type, then
// dV_w += Pᵀ·dO and dK_w += dSᵀ·Q. dQ: a block owns 64 queries and walks the key tiles they see:
// S = Q_w·Kᵀ, dP = dO_w·Vᵀ, dS as above, dQ_w += dS·K. No atomics: each output row has one owner.
template <int D>
constexpr size_t tcBackwardSharedBytes() {
  // four [64, D] tiles, two per-warp [16, 64] f32 scratch, one per-warp [16, 64] and one [16, 64] 16-bit
  // scratch, a per-warp [16, D] f32 output scratch, and two [64] f32 vectors.
  return size_t(4 * kTcRows * D) * 2 + size_t(2 * kTcWarps * 16 * kTcKeys) * 4 + size_t(2 * kTcWarps * 16 * kTcKeys) * 2 +
         size_t(kTcWarps * 16 * D) * 4 + size_t(2 * kTcRows) * 4;
}

struct TcBackwardSmem {
  void* X0;      // [64, D] 16-bit: the block's own rows (K or Q)
  void* X1;      // [64, D] 16-bit: V or dO
  void* Y0;      // [64, D] 16-bit: the tile's rows (Q or K)
  void* Y1;      // [64, D] 16-bit: dO or V
  void* P16;     // per warp [16, 64] 16-bit
  void* dS16;    // per warp [16, 64] 16-bit
  float* S32;    // per warp [16, 64]
  float* dP32;   // per warp [16, 64]
  float* out;    // per warp [16, D]
  float* vecA;   // [64]
  float* vecB;   // [64]
};

template <int D>
__device__ __forceinline__ TcBackwardSmem tcBackwardSmem(unsigned char* base) {
  TcBackwardSmem m;
  size_t tile = size_t(kTcRows * D) * 2, s16 = size_t(kTcWarps * 16 * kTcKeys) * 2, s32 = size_t(kTcWarps * 16 * kTcKeys) * 4;
  m.X0 = base;
  m.X1 = base + tile;
  m.Y0 = base + 2 * tile;
  m.Y1 = base + 3 * tile;
  m.S32 = reinterpret_cast<float*>(base + 4 * tile);
  m.dP32 = reinterpret_cast<float*>(base + 4 * tile + s32);
  m.P16 = base + 4 * tile + 2 * s32;
  m.dS16 = base + 4 * tile + 2 * s32 + s16;
  m.out = reinterpret_cast<float*>(base + 4 * tile + 2 * s32 + 2 * s16);
  m.vecA = m.out + kTcWarps * 16 * D;
  m.vecB = m.vecA + kTcRows;
  return m;
}

// C_w[16, 64] (f32, ld 64) = A_w[16, D] · Bᵀ for B [64, D] (both row-major 16-bit, ld D).
template <typename M, int D>
__device__ __forceinline__ void tcRowsTimesTileT(const M* A, const M* B, float* C) {
  using namespace nvcuda;
#pragma unroll
  for (int nb = 0; nb < kTcKeys / 16; nb++) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, A + kk * 16, D);
      wmma::load_matrix_sync(fb, B + nb * 16 * D + kk * 16, D);
      wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(C + nb * 16, c, kTcKeys, wmma::mem_row_major);
  }
}

// acc[db] += A_w[16, 64] (16-bit, ld 64) · B[64, D] (16-bit row-major, ld D), column block db of 16.
template <typename M, int D>
__device__ __forceinline__ void tcAccumulate(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[D / 16], const M* A,
                                             const M* B) {
  using namespace nvcuda;
#pragma unroll
  for (int db = 0; db < D / 16; db++) {
#pragma unroll
    for (int kb = 0; kb < kTcKeys / 16; kb++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, M, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, M, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, A + kb * 16, kTcKeys);
      wmma::load_matrix_sync(fb, B + kb * 16 * D + db * 16, D);
      wmma::mma_sync(acc[db], fa, fb, acc[db]);
    }
  }
}

// Writes a warp's 16 accumulated rows (rows t0.. of head (b, h) under L, those below T) through `scratch`.
template <typename T, int D>
__device__ __forceinline__ void tcStoreRows(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[D / 16], float* scratch,
                                            T* base, const HeadLayout& L, int64_t b, int64_t h, int64_t t0, int64_t T_) {
  using namespace nvcuda;
  int lane = threadIdx.x & 31;
  __syncwarp();
#pragma unroll
  for (int db = 0; db < D / 16; db++) wmma::store_matrix_sync(scratch + db * 16, acc[db], D, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * D; e += 32) {
    int r = e / D, d = e - r * D;
    if (t0 + r < T_) base[L.at(b, h, t0 + r) + d] = fromF32<T>(scratch[e]);
  }
  __syncwarp();
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcWarps * 32) flashBackwardKVTcKernel(const T* q, const T* k, const T* v, const T* go, const float* lse,
                                                                         const float* delta, T* gk, T* gv, Flash p, int64_t tiles) {
  using namespace nvcuda;
  using M = typename MmaType<T>::type;
  extern __shared__ __align__(128) unsigned char flashTcSmem[];
  TcBackwardSmem sm = tcBackwardSmem<D>(flashTcSmem);
  M* Ks = static_cast<M*>(sm.X0);
  M* Vs = static_cast<M*>(sm.X1);
  M* Qs = static_cast<M*>(sm.Y0);
  M* Gs = static_cast<M*>(sm.Y1);
  float* Lq = sm.vecA;
  float* Dq = sm.vecB;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  M* Pw = static_cast<M*>(sm.P16) + warp * 16 * kTcKeys;
  M* dSw = static_cast<M*>(sm.dS16) + warp * 16 * kTcKeys;
  float* Sw = sm.S32 + warp * 16 * kTcKeys;
  float* dPw = sm.dP32 + warp * 16 * kTcKeys;
  int64_t bh = blockIdx.x / tiles, b = bh / p.H, h = bh % p.H;
  int64_t j0 = (blockIdx.x % tiles) * kTcRows;
  int nk = int(p.tk - j0 < kTcRows ? p.tk - j0 : kTcRows);
  loadTileBits<T, D>(k, p.k, b, h, j0, nk, reinterpret_cast<uint16_t*>(Ks));
  loadTileBits<T, D>(v, p.v, b, h, j0, nk, reinterpret_cast<uint16_t*>(Vs));
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> dK[D / 16], dV[D / 16];
#pragma unroll
  for (int db = 0; db < D / 16; db++) {
    wmma::fill_fragment(dK[db], 0.0f);
    wmma::fill_fragment(dV[db], 0.0f);
  }
  int64_t shift = p.tk - p.tq, jEnd = j0 + nk;
  int64_t iBegin = p.mask.causal && j0 - shift > 0 ? j0 - shift : 0;
  int64_t iEnd = p.tq;
  if (p.mask.window > 0) {
    int64_t e = jEnd - shift + p.mask.window - 1;
    iEnd = e < 0 ? 0 : e < p.tq ? e : p.tq;
  }
  for (int64_t i0 = iBegin; i0 < iEnd; i0 += kTcKeys) {
    int nq = int(iEnd - i0 < kTcKeys ? iEnd - i0 : kTcKeys);
    __syncthreads();  // every warp is done with the previous query tile (and K, V are loaded)
    loadTileBits<T, D>(q, p.q, b, h, i0, nq, reinterpret_cast<uint16_t*>(Qs));
    loadTileBits<T, D>(go, p.o, b, h, i0, nq, reinterpret_cast<uint16_t*>(Gs));
    if (threadIdx.x < kTcKeys) {
      int t = threadIdx.x;
      Lq[t] = t < nq ? lse[bh * p.tq + i0 + t] : -INFINITY;
      Dq[t] = t < nq ? delta[bh * p.tq + i0 + t] : 0.0f;
    }
    __syncthreads();
    tcRowsTimesTileT<M, D>(Ks + warp * 16 * D, Qs, Sw);   // Sᵀ [16 keys, 64 queries]
    tcRowsTimesTileT<M, D>(Vs + warp * 16 * D, Gs, dPw);  // dPᵀ
    __syncwarp();
    for (int e = lane; e < 16 * kTcKeys; e += 32) {
      int jl = e / kTcKeys, il = e - jl * kTcKeys;
      int64_t j = j0 + warp * 16 + jl, i = i0 + il;
      float L = Lq[il], pv = 0.0f, ds = 0.0f;
      if (jl + warp * 16 < nk && il < nq && L != -INFINITY && j >= p.mask.lo(i) && j < p.mask.hi(i)) {
        pv = expf(Sw[e] * p.scale - L);
        ds = pv * (dPw[e] - Dq[il]) * p.scale;
      }
      Pw[e] = mmaOf<M>(pv);
      dSw[e] = mmaOf<M>(ds);
    }
    __syncwarp();
    tcAccumulate<M, D>(dV, Pw, Gs);   // dV_w += Pᵀ·dO
    tcAccumulate<M, D>(dK, dSw, Qs);  // dK_w += dSᵀ·Q
  }
  float* scratch = sm.out + warp * 16 * D;
  tcStoreRows<T, D>(dK, scratch, gk, p.k, b, h, j0 + warp * 16, p.tk);
  tcStoreRows<T, D>(dV, scratch, gv, p.v, b, h, j0 + warp * 16, p.tk);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTcWarps * 32) flashBackwardQTcKernel(const T* q, const T* k, const T* v, const T* go, const float* lse,
                                                                        const float* delta, T* gq, Flash p, int64_t tiles) {
  using namespace nvcuda;
  using M = typename MmaType<T>::type;
  extern __shared__ __align__(128) unsigned char flashTcSmem[];
  TcBackwardSmem sm = tcBackwardSmem<D>(flashTcSmem);
  M* Qs = static_cast<M*>(sm.X0);
  M* Gs = static_cast<M*>(sm.X1);
  M* Ks = static_cast<M*>(sm.Y0);
  M* Vs = static_cast<M*>(sm.Y1);
  float* Lr = sm.vecA;
  float* Dr = sm.vecB;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  M* dSw = static_cast<M*>(sm.dS16) + warp * 16 * kTcKeys;
  float* Sw = sm.S32 + warp * 16 * kTcKeys;
  float* dPw = sm.dP32 + warp * 16 * kTcKeys;
  int64_t bh = blockIdx.x / tiles, b = bh / p.H, h = bh % p.H;
  int64_t r0 = (blockIdx.x % tiles) * kTcRows;
  int nq = int(p.tq - r0 < kTcRows ? p.tq - r0 : kTcRows);
  loadTileBits<T, D>(q, p.q, b, h, r0, nq, reinterpret_cast<uint16_t*>(Qs));
  loadTileBits<T, D>(go, p.o, b, h, r0, nq, reinterpret_cast<uint16_t*>(Gs));
  if (threadIdx.x < kTcRows) {
    int t = threadIdx.x;
    Lr[t] = t < nq ? lse[bh * p.tq + r0 + t] : -INFINITY;
    Dr[t] = t < nq ? delta[bh * p.tq + r0 + t] : 0.0f;
  }
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> dQ[D / 16];
#pragma unroll
  for (int db = 0; db < D / 16; db++) wmma::fill_fragment(dQ[db], 0.0f);
  int64_t jlo = p.mask.lo(r0), jhi = p.mask.hi(r0 + nq - 1);
  for (int64_t j0 = jlo; j0 < jhi; j0 += kTcKeys) {
    int n = int(jhi - j0 < kTcKeys ? jhi - j0 : kTcKeys);
    __syncthreads();  // every warp is done with the previous key tile (and Q, dO, lse, delta are loaded)
    loadTileBits<T, D>(k, p.k, b, h, j0, n, reinterpret_cast<uint16_t*>(Ks));
    loadTileBits<T, D>(v, p.v, b, h, j0, n, reinterpret_cast<uint16_t*>(Vs));
    __syncthreads();
    tcRowsTimesTileT<M, D>(Qs + warp * 16 * D, Ks, Sw);   // S [16 queries, 64 keys]
    tcRowsTimesTileT<M, D>(Gs + warp * 16 * D, Vs, dPw);  // dP
    __syncwarp();
    for (int e = lane; e < 16 * kTcKeys; e += 32) {
      int il = e / kTcKeys, jl = e - il * kTcKeys;
      int64_t i = r0 + warp * 16 + il, j = j0 + jl;
      float L = Lr[warp * 16 + il], ds = 0.0f;
      if (il + warp * 16 < nq && jl < n && L != -INFINITY && j >= p.mask.lo(i) && j < p.mask.hi(i))
        ds = expf(Sw[e] * p.scale - L) * (dPw[e] - Dr[warp * 16 + il]) * p.scale;
      dSw[e] = mmaOf<M>(ds);
    }
    __syncwarp();
    tcAccumulate<M, D>(dQ, dSw, Ks);  // dQ_w += dS·K
  }
  __syncthreads();
  tcStoreRows<T, D>(dQ, sm.out + warp * 16 * D, gq, p.q, b, h, r0 + warp * 16, p.tq);
}

template <typename T, int D>
void launchBackwardTc(const void* q, const void* k, const void* v, const void* go, const float* lse, const float* delta, void* gq, void* gk,
                      void* gv, const Flash& p, cudaStream_t s, const char* call) {
  constexpr size_t bytes = tcBackwardSharedBytes<D>();
  for (const void* fn : {reinterpret_cast<const void*>(flashBackwardKVTcKernel<T, D>), reinterpret_cast<const void*>(flashBackwardQTcKernel<T, D>)}) {
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (err != cudaSuccess) fail(Err::Native, std::string(call) + ": " + cudaGetErrorString(err));
  }
  const T *tq = static_cast<const T*>(q), *tk = static_cast<const T*>(k), *tv = static_cast<const T*>(v), *tgo = static_cast<const T*>(go);
  if (p.tk > 0) {
    int64_t tiles = (p.tk + kTcRows - 1) / kTcRows;
    flashBackwardKVTcKernel<T, D><<<gridOf(p.B * p.H * tiles, call), kTcWarps * 32, bytes, s>>>(tq, tk, tv, tgo, lse, delta, static_cast<T*>(gk),
                                                                                                  static_cast<T*>(gv), p, tiles);
  }
  if (p.tq > 0) {
    int64_t tiles = (p.tq + kTcRows - 1) / kTcRows;
    flashBackwardQTcKernel<T, D><<<gridOf(p.B * p.H * tiles, call), kTcWarps * 32, bytes, s>>>(tq, tk, tv, tgo, lse, delta, static_cast<T*>(gq), p,
                                                                                                 tiles);
  }
}

// Whether the tensor-core kernels take this call: bf16/f16 at D = 64 or 128, unless NODETRON_FLASH_SIMT=1
// (read on every call, so a test can compare both paths in one process).
bool useTensorCores(DType dt, int64_t D) {
  return (dt == DType::BF16 || dt == DType::F16) && (D == 64 || D == 128) && !envFlag(std::getenv("NODETRON_FLASH_SIMT"));
}

}  // namespace

// flash_attention_forward(q, k, v, out, lse, qLayout, kLayout, vLayout, outLayout, batch, heads, tq, tk, dim,
//                         scale, causal, window, dtype): see native/cpu/kernels/flash_attention.cc.
NT_CUDA_KERNEL("flash_attention_forward", FlashAttentionForward) {
  int64_t ext[4];
  FlashProblem fp = flashProblem(k.args, ext, call);
  if (fp.D > kMaxDim) fail(Err::Shape, std::string(call) + ": head dim " + std::to_string(fp.D) + " is not supported on cuda (at most 256)");
  void* q = k.data("q", fp.dt, ext[0]);
  void* kk = k.data("k", fp.dt, ext[1]);
  void* v = k.data("v", fp.dt, ext[2]);
  void* o = k.data("out", fp.dt, ext[3]);
  float* lse = k.data<float>("lse", DType::F32, fp.B * fp.H * fp.tq);
  if (fp.B == 0 || fp.H == 0 || fp.tq == 0) return;
  Flash p = flashOf(fp);
  int64_t tiles = (fp.tq + kLocal - 1) / kLocal;
  unsigned grid = gridOf(fp.B * fp.H * tiles, call);
  size_t smem = size_t(2 * kRemote * p.D) * sizeof(float);
  cudaStream_t s = k.stream();
  if (useTensorCores(fp.dt, fp.D)) {
    if (fp.dt == DType::BF16) {
      if (fp.D == 64) launchForwardTc<bf16, 64>(q, kk, v, o, lse, p, s, call);
      else launchForwardTc<bf16, 128>(q, kk, v, o, lse, p, s, call);
    } else {
      if (fp.D == 64) launchForwardTc<f16, 64>(q, kk, v, o, lse, p, s, call);
      else launchForwardTc<f16, 128>(q, kk, v, o, lse, p, s, call);
    }
    k.launched();
    return;
  }
  NT_DISPATCH_FLOAT(fp.dt, call, T,
                    NT_FLASH_CHUNKS(p.D, call, C,
                                    flashForwardKernel<T, C><<<grid, kWarps * 32, smem, s>>>(
                                        static_cast<const T*>(q), static_cast<const T*>(kk), static_cast<const T*>(v), static_cast<T*>(o), lse, p,
                                        tiles)));
}

// flash_attention_backward(q, k, v, out, gradOut, lse, gradQ, gradK, gradV, qLayout, kLayout, vLayout, outLayout,
//                          batch, heads, tq, tk, dim, scale, causal, window, dtype): delta, then dK/dV, then dQ.
NT_CUDA_KERNEL("flash_attention_backward", FlashAttentionBackward) {
  int64_t ext[4];
  FlashProblem fp = flashProblem(k.args, ext, call);
  if (fp.D > kMaxDim) fail(Err::Shape, std::string(call) + ": head dim " + std::to_string(fp.D) + " is not supported on cuda (at most 256)");
  void* q = k.data("q", fp.dt, ext[0]);
  void* kk = k.data("k", fp.dt, ext[1]);
  void* v = k.data("v", fp.dt, ext[2]);
  void* o = k.data("out", fp.dt, ext[3]);
  void* go = k.data("gradOut", fp.dt, ext[3]);
  const float* lse = k.data<const float>("lse", DType::F32, fp.B * fp.H * fp.tq);
  void* gq = k.data("gradQ", fp.dt, ext[0]);
  void* gk = k.data("gradK", fp.dt, ext[1]);
  void* gv = k.data("gradV", fp.dt, ext[2]);
  if (fp.B == 0 || fp.H == 0) return;
  Flash p = flashOf(fp);
  cudaStream_t s = k.stream();
  int64_t rows = fp.B * fp.H * fp.tq;
  DeviceScratch delta(k.device(), size_t(rows > 0 ? rows : 1) * sizeof(float), call);
  int64_t qTiles = (fp.tq + kLocal - 1) / kLocal, kTiles = (fp.tk + kLocal - 1) / kLocal;
  size_t smemKV = size_t(2 * kRemote * p.D + 2 * kRemote) * sizeof(float), smemQ = size_t(2 * kRemote * p.D) * sizeof(float);
  if (rows > 0)
    NT_DISPATCH_FLOAT(fp.dt, call, T,
                      flashDeltaKernel<T><<<gridOf((rows + kWarps - 1) / kWarps, call), kWarps * 32, 0, s>>>(
                          static_cast<const T*>(o), static_cast<const T*>(go), delta.as<float>(), p));
  if (useTensorCores(fp.dt, fp.D)) {
    const float* dl = delta.as<float>();
    if (fp.dt == DType::BF16) {
      if (fp.D == 64) launchBackwardTc<bf16, 64>(q, kk, v, go, lse, dl, gq, gk, gv, p, s, call);
      else launchBackwardTc<bf16, 128>(q, kk, v, go, lse, dl, gq, gk, gv, p, s, call);
    } else {
      if (fp.D == 64) launchBackwardTc<f16, 64>(q, kk, v, go, lse, dl, gq, gk, gv, p, s, call);
      else launchBackwardTc<f16, 128>(q, kk, v, go, lse, dl, gq, gk, gv, p, s, call);
    }
    k.launched();
    return;
  }
  NT_DISPATCH_FLOAT(
      fp.dt, call, T,
      const T* tq_ = static_cast<const T*>(q); const T* tk_ = static_cast<const T*>(kk); const T* tv_ = static_cast<const T*>(v);
      const T* tgo = static_cast<const T*>(go);
      if (fp.tk > 0) NT_FLASH_CHUNKS(p.D, call, C,
                                     flashBackwardKVKernel<T, C><<<gridOf(fp.B * fp.H * kTiles, call), kWarps * 32, smemKV, s>>>(
                                         tq_, tk_, tv_, tgo, lse, delta.as<float>(), static_cast<T*>(gk), static_cast<T*>(gv), p, kTiles));
      if (rows > 0) NT_FLASH_CHUNKS(p.D, call, C,
                                    flashBackwardQKernel<T, C><<<gridOf(fp.B * fp.H * qTiles, call), kWarps * 32, smemQ, s>>>(
                                        tq_, tk_, tv_, tgo, lse, delta.as<float>(), static_cast<T*>(gq), p, qTiles)));
}

}  // namespace nt::cuda
