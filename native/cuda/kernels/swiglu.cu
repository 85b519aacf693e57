// SiLU and SwiGLU (Llama's MLP activation) on the cuda backend, the cpu backend's signatures:
//   swiglu_forward(gate, up|null, out, n, dtype): out = silu(gate)·up (silu(gate) when up is null);
//   swiglu_backward(gate, up|null, gradOut, gradGate, gradUp|null, n, dtype).
// silu(x) = x·σ(x), silu'(x) = σ(x)·(1 + x·(1 − σ(x))). Elementwise through map3Kernel.
#include "common.cuh"

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

static Napi::Value SwigluForwardAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "swiglu_forward");
  int64_t n = k.args.size(3);
  DType dt = k.args.dtype(4);
  void* g = k.data(0, dt, n);
  void* u = k.optional(1, dt, n);
  void* y = k.data(2, dt, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "swiglu_forward", T, {
    if (u) launchMap3<T>(st, SwigluF{}, static_cast<const T*>(g), static_cast<const T*>(u), nullptr, static_cast<T*>(y), n);
    else launchMap3<T>(st, SiluF{}, static_cast<const T*>(g), nullptr, nullptr, static_cast<T*>(y), n);
  });
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("swiglu_forward", SwigluForwardAbi);

static Napi::Value SwigluBackwardAbi(const Napi::CallbackInfo& info) {
  KernelCall k(info, "swiglu_backward");
  int64_t n = k.args.size(5);
  DType dt = k.args.dtype(6);
  void* g = k.data(0, dt, n);
  void* u = k.optional(1, dt, n);
  void* dy = k.data(2, dt, n);
  void* dg = k.data(3, dt, n);
  void* du = k.optional(4, dt, n);
  if ((u == nullptr) != (du == nullptr)) fail(Err::Argument, "swiglu_backward: gradUp must be given exactly when up is");
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "swiglu_backward", T, {
    const T *gt = static_cast<const T*>(g), *ut = static_cast<const T*>(u), *dyt = static_cast<const T*>(dy);
    if (u) {
      // gradUp first: gradGate may not alias anything read later, but gradUp's inputs are dy and gate only.
      launchMap3<T>(st, SwigluUpGradF{}, dyt, gt, nullptr, static_cast<T*>(du), n);
      launchMap3<T>(st, SwigluGateGradF{}, dyt, gt, ut, static_cast<T*>(dg), n);
    } else {
      launchMap3<T>(st, SiluGradF{}, dyt, gt, nullptr, static_cast<T*>(dg), n);
    }
  });
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("swiglu_backward", SwigluBackwardAbi);

}  // namespace nt::cuda
