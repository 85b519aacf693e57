// CUDA runtime layer: typed status checks, driver/device discovery, stream and event handles, device
// Storage, host<->device transfers through pinned staging buffers, and the memory statistics calls.
#include "runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <vector>

#include "../core/alloc_stats.h"
#include "staging.h"

namespace nt::cuda {

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  Err code = status == cudaErrorMemoryAllocation ? Err::OutOfMemory : Err::Native;
  fail(code, std::string(call) + ": " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")", call);
}

// ---- driver and devices ------------------------------------------------------------------------
struct Discovery {
  int count = 0;
  std::string status = "ok";
};

static const Discovery& discovery() {
  static Discovery d = [] {
    Discovery r;
    // cudart (static) loads libcuda.so.1 itself; look first so a missing driver is named plainly.
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
      r.status = "no NVIDIA driver found (libcuda.so.1 missing): install the NVIDIA driver (580 or newer for CUDA 13)";
      return r;
    }
    dlclose(h);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      r.status = std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
      if (e == cudaErrorInsufficientDriver)
        r.status += ": the NVIDIA driver is older than this CUDA runtime; update the driver (580 or newer for CUDA 13)";
      return r;
    }
    if (n == 0) r.status = "the NVIDIA driver is present but no GPU is visible (check CUDA_VISIBLE_DEVICES)";
    r.count = n;
    return r;
  }();
  return d;
}

int deviceCount() { return discovery().count; }
std::string driverStatus() { return discovery().status; }

void requireDevice(int device, const char* call) {
  const Discovery& d = discovery();
  if (d.count == 0) fail(Err::BackendUnavailable, std::string(call) + ": cuda is not usable: " + d.status, call);
  if (device < 0 || device >= d.count)
    fail(Err::Device, std::string(call) + ": cuda:" + std::to_string(device) + " does not exist (this machine has " +
                          std::to_string(d.count) + " GPU" + (d.count == 1 ? "" : "s") + ")",
         call);
}

// The device the running call used last (for the debug synchronization below).
static thread_local int touchedDevice = -1;

void useDevice(int device) {
  thread_local int current = -1;
  touchedDevice = device;
  if (current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  current = device;
}

// ---- streams -----------------------------------------------------------------------------------
struct StreamEntry {
  int device;
  cudaStream_t stream;
};
static std::mutex streamsMutex;
static std::vector<StreamEntry> streams(1, StreamEntry{-1, nullptr});  // id 0: each device's default
static std::vector<int64_t> currentIds;

int64_t currentStreamId(int device) {
  std::lock_guard<std::mutex> lock(streamsMutex);
  return size_t(device) < currentIds.size() ? currentIds[size_t(device)] : 0;
}

cudaStream_t streamById(int64_t id, int device, const char* call) {
  if (id == 0) return nullptr;
  std::lock_guard<std::mutex> lock(streamsMutex);
  if (id < 0 || size_t(id) >= streams.size() || !streams[size_t(id)].stream)
    fail(Err::Argument, std::string(call) + ": unknown or destroyed stream " + std::to_string(id));
  const StreamEntry& e = streams[size_t(id)];
  if (e.device != device)
    fail(Err::Device, std::string(call) + ": stream " + std::to_string(id) + " belongs to cuda:" + std::to_string(e.device) +
                          ", not cuda:" + std::to_string(device));
  return e.stream;
}

cudaStream_t currentStream(int device) { return streamById(currentStreamId(device), device, "currentStream"); }

int64_t createStream(int device, int priority) {
  useDevice(device);
  cudaStream_t s;
  check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority), "cudaStreamCreateWithPriority");
  std::lock_guard<std::mutex> lock(streamsMutex);
  streams.push_back({device, s});
  return int64_t(streams.size() - 1);
}

