// HostAllocatorSim: the cuda caching allocator's bookkeeping (native/core/caching_allocator.h) over
// simulated device memory and streams, so its splitting, merging, stream reuse and OOM handling are
// tested on machines without a GPU. Addresses are fake (never dereferenced); no memory is touched.
#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "../core/alloc_stats.h"
#include "../core/caching_allocator.h"

namespace nt::cpu {

// A device of `capacity` bytes whose streams are "busy" until the test says they are idle: an event
// recorded on a busy stream completes when that stream next becomes idle.
class SimMemory : public alloc::RawMemory {
 public:
  explicit SimMemory(size_t capacityBytes) : capacity_(capacityBytes) {}
  void* allocate(size_t bytes) override {
    if (used_ + bytes > capacity_) return nullptr;
    used_ += bytes;
    uintptr_t p = next_;
    next_ += bytes + 4096;  // gaps keep segments from looking adjacent
    live_[p] = bytes;
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, size_t bytes) override {
    auto it = live_.find(reinterpret_cast<uintptr_t>(p));
    if (it == live_.end() || it->second != bytes) fail(Err::Native, "HostAllocatorSim: release of a segment it does not hold");
    used_ -= bytes;
    live_.erase(it);
  }
  alloc::EventId recordEvent(alloc::StreamId stream) override {
    // Like the cuda runtime, which no longer knows a destroyed stream's id.
    if (unknown_.count(stream)) fail(Err::Argument, "recordEvent: unknown or destroyed stream " + std::to_string(stream));
    alloc::EventId e = ++lastEvent_;
    if (busy_.count(stream)) eventsOn_[stream].insert(e);
    return e;
  }
  bool eventDone(alloc::EventId e) override {
    for (auto& [s, events] : eventsOn_)
      if (events.count(e)) return false;
    return true;
  }
  void destroyEvent(alloc::EventId e) override { destroyed_++; }
  void setBusy(alloc::StreamId s, bool busy) {
    if (busy) {
      busy_.insert(s);
    } else {
      busy_.erase(s);
      eventsOn_.erase(s);
    }
  }
  // The stream is gone: recording an event on it fails from now on.
  void forget(alloc::StreamId s) { unknown_.insert(s); }
  size_t used() const { return used_; }
  int64_t destroyedEvents() const { return destroyed_; }

