// Reductions on the cuda backend, with the cpu backend's signatures: sum_to (sum into a
// broadcast-compatible shape, accumulated in double in a fixed order) and max_dim with its backward.
#include "../../core/arg_lists.h"
#include "common.cuh"

namespace nt::cuda {

// The general case: one thread per output element. `kept` walks the kept dims (a: input offset, b:
// output offset), `summed` the summed dims (a: input offset). Accumulates in double, as the cpu
// kernel, and in a fixed order, so the result is deterministic. Shapes that reduce to a contiguous
// pattern (a full sum, row sums, column sums) take the block-parallel kernels of common.cuh instead.
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

// Element (r, c) of a contiguous [batch, rows, cols] array seen as `rows` rows of batch·cols columns
// (column c = b·cols + j): the column sums over rows are the sums over the middle dimension.
template <typename T>
struct BatchedColumnRead {
  const T* x;
  int64_t rows, cols;
  __device__ __forceinline__ const T* column(int64_t c) const {
    int64_t b = c / cols;
    return x + b * rows * cols + (c - b * cols);
  }
  __device__ __forceinline__ void add(const T* col, int64_t r, double* acc) const { acc[0] += double(toF32(col[r * cols])); }
};

// One dimension of sum_to after size-1 dimensions are dropped and neighbours merged.
struct SumDim {
  int64_t size, outStride;  // outStride 0: summed
};

// Launches sum_to on `st` for a non-empty contiguous input x of `shape` (T its storage type):
// out[Σ idx_d·so_d] = Σ x[idx], every one of the nOut outputs written (zero where nothing lands).
template <typename T>
static void launchSumTo(int dev, cudaStream_t st, const T* xt, T* ot, const std::vector<int64_t>& shape, const std::vector<int64_t>& so,
                        int64_t nOut, const char* call) {
  int64_t n = product(shape);
  // The contiguous patterns: drop size-1 dims (their index is always 0), merge neighbouring summed
  // dims (the input is contiguous) and neighbouring kept dims whose output strides nest.
  std::vector<SumDim> dims;
  for (size_t d = 0; d < shape.size(); d++) {
    if (shape[d] == 1) continue;
    SumDim cur{shape[d], so[d]};
    if (!dims.empty()) {
      SumDim& prev = dims.back();
      if (prev.outStride == 0 && cur.outStride == 0) { prev.size *= cur.size; continue; }
      if (prev.outStride != 0 && cur.outStride != 0 && prev.outStride == cur.outStride * cur.size) {
        prev.size *= cur.size;
        prev.outStride = cur.outStride;
        continue;
      }
    }
    dims.push_back(cur);
  }
  auto kept = [](const SumDim& d) { return d.outStride != 0; };
  size_t nd = dims.size();
  int pattern = 0;  // 1: full sum, 2: [K, S] row sums, 3: [S, K] column sums, 4: [B, S, K] batched column sums
  if (nd == 0 || (nd == 1 && !kept(dims[0]))) pattern = 1;
  else if (nd == 2 && kept(dims[0]) && dims[0].outStride == 1 && !kept(dims[1])) pattern = 2;
  else if (nd == 2 && !kept(dims[0]) && kept(dims[1]) && dims[1].outStride == 1) pattern = 3;
  else if (nd == 3 && kept(dims[0]) && !kept(dims[1]) && kept(dims[2]) && dims[2].outStride == 1 && dims[0].outStride == dims[2].size)
    pattern = 4;
  int64_t keptCount = 1;
  for (const SumDim& d : dims)
    if (kept(d)) keptCount *= d.size;
  // The fast paths write outputs [0, keptCount); anything else leaves gaps that must read as zero.
  if (pattern == 0 || nOut != keptCount) check(cudaMemsetAsync(ot, 0, size_t(nOut) * sizeof(T), st), "cudaMemsetAsync");
  switch (pattern) {
    case 1: launchRowSums<T, false, T>(dev, st, xt, 1, n, ot, call); break;
    case 2: launchRowSums<T, false, T>(dev, st, xt, dims[0].size, dims[1].size, ot, call); break;
    case 3: launchColumnSums<1>(dev, st, BatchedColumnRead<T>{xt, dims[0].size, dims[1].size}, dims[0].size, dims[1].size, ot,
                                static_cast<T*>(nullptr), call); break;
    case 4: launchColumnSums<1>(dev, st, BatchedColumnRead<T>{xt, dims[1].size, dims[2].size}, dims[1].size, dims[0].size * dims[2].size,
                                ot, static_cast<T*>(nullptr), call); break;
    default: {
      std::vector<int64_t> keptShape, keptIn, keptOut, sumShape, sumIn;
      int64_t inStride = 1;
      for (size_t d = shape.size(); d-- > 0;) {  // the input is contiguous: row-major strides
        if (so[d] != 0) { keptShape.insert(keptShape.begin(), shape[d]); keptIn.insert(keptIn.begin(), inStride); keptOut.insert(keptOut.begin(), so[d]); }
        else { sumShape.insert(sumShape.begin(), shape[d]); sumIn.insert(sumIn.begin(), inStride); }
        inStride *= shape[d];
      }
      Strides ks = Strides::of(keptShape, keptIn, keptOut, call);
      Strides ss = Strides::of(sumShape, sumIn, std::vector<int64_t>(sumShape.size(), 0), call);
      int64_t kc = product(keptShape), sc = product(sumShape);
      sumToKernel<T><<<gridFor(kc), kThreads, 0, st>>>(xt, ot, kc, ks, sc, ss);
    }
  }
}

// sum_to(inp, out, dtype, inShape: Int32Array, outStrides: Int32Array, outCount)
//   out[Σ idx_d·outStrides_d] += inp[idx] over inShape, out first zeroed; outStrides is 0 on summed dims.
NT_CUDA_KERNEL("sum_to", SumTo) {
  DType dt = k.args.dtype("dtype");
  std::vector<int64_t> shape = k.args.ints("inShape");
  std::vector<int64_t> so = k.args.ints("outStrides", int64_t(shape.size()));
  int64_t nOut = k.args.size("outCount"), n = product(shape);
  if (n > 0 && stridedExtent(shape, so, call) > nOut) fail(Err::Argument, "sum_to: output strides reach past the output");
  void* x = k.data("inp", dt, n);
  void* out = k.data("out", dt, nOut);
  cudaStream_t st = k.stream();
  if (n == 0) {
    if (nOut > 0) check(cudaMemsetAsync(out, 0, size_t(nOut) * dtypeSize(dt), st), "cudaMemsetAsync");
    return;
  }
  NT_DISPATCH_FLOAT(dt, call, T, launchSumTo<T>(k.device(), st, static_cast<const T*>(x), static_cast<T*>(out), shape, so, nOut, call));
}

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
NT_CUDA_KERNEL("max_dim", MaxDim) {
  int64_t outer = k.args.size("outer"), red = k.args.size("red"), inner = k.args.size("inner");
  DType dt = k.args.dtype("dtype");
  if (red == 0) fail(Err::Shape, "max_dim: cannot take the max over an empty dimension");
  int64_t n = outer * red * inner, m = outer * inner;
  void* x = k.data("inp", dt, n);
  void* out = k.data("out", dt, m);
  int32_t* arg = k.data<int32_t>("argmax", DType::I32, m);
  if (m == 0) return;
  NT_LAUNCH_FLOAT(k, dt, maxDimKernel, gridFor(m), kThreads, static_cast<const T*>(x), static_cast<T*>(out), arg, outer, red, inner);
}

// max_dim_backward(gradOut, argmax: i32, gradIn, outer, red, inner, dtype): gradIn zero but at the argmax.
NT_CUDA_KERNEL("max_dim_backward", MaxDimBackward) {
  int64_t outer = k.args.size("outer"), red = k.args.size("red"), inner = k.args.size("inner");
  DType dt = k.args.dtype("dtype");
  int64_t n = outer * red * inner, m = outer * inner;
  void* g = k.data("gradOut", dt, m);
  int32_t* arg = k.data<int32_t>("argmax", DType::I32, m);
  void* gi = k.data("gradIn", dt, n);
  if (n == 0) return;
  cudaStream_t st = k.stream();
  check(cudaMemsetAsync(gi, 0, size_t(n) * dtypeSize(dt), st), "cudaMemsetAsync");
  NT_DISPATCH_FLOAT(dt, call, T,
                    maxDimBackwardKernel<T><<<gridFor(m), kThreads, 0, st>>>(static_cast<const T*>(g), arg, static_cast<T*>(gi), outer, red, inner));
}

}  // namespace nt::cuda
