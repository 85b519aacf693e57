// The instruction-set level the cpu kernels run at (util.h NT_SIMD: baseline, AVX2, AVX-512 on x86-64;
// baseline (scalar) and NEON on arm64), its runtime setting (setCpuIsa, what NODETRON_CPU_ISA drives),
// and the measured FMA peak of this machine at each level (fmaPeak: independent FMA chains on every
// kernel thread).
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#endif

#include <atomic>
#include <chrono>
#include <ctime>

#include "util.h"

namespace nt::cpu {

namespace {

#if defined(__x86_64__)

// GCC's __builtin_cpu_supports checks the CPUID bits and, for AVX and AVX-512, that the OS saves the
// wider registers (XGETBV), which is what makes a level safe to run.
Isa detectIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Isa::Avx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::Avx2;
  return Isa::Baseline;
}

const Isa gBest = detectIsa();
std::atomic<int> gIsa{int(gBest)};

const char* const kNames[] = {"baseline", "avx2", "avx512"};
constexpr int kLevels = 3;
// What each level needs of the CPU, for the error that names a level this one lacks.
const char* const kNeeds[] = {"", "x86-64-v3", "x86-64-v4"};
// The levels of other architectures this build names in its error (none on x86-64).
const char* foreignLevel(const std::string&) { return nullptr; }

#elif defined(__aarch64__)

// ASIMD (NEON) is part of the arm64 base architecture; the kernel's HWCAP says so all the same.
Isa detectIsa() { return (getauxval(AT_HWCAP) & HWCAP_ASIMD) ? Isa::Neon : Isa::Baseline; }

const Isa gBest = detectIsa();
std::atomic<int> gIsa{int(gBest)};

const char* const kNames[] = {"baseline", "neon"};
constexpr int kLevels = 2;
const char* const kNeeds[] = {"", "ASIMD"};
// The x86-64 levels are refused by name (a setting carried over from an x86 machine).
const char* foreignLevel(const std::string& name) {
  return name == "avx2" || name == "avx512" ? "an x86-64 level and this is an arm64 (aarch64) build" : nullptr;
}

#else

// Another architecture: one level, the build's own code.
const Isa gBest = Isa::Baseline;
std::atomic<int> gIsa{int(gBest)};
const char* const kNames[] = {"baseline"};
constexpr int kLevels = 1;
const char* const kNeeds[] = {""};
const char* foreignLevel(const std::string&) { return nullptr; }

#endif

std::string supportedList() {
  std::string s;
  for (int i = 0; i <= int(gBest); i++) s += std::string(i ? ", " : "") + kNames[i];
  return s;
}

// Parses a level name ("auto" = the best supported); throws ArgumentError for anything else, for a
// level this CPU lacks, and, by name, for another architecture's levels.
Isa parseIsa(const std::string& name, const char* call) {
  if (name == "auto") return gBest;
  for (int i = 0; i < kLevels; i++) {
    if (name != kNames[i]) continue;
    if (i > int(gBest))
      fail(Err::Argument, std::string(call) + ": this CPU does not support " + name + " (" + kNeeds[i] + "); supported here: " + supportedList() +
                              ", or auto");
    return Isa(i);
  }
  std::string expected = "auto";
  for (int i = 0; i < kLevels; i++) expected += std::string(", ") + kNames[i];
  expected += " (supported here: " + supportedList() + ")";
  if (const char* foreign = foreignLevel(name))
    fail(Err::Argument, std::string(call) + ": '" + name + "' is " + foreign + "; expected one of " + expected);
  fail(Err::Argument, std::string(call) + ": unknown instruction-set level '" + name + "'; expected one of " + expected);
}

}  // namespace

Isa cpuIsa() { return Isa(gIsa.load(std::memory_order_relaxed)); }
Isa bestIsa() { return gBest; }
const char* isaName(Isa isa) { return kNames[int(isa)]; }

