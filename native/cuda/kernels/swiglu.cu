// SiLU and SwiGLU (Llama's MLP activation) on the cuda backend, the cpu backend's signatures:
//   swiglu_forward(gate, up|null, out, n, dtype): out = silu(gate)·up (silu(gate) when up is null);
//   swiglu_backward(gate, up|null, gradOut, gradGate, gradUp|null, n, dtype).
// silu(x) = x·σ(x), silu'(x) = σ(x)·(1 + x·(1 − σ(x))). Elementwise through map3Kernel.
#include "call.cuh"

namespace nt::cuda {

__device__ __forceinline__ float sigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }

// (gate, up) -> silu(gate)·up
struct SwigluF {
  __device__ __forceinline__ float operator()(float g, float u, float) const { return g * sigmoidF(g) * u; }
};
// (gate) -> silu(gate)
struct SiluF {
  __device__ __forceinline__ float operator()(float g, float, float) const { return g * sigmoidF(g); }
};
// (dy, gate, up) -> dy·up·silu'(gate); with up absent (the silu gradient) the caller passes SiluGradF.
struct SwigluGateGradF {
  __device__ __forceinline__ float operator()(float dy, float g, float u) const {
    float s = sigmoidF(g);
    return dy * u * (s * (1.0f + g * (1.0f - s)));
  }
};
struct SiluGradF {
  __device__ __forceinline__ float operator()(float dy, float g, float) const {
    float s = sigmoidF(g);
    return dy * (s * (1.0f + g * (1.0f - s)));
  }
};
// (dy, gate) -> dy·silu(gate)
struct SwigluUpGradF {
  __device__ __forceinline__ float operator()(float dy, float g, float) const { return dy * g * sigmoidF(g); }
};

NT_CUDA_KERNEL("swiglu_forward", SwigluForward) {
  int64_t n = k.args.size("n");
  DType dt = k.args.dtype("dtype");
  void* g = k.data("gate", dt, n);
  void* u = k.optional("up", dt, n);
  void* y = k.data("out", dt, n);
  if (u) mapCall(k, dt, SwigluF{}, g, u, nullptr, y, n);
  else mapCall(k, dt, SiluF{}, g, nullptr, nullptr, y, n);
}

NT_CUDA_KERNEL("swiglu_backward", SwigluBackward) {
  int64_t n = k.args.size("n");
  DType dt = k.args.dtype("dtype");
  void* g = k.data("gate", dt, n);
  void* u = k.optional("up", dt, n);
  void* dy = k.data("gradOut", dt, n);
  void* dg = k.data("gradGate", dt, n);
  void* du = k.optional("gradUp", dt, n);
  if ((u == nullptr) != (du == nullptr)) fail(Err::Argument, "swiglu_backward: gradUp must be given exactly when up is");
  if (u) {
    // gradUp first: gradGate may not alias anything read later, but gradUp's inputs are dy and gate only.
    mapCall(k, dt, SwigluUpGradF{}, dy, g, nullptr, du, n);
    mapCall(k, dt, SwigluGateGradF{}, dy, g, u, dg, n);
  } else {
    mapCall(k, dt, SiluGradF{}, dy, g, nullptr, dg, n);
  }
}

}  // namespace nt::cuda
