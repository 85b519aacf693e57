// Gloo collectives and point-to-point ops over raw host buffers, run on a communicator's thread.
// Arguments are validated by the binding (gloo_communicator.cc) before they get here.
#pragma once

#include <gloo/transport/unbound_buffer.h>

#include <memory>
#include <vector>

#include "communicator.h"
#include "reduce_ops.h"

namespace nt::comm {

// Rendezvous through the store and connect every pair (blocking; honours state.timeout).
void connectMesh(CommState& s);

// `in == out` means in place. Counts are elements; `tag` distinguishes concurrent operations.
void allReduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, uint32_t tag,
               std::chrono::milliseconds timeout);
void broadcast(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, int root, uint32_t tag,
               std::chrono::milliseconds timeout);
// `out` is written on root; on other ranks it is scratch of `count` elements.
void reduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, int root, uint32_t tag,
            std::chrono::milliseconds timeout);
// Rank i contributes counts[i] elements; out holds them concatenated in rank order.
void allGather(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
               uint32_t tag, std::chrono::milliseconds timeout);
// `in` holds sum(counts) elements; rank r receives the reduction of block r (counts[r] elements).
void reduceScatter(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
                   RedOp op, uint32_t tag, std::chrono::milliseconds timeout);
// Block i of `in` (sendCounts[i] elements) goes to rank i; block j of `out` comes from rank j.
void allToAll(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& sendCounts,
              const std::vector<size_t>& recvCounts, uint32_t tag, std::chrono::milliseconds timeout);
void barrier(CommState& s, uint32_t tag, std::chrono::milliseconds timeout);

// Point to point: posted at once on the calling thread, waited for on the communicator's p2p thread.
std::shared_ptr<gloo::transport::UnboundBuffer> postSend(CommState& s, uint8_t* data, size_t bytes, int dst,
                                                         uint32_t tag);
std::shared_ptr<gloo::transport::UnboundBuffer> postRecv(CommState& s, uint8_t* data, size_t bytes, int src,
                                                         uint32_t tag);
void waitSend(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout);
void waitRecv(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout);

}  // namespace nt::comm
