// GELU (tanh approximation, as GPT-2) on the cpu backend: forward and backward.
#include "util.h"

namespace nt::cpu {

static constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

// tanh through the vectorizable exp: tanh(u) = 1 - 2 / (exp(2u) + 1).
static inline float tanhFast(float u) { return 1.0f - 2.0f / (fastExp(2.0f * u) + 1.0f); }

NT_SIMD_CLONES static void geluRange(const float* x, float* o, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i++) {
    float v = x[i];
    o[i] = 0.5f * v * (1.0f + tanhFast(kGeluC * (v + 0.044715f * v * v * v)));
  }
}

NT_SIMD_CLONES static void geluBackwardRange(const float* x, const float* g, float* o, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i++) {
    float v = x[i];
    float t = tanhFast(kGeluC * (v + 0.044715f * v * v * v));
    float du = kGeluC * (1.0f + 3.0f * 0.044715f * v * v);
    o[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

// gelu_forward(inp, out, n, dtype): out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
NT_KERNEL("gelu_forward", GeluForward) {
  int64_t n = a.size(2);
  DType dt = a.dtype(3);
  F32View I(info, 0, call, dt, n, true), O(info, 1, call, dt, n, false);
  const float* x = I.data();
  float* o = O.data();
  parallelRows(n, 20, [&](int64_t b, int64_t e) { geluRange(x, o, b, e); });
  O.commit();
}

// gelu_backward(inp, gradOut, gradIn, n, dtype): gradIn = gradOut · gelu'(inp)
NT_KERNEL("gelu_backward", GeluBackward) {
  int64_t n = a.size(3);
  DType dt = a.dtype(4);
  F32View I(info, 0, call, dt, n, true), G(info, 1, call, dt, n, true);
  F32View O(info, 2, call, dt, n, false);
  const float *x = I.data(), *g = G.data();
  float* o = O.data();
  parallelRows(n, 30, [&](int64_t b, int64_t e) { geluBackwardRange(x, g, o, b, e); });
  O.commit();
}

}  // namespace nt::cpu
