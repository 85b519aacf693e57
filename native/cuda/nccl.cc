// NCCL communicators for the cuda backend: unique ids, communicator setup, collectives and point-to-
// point on a dedicated communication stream, group calls, and error/timeout polling. Policy (which
// group, when to wait, how long) lives in lib/distributed; this file only does the mechanics.
//
// JS surface (element offsets and counts; dtype codes as elsewhere; op: the codes of
// lib/distributed/collectives.ts REDUCE_OP_CODES, 0 sum, 1 avg, 2 max, 3 min, 4 prod):
//   ncclUniqueId() -> Uint8Array(128)                      bytes to share through the store
//   new NcclComm(idBytes, rank, size, device)              non-blocking init; poll asyncError()
//   comm.allReduce(send, sendOff, recv, recvOff, count, dtype, op)         -> eventId | 0
//   comm.broadcast(send, sendOff, recv, recvOff, count, dtype, root)       -> eventId | 0
//   comm.reduce(send, sendOff, recv, recvOff, count, dtype, op, root)      -> eventId | 0
//   comm.allGather(send, sendOff, recv, recvOff, sendCount, dtype)         -> eventId | 0
//   comm.reduceScatter(send, sendOff, recv, recvOff, recvCount, dtype, op) -> eventId | 0
//   comm.allToAll(send, sendOff, recv, recvOff, countPerRank, dtype)       -> eventId | 0
//   comm.send(buf, off, count, dtype, peer) / comm.recv(buf, off, count, dtype, peer) -> eventId | 0
//   comm.groupStart(); ...; comm.groupEnd() -> eventId      (inside a group the calls return 0)
//   comm.asyncError() -> 'ok' | 'inProgress' | message;  comm.query(eventId) -> boolean (throws CommError)
//   comm.recordCompletion() -> eventId   after a call returned PENDING (-1), once asyncError() left 'inProgress'
//   comm.synchronize(eventId, timeoutMs)   host wait; on timeout aborts the communicator, TimeoutError
//   comm.abort(); comm.destroy(); comm.rank; comm.size; comm.device; comm.stream (its stream id)
// Each call makes the communication stream wait for the device's current stream (inputs are ready),
// and returns an event recorded after the operation: `streamWaitEvent(device, currentStream, id)`
// makes compute wait without blocking the host; the caller destroys the event (eventDestroy).
// Communicators are non-blocking: when NCCL answers ncclInProgress the kernel may not be enqueued
// yet (first collectives, a first send/recv to a peer), so an event recorded now could complete
// before the operation. Such a call returns PENDING (-1) and records nothing; the caller polls
// asyncError() until it leaves 'inProgress' (NCCL allows no other call on the communicator
// meanwhile) and then takes the completion event from recordCompletion(). The polling, with the
// op's timeout and the error naming rank, op and sequence number, is policy: lib/distributed/nccl-backend.ts.
#include <nccl.h>

#include <chrono>
#include <thread>

#include "runtime.h"

namespace nt::cuda {

static ncclDataType_t ncclType(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::U8: return ncclUint8;
  }
  return ncclFloat32;
}

static ncclRedOp_t ncclOp(int64_t op, const char* call) {
  switch (op) {
    case 0: return ncclSum;
    case 1: return ncclAvg;  // integers: NCCL sums, then divides (truncating), as the Gloo path does
    case 2: return ncclMax;
    case 3: return ncclMin;
    case 4: return ncclProd;
  }
  fail(Err::Argument, std::string(call) + ": unknown reduction op " + std::to_string(op) + " (0 sum, 1 avg, 2 max, 3 min, 4 prod)");
}

static void checkNccl(ncclResult_t r, const char* call, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string detail = comm ? ncclGetLastError(comm) : "";
  fail(Err::Comm, std::string(call) + ": " + ncclGetErrorString(r) + (detail.empty() ? "" : " (" + detail + ")"), call);
}

