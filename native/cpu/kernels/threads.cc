// The cpu kernels' thread pool (util.h runOnPool, parallelRows) and its thread count: workers are
// started once and parked between calls (a short spin, then a condition variable), so a kernel call
// hands work to threads that already exist instead of spawning them.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>

#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NT_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define NT_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define NT_CPU_RELAX() std::this_thread::yield()
#endif

namespace nt::cpu {

static std::atomic<int64_t> gKernelThreads{std::max<int64_t>(1, std::min<int64_t>(4, int64_t(std::thread::hardware_concurrency())))};

int64_t kernelThreads() { return gKernelThreads.load(std::memory_order_relaxed); }

namespace {

// How long a parked worker, or a caller waiting for its workers, spins before sleeping: kernels of
// one training step follow each other within microseconds, and a wake through the kernel costs more.
constexpr auto kSpin = std::chrono::microseconds(50);

// Spins until pred() or kSpin passes; returns pred().
template <class P>
bool spinFor(P pred) {
  auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; i++) {
    if (pred()) return true;
    NT_CPU_RELAX();
    if ((i & 63) == 63) {
      if (std::chrono::steady_clock::now() >= until) return pred();
      std::this_thread::yield();  // let a runnable thread (OpenBLAS's, another process's) have the core
    }
  }
}

thread_local bool tInPool = false;  // this thread is running a pool task (nested calls run inline)

struct Pool {
  std::mutex call;  // one caller at a time; a second concurrent caller runs its parts inline
  std::mutex m;
  std::condition_variable wake, done;
  std::atomic<uint64_t> gen{0};
  std::atomic<int64_t> remaining{0};
  void (*task)(void*, int64_t) = nullptr;
  void* ctx = nullptr;
  int64_t parts = 0;
  std::exception_ptr error;  // the first exception a worker's part threw (guarded by m)
  size_t nWorkers = 0;       // started workers; worker w runs part w + 1 (only grows)

  // Called under `call`, before the call's generation is posted: a new worker starts at the current
  // generation, so it waits for that post (it must not take an earlier, finished call for a new one).
  void start(size_t n) {
    while (nWorkers < n) {
      size_t w = nWorkers++;
      uint64_t g = gen.load(std::memory_order_acquire);
      std::thread([this, w, g] { loop(w, g); }).detach();  // the pool lives as long as the process
    }
  }

  void loop(size_t w, uint64_t seen) {
    tInPool = true;
    for (;;) {
      auto fresh = [&] { return gen.load(std::memory_order_acquire) != seen; };
      if (!spinFor(fresh)) {
        std::unique_lock<std::mutex> lk(m);
        wake.wait(lk, fresh);
      }
      seen = gen.load(std::memory_order_acquire);
      int64_t part = int64_t(w) + 1;
      if (part < parts) {
        try {
          task(ctx, part);
        } catch (...) {
          std::lock_guard<std::mutex> lk(m);
          if (!error) error = std::current_exception();
        }
      }
      if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(m);
        done.notify_one();
      }
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its detached workers outlive static destruction
  return *p;
}

}  // namespace

void runOnPool(int64_t parts, void (*task)(void* ctx, int64_t part), void* ctx) {
  Pool& p = pool();
  std::unique_lock<std::mutex> callLock(p.call, std::try_to_lock);
  if (parts <= 1 || tInPool || !callLock.owns_lock()) {
    for (int64_t t = 0; t < parts; t++) task(ctx, t);
    return;
  }
  p.start(size_t(parts - 1));
  {
    std::lock_guard<std::mutex> lk(p.m);
    p.task = task;
    p.ctx = ctx;
    p.parts = parts;
    p.error = nullptr;
    // Every started worker takes part in every call (those without a part just check in), so none
    // can still be reading this call's task when the next one is posted.
    p.remaining.store(int64_t(p.nWorkers), std::memory_order_relaxed);
    p.gen.fetch_add(1, std::memory_order_release);
  }
  p.wake.notify_all();
  std::exception_ptr mine;
  tInPool = true;
  try {
    task(ctx, 0);
  } catch (...) {
    mine = std::current_exception();
  }
  tInPool = false;
  auto finished = [&] { return p.remaining.load(std::memory_order_acquire) == 0; };
  if (!spinFor(finished)) {
    std::unique_lock<std::mutex> lk(p.m);
    p.done.wait(lk, finished);
  }
  std::exception_ptr theirs;
  {
    std::lock_guard<std::mutex> lk(p.m);
    theirs = p.error;
    p.error = nullptr;
  }
  if (mine) std::rethrow_exception(mine);
  if (theirs) std::rethrow_exception(theirs);
}

// setKernelThreads(n): threads for row-parallel kernels (softmax, cross-entropy, gelu, norms,
// attention, elementwise, optimizers)
static Napi::Value SetKernelThreads(const Napi::CallbackInfo& info) {
  Args a{info, "setKernelThreads"};
  a.count(1);
  int64_t n = a.size(0);
  if (n < 1 || n > 256) fail(Err::Argument, "setKernelThreads: need 1 to 256 threads, got " + std::to_string(n));
  gKernelThreads.store(n);
  return info.Env().Undefined();
}
NT_EXPORT("setKernelThreads", SetKernelThreads);

// kernelThreads() -> the current count
static Napi::Value KernelThreads(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(kernelThreads())); }
NT_EXPORT("kernelThreads", KernelThreads);

}  // namespace nt::cpu
