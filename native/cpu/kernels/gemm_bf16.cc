// bf16 GEMM on AVX512_BF16: vdpbf16ps multiplies 16 lanes of bf16 pairs and adds both products to
// f32 accumulators, twice the multiply-adds of an f32 FMA per instruction. The product is blocked as
// in GotoBLAS/BLIS: panels of op(B) (KC × NC) and op(A) (MC × KC) are packed into the layout the
// instruction reads (consecutive k in pairs: one 32-bit word per row of A or column of B per pair),
// and a register-blocked micro-kernel (MR rows × NR columns of C in 24 zmm accumulators) runs over
// the packed panels. The threads of the kernel pool each take a contiguous range of C's rows or
// columns (whichever is longer) and pack their own panels, so each element's sum is computed the same
// way whatever the thread count. Only the kernel part of this file is compiled for AVX-512 + BF16
// (GCC target pragma); gemm.cc calls it only when bf16GemmActive(), so the addon still loads and runs
// on CPUs without these instructions. On other architectures (arm64) the kernel is not compiled:
// bf16GemmSupported() is false there and bf16 GEMMs are widened to f32 for cblas_sgemm.
#include "gemm_bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "util.h"

namespace nt::cpu {

namespace {
std::atomic<int> gMode{int(Bf16GemmMode::Auto)};
bool detectBf16() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}
const bool gSupported = detectBf16();
}  // namespace

bool bf16GemmSupported() { return gSupported; }
Bf16GemmMode bf16GemmMode() { return Bf16GemmMode(gMode.load(std::memory_order_relaxed)); }
void setBf16GemmMode(Bf16GemmMode mode) { gMode.store(int(mode), std::memory_order_relaxed); }
#if defined(__x86_64__)
bool bf16GemmActive() {
  return gSupported && gMode.load(std::memory_order_relaxed) == int(Bf16GemmMode::Auto) && cpuIsa() == Isa::Avx512;
}

// ---- packing buffers (per thread, grown as needed, 64-byte aligned) ------------------------------
namespace {
struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  ~Buf() { std::free(p); }
  uint32_t* get(size_t want) {
    if (want > bytes) {
      std::free(p);
      size_t b = (want + 63) / 64 * 64;
      p = std::aligned_alloc(64, b);
      if (!p) {
        bytes = 0;
        throw std::bad_alloc();
      }
      bytes = b;
    }
    return static_cast<uint32_t*>(p);
  }
};
thread_local Buf tA, tB;

// Register block: MR rows × NR = 16·NV columns of C; MR·NV = 24 accumulators (of 32 zmm registers),
// 2 loads of B and 12 broadcasts of A per pair of k.
constexpr int MR = 12;
constexpr int NV = 2;
constexpr int NR = 16 * NV;
// Cache blocks: K in blocks of at most KC (even, so only the last block can end in half a pair); A
// in blocks of MC rows (MC × KC bf16 stay in L2); B in blocks of NC columns.
constexpr int64_t KC = 768;
constexpr int64_t MC = 96;
constexpr int64_t NC = 1536;

