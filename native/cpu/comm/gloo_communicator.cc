// GlooCommunicator: the JS object behind a cpu process group. Validates what memory safety needs,
// keeps the storages alive while an op is in flight, queues the op on the communicator's thread and
// returns a Promise carrying a waitSync() that blocks the JS thread until the op is done. Native
// method signatures are listed in lib/distributed/backend.ts.
#include <gloo/transport/unbound_buffer.h>

#include <cmath>
#include <numeric>

#include "collectives.h"
#include "shm.h"

namespace nt::comm {

namespace {

class GlooCommunicator : public Napi::ObjectWrap<GlooCommunicator> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function fn = DefineClass(env, "GlooCommunicator",
                                    {method<&GlooCommunicator::Connect>("connect"),
                                     method<&GlooCommunicator::AllReduce>("allReduce"),
                                     method<&GlooCommunicator::Broadcast>("broadcast"),
                                     method<&GlooCommunicator::Reduce>("reduce"),
                                     method<&GlooCommunicator::AllGather>("allGather"),
                                     method<&GlooCommunicator::ReduceScatter>("reduceScatter"),
                                     method<&GlooCommunicator::AllToAll>("allToAll"),
                                     method<&GlooCommunicator::Barrier>("barrier"),
                                     method<&GlooCommunicator::Send>("send"),
                                     method<&GlooCommunicator::Recv>("recv"),
                                     method<&GlooCommunicator::Destroy>("destroy"),
                                     method<&GlooCommunicator::Abort>("abort"),
                                     InstanceAccessor("rank", &GlooCommunicator::Rank, nullptr),
                                     InstanceAccessor("size", &GlooCommunicator::Size, nullptr),
                                     InstanceAccessor("pending", &GlooCommunicator::Pending, nullptr),
                                     InstanceAccessor("sharedMemory", &GlooCommunicator::SharedMemory, nullptr)});
    static Napi::FunctionReference ctor;
    ctor = Napi::Persistent(fn);
    ctor.SuppressDestruct();
    exports.Set("GlooCommunicator", fn);
  }

