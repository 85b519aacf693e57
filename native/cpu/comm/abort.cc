// Aborting Gloo communicators from outside their threads: waking a blocked Gloo op, the process's
// list of live communicators, and the abort-file watcher. JS exports:
//   abortCommunicators(reason): number      aborts every live communicator, returns how many
//   watchAbortFile(path, generation)         one native thread per process polls `path` every 20 ms;
//                                            a decimal content > generation aborts every live
//                                            communicator, then it watches for more than that
//   stopAbortWatch()                         ends the thread (also at process exit, and when an
//                                            environment that called watchAbortFile is torn down)
// The watcher runs while the JS thread is blocked (a waitSync), which is why it is native.
#include "abort.h"

#include <fcntl.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <condition_variable>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "communicator.h"

namespace nt::comm {

// ---- Interrupt -----------------------------------------------------------------------------------
void Interrupt::arm(std::function<void()> wake, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fired_) fail(Err::Comm, what + ": the communicator was aborted: " + reason_);
  wake_ = std::move(wake);
}

void Interrupt::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  wake_ = nullptr;
}

void Interrupt::fire(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fired_) return;
  fired_ = true;
  reason_ = reason;
  if (wake_) wake_();
}

void Interrupt::check(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fired_) fail(Err::Comm, what + ": the communicator was aborted: " + reason_);
}

bool Interrupt::fired() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fired_;
}

// ---- waking Gloo ---------------------------------------------------------------------------------
// gloo::Context::closeConnections() only closes each pair's socket: an op of this process waiting on
// a buffer is not told and sleeps until its own timeout. What wakes it is Gloo's path for an op that
// timed out: the waiting buffer calls tcp::Context::signalException, which sets the exception on
// every pair; each pair signals every buffer with an operation pending on it (their waits throw at
// once), later posts on it throw, and its socket closes, so the peers' ops fail too. That function
// is protected (and the Debian package's tcp headers cannot be included: they need a missing
// gloo/common/memory.h), so it is reached through the public API: a one-byte receive, on a slot no
// rank ever sends to, waited for with a 1 ms timeout. Gloo's own design has other threads post and
// wait on a context while ops run (each pair takes its lock; the device loop skips a pair whose
// lock it cannot take), which is what the communicator's point-to-point posts already rely on.
namespace {
// Outside the slot prefixes the collectives (0x01..0x08), point-to-point (0x20) and reduce-scatter
// (0x21) use.
constexpr uint64_t kAbortSlot = uint64_t(0x22) << 56;
}  // namespace

void signalGlooContext(gloo::Context& ctx, const std::string&) {
  // Every peer in turn: a pair that already failed (a dead peer) throws at the post without
  // signalling the others, so the next one is tried; once one wait has timed out, every pair has
  // its exception and the remaining posts throw at once.
  char byte = 0;
  for (int i = 1; i < ctx.size; i++) {
    try {
      std::unique_ptr<gloo::transport::UnboundBuffer> b = ctx.createUnboundBuffer(&byte, 1);
      b->recv((ctx.rank + i) % ctx.size, kAbortSlot);
      b->waitRecv(std::chrono::milliseconds(1));
    } catch (const std::exception&) {
      // Expected: "Timed out waiting 1ms for recv operation to complete" after signalling every
      // pair, or the pair's own exception when it had failed before.
    }
  }
}

// ---- the process's communicators -----------------------------------------------------------------
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<CommState>> states;
};

// Never destroyed: the watcher thread may still use it while the process exits.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void registerCommunicator(const std::shared_ptr<CommState>& s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Drops the communicators that are gone, so the list does not grow with every group ever made.
  std::vector<std::weak_ptr<CommState>> live;
  for (auto& w : r.states)
    if (auto p = w.lock(); p && !p->destroyed.load()) live.push_back(w);
  live.push_back(s);
  r.states = std::move(live);
}

namespace {

// The communicators an abort now would reach.
std::vector<std::shared_ptr<CommState>> liveCommunicators() {
  std::vector<std::shared_ptr<CommState>> targets;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& w : r.states)
    if (auto p = w.lock(); p && !p->destroyed.load() && !p->aborted.load()) targets.push_back(p);
  return targets;
}

int abortEach(std::vector<std::shared_ptr<CommState>> targets, const std::string& reason) {
  // All are marked first: an op that fails because another of them closed its pairs names the abort.
  std::vector<std::shared_ptr<CommState>> marked;
  for (auto& s : targets)
    if (s->markAborted(reason)) marked.push_back(s);
  targets = std::move(marked);
  if (targets.empty()) return 0;
  // Outside the list's lock. Closing a Gloo pair waits for a tick of the device loop (up to 10 ms),
  // so one communicator's abort takes 10-20 ms: they run side by side, and an op blocked in the
  // last one is not held up by the others.
  if (targets.size() == 1) {
    targets[0]->wake();
  } else {
    std::vector<std::thread> threads;
    for (auto& s : targets) {
      try {
        threads.emplace_back([s] { s->wake(); });
      } catch (const std::system_error&) {
        s->wake();  // no thread to be had: in turn
      }
    }
    for (auto& t : threads) t.join();
  }
  return int(targets.size());
}

}  // namespace