inline uint32_t pairOf(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }
inline uint32_t load32(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Packs op(A)[i0 .. i0+mc, k0 .. k0+kc) into panels of MR rows: panel q holds kp = ceil(kc/2) pairs,
// word (p, i) = (A(i0+q·MR+i, k0+2p), A(i0+q·MR+i, k0+2p+1)) at dst[q·kp·MR + p·MR + i]; rows past mc
// and the odd k past kc are zero.
void packA(bool ta, const uint16_t* A, int64_t lda, int64_t i0, int64_t mc, int64_t k0, int64_t kc, uint32_t* dst) {
  int64_t kp = (kc + 1) / 2, full = kc / 2;
  for (int64_t q = 0; q * MR < mc; q++) {
    uint32_t* d = dst + q * kp * MR;
    int64_t rows = std::min<int64_t>(MR, mc - q * MR);
    if (!ta) {
      for (int64_t i = 0; i < rows; i++) {
        const uint16_t* s = A + (i0 + q * MR + i) * lda + k0;
        for (int64_t p = 0; p < full; p++) d[p * MR + i] = load32(s + 2 * p);
        if (kc & 1) d[full * MR + i] = pairOf(s[kc - 1], 0);
      }
    } else {
      for (int64_t p = 0; p < kp; p++) {
        const uint16_t* s0 = A + (k0 + 2 * p) * lda + i0 + q * MR;
        const uint16_t* s1 = 2 * p + 1 < kc ? s0 + lda : nullptr;
        for (int64_t i = 0; i < rows; i++) d[p * MR + i] = pairOf(s0[i], s1 ? s1[i] : 0);
      }
    }
    for (int64_t i = rows; i < MR; i++)
      for (int64_t p = 0; p < kp; p++) d[p * MR + i] = 0;
  }
}

// Packs op(B)[k0 .. k0+kc, j0 .. j0+nc) into panels of NR columns: word (p, j) = (B(k0+2p, j),
// B(k0+2p+1, j)) at dst[q·kp·NR + p·NR + j]; columns past nc and the odd k past kc are zero.
void packB(bool tb, const uint16_t* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t nc, uint32_t* dst) {
  int64_t kp = (kc + 1) / 2, full = kc / 2;
  for (int64_t q = 0; q * NR < nc; q++) {
    uint32_t* d = dst + q * kp * NR;
    int64_t cols = std::min<int64_t>(NR, nc - q * NR);
    if (tb) {
      for (int64_t j = 0; j < cols; j++) {
        const uint16_t* s = B + (j0 + q * NR + j) * ldb + k0;
        for (int64_t p = 0; p < full; p++) d[p * NR + j] = load32(s + 2 * p);
        if (kc & 1) d[full * NR + j] = pairOf(s[kc - 1], 0);
      }
    } else {
      for (int64_t p = 0; p < kp; p++) {
        const uint16_t* s0 = B + (k0 + 2 * p) * ldb + j0 + q * NR;
        const uint16_t* s1 = 2 * p + 1 < kc ? s0 + ldb : nullptr;
        for (int64_t j = 0; j < cols; j++) d[p * NR + j] = pairOf(s0[j], s1 ? s1[j] : 0);
      }
    }
    for (int64_t j = cols; j < NR; j++)
      for (int64_t p = 0; p < kp; p++) d[p * NR + j] = 0;
  }
}

// How the micro-kernel stores its tile: C = alpha·acc + beta·C (the first k block; beta 0 reads no C),
// C += alpha·acc (later k blocks, f32 C only), or bf16 C = round(alpha·acc + beta·C) (one k block).
struct Store {
  float alpha, beta;
  bool first;
  bool bf16;
};
}  // namespace

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
// GCC 12's _mm512_cvtepu16_epi32 starts from _mm512_undefined_epi32, which its own warnings flag.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// The micro-kernel: R (≤ MR) rows × NR columns of C from kp pairs of packed A (stride MR) and B.
// Only the first `cols` columns are stored (masked).
template <int R>
__attribute__((noinline)) void micro(int64_t kp, const uint32_t* __restrict a, const uint32_t* __restrict b, void* c, int64_t ldc,
                                     int64_t cols, const Store& st) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int i = 0; i < R; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; p++) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_load_si512(b + p * NR + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < R; i++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[p * MR + i]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
  __mmask16 mask[NV];
  for (int v = 0; v < NV; v++) {
    int64_t n = std::clamp<int64_t>(cols - 16 * v, 0, 16);
    mask[v] = __mmask16((1u << n) - 1u);
  }
  const __m512 alpha = _mm512_set1_ps(st.alpha), beta = _mm512_set1_ps(st.beta);
  if (st.bf16) {
    auto* cr = static_cast<uint16_t*>(c);
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
        if (!mask[v]) continue;
        uint16_t* p = cr + i * ldc + 16 * v;
        __m512 r = _mm512_mul_ps(acc[i][v], alpha);
        if (st.beta != 0.0f) {
          __m256i old = _mm256_maskz_loadu_epi16(mask[v], p);
          __m512 oldf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16));
          r = _mm512_fmadd_ps(oldf, beta, r);
        }
        __m256i h = (__m256i)_mm512_cvtneps_pbh(r);
        _mm256_mask_storeu_epi16(p, mask[v], h);
      }
    return;
  }
  auto* cr = static_cast<float*>(c);
#pragma GCC unroll 16
  for (int i = 0; i < R; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      if (!mask[v]) continue;
      float* p = cr + i * ldc + 16 * v;
      __m512 r;
      if (!st.first) r = _mm512_fmadd_ps(acc[i][v], alpha, _mm512_maskz_loadu_ps(mask[v], p));
      else if (st.beta != 0.0f) r = _mm512_fmadd_ps(acc[i][v], alpha, _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mask[v], p)));
      else r = _mm512_mul_ps(acc[i][v], alpha);
      _mm512_mask_storeu_ps(p, mask[v], r);
    }
}

