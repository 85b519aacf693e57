// The communicator's work queue thread, aborting it from any thread, failure descriptions and the
// shared TCP devices.
#include "communicator.h"

#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "shm.h"

namespace nt::comm {

void CommState::markBroken(const std::string& why) {
  std::lock_guard<std::mutex> lock(brokenMutex);
  if (!broken.load()) brokenReason = why;
  broken = true;
}

std::string CommState::whyBroken() {
  std::lock_guard<std::mutex> lock(brokenMutex);
  return brokenReason;
}

void CommState::abort(const std::string& reason) {
  if (markAborted(reason)) wake();
}

bool CommState::markAborted(const std::string& reason) {
  std::lock_guard<std::mutex> lock(brokenMutex);
  if (aborted.load()) return false;
  abortReason = reason;
  brokenReason = "the communicator was aborted: " + reason +
                 (broken.load() ? " (after an earlier failure: " + brokenReason + ")" : std::string());
  broken = true;
  aborted = true;  // seq_cst: adopt() sees it, or wake() sees what adopt() published
  return true;
}

void CommState::wake() {
  const std::string reason = abortMessage().substr(std::string("the communicator was aborted: ").size());
  interrupt.fire(reason);
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::shared_ptr<ShmSegment> segment;
  {
    std::lock_guard<std::mutex> lock(handleMutex);
    ctx = context;
    segment = shm;
  }
  // Both stay alive through these copies even if destroy() releases them meanwhile.
  if (segment) segment->abort();
  if (ctx) signalGlooContext(*ctx, "the communicator was aborted: " + reason);
  // Ops that stay blocked anyway (a transfer in progress, see `queues`) are abandoned by a helper.
  std::shared_ptr<CommState> self = shared_from_this();
  try {
    std::thread([self] { self->abandonStuck(); }).detach();
  } catch (const std::system_error&) {
    // No thread to be had: such ops end at their own timeout.
  }
}

namespace {

// Whether the thread `tid` of this process is blocked in a futex wait (a condition variable: Gloo's
// buffer waits, or a queue with nothing to do); nullopt when /proc cannot tell.
std::optional<bool> blockedInFutex(int tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/syscall");
  std::string first;
  if (!(f >> first)) return std::nullopt;
  if (first == "running") return false;
  try {
    return std::stol(first) == long(SYS_futex);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

void CommState::abandonStuck() {
  // An op whose thread is seen blocked in a futex wait 3 times, 10 ms apart, is stuck in Gloo (a
  // thread that is still computing or copying reaches its next Gloo call, which throws, within
  // that time); one still running after 2 s is abandoned whatever it does. Only then is the
  // promise settled ahead of the thread: all pairs are closed by then, so nothing writes into
  // the op's buffers any more, and the thread leaves its wait only by throwing.
  constexpr auto kPoll = std::chrono::milliseconds(10);
  constexpr auto kCap = std::chrono::milliseconds(2000);
  constexpr int kSamples = 3;
  std::vector<std::shared_ptr<WorkQueue>> qs;
  for (auto& w : queues)
    if (auto q = w.lock()) qs.push_back(q);
  std::vector<int> seen(qs.size(), 0);
  std::vector<bool> done(qs.size(), false);
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    const bool capped = std::chrono::steady_clock::now() - start >= kCap;
    bool waiting = false;
    for (size_t i = 0; i < qs.size(); i++) {
      if (done[i]) continue;
      const int tid = qs[i]->runningThread();
      if (tid == 0) {
        seen[i] = 0;
        continue;
      }
      const std::optional<bool> blocked = blockedInFutex(tid);
      seen[i] = blocked.value_or(false) ? seen[i] + 1 : 0;
      if (seen[i] >= kSamples || capped) {
        qs[i]->abandon();
        done[i] = true;
      } else {
        waiting = true;
      }
    }
    if (!waiting || capped) return;
    std::this_thread::sleep_for(kPoll);
  }
}

std::string CommState::abortMessage() {
  std::lock_guard<std::mutex> lock(brokenMutex);
  return "the communicator was aborted: " + abortReason;
}

void CommState::adopt(std::shared_ptr<gloo::rendezvous::Context> ctx, std::shared_ptr<ShmSegment> segment) {
  {
    std::lock_guard<std::mutex> lock(handleMutex);
    context = ctx;
    shm = segment;
  }
  if (aborted.load()) {
    if (segment) segment->abort();
    if (ctx) signalGlooContext(*ctx, abortMessage());
    fail(Err::Comm, abortMessage());
  }
}

void CommState::release() {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::shared_ptr<ShmSegment> segment;
  {
    std::lock_guard<std::mutex> lock(handleMutex);
    ctx.swap(context);
    segment.swap(shm);
    destroyed = true;
  }
  // Closing the pairs waits for the device loop: done outside the lock an abort takes.
}

void Completion::markStarted() {
  std::lock_guard<std::mutex> lock(mutex);
  started = true;
  startedAt = std::chrono::steady_clock::now();
  cv.notify_all();
}

void Completion::finish(const std::optional<Error>& e) {
  std::lock_guard<std::mutex> lock(mutex);
  if (done) return;
  done = true;
  error = e;
  cv.notify_all();
}

Error describeFailure(const CommState& s, const Work& w, Err code, const std::string& what) {
  std::string msg = w.op + (w.seq >= 0 ? " #" + std::to_string(w.seq) : std::string()) + " (" +
                    std::to_string(w.bytes) + " bytes) on rank " + std::to_string(s.rank) + " of group '" + s.group +
                    "' (size " + std::to_string(s.size) + ") failed: " + what;
  return Error{code, msg, "GlooCommunicator." + w.op};
}

// Gloo reports timeouts as IoException/EnforceNotMet whose text says so; everything else from
// the transport (a peer closing its sockets) is a communication failure.
static Err classify(const std::string& what) {
  if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos) return Err::Timeout;
  return Err::Comm;
}

std::shared_ptr<WorkQueue> WorkQueue::start(std::shared_ptr<CommState> state, Napi::ThreadSafeFunction tsfn) {
  std::shared_ptr<WorkQueue> q(new WorkQueue(std::move(state), tsfn));
  tsfn.Acquire();
  q->thread_ = std::thread([q] { q->loop(); });
  return q;
}

WorkQueue::WorkQueue(std::shared_ptr<CommState> state, Napi::ThreadSafeFunction tsfn)
    : state_(std::move(state)), tsfn_(tsfn) {}

void WorkQueue::stopAndJoin(std::chrono::milliseconds grace) {
  stop();
  bool exited;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    exited = cv_.wait_for(lock, grace, [&] { return exited_; });
  }
  if (exited) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(tsfnMutex_);
    cutOff_ = true;
  }
  if (thread_.joinable()) thread_.detach();
}

