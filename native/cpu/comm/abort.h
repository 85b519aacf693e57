// Aborting communicators from any thread: the wake-up hook a blocking rendezvous-store call
// registers, the process-wide list of live Gloo communicators (abortCommunicators), and what Gloo's
// TCP transport needs to wake an op blocked on its pairs.
#pragma once

#include <gloo/context.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace nt::comm {

struct CommState;

// How to wake the one blocking call a thread is in (a store request's socket, a JS store reply),
// fired once by abort from another thread. The owner arms it around the call and disarms it before
// the resource the waker touches goes away; firing and arming exclude each other.
class Interrupt {
 public:
  // Keeps `wake` until disarm(); when already fired it is not kept and Comm error is thrown.
  void arm(std::function<void()> wake, const std::string& what);
  void disarm();
  // Runs the armed waker (if any) and makes later arm()/check() throw.
  void fire(const std::string& reason);
  // Throws Comm error "<what>: the communicator was aborted: <reason>" once fired.
  void check(const std::string& what);
  bool fired();

 private:
  std::mutex mutex_;
  bool fired_ = false;
  std::string reason_;
  std::function<void()> wake_;
};

// Sets an exception on every pair of a connected Gloo context (Gloo's own path for an op that timed
// out, see abort.cc): every op waiting on one of its buffers throws, later posts throw, and the
// sockets close, so the peers' ops fail too. Any thread may call it while ops and the device loop
// run; it takes about a millisecond. `why` is for the reader: Gloo's ops report a pair closure.
void signalGlooContext(gloo::Context& ctx, const std::string& why);

// The process-wide list behind abortCommunicators and the abort-file watcher.
void registerCommunicator(const std::shared_ptr<CommState>& s);
// Aborts every registered communicator not destroyed or aborted before; returns how many it aborted.
int abortAllCommunicators(const std::string& reason);

}  // namespace nt::comm
