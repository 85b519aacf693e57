// A Gloo communicator's state and the work queue its collectives run on (one thread per
// communicator, so the JS event loop and compute go on while bytes move).
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "abort.h"
#include "core/nt.h"

namespace nt::comm {

class ShmSegment;
class WorkQueue;

// What a communicator is, shared by its threads (which may outlive the JS object).
struct CommState : std::enable_shared_from_this<CommState> {
  int rank = 0;
  int size = 1;
  std::string group;  // the store prefix; names the group in errors
  std::chrono::milliseconds timeout{30000};
  std::string storeHost;
  int storePort = 0;
  std::string deviceHost;
  std::string deviceIface;
  std::shared_ptr<gloo::rendezvous::Context> context;  // set by connect on the collective thread
  // When set, the rendezvous goes through this JS store function (js_store.h) instead of the TCP
  // store at storeHost:storePort; connect releases it when done.
  std::optional<Napi::ThreadSafeFunction> storeOp;
  // Ranks agree on op, dtype and sizes before each collective (see agreeOn in collectives.h).
  bool verifySizes = true;
  // Use shared memory when every rank runs on this host (shm.h); set by connect when it applies.
  bool sharedMemory = true;
  std::shared_ptr<ShmSegment> shm;

  // A failed collective leaves Gloo's slots out of step between ranks, so later ops fail fast.
  std::mutex brokenMutex;
  std::string brokenReason;
  std::atomic<bool> broken{false};
  void markBroken(const std::string& why);
  std::string whyBroken();

  // abort(reason), from any thread: marks the communicator broken with the reason, wakes connect's
  // store calls (interrupt), aborts the shared-memory segment and sets an exception on every Gloo
  // pair, so the op in flight fails at once with "the communicator was aborted: <reason>" and later
  // ops fail without running. Idempotent; the first reason is kept.
  std::atomic<bool> aborted{false};
  std::atomic<bool> destroyed{false};  // set once destroy() has released the connections
  Interrupt interrupt;
  // The communicator's queues, for abort: Gloo 0.5's pairs do not signal a transfer in progress
  // (its buffer is then in neither list a pair signals), so an op waiting on one sleeps until its
  // timeout. Such an op, seen blocked after the abort, is abandoned (WorkQueue::abandon).
  std::vector<std::weak_ptr<WorkQueue>> queues;
  void abort(const std::string& reason);
  // abort() in two steps, so that aborting several communicators marks them all before waking any
  // (an op failing because a peer communicator closed its pairs then names the abort too).
  bool markAborted(const std::string& reason);  // false when aborted before
  void wake();
  // Run by abort on a helper thread: abandons the ops still blocked after the abort.
  void abandonStuck();
  std::string abortMessage();  // "the communicator was aborted: <reason>"
  // On the collective thread: `context` and `shm` become the communicator's under handleMutex (so
  // abort on another thread sees them or sees nothing); when an abort came first, they are aborted
  // at once and this throws.
  void adopt(std::shared_ptr<gloo::rendezvous::Context> ctx, std::shared_ptr<ShmSegment> segment);
  // destroy(): drops the context and the segment (under handleMutex; an abort keeps its own copies alive).
  void release();