 private:
  size_t capacity_;
  size_t used_ = 0;
  uintptr_t next_ = uintptr_t(1) << 32;
  std::map<uintptr_t, size_t> live_;
  std::set<alloc::StreamId> busy_, unknown_;
  std::map<alloc::StreamId, std::set<alloc::EventId>> eventsOn_;
  alloc::EventId lastEvent_ = 0;
  int64_t destroyed_ = 0;
};

class HostAllocatorSim : public Napi::ObjectWrap<HostAllocatorSim> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function fn = DefineClass(env, "HostAllocatorSim",
                                    {InstanceMethod("allocate", &HostAllocatorSim::Allocate),
                                     InstanceMethod("free", &HostAllocatorSim::Free),
                                     InstanceMethod("recordStream", &HostAllocatorSim::RecordStream),
                                     InstanceMethod("setStreamBusy", &HostAllocatorSim::SetStreamBusy),
                                     InstanceMethod("destroyStream", &HostAllocatorSim::DestroyStream),
                                     InstanceMethod("emptyCache", &HostAllocatorSim::EmptyCache),
                                     InstanceMethod("poolCreated", &HostAllocatorSim::PoolCreated),
                                     InstanceMethod("resetPeak", &HostAllocatorSim::ResetPeak),
                                     InstanceMethod("stats", &HostAllocatorSim::Stats),
                                     InstanceMethod("segments", &HostAllocatorSim::Segments)});
    exports.Set("HostAllocatorSim", fn);
  }

  // new HostAllocatorSim(capacityBytes)
  explicit HostAllocatorSim(const Napi::CallbackInfo& info) : Napi::ObjectWrap<HostAllocatorSim>(info) {
    double cap = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
    if (!(cap >= 0 && cap < 9007199254740992.0)) {
      makeError(info.Env(), Err::Argument, "HostAllocatorSim: capacityBytes must be a non-negative number", "HostAllocatorSim")
          .ThrowAsJavaScriptException();
      return;
    }
    memory_ = std::make_unique<SimMemory>(size_t(cap));
    allocator_ = std::make_unique<alloc::CachingAllocator>(*memory_, "sim");
  }

 private:
  template <typename F>
  Napi::Value run(const Napi::CallbackInfo& info, const char* call, F f) {
    try {
      return f(Args{info, call});
    } catch (const Error& e) {
      makeError(info.Env(), e.code, e.message, e.call.empty() ? call : e.call).ThrowAsJavaScriptException();
      return info.Env().Undefined();
    }
  }

  // allocate(bytes, stream) -> address (a number)
  Napi::Value Allocate(const Napi::CallbackInfo& info) {
    return run(info, "allocate", [&](const Args& a) {
      void* p = allocator_->allocate(size_t(a.size(0)), alloc::StreamId(a.size(1)), "allocate");
      return Napi::Number::New(info.Env(), double(reinterpret_cast<uintptr_t>(p)));
    });
  }
  Napi::Value Free(const Napi::CallbackInfo& info) {
    return run(info, "free", [&](const Args& a) {
      allocator_->free(reinterpret_cast<void*>(uintptr_t(a.size(0))));
      return info.Env().Undefined();
    });
  }
  Napi::Value RecordStream(const Napi::CallbackInfo& info) {
    return run(info, "recordStream", [&](const Args& a) {
      allocator_->recordStream(reinterpret_cast<void*>(uintptr_t(a.size(0))), alloc::StreamId(a.size(1)));
      return info.Env().Undefined();
    });
  }
  // setStreamBusy(stream, busy): work queued on a busy stream has not finished yet.
  Napi::Value SetStreamBusy(const Napi::CallbackInfo& info) {
    return run(info, "setStreamBusy", [&](const Args& a) {
      memory_->setBusy(alloc::StreamId(a.size(0)), a.boolean(1));
      return info.Env().Undefined();
    });
  }
  // destroyStream(stream, notify = true): what the cuda runtime's streamDestroy does: the stream is
  // synchronized (its events complete), destroyed (the device forgets it), and, unless notify is
  // false (to test the allocator without the notification), the allocator is told.
  Napi::Value DestroyStream(const Napi::CallbackInfo& info) {
    return run(info, "destroyStream", [&](const Args& a) {
      alloc::StreamId s = alloc::StreamId(a.size(0));
      bool notify = info.Length() < 2 || info[1].IsUndefined() || a.boolean(1);
      memory_->setBusy(s, false);
      memory_->forget(s);
      if (notify) allocator_->streamDestroyed(s);
      return info.Env().Undefined();
    });
  }
  // Marks `stream` as a live CUDA graph pool (graph.cc does it at graphBegin; destroyStream retires it).
  Napi::Value PoolCreated(const Napi::CallbackInfo& info) {
    return run(info, "poolCreated", [&](const Args& a) {
      allocator_->poolCreated(alloc::StreamId(a.size(0)));
      return info.Env().Undefined();
    });
  }
  Napi::Value EmptyCache(const Napi::CallbackInfo& info) {
    return run(info, "emptyCache", [&](const Args&) {
      allocator_->emptyCache();
      return info.Env().Undefined();
    });
  }
  Napi::Value ResetPeak(const Napi::CallbackInfo& info) {
    return run(info, "resetPeak", [&](const Args&) {
      allocator_->resetPeak();
      return info.Env().Undefined();
    });
  }
  Napi::Value Stats(const Napi::CallbackInfo& info) {
    return run(info, "stats", [&](const Args&) {
      Napi::Object o = allocatorStatsObject(info.Env(), allocator_->stats());
      o.Set("deviceBytesUsed", double(memory_->used()));
      o.Set("eventsDestroyed", double(memory_->destroyedEvents()));
      return o;
    });
  }
  // segments() -> [{ base, bytes, stream, small, blocks: [{ offsetBytes, bytes, allocated }] }] by address
  Napi::Value Segments(const Napi::CallbackInfo& info) {
    return run(info, "segments", [&](const Args&) {
      auto segs = allocator_->snapshot();
      std::sort(segs.begin(), segs.end(), [](const auto& x, const auto& y) { return x.base < y.base; });
      Napi::Array out = Napi::Array::New(info.Env(), segs.size());
      for (size_t i = 0; i < segs.size(); i++) {
        Napi::Object s = Napi::Object::New(info.Env());
        s.Set("base", double(segs[i].base));
        s.Set("bytes", double(segs[i].bytes));
        s.Set("stream", double(segs[i].stream));
        s.Set("small", segs[i].small);
        Napi::Array blocks = Napi::Array::New(info.Env(), segs[i].blocks.size());
        for (size_t j = 0; j < segs[i].blocks.size(); j++) {
          Napi::Object b = Napi::Object::New(info.Env());
          b.Set("offsetBytes", double(segs[i].blocks[j].offsetBytes));
          b.Set("bytes", double(segs[i].blocks[j].bytes));
          b.Set("allocated", segs[i].blocks[j].allocated);
          blocks.Set(uint32_t(j), b);
        }
        s.Set("blocks", blocks);
        out.Set(uint32_t(i), s);
      }
      return out;
    });
  }

  std::unique_ptr<SimMemory> memory_;
  std::unique_ptr<alloc::CachingAllocator> allocator_;
};

NT_EXPORT_CLASS(HostAllocatorSim::Init);

}  // namespace nt::cpu
