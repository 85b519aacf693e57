// The thread count of the cpu kernels that split rows over threads (util.h parallelRows).
#include <atomic>

#include "util.h"

namespace nt::cpu {

static std::atomic<int64_t> gKernelThreads{std::max<int64_t>(1, std::min<int64_t>(4, int64_t(std::thread::hardware_concurrency())))};

int64_t kernelThreads() { return gKernelThreads.load(std::memory_order_relaxed); }

// setKernelThreads(n): threads for row-parallel kernels (softmax, cross-entropy, gelu, norms, attention)
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
