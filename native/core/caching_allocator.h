// Bookkeeping of the stream-aware caching allocator (header-only, no CUDA): the cuda backend runs it
// over cudaMalloc (native/cuda/allocator.*), the cpu addon over simulated memory so tests need no GPU.
//
// Design (after PyTorch's CUDACachingAllocator):
// - Memory comes from the device in segments; a segment is carved into blocks. A freed block is
//   cached, not returned, because cudaMalloc/cudaFree synchronize the device and cost 100s of µs.
// - Every segment, and so every block, belongs to the stream it was first allocated for. A cached
//   block is handed out again only for that stream: kernels on one stream run in order, so a block
//   freed by the host while earlier kernels still use it is safe to reuse for later kernels on the
//   same stream without any synchronization. A block that was also used on other streams
//   (recordStream) returns to the cache only after events recorded on those streams at free time
//   have completed.
// - Requests of at most 1 MiB ("small") are packed into 2 MiB segments; larger ones take 20 MiB
//   segments when under 10 MiB, else a segment of their size rounded to 2 MiB. The best-fitting
//   cached block (smallest that is large enough) is split; the rest stays cached. Small blocks split
//   down to 512 bytes, large ones only when more than 1 MiB would remain, which bounds
//   fragmentation of the large pool.
// - A freed block merges with free neighbours of its segment, so a segment whose blocks are all free
//   is one block again and can be released.
// - A destroyed stream (the runtime synchronizes it first) has no work left and gets none later:
//   streamDestroyed() forgets it in every block's recorded streams (no event is needed for it), and
//   releases its segments, which no later request can use, as soon as they are fully free.
// - When the device refuses a segment, every fully free cached segment is released and the request
//   retried once; if that fails too, OutOfMemoryError carries the allocator's statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "nt.h"

namespace nt::alloc {

using StreamId = uint64_t;
using EventId = uint64_t;

// What the allocator needs from a device: raw segments and stream events.
struct RawMemory {
  virtual ~RawMemory() = default;
  // nullptr when the device has no room (any other failure throws).
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  // An event that completes when the work queued on `stream` so far has finished.
  virtual EventId recordEvent(StreamId stream) = 0;
  virtual bool eventDone(EventId e) = 0;
  virtual void destroyEvent(EventId e) = 0;
};

struct AllocatorStats {
  int64_t allocated = 0;       // bytes of blocks handed out (rounded sizes)
  int64_t requested = 0;       // bytes callers asked for
  int64_t reserved = 0;        // bytes of segments held from the device
  int64_t peak = 0;            // highest `allocated` since start or resetPeak()
  int64_t allocations = 0;     // successful allocate() calls
  int64_t cacheHits = 0;       // allocate() served from cached blocks
  int64_t segments = 0;        // live segments
  int64_t deviceAllocations = 0;  // segments obtained from the device, ever
  int64_t cacheFlushes = 0;    // times the cache was released to satisfy a request
  int64_t ooms = 0;            // requests that failed after the flush
  int64_t pendingFrees = 0;    // freed blocks waiting for other streams' events
};

class CachingAllocator {
 public:
  static constexpr size_t kRoundBytes = 512;
  static constexpr size_t kSmallLimitBytes = size_t(1) << 20;
  static constexpr size_t kSmallSegmentBytes = size_t(2) << 20;
  static constexpr size_t kMidLimitBytes = size_t(10) << 20;
  static constexpr size_t kMidSegmentBytes = size_t(20) << 20;
  static constexpr size_t kLargeRoundBytes = size_t(2) << 20;

  struct BlockInfo {
    size_t offsetBytes;
    size_t bytes;
    bool allocated;
  };
  struct SegmentInfo {
    uintptr_t base;
    size_t bytes;
    StreamId stream;
    bool small;
    std::vector<BlockInfo> blocks;
  };

  CachingAllocator(RawMemory& raw, std::string deviceName) : raw_(raw), deviceName_(std::move(deviceName)) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  ~CachingAllocator() {
    // Live blocks may still be referenced by kernels at exit; only cached segments go back.
    for (Block* b : pending_)
      for (EventId e : b->events) raw_.destroyEvent(e);
    releaseCached();
  }