 private:
  std::mutex handleMutex;
  std::string abortReason;  // under brokenMutex
};

// Ranks disagreed before any byte of the collective moved: the op fails on every rank, and the
// communicator stays usable because all ranks ran the same agreement exchange.
struct MismatchError : Error {
  explicit MismatchError(const std::string& message) : Error{Err::Comm, message, ""} {}
};

// How a Work ended, readable from the JS thread while it blocks in waitSync (the promise settles
// later, when the event loop runs again).
struct Completion {
  std::mutex mutex;
  std::condition_variable cv;
  bool started = false;
  bool done = false;
  std::chrono::steady_clock::time_point startedAt;
  std::optional<Error> error;
  void markStarted();
  // The first outcome wins (a waitSync that gave up first, or the queue thread).
  void finish(const std::optional<Error>& e);
};

// A Work's promise, settled once on the JS thread: when the Work comes back, or earlier when an
// abort abandons it (the Work, and the storages it keeps alive, come back when its thread is done).
struct Settlement {
  std::optional<Napi::Promise::Deferred> deferred;
  std::function<void()> settled;  // JS-thread bookkeeping after the promise settles
  bool done = false;
  void settle(Napi::Env env, const std::optional<Error>& error);
};

// One unit of work: runs on a queue thread, then settles its promise on the JS thread.
struct Work {
  std::string op;
  int64_t seq = -1;
  size_t bytes = 0;
  std::function<void()> run;
  bool marksBrokenOnError = true;
  std::optional<Error> error;
  std::shared_ptr<Settlement> settlement = std::make_shared<Settlement>();
  std::vector<Napi::ObjectReference> keepAlive;  // storages (and the communicator) in use
  std::shared_ptr<Completion> completion = std::make_shared<Completion>();
};

// A FIFO of Work served by one thread; results go back through a thread-safe function (shared by
// a communicator's queues). The thread must never touch the thread-safe function after Node has
// finalized it (that aborts inside libuv), so the function's finalizer calls stopAndJoin on every
// queue: at the normal end (each thread released it) the threads are already leaving; at
// environment teardown they see napi_closing and leave without releasing.
class WorkQueue : public std::enable_shared_from_this<WorkQueue> {
 public:
  static std::shared_ptr<WorkQueue> start(std::shared_ptr<CommState> state, Napi::ThreadSafeFunction tsfn);
  void push(std::unique_ptr<Work> w);
  // Lets the thread finish what is queued, then exit.
  void stop();
  // On the JS thread, from the thread-safe function's finalizer: stop, then join the thread. A
  // thread still inside an op after `grace` (a peer that hangs until the op's timeout) is cut off
  // from the thread-safe function and detached instead, so process exit is not held up.
  void stopAndJoin(std::chrono::milliseconds grace);
  bool aborted() const;
  // The kernel id of the thread while it runs an op, else 0.
  int runningThread();
  // After an abort, from another thread: the op the thread is stuck in and the ops queued behind
  // it settle now with the abort's error (waitSync returns, promises reject); the thread itself
  // stays in Gloo until the op's own timeout, and the storages stay referenced until then.
  void abandon();

 private:
  WorkQueue(std::shared_ptr<CommState> state, Napi::ThreadSafeFunction tsfn);
  void loop();
  // Hands a finished Work to the JS thread; false once the thread-safe function is closing.
  bool deliver(Work* raw);
  // Settles a promise ahead of its Work (abandon); false once the thread-safe function is closing.
  bool settleEarly(std::shared_ptr<Settlement> settlement, Error error);
  std::shared_ptr<CommState> state_;
  Napi::ThreadSafeFunction tsfn_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Work>> items_;
  bool stopping_ = false;
  bool exited_ = false;
  Work* current_ = nullptr;  // the Work the thread runs (under mutex_)
  int tid_ = 0;
  // Guards every use of tsfn_ against the finalizer cutting it off and the thread releasing it.
  std::mutex tsfnMutex_;
  bool cutOff_ = false;
  bool released_ = false;
};

// The queues of one communicator, owned by its thread-safe function's finalizer.
struct QueueSet {
  std::vector<std::shared_ptr<WorkQueue>> queues;
  // Runs on the JS thread once the thread-safe function is finalized (data and context are the set).
  static void finalize(Napi::Env, QueueSet* set, QueueSet* context);
};

// Turns an exception thrown by Gloo, the store client or an op into the typed error of a Work:
// names rank, group, op, sequence number and byte count.
Error describeFailure(const CommState& s, const Work& w, Err code, const std::string& what);

// A TCP device per (host, iface), shared by the communicators of this process.
std::shared_ptr<gloo::transport::Device> tcpDevice(const std::string& host, const std::string& iface);

}  // namespace nt::comm
