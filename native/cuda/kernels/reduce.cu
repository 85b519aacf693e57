// Reductions on the cuda backend over the middle axis of a [outer, reduced, inner] view:
// sum, mean, max, min, sum of squares; accumulated in f32, written in the output's dtype.
#include "common.cuh"

namespace nt::cuda {

enum ReduceOp { kSum, kMean, kMax, kMin, kSumSquares };

__device__ __forceinline__ float combine(int op, float acc, float v) {
  switch (op) {
    case kMax: return fmaxf(acc, v);
    case kMin: return fminf(acc, v);
    case kSumSquares: return acc + v * v;
    default: return acc + v;
  }
}
__device__ __forceinline__ float identity(int op) { return op == kMax ? -INFINITY : op == kMin ? INFINITY : 0.0f; }

// inner == 1: one block per row, threads stride along it.
template <typename T, typename O>
__global__ void reduceRowsKernel(int op, const T* x, O* out, int64_t reduced) {
  __shared__ float scratch[32];
  const T* row = x + int64_t(blockIdx.x) * reduced;
  float acc = identity(op);
  for (int64_t j = threadIdx.x; j < reduced; j += blockDim.x) acc = combine(op, acc, toF32(row[j]));
  if (op == kMax) acc = blockMax(acc, scratch);
  else if (op == kMin) acc = -blockMax(-acc, scratch);
  else acc = blockSum(acc, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = fromF32<O>(op == kMean ? acc / float(reduced) : acc);
}

// inner > 1: one thread per (outer, inner) output; neighbouring threads read neighbouring elements.
template <typename T, typename O>
__global__ void reduceColumnsKernel(int op, const T* x, O* out, int64_t outer, int64_t reduced, int64_t inner) {
  NT_GRID_STRIDE(i, outer * inner) {
    int64_t o = i / inner, in = i % inner;
    const T* p = x + o * reduced * inner + in;
    float acc = identity(op);
    for (int64_t j = 0; j < reduced; j++) acc = combine(op, acc, toF32(p[j * inner]));
    out[i] = fromF32<O>(op == kMean ? acc / float(reduced) : acc);
  }
}

// reduce(op, x, out, dtype, outer, reduced, inner, outDtype): op 0 sum, 1 mean, 2 max, 3 min, 4 sum of squares
static Napi::Value Reduce(const Napi::CallbackInfo& info) {
  KernelCall k(info, "reduce");
  k.args.count(8);
  int64_t op = k.args.int64(0);
  if (op < kSum || op > kSumSquares) fail(Err::Argument, "reduce: unknown op " + std::to_string(op));
  DType dt = k.args.dtype(3), ot = k.args.dtype(7);
  int64_t outer = k.args.size(4), reduced = k.args.size(5), inner = k.args.size(6);
  if (reduced == 0 && (op == kMax || op == kMin)) fail(Err::Shape, "reduce: max/min over an empty axis");
  void* x = k.data(1, dt, outer * reduced * inner);
  void* out = k.data(2, ot, outer * inner);
  if (outer * inner == 0) return info.Env().Undefined();
  if (outer > INT32_MAX) fail(Err::Shape, "reduce: more than 2^31 rows");
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "reduce", T, NT_DISPATCH_FLOAT(ot, "reduce", O, {
    if (inner == 1)
      reduceRowsKernel<T, O><<<unsigned(outer), kThreads, 0, st>>>(int(op), static_cast<const T*>(x), static_cast<O*>(out), reduced);
    else
      reduceColumnsKernel<T, O><<<gridFor(outer * inner), kThreads, 0, st>>>(int(op), static_cast<const T*>(x),
                                                                              static_cast<O*>(out), outer, reduced, inner);
  }));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("reduce", Reduce);

}  // namespace nt::cuda
