// Host-only logic of the cuda backend exported for tests (no GPU needed):
//   gemmEpiloguePlan(case) -> { fused, intoAux, copyCToAux, perMatrix }: lt::planEpilogue
//     (native/cuda/gemm_plan.h), how gemm_epilogue runs an epilogue.
//   gemmWorkspaceTrace(ops) -> [{ count, bytes, freed }]: lt::WorkspaceTable, the books of the
//     per-stream cuBLASLt workspaces, driven by ops ['use', stream] | ['destroy', stream] | ['teardown'].
//   stagingSim(options, steps) -> [{ ok, message?, buffers, eventsMade, eventsLive, data? }]: the
//     host<->device transfers of runtime.cc (native/cuda/staging.h) on a simulated runtime.
#include <map>
#include <memory>
#include <vector>

#include "../core/nt.h"
#include "../cuda/gemm_plan.h"
#include "../cuda/staging.h"

namespace nt::testing {

static bool flag(const Napi::Object& o, const char* name, bool dflt) {
  Napi::Value v = o.Get(name);
  return v.IsUndefined() ? dflt : v.ToBoolean().Value();
}
static int64_t integer(const Napi::Object& o, const char* name, int64_t dflt) {
  Napi::Value v = o.Get(name);
  return v.IsUndefined() ? dflt : int64_t(v.ToNumber().DoubleValue());
}

static Napi::Value GemmEpiloguePlan(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsObject()) fail(Err::Argument, "gemmEpiloguePlan: argument 0 must be an object");
  Napi::Object o = info[0].As<Napi::Object>();
  cuda::lt::EpilogueCase c;
  c.epilogue = int(integer(o, "epilogue", 0));
  c.fusedAllowed = flag(o, "fusedAllowed", true);
  c.aux = flag(o, "aux", false);
  c.auxFits = flag(o, "auxFits", true);
  c.heuristicFound = flag(o, "heuristicFound", true);
  c.fusedNotSupported = flag(o, "fusedNotSupported", false);
  c.betaZero = flag(o, "betaZero", true);
  c.batch = integer(o, "batch", 1);
  c.m = integer(o, "m", 0);
  c.n = integer(o, "n", 0);
  c.strideC = integer(o, "strideC", c.m * c.n);
  cuda::lt::EpiloguePlan p = cuda::lt::planEpilogue(c);
  Napi::Object r = Napi::Object::New(info.Env());
  r.Set("fused", p.fused);
  r.Set("intoAux", p.intoAux);
  r.Set("copyCToAux", p.copyCToAux);
  r.Set("perMatrix", p.perMatrix);
  return r;
}
NT_EXPORT("gemmEpiloguePlan", GemmEpiloguePlan);

// Workspaces are simulated as numbered allocations of `bytes`; freed lists what went back.
static Napi::Value GemmWorkspaceTrace(const Napi::CallbackInfo& info) {
  if (info.Length() < 2 || !info[1].IsArray()) fail(Err::Argument, "gemmWorkspaceTrace: expected (bytes, ops[])");
  size_t bytes = size_t(info[0].ToNumber().DoubleValue());
  Napi::Array ops = info[1].As<Napi::Array>();
  cuda::lt::WorkspaceTable<int64_t> table;
  int64_t next = 1;
  Napi::Array out = Napi::Array::New(info.Env(), ops.Length());
  for (uint32_t i = 0; i < ops.Length(); i++) {
    Napi::Array op = ops.Get(i).As<Napi::Array>();
    std::string what = op.Get(0u).ToString().Utf8Value();
    int64_t stream = op.Length() > 1 ? int64_t(op.Get(1u).ToNumber().DoubleValue()) : 0;
    Napi::Array freed = Napi::Array::New(info.Env());
    if (what == "use") {  // gemm.cu's workspace(): find, else allocate and add
      if (!table.find(stream)) table.add(stream, next++, bytes);
    } else if (what == "destroy") {
      if (int64_t p = table.remove(stream)) freed.Set(0u, double(p));
    } else if (what == "teardown") {
      uint32_t j = 0;
      for (int64_t p : table.removeAll()) freed.Set(j++, double(p));
    } else {
      fail(Err::Argument, "gemmWorkspaceTrace: unknown op " + what);
    }
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("count", double(table.count()));
    r.Set("bytes", double(table.bytes()));
    r.Set("freed", freed);
    out.Set(i, r);
  }
  return out;
}
NT_EXPORT("gemmWorkspaceTrace", GemmWorkspaceTrace);

// A simulated CUDA runtime for staging.h: device memory is host memory, copies happen when queued,
// an event recorded on a stream stays pending until a 'complete' step, and an event recorded while
// the stream is being captured can no longer be queried or waited on (as CUDA's events recorded
// into a capture that was then discarded).
struct SimRt {
  using Stream = int;
  using Event = int64_t;
  enum State { Idle, Pending, Captured, Destroyed };
  std::map<Event, State> events;
  std::vector<std::unique_ptr<uint8_t[]>> hostBuffers;
  Event nextEvent = 1;
  int64_t made = 0;
  bool capturing = false;

