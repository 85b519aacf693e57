// GEMM on the cpu backend: cblas_sgemm from OpenBLAS, batched by strides; bf16 on the AVX512_BF16
// kernel of gemm_bf16.cc where the CPU has it, else (and f16 always) widened to f32 for cblas_sgemm.
#include <cblas.h>

#include <chrono>
#include <mutex>

#include "convert.h"
#include "gemm_bf16.h"
#include "util.h"

extern "C" {
char* openblas_get_config(void);
char* openblas_get_corename(void);
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace nt::cpu {

// Held by whoever sets OpenBLAS to one thread around a parallel batch of small GEMMs (here and
// flash_attention.cc): the thread count is process-wide, so one caller at a time changes it.
std::mutex& blasThreadsMutex() {
  static std::mutex m;
  return m;
}

// Multiply-adds (M·N·K) up to which one GEMM of a batch is "small" (see Gemm).
static constexpr int64_t kSmallGemm = int64_t(1) << 23;

// The bf16 GEMMs of one gemm call on the AVX512_BF16 kernel (gemmBf16): the same batching as the
// sgemm path below. C is bf16 or f32 (cBf16 false); a batch accumulating into one bf16 matrix
// (sC == 0) accumulates in an f32 copy of it, rounded once at the end, as the widening path does.
static void gemmBf16Batch(const uint16_t* A, const uint16_t* B, uint8_t* C, bool cBf16, int64_t batch, int64_t M, int64_t N, int64_t K,
                          bool ta, bool tb, float alpha, float beta, int64_t sA, int64_t sB, int64_t sC) {
  const int64_t es = cBf16 ? 2 : 4, lda = ta ? M : K, ldb = tb ? K : N;
  if (K == 0) {  // the product is beta · C, once per batch entry (as the sgemm path)
    for (int64_t b = 0; b < batch; b++) {
      uint8_t* c = C + b * sC * es;
      if (!cBf16) {
        auto* f = reinterpret_cast<float*>(c);
        for (int64_t i = 0; i < M * N; i++) f[i] = beta == 0.0f ? 0.0f : beta * f[i];
      } else {
        auto* h = reinterpret_cast<uint16_t*>(c);
        for (int64_t i = 0; i < M * N; i++) h[i] = f32ToBf16(beta == 0.0f ? 0.0f : beta * bf16ToF32(h[i]));
      }
    }
    return;
  }
  if (sC == 0 && batch > 1 && cBf16) {
    std::vector<float> w(size_t(M * N), 0.0f);
    if (beta != 0.0f) toF32(C, DType::BF16, w.data(), M * N);
    for (int64_t b = 0; b < batch; b++) gemmBf16(ta, tb, M, N, K, alpha, A + b * sA, lda, B + b * sB, ldb, beta, w.data(), N, false, true);
    fromF32(w.data(), C, DType::BF16, M * N);
    return;
  }
  auto one = [&](int64_t b, bool threaded) {
    gemmBf16(ta, tb, M, N, K, alpha, A + b * sA, lda, B + b * sB, ldb, beta, C + b * sC * es, N, cBf16, threaded);
  };
  // Small GEMMs of a batch (attention's per-head products): one per pool thread, as below.
  bool smallBatch = batch >= 2 && sC >= M * N && M * N * K <= kSmallGemm && kernelThreads() > 1;
  if (smallBatch) parallelBlocks(batch, 2 * M * N * K, [&](int64_t b) { one(b, false); });
  else
    for (int64_t b = 0; b < batch; b++) one(b, true);
}

// gemm(A, B, C, dtype, batch, M, N, K, transA, transB, alpha, beta, strideA, strideB, strideC[, outDtype])
// Row-major: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b], op(A) is M x K, op(B) is K x N.
// Batch strides are in elements; 0 broadcasts one matrix across the batch. C is of `dtype` like A and
// B, or f32 (outDtype) for bf16/f16 inputs: the f32 sums are stored without rounding to 16 bits.
NT_KERNEL("gemm", Gemm) {
  DType dt = a.dtype("dtype");
  int64_t batch = a.size("batch"), M = a.size("m"), N = a.size("n"), K = a.size("k");
  bool ta = a.boolean("transA"), tb = a.boolean("transB");
  float alpha = float(a.number("alpha")), beta = float(a.number("beta"));
  int64_t sA = a.size("strideA"), sB = a.size("strideB"), sC = a.size("strideC");
  DType ct = info.Length() > 15 ? a.dtype("outDtype") : dt;
  if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16)
    fail(Err::DType, std::string("gemm: dtype ") + dtypeName(dt) + " is not supported (f32, bf16, f16)");
  if (ct != dt && !(ct == DType::F32 && (dt == DType::BF16 || dt == DType::F16)))
    fail(Err::DType, std::string("gemm: output dtype ") + dtypeName(ct) + " for " + dtypeName(dt) +
                         " inputs is not supported (the inputs' dtype, or f32 for bf16 and f16 inputs)");
  auto extent = [&](int64_t stride, int64_t mat) { return batch == 0 ? 0 : (batch - 1) * stride + mat; };
  int64_t nA = extent(sA, M * K), nB = extent(sB, K * N), nC = extent(sC, M * N);
  uint8_t* pa = storageData(info, a.at("a", "so"), call, dt, nA);
  uint8_t* pb = storageData(info, a.at("b", "so"), call, dt, nB);
  uint8_t* pc = storageData(info, a.at("c", "so"), call, ct, nC);
  if (batch == 0 || M == 0 || N == 0) return;
  if (dt == DType::BF16 && bf16GemmActive()) {
    gemmBf16Batch(reinterpret_cast<const uint16_t*>(pa), reinterpret_cast<const uint16_t*>(pb), pc, ct == DType::BF16, batch, M, N, K, ta,
                  tb, alpha, beta, sA, sB, sC);
    return;
  }
  F32View A(pa, dt, nA, true), B(pb, dt, nB, true), C(pc, ct, nC, beta != 0.0f);
  int lda = int(ta ? M : K), ldb = int(tb ? K : N), ldc = int(N);
  auto one = [&](int64_t b) {
    float* c = C.data() + b * sC;
    if (K == 0) {  // OpenBLAS rejects k == 0 with lda < 1 on some paths; the product is beta * C
      for (int64_t i = 0; i < M * N; i++) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
      return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
                alpha, A.data() + b * sA, lda > 0 ? lda : 1, B.data() + b * sB, ldb > 0 ? ldb : 1, beta, c, ldc);
  };
  // A batch of small GEMMs (attention's per-head products) runs one GEMM per pool thread with
  // OpenBLAS on one thread, instead of OpenBLAS splitting each small GEMM over its threads: the
  // split costs more than such a GEMM. Batches that accumulate into one matrix (sC == 0) stay serial.
  // OpenBLAS splits a GEMM by rows and columns of C, never along k, so every element is computed
  // the same way on either path.
  bool smallBatch = batch >= 2 && sC >= M * N && M * N * std::max<int64_t>(K, 1) <= kSmallGemm && kernelThreads() > 1;
  // The OpenBLAS thread count is process-wide: one caller at a time changes it (others run serially).
  std::unique_lock<std::mutex> lock(blasThreadsMutex(), std::defer_lock);
  if (smallBatch && lock.try_lock()) {
    int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    parallelBlocks(batch, 2 * M * N * std::max<int64_t>(K, 1), one);
    if (saved != 1) openblas_set_num_threads(saved);
  } else {
    for (int64_t b = 0; b < batch; b++) one(b);
  }
  C.commit();
}

// Calls cblas_sgemm directly on f32 storages: the yardstick of `nodetron bench gemm`.
// cblasSgemm(A, B, C, M, N, K, iterations) -> seconds of the loop
static Napi::Value CblasSgemmLoop(const Napi::CallbackInfo& info) {
  Args a{info, "cblasSgemmLoop"};
  a.count(7);
  int64_t M = a.size(3), N = a.size(4), K = a.size(5), it = a.size(6);
  float* A = reinterpret_cast<float*>(storageData(info, 0, "cblasSgemmLoop", DType::F32, M * K));
  float* B = reinterpret_cast<float*>(storageData(info, 1, "cblasSgemmLoop", DType::F32, K * N));
  float* C = reinterpret_cast<float*>(storageData(info, 2, "cblasSgemmLoop", DType::F32, M * N));
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < it; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f, A, int(K), B, int(N), 0.0f, C,
                int(N));
  auto t1 = std::chrono::steady_clock::now();
  return Napi::Number::New(info.Env(), std::chrono::duration<double>(t1 - t0).count());
}
NT_EXPORT("cblasSgemmLoop", CblasSgemmLoop);

