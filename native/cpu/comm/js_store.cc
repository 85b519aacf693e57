// JsStore: Gloo's rendezvous store calls, forwarded to a JS store through a thread-safe function
// and awaited on the communicator's thread (the JS event loop is free while connect() runs).
#include "js_store.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

namespace nt::comm {

namespace {

struct Pending {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::optional<std::string> error;
  std::vector<char> value;
};

struct Request {
  std::string op;
  std::string key;
  std::optional<std::vector<char>> value;
  std::shared_ptr<Pending> pending;
};

void settle(Pending& p, std::optional<std::string> error, std::vector<char> value) {
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.done) return;
  p.done = true;
  p.error = std::move(error);
  p.value = std::move(value);
  p.cv.notify_all();
}

// On the JS thread: calls storeOp(op, key, value, done).
void invoke(Napi::Env env, Napi::Function storeOp, Request* raw) {
  std::unique_ptr<Request> req(raw);
  std::shared_ptr<Pending> pending = req->pending;
  Napi::Function done = Napi::Function::New(env, [pending](const Napi::CallbackInfo& info) {
    if (info.Length() > 0 && !info[0].IsNull() && !info[0].IsUndefined()) {
      settle(*pending, info[0].ToString().Utf8Value(), {});
      return;
    }
    std::vector<char> value;
    if (info.Length() > 1 && info[1].IsTypedArray()) {
      Napi::Uint8Array a = info[1].As<Napi::Uint8Array>();
      value.assign(reinterpret_cast<const char*>(a.Data()), reinterpret_cast<const char*>(a.Data()) + a.ByteLength());
    }
    settle(*pending, std::nullopt, std::move(value));
  });
  Napi::Value value = env.Null();
  if (req->value) {
    Napi::Uint8Array a = Napi::Uint8Array::New(env, req->value->size());
    std::memcpy(a.Data(), req->value->data(), req->value->size());
    value = a;
  }
  try {
    storeOp.Call({Napi::String::New(env, req->op), Napi::String::New(env, req->key), value, done});
  } catch (const Napi::Error& e) {
    settle(*pending, std::string(e.Message()), {});
  }
}

}  // namespace

JsStore::JsStore(Napi::ThreadSafeFunction storeOp, std::string prefix, std::chrono::milliseconds timeout,
                 Interrupt* interrupt)
    : storeOp_(storeOp), prefix_(std::move(prefix)), timeout_(timeout), interrupt_(interrupt) {}

std::vector<char> JsStore::call(const char* op, const std::string& key, const std::vector<char>* value,
                                std::chrono::milliseconds timeout) {
  const std::string what = std::string("store ") + op + " '" + key + "'";
  auto pending = std::make_shared<Pending>();
  // An abort settles the call at once; the JS store's late answer then finds it settled.
  struct Armed {
    Interrupt* interrupt;
    ~Armed() {
      if (interrupt) interrupt->disarm();
    }
  } armed{interrupt_};
  if (interrupt_) interrupt_->arm([pending] { settle(*pending, std::string("aborted"), {}); }, what);
  auto* req = new Request{op, key, value ? std::optional<std::vector<char>>(*value) : std::nullopt, pending};
  if (storeOp_.BlockingCall(req, invoke) != napi_ok) {
    delete req;
    fail(Err::Comm, std::string("store ") + op + " '" + key + "': the JS environment is shutting down");
  }
  std::unique_lock<std::mutex> lock(pending->mutex);
  // The JS store applies its own timeout; this bound only guards against a store that never answers.
  if (!pending->cv.wait_for(lock, timeout + std::chrono::seconds(5), [&] { return pending->done; }))
    fail(Err::Timeout, std::string("store ") + op + " '" + key + "' timed out after " + std::to_string(timeout.count()) + " ms");
  lock.unlock();
  if (interrupt_) interrupt_->check(what);
  lock.lock();
  if (pending->error) fail(Err::Comm, std::string("store ") + op + " '" + key + "': " + *pending->error);
  return pending->value;
}

void JsStore::set(const std::string& key, const std::vector<char>& data) { call("set", prefix_ + "/" + key, &data, timeout_); }

std::vector<char> JsStore::get(const std::string& key) { return call("get", prefix_ + "/" + key, nullptr, timeout_); }

void JsStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void JsStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  for (const std::string& k : keys) call("wait", prefix_ + "/" + k, nullptr, timeout);
}

}  // namespace nt::comm