// cpuIsa() -> { active, best, supported: string[] }: the level the kernels run at, the best one this
// CPU supports, and every level it supports (baseline first).
static Napi::Value CpuIsa(const Napi::CallbackInfo& info) {
  Args a{info, "cpuIsa"};
  a.count(0);
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("active", isaName(cpuIsa()));
  o.Set("best", isaName(gBest));
  Napi::Array s = Napi::Array::New(env);
  for (int i = 0; i <= int(gBest); i++) s.Set(uint32_t(i), kNames[i]);
  o.Set("supported", s);
  return o;
}
NT_EXPORT("cpuIsa", CpuIsa);

// setCpuIsa(name) -> the level now active: "auto" (the best supported), "baseline", "avx2" or
// "avx512". Process-wide; kernels already running finish on the level they started with.
static Napi::Value SetCpuIsa(const Napi::CallbackInfo& info) {
  Args a{info, "setCpuIsa"};
  a.count(1);
  Isa isa = parseIsa(a.string(0), "setCpuIsa");
  gIsa.store(int(isa), std::memory_order_relaxed);
  return Napi::String::New(info.Env(), isaName(isa));
}
NT_EXPORT("setCpuIsa", SetCpuIsa);

// ---- the FMA peak -------------------------------------------------------------------------------
// Each thread runs kChains independent multiply-add chains acc = acc·a + b for `iters` rounds, enough
// chains to cover the FMA latency on every port (4 cycles × 2 ports on recent cores), few enough to
// stay in registers. The chains' sum is returned so that the loop is not removed. Flops per round:
// chains × lanes × 2. The baseline level has no FMA (x86-64-v2): a multiply and an add, also 2 flops.
// arm64: 16 chains (Neoverse V2, NVIDIA Grace's core, has four 128-bit FMA pipes of 4 cycles' latency:
// 16 in flight; arm64 has 32 vector registers), of 4 lanes (NEON) or 1 (the scalar baseline, fmadd).
#if defined(__aarch64__)
constexpr int kChains = 16;
#else
constexpr int kChains = 12;
#endif

struct PeakCtx {
  Isa isa;
  int64_t iters;
  std::vector<double>* sinks;  // one result per part, read after the pool returns
};

#if defined(__x86_64__)

NT_TARGET_V4 static double fmaChainsV4(int64_t iters, float seed) {
  __m512 acc[kChains];
  for (int u = 0; u < kChains; u++) acc[u] = _mm512_set1_ps(seed + 0.001f * float(u));
  const __m512 m = _mm512_set1_ps(0.99999994f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; i++)
    for (int u = 0; u < kChains; u++) acc[u] = _mm512_fmadd_ps(acc[u], m, c);
  __m512 s = acc[0];
  for (int u = 1; u < kChains; u++) s = _mm512_add_ps(s, acc[u]);
  return double(_mm512_reduce_add_ps(s));
}

NT_TARGET_V3 static double fmaChainsV3(int64_t iters, float seed) {
  __m256 acc[kChains];
  for (int u = 0; u < kChains; u++) acc[u] = _mm256_set1_ps(seed + 0.001f * float(u));
  const __m256 m = _mm256_set1_ps(0.99999994f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; i++)
    for (int u = 0; u < kChains; u++) acc[u] = _mm256_fmadd_ps(acc[u], m, c);
  __m256 s = acc[0];
  for (int u = 1; u < kChains; u++) s = _mm256_add_ps(s, acc[u]);
  float out[8];
  _mm256_storeu_ps(out, s);
  double t = 0;
  for (float v : out) t += v;
  return t;
}

