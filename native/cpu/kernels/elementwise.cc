// Elementwise kernels on the cpu backend: broadcasting binary ops, unary ops with a scalar
// parameter, and the backward of the unary ops. Computed in f32 (bf16/f16 through F32View).
#include "../../core/op_codes.h"
#include "util.h"

namespace nt::cpu {

template <class F>
static void binaryLoop(F f, const float* a, const float* b, float* o, const std::vector<int64_t>& shape,
                       const std::vector<int64_t>& sa, const std::vector<int64_t>& sb) {
  size_t rank = shape.size();
  int64_t total = product(shape);
  if (total == 0) return;
  if (rank == 0) { o[0] = f(a[0], b[0]); return; }
  if (rank == 1 && sa[0] == 1 && sb[0] == 1) {  // same-shape operands (gradient accumulation): split over the pool
    parallelRows(total, 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; j++) o[j] = f(a[j], b[j]);
    });
    return;
  }
  int64_t inner = shape[rank - 1], ia = sa[rank - 1], ib = sb[rank - 1];
  forEachStridedRow<2>(shape, {&sa, &sb}, {0, 0}, [&](int64_t base, const std::array<int64_t, 2>& off) {
    float* oo = o + base;
    const float* aa = a + off[0];
    const float* bb = b + off[1];
    if (ia == 1 && ib == 1) for (int64_t j = 0; j < inner; j++) oo[j] = f(aa[j], bb[j]);
    else if (ia == 1 && ib == 0) { float y = bb[0]; for (int64_t j = 0; j < inner; j++) oo[j] = f(aa[j], y); }
    else if (ia == 0 && ib == 1) { float x = aa[0]; for (int64_t j = 0; j < inner; j++) oo[j] = f(x, bb[j]); }
    else for (int64_t j = 0; j < inner; j++) oo[j] = f(aa[j * ia], bb[j * ib]);
  });
}

// binary(op, a, b, out, dtype, outShape: Int32Array, aStrides: Int32Array, bStrides: Int32Array)
//   out[i] = a[i·aStrides] op b[i·bStrides] over outShape (row-major, contiguous out); op 0 add,
//   1 sub, 2 mul, 3 div, 4 max, 5 min (fmax/fmin), 6 pow (op_codes.h). Broadcast dims have stride 0. out may alias a when their shapes match.
NT_KERNEL("binary", Binary) {
  int64_t op = a.int64("op");
  DType dt = a.dtype("dtype");
  auto shape = a.ints("outShape");
  auto sa = a.ints("aStrides", int64_t(shape.size()));
  auto sb = a.ints("bStrides", int64_t(shape.size()));
  if (!validBinaryOp(op)) fail(Err::Argument, "binary: unknown op " + std::to_string(op));
  int64_t n = product(shape);
  int64_t na = stridedExtent(shape, sa, call), nb = stridedExtent(shape, sb, call);
  uint8_t* pa = storageData(info, a.at("a", "so"), call, dt, na);
  uint8_t* pb = storageData(info, a.at("b", "so"), call, dt, nb);
  uint8_t* po = storageData(info, a.at("out", "so"), call, dt, n);
  F32View A(pa, dt, na, true), B(pb, dt, nb, true), O(po, dt, n, false);
  const float *x = A.data(), *y = B.data();
  float* o = O.data();
  using namespace binary_op;
  switch (op) {
    case kAdd: binaryLoop([](float u, float v) { return u + v; }, x, y, o, shape, sa, sb); break;
    case kSub: binaryLoop([](float u, float v) { return u - v; }, x, y, o, shape, sa, sb); break;
    case kMul: binaryLoop([](float u, float v) { return u * v; }, x, y, o, shape, sa, sb); break;
    case kDiv: binaryLoop([](float u, float v) { return u / v; }, x, y, o, shape, sa, sb); break;
    case kMax: binaryLoop([](float u, float v) { return std::fmax(u, v); }, x, y, o, shape, sa, sb); break;
    case kMin: binaryLoop([](float u, float v) { return std::fmin(u, v); }, x, y, o, shape, sa, sb); break;
    default: binaryLoop([](float u, float v) { return std::pow(u, v); }, x, y, o, shape, sa, sb); break;
  }
  O.commit();
}

