// Helpers shared by the cpu kernel families: shape/stride arguments passed as Int32Array, strided
// extents, a vectorizable exp, and a split of row ranges over a few threads.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "../../core/arg_lists.h"
#include "convert.h"

namespace nt::cpu {

// exp(x) to about 1 ulp over its whole range, written so loops over it vectorize (no libm call):
// x = n·ln2 + r with n = round(x/ln2) and r = x − n·ln2 taken in two parts (ln2's high part has few
// enough bits that n·ln2_hi is exact, so r keeps its precision however large |x| is; one product
// x·log2(e) alone would lose up to ~5e-6 relative at |x| = 87), then e^r by its degree-7 Taylor
// polynomial on |r| <= ln2/2 (truncation < 1e-8 relative) and 2^n added to the exponent bits.
// Inputs below -87 give 0; inputs above 88 are clamped to 88 (e^88 ≈ 1.65e38). NaN stays NaN.
inline float fastExp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest without a libm call
  float r = x - n * 0.693145751953125f;                               // ln2_hi: n·ln2_hi is exact
  r = r - n * 1.428606820309417e-6f;                                  // ln2_lo = ln2 − ln2_hi
  float p = 1.9841270e-4f;                                            // 1/7!
  p = p * r + 1.3888889e-3f;                                          // 1/6!
  p = p * r + 8.3333333e-3f;                                          // 1/5!
  p = p * r + 4.1666667e-2f;                                          // 1/4!
  p = p * r + 1.6666667e-1f;                                          // 1/3!
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += int32_t(n) << 23;
  float out;
  std::memcpy(&out, &bits, 4);
  return x <= -87.0f ? 0.0f : out;
}

// ---- runtime SIMD dispatch -----------------------------------------------------------------------
// x86-64: the addon is compiled for x86-64-v2 (SSE4.2) so that one prebuilt binary runs on any x86-64 machine
// of the last decade. The hot row loops (cross-entropy, softmax, GELU, norms, AdamW, attention's
// softmax) are compiled three times more or less, and one copy is chosen per call from cpuIsa():
//   Isa::Avx512  x86-64-v4 (AVX-512 F/BW/CD/DQ/VL + FMA), 512-bit vectors
//   Isa::Avx2    x86-64-v3 (AVX2 + FMA), 256-bit vectors
//   Isa::Baseline the build's own x86-64-v2 code, 128-bit vectors
// aarch64 (arm64: Graviton, NVIDIA Grace): the addon is compiled for armv8-a, whose ASIMD (NEON) every
// arm64 CPU has, so there are two copies:
//   Isa::Neon     the build's own armv8-a code, auto-vectorized to 128-bit NEON vectors
//   Isa::Baseline the same body compiled without vectorization (scalar), the reference to compare against
// Why explicit copies and not GCC's target_clones (which the loader resolves once, from CPUID): the
// choice must be forceable at run time (NODETRON_CPU_ISA / setCpuIsa) so tests can check every path
// against the float64 reference on one machine, and users can compare; and it is one relaxed atomic
// load and a switch per call of a loop over whole rows, nothing per element.
//
// How a kernel gets its copies (NT_SIMD below): its body is written once as an always_inline function
// `<name>Body`; NT_SIMD defines `<name>V4` and `<name>V3` with target attributes and `flatten` (so the
// body and everything it calls -- fastExp, sumLanes, their lambdas -- are inlined and compiled for that
// target, never left as a baseline call), `<name>V2` at the build's baseline, and `<name>` that picks
// one (on aarch64: `<name>Neon` at the build's own target and `<name>Scalar` without vectorization).
// setCpuIsa refuses a level the CPU (and OS) does not support, so a forced path cannot fault.
// Floating-point results differ between levels only by rounding (FMA contraction, lane order of the
// sums); test/ops/simd.test.ts checks every level against float64.
#if defined(__x86_64__)
enum class Isa : int { Baseline = 0, Avx2 = 1, Avx512 = 2 };
#elif defined(__aarch64__)
enum class Isa : int { Baseline = 0, Neon = 1 };
#else
enum class Isa : int { Baseline = 0 };
#endif

// The level the kernels run at now (the best supported one unless set otherwise).
Isa cpuIsa();
// The best level this CPU and OS support.
Isa bestIsa();
const char* isaName(Isa isa);

