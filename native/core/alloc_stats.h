// The caching allocator's counters as a JS object: one layout for the cuda backend's memoryStats and
// the testing addon's allocator simulator (native/testing/alloc_sim.cc), which adds its own fields.
#pragma once

#include "caching_allocator.h"
#include "nt.h"

namespace nt {

inline Napi::Object allocatorStatsObject(Napi::Env env, const alloc::AllocatorStats& s) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("allocated", double(s.allocated));
  o.Set("reserved", double(s.reserved));
  o.Set("peak", double(s.peak));
  o.Set("allocations", double(s.allocations));
  o.Set("requested", double(s.requested));
  o.Set("cacheHits", double(s.cacheHits));
  o.Set("segments", double(s.segments));
  o.Set("deviceAllocations", double(s.deviceAllocations));
  o.Set("cacheFlushes", double(s.cacheFlushes));
  o.Set("ooms", double(s.ooms));
  o.Set("pendingFrees", double(s.pendingFrees));
  return o;
}

}  // namespace nt
