// Host<->device transfers through pinned staging buffers (write/read in runtime.cc), written over a
// runtime interface `Rt` so that the test-only addon runs the same code on a simulated runtime
// without a GPU (native/testing/cuda_staging.cc). Host-only: no CUDA header here.
//
// Rt provides: a `Stream` and an `Event` type; `void* hostAlloc(size_t)`, `Event createEvent(int
// device)`, `void destroyEvent(Event)` (never throws); `bool ready(Event)` (true when its work is
// done, false while pending, a typed error otherwise), `void wait(Event)`, `void record(Event,
// Stream)`, `EventState probe(Event)` (never throws); `void toDevice(void* dst, const void* src,
// size_t, Stream)` and `void toHost(void* dst, const void* src, size_t, Stream)`, queued on the stream.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>

#include "../core/nt.h"

namespace nt::cuda::staging {

enum class EventState { Ready, Pending, Broken };

// A transfer between host and device memory cannot be part of a CUDA graph: a captured write copies
// from a staging buffer that later writes reuse (each replay would read whatever was staged last),
// and a captured read cannot hand values back to the host (its wait fails the capture, and the
// staging event recorded into the capture breaks later transfers). Both are refused while the
// device captures (`captureStream` >= 0), before any staging buffer is touched.
inline void refuseDuringCapture(const char* op, bool toDevice, int device, int64_t captureStream) {
  if (captureStream < 0) return;
  std::string where = "cuda:" + std::to_string(device) + " is capturing a CUDA graph (nt.cuda.graph, stream " + std::to_string(captureStream) + ")";
  if (toDevice)
    fail(Err::Native,
         std::string(op) + ": a host-to-device write cannot be captured into a CUDA graph (" + where +
             "): replays would copy from a staging buffer that later writes reuse, so they would read stale data. "
             "Write outside the captured function, into a device-resident tensor made before the capture that the captured work reads",
         op);
  fail(Err::Native,
       std::string(op) + ": a device-to-host read cannot be captured into a CUDA graph (" + where +
           "): a replay cannot hand values back to the host. Read outside the captured function, or keep the values in a "
           "device-resident tensor and read it after replay()",
       op);
}

// A bounded set of page-locked buffers, each reused once the event recorded after its copy completed.
template <typename Rt>
class Pool {
 public:
  using Event = typename Rt::Event;
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    Event done{};
    int device = -1;
  };

  explicit Pool(Rt& rt, size_t maxBuffers = 8, size_t minBytes = size_t(1) << 20) : rt_(rt), max_(maxBuffers), minBytes_(minBytes) {}

  // A free buffer of the device holding `bytes`: a finished one, else (at the bound) the oldest
  // one after waiting for it, else a new one.
  Buffer& acquire(int device, size_t bytes) {
    for (Buffer& b : bufs_) {
      if (b.device != device || b.bytes < bytes) continue;
      if (rt_.ready(b.done)) return b;
    }
    if (bufs_.size() >= max_) {
      for (Buffer& b : bufs_) {
        if (b.device != device || b.bytes < bytes) continue;
        rt_.wait(b.done);
        return b;
      }
    }
    Buffer b;
    b.device = device;
    b.bytes = std::max(bytes, minBytes_);
    b.ptr = rt_.hostAlloc(b.bytes);
    b.done = rt_.createEvent(device);  // never recorded: ready
    bufs_.push_back(b);
    return bufs_.back();
  }

  // After a discarded capture: every staging event of the device is made anew (an event recorded
  // into a capture cannot be queried or waited on afterwards), once the eager copies still pending
  // on them have finished. Returns how many events were replaced.
  size_t resetEvents(int device) {
    size_t n = 0;
    for (Buffer& b : bufs_) {
      if (b.device != device) continue;
      if (rt_.probe(b.done) == EventState::Pending) {
        try { rt_.wait(b.done); } catch (const Error&) {}  // broken after all: replaced below
      }
      Event fresh = rt_.createEvent(device);
      rt_.destroyEvent(b.done);
      b.done = fresh;
      n++;
    }
    return n;
  }

  size_t size() const { return bufs_.size(); }

 private:
  Rt& rt_;
  size_t max_, minBytes_;
  std::deque<Buffer> bufs_;  // a deque: references handed out stay valid as it grows
};

// write: host -> device in chunks of at most `chunk` bytes, ordered on `stream`. Returns once the
// bytes sit in staging buffers, so the caller may reuse `src` at once.
template <typename Rt>
void hostToDevice(Rt& rt, Pool<Rt>& pool, const char* op, int device, int64_t captureStream, typename Rt::Stream stream, uint8_t* dst,
                  const uint8_t* src, size_t bytes, size_t chunk) {
  refuseDuringCapture(op, true, device, captureStream);
  for (size_t done = 0; done < bytes;) {
    size_t n = std::min(chunk, bytes - done);
    auto& buf = pool.acquire(device, n);
    std::memcpy(buf.ptr, src + done, n);
    rt.toDevice(dst + done, buf.ptr, n, stream);
    rt.record(buf.done, stream);
    done += n;
  }
}

// read: device -> host in chunks, each waited for (after the work queued on `stream` before it).
template <typename Rt>
void deviceToHost(Rt& rt, Pool<Rt>& pool, const char* op, int device, int64_t captureStream, typename Rt::Stream stream, uint8_t* dst,
                  const uint8_t* src, size_t bytes, size_t chunk) {
  refuseDuringCapture(op, false, device, captureStream);
  for (size_t done = 0; done < bytes;) {
    size_t n = std::min(chunk, bytes - done);
    auto& buf = pool.acquire(device, n);
    rt.toHost(buf.ptr, src + done, n, stream);
    rt.record(buf.done, stream);
    rt.wait(buf.done);
    std::memcpy(dst + done, buf.ptr, n);
    done += n;
  }
}

}  // namespace nt::cuda::staging
