// Gloo collectives for the cpu backend: Gloo's own algorithms where 0.5.0 has them (allreduce,
// broadcast, reduce, allgather(v), alltoall(v), barrier) and a ring reduce-scatter on unbound
// buffers (0.5.0 has no options-style reduce-scatter).
#include "collectives.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/types.h>

#include <numeric>
#include <sstream>

#include "js_store.h"
#include "shm.h"
#include "store_client.h"

namespace nt::comm {

namespace {

// Slot prefixes outside the range Gloo's collectives use (0x01..0x08).
constexpr uint8_t kPointToPointSlotPrefix = 0x20;
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;

// Calls f with a typed null pointer of the element type Gloo's templates need for dtype's size.
template <typename F>
void withElement(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(static_cast<float*>(nullptr)); break;
    case DType::I32: f(static_cast<int32_t*>(nullptr)); break;
    case DType::U8: f(static_cast<uint8_t*>(nullptr)); break;
    case DType::F16:
    case DType::BF16: f(static_cast<uint16_t*>(nullptr)); break;
  }
}

template <typename T>
T* typed(const uint8_t* p) { return reinterpret_cast<T*>(const_cast<uint8_t*>(p)); }

// Points o's output (and its input, when withInput) at out and in as dtype's element type; the
// counts are whatever the options take (an element count or per-rank counts).
template <typename Options, typename InCount, typename OutCount>
void setBuffers(Options& o, DType dt, const uint8_t* in, const InCount& inCount, uint8_t* out, const OutCount& outCount,
                bool withInput = true) {
  withElement(dt, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    if (withInput) o.setInput(typed<T>(in), inCount);
    o.setOutput(typed<T>(out), outCount);
  });
}

// Gives o the collective's tag and timeout and runs Gloo's `algorithm` on it.
template <typename Options, typename Algorithm>
void runTagged(Options& o, Algorithm algorithm, uint32_t tag, std::chrono::milliseconds timeout) {
  o.setTag(tag);
  o.setTimeout(timeout);
  algorithm(o);
}

// Agreement exchanges use tags with a high bit set, apart from the collective's own (its sequence
// number, below 2^30).
constexpr uint32_t kAgreementTagBit = 0x80000000u;
constexpr uint32_t kAllToAllCountsTagBit = 0x40000000u;

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Hashes fit in 62 bits so that negating them cannot overflow.
int64_t fold(uint64_t h) { return int64_t(h & ((uint64_t(1) << 62) - 1)); }

void maxInt64(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<int64_t*>(c);
  const auto* x = static_cast<const int64_t*>(a);
  const auto* y = static_cast<const int64_t*>(b);
  for (size_t i = 0; i < n; i++) out[i] = std::max(x[i], y[i]);
}

void allReduceMax(CommState& s, std::vector<int64_t>& v, uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions o(s.context);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(maxInt64);
  runTagged(o, gloo::allreduce, tag, timeout);
}

std::string listCounts(const std::vector<size_t>& counts) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < counts.size(); i++) out << (i ? "," : "") << counts[i];
  out << "]";
  return out.str();
}

}  // namespace

void connectMesh(CommState& s) {
  // The store calls are where connect waits on its peers; an abort wakes them (s.interrupt).
  std::unique_ptr<gloo::rendezvous::Store> store;
  if (s.storeOp) store = std::make_unique<JsStore>(*s.storeOp, s.group, s.timeout, &s.interrupt);
  else store = std::make_unique<StoreClient>(s.storeHost, s.storePort, s.group, s.timeout, &s.interrupt);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(s.rank, s.size);
  ctx->setTimeout(s.timeout);
  std::shared_ptr<gloo::transport::Device> dev = tcpDevice(s.deviceHost, s.deviceIface);
  ctx->connectFullMesh(*store, dev);
  std::shared_ptr<ShmSegment> segment = ShmSegment::open(*store, s.rank, s.size, s.sharedMemory);
  s.adopt(ctx, segment);
}

namespace {

// Runs a shared-memory op; a failure tells the peers waiting in the segment to give up at once.
template <typename F>
auto onShm(CommState& s, F f) {
  try {
    return f(*s.shm);
  } catch (...) {
    s.shm->abort();
    throw;
  }
}

}  // namespace

