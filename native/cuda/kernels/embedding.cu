// Embedding lookup on the cuda backend: forward gathers rows of the table, backward scatters the
// output gradient into an f32 table gradient with atomic adds (order of adds is not fixed).
#include "common.cuh"

namespace nt::cuda {

template <typename T>
__global__ void embeddingForwardKernel(const T* weight, const int32_t* ids, T* out, int64_t n, int64_t dim, int64_t vocab) {
  NT_GRID_STRIDE(i, n * dim) {
    int64_t row = i / dim, col = i % dim;
    int32_t id = ids[row];
    // Ids outside the table give NaN rows (the cpu kernel throws; a kernel cannot, and must not read out of bounds).
    out[i] = id >= 0 && id < vocab ? weight[int64_t(id) * dim + col] : fromF32<T>(NAN);
  }
}

template <typename T>
__global__ void embeddingBackwardKernel(const T* dout, const int32_t* ids, float* dweight, int64_t n, int64_t dim, int64_t vocab) {
  NT_GRID_STRIDE(i, n * dim) {
    int64_t row = i / dim, col = i % dim;
    int32_t id = ids[row];
    if (id >= 0 && id < vocab) atomicAdd(dweight + int64_t(id) * dim + col, toF32(dout[i]));
  }
}

// embeddingForward(weight, ids (i32), out, dtype, n, dim, vocab)
static Napi::Value EmbeddingForward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "embeddingForward");
  k.args.count(7);
  DType dt = k.args.dtype(3);
  int64_t n = k.args.size(4), dim = k.args.size(5), vocab = k.args.size(6);
  void* w = k.data(0, dt, vocab * dim);
  int32_t* ids = k.data<int32_t>(1, DType::I32, n);
  void* out = k.data(2, dt, n * dim);
  if (n * dim == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "embeddingForward", T,
                    embeddingForwardKernel<T><<<gridFor(n * dim), kThreads, 0, st>>>(static_cast<const T*>(w), ids,
                                                                                    static_cast<T*>(out), n, dim, vocab));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("embeddingForward", EmbeddingForward);

// embeddingBackward(dout, ids, dweight (f32, accumulated into), dtype, n, dim, vocab)
static Napi::Value EmbeddingBackward(const Napi::CallbackInfo& info) {
  KernelCall k(info, "embeddingBackward");
  k.args.count(7);
  DType dt = k.args.dtype(3);
  int64_t n = k.args.size(4), dim = k.args.size(5), vocab = k.args.size(6);
  void* dout = k.data(0, dt, n * dim);
  int32_t* ids = k.data<int32_t>(1, DType::I32, n);
  float* dw = k.data<float>(2, DType::F32, vocab * dim);
  if (n * dim == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "embeddingBackward", T,
                    embeddingBackwardKernel<T><<<gridFor(n * dim), kThreads, 0, st>>>(static_cast<const T*>(dout), ids, dw, n,
                                                                                     dim, vocab));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("embeddingBackward", EmbeddingBackward);

}  // namespace nt::cuda
