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
NT_CUDA_KERNEL("rope", RopeAbi) {
  int64_t posCount = k.args.size("posCount"), batch = k.args.size("batch"), seq = k.args.size("seq"), heads = k.args.size("heads"), dim = k.args.size("dim"),
          offset = k.args.size("offset");
  double theta = k.args.number("theta");
  bool inverse = k.args.boolean("inverse");
  DType dt = k.args.dtype("dtype");
  if (dim % 2 != 0) fail(Err::Shape, "rope: the head dim " + std::to_string(dim) + " must be even");
  if (!(theta > 0) || !std::isfinite(theta)) fail(Err::Argument, "rope: theta must be a finite number > 0");
  bool hasPos = k.args.given("positions");
  if (hasPos != (posCount > 0) || (hasPos && posCount != seq && posCount != batch * seq))
    fail(Err::Shape, "rope: positions must hold seq (" + std::to_string(seq) + ") or batch·seq (" + std::to_string(batch * seq) +
                         ") entries, got " + std::to_string(posCount));
  int64_t n = batch * seq * heads * dim;
  void* x = k.data("inp", dt, n);
  void* y = k.data("out", dt, n);
  const int32_t* pos = hasPos ? k.data<int32_t>("positions", DType::I32, posCount) : nullptr;
  if (n == 0) return;
  cudaStream_t st = k.stream();
  int64_t half = dim / 2, pairs = n / 2;
  bool batched = hasPos && posCount == batch * seq;
  NT_DISPATCH_FLOAT(dt, "rope", T,
                    ropeKernel<T><<<gridFor(pairs), kThreads, 0, st>>>(static_cast<const T*>(x), static_cast<T*>(y), pos, batched, seq, heads,
                                                                        half, offset, theta, double(dim), inverse, pairs));
}

}  // namespace nt::cuda
