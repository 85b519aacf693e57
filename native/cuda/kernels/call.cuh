// The launches kernel bindings (NT_CUDA_KERNEL, native/cuda/runtime.h) share, on the KernelCall's
// stream: kept out of common.cuh, which the CPU emulation (scripts/gpu/emulate) compiles without
// the runtime.
#pragma once
#include "common.cuh"

namespace nt::cuda {

// out[i] = f(a[i], b[i], c[i]) over n elements of the floating dtype dt (map3Kernel; an absent input
// is null), on the call's stream; nothing when n is 0.
template <class F>
inline void mapCall(KernelCall& k, DType dt, F f, const void* a, const void* b, const void* c, void* out, int64_t n) {
  if (n == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, k.name(), T,
                    launchMap3<T>(st, f, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const T*>(c), static_cast<T*>(out), n));
}

}  // namespace nt::cuda
