// CUDA graphs (nt.cuda.graph, lib/cuda/graph.ts): the work a JS function queues on a side stream is
// captured (cudaStreamBeginCapture in relaxed mode, so the caching allocator may still cudaMalloc),
// instantiated once and replayed with one cudaGraphLaunch.
//
// Memory. Allocations made on the capturing stream during a capture come from a pool of their own:
// the caching allocator's blocks are keyed by stream, and the capture's requests use a key far above
// any stream id (kPoolBase + n), so its blocks are handed out only to that capture (reuse inside the
// capture follows the captured stream order, as on a stream) and never to later eager work, and
// emptyCache or an out-of-memory retry does not release them while the graph lives (poolCreated). Frees
// during the capture of blocks outside the pool (tensors made before it, which the graph may read
// or write) are deferred until the graph is destroyed. Destroying the graph synchronizes its stream,
// performs those frees and retires the pool (its segments go back to the device once every block in
// them is free: tensors the capture made and the caller still holds keep theirs until disposed).
// The cuBLASLt workspace of the side stream is freed when lib/cuda/graph.ts destroys that stream
// right after the graph (streamDestroy).
//
// Host transfers. write and read are refused while the device captures (runtime.cc, staging.h):
// a captured write would copy from a staging buffer later writes reuse, a captured read cannot
// return values. After a discarded capture the device's staging events are made anew.
#include <mutex>
#include <vector>

#include "allocator.h"
#include "runtime.h"

namespace nt::cuda {

static constexpr int64_t kPoolBase = int64_t(1) << 62;

struct Capture {
  int64_t stream = -1;  // the capturing stream's id, -1 when no capture runs on the device
  int64_t pool = 0;
  std::vector<void*> deferred;  // frees of blocks outside the pool, made during the capture
};
struct GraphEntry {
  int device = -1;
  int64_t stream = 0, pool = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<void*> deferred;
};

static std::mutex graphsMutex;
static std::vector<Capture> captures;      // per device
static std::vector<GraphEntry> graphs(1);  // id 0 unused
static int64_t nextPool = kPoolBase;

static Capture& captureOf(int device) {
  if (size_t(device) >= captures.size()) captures.resize(size_t(device) + 1);
  return captures[size_t(device)];
}

int64_t allocationStream(int device, int64_t stream) {
  std::lock_guard<std::mutex> lock(graphsMutex);
  if (size_t(device) < captures.size() && captures[size_t(device)].stream == stream) return captures[size_t(device)].pool;
  return stream;
}

int64_t capturingStream(int device) {
  std::lock_guard<std::mutex> lock(graphsMutex);
  return size_t(device) < captures.size() ? captures[size_t(device)].stream : -1;
}

bool deferFreeDuringCapture(int device, void* p) {
  std::lock_guard<std::mutex> lock(graphsMutex);
  if (size_t(device) >= captures.size() || captures[size_t(device)].stream < 0) return false;
  Capture& c = captures[size_t(device)];
  if (int64_t(allocator(device).streamOf(p)) == c.pool) return false;
  c.deferred.push_back(p);
  return true;
}

// Frees `deferred` and retires `pool` (after the work that uses them has finished).
static void retire(int device, int64_t pool, std::vector<void*>& deferred) {
  for (void* p : deferred) allocator(device).free(p);
  deferred.clear();
  allocator(device).streamDestroyed(alloc::StreamId(pool));
}

// graphBegin(device, streamId) -> pool id: starts capturing the stream (not the default one).
static Napi::Value GraphBegin(const Napi::CallbackInfo& info) {
  Args a{info, "graphBegin"};
  int device = int(a.size(0));
  int64_t stream = a.int64(1);
  requireDevice(device, "graphBegin");
  if (stream == 0) fail(Err::Argument, "graphBegin: the default stream cannot be captured (nt.cuda.graph captures on a side stream)", "graphBegin");
  cudaStream_t s = streamById(stream, device, "graphBegin");
  int64_t pool;
  {
    std::lock_guard<std::mutex> lock(graphsMutex);
    Capture& c = captureOf(device);
    if (c.stream >= 0)
      fail(Err::Argument, "graphBegin: a capture is already running on cuda:" + std::to_string(device) + " (stream " + std::to_string(c.stream) + ")",
           "graphBegin");
    pool = nextPool++;
    c.stream = stream;
    c.pool = pool;
    c.deferred.clear();
  }
  // Its free blocks stay out of emptyCache's reach until the pool is retired (the replays use them).
  allocator(device).poolCreated(alloc::StreamId(pool));
  useDevice(device);
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> lock(graphsMutex);
    captureOf(device).stream = -1;
  }
  check(e, "cudaStreamBeginCapture");
  return Napi::Number::New(info.Env(), double(pool));
}
NT_EXPORT("graphBegin", GraphBegin);

// Ends the device's capture: the captured graph (null when capture failed), the capture's state moved out.
static cudaError_t endCapture(int device, cudaGraph_t* graph, Capture* ended, const char* call) {
  {
    std::lock_guard<std::mutex> lock(graphsMutex);
    Capture& c = captureOf(device);
    if (c.stream < 0) fail(Err::Argument, std::string(call) + ": no capture is running on cuda:" + std::to_string(device), call);
    *ended = std::move(c);
    c = Capture{};
  }
  useDevice(device);
  *graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(streamById(ended->stream, device, call), graph);
  if (e != cudaSuccess) cudaGetLastError();  // a failed capture leaves a sticky-free error: clear it for later calls
  return e;
}