// The arguments unary and unary_backward share (op, n, dtype, p), read by name.
struct UnaryArgs {
  int64_t op, n;
  DType dt;
  float p;
};
static UnaryArgs unaryArgs(const Args& a) {
  UnaryArgs u{a.int64("op"), a.size("n"), a.dtype("dtype"), float(a.number("p"))};
  if (!validUnaryOp(u.op)) fail(Err::Argument, std::string(a.call) + ": unknown op " + std::to_string(u.op));
  return u;
}

// unary(op, inp, out, n, dtype, p)
//   op 0 neg, 1 exp, 2 log, 3 sqrt, 4 tanh, 5 pow(x, p), 6 x·p, 7 x+p, 8 p−x, 9 p/x. out may alias inp.
NT_KERNEL("unary", Unary) {
  using namespace unary_op;
  auto [op, n, dt, p] = unaryArgs(a);
  F32View I(a, "inp", dt, n, true), O(a, "out", dt, n, false);
  const float* x = I.data();
  float* o = O.data();
  switch (op) {
    case kNeg: for (int64_t i = 0; i < n; i++) o[i] = -x[i]; break;
    case kExp: for (int64_t i = 0; i < n; i++) o[i] = std::exp(x[i]); break;
    case kLog: for (int64_t i = 0; i < n; i++) o[i] = std::log(x[i]); break;
    case kSqrt: for (int64_t i = 0; i < n; i++) o[i] = std::sqrt(x[i]); break;
    case kTanh: for (int64_t i = 0; i < n; i++) o[i] = std::tanh(x[i]); break;
    case kPow:
      if (p == 2.0f) for (int64_t i = 0; i < n; i++) o[i] = x[i] * x[i];
      else for (int64_t i = 0; i < n; i++) o[i] = std::pow(x[i], p);
      break;
    case kScale: for (int64_t i = 0; i < n; i++) o[i] = x[i] * p; break;
    case kAddScalar: for (int64_t i = 0; i < n; i++) o[i] = x[i] + p; break;
    case kRsub: for (int64_t i = 0; i < n; i++) o[i] = p - x[i]; break;
    default: for (int64_t i = 0; i < n; i++) o[i] = p / x[i]; break;
  }
  O.commit();
}

// unary_backward(op, inp, out, gradOut, gradIn, n, dtype, p)
//   gradIn = gradOut · d unary(op, inp, p)/d inp, using the saved output where cheaper (exp, sqrt, tanh).
NT_KERNEL("unary_backward", UnaryBackward) {
  using namespace unary_op;
  auto [op, n, dt, p] = unaryArgs(a);
  bool needX = op == kLog || op == kPow || op == kRdiv;
  bool needY = op == kExp || op == kSqrt || op == kTanh;
  F32View X(a, "inp", dt, n, true, needX);
  F32View Y(a, "out", dt, n, true, needY);
  F32View G(a, "gradOut", dt, n, true), O(a, "gradIn", dt, n, false);
  const float *x = X.data(), *y = Y.data(), *g = G.data();
  float* o = O.data();
  switch (op) {
    case kNeg: case kRsub: for (int64_t i = 0; i < n; i++) o[i] = -g[i]; break;
    case kExp: for (int64_t i = 0; i < n; i++) o[i] = g[i] * y[i]; break;
    case kLog: for (int64_t i = 0; i < n; i++) o[i] = g[i] / x[i]; break;
    case kSqrt: for (int64_t i = 0; i < n; i++) o[i] = g[i] * 0.5f / y[i]; break;
    case kTanh: for (int64_t i = 0; i < n; i++) o[i] = g[i] * (1.0f - y[i] * y[i]); break;
    case kPow:
      if (p == 2.0f) for (int64_t i = 0; i < n; i++) o[i] = g[i] * 2.0f * x[i];
      else for (int64_t i = 0; i < n; i++) o[i] = g[i] * p * std::pow(x[i], p - 1.0f);
      break;
    case kScale: for (int64_t i = 0; i < n; i++) o[i] = g[i] * p; break;
    case kAddScalar: for (int64_t i = 0; i < n; i++) o[i] = g[i]; break;
    default: for (int64_t i = 0; i < n; i++) o[i] = -g[i] * p / (x[i] * x[i]); break;
  }
  O.commit();
}

}  // namespace nt::cpu
