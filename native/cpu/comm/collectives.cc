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

}  // namespace

void connectMesh(CommState& s) {
  StoreClient store(s.storeHost, s.storePort, s.group, s.timeout);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(s.rank, s.size);
  ctx->setTimeout(s.timeout);
  std::shared_ptr<gloo::transport::Device> dev = tcpDevice(s.deviceHost, s.deviceIface);
  ctx->connectFullMesh(store, dev);
  s.context = ctx;
}

void allReduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, uint32_t tag,
               std::chrono::milliseconds timeout) {
  if (count > 0 && s.size > 1) {
    gloo::AllreduceOptions o(s.context);
    withElement(dt, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      if (in != out) o.setInput(typed<T>(in), count);
      o.setOutput(typed<T>(out), count);
    });
    o.setReduceFunction(reduceFunction(dt, op));
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::allreduce(o);
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
  withElement(dt, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    if (s.rank == root && in != out) o.setInput(typed<T>(in), count);
    o.setOutput(typed<T>(out), count);
  });
  o.setRoot(root);
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::broadcast(o);
}

void reduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, int root, uint32_t tag,
            std::chrono::milliseconds timeout) {
  if (count > 0 && s.size > 1) {
    gloo::ReduceOptions o(s.context);
    withElement(dt, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      if (in != out) o.setInput(typed<T>(in), count);
      o.setOutput(typed<T>(out), count);
    });
    o.setReduceFunction(reduceFunction(dt, op));
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::reduce(o);
  } else if (in != out) {
    std::memcpy(out, in, count * dtypeSize(dt));
  }
  if (op == RedOp::Avg && s.rank == root) divideInPlace(out, dt, count, s.size);
}

void allGather(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
               uint32_t tag, std::chrono::milliseconds timeout) {
  size_t esize = dtypeSize(dt);
  size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  if (total == 0) return;
  if (s.size == 1) {
    if (in != out) std::memcpy(out, in, counts[0] * esize);
    return;
  }
  bool equal = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
  if (equal) {
    gloo::AllgatherOptions o(s.context);
    withElement(dt, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      o.setInput(typed<T>(in), counts[0]);
      o.setOutput(typed<T>(out), total);
    });
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::allgather(o);
  } else {
    gloo::AllgathervOptions o(s.context);
    withElement(dt, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      o.setInput(typed<T>(in), counts[size_t(s.rank)]);
      o.setOutput(typed<T>(out), counts);
    });
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::allgatherv(o);
  }
}

// Ring reduce-scatter: at step k (0 <= k < n-1) rank r sends its partial sum of block (r-k-1) to
// rank r+1 and receives the partial sum of block (r-k-2) from rank r-1, reducing it into its own;
// after n-1 steps block r holds the reduction over all ranks. Each rank moves (n-1)/n of the data.
void reduceScatter(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
                   RedOp op, uint32_t tag, std::chrono::milliseconds timeout) {
  const size_t esize = dtypeSize(dt);
  const int n = s.size, r = s.rank;
  std::vector<size_t> offsets(size_t(n) + 1, 0);
  for (int i = 0; i < n; i++) offsets[size_t(i) + 1] = offsets[size_t(i)] + counts[size_t(i)];
  const size_t total = offsets[size_t(n)];
  if (n == 1 || total == 0) {
    if (counts[size_t(r)] > 0 && in != out) std::memcpy(out, in, counts[size_t(r)] * esize);
    if (op == RedOp::Avg) divideInPlace(out, dt, counts[size_t(r)], n);
    return;
  }
  std::vector<uint8_t> acc(in, in + total * esize);
  size_t maxBlock = *std::max_element(counts.begin(), counts.end());
  std::vector<uint8_t> incoming(std::max<size_t>(maxBlock * esize, 1));
  auto accBuf = s.context->createUnboundBuffer(acc.data(), acc.size());
  auto inBuf = s.context->createUnboundBuffer(incoming.data(), incoming.size());
  ReduceFn fn = reduceFunction(dt, op);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const gloo::Slot base = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  auto mod = [n](int i) { return size_t(((i % n) + n) % n); };
  for (int k = 0; k < n - 1; k++) {
    size_t sendBlock = mod(r - k - 1), recvBlock = mod(r - k - 2);
    uint64_t slot = base + static_cast<uint8_t>(k);
    if (counts[recvBlock] > 0) inBuf->recv(left, slot, 0, counts[recvBlock] * esize);
    if (counts[sendBlock] > 0) accBuf->send(right, slot, offsets[sendBlock] * esize, counts[sendBlock] * esize);
    if (counts[recvBlock] > 0) {
      if (!inBuf->waitRecv(timeout)) fail(Err::Comm, "reduce-scatter receive was aborted");
      uint8_t* dst = acc.data() + offsets[recvBlock] * esize;
      fn(dst, dst, incoming.data(), counts[recvBlock]);
    }
    if (counts[sendBlock] > 0 && !accBuf->waitSend(timeout)) fail(Err::Comm, "reduce-scatter send was aborted");
  }
  std::memcpy(out, acc.data() + offsets[size_t(r)] * esize, counts[size_t(r)] * esize);
  if (op == RedOp::Avg) divideInPlace(out, dt, counts[size_t(r)], n);
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
    withElement(dt, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      o.setInput(typed<T>(in), sendTotal);
      o.setOutput(typed<T>(out), recvTotal);
    });
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::alltoall(o);
  } else {
    gloo::AlltoallvOptions o(s.context);
    std::vector<int64_t> sc(sendCounts.begin(), sendCounts.end()), rc(recvCounts.begin(), recvCounts.end());
    withElement(dt, [&](auto* t) {
      using T = std::remove_pointer_t<decltype(t)>;
      o.setInput(typed<T>(in), sc);
      o.setOutput(typed<T>(out), rc);
    });
    o.setTag(tag);
    o.setTimeout(timeout);
    gloo::alltoallv(o);
  }
}

void barrier(CommState& s, uint32_t tag, std::chrono::milliseconds timeout) {
  if (s.size == 1) return;
  gloo::BarrierOptions o(s.context);
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::barrier(o);
}

std::shared_ptr<gloo::transport::UnboundBuffer> postSend(CommState& s, uint8_t* data, size_t bytes, int dst,
                                                         uint32_t tag) {
  std::shared_ptr<gloo::transport::UnboundBuffer> b = s.context->createUnboundBuffer(data, bytes);
  b->send(dst, gloo::Slot::build(kPointToPointSlotPrefix, tag));
  return b;
}

std::shared_ptr<gloo::transport::UnboundBuffer> postRecv(CommState& s, uint8_t* data, size_t bytes, int src,
                                                         uint32_t tag) {
  std::shared_ptr<gloo::transport::UnboundBuffer> b = s.context->createUnboundBuffer(data, bytes);
  b->recv(src, gloo::Slot::build(kPointToPointSlotPrefix, tag));
  return b;
}

void waitSend(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitSend(timeout)) fail(Err::Comm, "send was aborted");
}

void waitRecv(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitRecv(timeout)) fail(Err::Comm, "receive was aborted");
}

}  // namespace nt::comm