static int deviceOfStream(int64_t id, const char* call) {
  std::lock_guard<std::mutex> lock(streamsMutex);
  if (id <= 0 || size_t(id) >= streams.size() || !streams[size_t(id)].stream)
    fail(Err::Argument, std::string(call) + ": unknown or destroyed stream " + std::to_string(id));
  return streams[size_t(id)].device;
}

// ---- events ------------------------------------------------------------------------------------
struct EventEntry {
  int device;
  cudaEvent_t event;
};
static std::vector<EventEntry> events(1, EventEntry{-1, nullptr});
static std::vector<int64_t> freeEventIds;  // ids are reused: collectives create one event each

static EventEntry& eventById(int64_t id, const char* call) {
  if (id <= 0 || size_t(id) >= events.size() || !events[size_t(id)].event)
    fail(Err::Argument, std::string(call) + ": unknown or destroyed event " + std::to_string(id));
  return events[size_t(id)];
}

int64_t eventCreateId(int device, bool timing) {
  useDevice(device);
  cudaEvent_t ev;
  check(cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreateWithFlags");
  if (!freeEventIds.empty()) {
    int64_t id = freeEventIds.back();
    freeEventIds.pop_back();
    events[size_t(id)] = {device, ev};
    return id;
  }
  events.push_back({device, ev});
  return int64_t(events.size() - 1);
}

cudaEvent_t eventHandle(int64_t id, const char* call) { return eventById(id, call).event; }

// ---- pinned staging for transfers --------------------------------------------------------------
// Host<->device copies go through page-locked buffers so they are true DMA transfers. A buffer is
// reused once the event recorded after its copy has completed; large transfers go in chunks
// (native/cuda/staging.h holds the logic, shared with the test-only addon's simulated runtime).
static constexpr size_t kStagingChunkBytes = size_t(16) << 20;

struct CudaStagingRt {
  using Stream = cudaStream_t;
  using Event = cudaEvent_t;
  void* hostAlloc(size_t bytes) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    return p;
  }
  Event createEvent(int device) {
    useDevice(device);
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroyEvent(Event e) {
    if (cudaEventDestroy(e) != cudaSuccess) cudaGetLastError();
  }
  bool ready(Event e) {
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaErrorNotReady) return false;
    check(q, "cudaEventQuery");
    return true;
  }
  void wait(Event e) { check(cudaEventSynchronize(e), "cudaEventSynchronize"); }
  void record(Event e, Stream s) { check(cudaEventRecord(e, s), "cudaEventRecord"); }
  staging::EventState probe(Event e) {
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return staging::EventState::Ready;
    if (q == cudaErrorNotReady) return staging::EventState::Pending;
    cudaGetLastError();
    return staging::EventState::Broken;
  }
  void toDevice(void* dst, const void* src, size_t n, Stream s) {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
  }
  void toHost(void* dst, const void* src, size_t n, Stream s) {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  }
};
static CudaStagingRt stagingRt;
static staging::Pool<CudaStagingRt> stagingPool(stagingRt);

void resetStagingEvents(int device) { stagingPool.resetEvents(device); }

// ---- DeviceStorage -----------------------------------------------------------------------------
Napi::FunctionReference DeviceStorage::ctor;

void DeviceStorage::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function fn = DefineClass(env, "Storage",
                                  {InstanceMethod("dispose", &DeviceStorage::Dispose),
                                   InstanceAccessor("bytes", &DeviceStorage::Bytes, nullptr),
                                   InstanceAccessor("disposed", &DeviceStorage::Disposed, nullptr),
                                   InstanceAccessor("device", &DeviceStorage::Device, nullptr)});
  ctor = Napi::Persistent(fn);
  ctor.SuppressDestruct();
  exports.Set("Storage", fn);  // replaces the core's host Storage in this addon
}
NT_EXPORT_CLASS(DeviceStorage::Init);

