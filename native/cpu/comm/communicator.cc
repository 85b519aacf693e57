// The communicator's work queue thread, aborting it from any thread, failure descriptions and the
// shared TCP devices.
#include "communicator.h"

#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>

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
  {
    std::lock_guard<std::mutex> lock(brokenMutex);
    if (aborted.load()) return;
    abortReason = reason;
    brokenReason = "the communicator was aborted: " + reason +
                   (broken.load() ? " (after an earlier failure: " + brokenReason + ")" : std::string());
    broken = true;
    aborted = true;  // seq_cst: adopt() sees it, or this sees what adopt() published (below)
  }
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
  for (auto& q : set->queues) q->stopAndJoin(std::chrono::seconds(5));
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
  while (true) {
    std::unique_ptr<Work> w;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) break;
      w = std::move(items_.front());
      items_.pop_front();
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
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_ = true;
  }
  cv_.notify_all();
}

bool WorkQueue::deliver(Work* raw) {
  std::lock_guard<std::mutex> lock(tsfnMutex_);
  if (cutOff_) return false;
  napi_status st = tsfn_.BlockingCall(raw, [](Napi::Env env, Napi::Function, Work* done) {
    std::unique_ptr<Work> owned(done);
    if (owned->error) {
      owned->deferred->Reject(makeError(env, owned->error->code, owned->error->message, owned->error->call).Value());
    } else {
      owned->deferred->Resolve(env.Undefined());
    }
    if (owned->settled) owned->settled();
  });
  return st == napi_ok;
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
