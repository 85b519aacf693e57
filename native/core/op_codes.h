// The op codes of the elementwise kernels (binary, unary, unary_backward): one definition that both
// backends compile (native/cpu/kernels/elementwise.cc, native/cuda/kernels/elementwise.cu), so a code
// means the same op everywhere and both backends accept and refuse the same codes.
// lib/kernel-codes.ts mirrors it; test/core/op-codes.test.ts reads this file and checks they agree.
// Each list has a namespace of its own: binary pow (a tensor exponent) and unary pow (a scalar
// exponent p) are different ops with different codes.
#pragma once
#include <cstdint>

namespace nt {

namespace binary_op {
// max and min are fmax/fmin (a NaN operand yields the other operand); pow is powf(a, b).
enum BinaryOp : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kMax = 4, kMin = 5, kPow = 6, kBinaryOpCount = 7 };
}  // namespace binary_op
namespace unary_op {
enum UnaryOp : int { kNeg = 0, kExp = 1, kLog = 2, kSqrt = 3, kTanh = 4, kPow = 5, kScale = 6, kAddScalar = 7, kRsub = 8, kRdiv = 9, kUnaryOpCount = 10 };
}  // namespace unary_op

inline bool validBinaryOp(int64_t op) { return op >= 0 && op < binary_op::kBinaryOpCount; }
inline bool validUnaryOp(int64_t op) { return op >= 0 && op < unary_op::kUnaryOpCount; }

}  // namespace nt