void QueueSet::finalize(Napi::Env, QueueSet* set, QueueSet*) {
  // An aborted communicator's thread may be stuck in an abandoned op until its timeout: not waited for.
  for (auto& q : set->queues) q->stopAndJoin(q->aborted() ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000));
  delete set;
}

void WorkQueue::push(std::unique_ptr<Work> w) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    items_.push_back(std::move(w));
  }
  cv_.notify_one();
}

void WorkQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
}

void WorkQueue::loop() {
  bool closing = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tid_ = int(::syscall(SYS_gettid));
  }
  while (true) {
    std::unique_ptr<Work> w;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) break;
      w = std::move(items_.front());
      items_.pop_front();
      current_ = w.get();
    }
    w->completion->markStarted();
    if (w->marksBrokenOnError && state_->aborted.load()) {
      w->error = describeFailure(*state_, *w, Err::Comm, state_->abortMessage());
    } else if (w->marksBrokenOnError && state_->broken.load()) {
      w->error = describeFailure(*state_, *w, Err::Comm,
                                 "the communicator is unusable after an earlier failure: " + state_->whyBroken());
    } else {
      bool mismatch = false;
      try {
        w->run();
      } catch (const MismatchError& e) {
        w->error = describeFailure(*state_, *w, e.code, e.message);
        mismatch = true;
      } catch (const Error& e) {
        w->error = describeFailure(*state_, *w, e.code, e.message);
      } catch (const std::exception& e) {
        w->error = describeFailure(*state_, *w, classify(e.what()), e.what());
      }
      // An op that failed because the communicator was aborted says so (whatever Gloo or the
      // shared-memory barrier reported when it woke), as a CommError rather than a timeout.
      if (w->error && state_->aborted.load()) w->error = describeFailure(*state_, *w, Err::Comm, state_->abortMessage());
      if (w->error && w->marksBrokenOnError && !mismatch) state_->markBroken(w->error->message);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current_ = nullptr;
    }
    w->completion->finish(w->error);
    // When the thread-safe function is closing (environment teardown), nobody can receive the
    // result and JS objects in the Work must not be touched off the JS thread: leaked on purpose.
    if (!deliver(w.release())) {
      closing = true;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(tsfnMutex_);
    if (!closing && !cutOff_) tsfn_.Release();
    released_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_ = true;
  }
  cv_.notify_all();
}