// new Storage(bytes, zero, deviceIndex)
DeviceStorage::DeviceStorage(const Napi::CallbackInfo& info) : Napi::ObjectWrap<DeviceStorage>(info) {
  try {
    Args a{info, "Storage"};
    if (info.Length() > 0 && info[0].IsObject()) {
      // new Storage(parent, offsetBytes, bytes): an alias of a range of parent, on parent's device.
      a.count(3);
      DeviceStorage* parent = DeviceStorage::From(info[0], "Storage", 0);
      device_ = parent->device();
      aliasOf(*parent, size_t(a.size(1)), size_t(a.size(2)), "Storage");
      return;
    }
    int64_t bytes = a.size(0);
    bool zero = info.Length() > 1 && info[1].ToBoolean().Value();
    int64_t device = info.Length() > 2 && !info[2].IsUndefined() ? a.size(2) : 0;
    requireDevice(int(device), "Storage");
    device_ = int(device);
    useDevice(device_);
    bytes_ = size_t(bytes);
    empty_ = bytes_ == 0;
    data_ = static_cast<uint8_t*>(deviceAlloc(device_, bytes_, "Storage"));
    int dev = device_;
    // The deleter runs from whichever holder lets go last; a failed free cannot be reported there
    // (the allocator keeps its books consistent either way).
    block_ = std::shared_ptr<uint8_t>(data_, [dev](uint8_t* p) {
      if (!p) return;
      try { deviceFree(dev, p); } catch (...) {}
    });
    if (zero && data_) check(cudaMemsetAsync(data_, 0, bytes_, currentStream(device_)), "cudaMemsetAsync");
  } catch (const Error& e) {
    makeError(info.Env(), e.code, e.message, e.call.empty() ? "Storage" : e.call).ThrowAsJavaScriptException();
  }
}

DeviceStorage::~DeviceStorage() {
  try {
    release();
  } catch (const Error&) {
    // A destructor cannot report; the allocator keeps its books consistent either way.
  }
}

void DeviceStorage::release() { dropBytes(); }

Napi::Value DeviceStorage::Dispose(const Napi::CallbackInfo& info) {
  return guarded("dispose", [](const Napi::CallbackInfo& i) -> Napi::Value {
    Napi::ObjectWrap<DeviceStorage>::Unwrap(i.This().As<Napi::Object>())->release();
    return i.Env().Undefined();
  }, info);
}
Napi::Value DeviceStorage::Bytes(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(bytes_)); }
Napi::Value DeviceStorage::Disposed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), disposed()); }
Napi::Value DeviceStorage::Device(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), device_); }

// ---- KernelCall --------------------------------------------------------------------------------
uint8_t* KernelCall::bytesOf(size_t i, DType dtype, int64_t count, int64_t offset) {
  DeviceStorage* s = DeviceStorage::From(info_[i], call_, i);
  if (device_ < 0) device_ = s->device();
  else if (s->device() != device_)
    fail(Err::Device, std::string(call_) + ": argument " + std::to_string(i) + " lives on cuda:" +
                          std::to_string(s->device()) + ", earlier ones on cuda:" + std::to_string(device_));
  size_t esize = dtypeSize(dtype);
  s->checkRange(size_t(offset) * esize, size_t(count) * esize, call_);
  return s->data() + size_t(offset) * esize;
}

cudaStream_t KernelCall::stream() {
  streamUsed_ = true;
  useDevice(device());
  return currentStream(device());
}

void checkLaunch(const char* call) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail(Err::Native, std::string(call) + ": kernel launch failed: " + cudaGetErrorString(e), call);
}

void KernelCall::launched() { checkLaunch(call_); }

// ---- debug synchronization (NODETRON_CUDA_SYNC=1) ---------------------------------------------
// Kernels and cuBLASLt calls run asynchronously: a fault they cause (an illegal address, a trap)
// surfaces at some later call that has nothing to do with it. In this mode every registered call
// that used a device waits for that device's current stream before it returns, so the fault
// becomes a typed error under the op that queued it.
static std::string asyncFaultMessage(const char* call, int device, cudaError_t status) {
  return std::string(call) + ": asynchronous CUDA error on cuda:" + std::to_string(device) +
         " right after this call (NODETRON_CUDA_SYNC=1): " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) +
         "). This call, or work queued on its stream just before it, caused it; the CUDA context may now be unusable";
}