  // new GlooCommunicator(storeHost, storePort, group, rank, size, timeoutMs, deviceHost, deviceIface, verifySizes,
  //                      sharedMemory, storeOp | null)   storeOp: see js_store.h; null = the TCP store
  explicit GlooCommunicator(const Napi::CallbackInfo& info) : Napi::ObjectWrap<GlooCommunicator>(info) {
    try {
      Args a{info, "GlooCommunicator"};
      a.count(11);
      state_ = std::make_shared<CommState>();
      state_->storeHost = a.string(0);
      state_->storePort = static_cast<int>(a.size(1));
      state_->group = a.string(2);
      state_->rank = static_cast<int>(a.size(3));
      state_->size = static_cast<int>(a.size(4));
      state_->timeout = std::chrono::milliseconds(a.size(5));
      state_->deviceHost = a.string(6);
      state_->deviceIface = a.string(7);
      state_->verifySizes = a.boolean(8);
      state_->sharedMemory = a.boolean(9);
      if (state_->size < 1 || state_->rank >= state_->size)
        fail(Err::Argument, "GlooCommunicator: rank " + std::to_string(state_->rank) + " is outside a group of size " +
                                std::to_string(state_->size));
      if (state_->storePort < 1 || state_->storePort > 65535)
        fail(Err::Argument, "GlooCommunicator: store port " + std::to_string(state_->storePort) + " is out of range");
      if (state_->timeout.count() < 1) fail(Err::Argument, "GlooCommunicator: timeoutMs must be at least 1");
      Napi::Env env = info.Env();
      if (info[10].IsFunction()) {
        state_->storeOp = Napi::ThreadSafeFunction::New(env, info[10].As<Napi::Function>(), "nodetron-gloo-store", 0, 1);
        state_->storeOp->Unref(env);  // connect's own work keeps the event loop alive while it runs
      } else if (!info[10].IsNull() && !info[10].IsUndefined()) {
        fail(Err::Argument, "GlooCommunicator: storeOp must be a function or null");
      }
      auto* queues = new QueueSet();
      tsfn_ = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}),
                                            "nodetron-gloo", 0, 1, queues, &QueueSet::finalize, queues);
      collectives_ = WorkQueue::start(state_, tsfn_);
      pointToPoint_ = WorkQueue::start(state_, tsfn_);
      queues->queues = {collectives_, pointToPoint_};
      state_->queues = {collectives_, pointToPoint_};
      tsfn_.Release();  // the queue threads hold it from here on
      tsfn_.Unref(env);
      registerCommunicator(state_);  // for abortCommunicators and the abort-file watcher (abort.h)
    } catch (const Error& e) {
      makeError(info.Env(), e.code, e.message, e.call.empty() ? "GlooCommunicator" : e.call).ThrowAsJavaScriptException();
    }
  }

  ~GlooCommunicator() override { shutdown(); }

 private:
  void shutdown() {
    // A JS store that connect never took over is released here, on the JS thread.
    if (state_ && !connectRequested_ && state_->storeOp) {
      state_->storeOp->Release();
      state_->storeOp.reset();
    }
    if (collectives_) collectives_->stop();
    if (pointToPoint_) pointToPoint_->stop();
    collectives_.reset();
    pointToPoint_.reset();
  }

  // A JS method named `name` running `body`: nt::Error thrown while validating
  // becomes a typed JS exception naming the call. The name rides along as the method's data.
  using Body = Napi::Value (GlooCommunicator::*)(const Napi::CallbackInfo&);
  template <Body body>
  static Napi::ClassPropertyDescriptor<GlooCommunicator> method(const char* name) {
    return InstanceMethod(name, &GlooCommunicator::guarded<body>, napi_default, const_cast<char*>(name));
  }
  template <Body body>
  Napi::Value guarded(const Napi::CallbackInfo& info) {
    const char* name = static_cast<const char*>(info.Data());
    try {
      return (this->*body)(info);
    } catch (const Error& e) {
      makeError(info.Env(), e.code, e.message, e.call.empty() ? name : e.call).ThrowAsJavaScriptException();
    } catch (const std::exception& e) {
      makeError(info.Env(), Err::Comm, std::string(name) + ": " + e.what(), name).ThrowAsJavaScriptException();
    }
    return info.Env().Undefined();
  }

  void checkUsable(const char* call, bool needsConnection = true) {
    if (!collectives_) fail(Err::Comm, std::string(call) + ": the communicator of group '" + state_->group + "' was destroyed");
    if (needsConnection && !connected_)
      fail(Err::Comm, std::string(call) + ": the communicator of group '" + state_->group + "' is not connected");
  }

  // A live storage holding `count` elements of `dt` at argument i, pinned by the Work.
  uint8_t* buffer(const Napi::CallbackInfo& info, size_t i, const char* call, DType dt, size_t count, Work& w) {
    Storage* s = Storage::From(info[i], call, i);
    s->checkRange(0, count * dtypeSize(dt), call);
    w.keepAlive.push_back(Napi::Persistent(info[i].As<Napi::Object>()));
    return s->data();
  }

  std::vector<size_t> counts(const Napi::Value& v, const char* call, const char* what, size_t expected) {
    if (!v.IsArray()) fail(Err::Argument, std::string(call) + ": " + what + " must be an array of element counts");
    Napi::Array arr = v.As<Napi::Array>();
    if (arr.Length() != expected)
      fail(Err::Argument, std::string(call) + ": " + what + " has " + std::to_string(arr.Length()) +
                              " entries, expected one per rank (" + std::to_string(expected) + ")");
    std::vector<size_t> out(expected);
    for (uint32_t i = 0; i < arr.Length(); i++) {
      Napi::Value e = arr.Get(i);
      double d = e.IsNumber() ? e.As<Napi::Number>().DoubleValue() : -1;
      if (!(d >= 0) || d != std::floor(d) || d > 9007199254740991.0)
        fail(Err::Argument, std::string(call) + ": " + what + "[" + std::to_string(i) + "] must be a non-negative integer");
      out[i] = static_cast<size_t>(d);
    }
    return out;
  }

  int rankArg(const Args& a, size_t i, const char* what) {
    int64_t r = a.int64(i);
    if (r < 0 || r >= state_->size)
      fail(Err::Argument, std::string(a.call) + ": " + what + " " + std::to_string(r) + " is outside a group of size " +
                              std::to_string(state_->size));
    return static_cast<int>(r);
  }

  std::unique_ptr<Work> newWork(const Napi::CallbackInfo& info, const char* op, int64_t seq) {
    auto w = std::make_unique<Work>();
    w->op = op;
    w->seq = seq;
    w->settlement->deferred.emplace(Napi::Promise::Deferred::New(info.Env()));
    w->keepAlive.push_back(Napi::Persistent(Value()));
    return w;
  }

  // Queues w and returns its promise; the thread-safe function keeps the event loop alive only
  // while some op is in flight, so an idle communicator does not hold a process open.
  // `timeout` bounds a waitSync once the op has started running (queued ops ahead of it are
  // bounded by their own timeouts).
  Napi::Value submit(const Napi::CallbackInfo& info, std::unique_ptr<Work> w, WorkQueue& q,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    Napi::Promise p = w->settlement->deferred->Promise();
    Napi::Env env = info.Env();
    if (timeout.count() > 0) p.Set("waitSync", waitSyncFunction(env, w->completion, timeout, w->op));
    // After an abort an op fails here at once: its queue's thread may still be stuck in the op
    // the abort abandoned (destroy() alone goes on, and resolves at once, see Destroy).
    if (state_->aborted.load() && w->op != "destroy") {
      w->error = describeFailure(*state_, *w, Err::Comm, state_->abortMessage());
      w->completion->finish(w->error);
      w->settlement->settle(env, w->error);
      return p;
    }
    if (pending_++ == 0) tsfn_.Ref(env);
    w->settlement->settled = [this, env] {
      if (--pending_ == 0) tsfn_.Unref(env);
    };
    q.push(std::move(w));
    return p;
  }

  // promise.waitSync(): blocks until the op has finished on this rank and throws its typed error,
  // the same one the promise rejects with. Gloo ends an op on its own timeout; the grace covers
  // its slack, after which the wait gives up with TimeoutError and marks the communicator broken.
  Napi::Function waitSyncFunction(Napi::Env env, std::shared_ptr<Completion> c, std::chrono::milliseconds timeout,
                                  std::string op) {
    std::shared_ptr<CommState> s = state_;
    return Napi::Function::New(env, [c, timeout, op, s](const Napi::CallbackInfo& info) -> Napi::Value {
      constexpr std::chrono::milliseconds grace{2000};
      std::unique_lock<std::mutex> lock(c->mutex);
      c->cv.wait(lock, [&] { return c->started || c->done; });
      if (!c->cv.wait_until(lock, c->startedAt + timeout + grace, [&] { return c->done; })) {
        lock.unlock();
        std::string why = op + " on rank " + std::to_string(s->rank) + " of group '" + s->group +
                          "' did not finish within " + std::to_string((timeout + grace).count()) + " ms (waitSync)";
        s->markBroken(why);
        c->finish(Error{Err::Timeout, why, "GlooCommunicator." + op});
        lock.lock();
      }
      if (c->error) {
        Error e = *c->error;
        lock.unlock();
        makeError(info.Env(), e.code, e.message, e.call).ThrowAsJavaScriptException();
      }
      return info.Env().Undefined();
    }, "waitSync");
  }

  // Queues a collective on the communicator's thread: the ranks first agree on `agreement` (agreeOn
  // in collectives.h), then `body` runs with the collective's tag (its sequence number). `w` is
  // taken by reference so that arguments built from it (the agreement names w->op) are read first.
  Napi::Value queueCollective(const Napi::CallbackInfo& info, std::unique_ptr<Work>&& w, Agreement agreement,
                              std::chrono::milliseconds timeout, std::function<void(CommState&, uint32_t)> body) {
    std::shared_ptr<CommState> s = state_;
    const uint32_t tag = uint32_t(w->seq);
    w->run = [s, tag, timeout, agreement = std::move(agreement), body = std::move(body)] {
      agreeOn(*s, agreement, tag, timeout);
      body(*s, tag);
    };
    return submit(info, std::move(w), *collectives_, timeout);
  }

  std::chrono::milliseconds timeoutArg(const Args& a, size_t i) {
    int64_t ms = a.int64(i);
    if (ms < 1) fail(Err::Argument, std::string(a.call) + ": timeoutMs must be at least 1");
    return std::chrono::milliseconds(ms);
  }

  // The collectives that take (send, recv, dtype, ...their own arguments..., seq, timeoutMs).
  // open() checks the call and reads the dtype; queueBuffers() makes the Work from the trailing
  // (seq, timeoutMs) at `seqArg`, keeps send (inCount elements) and recv (outCount) alive with it,
  // names it after the agreement's op and queues body(s, in, out, tag, timeout) behind the ranks'
  // agreement (it moves agreement.count elements).
  struct Opened {
    Args a;
    DType dt;
  };
  Opened open(const Napi::CallbackInfo& info, const char* call, size_t argc) {
    Args a{info, call};
    a.count(argc);
    checkUsable(call);
    return {a, a.dtype(2)};
  }
  template <typename F>
  Napi::Value queueBuffers(const Napi::CallbackInfo& info, const Opened& c, size_t seqArg, size_t inCount,
                           size_t outCount, Agreement agreement, F body) {
    auto w = newWork(info, c.a.call, c.a.int64(seqArg));
    auto timeout = timeoutArg(c.a, seqArg + 1);
    const uint8_t* in = buffer(info, 0, c.a.call, c.dt, inCount, *w);
    uint8_t* out = buffer(info, 1, c.a.call, c.dt, outCount, *w);
    w->op = agreement.op;
    w->bytes = agreement.count * dtypeSize(c.dt);
    return queueCollective(info, std::move(w), std::move(agreement), timeout,
                           [=](CommState& s, uint32_t tag) { body(s, in, out, tag, timeout); });
  }
  // allReduce, broadcast, reduce: both buffers hold n elements (count, argument 3).
  template <typename F>
  Napi::Value queueSameSize(const Napi::CallbackInfo& info, const Opened& c, size_t n, size_t seqArg, std::string op, int root,
                            F body) {
    return queueBuffers(info, c, seqArg, n, n, Agreement{std::move(op), c.dt, root, n, {}}, body);
  }
  // allGather, reduceScatter: counts[size] (argument 3), one block per rank.
  std::vector<size_t> perRank(const Opened& c) { return counts(c.a.info[3], c.a.call, "counts", size_t(state_->size)); }
  static size_t sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t(0)); }

  // connect(): Promise<void> — rendezvous through the store and connect the full mesh.
  Napi::Value Connect(const Napi::CallbackInfo& info) {
    checkUsable("connect", false);
    if (connectRequested_) fail(Err::Comm, "connect: already called for group '" + state_->group + "'");
    connectRequested_ = true;
    auto w = newWork(info, "connect", -1);
    std::shared_ptr<CommState> s = state_;
    w->run = [s] {
      // The JS store is only needed to meet; release it whether or not the rendezvous worked.
      struct ReleaseStore {
        CommState& s;
        ~ReleaseStore() {
          if (s.storeOp) s.storeOp->Release();
          s.storeOp.reset();
        }
      } release{*s};
      connectMesh(*s);
    };
    connected_ = true;  // ops queued after connect run after it on the same thread
    return submit(info, std::move(w), *collectives_);
  }

  // allReduce(send, recv, dtype, count, op, seq, timeoutMs)
  Napi::Value AllReduce(const Napi::CallbackInfo& info) {
    auto c = open(info, "allReduce", 7);
    size_t n = size_t(c.a.size(3));
    RedOp op = parseRedOp(c.a.int64(4), c.a.call);
    return queueSameSize(info, c, n, 5, std::string("allReduce(") + redOpName(op) + ")", -1, [op, dt = c.dt, n](CommState& s, const uint8_t* in, uint8_t* out, uint32_t tag, std::chrono::milliseconds timeout) {
      allReduce(s, in, out, dt, n, op, tag, timeout);
    });
  }

  // broadcast(send, recv, dtype, count, root, seq, timeoutMs)
  Napi::Value Broadcast(const Napi::CallbackInfo& info) {
    auto c = open(info, "broadcast", 7);
    size_t n = size_t(c.a.size(3));
    int root = rankArg(c.a, 4, "root");
    return queueSameSize(info, c, n, 5, "broadcast", root, [root, dt = c.dt, n](CommState& s, const uint8_t* in, uint8_t* out, uint32_t tag, std::chrono::milliseconds timeout) {
      broadcast(s, in, out, dt, n, root, tag, timeout);
    });
  }

  // reduce(send, recv, dtype, count, op, root, seq, timeoutMs)
  Napi::Value Reduce(const Napi::CallbackInfo& info) {
    auto c = open(info, "reduce", 8);
    size_t n = size_t(c.a.size(3));
    RedOp op = parseRedOp(c.a.int64(4), c.a.call);
    int root = rankArg(c.a, 5, "root");
    return queueSameSize(info, c, n, 6, std::string("reduce(") + redOpName(op) + ")", root, [op, root, dt = c.dt, n](CommState& s, const uint8_t* in, uint8_t* out, uint32_t tag, std::chrono::milliseconds timeout) {
      reduce(s, in, out, dt, n, op, root, tag, timeout);
    });
  }

  // allGather(send, recv, dtype, counts[size], seq, timeoutMs)
  Napi::Value AllGather(const Napi::CallbackInfo& info) {
    auto c = open(info, "allGather", 6);
    std::vector<size_t> counts = perRank(c);
    size_t total = sum(counts);
    return queueBuffers(info, c, 4, counts[size_t(state_->rank)], total, Agreement{"allGather", c.dt, -1, total, counts},
                        [counts, dt = c.dt](CommState& s, const uint8_t* in, uint8_t* out, uint32_t tag, std::chrono::milliseconds timeout) {
      allGather(s, in, out, dt, counts, tag, timeout);
    });
  }

  // reduceScatter(send, recv, dtype, counts[size], op, seq, timeoutMs)
  Napi::Value ReduceScatter(const Napi::CallbackInfo& info) {
    auto c = open(info, "reduceScatter", 7);
    std::vector<size_t> counts = perRank(c);
    size_t total = sum(counts);
    RedOp op = parseRedOp(c.a.int64(4), c.a.call);
    return queueBuffers(info, c, 5, total, counts[size_t(state_->rank)],
                        Agreement{std::string("reduceScatter(") + redOpName(op) + ")", c.dt, -1, total, counts},
                        [counts, op, dt = c.dt](CommState& s, const uint8_t* in, uint8_t* out, uint32_t tag, std::chrono::milliseconds timeout) {
      reduceScatter(s, in, out, dt, counts, op, tag, timeout);
    });
  }

  // allToAll(send, recv, dtype, sendCounts[size], recvCounts[size], seq, timeoutMs)
  Napi::Value AllToAll(const Napi::CallbackInfo& info) {
    auto c = open(info, "allToAll", 7);
    const Args& a = c.a;
    DType dt = c.dt;
    std::vector<size_t> sc = counts(info[3], a.call, "sendCounts", size_t(state_->size));
    std::vector<size_t> rc = counts(info[4], a.call, "recvCounts", size_t(state_->size));
    size_t sendTotal = sum(sc), recvTotal = sum(rc);
    if (state_->size == 1 && sendTotal != recvTotal)
      fail(Err::Argument, "allToAll: a group of one must receive what it sends");
    auto w = newWork(info, "allToAll", a.int64(5));
    auto timeout = timeoutArg(a, 6);
    const uint8_t* in = buffer(info, 0, a.call, dt, sendTotal, *w);
    uint8_t* out = buffer(info, 1, a.call, dt, recvTotal, *w);
    if (in == out) fail(Err::Argument, "allToAll: send and receive buffers must differ");
    w->bytes = sendTotal * dtypeSize(dt);
    // Totals legitimately differ between ranks; the per-pair counts are checked after the header.
    return queueCollective(info, std::move(w), Agreement{w->op, dt, -1, 0, {}}, timeout, [=](CommState& s, uint32_t tag) {
      agreeOnAllToAll(s, sc, rc, tag, timeout);
      allToAll(s, in, out, dt, sc, rc, tag, timeout);
    });
  }

  // barrier(seq, timeoutMs)
  Napi::Value Barrier(const Napi::CallbackInfo& info) {
    Args a{info, "barrier"};
    a.count(2);
    checkUsable(a.call);
    auto w = newWork(info, "barrier", a.int64(0));
    auto timeout = timeoutArg(a, 1);
    return queueCollective(info, std::move(w), Agreement{w->op, DType::U8, -1, 0, {}}, timeout, [=](CommState& s, uint32_t tag) {
      barrier(s, tag, timeout);
    });
  }

  // send(storage, dtype, count, dst, tag, timeoutMs) / recv(storage, dtype, count, src, tag, timeoutMs):
  // posted now (so a send and a recv issued back to back on both ranks cannot deadlock), waited for
  // on the point-to-point thread.
  Napi::Value Send(const Napi::CallbackInfo& info) { return pointToPoint(info, true); }
  Napi::Value Recv(const Napi::CallbackInfo& info) { return pointToPoint(info, false); }

  Napi::Value pointToPoint(const Napi::CallbackInfo& info, bool isSend) {
    Args a{info, isSend ? "send" : "recv"};
    a.count(6);
    checkUsable(a.call);
    if (!connectedDone()) fail(Err::Comm, std::string(a.call) + ": await connect() before point-to-point ops");
    if (state_->broken.load())
      fail(Err::Comm, std::string(a.call) + ": the communicator of group '" + state_->group +
                          "' is unusable after an earlier failure: " + state_->whyBroken());
    DType dt = a.dtype(1);
    size_t n = size_t(a.size(2));
    int peer = rankArg(a, 3, isSend ? "dst" : "src");
    if (peer == state_->rank) fail(Err::Argument, std::string(a.call) + ": a rank cannot " + a.call + " to itself");
    int64_t tag = a.int64(4);
    if (tag < 0 || tag > 0xffffff) fail(Err::Argument, std::string(a.call) + ": tag must be in [0, 2^24)");
    auto timeout = timeoutArg(a, 5);
    auto w = newWork(info, isSend ? "send" : "recv", -1);
    uint8_t* data = buffer(info, 0, a.call, dt, n, *w);
    w->bytes = n * dtypeSize(dt);
    w->op += std::string(isSend ? " to " : " from ") + "rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
    w->marksBrokenOnError = false;
    if (w->bytes == 0) {
      w->run = [] {};
      return submit(info, std::move(w), *pointToPoint_, timeout);
    }
    std::shared_ptr<gloo::transport::UnboundBuffer> b;
    try {
      b = isSend ? postSend(*state_, data, w->bytes, peer, uint32_t(tag)) : postRecv(*state_, data, w->bytes, peer, uint32_t(tag));
    } catch (const std::exception& e) {
      Error err = describeFailure(*state_, *w, Err::Comm, e.what());
      throw err;
    }
    w->run = [b, isSend, timeout] { isSend ? waitSend(*b, timeout) : waitRecv(*b, timeout); };
    return submit(info, std::move(w), *pointToPoint_, timeout);
  }

  // p2p posts on the JS thread touch the Gloo context directly, so it must exist already.
  bool connectedDone() const { return state_->context != nullptr; }

  // destroy(): Promise<void> — resolves once queued ops have finished; the communicator is
  // unusable afterwards (ops throw).
  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    if (!collectives_) {
      auto d = Napi::Promise::Deferred::New(info.Env());
      d.Resolve(info.Env().Undefined());
      return d.Promise();
    }
    if (state_->aborted.load()) {
      // Nothing to wait for: the connections are closed, and a thread still stuck in an abandoned
      // op keeps the state (and the context) alive until that op's timeout ends it.
      state_->markBroken("the communicator was destroyed");
      state_->destroyed = true;
      shutdown();
      auto d = Napi::Promise::Deferred::New(info.Env());
      d.Resolve(info.Env().Undefined());
      return d.Promise();
    }
    auto w = newWork(info, "destroy", -1);
    w->marksBrokenOnError = false;
    std::shared_ptr<CommState> s = state_;
    w->run = [s] {
      s->markBroken("the communicator was destroyed");
      s->release();
    };
    Napi::Value p = submit(info, std::move(w), *collectives_);
    shutdown();
    return p;
  }

  // abort(reason): callable at any time from the JS thread, also while this communicator's thread
  // is blocked in an op (see CommState::abort): the op in flight rejects promptly with CommError
  // naming the reason, later ops fail at once, and destroy() still resolves. An op's storages stay
  // referenced until its thread has left it; an op abandoned while stuck (CommState::abandonStuck)
  // settles earlier, once every pair is closed and its thread can only leave the wait by throwing.
  // A no-op after an earlier abort or after destroy().
  Napi::Value Abort(const Napi::CallbackInfo& info) {
    Args a{info, "abort"};
    a.count(1);
    std::string reason = a.string(0);
    if (state_) state_->abort(reason);
    return info.Env().Undefined();
  }

  Napi::Value Rank(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), state_ ? state_->rank : -1); }
  Napi::Value Size(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), state_ ? state_->size : 0); }
  Napi::Value Pending(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(pending_)); }
  // Whether connect() found every rank on this host and collectives go through shared memory.
  Napi::Value SharedMemory(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), state_ && state_->shm != nullptr); }

  std::shared_ptr<CommState> state_;
  std::shared_ptr<WorkQueue> collectives_;
  std::shared_ptr<WorkQueue> pointToPoint_;
  Napi::ThreadSafeFunction tsfn_;
  int64_t pending_ = 0;
  bool connectRequested_ = false;
  bool connected_ = false;
};

}  // namespace

NT_EXPORT_CLASS(GlooCommunicator::Init);

}  // namespace nt::comm
