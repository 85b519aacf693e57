// A gloo::rendezvous::Store whose operations run on the JS thread through a thread-safe function,
// so Gloo meets through whatever store lib/ holds (Redis when the job was launched with --rdzv).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "abort.h"
#include "core/nt.h"

namespace nt::comm {

// storeOp(op: 'set' | 'get' | 'wait', key, value: Uint8Array | null, done(error: string | null, value?: Uint8Array))
// Keys get `prefix + "/"` in front. Called from the communicator's thread only; each call blocks
// until JS calls done, or fails with a Timeout error after `timeout`.
class JsStore : public gloo::rendezvous::Store {
 public:
  // `interrupt` (optional, outliving the store): its firing ends the call being waited for and
  // makes later calls fail at once.
  JsStore(Napi::ThreadSafeFunction storeOp, std::string prefix, std::chrono::milliseconds timeout,
          Interrupt* interrupt = nullptr);
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<char> call(const char* op, const std::string& key, const std::vector<char>* value, std::chrono::milliseconds timeout);
  Napi::ThreadSafeFunction storeOp_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  Interrupt* interrupt_;
};

}  // namespace nt::comm
