// The rendezvous-store client behind Gloo's Store interface: framing, connection with retries,
// and the SET / GET / WAIT requests connectFullMesh needs.
#include "store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/nt.h"

namespace nt::comm {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 6 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kNotFound = 2, kError = 3 };

void putU32(std::vector<char>& b, uint32_t v) {
  for (int i = 0; i < 4; i++) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putI64(std::vector<char>& b, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; i++) b.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void putBytes(std::vector<char>& b, const char* p, size_t n) {
  putU32(b, static_cast<uint32_t>(n));
  b.insert(b.end(), p, p + n);
}
uint32_t readU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= uint32_t(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

int connectOnce(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    why = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    why = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port, std::string prefix, std::chrono::milliseconds timeout,
                         Interrupt* interrupt)
    : host_(host), port_(port), prefix_(std::move(prefix)), timeout_(timeout), interrupt_(interrupt) {
  const std::string what = "rendezvous store at " + host + ":" + std::to_string(port);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string why;
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    if (interrupt_) interrupt_->check(what);
    fd_ = connectOnce(host, port, why);
    if (fd_ >= 0) break;
    if (std::chrono::steady_clock::now() + backoff >= deadline)
      fail(Err::Timeout, "could not reach the " + what + " within " + std::to_string(timeout.count()) + " ms (" + why + ")");
    // Slept in short slices so that an abort ends the retries promptly.
    for (auto slept = std::chrono::milliseconds(0); slept < backoff; slept += std::chrono::milliseconds(10)) {
      if (interrupt_ && interrupt_->fired()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  if (!interrupt_) return;
  // shutdown() wakes a send or recv blocked on the socket; the fd stays open (and is not reused)
  // until the destructor disarms the waker and closes it.
  const int fd = fd_;
  try {
    interrupt_->arm([fd] { ::shutdown(fd, SHUT_RDWR); }, what);
  } catch (...) {
    close(fd_);
    fd_ = -1;
    throw;
  }
}

StoreClient::~StoreClient() {
  if (interrupt_) interrupt_->disarm();
  if (fd_ >= 0) close(fd_);
}

std::vector<char> StoreClient::request(const std::vector<char>& body, const char* op, const std::string& key) {
  auto where = [&] { return std::string("store ") + op + " '" + key + "' at " + host_ + ":" + std::to_string(port_); };
  if (interrupt_) interrupt_->check(where());
  // A failure after an abort shut the socket down names the abort rather than the broken socket.
  struct AbortFirst {
    Interrupt* interrupt;
    std::string what;
    void operator()() const {
      if (interrupt) interrupt->check(what);
    }
  } abortFirst{interrupt_, where()};
  std::vector<char> frame;
  putU32(frame, static_cast<uint32_t>(body.size()));
  frame.insert(frame.end(), body.begin(), body.end());
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      abortFirst();
      fail(Err::Comm, where() + ": send failed: " + std::strerror(errno));
    }
    off += size_t(n);
  }
  auto readAll = [&](char* p, size_t len) {
    size_t got = 0;
    while (got < len) {
      ssize_t n = ::recv(fd_, p + got, len - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) abortFirst();
      if (n == 0) fail(Err::Comm, where() + ": the store closed the connection");
      if (n < 0) fail(Err::Comm, where() + ": recv failed: " + std::strerror(errno));
      got += size_t(n);
    }
  };
  char hdr[4];
  readAll(hdr, 4);
  uint32_t len = readU32(hdr);
  if (len < 1) fail(Err::Comm, where() + ": empty response frame");
  std::vector<char> resp(len);
  readAll(resp.data(), len);
  uint8_t status = static_cast<uint8_t>(resp[0]);
  std::vector<char> result(resp.begin() + 1, resp.end());
  if (status == kOk) return result;
  if (status == kTimeout) fail(Err::Timeout, where() + ": timed out");
  if (status == kNotFound) fail(Err::Comm, where() + ": key not found");
  std::string msg = result.size() >= 4 ? std::string(result.data() + 4, result.size() - 4) : std::string();
  fail(Err::Comm, where() + ": store error: " + msg);
}

void StoreClient::set(const std::string& key, const std::vector<char>& data) {
  std::string full = prefix_ + "/" + key;
  std::vector<char> body{static_cast<char>(kSet)};
  putBytes(body, full.data(), full.size());
  putBytes(body, data.data(), data.size());
  request(body, "SET", full);
}

std::vector<char> StoreClient::get(const std::string& key) {
  std::string full = prefix_ + "/" + key;
  std::vector<char> body{static_cast<char>(kGet)};
  putBytes(body, full.data(), full.size());
  putI64(body, timeout_.count());
  std::vector<char> r = request(body, "GET", full);
  if (r.size() < 4 || readU32(r.data()) != r.size() - 4) fail(Err::Comm, "store GET '" + full + "': malformed value");
  return std::vector<char>(r.begin() + 4, r.end());
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<char> body{static_cast<char>(kWait)};
  putU32(body, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    std::string full = prefix_ + "/" + k;
    putBytes(body, full.data(), full.size());
  }
  putI64(body, timeout.count());
  request(body, "WAIT", keys.empty() ? prefix_ : prefix_ + "/" + keys[0]);
}

}  // namespace nt::comm
