// Rotary position embeddings (RoPE) on the cuda backend, in Hugging Face's rotate-half layout (the
// cpu backend's signature and math, native/cpu/kernels/rope.cc): for a head vector x of even width D
// at position p, half = D/2, θ_i = p·theta^(−2i/D):
//   out[i] = x[i]·cos θ_i − x[i+half]·sin θ_i,  out[i+half] = x[i+half]·cos θ_i + x[i]·sin θ_i;
// `inverse` rotates by −θ (the backward). Angles in double, rounded once to f32, as the cpu kernel.
#include <cmath>

#include "common.cuh"

namespace nt::cuda {

// One thread per (row, i < half) pair; rows are [batch, seq, heads] of inp/out (out may be inp).
template <typename T>
__global__ void ropeKernel(const T* x, T* out, const int32_t* pos, bool batched, int64_t seq, int64_t heads, int64_t half,
                           int64_t offset, double theta, double dim, bool inverse, int64_t pairs) {
  NT_GRID_STRIDE(k, pairs) {
    int64_t r = k / half, i = k % half;
    int64_t bt = r / heads, t = bt % seq;
    double p = pos ? double(pos[batched ? bt : t]) : double(offset + t);
    double ang = p * pow(theta, -double(2 * i) / dim);
    float c = float(cos(ang)), s = float(sin(ang));
    if (inverse) s = -s;
    const T* xr = x + r * 2 * half;
    T* orow = out + r * 2 * half;
    float x1 = toF32(xr[i]), x2 = toF32(xr[i + half]);
    orow[i] = fromF32<T>(x1 * c - x2 * s);
    orow[i + half] = fromF32<T>(x2 * c + x1 * s);
  }
}

// rope(inp, out, positions|null, posCount, batch, seq, heads, dim, offset, theta, inverse, dtype)
static Napi::Value RopeAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "rope");
  int64_t posCount = k.args.size(3), batch = k.args.size(4), seq = k.args.size(5), heads = k.args.size(6), dim = k.args.size(7),
          offset = k.args.size(8);
  double theta = k.args.number(9);
  bool inverse = k.args.boolean(10);
  DType dt = k.args.dtype(11);
  if (dim % 2 != 0) fail(Err::Shape, "rope: the head dim " + std::to_string(dim) + " must be even");
  if (!(theta > 0) || !std::isfinite(theta)) fail(Err::Argument, "rope: theta must be a finite number > 0");
  bool hasPos = !info[2].IsNull() && !info[2].IsUndefined();
  if (hasPos != (posCount > 0) || (hasPos && posCount != seq && posCount != batch * seq))
    fail(Err::Shape, "rope: positions must hold seq (" + std::to_string(seq) + ") or batch·seq (" + std::to_string(batch * seq) +
                         ") entries, got " + std::to_string(posCount));
  int64_t n = batch * seq * heads * dim;
  void* x = k.data(0, dt, n);
  void* y = k.data(1, dt, n);
  const int32_t* pos = hasPos ? k.data<int32_t>(2, DType::I32, posCount) : nullptr;
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  int64_t half = dim / 2, pairs = n / 2;
  bool batched = hasPos && posCount == batch * seq;
  NT_DISPATCH_FLOAT(dt, "rope", T,
                    ropeKernel<T><<<gridFor(pairs), kThreads, 0, st>>>(static_cast<const T*>(x), static_cast<T*>(y), pos, batched, seq, heads,
                                                                        half, offset, theta, double(dim), inverse, pairs));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("rope", RopeAbi);

}  // namespace nt::cuda