static void syncAfterCall(const char* call) {
  int d = touchedDevice;
  touchedDevice = -1;
  if (d < 0) return;
  cudaError_t e = cudaStreamSynchronize(currentStream(d));
  if (e != cudaSuccess) fail(Err::Native, asyncFaultMessage(call, d, e), call);
}

static const bool debugSync = [] {
  bool on = envFlag(std::getenv("NODETRON_CUDA_SYNC"));
  if (on) setAfterCallHook(syncAfterCall);
  return on;
}();

// debugSync() -> whether NODETRON_CUDA_SYNC turned the synchronization on when the addon loaded.
static Napi::Value DebugSync(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), debugSync); }
NT_EXPORT("debugSync", DebugSync);

// NODETRON_CUDA_VECTOR=0 (or false/no/off), read once at load: the row kernels (norms, softmax,
// cross-entropy) keep to scalar loads (kernels/common.cuh, rowVectorizable).
static const bool vectorRows = [] {
  const char* v = std::getenv("NODETRON_CUDA_VECTOR");
  if (!v) return true;
  std::string s(v);
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return !(s == "0" || s == "false" || s == "no" || s == "off");
}();
bool rowVectorLoads() { return vectorRows; }

// switches() -> { sync, epilogues, vector }: the environment switches as the addon read them when it
// loaded (NODETRON_CUDA_SYNC, NODETRON_CUDA_EPILOGUES, NODETRON_CUDA_VECTOR), for nt.info().
static Napi::Value Switches(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("sync", debugSync);
  o.Set("epilogues", gemmFusedEpilogues());
  o.Set("vector", vectorRows);
  return o;
}
NT_EXPORT("switches", Switches);

// ---- exported functions ------------------------------------------------------------------------
static int deviceArg(const Args& a, size_t i) {
  return a.info.Length() > i && !a.info[i].IsUndefined() ? int(a.size(i)) : 0;
}

// write(storage, offsetBytes, typedArray): host -> device, ordered on the current stream. Returns
// once the data sits in a staging buffer, so the caller may reuse its array at once. Refused while
// the device captures a CUDA graph (staging.h says why).
static Napi::Value Write(const Napi::CallbackInfo& info) {
  auto [s, off, src] = typedArrayRange<DeviceStorage>(info, "write");
  int64_t capture = capturingStream(s->device());
  useDevice(s->device());
  staging::hostToDevice(stagingRt, stagingPool, "write", s->device(), capture, currentStream(s->device()), s->data() + off, src.data,
                        src.bytes, kStagingChunkBytes);
  return info.Env().Undefined();
}
NT_EXPORT("write", Write);

// read(storage, offsetBytes, typedArray): device -> host; waits for the current stream. Refused
// while the device captures a CUDA graph.
static Napi::Value Read(const Napi::CallbackInfo& info) {
  auto [s, off, dst] = typedArrayRange<DeviceStorage>(info, "read");
  int64_t capture = capturingStream(s->device());
  useDevice(s->device());
  staging::deviceToHost(stagingRt, stagingPool, "read", s->device(), capture, currentStream(s->device()), dst.data, s->data() + off,
                        dst.bytes, kStagingChunkBytes);
  return info.Env().Undefined();
}
NT_EXPORT("read", Read);

