// Elementwise kernels on the cuda backend: binary ops with broadcasting (by element strides, 0 on a
// broadcast dimension) and unary ops, computed in f32 and stored in the tensor's dtype.
#include "common.cuh"

namespace nt::cuda {

constexpr int kMaxDims = 8;
struct Strides {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t a[kMaxDims];
  int64_t b[kMaxDims];
};

enum BinaryOp { kAdd, kSub, kMul, kDiv, kMax, kMin, kPow };
enum UnaryOp { kNeg, kExp, kLog, kSqrt, kRsqrt, kTanh, kRelu, kSigmoid, kAbs, kScale, kAddScalar, kSquare };

__device__ __forceinline__ float binary(int op, float x, float y) {
  switch (op) {
    case kAdd: return x + y;
    case kSub: return x - y;
    case kMul: return x * y;
    case kDiv: return x / y;
    case kMax: return fmaxf(x, y);
    case kMin: return fminf(x, y);
    default: return powf(x, y);
  }
}

template <typename T>
__global__ void binaryKernel(int op, const T* a, const T* b, T* out, int64_t n, Strides s) {
  NT_GRID_STRIDE(i, n) {
    int64_t rem = i, ia = 0, ib = 0;
    for (int d = s.ndim - 1; d >= 0; d--) {
      int64_t c = rem % s.shape[d];
      rem /= s.shape[d];
      ia += c * s.a[d];
      ib += c * s.b[d];
    }
    out[i] = fromF32<T>(binary(op, toF32(a[ia]), toF32(b[ib])));
  }
}

template <typename T>
__global__ void unaryKernel(int op, const T* x, T* out, int64_t n, float alpha) {
  NT_GRID_STRIDE(i, n) {
    float v = toF32(x[i]), r;
    switch (op) {
      case kNeg: r = -v; break;
      case kExp: r = expf(v); break;
      case kLog: r = logf(v); break;
      case kSqrt: r = sqrtf(v); break;
      case kRsqrt: r = rsqrtf(v); break;
      case kTanh: r = tanhf(v); break;
      case kRelu: r = v > 0.0f ? v : 0.0f; break;
      case kSigmoid: r = 1.0f / (1.0f + expf(-v)); break;
      case kAbs: r = fabsf(v); break;
      case kScale: r = v * alpha; break;
      case kAddScalar: r = v + alpha; break;
      default: r = v * v;
    }
    out[i] = fromF32<T>(r);
  }
}

static std::vector<int64_t> intList(const Napi::CallbackInfo& info, size_t i, const char* call) {
  if (!info[i].IsArray()) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must be an array of integers");
  Napi::Array arr = info[i].As<Napi::Array>();
  std::vector<int64_t> v(arr.Length());
  for (uint32_t j = 0; j < arr.Length(); j++) {
    Napi::Value x = arr.Get(j);
    if (!x.IsNumber()) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must hold integers");
    double d = x.As<Napi::Number>().DoubleValue();
    if (d < 0 || d != double(int64_t(d))) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must hold non-negative integers");
    v[j] = int64_t(d);
  }
  return v;
}

// binary(op, a, b, out, dtype, outShape, aStrides, bStrides): out[idx] = a[idx . aStrides] op b[idx . bStrides]
//   op: 0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min, 6 pow; strides in elements, 0 broadcasts.
static Napi::Value Binary(const Napi::CallbackInfo& info) {
  KernelCall k(info, "binary");
  k.args.count(8);
  int64_t op = k.args.int64(0);
  if (op < kAdd || op > kPow) fail(Err::Argument, "binary: unknown op " + std::to_string(op));
  DType dt = k.args.dtype(4);
  std::vector<int64_t> shape = intList(info, 5, "binary"), sa = intList(info, 6, "binary"), sb = intList(info, 7, "binary");
  if (shape.size() > kMaxDims || sa.size() != shape.size() || sb.size() != shape.size())
    fail(Err::Shape, "binary: shape and strides must have the same length (at most 8)");
  Strides s{int(shape.size()), {}, {}, {}};
  int64_t n = 1, extentA = 1, extentB = 1;
  for (size_t d = 0; d < shape.size(); d++) {
    s.shape[d] = shape[d];
    s.a[d] = sa[d];
    s.b[d] = sb[d];
    n *= shape[d];
    extentA += (shape[d] - 1) * sa[d];
    extentB += (shape[d] - 1) * sb[d];
  }
  if (n == 0) return info.Env().Undefined();
  void* a = k.data(1, dt, extentA);
  void* b = k.data(2, dt, extentB);
  void* out = k.data(3, dt, n);
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "binary", T,
                    binaryKernel<T><<<gridFor(n), kThreads, 0, st>>>(int(op), static_cast<const T*>(a), static_cast<const T*>(b),
                                                                     static_cast<T*>(out), n, s));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("binary", Binary);

// unary(op, x, out, dtype, n, alpha): 0 neg, 1 exp, 2 log, 3 sqrt, 4 rsqrt, 5 tanh, 6 relu,
//   7 sigmoid, 8 abs, 9 scale by alpha, 10 add alpha, 11 square
static Napi::Value Unary(const Napi::CallbackInfo& info) {
  KernelCall k(info, "unary");
  k.args.count(6);
  int64_t op = k.args.int64(0);
  if (op < kNeg || op > kSquare) fail(Err::Argument, "unary: unknown op " + std::to_string(op));
  DType dt = k.args.dtype(3);
  int64_t n = k.args.size(4);
  float alpha = float(k.args.number(5));
  void* x = k.data(1, dt, n);
  void* out = k.data(2, dt, n);
  if (n == 0) return info.Env().Undefined();
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, "unary", T,
                    unaryKernel<T><<<gridFor(n), kThreads, 0, st>>>(int(op), static_cast<const T*>(x), static_cast<T*>(out), n, alpha));
  k.launched();
  return info.Env().Undefined();
}
NT_EXPORT("unary", Unary);

}  // namespace nt::cuda
