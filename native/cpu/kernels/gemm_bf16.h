// The bf16 GEMM of the cpu backend on AVX512_BF16 (vdpbf16ps: 32 bf16 products per instruction,
// accumulated in f32), chosen at run time; gemm.cc falls back to widening to f32 and cblas_sgemm.
#pragma once
#include <cstdint>

namespace nt::cpu {

// Which bf16 GEMM the cpu backend runs (setBf16Gemm / NODETRON_BF16_GEMM).
enum class Bf16GemmMode : int { Auto = 0, Fallback = 1 };

// Whether this CPU and OS can run the AVX512_BF16 kernel (AVX-512 F/BW/VL/DQ and AVX512_BF16).
bool bf16GemmSupported();
// Whether a bf16 GEMM runs the AVX512_BF16 kernel now: supported, the mode is Auto, and the kernels'
// instruction-set level (cpuIsa) is avx512 (a level forced lower keeps AVX-512 out of every kernel).
bool bf16GemmActive();
Bf16GemmMode bf16GemmMode();
void setBf16GemmMode(Bf16GemmMode mode);

// C = alpha·op(A)·op(B) + beta·C for one row-major GEMM: op(A) is M×K (A is [M, K] with lda, or
// [K, M] when ta), op(B) is K×N (B is [K, N] with ldb, or [N, K] when tb), C is [M, N] with ldc, f32
// (cBf16 false) or bf16 (cBf16 true, rounded to nearest even once, from the f32 sums). Sums are f32
// over K in a fixed order that depends on the shape only (not on the thread count). `threaded`: split
// the product over the kernel thread pool. Only when bf16GemmActive(); K > 0, M > 0, N > 0.
void gemmBf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
              int64_t ldb, float beta, void* C, int64_t ldc, bool cBf16, bool threaded);

}  // namespace nt::cpu