// copy(dst, dstOffsetBytes, src, srcOffsetBytes, bytes): device -> device on the current stream.
NT_CUDA_KERNEL("copy", Copy) {
  // dst and src may live on different devices (a peer copy), so they are not read through k.data().
  size_t di = k.args.at("dst", "s"), si = k.args.at("src", "s");
  DeviceStorage* d = DeviceStorage::From(k.info()[di], call, di);
  DeviceStorage* s = DeviceStorage::From(k.info()[si], call, si);
  size_t doff = size_t(k.args.size("dstOffsetBytes")), soff = size_t(k.args.size("srcOffsetBytes")), bytes = size_t(k.args.size("bytes"));
  d->checkRange(doff, bytes, call);
  s->checkRange(soff, bytes, call);
  if (bytes == 0) return;
  useDevice(d->device());
  if (d->device() == s->device()) {
    check(cudaMemcpyAsync(d->data() + doff, s->data() + soff, bytes, cudaMemcpyDeviceToDevice, currentStream(d->device())),
          "cudaMemcpyAsync");
  } else {
    check(cudaMemcpyPeerAsync(d->data() + doff, d->device(), s->data() + soff, s->device(), bytes, currentStream(d->device())),
          "cudaMemcpyPeerAsync");
  }
}

static Napi::Value DeviceCount(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), deviceCount()); }
NT_EXPORT("deviceCount", DeviceCount);

static Napi::Value DriverStatus(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), driverStatus()); }
NT_EXPORT("driverStatus", DriverStatus);

// deviceInfo() -> [{ index, name, totalMemory, freeMemory, computeCapability, multiprocessors }]
static Napi::Value DeviceInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int n = deviceCount();
  Napi::Array out = Napi::Array::New(env, size_t(n));
  for (int d = 0; d < n; d++) {
    cudaDeviceProp p;
    check(cudaGetDeviceProperties(&p, d), "cudaGetDeviceProperties");
    useDevice(d);
    size_t freeBytes = 0, totalBytes = 0;
    check(cudaMemGetInfo(&freeBytes, &totalBytes), "cudaMemGetInfo");
    Napi::Object o = Napi::Object::New(env);
    o.Set("index", d);
    o.Set("name", std::string(p.name));
    o.Set("totalMemory", double(totalBytes));
    o.Set("freeMemory", double(freeBytes));
    o.Set("computeCapability", std::to_string(p.major) + "." + std::to_string(p.minor));
    o.Set("multiprocessors", p.multiProcessorCount);
    out.Set(uint32_t(d), o);
  }
  return out;
}
NT_EXPORT("deviceInfo", DeviceInfo);

// The caching allocator of the device at argument 0 (default 0), which must exist.
static alloc::CachingAllocator& allocatorArg(const Napi::CallbackInfo& info, const char* call) {
  Args a{info, call};
  int d = deviceArg(a, 0);
  requireDevice(d, call);
  return allocator(d);
}

static Napi::Value MemoryStats(const Napi::CallbackInfo& info) {
  return allocatorStatsObject(info.Env(), allocatorArg(info, "memoryStats").stats());
}
NT_EXPORT("memoryStats", MemoryStats);

static Napi::Value ResetPeakMemory(const Napi::CallbackInfo& info) {
  allocatorArg(info, "resetPeakMemory").resetPeak();
  return info.Env().Undefined();
}
NT_EXPORT("resetPeakMemory", ResetPeakMemory);

static Napi::Value EmptyCache(const Napi::CallbackInfo& info) {
  allocatorArg(info, "emptyCache").emptyCache();
  return info.Env().Undefined();
}
NT_EXPORT("emptyCache", EmptyCache);

// recordStream(storage, streamId): the storage is also used on that stream (see the allocator).
static Napi::Value RecordStream(const Napi::CallbackInfo& info) {
  Args a{info, "recordStream"};
  DeviceStorage* s = DeviceStorage::From(info[0], "recordStream", 0);
  int64_t id = a.size(1);
  streamById(id, s->device(), "recordStream");
  if (s->data()) allocator(s->device()).recordStream(s->data(), alloc::StreamId(id));
  return info.Env().Undefined();
}
NT_EXPORT("recordStream", RecordStream);

