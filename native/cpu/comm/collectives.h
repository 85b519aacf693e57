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

// What every rank must pass alike before a collective whose buffer sizes have to match: Gloo's
// I/O thread aborts the process when a message is longer than the buffer posted for it.
struct Agreement {
  std::string op;           // e.g. "allReduce(sum)"; compared by hash, named in errors
  DType dtype = DType::F32;
  int64_t root = -1;        // -1 for rootless ops
  size_t count = 0;         // elements the op moves in total
  std::vector<size_t> counts;  // per-rank counts where the op takes them (else empty)
};

// Unless s.verifySizes is off, runs one small max-allreduce of every field and its negation (so
// each rank learns the minimum and maximum) and throws MismatchError on every rank alike when the
// ranks differ, naming the smallest and largest value. `tag` is the collective's own tag.
void agreeOn(CommState& s, const Agreement& mine, uint32_t tag, std::chrono::milliseconds timeout);
// allToAll: after agreeOn, checks that what rank i sends to rank j is what j expects from i.
void agreeOnAllToAll(CommState& s, const std::vector<size_t>& sendCounts, const std::vector<size_t>& recvCounts,
                     uint32_t tag, std::chrono::milliseconds timeout);

// `in == out` means in place. Counts are elements; `tag` distinguishes concurrent operations.
void allReduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, uint32_t tag,
               std::chrono::milliseconds timeout);
void broadcast(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, int root, uint32_t tag,
               std::chrono::milliseconds timeout);
// `out` is written on root; on other ranks it is scratch of `count` elements.
void reduce(CommState& s, const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, int root, uint32_t tag,
            std::chrono::milliseconds timeout);
// Rank i contributes counts[i] elements; out holds them concatenated in rank order. In place when
// in == out: this rank's block of out is its input.
void allGather(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
               uint32_t tag, std::chrono::milliseconds timeout);
// `in` holds sum(counts) elements; rank r receives the reduction of block r (counts[r] elements).
// In place when in == out: the result goes to block r of in, the other blocks are left unchanged.
void reduceScatter(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& counts,
                   RedOp op, uint32_t tag, std::chrono::milliseconds timeout);
// Block i of `in` (sendCounts[i] elements) goes to rank i; block j of `out` comes from rank j.
void allToAll(CommState& s, const uint8_t* in, uint8_t* out, DType dt, const std::vector<size_t>& sendCounts,
              const std::vector<size_t>& recvCounts, uint32_t tag, std::chrono::milliseconds timeout);
void barrier(CommState& s, uint32_t tag, std::chrono::milliseconds timeout);

// Point to point: posted at once on the calling thread, waited for on the communicator's p2p thread.
// The byte count is part of the slot, so a send and a recv of different sizes never match (each
// side times out) instead of Gloo aborting the receiver; sizes of 4 GiB or more are folded into
// 32 bits, so two such sizes can collide (a 1 in 2^32 chance) and then abort as before.
std::shared_ptr<gloo::transport::UnboundBuffer> postSend(CommState& s, uint8_t* data, size_t bytes, int dst,
                                                         uint32_t tag);
std::shared_ptr<gloo::transport::UnboundBuffer> postRecv(CommState& s, uint8_t* data, size_t bytes, int src,
                                                         uint32_t tag);
void waitSend(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout);
void waitRecv(gloo::transport::UnboundBuffer& b, std::chrono::milliseconds timeout);

}  // namespace nt::comm