// graphEnd(device) -> graph id: ends the capture and instantiates its graph. A capture that an
// unsupported call invalidated fails here (typed, naming cudaStreamEndCapture) and leaves no graph.
static Napi::Value GraphEnd(const Napi::CallbackInfo& info) {
  Args a{info, "graphEnd"};
  int device = int(a.size(0));
  Capture ended;
  cudaGraph_t graph = nullptr;
  cudaError_t e = endCapture(device, &graph, &ended, "graphEnd");
  cudaGraphExec_t exec = nullptr;
  const char* failed = "cudaStreamEndCapture";
  if (e == cudaSuccess) {
    e = cudaGraphInstantiate(&exec, graph, 0);
    failed = "cudaGraphInstantiate";
    if (e != cudaSuccess) cudaGetLastError();
  }
  if (e != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaStreamSynchronize(streamById(ended.stream, device, "graphEnd"));
    cudaGetLastError();
    retire(device, ended.pool, ended.deferred);
    resetStagingEvents(device);
    check(e, failed);
  }
  std::lock_guard<std::mutex> lock(graphsMutex);
  graphs.push_back(GraphEntry{device, ended.stream, ended.pool, graph, exec, std::move(ended.deferred)});
  return Napi::Number::New(info.Env(), double(graphs.size() - 1));
}
NT_EXPORT("graphEnd", GraphEnd);

// graphAbort(device): ends a running capture and discards it (after a JS error inside the captured
// function); nothing when no capture runs.
static Napi::Value GraphAbort(const Napi::CallbackInfo& info) {
  Args a{info, "graphAbort"};
  int device = int(a.size(0));
  {
    std::lock_guard<std::mutex> lock(graphsMutex);
    if (size_t(device) >= captures.size() || captures[size_t(device)].stream < 0) return info.Env().Undefined();
  }
  Capture ended;
  cudaGraph_t graph = nullptr;
  endCapture(device, &graph, &ended, "graphAbort");
  if (graph) cudaGraphDestroy(graph);
  cudaStreamSynchronize(streamById(ended.stream, device, "graphAbort"));
  cudaGetLastError();
  retire(device, ended.pool, ended.deferred);
  // Host transfers are refused during a capture (staging.h); should a staging event have been
  // recorded into it all the same, it could not be queried again: the device's are made anew.
  resetStagingEvents(device);
  return info.Env().Undefined();
}
NT_EXPORT("graphAbort", GraphAbort);

static GraphEntry& graphById(int64_t id, const char* call) {
  if (id <= 0 || size_t(id) >= graphs.size() || !graphs[size_t(id)].exec)
    fail(Err::Argument, std::string(call) + ": graph " + std::to_string(id) + " does not exist or was destroyed", call);
  return graphs[size_t(id)];
}

// graphLaunch(id): replays the graph on the stream it was captured on.
static Napi::Value GraphLaunch(const Napi::CallbackInfo& info) {
  Args a{info, "graphLaunch"};
  int64_t id = a.int64(0);
  cudaGraphExec_t exec;
  int device;
  int64_t stream;
  {
    std::lock_guard<std::mutex> lock(graphsMutex);
    GraphEntry& g = graphById(id, "graphLaunch");
    exec = g.exec;
    device = g.device;
    stream = g.stream;
  }
  useDevice(device);
  check(cudaGraphLaunch(exec, streamById(stream, device, "graphLaunch")), "cudaGraphLaunch");
  return info.Env().Undefined();
}
NT_EXPORT("graphLaunch", GraphLaunch);

// graphDestroy(id): waits for its replays, frees what the capture deferred, retires its pool.
static Napi::Value GraphDestroy(const Napi::CallbackInfo& info) {
  Args a{info, "graphDestroy"};
  int64_t id = a.int64(0);
  GraphEntry g;
  {
    std::lock_guard<std::mutex> lock(graphsMutex);
    g = std::move(graphById(id, "graphDestroy"));
    graphs[size_t(id)] = GraphEntry{};
  }
  useDevice(g.device);
  cudaError_t e = cudaStreamSynchronize(streamById(g.stream, g.device, "graphDestroy"));
  cudaGraphExecDestroy(g.exec);
  cudaGraphDestroy(g.graph);
  retire(g.device, g.pool, g.deferred);
  check(e, "cudaStreamSynchronize");
  return info.Env().Undefined();
}
NT_EXPORT("graphDestroy", GraphDestroy);

// graphCapturing(device) -> whether a capture runs on the device.
static Napi::Value GraphCapturing(const Napi::CallbackInfo& info) {
  Args a{info, "graphCapturing"};
  int device = int(a.size(0));
  std::lock_guard<std::mutex> lock(graphsMutex);
  return Napi::Boolean::New(info.Env(), size_t(device) < captures.size() && captures[size_t(device)].stream >= 0);
}
NT_EXPORT("graphCapturing", GraphCapturing);

}  // namespace nt::cuda
