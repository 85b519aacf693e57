// SiLU and SwiGLU (Llama's MLP activation) on the cpu backend: forward and backward.
//   silu(x) = x·σ(x);  swiglu(gate, up) = silu(gate)·up.
// One pair of kernels serves both: `up` null is plain SiLU.
#include "util.h"

namespace nt::cpu {

static inline float sigmoidF(float x) { return 1.0f / (1.0f + fastExp(-x)); }

NT_SIMD_BODY void swigluRangeBody(const float* g, const float* u, float* o, int64_t begin, int64_t end) {
  if (u) {
    for (int64_t i = begin; i < end; i++) o[i] = g[i] * sigmoidF(g[i]) * u[i];
  } else {
    for (int64_t i = begin; i < end; i++) o[i] = g[i] * sigmoidF(g[i]);
  }
}
NT_SIMD(swigluRange, (const float* g, const float* u, float* o, int64_t begin, int64_t end), (g, u, o, begin, end))

// dGate = dy·up·silu'(gate), dUp = dy·silu(gate) (up null: dGate = dy·silu'(gate)),
// silu'(x) = σ(x)·(1 + x·(1 − σ(x))).
NT_SIMD_BODY void swigluBackwardRangeBody(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i++) {
    float x = g[i], s = sigmoidF(x);
    float d = s * (1.0f + x * (1.0f - s));
    if (u) {
      dg[i] = dy[i] * u[i] * d;
      du[i] = dy[i] * x * s;
    } else {
      dg[i] = dy[i] * d;
    }
  }
}
NT_SIMD(swigluBackwardRange, (const float* g, const float* u, const float* dy, float* dg, float* du, int64_t begin, int64_t end),
        (g, u, dy, dg, du, begin, end))

// swiglu_forward(gate, up|null, out, n, dtype): out = silu(gate)·up, or silu(gate) when up is null.
NT_KERNEL("swiglu_forward", SwigluForward) {
  int64_t n = a.size("n");
  DType dt = a.dtype("dtype");
  bool hasUp = a.given("up");
  F32View G(a, "gate", dt, n, true), U(a, "up", dt, n, true, hasUp);
  F32View O(a, "out", dt, n, false);
  const float *g = G.data(), *u = hasUp ? U.data() : nullptr;
  float* o = O.data();
  parallelRows(n, 24, [&](int64_t b, int64_t e) { swigluRange(g, u, o, b, e); });
  O.commit();
}

// swiglu_backward(gate, up|null, gradOut, gradGate, gradUp|null, n, dtype): gradients of
// swiglu_forward (both overwritten); gradUp is null exactly when up is.
NT_KERNEL("swiglu_backward", SwigluBackward) {
  int64_t n = a.size("n");
  DType dt = a.dtype("dtype");
  bool hasUp = a.given("up");
  bool hasGradUp = a.given("gradUp");
  if (hasUp != hasGradUp) fail(Err::Argument, std::string(call) + ": gradUp must be given exactly when up is");
  F32View G(a, "gate", dt, n, true), U(a, "up", dt, n, true, hasUp), DY(a, "gradOut", dt, n, true);
  F32View DG(a, "gradGate", dt, n, false), DU(a, "gradUp", dt, n, false, hasUp);
  const float *g = G.data(), *u = hasUp ? U.data() : nullptr, *dy = DY.data();
  float *dg = DG.data(), *du = hasUp ? DU.data() : nullptr;
  parallelRows(n, 30, [&](int64_t b, int64_t e) { swigluBackwardRange(g, u, dy, dg, du, b, e); });
  DG.commit();
  if (hasUp) DU.commit();
}

}  // namespace nt::cpu
