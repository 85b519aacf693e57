// The op codes of the elementwise kernels (binary, unary, unary_backward): one definition that both
// backends compile (native/cpu/kernels/elementwise.cc, native/cuda/kernels/elementwise.cu), so a code
// means the same op everywhere and one that a backend would refuse is refused by both.
// lib/kernel-codes.ts mirrors it; test/core/op-codes.test.ts reads this file and checks they agree.
#pragma once
#include <cstdint>

namespace nt {

enum BinaryOp : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kBinaryOpCount = 4 };
enum UnaryOp : int { kNeg = 0, kExp = 1, kLog = 2, kSqrt = 3, kTanh = 4, kPow = 5, kScale = 6, kAddScalar = 7, kRsub = 8, kRdiv = 9, kUnaryOpCount = 10 };

inline bool validBinaryOp(int64_t op) { return op >= 0 && op < kBinaryOpCount; }
inline bool validUnaryOp(int64_t op) { return op >= 0 && op < kUnaryOpCount; }

}  // namespace nt
