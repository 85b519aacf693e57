// Elementwise kernels on the cuda backend, with the cpu backend's signatures and op codes (lib/ops calls
// both the same way): binary ops with broadcasting (element strides, 0 on a broadcast dimension), unary
// ops with a scalar parameter and their backward; computed in f32, stored in the tensor's dtype. Operands
// in row-major order go through map3Kernel (16-byte packs where aligned), broadcasts over at most two
// merged dims through binary2dKernel, others through the strided kernel.
#include "../../core/arg_lists.h"
#include "../../core/op_codes.h"
#include "call.cuh"

namespace nt::cuda {

// Op codes: native/core/op_codes.h (the cpu backend compiles the same file; lib/kernel-codes.ts mirrors it).
__device__ __forceinline__ float binary(int op, float x, float y) {
  using namespace binary_op;
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
    int64_t ia, ib;
    s.offsets(i, ia, ib);
    out[i] = fromF32<T>(binary(op, toF32(a[ia]), toF32(b[ib])));
  }
}

__device__ __forceinline__ float unary(int op, float v, float p) {
  using namespace unary_op;
  switch (op) {
    case kNeg: return -v;
    case kExp: return expf(v);
    case kLog: return logf(v);
    case kSqrt: return sqrtf(v);
    case kTanh: return tanhf(v);
    case kPow: return p == 2.0f ? v * v : powf(v, p);
    case kScale: return v * p;
    case kAddScalar: return v + p;
    case kRsub: return p - v;
    default: return p / v;
  }
}

// gradIn from gradOut g, the input x and the output y (whichever the op's derivative needs).
__device__ __forceinline__ float unaryGrad(int op, float x, float y, float gv, float p) {
  using namespace unary_op;
  switch (op) {
    case kNeg: case kRsub: return -gv;
    case kExp: return gv * y;
    case kLog: return gv / x;
    case kSqrt: return gv * 0.5f / y;
    case kTanh: return gv * (1.0f - y * y);
    case kPow: return p == 2.0f ? gv * 2.0f * x : gv * p * powf(x, p - 1.0f);
    case kScale: return gv * p;
    case kAddScalar: return gv;
    default: return -gv * p / (x * x);
  }
}

// The ops as map3Kernel functors (common.cuh): the contiguous path with 16-byte packs.
struct BinaryF {
  int op;
  __device__ __forceinline__ float operator()(float a, float b, float) const { return binary(op, a, b); }
};
struct UnaryF {
  int op;
  float p;
  __device__ __forceinline__ float operator()(float x, float, float) const { return unary(op, x, p); }
};
struct UnaryGradF {
  int op;
  float p;
  __device__ __forceinline__ float operator()(float x, float y, float g) const { return unaryGrad(op, x, y, g, p); }
};

// A broadcast over at most two (merged) dimensions: out[r, c] = a[r·ar + c·ac] op b[r·br + c·bc], rows
// walked by blockIdx.y in strides of gridDim.y and a row's columns by the x threads, so no index is
// divided (a bias row [R, D] + [D], a column [R, D] + [R, 1], a scalar).
template <typename T>
__global__ void binary2dKernel(int op, const T* a, const T* b, T* out, int64_t rows, int64_t cols, int64_t ar, int64_t ac, int64_t br,
                               int64_t bc) {
  int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = first; c < cols; c += stride) out[r * cols + c] = fromF32<T>(binary(op, toF32(a[r * ar + c * ac]), toF32(b[r * br + c * bc])));
}

// One dimension of a binary op after size-1 dims are dropped and neighbours merged.
struct BinaryDim {
  int64_t size, a, b;
};
// Drops size-1 dims and merges a dim into its left neighbour when both operands' strides nest there
// (the output is contiguous, so its strides always nest).
static std::vector<BinaryDim> mergeBinaryDims(const std::vector<int64_t>& shape, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb) {
  std::vector<BinaryDim> dims;
  for (size_t d = 0; d < shape.size(); d++) {
    if (shape[d] == 1) continue;
    BinaryDim cur{shape[d], sa[d], sb[d]};
    if (!dims.empty()) {
      BinaryDim& prev = dims.back();
      if (prev.a == cur.a * cur.size && prev.b == cur.b * cur.size) {
        prev = BinaryDim{prev.size * cur.size, cur.a, cur.b};
        continue;
      }
    }
    dims.push_back(cur);
  }
  return dims;
}

