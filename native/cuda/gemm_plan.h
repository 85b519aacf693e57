// Host-only pieces of the cuBLASLt GEMM (native/cuda/kernels/gemm.cu) that need no CUDA, so the
// test-only addon checks them on machines without a GPU: the pointer alignment cuBLASLt's
// heuristic is told, the key a cached plan is found by, and the bounded cache that holds plans.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

namespace nt::cuda::lt {

// The alignment in bytes to declare for a matrix (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES):
// the largest power of two <= 256 dividing its address. With a strided batch, matrix i starts at
// address + i * batchStrideBytes, so the stride must be divisible too. cuBLASLt assumes 256 when
// not told, and an algorithm picked under that assumption may fault or misread a less aligned
// pointer (an offset into a storage, an odd batch stride).
inline uint32_t alignmentBytes(uintptr_t address, int64_t batch = 1, int64_t batchStrideBytes = 0) {
  uint64_t bits = uint64_t(address) | 256u;
  if (batch > 1) bits |= uint64_t(batchStrideBytes);
  return uint32_t(bits & (~bits + 1));  // lowest set bit
}

// Everything a plan (matmul descriptor, layouts, chosen algorithm) depends on; pointers only
// through their alignment. Pointer values themselves are set on every call.
struct PlanKey {
  int32_t dtype = 0;   // of A and B
  int32_t cdtype = 0;  // of C (and D): A's dtype, or f32 for 16-bit A and B accumulated in f32
  int32_t compute = 0;  // cublasComputeType_t (f32 or tf32)
  int64_t batch = 0, m = 0, n = 0, k = 0;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  bool transA = false, transB = false;
  int32_t epilogue = 0;  // cublasLtEpilogue_t, 1 (CUBLASLT_EPILOGUE_DEFAULT) when none
  uint32_t alignA = 256, alignB = 256, alignC = 256, alignBias = 256, alignAux = 256;

  auto tie() const {
    return std::tie(dtype, cdtype, compute, batch, m, n, k, strideA, strideB, strideC, transA, transB, epilogue, alignA, alignB, alignC,
                    alignBias, alignAux);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
  bool operator==(const PlanKey& o) const { return tie() == o.tie(); }
};

struct CacheStats {
  int64_t size = 0, hits = 0, misses = 0, evictions = 0;
};

// A least-recently-used map of at most `capacity` entries. Values are shared: an entry evicted
// while a caller still holds it lives until that caller lets go. Not thread-safe (callers lock).
template <typename K, typename V>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The entry for `key` (now the most recent), or null.
  std::shared_ptr<V> find(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) {
      stats_.misses++;
      return nullptr;
    }
    stats_.hits++;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  // Stores `value` under `key` (replacing any entry), evicting the least recent beyond capacity.
  void insert(const K& key, std::shared_ptr<V> value) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      stats_.evictions++;
    }
  }

  void clear() {
    index_.clear();
    order_.clear();
  }
  size_t size() const { return order_.size(); }
  CacheStats stats() const {
    CacheStats s = stats_;
    s.size = int64_t(order_.size());
    return s;
  }

 private:
  size_t capacity_;
  std::list<std::pair<K, std::shared_ptr<V>>> order_;  // most recent first
  std::map<K, typename std::list<std::pair<K, std::shared_ptr<V>>>::iterator> index_;
  CacheStats stats_;
};

}  // namespace nt::cuda::lt