using MicroFn = void (*)(int64_t, const uint32_t*, const uint32_t*, void*, int64_t, int64_t, const Store&);
const MicroFn kMicro[MR + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>,
                                micro<7>, micro<8>, micro<9>, micro<10>, micro<11>, micro<12>};

}  // namespace

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace {

struct Problem {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  const uint16_t* A;
  int64_t lda;
  const uint16_t* B;
  int64_t ldb;
  void* C;
  int64_t ldc;
  bool cBf16;
};

// The blocked product over C's rows [m0, m1) and columns [n0, n1), on this thread.
void gemmRange(const Problem& P, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m0 >= m1 || n0 >= n1) return;
  const int64_t es = P.cBf16 ? 2 : 4;
  auto* C = static_cast<uint8_t*>(P.C);
  // K in equal blocks of at most KC (even sizes), so no block is a sliver.
  int64_t kBlocks = (P.K + KC - 1) / KC;
  int64_t kcStep = ((P.K + kBlocks - 1) / kBlocks + 1) / 2 * 2;
  int64_t ncMax = std::min<int64_t>(NC, (n1 - n0 + NR - 1) / NR * NR);
  int64_t mcMax = std::min<int64_t>(MC, (m1 - m0 + MR - 1) / MR * MR);
  int64_t kpMax = (std::min(kcStep, P.K) + 1) / 2;
  uint32_t* bufB = tB.get(size_t(kpMax * ncMax) * 4);
  uint32_t* bufA = tA.get(size_t(kpMax * mcMax) * 4);
  for (int64_t jc = n0; jc < n1; jc += NC) {
    int64_t nc = std::min(NC, n1 - jc);
    for (int64_t pc = 0; pc < P.K; pc += kcStep) {
      int64_t kc = std::min(kcStep, P.K - pc), kp = (kc + 1) / 2;
      packB(P.tb, P.B, P.ldb, pc, kc, jc, nc, bufB);
      Store st{P.alpha, P.beta, pc == 0, P.cBf16};
      for (int64_t ic = m0; ic < m1; ic += MC) {
        int64_t mc = std::min(MC, m1 - ic);
        packA(P.ta, P.A, P.lda, ic, mc, pc, kc, bufA);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const uint32_t* bp = bufB + (jr / NR) * kp * NR;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t rows = std::min<int64_t>(MR, mc - ir);
            void* c = C + ((ic + ir) * P.ldc + jc + jr) * es;
            kMicro[rows](kp, bufA + (ir / MR) * kp * MR, bp, c, P.ldc, nc - jr, st);
          }
        }
      }
    }
  }
}

// The threaded product: for each block of op(B) (KC × NC), the threads first pack its panels together
// (each a share of them), then each computes a contiguous range of C's rows (MR multiples, packing its
// own rows of A) against all of them; when C has too few rows for that, each takes a range of the
// block's NR-column panels and packs all of A's (few) rows itself. Two pool calls per block.
struct Threaded {
  const Problem* P;
  int64_t parts;
  int64_t jc, nc, pc, kc, kp;
  uint32_t* bufB;
  bool byRows;
  int64_t rowChunk;  // rows per part (a multiple of MR) when byRows
};

void packBTask(void* p, int64_t part) {
  auto* t = static_cast<Threaded*>(p);
  int64_t panels = (t->nc + NR - 1) / NR, per = (panels + t->parts - 1) / t->parts;
  int64_t q0 = part * per, q1 = std::min(panels, q0 + per);
  if (q0 < q1)
    packB(t->P->tb, t->P->B, t->P->ldb, t->pc, t->kc, t->jc + q0 * NR, std::min(t->nc - q0 * NR, (q1 - q0) * NR), t->bufB + q0 * t->kp * NR);
}