// ---- streams and events to JS ------------------------------------------------------------------
// streamCreate(device, priority) -> id
static Napi::Value StreamCreate(const Napi::CallbackInfo& info) {
  Args a{info, "streamCreate"};
  int d = int(a.size(0));
  requireDevice(d, "streamCreate");
  int priority = info.Length() > 1 ? int(a.int64(1)) : 0;
  return Napi::Number::New(info.Env(), double(createStream(d, priority)));
}
NT_EXPORT("streamCreate", StreamCreate);

static Napi::Value StreamDestroy(const Napi::CallbackInfo& info) {
  Args a{info, "streamDestroy"};
  int64_t id = a.size(0);
  int d = deviceOfStream(id, "streamDestroy");
  {
    std::lock_guard<std::mutex> lock(streamsMutex);
    for (int64_t& c : currentIds)
      if (c == id) fail(Err::Argument, "streamDestroy: stream " + std::to_string(id) + " is a device's current stream");
  }
  useDevice(d);
  // Synchronizing first means the stream has no work left: the allocator then needs no event for
  // blocks recorded on it, and releases its segments once they are free (ids are never reused).
  check(cudaStreamSynchronize(streams[size_t(id)].stream), "cudaStreamSynchronize");
  check(cudaStreamDestroy(streams[size_t(id)].stream), "cudaStreamDestroy");
  {
    std::lock_guard<std::mutex> lock(streamsMutex);
    streams[size_t(id)].stream = nullptr;
  }
  releaseGemmWorkspace(d, id);  // its cuBLASLt workspace (a graph's side stream: with the graph)
  allocator(d).streamDestroyed(alloc::StreamId(id));
  return info.Env().Undefined();
}
NT_EXPORT("streamDestroy", StreamDestroy);

// setCurrentStream(device, id): later ops on the device are queued on that stream.
static Napi::Value SetCurrentStream(const Napi::CallbackInfo& info) {
  Args a{info, "setCurrentStream"};
  int d = int(a.size(0));
  int64_t id = a.size(1);
  requireDevice(d, "setCurrentStream");
  streamById(id, d, "setCurrentStream");
  std::lock_guard<std::mutex> lock(streamsMutex);
  if (currentIds.size() <= size_t(d)) currentIds.resize(size_t(d) + 1, 0);
  currentIds[size_t(d)] = id;
  return info.Env().Undefined();
}
NT_EXPORT("setCurrentStream", SetCurrentStream);

static Napi::Value CurrentStream(const Napi::CallbackInfo& info) {
  Args a{info, "currentStream"};
  return Napi::Number::New(info.Env(), double(currentStreamId(int(a.size(0)))));
}
NT_EXPORT("currentStream", CurrentStream);

// streamSynchronize(device, id)
static Napi::Value StreamSynchronize(const Napi::CallbackInfo& info) {
  Args a{info, "streamSynchronize"};
  int d = int(a.size(0));
  requireDevice(d, "streamSynchronize");
  useDevice(d);
  check(cudaStreamSynchronize(streamById(a.size(1), d, "streamSynchronize")), "cudaStreamSynchronize");
  return info.Env().Undefined();
}
NT_EXPORT("streamSynchronize", StreamSynchronize);

// streamQuery(device, id) -> true when all its work has finished
static Napi::Value StreamQuery(const Napi::CallbackInfo& info) {
  Args a{info, "streamQuery"};
  int d = int(a.size(0));
  requireDevice(d, "streamQuery");
  cudaError_t e = cudaStreamQuery(streamById(a.size(1), d, "streamQuery"));
  if (e == cudaErrorNotReady) return Napi::Boolean::New(info.Env(), false);
  check(e, "cudaStreamQuery");
  return Napi::Boolean::New(info.Env(), true);
}
NT_EXPORT("streamQuery", StreamQuery);