void agreeOn(CommState& s, const Agreement& mine, uint32_t tag, std::chrono::milliseconds timeout) {
  if (!s.verifySizes || s.size == 1) return;
  const int64_t fields[] = {fold(fnv1a(mine.op.data(), mine.op.size())), int64_t(mine.dtype), mine.root,
                            int64_t(mine.count), fold(fnv1a(mine.counts.data(), mine.counts.size() * sizeof(size_t)))};
  constexpr size_t k = sizeof(fields) / sizeof(fields[0]);
  // v[i] = max over ranks of field i, v[k + i] = max of its negation (so -v[k + i] is the minimum).
  std::vector<int64_t> v(2 * k);
  for (size_t i = 0; i < k; i++) {
    v[i] = fields[i];
    v[k + i] = -fields[i];
  }
  if (s.shm) {
    const std::vector<int64_t> rows = onShm(s, [&](ShmSegment& shm) { return shm.exchange(std::vector<int64_t>(fields, fields + k), timeout); });
    for (int r = 0; r < s.size; r++) {
      for (size_t i = 0; i < k; i++) {
        v[i] = std::max(v[i], rows[size_t(r) * k + i]);
        v[k + i] = std::max(v[k + i], -rows[size_t(r) * k + i]);
      }
    }
  } else {
    allReduceMax(s, v, tag | kAgreementTagBit, timeout);
  }
  auto lo = [&](size_t i) { return -v[k + i]; };
  auto hi = [&](size_t i) { return v[i]; };
  if (lo(0) != hi(0))
    throw MismatchError("ranks run different collectives here (this rank runs " + mine.op +
                        "); NODETRON_COMM_CHECK=1 names every rank's");
  if (lo(1) != hi(1))
    throw MismatchError(std::string("ranks disagree on the dtype: ") + dtypeName(DType(lo(1))) + " on some, " +
                        dtypeName(DType(hi(1))) + " on others (this rank: " + dtypeName(mine.dtype) + ")");
  if (lo(2) != hi(2))
    throw MismatchError("ranks disagree on the root: from " + std::to_string(lo(2)) + " to " + std::to_string(hi(2)) +
                        " (this rank: " + std::to_string(mine.root) + ")");
  const size_t esize = dtypeSize(mine.dtype);
  if (lo(3) != hi(3))
    throw MismatchError("element counts differ between ranks: " + std::to_string(lo(3)) + " (" +
                        std::to_string(size_t(lo(3)) * esize) + " bytes) on some, " + std::to_string(hi(3)) + " (" +
                        std::to_string(size_t(hi(3)) * esize) + " bytes) on others (this rank: " +
                        std::to_string(mine.count) + ")");
  if (lo(4) != hi(4))
    throw MismatchError("ranks pass different per-rank counts (this rank: " + listCounts(mine.counts) + ")");
}

void agreeOnAllToAll(CommState& s, const std::vector<size_t>& sendCounts, const std::vector<size_t>& recvCounts,
                     uint32_t tag, std::chrono::milliseconds timeout) {
  if (!s.verifySizes || s.size == 1) return;
  // Row r of each n x n matrix is rank r's list; every other entry is 0, so max fills in the rows.
  const size_t n = size_t(s.size), r = size_t(s.rank);
  std::vector<int64_t> v(2 * n * n, 0);
  for (size_t j = 0; j < n; j++) {
    v[r * n + j] = int64_t(sendCounts[j]);
    v[n * n + r * n + j] = int64_t(recvCounts[j]);
  }
  allReduceMax(s, v, tag | kAllToAllCountsTagBit, timeout);
  for (size_t i = 0; i < n; i++) {
    for (size_t j = 0; j < n; j++) {
      int64_t sends = v[i * n + j], expects = v[n * n + j * n + i];
      if (sends != expects)
        throw MismatchError("rank " + std::to_string(i) + " sends " + std::to_string(sends) + " elements to rank " +
                            std::to_string(j) + ", which expects " + std::to_string(expects));
    }
  }
}

void allReduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, uint32_t tag,
               std::chrono::milliseconds timeout) {
  if (count > 0 && s.shm) {
    onShm(s, [&](ShmSegment& shm) { shm.allReduce(in, out, dt, count, op, timeout); });
  } else if (count > 0 && s.size > 1) {
    gloo::AllreduceOptions o(s.context);
    setBuffers(o, dt, in, count, out, count, in != out);
    o.setReduceFunction(reduceFunction(dt, op));
    runTagged(o, gloo::allreduce, tag, timeout);
  } else if (in != out) {
    std::memcpy(out, in, count * dtypeSize(dt));
  }
  if (op == RedOp::Avg) divideInPlace(out, dt, count, s.size);
}