void computeTask(void* p, int64_t part) {
  auto* t = static_cast<Threaded*>(p);
  const Problem& P = *t->P;
  const int64_t es = P.cBf16 ? 2 : 4;
  auto* C = static_cast<uint8_t*>(P.C);
  Store st{P.alpha, P.beta, t->pc == 0, P.cBf16};
  int64_t r0 = 0, r1 = P.M, q0 = 0, q1 = (t->nc + NR - 1) / NR;
  if (t->byRows) {
    r0 = part * t->rowChunk;
    r1 = std::min(P.M, r0 + t->rowChunk);
  } else {
    int64_t per = (q1 + t->parts - 1) / t->parts;
    q0 = part * per;
    q1 = std::min(q1, q0 + per);
  }
  if (r0 >= r1 || q0 >= q1) return;
  uint32_t* bufA = tA.get(size_t(t->kp * std::min<int64_t>(MC, (r1 - r0 + MR - 1) / MR * MR)) * 4);
  for (int64_t ic = r0; ic < r1; ic += MC) {
    int64_t mc = std::min(MC, r1 - ic);
    packA(P.ta, P.A, P.lda, ic, mc, t->pc, t->kc, bufA);
    for (int64_t q = q0; q < q1; q++) {
      int64_t jr = q * NR;
      const uint32_t* bp = t->bufB + q * t->kp * NR;
      for (int64_t ir = 0; ir < mc; ir += MR) {
        int64_t rows = std::min<int64_t>(MR, mc - ir);
        void* c = C + ((ic + ir) * P.ldc + t->jc + jr) * es;
        kMicro[rows](t->kp, bufA + (ir / MR) * t->kp * MR, bp, c, P.ldc, t->nc - jr, st);
      }
    }
  }
}

void gemmThreaded(const Problem& P, int64_t threads) {
  int64_t kBlocks = (P.K + KC - 1) / KC;
  int64_t kcStep = ((P.K + kBlocks - 1) / kBlocks + 1) / 2 * 2;
  int64_t kpMax = (std::min(kcStep, P.K) + 1) / 2;
  // Column blocks of op(B) of about 3 MiB packed (at least NC columns): fewer re-packs of A when K is short.
  int64_t ncStep = std::max<int64_t>(NC, (int64_t(3) << 20) / (4 * kpMax) / NR * NR);
  int64_t ncMax = std::min<int64_t>(ncStep, (P.N + NR - 1) / NR * NR);
  Threaded t{&P, threads, 0, 0, 0, 0, 0, tB.get(size_t(kpMax * ncMax) * 4), false, 0};
  int64_t rowUnits = (P.M + MR - 1) / MR;
  t.byRows = rowUnits >= 2 * threads;
  if (t.byRows) t.rowChunk = (rowUnits + threads - 1) / threads * MR;
  for (int64_t jc = 0; jc < P.N; jc += ncStep) {
    t.jc = jc;
    t.nc = std::min(ncStep, P.N - jc);
    for (int64_t pc = 0; pc < P.K; pc += kcStep) {
      t.pc = pc;
      t.kc = std::min(kcStep, P.K - pc);
      t.kp = (t.kc + 1) / 2;
      runOnPool(threads, packBTask, &t);
      runOnPool(threads, computeTask, &t);
    }
  }
}

}  // namespace

// Multiply-adds below which one GEMM runs on one thread (waking the pool costs microseconds).
static constexpr int64_t kThreadedMinMacs = int64_t(1) << 20;

static void gemmDirect(const Problem& P, bool threaded) {
  int64_t threads = threaded ? kernelThreads() : 1;
  if (threads > 1 && P.M * P.N * P.K >= kThreadedMinMacs) gemmThreaded(P, threads);
  else gemmRange(P, 0, P.M, 0, P.N);
}

void gemmBf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
              int64_t ldb, float beta, void* C, int64_t ldc, bool cBf16, bool threaded) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  if (cBf16 && K > KC) {
    // More than one k block: the partial sums stay in f32 (a workspace), rounded to bf16 once at the end.
    std::vector<float> w(size_t(M * N));
    auto* c = static_cast<uint16_t*>(C);
    if (beta != 0.0f)
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) w[size_t(i * N + j)] = bf16ToF32(c[i * ldc + j]);
    gemmDirect(Problem{ta, tb, M, N, K, alpha, beta, A, lda, B, ldb, w.data(), N, false}, threaded);
    for (int64_t i = 0; i < M; i++) fromF32(w.data() + i * N, reinterpret_cast<uint8_t*>(c + i * ldc), DType::BF16, N);
    return;
  }
  gemmDirect(Problem{ta, tb, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, cBf16}, threaded);
}

#else

bool bf16GemmActive() { return false; }

// Never reached: gemm.cc calls gemmBf16 only when bf16GemmActive(), which is false on this architecture.
void gemmBf16(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, int64_t, float, void*, int64_t, bool, bool) {
  fail(Err::Native, "gemmBf16: the AVX512_BF16 kernel is not compiled on this architecture");
}

#endif

}  // namespace nt::cpu
