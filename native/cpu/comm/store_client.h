// C++ client of nodetron's rendezvous store (wire protocol: docs/store-protocol.md), as a
// gloo::rendezvous::Store so Gloo's connectFullMesh rendezvouses through the launcher's store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "abort.h"

namespace nt::comm {

// One blocking TCP connection; keys are namespaced under `prefix + "/"`. Not thread-safe: a
// communicator uses it only from its own thread. Failures throw nt::Error (Comm or Timeout).
class StoreClient : public gloo::rendezvous::Store {
 public:
  // Retries the connection until timeoutMs passes (the store may come up after the ranks).
  // `interrupt` (optional, outliving the client): its firing ends the retries and, by shutting the
  // socket down, the request in progress; later requests fail at once.
  StoreClient(const std::string& host, int port, std::string prefix, std::chrono::milliseconds timeout,
              Interrupt* interrupt = nullptr);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  // Sends one request body and returns the response body after its status byte.
  std::vector<char> request(const std::vector<char>& body, const char* op, const std::string& key);

  int fd_ = -1;
  std::string host_;
  int port_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  Interrupt* interrupt_;
};

}  // namespace nt::comm