static Napi::Value DeviceSynchronize(const Napi::CallbackInfo& info) {
  Args a{info, "synchronize"};
  int d = deviceArg(a, 0);
  requireDevice(d, "synchronize");
  useDevice(d);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return info.Env().Undefined();
}
NT_EXPORT("synchronize", DeviceSynchronize);

// eventCreate(device, timing) -> id
static Napi::Value EventCreate(const Napi::CallbackInfo& info) {
  Args a{info, "eventCreate"};
  int d = int(a.size(0));
  bool timing = info.Length() > 1 && a.boolean(1);
  requireDevice(d, "eventCreate");
  return Napi::Number::New(info.Env(), double(eventCreateId(d, timing)));
}
NT_EXPORT("eventCreate", EventCreate);

// eventRecord(event, streamId)
static Napi::Value EventRecord(const Napi::CallbackInfo& info) {
  Args a{info, "eventRecord"};
  EventEntry& e = eventById(a.size(0), "eventRecord");
  useDevice(e.device);
  check(cudaEventRecord(e.event, streamById(a.size(1), e.device, "eventRecord")), "cudaEventRecord");
  return info.Env().Undefined();
}
NT_EXPORT("eventRecord", EventRecord);

// streamWaitEvent(device, streamId, event): later work on the stream waits for the event (no host block).
static Napi::Value StreamWaitEvent(const Napi::CallbackInfo& info) {
  Args a{info, "streamWaitEvent"};
  int d = int(a.size(0));
  cudaStream_t s = streamById(a.size(1), d, "streamWaitEvent");
  EventEntry& e = eventById(a.size(2), "streamWaitEvent");
  useDevice(d);
  check(cudaStreamWaitEvent(s, e.event, 0), "cudaStreamWaitEvent");
  return info.Env().Undefined();
}
NT_EXPORT("streamWaitEvent", StreamWaitEvent);

static Napi::Value EventSynchronize(const Napi::CallbackInfo& info) {
  Args a{info, "eventSynchronize"};
  check(cudaEventSynchronize(eventById(a.size(0), "eventSynchronize").event), "cudaEventSynchronize");
  return info.Env().Undefined();
}
NT_EXPORT("eventSynchronize", EventSynchronize);

static Napi::Value EventQuery(const Napi::CallbackInfo& info) {
  Args a{info, "eventQuery"};
  cudaError_t e = cudaEventQuery(eventById(a.size(0), "eventQuery").event);
  if (e == cudaErrorNotReady) return Napi::Boolean::New(info.Env(), false);
  check(e, "cudaEventQuery");
  return Napi::Boolean::New(info.Env(), true);
}
NT_EXPORT("eventQuery", EventQuery);

// eventElapsedMs(start, end) -> milliseconds between two recorded timing events
static Napi::Value EventElapsedMs(const Napi::CallbackInfo& info) {
  Args a{info, "eventElapsedMs"};
  float ms = 0;
  check(cudaEventElapsedTime(&ms, eventById(a.size(0), "eventElapsedMs").event, eventById(a.size(1), "eventElapsedMs").event),
        "cudaEventElapsedTime");
  return Napi::Number::New(info.Env(), ms);
}
NT_EXPORT("eventElapsedMs", EventElapsedMs);

static Napi::Value EventDestroy(const Napi::CallbackInfo& info) {
  Args a{info, "eventDestroy"};
  EventEntry& e = eventById(a.size(0), "eventDestroy");
  check(cudaEventDestroy(e.event), "cudaEventDestroy");
  e.event = nullptr;
  freeEventIds.push_back(a.size(0));
  return info.Env().Undefined();
}
NT_EXPORT("eventDestroy", EventDestroy);

static Napi::Value Noop(const Napi::CallbackInfo& info) { return info.Env().Undefined(); }
NT_EXPORT("noop", Noop);

}  // namespace nt::cuda