static double fmaChainsV2(int64_t iters, float seed) {
  __m128 acc[kChains];
  for (int u = 0; u < kChains; u++) acc[u] = _mm_set1_ps(seed + 0.001f * float(u));
  const __m128 m = _mm_set1_ps(0.99999994f), c = _mm_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; i++)
    for (int u = 0; u < kChains; u++) acc[u] = _mm_add_ps(_mm_mul_ps(acc[u], m), c);
  __m128 s = acc[0];
  for (int u = 1; u < kChains; u++) s = _mm_add_ps(s, acc[u]);
  float out[4];
  _mm_storeu_ps(out, s);
  return double(out[0]) + out[1] + out[2] + out[3];
}

static int lanes(Isa isa) { return isa == Isa::Avx512 ? 16 : isa == Isa::Avx2 ? 8 : 4; }

static void peakTask(void* p, int64_t part) {
  auto* c = static_cast<PeakCtx*>(p);
  float seed = 1.0f + 0.01f * float(part);
  double r = c->isa == Isa::Avx512 ? fmaChainsV4(c->iters, seed)
             : c->isa == Isa::Avx2 ? fmaChainsV3(c->iters, seed)
                                   : fmaChainsV2(c->iters, seed);
  (*c->sinks)[size_t(part)] = r;
}

#elif defined(__aarch64__)

static double fmaChainsNeon(int64_t iters, float seed) {
  float32x4_t acc[kChains];
  for (int u = 0; u < kChains; u++) acc[u] = vdupq_n_f32(seed + 0.001f * float(u));
  const float32x4_t m = vdupq_n_f32(0.99999994f), c = vdupq_n_f32(1e-7f);
  for (int64_t i = 0; i < iters; i++)
    for (int u = 0; u < kChains; u++) acc[u] = vfmaq_f32(c, acc[u], m);  // c + acc·m
  float32x4_t s = acc[0];
  for (int u = 1; u < kChains; u++) s = vaddq_f32(s, acc[u]);
  return double(vaddvq_f32(s));
}

// Scalar chains (fmadd on s registers), kept scalar like the kernels' baseline copies.
NT_TARGET_SCALAR static double fmaChainsScalar(int64_t iters, float seed) {
  float acc[kChains];
  for (int u = 0; u < kChains; u++) acc[u] = seed + 0.001f * float(u);
  const float m = 0.99999994f, c = 1e-7f;
  for (int64_t i = 0; i < iters; i++)
    for (int u = 0; u < kChains; u++) acc[u] = std::fma(acc[u], m, c);
  double t = 0;
  for (float v : acc) t += v;
  return t;
}

static int lanes(Isa isa) { return isa == Isa::Neon ? 4 : 1; }

static void peakTask(void* p, int64_t part) {
  auto* c = static_cast<PeakCtx*>(p);
  float seed = 1.0f + 0.01f * float(part);
  (*c->sinks)[size_t(part)] = c->isa == Isa::Neon ? fmaChainsNeon(c->iters, seed) : fmaChainsScalar(c->iters, seed);
}

#else

static double fmaChainsScalar(int64_t iters, float seed) {
  float acc[kChains];
  for (int u = 0; u < kChains; u++) acc[u] = seed + 0.001f * float(u);
  const float m = 0.99999994f, c = 1e-7f;
  for (int64_t i = 0; i < iters; i++)
    for (int u = 0; u < kChains; u++) acc[u] = acc[u] * m + c;
  double t = 0;
  for (float v : acc) t += v;
  return t;
}

static int lanes(Isa) { return 1; }

static void peakTask(void* p, int64_t part) {
  auto* c = static_cast<PeakCtx*>(p);
  (*c->sinks)[size_t(part)] = fmaChainsScalar(c->iters, 1.0f + 0.01f * float(part));
}

#endif

// Seconds for `threads` kernel threads (1: the calling thread alone) to run `iters` rounds each at
// `isa` (wall time of the slowest).
static double timePeak(Isa isa, int64_t iters, int64_t threads, double* sink) {
  std::vector<double> sinks(size_t(threads), 0.0);
  PeakCtx ctx{isa, iters, &sinks};
  auto t0 = std::chrono::steady_clock::now();
  if (threads == 1) peakTask(&ctx, 0);
  else runOnPool(threads, peakTask, &ctx);
  auto t1 = std::chrono::steady_clock::now();
  for (double v : sinks) *sink += v;
  return std::chrono::duration<double>(t1 - t0).count();
}