  void* hostAlloc(size_t bytes) {
    hostBuffers.emplace_back(new uint8_t[bytes]);
    return hostBuffers.back().get();
  }
  Event createEvent(int) {
    made++;
    events[nextEvent] = Idle;
    return nextEvent++;
  }
  void destroyEvent(Event e) { events[e] = Destroyed; }
  State state(Event e, const char* call) {
    State s = events.at(e);
    if (s == Destroyed) fail(Err::Native, std::string(call) + ": invalid resource handle (cudaErrorInvalidResourceHandle)", call);
    if (s == Captured)
      fail(Err::Native, std::string(call) + ": operation not permitted on an event last recorded in a capturing stream (cudaErrorStreamCaptureUnsupported)",
           call);
    return s;
  }
  bool ready(Event e) { return state(e, "cudaEventQuery") != Pending; }
  void wait(Event e) {
    state(e, "cudaEventSynchronize");
    events[e] = Idle;  // a host wait lets the simulated device finish the work
  }
  void record(Event e, Stream) {
    state(e, "cudaEventRecord");
    events[e] = capturing ? Captured : Pending;
  }
  cuda::staging::EventState probe(Event e) {
    State s = events.at(e);
    return s == Idle ? cuda::staging::EventState::Ready : s == Pending ? cuda::staging::EventState::Pending : cuda::staging::EventState::Broken;
  }
  void toDevice(void* dst, const void* src, size_t n, Stream) { std::memcpy(dst, src, n); }
  void toHost(void* dst, const void* src, size_t n, Stream) { std::memcpy(dst, src, n); }
  void complete() {
    for (auto& [e, s] : events)
      if (s == Pending) s = Idle;
  }
  int64_t live() const {
    int64_t n = 0;
    for (auto& [e, s] : events) n += s != Destroyed;
    return n;
  }
};

// stagingSim({ chunk, maxBuffers, minBytes, deviceBytes, resetOnAbort }, steps): steps are
//   ['write', offset, bytes, seed]  write bytes (byte i = (seed + i) & 255) at offset, through runtime.cc's path
//   ['read', offset, bytes]         read them back (the result's `data`)
//   ['begin'] / ['abort']           a capture starts on the device / is discarded (resetEvents unless resetOnAbort is false)
//   ['recordInCapture']             what the unguarded read did: a staging event recorded into the capture
//   ['complete']                    the simulated device finishes its queued work
static Napi::Value StagingSim(const Napi::CallbackInfo& info) {
  if (info.Length() < 2 || !info[0].IsObject() || !info[1].IsArray()) fail(Err::Argument, "stagingSim: expected (options, steps[])");
  Napi::Env env = info.Env();
  Napi::Object o = info[0].As<Napi::Object>();
  size_t chunk = size_t(integer(o, "chunk", 64)), maxBuffers = size_t(integer(o, "maxBuffers", 8)), minBytes = size_t(integer(o, "minBytes", 16));
  size_t deviceBytes = size_t(integer(o, "deviceBytes", 4096));
  bool resetOnAbort = flag(o, "resetOnAbort", true);
  SimRt rt;
  cuda::staging::Pool<SimRt> pool(rt, maxBuffers, minBytes);
  std::vector<uint8_t> device(deviceBytes);
  const int dev = 0, stream = 1;
  Napi::Array steps = info[1].As<Napi::Array>();
  Napi::Array out = Napi::Array::New(env, steps.Length());
  for (uint32_t i = 0; i < steps.Length(); i++) {
    Napi::Array st = steps.Get(i).As<Napi::Array>();
    std::string what = st.Get(0u).ToString().Utf8Value();
    auto arg = [&](uint32_t j) { return size_t(st.Get(j).ToNumber().DoubleValue()); };
    Napi::Object r = Napi::Object::New(env);
    try {
      int64_t capture = rt.capturing ? stream : -1;
      if (what == "write") {
        size_t off = arg(1), n = arg(2), seed = arg(3);
        if (off + n > deviceBytes) fail(Err::Argument, "stagingSim: write past the simulated device");
        std::vector<uint8_t> src(n);
        for (size_t b = 0; b < n; b++) src[b] = uint8_t((seed + b) & 255);
        cuda::staging::hostToDevice(rt, pool, "write", dev, capture, stream, device.data() + off, src.data(), n, chunk);
      } else if (what == "read") {
        size_t off = arg(1), n = arg(2);
        if (off + n > deviceBytes) fail(Err::Argument, "stagingSim: read past the simulated device");
        std::vector<uint8_t> dst(n);
        cuda::staging::deviceToHost(rt, pool, "read", dev, capture, stream, dst.data(), device.data() + off, n, chunk);
        Napi::Array data = Napi::Array::New(env, n);
        for (size_t b = 0; b < n; b++) data.Set(uint32_t(b), double(dst[b]));
        r.Set("data", data);
      } else if (what == "begin") {
        rt.capturing = true;
      } else if (what == "abort") {
        rt.capturing = false;
        if (resetOnAbort) pool.resetEvents(dev);
      } else if (what == "recordInCapture") {
        auto& buf = pool.acquire(dev, 1);
        rt.record(buf.done, stream);
      } else if (what == "complete") {
        rt.complete();
      } else {
        fail(Err::Argument, "stagingSim: unknown step " + what);
      }
      r.Set("ok", true);
    } catch (const Error& e) {
      r.Set("ok", false);
      r.Set("message", e.message);
    }
    r.Set("buffers", double(pool.size()));
    r.Set("eventsMade", double(rt.made));
    r.Set("eventsLive", double(rt.live()));
    out.Set(i, r);
  }
  return out;
}
NT_EXPORT("stagingSim", StagingSim);

}  // namespace nt::testing