static Napi::Value UniqueId(const Napi::CallbackInfo& info) {
  ncclUniqueId id;
  checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  Napi::Uint8Array out = Napi::Uint8Array::New(info.Env(), sizeof(id.internal));
  std::memcpy(out.Data(), id.internal, sizeof(id.internal));
  return out;
}
NT_EXPORT("ncclUniqueId", UniqueId);

static Napi::Value NcclVersion(const Napi::CallbackInfo& info) {
  int v = 0;
  checkNccl(ncclGetVersion(&v), "ncclGetVersion");
  return Napi::Number::New(info.Env(), v);
}
NT_EXPORT("ncclVersion", NcclVersion);

class NcclComm : public Napi::ObjectWrap<NcclComm> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function fn = DefineClass(
        env, "NcclComm",
        {InstanceMethod("allReduce", &NcclComm::AllReduce), InstanceMethod("broadcast", &NcclComm::Broadcast),
         InstanceMethod("reduce", &NcclComm::Reduce), InstanceMethod("allGather", &NcclComm::AllGather),
         InstanceMethod("reduceScatter", &NcclComm::ReduceScatter), InstanceMethod("allToAll", &NcclComm::AllToAll),
         InstanceMethod("send", &NcclComm::Send), InstanceMethod("recv", &NcclComm::Recv),
         InstanceMethod("groupStart", &NcclComm::GroupStart), InstanceMethod("groupEnd", &NcclComm::GroupEnd),
         InstanceMethod("asyncError", &NcclComm::AsyncError), InstanceMethod("query", &NcclComm::Query),
         InstanceMethod("recordCompletion", &NcclComm::RecordCompletion),
         InstanceMethod("synchronize", &NcclComm::Synchronize), InstanceMethod("abort", &NcclComm::Abort),
         InstanceMethod("destroy", &NcclComm::Destroy), InstanceAccessor("rank", &NcclComm::Rank, nullptr),
         InstanceAccessor("size", &NcclComm::Size, nullptr), InstanceAccessor("device", &NcclComm::Device, nullptr),
         InstanceAccessor("stream", &NcclComm::Stream, nullptr)});
    exports.Set("NcclComm", fn);
  }

  // new NcclComm(idBytes, rank, size, device)
  explicit NcclComm(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NcclComm>(info) {
    try {
      Args a{info, "NcclComm"};
      a.count(4);
      RawBytes id = typedArrayBytes(info[0], "NcclComm", 0);
      if (id.bytes != sizeof(ncclUniqueId)) fail(Err::Argument, "NcclComm: the id must be " + std::to_string(sizeof(ncclUniqueId)) + " bytes");
      rank_ = int(a.size(1));
      size_ = int(a.size(2));
      device_ = int(a.size(3));
      if (size_ < 1 || rank_ >= size_) fail(Err::Argument, "NcclComm: rank " + std::to_string(rank_) + " outside a group of " + std::to_string(size_));
      requireDevice(device_, "NcclComm");
      useDevice(device_);
      ncclUniqueId uid;
      std::memcpy(uid.internal, id.data, sizeof(uid.internal));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // init and calls return at once; asyncError() reports progress
      checkNccl(ncclCommInitRankConfig(&comm_, size_, uid, rank_, &config), "ncclCommInitRankConfig");
      streamId_ = createStream(device_, -1);
      stream_ = streamById(streamId_, device_, "NcclComm");
    } catch (const Error& e) {
      makeError(info.Env(), e.code, e.message, e.call.empty() ? "NcclComm" : e.call).ThrowAsJavaScriptException();
    }
  }
  ~NcclComm() override {
    if (comm_) ncclCommAbort(comm_);  // not destroyed by the user: abort rather than wait on peers
  }

 private:
  ncclComm_t live(const char* call) {
    if (!comm_) fail(Err::Comm, std::string(call) + ": the communicator was destroyed or aborted");
    return comm_;
  }

  // Storage argument i at element offset `off` holding `count` elements, recorded as used on the
  // communication stream so the allocator does not reuse it before the operation has finished.
  void* buffer(const Napi::CallbackInfo& info, size_t i, int64_t off, int64_t count, DType dt, const char* call) {
    DeviceStorage* s = DeviceStorage::From(info[i], call, i);
    if (s->device() != device_)
      fail(Err::Device, std::string(call) + ": buffer on cuda:" + std::to_string(s->device()) + ", communicator on cuda:" + std::to_string(device_));
    size_t es = dtypeSize(dt);
    s->checkRange(size_t(off) * es, size_t(count) * es, call);
    if (s->data()) allocator(device_).recordStream(s->data(), alloc::StreamId(streamId_));
    return s->data() + size_t(off) * es;
  }

  // Orders the communication stream after the work queued so far on the compute stream.
  void before(const char* call) {
    useDevice(device_);
    cudaEvent_t ready = eventHandle(readyEvent(), call);
    check(cudaEventRecord(ready, currentStream(device_)), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
  }
  int64_t readyEvent() {
    if (!readyEventId_) readyEventId_ = eventCreateId(device_, false);
    return readyEventId_;
  }
  // What a call that NCCL accepted with `r` returns: 0 inside a group (groupEnd answers for it),
  // PENDING while NCCL is still enqueueing it, else the event that completes with the operation.
  static constexpr int64_t PENDING = -1;
  Napi::Value after(const Napi::CallbackInfo& info, ncclResult_t r) {
    if (groupDepth_ > 0) return Napi::Number::New(info.Env(), 0);
    if (r == ncclInProgress) return Napi::Number::New(info.Env(), double(PENDING));
    return Napi::Number::New(info.Env(), double(recordEvent("collective")));
  }
  int64_t recordEvent(const char* call) {
    int64_t id = eventCreateId(device_, false);
    check(cudaEventRecord(eventHandle(id, call), stream_), "cudaEventRecord");
    return id;
  }

  template <typename F>
  Napi::Value run(const Napi::CallbackInfo& info, const char* call, F f) {
    try {
      Args a{info, call};
      return f(a);
    } catch (const Error& e) {
      makeError(info.Env(), e.code, e.message, e.call.empty() ? call : e.call).ThrowAsJavaScriptException();
      return info.Env().Undefined();
    }
  }

  // A collective's binding, (send, sendOff, recv, recvOff, count, dtype, ...extra): the buffers hold
  // count * sendBlocks and count * recvBlocks elements; `nccl` enqueues it on the communication stream.
  template <typename F>
  Napi::Value collective(const Napi::CallbackInfo& info, const char* call, size_t argc, int64_t sendBlocks, int64_t recvBlocks,
                         F nccl) {
    return run(info, call, [&](const Args& a) {
      a.count(argc);
      DType dt = a.dtype(5);
      int64_t n = a.size(4);
      void* s = buffer(info, 0, a.size(1), n * sendBlocks, dt, call);
      void* r = buffer(info, 2, a.size(3), n * recvBlocks, dt, call);
      before(call);
      ncclResult_t res = nccl(a, s, r, size_t(n), ncclType(dt), live(call));
      checkNccl(res, call, comm_);
      return after(info, res);
    });
  }

  Napi::Value AllReduce(const Napi::CallbackInfo& info) {
    return collective(info, "allReduce", 7, 1, 1, [&](const Args& a, void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c) {
      return ncclAllReduce(s, r, n, t, ncclOp(a.int64(6), "allReduce"), c, stream_);
    });
  }
  Napi::Value Broadcast(const Napi::CallbackInfo& info) {
    return collective(info, "broadcast", 7, 1, 1, [&](const Args& a, void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c) {
      return ncclBroadcast(s, r, n, t, int(a.size(6)), c, stream_);
    });
  }
  Napi::Value Reduce(const Napi::CallbackInfo& info) {
    return collective(info, "reduce", 8, 1, 1, [&](const Args& a, void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c) {
      return ncclReduce(s, r, n, t, ncclOp(a.int64(6), "reduce"), int(a.size(7)), c, stream_);
    });
  }
  // count is what each rank contributes; recv holds size blocks of it.
  Napi::Value AllGather(const Napi::CallbackInfo& info) {
    return collective(info, "allGather", 6, 1, size_, [&](const Args&, void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c) {
      return ncclAllGather(s, r, n, t, c, stream_);
    });
  }
  // count is what each rank receives; send holds size blocks of it.
  Napi::Value ReduceScatter(const Napi::CallbackInfo& info) {
    return collective(info, "reduceScatter", 7, size_, 1, [&](const Args& a, void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c) {
      return ncclReduceScatter(s, r, n, t, ncclOp(a.int64(6), "reduceScatter"), c, stream_);
    });
  }
  // Block r of send goes to rank r; block r of recv comes from rank r (one send/recv group).
  Napi::Value AllToAll(const Napi::CallbackInfo& info) {
    return collective(info, "allToAll", 6, size_, size_, [&](const Args& a, void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c) {
      const size_t blockBytes = n * dtypeSize(a.dtype(5));
      checkNccl(ncclGroupStart(), "ncclGroupStart");
      for (int peer = 0; peer < size_; peer++) {
        ncclResult_t rs = ncclSend(static_cast<uint8_t*>(s) + peer * blockBytes, n, t, peer, c, stream_);
        ncclResult_t rr = ncclRecv(static_cast<uint8_t*>(r) + peer * blockBytes, n, t, peer, c, stream_);
        if ((rs != ncclSuccess && rs != ncclInProgress) || (rr != ncclSuccess && rr != ncclInProgress)) {
          ncclGroupEnd();
          return rs != ncclSuccess && rs != ncclInProgress ? rs : rr;
        }
      }
      return ncclGroupEnd();
    });
  }
  // send(buf, off, count, dtype, peer) / recv(...): one side of a point-to-point transfer.
  Napi::Value pointToPoint(const Napi::CallbackInfo& info, bool isSend) {
    const char* call = isSend ? "send" : "recv";
    return run(info, call, [&](const Args& a) {
      a.count(5);
      DType dt = a.dtype(3);
      int64_t n = a.size(2);
      void* b = buffer(info, 0, a.size(1), n, dt, call);
      before(call);
      ncclComm_t c = live(call);
      int peer = int(a.size(4));
      ncclResult_t res = isSend ? ncclSend(b, size_t(n), ncclType(dt), peer, c, stream_) : ncclRecv(b, size_t(n), ncclType(dt), peer, c, stream_);
      checkNccl(res, call, comm_);
      return after(info, res);
    });
  }
  Napi::Value Send(const Napi::CallbackInfo& info) { return pointToPoint(info, true); }
  Napi::Value Recv(const Napi::CallbackInfo& info) { return pointToPoint(info, false); }
  Napi::Value GroupStart(const Napi::CallbackInfo& info) {
    return run(info, "groupStart", [&](const Args&) {
      live("groupStart");
      checkNccl(ncclGroupStart(), "ncclGroupStart");
      groupDepth_++;
      return info.Env().Undefined();
    });
  }
  Napi::Value GroupEnd(const Napi::CallbackInfo& info) {
    return run(info, "groupEnd", [&](const Args&) {
      if (groupDepth_ == 0) fail(Err::Argument, "groupEnd: no group was started");
      groupDepth_--;
      ncclResult_t res = ncclGroupEnd();
      checkNccl(res, "ncclGroupEnd", comm_);
      return after(info, res);
    });
  }
  // recordCompletion(): the completion event of the call that returned PENDING; valid only once
  // asyncError() has left 'inProgress' (the operation is then enqueued on the stream).
  Napi::Value RecordCompletion(const Napi::CallbackInfo& info) {
    return run(info, "recordCompletion", [&](const Args&) {
      ncclResult_t state;
      checkNccl(ncclCommGetAsyncError(live("recordCompletion"), &state), "ncclCommGetAsyncError");
      if (state == ncclInProgress) fail(Err::Comm, "recordCompletion: NCCL is still enqueueing the previous call; poll asyncError() until it leaves 'inProgress'");
      if (state != ncclSuccess) fail(Err::Comm, std::string("recordCompletion: ") + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) + ")");
      useDevice(device_);
      return Napi::Number::New(info.Env(), double(recordEvent("recordCompletion")));
    });
  }
  Napi::Value AsyncError(const Napi::CallbackInfo& info) {
    return run(info, "asyncError", [&](const Args&) {
      ncclResult_t state;
      checkNccl(ncclCommGetAsyncError(live("asyncError"), &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return Napi::String::New(info.Env(), "ok");
      if (state == ncclInProgress) return Napi::String::New(info.Env(), "inProgress");
      return Napi::String::New(info.Env(), std::string(ncclGetErrorString(state)) + " (" + ncclGetLastError(comm_) + ")");
    });
  }
  void throwIfFailed(const char* call) {
    ncclResult_t state;
    checkNccl(ncclCommGetAsyncError(live(call), &state), "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress)
      fail(Err::Comm, std::string(call) + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) + ")");
  }
  // query(eventId) -> whether the operation has finished; throws CommError on an asynchronous failure.
  Napi::Value Query(const Napi::CallbackInfo& info) {
    return run(info, "query", [&](const Args& a) {
      cudaError_t e = cudaEventQuery(eventHandle(a.size(0), "query"));
      if (e == cudaErrorNotReady) {
        throwIfFailed("query");
        return Napi::Boolean::New(info.Env(), false);
      }
      check(e, "cudaEventQuery");
      return Napi::Boolean::New(info.Env(), true);
    });
  }
  // synchronize(eventId, timeoutMs): waits on the host, polling NCCL's error state; on timeout the
  // communicator is aborted (peers then fail too instead of hanging) and TimeoutError is thrown.
  Napi::Value Synchronize(const Napi::CallbackInfo& info) {
    return run(info, "synchronize", [&](const Args& a) {
      cudaEvent_t ev = eventHandle(a.size(0), "synchronize");
      double timeoutMs = a.number(1);
      auto start = std::chrono::steady_clock::now();
      for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return info.Env().Undefined();
        if (e != cudaErrorNotReady) check(e, "cudaEventQuery");
        throwIfFailed("synchronize");
        double waited = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (waited > timeoutMs) {
          ncclCommAbort(comm_);
          comm_ = nullptr;
          fail(Err::Timeout, "synchronize: NCCL operation on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                 " did not finish within " + std::to_string(int64_t(timeoutMs)) + " ms; the communicator was aborted");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  Napi::Value Abort(const Napi::CallbackInfo& info) {
    return run(info, "abort", [&](const Args&) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      return info.Env().Undefined();
    });
  }
  // destroy(): waits for pending operations (ncclCommFinalize), then frees the communicator.
  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    return run(info, "destroy", [&](const Args&) {
      if (!comm_) return info.Env().Undefined();
      useDevice(device_);
      checkNccl(ncclCommFinalize(comm_), "ncclCommFinalize", comm_);
      ncclResult_t state = ncclInProgress;
      while (state == ncclInProgress) checkNccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      checkNccl(state, "ncclCommFinalize", comm_);
      checkNccl(ncclCommDestroy(comm_), "ncclCommDestroy");
      comm_ = nullptr;
      return info.Env().Undefined();
    });
  }
  Napi::Value Rank(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), rank_); }
  Napi::Value Size(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), size_); }
  Napi::Value Device(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), device_); }
  Napi::Value Stream(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(streamId_)); }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  int64_t streamId_ = 0;
  cudaStream_t stream_ = nullptr;
  int64_t readyEventId_ = 0;
  int groupDepth_ = 0;
};

NT_EXPORT_CLASS(NcclComm::Init);

}  // namespace nt::cuda