void Settlement::settle(Napi::Env env, const std::optional<Error>& error) {
  if (done) return;
  done = true;
  if (error) deferred->Reject(makeError(env, error->code, error->message, error->call).Value());
  else deferred->Resolve(env.Undefined());
  if (settled) settled();
}

bool WorkQueue::deliver(Work* raw) {
  std::lock_guard<std::mutex> lock(tsfnMutex_);
  if (cutOff_ || released_) return false;
  napi_status st = tsfn_.BlockingCall(raw, [](Napi::Env env, Napi::Function, Work* done) {
    std::unique_ptr<Work> owned(done);
    owned->settlement->settle(env, owned->error);
  });
  return st == napi_ok;
}

bool WorkQueue::settleEarly(std::shared_ptr<Settlement> settlement, Error error) {
  struct Early {
    std::shared_ptr<Settlement> settlement;
    Error error;
  };
  std::lock_guard<std::mutex> lock(tsfnMutex_);
  if (cutOff_ || released_) return false;
  auto* early = new Early{std::move(settlement), std::move(error)};
  napi_status st = tsfn_.BlockingCall(early, [](Napi::Env env, Napi::Function, Early* raw) {
    std::unique_ptr<Early> owned(raw);
    owned->settlement->settle(env, owned->error);
  });
  if (st != napi_ok) delete early;
  return st == napi_ok;
}

bool WorkQueue::aborted() const { return state_->aborted.load(); }

int WorkQueue::runningThread() {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_ ? tid_ : 0;
}

void WorkQueue::abandon() {
  std::deque<std::unique_ptr<Work>> queued;
  std::shared_ptr<Completion> completion;
  std::shared_ptr<Settlement> settlement;
  std::optional<Error> error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued.swap(items_);
    // op, seq and bytes are fixed before a Work is queued; the thread writes only its error.
    if (current_) {
      completion = current_->completion;
      settlement = current_->settlement;
      error = describeFailure(*state_, *current_, Err::Comm, state_->abortMessage());
    }
  }
  // Ops queued behind it never ran: they come back now, with their storages.
  for (auto& w : queued) {
    w->error = describeFailure(*state_, *w, Err::Comm, state_->abortMessage());
    w->completion->finish(w->error);
    deliver(w.release());  // when closing, leaked on purpose (see loop)
  }
  if (completion) {
    completion->finish(error);
    settleEarly(settlement, *error);
  }
}


std::shared_ptr<gloo::transport::Device> tcpDevice(const std::string& host, const std::string& iface) {
  static std::mutex m;
  static std::map<std::string, std::weak_ptr<gloo::transport::Device>> devices;
  std::lock_guard<std::mutex> lock(m);
  std::string key = host + "|" + iface;
  if (auto d = devices[key].lock()) return d;
  gloo::transport::tcp::attr attr;
  if (!iface.empty()) attr.iface = iface;
  else attr.hostname = host;
  std::shared_ptr<gloo::transport::Device> d = gloo::transport::tcp::CreateDevice(attr);
  devices[key] = d;
  return d;
}

}  // namespace nt::comm
