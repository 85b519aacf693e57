// cudaMalloc/cudaFree and CUDA events behind the caching allocator's RawMemory interface, one
// allocator per device (design note in native/core/caching_allocator.h).
#include "allocator.h"

#include <memory>
#include <mutex>
#include <vector>

#include "runtime.h"

namespace nt::cuda {

class CudaMemory : public alloc::RawMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {}
  void* allocate(size_t bytes) override {
    useDevice(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error so later calls do not report it
      return nullptr;
    }
    check(e, "cudaMalloc");
    return p;
  }
  void release(void* p, size_t) override {
    useDevice(device_);
    check(cudaFree(p), "cudaFree");
  }
  alloc::EventId recordEvent(alloc::StreamId stream) override {
    useDevice(device_);
    cudaEvent_t ev;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventRecord(ev, streamById(int64_t(stream), device_, "recordEvent")), "cudaEventRecord");
    return reinterpret_cast<alloc::EventId>(ev);
  }
  bool eventDone(alloc::EventId e) override {
    cudaError_t s = cudaEventQuery(reinterpret_cast<cudaEvent_t>(e));
    if (s == cudaErrorNotReady) return false;
    check(s, "cudaEventQuery");
    return true;
  }
  void destroyEvent(alloc::EventId e) override { cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e)); }

 private:
  int device_;
};

struct DeviceAllocator {
  std::unique_ptr<CudaMemory> memory;
  std::unique_ptr<alloc::CachingAllocator> allocator;
};

static std::mutex allocatorsMutex;
static std::vector<DeviceAllocator>& allocators() {
  // Never destroyed: at process exit the driver may already be unloading, and freeing device
  // memory from a static destructor would race with it.
  static auto* v = new std::vector<DeviceAllocator>();
  return *v;
}

alloc::CachingAllocator& allocator(int device) {
  std::lock_guard<std::mutex> lock(allocatorsMutex);
  auto& v = allocators();
  if (size_t(device) >= v.size()) v.resize(size_t(device) + 1);
  DeviceAllocator& d = v[size_t(device)];
  if (!d.allocator) {
    d.memory = std::make_unique<CudaMemory>(device);
    d.allocator = std::make_unique<alloc::CachingAllocator>(*d.memory, "cuda:" + std::to_string(device));
  }
  return *d.allocator;
}

void* deviceAlloc(int device, size_t bytes, const char* call) {
  return allocator(device).allocate(bytes, alloc::StreamId(allocationStream(device, currentStreamId(device))), call);
}

void deviceFree(int device, void* p) {
  if (p && deferFreeDuringCapture(device, p)) return;
  allocator(device).free(p);
}

void emptyAllCaches() {
  size_t n;
  {
    std::lock_guard<std::mutex> lock(allocatorsMutex);
    n = allocators().size();
  }
  for (size_t d = 0; d < n; d++)
    if (allocators()[d].allocator) allocators()[d].allocator->emptyCache();
}

}  // namespace nt::cuda