int abortAllCommunicators(const std::string& reason) { return abortEach(liveCommunicators(), reason); }

// ---- the abort-file watcher ----------------------------------------------------------------------
namespace {

constexpr std::chrono::milliseconds kPollInterval{20};

struct Watcher {
  std::mutex mutex;
  std::condition_variable cv;
  std::thread thread;
  bool stopping = false;
  std::string path;
  int64_t generation = 0;
  // Environments with a cleanup hook that stops the thread (Node refuses a hook added twice).
  std::set<napi_env> hooked;
};

// Never destroyed (see registry()); stopWatcher() joins its thread at exit.
Watcher& watcher() {
  static Watcher* w = new Watcher();
  return *w;
}

// The file's decimal content, or -1 when it is missing, empty or not a plain number.
int64_t readGeneration(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[64];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  int64_t v = 0;
  bool digits = false;
  for (ssize_t i = 0; i < n; i++) {
    char c = buf[i];
    if (c >= '0' && c <= '9') {
      if (v > (INT64_MAX - 9) / 10) return -1;
      v = v * 10 + (c - '0');
      digits = true;
    } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
      if (digits) break;
    } else {
      return -1;
    }
  }
  return digits ? v : -1;
}

void watchLoop() {
  Watcher& w = watcher();
  std::unique_lock<std::mutex> lock(w.mutex);
  while (!w.stopping) {
    const std::string path = w.path;
    const int64_t watching = w.generation;
    lock.unlock();
    const int64_t g = readGeneration(path);
    if (g > watching) {
      lock.lock();
      // Retargeted meanwhile: the new target is read on the next poll instead. The communicators
      // are listed under the lock, so those made after a retarget (a regroup's new generation) are
      // never aborted for the generation the retarget moved past.
      const bool current = w.path == path && w.generation == watching;
      std::vector<std::shared_ptr<CommState>> targets;
      if (current) {
        w.generation = g;
        targets = liveCommunicators();
      }
      lock.unlock();
      abortEach(targets, "generation " + std::to_string(g) + " started (abort file " + path + ")");
    }
    lock.lock();
    w.cv.wait_for(lock, kPollInterval, [&] { return w.stopping; });
  }
}

void stopWatcher() {
  Watcher& w = watcher();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.stopping = true;
    t = std::move(w.thread);
  }
  w.cv.notify_all();
  if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  else if (t.joinable()) t.detach();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.stopping = false;
}

// At process exit (static destruction) the thread is joined rather than left running.
struct StopAtExit {
  ~StopAtExit() { stopWatcher(); }
} stopAtExit;

void cleanupHook(void* env) {
  {
    std::lock_guard<std::mutex> lock(watcher().mutex);
    watcher().hooked.erase(static_cast<napi_env>(env));
  }
  stopWatcher();
}

Napi::Value AbortCommunicators(const Napi::CallbackInfo& info) {
  Args a{info, "abortCommunicators"};
  a.count(1);
  return Napi::Number::New(info.Env(), abortAllCommunicators(a.string(0)));
}

Napi::Value WatchAbortFile(const Napi::CallbackInfo& info) {
  Args a{info, "watchAbortFile"};
  a.count(2);
  std::string path = a.string(0);
  if (path.empty()) fail(Err::Argument, "watchAbortFile: path must not be empty");
  int64_t generation = a.int64(1);
  if (generation < 0) fail(Err::Argument, "watchAbortFile: generation must be a non-negative integer");
  Watcher& w = watcher();
  napi_env env = info.Env();
  bool hook = false;
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.path = path;
    w.generation = generation;
    if (!w.thread.joinable()) w.thread = std::thread(watchLoop);
    hook = w.hooked.insert(env).second;
  }
  // An environment that asked for the watcher stops it when it is torn down (a worker's end, or
  // the main environment's), before the addon's code can go away.
  if (hook) napi_add_env_cleanup_hook(env, cleanupHook, env);
  return info.Env().Undefined();
}

Napi::Value StopAbortWatch(const Napi::CallbackInfo& info) {
  Args a{info, "stopAbortWatch"};
  a.count(0);
  stopWatcher();
  return info.Env().Undefined();
}

}  // namespace

NT_EXPORT("abortCommunicators", AbortCommunicators);
NT_EXPORT("watchAbortFile", WatchAbortFile);
NT_EXPORT("stopAbortWatch", StopAbortWatch);

}  // namespace nt::comm