// gemmBf16Kernel() -> { mode, supported, active, kernel }: how bf16 GEMMs run. mode "auto" (the AVX512_BF16
// kernel where supported) or "fallback" (widened to f32 for cblas_sgemm); supported: this CPU has
// AVX-512 and AVX512_BF16; active: the kernel runs now (supported, mode auto, cpuIsa avx512); kernel:
// "avx512bf16" or "sgemm".
static Napi::Value GemmBf16Kernel(const Napi::CallbackInfo& info) {
  Args a{info, "gemmBf16Kernel"};
  a.count(0);
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("mode", bf16GemmMode() == Bf16GemmMode::Auto ? "auto" : "fallback");
  o.Set("supported", bf16GemmSupported());
  o.Set("active", bf16GemmActive());
  o.Set("kernel", bf16GemmActive() ? "avx512bf16" : "sgemm");
  return o;
}
NT_EXPORT("gemmBf16Kernel", GemmBf16Kernel);

// setBf16Gemm(mode) -> the mode now: "auto" or "fallback" (see gemmBf16Kernel; NODETRON_BF16_GEMM drives
// it when the addon loads). Process-wide.
static Napi::Value SetBf16Gemm(const Napi::CallbackInfo& info) {
  Args a{info, "setBf16Gemm"};
  a.count(1);
  std::string m = a.string(0);
  if (m == "auto") setBf16GemmMode(Bf16GemmMode::Auto);
  else if (m == "fallback") setBf16GemmMode(Bf16GemmMode::Fallback);
  else fail(Err::Argument, "setBf16Gemm: unknown mode '" + m + "'; expected auto or fallback");
  return Napi::String::New(info.Env(), m);
}
NT_EXPORT("setBf16Gemm", SetBf16Gemm);

static Napi::Value BlasInfo(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("config", std::string(openblas_get_config()));
  o.Set("coreType", std::string(openblas_get_corename()));
  o.Set("threads", openblas_get_num_threads());
  return o;
}
NT_EXPORT("blasInfo", BlasInfo);

static Napi::Value SetBlasThreads(const Napi::CallbackInfo& info) {
  Args a{info, "setBlasThreads"};
  int64_t n = a.size(0);
  if (n < 1) fail(Err::Argument, "setBlasThreads: need at least 1 thread");
  openblas_set_num_threads(int(n));
  return info.Env().Undefined();
}
NT_EXPORT("setBlasThreads", SetBlasThreads);

}  // namespace nt::cpu