  // Returns device memory of at least `bytes` usable on `stream` (nullptr for 0 bytes).
  void* allocate(size_t bytes, StreamId stream, const char* call) {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    processEventsLocked();
    size_t size = roundUp(bytes, kRoundBytes);
    bool small = size <= kSmallLimitBytes;
    std::set<Block*, BlockLess>& pool = small ? small_ : large_;
    Block key{};
    key.stream = stream;
    key.size = size;
    Block* b = nullptr;
    auto it = pool.lower_bound(&key);
    if (it != pool.end() && (*it)->stream == stream) {
      b = *it;
      pool.erase(it);
      stats_.cacheHits++;
    } else {
      b = newSegment(size, small, stream, call);
    }
    size_t rest = b->size - size;
    if (small ? rest >= kRoundBytes : rest > kSmallLimitBytes) {
      Block* r = new Block{};
      r->ptr = b->ptr + size;
      r->size = rest;
      r->stream = stream;
      r->small = small;
      r->prev = b;
      r->next = b->next;
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = size;
      pool.insert(r);
    }
    b->allocated = true;
    b->requested = bytes;
    live_[b->ptr] = b;
    stats_.allocated += int64_t(b->size);
    stats_.requested += int64_t(bytes);
    stats_.allocations++;
    if (stats_.allocated > stats_.peak) stats_.peak = stats_.allocated;
    return b->ptr;
  }

  // Returns a block to the cache (after the streams it was recorded on have caught up). If an event
  // cannot be recorded the call throws and the block stays live: the books never lose it.
  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Block* b = liveBlock(p, "free");
    std::vector<EventId> events;
    try {
      for (StreamId s : b->usedOn)
        if (!dead_.count(s)) events.push_back(raw_.recordEvent(s));
    } catch (...) {
      for (EventId e : events) raw_.destroyEvent(e);
      throw;
    }
    live_.erase(b->ptr);
    stats_.allocated -= int64_t(b->size);
    stats_.requested -= int64_t(b->requested);
    b->usedOn.clear();
    if (events.empty()) {
      toCache(b);
      return;
    }
    b->events = std::move(events);
    pending_.push_back(b);
    stats_.pendingFrees++;
  }

  // The stream (or pool key) a live block was allocated for.
  StreamId streamOf(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    return liveBlock(p, "streamOf")->stream;
  }

  // Declares that a live block is also used by work on `stream` (a destroyed stream has none).
  void recordStream(void* p, StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    Block* b = liveBlock(p, "recordStream");
    if (stream == b->stream || dead_.count(stream)) return;
    for (StreamId s : b->usedOn)
      if (s == stream) return;
    b->usedOn.push_back(stream);
  }

  // `pool` is a CUDA graph's memory pool (a key its capture allocates under): its free blocks are
  // not released by emptyCache or an out-of-memory retry while it lives, because the graph's replays
  // still write them (the capture freed them to the pool, the graph kept their addresses). Retired by
  // streamDestroyed(pool) when the graph is destroyed.
  void poolCreated(StreamId pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    pools_.insert(pool);
  }

  // `stream` was destroyed after all its work finished (ids are never reused). Blocks recorded as
  // used on it no longer wait for it; its segments are released once fully free (now, or when their
  // last block is freed), since no later request can be served from them.
  void streamDestroyed(StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    dead_.insert(stream);
    pools_.erase(stream);
    for (auto& [ptr, b] : live_) {
      auto& u = b->usedOn;
      for (size_t i = 0; i < u.size();) {
        if (u[i] == stream) {
          u[i] = u.back();
          u.pop_back();
        } else {
          i++;
        }
      }
    }
    processEventsLocked();
    releaseCached(&stream);
  }

  // Caches blocks whose cross-stream events have completed.
  void processEvents() {
    std::lock_guard<std::mutex> lock(mutex_);
    processEventsLocked();
  }

  // Gives every fully free cached segment back to the device.
  void emptyCache() {
    std::lock_guard<std::mutex> lock(mutex_);
    processEventsLocked();
    releaseCached();
  }

  AllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void resetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak = stats_.allocated;
  }
  const std::string& deviceName() const { return deviceName_; }

  // Every segment with its blocks in address order (for tests and memory snapshots).
  std::vector<SegmentInfo> snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SegmentInfo> out;
    for (const auto& [base, head] : segments_) {
      SegmentInfo s{reinterpret_cast<uintptr_t>(base), 0, head->stream, head->small, {}};
      for (const Block* b = head; b; b = b->next) {
        s.blocks.push_back({size_t(b->ptr - base), b->size, b->allocated});
        s.bytes += b->size;
      }
      out.push_back(std::move(s));
    }
    return out;
  }

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    StreamId stream = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours inside the same segment
    Block* next = nullptr;
    std::vector<StreamId> usedOn;
    std::vector<EventId> events;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };

  static size_t roundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }

  Block* liveBlock(void* p, const char* call) {
    auto it = live_.find(static_cast<char*>(p));
    if (it == live_.end())
      fail(Err::Argument, std::string(call) + ": pointer was not allocated by the " + deviceName_ + " allocator or was already freed");
    return it->second;
  }

  Block* newSegment(size_t size, bool small, StreamId stream, const char* call) {
    size_t bytes = small ? kSmallSegmentBytes : size < kMidLimitBytes ? kMidSegmentBytes : roundUp(size, kLargeRoundBytes);
    void* p = raw_.allocate(bytes);
    if (!p) {
      stats_.cacheFlushes++;
      releaseCached();
      p = raw_.allocate(bytes);
    }
    if (!p) {
      stats_.ooms++;
      fail(Err::OutOfMemory,
           "out of memory on " + deviceName_ + ": tried to allocate " + std::to_string(size) + " bytes (a segment of " +
               std::to_string(bytes) + "); allocated " + std::to_string(stats_.allocated) + " bytes by live tensors, reserved " +
               std::to_string(stats_.reserved) + " bytes, peak " + std::to_string(stats_.peak) + " bytes, " +
               std::to_string(stats_.pendingFrees) + " frees waiting on other streams",
           call);
    }
    Block* b = new Block{};
    b->ptr = static_cast<char*>(p);
    b->size = bytes;
    b->stream = stream;
    b->small = small;
    segments_[b->ptr] = b;
    stats_.reserved += int64_t(bytes);
    stats_.segments++;
    stats_.deviceAllocations++;
    return b;
  }

  // Marks a block free, merges it with free neighbours and puts the result in its pool.
  void toCache(Block* b) {
    std::set<Block*, BlockLess>& pool = b->small ? small_ : large_;
    b->allocated = false;
    b->requested = 0;
    if (b->prev && !b->prev->allocated) {
      Block* p = b->prev;
      pool.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      delete b;
      b = p;
    }
    if (b->next && !b->next->allocated) {
      Block* n = b->next;
      pool.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      delete n;
    }
    if (!b->prev && !b->next && dead_.count(b->stream)) {  // a dead stream's segment, now fully free
      releaseSegment(b);
      return;
    }
    pool.insert(b);
  }

  // Gives a segment that is one free block, not in any pool, back to the device.
  void releaseSegment(Block* b) {
    segments_.erase(b->ptr);
    raw_.release(b->ptr, b->size);
    stats_.reserved -= int64_t(b->size);
    stats_.segments--;
    delete b;
  }

  void processEventsLocked() {
    for (size_t i = 0; i < pending_.size();) {
      Block* b = pending_[i];
      bool done = true;
      for (EventId e : b->events) done = done && raw_.eventDone(e);
      if (!done) {
        i++;
        continue;
      }
      for (EventId e : b->events) raw_.destroyEvent(e);
      b->events.clear();
      pending_[i] = pending_.back();
      pending_.pop_back();
      stats_.pendingFrees--;
      toCache(b);
    }
  }

  // Releases every fully free cached segment (only those of *onlyStream when given), but a live graph
  // pool's (poolCreated).
  void releaseCached(const StreamId* onlyStream = nullptr) {
    for (std::set<Block*, BlockLess>* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next || (onlyStream && b->stream != *onlyStream) || pools_.count(b->stream)) {
          ++it;
          continue;
        }
        it = pool->erase(it);
        releaseSegment(b);
      }
    }
  }

  RawMemory& raw_;
  std::string deviceName_;
  mutable std::mutex mutex_;
  std::set<Block*, BlockLess> small_, large_;
  std::unordered_map<char*, Block*> live_;
  std::unordered_map<char*, Block*> segments_;  // base -> first block
  std::vector<Block*> pending_;
  std::set<StreamId> dead_;  // destroyed streams
  std::set<StreamId> pools_;  // live CUDA graph pools (poolCreated until streamDestroyed)
  AllocatorStats stats_;
};

}  // namespace nt::alloc