#define NT_SIMD_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__)
#define NT_TARGET_V4 __attribute__((target("arch=x86-64-v4,prefer-vector-width=512"), flatten))
#define NT_TARGET_V3 __attribute__((target("arch=x86-64-v3"), flatten))

// NT_SIMD(name, (params...), (args...)): copies of `name##Body` at each level and `name` choosing one.
#define NT_SIMD(name, params, args)                                   \
  NT_TARGET_V4 static void name##V4 params { name##Body args; }       \
  NT_TARGET_V3 static void name##V3 params { name##Body args; }       \
  __attribute__((flatten)) static void name##V2 params { name##Body args; } \
  static inline void name params {                                    \
    switch (cpuIsa()) {                                               \
      case Isa::Avx512: name##V4 args; return;                        \
      case Isa::Avx2: name##V3 args; return;                          \
      default: name##V2 args; return;                                 \
    }                                                                 \
  }
#elif defined(__aarch64__)
// The scalar copy: the loops stay scalar (no loop or SLP vectorization) after the body is inlined.
#define NT_TARGET_SCALAR __attribute__((optimize("no-tree-vectorize", "no-tree-slp-vectorize"), flatten))

#define NT_SIMD(name, params, args)                                          \
  __attribute__((flatten)) static void name##Neon params { name##Body args; } \
  NT_TARGET_SCALAR static void name##Scalar params { name##Body args; }      \
  static inline void name params {                                           \
    if (cpuIsa() == Isa::Neon) name##Neon args;                              \
    else name##Scalar args;                                                  \
  }
