// Rotary position embeddings (RoPE) on the cpu backend, in Hugging Face's rotate-half layout: for a
// head vector x of even width D and position p, with half = D/2 and θ_i = p·theta^(−2i/D),
//   out[i]        = x[i]·cos θ_i − x[i+half]·sin θ_i
//   out[i + half] = x[i+half]·cos θ_i + x[i]·sin θ_i          (i < half)
// `inverse` rotates by −θ: the transpose of the rotation, which is the backward of the forward.
#include <cmath>
#include <vector>

#include "util.h"

namespace nt::cpu {

// rope(inp, out, positions|null, posCount, batch, seq, heads, dim, offset, theta, inverse, dtype)
//   inp, out [batch, seq, heads, dim] (out may be inp); positions i32: null (position offset + t),
//   [seq] (shared by the batch) or [batch, seq]; posCount its element count (0 when null).
//   Angles are computed in double and rounded once to f32.
NT_KERNEL("rope", Rope) {
  int64_t posCount = a.size("posCount"), batch = a.size("batch"), seq = a.size("seq"), heads = a.size("heads"), dim = a.size("dim"), offset = a.size("offset");
  double theta = a.number("theta");
  bool inverse = a.boolean("inverse");
  DType dt = a.dtype("dtype");
  if (dim % 2 != 0) fail(Err::Shape, std::string(call) + ": the head dim " + std::to_string(dim) + " must be even");
  if (!(theta > 0) || !std::isfinite(theta)) fail(Err::Argument, std::string(call) + ": theta must be a finite number > 0");
  bool hasPos = a.given("positions");
  if (hasPos != (posCount > 0) || (hasPos && posCount != seq && posCount != batch * seq))
    fail(Err::Shape, std::string(call) + ": positions must hold seq (" + std::to_string(seq) + ") or batch·seq (" + std::to_string(batch * seq) +
                         ") entries, got " + std::to_string(posCount));
  int64_t n = batch * seq * heads * dim;
  const int32_t* pos = hasPos ? reinterpret_cast<const int32_t*>(storageData(info, a.at("positions", "so"), call, DType::I32, posCount)) : nullptr;
  F32View I(a, "inp", dt, n, true), O(a, "out", dt, n, false);
  if (n == 0) return;
  int64_t half = dim / 2, P = hasPos ? posCount : seq;
  // cos and sin per (position row, i), each computed once.
  std::vector<double> invFreq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++) invFreq[size_t(i)] = std::pow(theta, -double(2 * i) / double(dim));
  std::vector<float> cs(static_cast<size_t>(P * half)), sn(static_cast<size_t>(P * half));
  parallelRows(P, half * 40, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      double p = hasPos ? double(pos[r]) : double(offset + r);
      for (int64_t i = 0; i < half; i++) {
        double ang = p * invFreq[size_t(i)];
        cs[size_t(r * half + i)] = float(std::cos(ang));
        sn[size_t(r * half + i)] = float(inverse ? -std::sin(ang) : std::sin(ang));
      }
    }
  });
  const float* x = I.data();
  float* o = O.data();
  int64_t rows = batch * seq * heads;
  bool batched = hasPos && posCount == batch * seq;
  parallelRows(rows, dim * 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) {
      int64_t bt = r / heads, t = bt % seq;
      int64_t pr = batched ? bt : t;
      const float *c = cs.data() + pr * half, *s = sn.data() + pr * half;
      const float* xr = x + r * dim;
      float* orow = o + r * dim;
      for (int64_t i = 0; i < half; i++) {
        float x1 = xr[i], x2 = xr[i + half];
        orow[i] = x1 * c[i] - x2 * s[i];
        orow[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  });
  O.commit();
}

}  // namespace nt::cpu
