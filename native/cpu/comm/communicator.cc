// The communicator's work queue thread, failure descriptions and the shared TCP devices.
#include "communicator.h"

#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>

#include <map>

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
  std::thread([q] { q->loop(); }).detach();
  return q;
}

WorkQueue::WorkQueue(std::shared_ptr<CommState> state, Napi::ThreadSafeFunction tsfn)
    : state_(std::move(state)), tsfn_(tsfn) {}

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
  cv_.notify_one();
}

void WorkQueue::loop() {
  while (true) {
    std::unique_ptr<Work> w;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) break;
      w = std::move(items_.front());
      items_.pop_front();
    }
    if (w->marksBrokenOnError && state_->broken.load()) {
      w->error = describeFailure(*state_, *w, Err::Comm,
                                 "the communicator is unusable after an earlier failure: " + state_->whyBroken());
    } else {
      try {
        w->run();
      } catch (const Error& e) {
        w->error = describeFailure(*state_, *w, e.code, e.message);
      } catch (const std::exception& e) {
        w->error = describeFailure(*state_, *w, classify(e.what()), e.what());
      }
      if (w->error && w->marksBrokenOnError) state_->markBroken(w->error->message);
    }
    Work* raw = w.release();
    napi_status st = tsfn_.BlockingCall(raw, [](Napi::Env env, Napi::Function, Work* done) {
      std::unique_ptr<Work> owned(done);
      if (owned->error) {
        owned->deferred->Reject(makeError(env, owned->error->code, owned->error->message, owned->error->call).Value());
      } else {
        owned->deferred->Resolve(env.Undefined());
      }
      if (owned->settled) owned->settled();
    });
    // The environment is shutting down: nobody can receive the result, and JS objects in the
    // Work must not be touched off the JS thread, so the Work is leaked on purpose.
    if (st != napi_ok) break;
  }
  tsfn_.Release();
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
