// Causal self-attention on the cuda backend, flash-style: keys and values stream through shared
// memory in tiles with an online softmax, so the T x T score matrix never exists. Optional sliding
// window (a query sees at most `window` keys, itself included). Layout [batch*heads, T, D], D <= 128.
// One thread per query row on CUDA cores: correct and memory-lean, not yet tensor-core fast.
#include "common.cuh"

namespace nt::cuda {

constexpr int kMaxHeadDim = 128;
constexpr int kQueries = 64;      // queries (threads) per block
constexpr int kFwdKeys = 32;      // keys per shared-memory tile in the forward
constexpr int kBwdKeys = 16;      // in the backward (four tiles: K, V, dK, dV)

__device__ __forceinline__ bool visible(int64_t i, int64_t j, int64_t window) { return j <= i && (window == 0 || i - j < window); }

template <typename T>
__global__ void attentionForwardKernel(const T* q, const T* k, const T* v, T* out, float* lse, int64_t t, int d, float scale,
                                       int64_t window) {
  extern __shared__ float tile[];  // K tile then V tile, kFwdKeys x d each
  float* ks = tile;
  float* vs = tile + kFwdKeys * d;
  int64_t bh = blockIdx.y, first = int64_t(blockIdx.x) * kQueries, i = first + threadIdx.x;
  int64_t last = min(first + kQueries, t) - 1;
  const T* qb = q + bh * t * d;
  const T* kb = k + bh * t * d;
  const T* vb = v + bh * t * d;
  float qr[kMaxHeadDim], acc[kMaxHeadDim];
  for (int c = 0; c < d; c++) {
    qr[c] = i < t ? toF32(qb[i * d + c]) * scale : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  int64_t startKey = window > 0 ? max(int64_t(0), first - window + 1) : 0;
  startKey = startKey / kFwdKeys * kFwdKeys;
  for (int64_t kt = startKey; kt <= last; kt += kFwdKeys) {
    __syncthreads();
    for (int e = threadIdx.x; e < kFwdKeys * d; e += blockDim.x) {
      int64_t j = kt + e / d;
      ks[e] = j < t ? toF32(kb[j * d + e % d]) : 0.0f;
      vs[e] = j < t ? toF32(vb[j * d + e % d]) : 0.0f;
    }
    __syncthreads();
    if (i >= t) continue;
    for (int jj = 0; jj < kFwdKeys; jj++) {
      int64_t j = kt + jj;
      if (j >= t || !visible(i, j, window)) continue;
      float s = 0.0f;
      for (int c = 0; c < d; c++) s += qr[c] * ks[jj * d + c];
      float mNew = fmaxf(m, s), corr = expf(m - mNew), p = expf(s - mNew);
      l = l * corr + p;
      for (int c = 0; c < d; c++) acc[c] = acc[c] * corr + p * vs[jj * d + c];
      m = mNew;
    }
  }
  if (i < t) {
    for (int c = 0; c < d; c++) out[(bh * t + i) * d + c] = fromF32<T>(acc[c] / l);
    lse[bh * t + i] = m + logf(l);
  }
}

// dQ_i = scale sum_j P_ij (dP_ij - delta_i) K_j, dK_j += scale P_ij (dP_ij - delta_i) q_i,
// dV_j += P_ij dO_i with P recomputed from lse and delta_i = dO_i . O_i. dK/dV of a tile are
// summed in shared memory, then added to the f32 outputs.
template <typename T>
__global__ void attentionBackwardKernel(const T* q, const T* k, const T* v, const T* o, const T* dout, const float* lse,
                                        float* dq, float* dk, float* dv, int64_t t, int d, float scale, int64_t window) {
  extern __shared__ float tile[];
  float* ks = tile;
  float* vs = ks + kBwdKeys * d;
  float* dks = vs + kBwdKeys * d;
  float* dvs = dks + kBwdKeys * d;
  int64_t bh = blockIdx.y, first = int64_t(blockIdx.x) * kQueries, i = first + threadIdx.x;
  int64_t last = min(first + kQueries, t) - 1;
  int64_t base = bh * t * d;
  float qr[kMaxHeadDim], dor[kMaxHeadDim], dqr[kMaxHeadDim];
  float delta = 0.0f, li = i < t ? lse[bh * t + i] : 0.0f;
  for (int c = 0; c < d; c++) {
    qr[c] = i < t ? toF32(q[base + i * d + c]) : 0.0f;
    dor[c] = i < t ? toF32(dout[base + i * d + c]) : 0.0f;
    delta += i < t ? dor[c] * toF32(o[base + i * d + c]) : 0.0f;
    dqr[c] = 0.0f;
  }
  int64_t startKey = window > 0 ? max(int64_t(0), first - window + 1) : 0;
  startKey = startKey / kBwdKeys * kBwdKeys;
  for (int64_t kt = startKey; kt <= last; kt += kBwdKeys) {
    __syncthreads();
    for (int e = threadIdx.x; e < kBwdKeys * d; e += blockDim.x) {
      int64_t j = kt + e / d;
      ks[e] = j < t ? toF32(k[base + j * d + e % d]) : 0.0f;
      vs[e] = j < t ? toF32(v[base + j * d + e % d]) : 0.0f;
      dks[e] = 0.0f;
      dvs[e] = 0.0f;
    }
    __syncthreads();
    if (i < t) {
      for (int jj = 0; jj < kBwdKeys; jj++) {
        int64_t j = kt + jj;
        if (j >= t || !visible(i, j, window)) continue;
        float s = 0.0f, dp = 0.0f;
        for (int c = 0; c < d; c++) {
          s += qr[c] * ks[jj * d + c];
          dp += dor[c] * vs[jj * d + c];
        }
        float p = expf(s * scale - li), ds = p * (dp - delta) * scale;
        for (int c = 0; c < d; c++) {
          dqr[c] += ds * ks[jj * d + c];
          atomicAdd(dks + jj * d + c, ds * qr[c]);
          atomicAdd(dvs + jj * d + c, p * dor[c]);
        }
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kBwdKeys * d; e += blockDim.x) {
      int64_t j = kt + e / d;
      if (j < t) {
        atomicAdd(dk + base + j * d + e % d, dks[e]);
        atomicAdd(dv + base + j * d + e % d, dvs[e]);
      }
    }
  }
  if (i < t)
    for (int c = 0; c < d; c++) dq[base + i * d + c] = dqr[c];
}

struct AttentionShape {
  int64_t bh, t, d, window;
  float scale;
};

static AttentionShape shapeArgs(const Args& a, size_t i, const char* call) {
  AttentionShape s{a.size(i), a.size(i + 1), a.size(i + 2), a.size(i + 4), float(a.number(i + 3))};
  if (s.d < 1 || s.d > kMaxHeadDim) fail(Err::Shape, std::string(call) + ": head dimension must lie in [1, 128], got " + std::to_string(s.d));
  if (s.bh > 65535) fail(Err::Shape, std::string(call) + ": batch*heads above 65535");
  return s;
}

// attentionForward(q, k, v, out, lse (f32 [bh, t]), dtype, bh, t, d, scale, window (0: all earlier keys))
static Napi::Value AttentionForward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "attentionForward");
  k.args.count(11);
  DType dt = k.args.dtype(5);
  AttentionShape s = shapeArgs(k.args, 6, "attentionForward");
  int64_t n = s.bh * s.t * s.d;
  void* q = k.data(0, dt, n);
  void* kk = k.data(1, dt, n);
  void* v = k.data(2, dt, n);
  void* out = k.data(3, dt, n);
  float* lse = k.data<float>(4, DType::F32, s.bh * s.t);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  dim3 grid(unsigned((s.t + kQueries - 1) / kQueries), unsigned(s.bh));
  size_t shared = size_t(2 * kFwdKeys * s.d) * sizeof(float);
  NT_DISPATCH_FLOAT(dt, "attentionForward", T,
                    attentionForwardKernel<T><<<grid, kQueries, shared, st>>>(
                        static_cast<const T*>(q), static_cast<const T*>(kk), static_cast<const T*>(v), static_cast<T*>(out), lse,
                        s.t, int(s.d), s.scale, s.window));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("attentionForward", AttentionForward);

// attentionBackward(q, k, v, out, dout, lse, dq, dk, dv (f32 outputs), dtype, bh, t, d, scale, window)
static Napi::Value AttentionBackward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "attentionBackward");
  k.args.count(15);
  DType dt = k.args.dtype(9);
  AttentionShape s = shapeArgs(k.args, 10, "attentionBackward");
  int64_t n = s.bh * s.t * s.d;
  void* q = k.data(0, dt, n);
  void* kk = k.data(1, dt, n);
  void* v = k.data(2, dt, n);
  void* o = k.data(3, dt, n);
  void* dout = k.data(4, dt, n);
  float* lse = k.data<float>(5, DType::F32, s.bh * s.t);
  float* dq = k.data<float>(6, DType::F32, n);
  float* dk = k.data<float>(7, DType::F32, n);
  float* dv = k.data<float>(8, DType::F32, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  check(cudaMemsetAsync(dk, 0, size_t(n) * 4, st), "cudaMemsetAsync");
  check(cudaMemsetAsync(dv, 0, size_t(n) * 4, st), "cudaMemsetAsync");
  dim3 grid(unsigned((s.t + kQueries - 1) / kQueries), unsigned(s.bh));
  size_t shared = size_t(4 * kBwdKeys * s.d) * sizeof(float);
  NT_DISPATCH_FLOAT(dt, "attentionBackward", T,
                    attentionBackwardKernel<T><<<grid, kQueries, shared, st>>>(
                        static_cast<const T*>(q), static_cast<const T*>(kk), static_cast<const T*>(v), static_cast<const T*>(o),
                        static_cast<const T*>(dout), lse, dq, dk, dv, s.t, int(s.d), s.scale, s.window));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("attentionBackward", AttentionBackward);

}  // namespace nt::cuda