void broadcast(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, int root, uint32_t tag,
               std::chrono::milliseconds timeout) {
  if (count == 0) return;
  if (s.size == 1) {
    if (in != out) std::memcpy(out, in, count * dtypeSize(dt));
    return;
  }
  gloo::BroadcastOptions o(s.context);
  setBuffers(o, dt, in, count, out, count, s.rank == root && in != out);
  o.setRoot(root);
  runTagged(o, gloo::broadcast, tag, timeout);
}

void reduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, int root, uint32_t tag,
            std::chrono::milliseconds timeout) {
  if (count > 0 && s.size > 1) {
    gloo::ReduceOptions o(s.context);
    setBuffers(o, dt, in, count, out, count, in != out);
    o.setReduceFunction(reduceFunction(dt, op));
    o.setRoot(root);
    runTagged(o, gloo::reduce, tag, timeout);
  } else if (in != out) {
    std::memcpy(out, in, count * dtypeSize(dt));
  }
  if (op == RedOp::Avg && s.rank == root) divideInPlace(out, dt, count, s.size);
}

void allGather(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
               uint32_t tag, std::chrono::milliseconds timeout) {
  size_t esize = dtypeSize(dt);
  size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  if (total == 0 || s.size == 1) {
    if (total > 0 && in != out) std::memcpy(out, in, counts[0] * esize);
    return;
  }
  // In place (in == out): this rank's block of out is the input, so Gloo gets no input buffer.
  const bool inPlace = in == out;
  bool equal = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
  if (equal) {
    gloo::AllgatherOptions o(s.context);
    setBuffers(o, dt, in, counts[0], out, total, !inPlace);
    runTagged(o, gloo::allgather, tag, timeout);
  } else {
    gloo::AllgathervOptions o(s.context);
    setBuffers(o, dt, in, counts[size_t(s.rank)], out, counts, !inPlace);
    runTagged(o, gloo::allgatherv, tag, timeout);
  }
}

// Ring reduce-scatter: at step k (0 <= k < n-1) rank r sends its partial sum of block (r-k-1) to
// rank r+1 and receives the partial sum of block (r-k-2) from rank r-1, adding its own input block;
// after n-1 steps block r holds the reduction over all ranks. Each rank moves (n-1)/n of the data.
// Partial sums live in two block-sized buffers (one being sent while the next is formed) and the
// last step reduces straight into the output, so the input is never copied whole and is only read:
// in place (in == out), block r of in receives the result and the other blocks stay unchanged.
void reduceScatter(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
                   RedOp op, uint32_t tag, std::chrono::milliseconds timeout) {
  const size_t esize = dtypeSize(dt);
  const int n = s.size, r = s.rank;
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; i++) offsets[size_t(i) + 1] = offsets[size_t(i)] + counts[size_t(i)];
  const size_t total = offsets[size_t(n)];
  uint8_t* result = in == out ? out + offsets[size_t(r)] * esize : out;
  if (n == 1 || total == 0) {
    if (counts[size_t(r)] > 0 && in != result) std::memcpy(result, in, counts[size_t(r)] * esize);
    if (op == RedOp::Avg) divideInPlace(result, dt, counts[size_t(r)], n);
    return;
  }
  const size_t maxBlockBytes = std::max<size_t>(*std::max_element(counts.begin(), counts.end()) * esize, 1);
  std::vector<uint8_t> incoming(maxBlockBytes), partial[2] = {std::vector<uint8_t>(maxBlockBytes), std::vector<uint8_t>(maxBlockBytes)};
  // Gloo's buffers take a mutable pointer; the input is only ever sent from.
  auto inBuf = s.context->createUnboundBuffer(const_cast<uint8_t*>(in), total * esize);
  auto recvBuf = s.context->createUnboundBuffer(incoming.data(), incoming.size());
  std::unique_ptr<gloo::transport::UnboundBuffer> partialBuf[2] = {
      s.context->createUnboundBuffer(partial[0].data(), partial[0].size()),
      s.context->createUnboundBuffer(partial[1].data(), partial[1].size())};
  ReduceFn fn = reduceFunction(dt, op);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const gloo::Slot base = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  auto mod = [n](int i) { return size_t(((i % n) + n) % n); };
  for (int k = 0; k < n - 1; k++) {
    const size_t sendBlock = mod(r - k - 1), recvBlock = mod(r - k - 2);
    const size_t sendBytes = counts[sendBlock] * esize, recvCount = counts[recvBlock];
    const uint64_t slot = base + static_cast<uint8_t>(k);
    // Step 0 sends the raw input block; later steps send the partial sum formed one step before.
    gloo::transport::UnboundBuffer& sendFrom = k == 0 ? *inBuf : *partialBuf[(k - 1) % 2];
    const size_t sendOffset = k == 0 ? offsets[sendBlock] * esize : 0;
    if (recvCount > 0) recvBuf->recv(left, slot, 0, recvCount * esize);
    if (sendBytes > 0) sendFrom.send(right, slot, sendOffset, sendBytes);
    if (recvCount > 0) {
      if (!recvBuf->waitRecv(timeout)) fail(Err::Comm, "reduce-scatter receive was aborted");
      uint8_t* dst = k == n - 2 ? result : partial[k % 2].data();
      fn(dst, in + offsets[recvBlock] * esize, incoming.data(), recvCount);
    }
    if (sendBytes > 0 && !sendFrom.waitSend(timeout)) fail(Err::Comm, "reduce-scatter send was aborted");
  }
  if (op == RedOp::Avg) divideInPlace(result, dt, counts[size_t(r)], n);
}