// True when `strides` are the row-major strides of `shape` (size-1 dims may have any stride): the
// operand is read in output order and the contiguous path applies.
static bool rowMajor(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t expect = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    if (strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

// Launches binary op over the non-empty `shape` on `st` (s: the strides of sa and sb as a kernel argument).
template <typename T>
static void launchBinary(cudaStream_t st, int op, const T* a, const T* b, T* out, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& sa, const std::vector<int64_t>& sb, const Strides& s) {
  int64_t n = product(shape);
  std::vector<BinaryDim> dims = mergeBinaryDims(shape, sa, sb);
  if (rowMajor(shape, sa) && rowMajor(shape, sb)) {
    launchMap3<T>(st, BinaryF{op}, a, b, nullptr, out, n);
  } else if (dims.size() <= 2) {
    BinaryDim row = dims.size() == 2 ? dims[0] : BinaryDim{1, 0, 0};
    BinaryDim col = dims.empty() ? BinaryDim{1, 0, 0} : dims.back();
    unsigned threads = col.size >= 256 ? 256 : unsigned((col.size + 31) / 32 * 32);
    int64_t bx = (col.size + threads - 1) / threads;
    dim3 grid(unsigned(bx < 65535 * 8 ? bx : 65535 * 8), unsigned(row.size < 65535 ? row.size : 65535));
    binary2dKernel<T><<<grid, threads, 0, st>>>(op, a, b, out, row.size, col.size, row.a, col.a, row.b, col.b);
  } else {
    binaryKernel<T><<<gridFor(n), kThreads, 0, st>>>(op, a, b, out, n, s);
  }
}

// binary(op, a, b, out, dtype, outShape: Int32Array, aStrides: Int32Array, bStrides: Int32Array)
//   out[idx] = a[idx . aStrides] op b[idx . bStrides]; op: 0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min,
//   6 pow (op_codes.h);
//   strides in elements, 0 broadcasts.
NT_CUDA_KERNEL("binary", Binary) {
  int64_t op = k.args.int64("op");
  if (!validBinaryOp(op)) fail(Err::Argument, "binary: unknown op " + std::to_string(op));
  DType dt = k.args.dtype("dtype");
  std::vector<int64_t> shape = k.args.ints("outShape");
  std::vector<int64_t> sa = k.args.ints("aStrides", int64_t(shape.size())), sb = k.args.ints("bStrides", int64_t(shape.size()));
  Strides s = Strides::of(shape, sa, sb, call);
  int64_t n = product(shape), extentA = stridedExtent(shape, sa, call), extentB = stridedExtent(shape, sb, call);
  if (n == 0) return;
  void* a = k.data("a", dt, extentA);
  void* b = k.data("b", dt, extentB);
  void* out = k.data("out", dt, n);
  cudaStream_t st = k.stream();
  NT_DISPATCH_FLOAT(dt, call, T,
                    launchBinary<T>(st, int(op), static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), shape, sa, sb, s));
}

// The op code of unary and unary_backward, checked against op_codes.h.
static int unaryOp(const KernelCall& k) {
  int64_t op = k.args.int64("op");
  if (!validUnaryOp(op)) fail(Err::Argument, std::string(k.name()) + ": unknown op " + std::to_string(op));
  return int(op);
}

// unary(op, inp, out, n, dtype, p): 0 neg, 1 exp, 2 log, 3 sqrt, 4 tanh, 5 pow(x, p), 6 x·p, 7 x+p,
//   8 p−x, 9 p/x. out may alias inp.
NT_CUDA_KERNEL("unary", Unary) {
  int64_t n = k.args.size("n");
  DType dt = k.args.dtype("dtype");
  float p = float(k.args.number("p"));
  int op = unaryOp(k);
  void* x = k.data("inp", dt, n);
  void* out = k.data("out", dt, n);
  mapCall(k, dt, UnaryF{op, p}, x, nullptr, nullptr, out, n);
}

// unary_backward(op, inp, out, gradOut, gradIn, n, dtype, p): gradIn = gradOut · d unary(op, inp, p)/d inp,
//   reading the saved output where the cpu backend does (exp, sqrt, tanh) and the input elsewhere.
NT_CUDA_KERNEL("unary_backward", UnaryBackward) {
  using namespace unary_op;
  int64_t n = k.args.size("n");
  DType dt = k.args.dtype("dtype");
  float p = float(k.args.number("p"));
  int op = unaryOp(k);
  bool needX = op == kLog || op == kPow || op == kRdiv;
  bool needY = op == kExp || op == kSqrt || op == kTanh;
  void* x = needX ? k.data("inp", dt, n) : nullptr;
  void* y = needY ? k.data("out", dt, n) : nullptr;
  void* g = k.data("gradOut", dt, n);
  void* gi = k.data("gradIn", dt, n);
  mapCall(k, dt, UnaryGradF{op, p}, x, y, g, gi, n);
}

}  // namespace nt::cuda