// CPU seconds the calling thread spends running `iters` rounds at `isa` alone: what other processes
// on the machine cannot inflate (they take turns on the core, not cycles out of the thread's own time).
static double cpuTimePeak(Isa isa, int64_t iters, double* sink) {
  std::vector<double> sinks(1, 0.0);
  PeakCtx ctx{isa, iters, &sinks};
  timespec t0{}, t1{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  peakTask(&ctx, 0);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  *sink += sinks[0];
  return double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);
}

// fmaPeak(isa, seconds) -> { gflops, gflopsAllThreads, gflopsOneThread, gflopsOneThreadCpuTime, isa, threads, chains, lanes, seconds }:
// the float32 multiply-add rate of independent FMA chains at `isa` ("auto" = the best supported level)
// on the kernel threads: all of them together, and one alone times the thread count, each the best of
// five runs (about `seconds` in all). `gflops` is the larger of the two: other processes on the machine
// can only lower either, and one thread finds a quiet core more often than all of them find theirs.
// gflopsOneThreadCpuTime: one thread's rate per second of its own CPU time (what a loaded machine
// leaves nearly intact; the peak `--cpu-time` profiles compare against).
static Napi::Value FmaPeak(const Napi::CallbackInfo& info) {
  Args a{info, "fmaPeak"};
  a.count(2);
  Isa isa = parseIsa(a.string(0), "fmaPeak");
  double seconds = a.number(1);
  if (!(seconds > 0 && seconds <= 60)) fail(Err::Argument, "fmaPeak: seconds must be in (0, 60], got " + std::to_string(seconds));
  int64_t threads = kernelThreads();
  double sink = 0;
  // Calibrate: grow the round count until one run takes a fiftieth of the target, timed on the calling
  // thread alone: on a loaded machine waking the pool's threads can take longer than such a short run,
  // which kept the count small and the all-threads figure a measure of that latency (0.6 GFLOP/s seen).
  int64_t iters = 1 << 12;
  double t = timePeak(isa, iters, 1, &sink);
  while (t < seconds / 50 && iters < (int64_t(1) << 40)) {
    iters *= 4;
    t = timePeak(isa, iters, 1, &sink);
  }
  constexpr int kRuns = 5;
  iters = std::max<int64_t>(1, int64_t(double(iters) * (seconds / (2 * kRuns)) / std::max(t, 1e-9)));
  double bestAll = 1e300, bestOne = 1e300, bestCpu = 1e300;
  for (int r = 0; r < kRuns; r++) {
    bestAll = std::min(bestAll, timePeak(isa, iters, threads, &sink));
    bestOne = std::min(bestOne, timePeak(isa, iters, 1, &sink));
    bestCpu = std::min(bestCpu, cpuTimePeak(isa, iters, &sink));
  }
  double perThread = double(iters) * kChains * lanes(isa) * 2.0;
  double all = double(threads) * perThread / bestAll / 1e9, one = perThread / bestOne / 1e9;
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("gflops", std::max(all, one * double(threads)));
  o.Set("gflopsAllThreads", all);
  o.Set("gflopsOneThread", one);
  o.Set("gflopsOneThreadCpuTime", perThread / std::max(bestCpu, 1e-9) / 1e9);
  o.Set("isa", isaName(isa));
  o.Set("threads", double(threads));
  o.Set("chains", double(kChains));
  o.Set("lanes", double(lanes(isa)));
  o.Set("seconds", bestAll);
  o.Set("checksum", sink);  // the chains' values (finite, near 1 per lane): keeps the loops live
  return o;
}
NT_EXPORT("fmaPeak", FmaPeak);

}  // namespace nt::cpu
