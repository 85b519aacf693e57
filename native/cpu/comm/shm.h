// Shared-memory collectives for the ranks of a group that all run on one host: a segment under
// /dev/shm with per-rank staging slots and arrival counters, met through the rendezvous store.
// Bytes move with memcpy and the reduction kernels instead of through loopback TCP sockets.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "reduce_ops.h"

namespace nt::comm {

struct ShmHeader;

class ShmSegment {
 public:
  // Collective over the group (every rank calls it after Gloo's rendezvous). Returns nullptr on
  // every rank alike when the ranks do not all share this host, when a rank has shared memory
  // turned off, or when the segment cannot be reserved. Throws nt::Error on store failures.
  static std::unique_ptr<ShmSegment> open(gloo::rendezvous::Store& store, int rank, int size, bool enabled);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // `in == out` is in place. Every rank gets bit-identical results (block j is reduced by rank j only).
  void allReduce(const uint8_t* in, uint8_t* out, DType dt, size_t count, RedOp op, std::chrono::milliseconds timeout);
  // Every rank contributes `mine` (at most kExchangeWords values); returns the size x words matrix.
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine, std::chrono::milliseconds timeout);
  // Makes peers waiting in this segment fail at once (after a local failure).
  void abort();

  static constexpr size_t kExchangeWords = 16;
  static constexpr int kMaxRanks = 64;

 private:
  ShmSegment(void* base, size_t bytes, int rank, int size, size_t slotBytes);
  void barrier(std::chrono::milliseconds timeout);
  uint8_t* slot(int set, int r) const;

  void* base_;
  size_t bytes_;
  int rank_, size_;
  size_t slotBytes_;
  ShmHeader* header_;
  uint8_t* data_;
  uint64_t epoch_ = 0;
  int set_ = 0;          // which of the two slot sets the next chunk uses
  int exchangeSet_ = 0;  // which of the two exchange rows the next exchange uses
};

}  // namespace nt::comm
