// Reductions on the cpu backend: sum into a broadcast-compatible shape (sum over dims, and the
// backward of broadcasting), and max over one dimension with its argmax for backward.
#include "util.h"

namespace nt::cpu {

// sum_to(inp, out, dtype, inShape: Int32Array, outStrides: Int32Array, outCount)
//   out[Σ idx_d·outStrides_d] += inp[idx] over inShape, out first zeroed; outStrides is 0 on the
//   summed dims. Accumulates in double so long sums stay exact to f32 rounding.
NT_KERNEL("sum_to", SumTo) {
  DType dt = a.dtype("dtype");
  auto shape = a.ints("inShape");
  auto so = a.ints("outStrides", int64_t(shape.size()));
  int64_t nOut = a.size("outCount");
  int64_t n = product(shape);
  if (n > 0 && stridedExtent(shape, so, call) > nOut) fail(Err::Argument, "sum_to: output strides reach past the output");
  F32View I(a, "inp", dt, n, true), O(a, "out", dt, nOut, false);
  std::vector<double> acc(static_cast<size_t>(nOut), 0.0);
  const float* x = I.data();
  size_t rank = shape.size();
  if (n > 0 && rank == 0) acc[0] = x[0];
  if (n > 0 && rank > 0) {
    int64_t inner = shape[rank - 1], io = so[rank - 1];
    forEachStridedRow<1>(shape, {&so}, {0}, [&](int64_t base, const std::array<int64_t, 1>& off) {
      const float* xx = x + base;
      if (io == 0) {
        double s = 0;
        for (int64_t j = 0; j < inner; j++) s += xx[j];
        acc[size_t(off[0])] += s;
      } else {
        double* d = acc.data() + off[0];
        for (int64_t j = 0; j < inner; j++) d[j * io] += xx[j];
      }
    });
  }
  float* o = O.data();
  for (int64_t i = 0; i < nOut; i++) o[i] = float(acc[size_t(i)]);
  O.commit();
}

// max_dim(inp, out, argmax: i32, outer, red, inner, dtype)
//   inp viewed as [outer, red, inner]; out[o, i] = max_r inp[o, r, i], argmax the first r reaching it.
NT_KERNEL("max_dim", MaxDim) {
  int64_t outer = a.size("outer"), red = a.size("red"), inner = a.size("inner");
  DType dt = a.dtype("dtype");
  if (red == 0) fail(Err::Shape, "max_dim: cannot take the max over an empty dimension");
  int64_t n = outer * red * inner, m = outer * inner;
  F32View I(a, "inp", dt, n, true), O(a, "out", dt, m, false);
  int32_t* arg = reinterpret_cast<int32_t*>(storageData(info, a.at("argmax", "so"), call, DType::I32, m));
  const float* x = I.data();
  float* o = O.data();
  for (int64_t b = 0; b < outer; b++) {
    for (int64_t i = 0; i < inner; i++) { o[b * inner + i] = x[b * red * inner + i]; arg[b * inner + i] = 0; }
    for (int64_t r = 1; r < red; r++) {
      const float* row = x + (b * red + r) * inner;
      for (int64_t i = 0; i < inner; i++) {
        if (row[i] > o[b * inner + i] || (std::isnan(row[i]) && !std::isnan(o[b * inner + i]))) {
          o[b * inner + i] = row[i];
          arg[b * inner + i] = int32_t(r);
        }
      }
    }
  }
  O.commit();
}

// max_dim_backward(gradOut, argmax: i32, gradIn, outer, red, inner, dtype)
//   gradIn[o, argmax[o, i], i] = gradOut[o, i]; every other element 0.
NT_KERNEL("max_dim_backward", MaxDimBackward) {
  int64_t outer = a.size("outer"), red = a.size("red"), inner = a.size("inner");
  DType dt = a.dtype("dtype");
  int64_t n = outer * red * inner, m = outer * inner;
  F32View G(a, "gradOut", dt, m, true), O(a, "gradIn", dt, n, false);
  const int32_t* arg = reinterpret_cast<const int32_t*>(storageData(info, a.at("argmax", "so"), call, DType::I32, m));
  for (int64_t k = 0; k < m; k++)
    if (arg[k] < 0 || arg[k] >= red) fail(Err::Argument, "max_dim_backward: argmax index out of range");
  float* o = O.data();
  std::fill(o, o + n, 0.0f);
  for (int64_t b = 0; b < outer; b++)
    for (int64_t i = 0; i < inner; i++) o[(b * red + arg[b * inner + i]) * inner + i] = G.data()[b * inner + i];
  O.commit();
}

}  // namespace nt::cpu