void allToAll(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& sendCounts,
              const std::vector<size_t>& recvCounts, uint32_t tag, std::chrono::milliseconds timeout) {
  size_t sendTotal = std::accumulate(sendCounts.begin(), sendCounts.end(), size_t(0));
  size_t recvTotal = std::accumulate(recvCounts.begin(), recvCounts.end(), size_t(0));
  if (s.size == 1) {
    if (sendTotal > 0) std::memmove(out, in, sendTotal * dtypeSize(dt));
    return;
  }
  bool equal = std::all_of(sendCounts.begin(), sendCounts.end(), [&](size_t c) { return c == sendCounts[0]; }) &&
               std::all_of(recvCounts.begin(), recvCounts.end(), [&](size_t c) { return c == sendCounts[0]; });
  if (equal) {
    if (sendTotal == 0) return;
    gloo::AlltoallOptions o(s.context);
    setBuffers(o, dt, in, sendTotal, out, recvTotal);
    runTagged(o, gloo::alltoall, tag, timeout);
  } else {
    gloo::AlltoallvOptions o(s.context);
    std::vector<int64_t> sc(sendCounts.begin(), sendCounts.end()), rc(recvCounts.begin(), recvCounts.end());
    setBuffers(o, dt, in, sc, out, rc);
    runTagged(o, gloo::alltoallv, tag, timeout);
  }
}

void barrier(CommState& s, uint32_t tag, std::chrono::milliseconds timeout) {
  if (s.size == 1) return;
  gloo::BarrierOptions o(s.context);
  runTagged(o, gloo::barrier, tag, timeout);
}

// Slot bits: prefix (63..56) | tag (55..32, 24 bits) | byte count (31..0, folded above 4 GiB).
static uint64_t pointToPointSlot(uint32_t tag, size_t bytes) {
  uint64_t high = uint64_t(bytes) >> 32;
  uint32_t sizeBits = uint32_t(bytes) ^ (high ? uint32_t(fnv1a(&high, sizeof(high))) : 0u);
  return (uint64_t(kPointToPointSlotPrefix) << 56) | (uint64_t(tag & 0xffffffu) << 32) | sizeBits;
}

std::shared_ptr<gloo::transport::UnboundBuffer> postSend(CommState& s, uint8_t* data, size_t bytes, int dst,
                                                         uint32_t tag) {
  std::shared_ptr<gloo::transport::UnboundBuffer> b = s.context->createUnboundBuffer(data, bytes);
  b->send(dst, pointToPointSlot(tag, bytes));
  return b;
}

std::shared_ptr<gloo::transport::UnboundBuffer> postRecv(CommState& s, uint8_t* data, size_t bytes, int src,
                                                         uint32_t tag) {
  std::shared_ptr<gloo::transport::UnboundBuffer> b = s.context->createUnboundBuffer(data, bytes);
  b->recv(src, pointToPointSlot(tag, bytes));
  return b;
}

void waitSend(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitSend(timeout)) fail(Err::Comm, "send was aborted");
}

void waitRecv(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitRecv(timeout)) fail(Err::Comm, "receive was aborted");
}

}  // namespace nt::comm
