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


// embedding_forward(ids: i32 [n], weight [vocab, dim], out [n, dim], n, vocab, dim, dtype): the cpu signature.
NT_CUDA_KERNEL("embedding_forward", EmbeddingForwardAbi) {
  int64_t n = k.args.size("n"), vocab = k.args.size("vocab"), dim = k.args.size("dim");
  DType dt = k.args.dtype("dtype");
  int32_t* ids = k.data<int32_t>("ids", DType::I32, n);
  void* w = k.data("weight", dt, vocab * dim);
  void* out = k.data("out", dt, n * dim);
  if (n * dim == 0) return;
  NT_LAUNCH_FLOAT(k, dt, embeddingForwardKernel, gridFor(n * dim), kThreads,
                  static_cast<const T*>(w), ids, static_cast<T*>(out), n, dim, vocab);
}

// embedding_backward(ids: i32 [n], gradOut [n, dim], gradWeight [vocab, dim], n, vocab, dim, dtype):
//   gradWeight overwritten; sums in f32 (in place for f32, else in scratch then rounded once).
NT_CUDA_KERNEL("embedding_backward", EmbeddingBackwardAbi) {
  int64_t n = k.args.size("n"), vocab = k.args.size("vocab"), dim = k.args.size("dim"), m = vocab * dim;
  DType dt = k.args.dtype("dtype");
  int32_t* ids = k.data<int32_t>("ids", DType::I32, n);
  void* g = k.data("gradOut", dt, n * dim);
  void* gw = k.data("gradWeight", dt, m);
  if (m == 0) return;
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T, {
    bool direct = dt == DType::F32;
    DeviceScratch scratch(k.device(), direct ? sizeof(float) : size_t(m) * sizeof(float), call);
    float* acc = direct ? static_cast<float*>(gw) : scratch.as<float>();
    check(cudaMemsetAsync(acc, 0, size_t(m) * sizeof(float), st), "cudaMemsetAsync");
    if (n * dim > 0)
      embeddingBackwardKernel<T><<<gridFor(n * dim), kThreads, 0, st>>>(static_cast<const T*>(g), ids, acc, n, dim, vocab);
    if (!direct) storeF32Kernel<T><<<gridFor(m), kThreads, 0, st>>>(acc, static_cast<T*>(gw), m);
    k.launched();
  });
}

}  // namespace nt::cuda