#else
// Other architectures: one copy, the build's own code.
#define NT_SIMD(name, params, args) \
  __attribute__((flatten)) static void name params { name##Body args; }
#endif

// Σ f(j) for j < n, in 16 independent partial sums so the loop vectorizes without reassociation flags.
template <class F>
inline float sumLanes(int64_t n, F f) {
  constexpr int L = 16;
  float acc[L] = {};
  int64_t j = 0;
  for (; j + L <= n; j += L)
    for (int u = 0; u < L; u++) acc[u] += f(j + u);
  float s = 0;
  for (; j < n; j++) s += f(j);
  for (int u = 0; u < L; u++) s += acc[u];
  return s;
}

// max of x[0..n) (−inf for n == 0; NaNs are skipped), vectorizable like sumLanes.
inline float maxLanes(const float* x, int64_t n) {
  constexpr int L = 16;
  float acc[L];
  for (int u = 0; u < L; u++) acc[u] = -INFINITY;
  int64_t j = 0;
  for (; j + L <= n; j += L)
    for (int u = 0; u < L; u++) acc[u] = x[j + u] > acc[u] ? x[j + u] : acc[u];
  float m = -INFINITY;
  for (; j < n; j++) m = x[j] > m ? x[j] : m;
  for (int u = 0; u < L; u++) m = acc[u] > m ? acc[u] : m;
  return m;
}

// Walks a non-empty shape of rank >= 1 row by row, in row-major order: fn(base, off) for each run of
// the last dimension, where base is the run's first element and off[k] its offset under strides[k]
// (starting from start[k]); the outer index advances like an odometer.
template <size_t K, class F>
inline void forEachStridedRow(const std::vector<int64_t>& shape, const std::array<const std::vector<int64_t>*, K>& strides,
                              std::array<int64_t, K> off, F fn) {
  size_t rank = shape.size();
  int64_t total = product(shape), inner = shape[rank - 1];
  std::vector<int64_t> idx(rank, int64_t(0));
  for (int64_t base = 0; base < total; base += inner) {
    fn(base, off);
    for (int64_t d = int64_t(rank) - 2; d >= 0; d--) {
      for (size_t k = 0; k < K; k++) off[k] += (*strides[k])[size_t(d)];
      if (++idx[size_t(d)] < shape[size_t(d)]) break;
      for (size_t k = 0; k < K; k++) off[k] -= (*strides[k])[size_t(d)] * shape[size_t(d)];
      idx[size_t(d)] = 0;
    }
  }
}

// Rounds x[0..n) to `dt` and back (nothing for f32): a fused kernel that stores a value and goes on
// computing from it sees what the unfused ops would read back from storage.
inline void roundThrough(float* x, int64_t n, DType dt) {
  if (dt == DType::F32 || n == 0) return;
  constexpr int64_t kChunk = 256;
  uint16_t tmp[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    int64_t m = std::min(kChunk, n - i);
    fromF32(x + i, reinterpret_cast<uint8_t*>(tmp), dt, m);
    toF32(reinterpret_cast<const uint8_t*>(tmp), dt, x + i, m);
  }
}

// Rows per block of blockColumnSums (below).
inline constexpr int64_t kSumBlockRows = 64;

// Threads the row-parallel kernels use (setKernelThreads; default: the cores, at most 4).
int64_t kernelThreads();

// Runs task(ctx, t) for t in [0, parts) on the kernel thread pool: the calling thread runs part 0 and
// persistent workers (started once, then parked) run the rest, so a call spawns no thread. Returns
// when every part is done. A call made from inside a pool task, or while another thread holds the
// pool, runs the parts one after another on the calling thread (same results: callers split work so
// that the split does not depend on which thread runs a part).
void runOnPool(int64_t parts, void (*task)(void* ctx, int64_t part), void* ctx);

// Work units (roughly: element operations) below which a kernel runs on one thread: waking a parked
// worker costs a few microseconds, about this much work.
inline constexpr int64_t kParallelMinWork = int64_t(1) << 17;

// Runs fn(begin, end) over [0, rows) split into contiguous ranges, one per pool thread, when
// rows · workPerRow is large enough to pay for the hand-off (kParallelMinWork); else on this thread.
// Each row is computed the same way whichever range holds it, so results do not depend on the
// thread count.
template <class F>
void parallelRows(int64_t rows, int64_t workPerRow, F fn) {
  int64_t threads = std::min<int64_t>(kernelThreads(), rows);
  if (threads <= 1 || rows * workPerRow < kParallelMinWork) {
    fn(int64_t(0), rows);
    return;
  }
  struct Ctx {
    F* fn;
    int64_t rows, chunk;
  } ctx{&fn, rows, (rows + threads - 1) / threads};
  runOnPool(threads, [](void* p, int64_t t) {
    auto* c = static_cast<Ctx*>(p);
    int64_t b = t * c->chunk, e = std::min(c->rows, b + c->chunk);
    if (b < e) (*c->fn)(b, e);
  }, &ctx);
}

// Runs fn(block) for each of `blocks` independent blocks over the pool (blocks dealt out in
// contiguous ranges, as parallelRows); `workPerBlock` as parallelRows' workPerRow.
template <class F>
void parallelBlocks(int64_t blocks, int64_t workPerBlock, F fn) {
  parallelRows(blocks, workPerBlock, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) fn(i);
  });
}

// Column sums in double over fixed blocks of kSumBlockRows rows that the pool runs in parallel and
// that are added in block order, so the sums do not depend on the thread count. row(r, acc) computes
// row r (whatever the kernel writes for it) and adds its contributions to S sums of `cols` columns:
// acc[k][j] is sum k's partial of column j for r's block. Sum k is written to out[k] as f32 (skipped
// when out[k] is null). `workPerRow` as parallelRows'.
template <int S, class F>
void blockColumnSums(int64_t rows, int64_t cols, int64_t workPerRow, F row, const std::array<float*, S>& out) {
  int64_t blocks = (rows + kSumBlockRows - 1) / kSumBlockRows;
  std::vector<double> partial(size_t(S * blocks * cols), 0.0);
  parallelBlocks(blocks, kSumBlockRows * workPerRow, [&](int64_t blk) {
    std::array<double*, S> acc;
    for (int k = 0; k < S; k++) acc[k] = partial.data() + (k * blocks + blk) * cols;
    for (int64_t r = blk * kSumBlockRows, end = std::min(rows, r + kSumBlockRows); r < end; r++) row(r, acc);
  });
  for (int k = 0; k < S; k++) {
    if (!out[k]) continue;
    const double* sums = partial.data() + k * blocks * cols;
    for (int64_t j = 0; j < cols; j++) {
      double s = 0;
      for (int64_t blk = 0; blk < blocks; blk++) s += sums[size_t(blk * cols + j)];
      out[k][j] = float(s);
    }
  }
}

}  // namespace nt::cpu
