// Reductions on the cuda backend, with the cpu backend's signatures: sum_to (sum into a
// broadcast-compatible shape, accumulated in double in a fixed order) and max_dim with its backward.
#include "../../core/arg_lists.h"
#include "common.cuh"

namespace nt::cuda {

// One thread per output element: `kept` walks the kept dims (a: input offset, b: output offset),
// `summed` the summed dims (a: input offset). Accumulates in double, as the cpu kernel, and in a
// fixed order, so the result is deterministic.
template <typename T>
__global__ void sumToKernel(const T* x, T* out, int64_t keptCount, Strides kept, int64_t sumCount, Strides summed) {
  NT_GRID_STRIDE(k, keptCount) {
    int64_t base, o, off, unused;
    kept.offsets(k, base, o);
    double acc = 0.0;
    for (int64_t r = 0; r < sumCount; r++) {
      summed.offsets(r, off, unused);
      acc += double(toF32(x[base + off]));
    }
    out[o] = fromF32<T>(float(acc));
  }
}

// sum_to(inp, out, dtype, inShape: Int32Array, outStrides: Int32Array, outCount)
//   out[Σ idx_d·outStrides_d] += inp[idx] over inShape, out first zeroed; outStrides is 0 on summed dims.
static Napi::Value SumTo(const Napi::CallbackInfo& info) {
  const char* call = "sum_to";
  KernelCall k(info, call);
  DType dt = k.args.dtype(2);
  std::vector<int64_t> shape = intList(info, 3, call);
  std::vector<int64_t> so = intList(info, 4, call, int64_t(shape.size()));
  int64_t nOut = k.args.size(5), n = product(shape);
  if (n > 0 && stridedExtent(shape, so, call) > nOut) fail(Err::Argument, "sum_to: output strides reach past the output");
  void* x = k.data(0, dt, n);
  void* out = k.data(1, dt, nOut);
  std::vector<int64_t> keptShape, keptIn, keptOut, sumShape, sumIn;
  int64_t inStride = 1;
  for (size_t d = shape.size(); d-- > 0;) {  // the input is contiguous: row-major strides
    if (so[d] != 0) { keptShape.insert(keptShape.begin(), shape[d]); keptIn.insert(keptIn.begin(), inStride); keptOut.insert(keptOut.begin(), so[d]); }
    else { sumShape.insert(sumShape.begin(), shape[d]); sumIn.insert(sumIn.begin(), inStride); }
    inStride *= shape[d];
  }
  Strides kept = Strides::of(keptShape, keptIn, keptOut, call);
  Strides summed = Strides::of(sumShape, sumIn, std::vector<int64_t>(sumShape.size(), 0), call);
  cudaStream_t st = k.stream();
  if (nOut > 0) check(cudaMemsetAsync(out, 0, size_t(nOut) * dtypeSize(dt), st), "cudaMemsetAsync");
  if (n == 0) return info.Env().Undefined();
  int64_t keptCount = product(keptShape), sumCount = product(sumShape);
  NT_DISPATCH_FLOAT(dt, call, T,
                    sumToKernel<T><<<gridFor(keptCount), kThreads, 0, st>>>(static_cast<const T*>(x), static_cast<T*>(out), keptCount,
                                                                           kept, sumCount, summed));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("sum_to", SumTo);

template <typename T>
__global__ void maxDimKernel(const T* x, T* out, int32_t* arg, int64_t outer, int64_t red, int64_t inner) {
  NT_GRID_STRIDE(k, outer * inner) {
    const T* p = x + (k / inner) * red * inner + k % inner;
    float m = toF32(p[0]);
    int32_t a = 0;
    for (int64_t r = 1; r < red; r++) {
      float v = toF32(p[r * inner]);
      if (v > m || (isnan(v) && !isnan(m))) { m = v; a = int32_t(r); }
    }
    out[k] = fromF32<T>(m);
    arg[k] = a;
  }
}

// Argmax entries outside [0, red) are skipped (the cpu kernel throws; a kernel cannot without a sync).
template <typename T>
__global__ void maxDimBackwardKernel(const T* g, const int32_t* arg, T* gi, int64_t outer, int64_t red, int64_t inner) {
  NT_GRID_STRIDE(k, outer * inner) {
    int32_t a = arg[k];
    if (a >= 0 && a < red) gi[((k / inner) * red + a) * inner + k % inner] = g[k];
  }
}

// max_dim(inp, out, argmax: i32, outer, red, inner, dtype): inp as [outer, red, inner]; first max wins.
static Napi::Value MaxDim(const Napi::CallbackInfo& info) {
  const char* call = "max_dim";
  KernelCall k(info, call);
  int64_t outer = k.args.size(3), red = k.args.size(4), inner = k.args.size(5);
  DType dt = k.args.dtype(6);
  if (red == 0) fail(Err::Shape, "max_dim: cannot take the max over an empty dimension");
  int64_t n = outer * red * inner, m = outer * inner;
  void* x = k.data(0, dt, n);
  void* out = k.data(1, dt, m);
  int32_t* arg = k.data<int32_t>(2, DType::I32, m);
  if (m == 0) return info.Env().Undefined();
  NT_LAUNCH_FLOAT(k, dt, maxDimKernel, gridFor(m), kThreads, static_cast<const T*>(x), static_cast<T*>(out), arg, outer, red, inner);
  return info.Env().Undefined();
}
NT_EXPORT("max_dim", MaxDim);

// max_dim_backward(gradOut, argmax: i32, gradIn, outer, red, inner, dtype): gradIn zero but at the argmax.
static Napi::Value MaxDimBackward(const Napi::CallbackInfo& info) {
  const char* call = "max_dim_backward";
  KernelCall k(info, call);
  int64_t outer = k.args.size(3), red = k.args.size(4), inner = k.args.size(5);
  DType dt = k.args.dtype(6);
  int64_t n = outer * red * inner, m = outer * inner;
  void* g = k.data(0, dt, m);
  int32_t* arg = k.data<int32_t>(1, DType::I32, m);
  void* gi = k.data(2, dt, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  check(cudaMemsetAsync(gi, 0, size_t(n) * dtypeSize(dt), st), "cudaMemsetAsync");
  NT_DISPATCH_FLOAT(dt, call, T,
                    maxDimBackwardKernel<T><<<gridFor(m), kThreads, 0, st>>>(static_cast<const T*>(g), arg, static_cast<T*>(gi), outer, red, inner));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("max_dim_backward", MaxDimBackward);

}  // namespace nt::cuda
