// The per-device caching allocator of the cuda backend: the stream-aware bookkeeping of
// native/core/caching_allocator.h (design note there) over cudaMalloc/cudaFree and CUDA events.
// Stream ids are the runtime's (0 = the device's default stream); see runtime.h.
#pragma once

#include "../core/caching_allocator.h"

namespace nt::cuda {

// The allocator of a device, created on first use (the device must exist: see requireDevice).
alloc::CachingAllocator& allocator(int device);
// Allocates on the device's current stream.
void* deviceAlloc(int device, size_t bytes, const char* call);
void deviceFree(int device, void* p);
// Frees every allocator's cached segments (all devices that have one).
void emptyAllCaches();
// Graph capture (native/cuda/graph.cc): the allocator key of a request on `stream` (the capture's
// pool while that stream is being captured, else the stream), and whether a free made during a
// capture is deferred until its graph is destroyed (a block from outside the capture's pool).
int64_t allocationStream(int device, int64_t stream);
bool deferFreeDuringCapture(int device, void* p);

}  // namespace nt::cuda
