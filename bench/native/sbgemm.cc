// bf16 GEMM on the cpu backend, two ways, on the GEMM shapes of the `tiny` and `small` training-bench
// GPTs (lib/bench/configs.ts): what native/cpu/kernels/gemm.cc does (widen A and B to f32, cblas_sgemm,
// round C to bf16) against OpenBLAS's cblas_sbgemm (bf16 A and B, f32 C, then C rounded to bf16).
// Prints the best of 15 timings of each, and of cblas_sgemm alone on inputs already in f32 (what the
// conversions cost), and the largest difference between the two bf16 results. cblas_sbgemm is looked up
// at run time: OpenBLAS has it only when built with BUILD_BFLOAT16 (Debian's 0.3.21 package is not).
//   g++ -O2 -march=native -I/usr/include/x86_64-linux-gnu/openblas-pthread bench/native/sbgemm.cc -lopenblas -ldl -o /tmp/sbgemm && /tmp/sbgemm
#include <cblas.h>
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

extern "C" char* openblas_get_corename(void);
extern "C" int openblas_get_num_threads(void);

static float bf16ToF32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static uint16_t f32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Shape { const char* name; int M, N, K; bool ta, tb; };

using SbgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float, const uint16_t*, blasint,
                          const uint16_t*, blasint, float, float*, blasint);

int main() {
  auto sbgemmFn = reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  if (!sbgemmFn) std::printf("cblas_sbgemm: not in this OpenBLAS (built without BUILD_BFLOAT16); timing convert+sgemm and sgemm alone\n");
  // rows = batch·ctx = 1024 for both configs; NT: forward x·Wᵀ; TN: weight gradient gᵀ·x; NN: input gradient g·W.
  const Shape shapes[] = {
      {"tiny qkv fwd   1024x384x128 NT", 1024, 384, 128, false, true},
      {"tiny fc fwd    1024x512x128 NT", 1024, 512, 128, false, true},
      {"tiny fc dW     512x128x1024 TN", 512, 128, 1024, true, false},
      {"tiny head fwd  512x50257x128 NT", 512, 50257, 128, false, true},
      {"small qkv fwd  1024x1152x384 NT", 1024, 1152, 384, false, true},
      {"small fc fwd   1024x1536x384 NT", 1024, 1536, 384, false, true},
      {"small fcp dX   1024x1536x384 NN", 1024, 1536, 384, false, false},
      {"small fc dW    1536x384x1024 TN", 1536, 384, 1024, true, false},
      {"small head fwd 256x50257x384 NT", 256, 50257, 384, false, true},
  };
  std::printf("OpenBLAS core %s, %d threads\n", openblas_get_corename(), openblas_get_num_threads());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const Shape& s : shapes) {
    const int64_t nA = int64_t(s.M) * s.K, nB = int64_t(s.K) * s.N, nC = int64_t(s.M) * s.N;
    std::vector<uint16_t> A(nA), B(nB), C1(nC), C2(nC);
    for (auto& v : A) v = f32ToBf16(dist(rng));
    for (auto& v : B) v = f32ToBf16(dist(rng));
    std::vector<float> Af(nA), Bf(nB), Cf(nC);
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto ta = s.ta ? CblasTrans : CblasNoTrans, tb = s.tb ? CblasTrans : CblasNoTrans;
    auto convertSgemm = [&] {
      for (int64_t i = 0; i < nA; i++) Af[i] = bf16ToF32(A[i]);
      for (int64_t i = 0; i < nB; i++) Bf[i] = bf16ToF32(B[i]);
      cblas_sgemm(CblasRowMajor, ta, tb, s.M, s.N, s.K, 1.0f, Af.data(), lda, Bf.data(), ldb, 0.0f, Cf.data(), s.N);
      for (int64_t i = 0; i < nC; i++) C1[i] = f32ToBf16(Cf[i]);
    };
    auto sbgemm = [&] {
      sbgemmFn(CblasRowMajor, ta, tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, Cf.data(), s.N);
      for (int64_t i = 0; i < nC; i++) C2[i] = f32ToBf16(Cf[i]);
    };
    auto best = [](auto&& fn) {
      double b = 1e30;
      for (int r = 0; r < 15; r++) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        b = std::min(b, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      return b;
    };
    auto sgemmOnly = [&] {
      cblas_sgemm(CblasRowMajor, ta, tb, s.M, s.N, s.K, 1.0f, Af.data(), lda, Bf.data(), ldb, 0.0f, Cf.data(), s.N);
    };
    const double gflop = 2.0 * s.M * s.N * s.K / 1e9;
    double t1 = best(convertSgemm), t0 = best(sgemmOnly);
    if (!sbgemmFn) {
      std::printf("%-34s convert+sgemm %8.2f ms (%6.1f GFLOP/s)  sgemm alone %8.2f ms (%6.1f GFLOP/s)  conversions %4.1f%%\n", s.name, t1,
                  gflop / t1 * 1e3, t0, gflop / t0 * 1e3, 100 * (t1 - t0) / t1);
      continue;
    }
    double t2 = best(sbgemm);
    convertSgemm();
    sbgemm();
    double maxRel = 0;
    for (int64_t i = 0; i < nC; i++) {
      double a = bf16ToF32(C1[i]), b = bf16ToF32(C2[i]);
      maxRel = std::max(maxRel, std::fabs(a - b) / std::max(1e-3, std::fabs(a)));
    }
    std::printf("%-34s convert+sgemm %8.2f ms (%6.1f GFLOP/s)  sbgemm %8.2f ms (%6.1f GFLOP/s)  ratio %.2f  max rel diff %.2g\n", s.name, t1,
                gflop / t1 * 1e3, t2, gflop / t2 * 1e3, t1 / t2, maxRel);
  }
}
