// Shared-memory allreduce and small exchanges within one host. A chunk of each rank's input is
// copied into the rank's slot, every rank reduces its own 1/n of the chunk across all slots, and
// every rank copies the n reduced parts out: ~4 passes over the bytes, no syscalls, no sockets.
// Two slot sets alternate between chunks so one arrival barrier per step suffices.
#include "shm.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <thread>


namespace nt::comm {

struct alignas(64) ArrivalCounter {
  std::atomic<uint64_t> value;
};

struct ShmHeader {
  ArrivalCounter arrived[ShmSegment::kMaxRanks];
  // Process ids, so a waiting rank notices a peer that died instead of waiting out the timeout.
  alignas(64) std::atomic<int32_t> pid[ShmSegment::kMaxRanks];
  alignas(64) std::atomic<uint32_t> aborted;
  alignas(64) int64_t exchange[2][ShmSegment::kMaxRanks][ShmSegment::kExchangeWords];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

namespace {

// Total staging memory per group; slots are smaller with more ranks.
constexpr size_t kStagingBudgetBytes = size_t(32) << 20;
constexpr size_t kMaxSlotBytes = size_t(4) << 20;
constexpr size_t kMinSlotBytes = size_t(64) << 10;

std::string hostIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  // The network namespace too: ranks in different namespaces (bench chaos --netns: one per simulated node)
  // are different hosts, so their bytes go over the network and a link cut there cuts them.
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return std::string(host) + "|" + boot + "|" + (n > 0 ? std::string(ns, size_t(n)) : std::string());
}

std::string randomHex() {
  std::random_device rd;
  char buf[17];
  snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

// Elements [lo, hi) of a chunk of `count` that rank j reduces.
size_t partStart(size_t count, int j, int n) { return count * size_t(j) / size_t(n); }

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::open(gloo::rendezvous::Store& store, int rank, int size, bool enabled) {
  if (size < 2 || size > kMaxRanks) return nullptr;
  auto put = [&](const std::string& key, const std::string& value) { store.set(key, std::vector<char>(value.begin(), value.end())); };
  auto get = [&](const std::string& key) {
    std::vector<char> v = store.get(key);
    return std::string(v.begin(), v.end());
  };
  // A rank with shared memory off publishes a record nobody else matches, so all ranks decline alike.
  const std::string mine = enabled ? hostIdentity() : "off/" + std::to_string(rank);
  put("shm/host/" + std::to_string(rank), mine);
  bool sameHost = enabled;
  for (int i = 0; i < size; i++)
    if (get("shm/host/" + std::to_string(i)) != mine) sameHost = false;
  if (!sameHost) return nullptr;

  size_t slotBytes = std::min(kMaxSlotBytes, std::max(kMinSlotBytes, kStagingBudgetBytes / (2 * size_t(size))));
  slotBytes -= slotBytes % 64;
  const size_t bytes = sizeof(ShmHeader) + 2 * size_t(size) * slotBytes;
  std::string name;
  void* base = nullptr;
  if (rank == 0) {
    name = "/nodetron-" + std::to_string(getpid()) + "-" + randomHex();
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    // posix_fallocate reserves the pages now: a full /dev/shm fails here, not with SIGBUS later.
    if (fd >= 0 && posix_fallocate(fd, 0, off_t(bytes)) == 0) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) base = nullptr;
    }
    if (fd >= 0) close(fd);
    if (base) {
      new (base) ShmHeader();
    } else {
      if (fd >= 0) shm_unlink(name.c_str());
      name.clear();
    }
    put("shm/name", name);
  } else {
    name = get("shm/name");
    if (!name.empty()) {
      int fd = shm_open(name.c_str(), O_RDWR, 0);
      if (fd >= 0) {
        base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) base = nullptr;
        close(fd);
      }
    }
  }
  if (base) static_cast<ShmHeader*>(base)->pid[rank].store(int32_t(getpid()), std::memory_order_release);
  put("shm/ok/" + std::to_string(rank), base ? "1" : "0");
  bool allMapped = true;
  for (int i = 0; i < size; i++)
    if (get("shm/ok/" + std::to_string(i)) != "1") allMapped = false;
  // Every rank has mapped it (or given up): the name can go, so a crash leaves no file behind.
  if (rank == 0 && !name.empty()) shm_unlink(name.c_str());
  if (!allMapped) {
    if (base) munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(base, bytes, rank, size, slotBytes));
}

ShmSegment::ShmSegment(void* base, size_t bytes, int rank, int size, size_t slotBytes)
    : base_(base), bytes_(bytes), rank_(rank), size_(size), slotBytes_(slotBytes),
      header_(static_cast<ShmHeader*>(base)), data_(static_cast<uint8_t*>(base) + sizeof(ShmHeader)) {}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

uint8_t* ShmSegment::slot(int set, int r) const { return data_ + (size_t(set) * size_t(size_) + size_t(r)) * slotBytes_; }

void ShmSegment::abort() { header_->aborted.store(1, std::memory_order_release); }

// Arrival barrier: each rank publishes its epoch (release) and waits until every rank has reached
// it (acquire), so bytes written before the barrier are visible after it. Spins briefly, then
// yields (ranks often outnumber cores), then sleeps with a growing interval during long waits.
void ShmSegment::barrier(std::chrono::milliseconds timeout) {
  epoch_++;
  header_->arrived[rank_].value.store(epoch_, std::memory_order_release);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::microseconds(50);
  for (uint64_t spins = 0;; spins++) {
    bool all = true;
    for (int i = 0; i < size_ && all; i++)
      if (header_->arrived[i].value.load(std::memory_order_acquire) < epoch_) all = false;
    if (all) return;
    if (header_->aborted.load(std::memory_order_acquire))
      fail(Err::Comm, "a peer rank gave up on the shared-memory collective (it failed or timed out)");
    if ((spins & 255) == 0 && spins > 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        fail(Err::Timeout, "timed out after " + std::to_string(timeout.count()) + " ms waiting for peer ranks in shared memory");
      }
      for (int i = 0; i < size_; i++) {
        const int32_t pid = header_->pid[i].load(std::memory_order_acquire);
        if (header_->arrived[i].value.load(std::memory_order_acquire) < epoch_ && kill(pid, 0) != 0 && errno == ESRCH) {
          abort();
          fail(Err::Comm, "rank " + std::to_string(i) + " (pid " + std::to_string(pid) + ") exited during a shared-memory collective");
        }
      }
    }
    if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      __asm__ __volatile__("yield");
#endif
    } else if (spins < 20000) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
  }
}

void ShmSegment::allReduce(const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op,
                           std::chrono::milliseconds timeout) {
  const size_t esize = dtypeSize(dt);
  const size_t chunkElems = slotBytes_ / esize;
  ReduceFn fn = reduceFunction(dt, op);
  for (size_t start = 0; start < count; start += chunkElems) {
    const size_t c = std::min(chunkElems, count - start);
    const int set = set_;
    set_ ^= 1;
    std::memcpy(slot(set, rank_), in + start * esize, c * esize);
    barrier(timeout);
    // This rank's part, reduced into its own slot (bytes no peer reads until the next barrier).
    const size_t lo = partStart(c, rank_, size_), hi = partStart(c, rank_ + 1, size_);
    if (hi > lo) {
      uint8_t* acc = slot(set, rank_) + lo * esize;
      for (int i = 0; i < size_; i++)
        if (i != rank_) fn(acc, acc, slot(set, i) + lo * esize, hi - lo);
    }
    barrier(timeout);
    for (int j = 0; j < size_; j++) {
      const size_t jl = partStart(c, j, size_), jh = partStart(c, j + 1, size_);
      if (jh > jl) std::memcpy(out + (start + jl) * esize, slot(set, j) + jl * esize, (jh - jl) * esize);
    }
  }
}

std::vector<int64_t> ShmSegment::exchange(const std::vector<int64_t>& mine, std::chrono::milliseconds timeout) {
  if (mine.size() > kExchangeWords) fail(Err::Argument, "shared-memory exchange: too many words");
  const int e = exchangeSet_;
  exchangeSet_ ^= 1;
  std::memcpy(header_->exchange[e][rank_], mine.data(), mine.size() * sizeof(int64_t));
  barrier(timeout);
  std::vector<int64_t> all(size_t(size_) * mine.size());
  for (int i = 0; i < size_; i++) std::memcpy(&all[size_t(i) * mine.size()], header_->exchange[e][i], mine.size() * sizeof(int64_t));
  return all;
}

}  // namespace nt::comm
