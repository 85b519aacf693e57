// Host-only pieces of the cuBLASLt GEMM (native/cuda/kernels/gemm.cu) that need no CUDA, so the
// test-only addon checks them on machines without a GPU: the pointer alignment cuBLASLt's
// heuristic is told, the key a cached plan is found by, the bounded cache that holds plans, the
// choice between a fused epilogue and the composed one, and the per-stream workspaces' books.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

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

// The epilogues of gemm_epilogue (their numbers are the JS argument's).
enum Epilogue { kNone = 0, kBias = 1, kGelu = 2, kGeluBias = 3, kBGrad = 4, kDGeluBGrad = 5 };

// What decides how an epilogue runs.
struct EpilogueCase {
  int epilogue = kNone;
  bool fusedAllowed = true;  // NODETRON_CUDA_EPILOGUES is not 0
  bool aux = false;          // a GELU forward writes its pre-activation into aux
  bool auxFits = true;       // cuBLASLt's aux rules hold (leading dimension and batch stride % 8, 16-byte aligned)
  bool heuristicFound = true;     // cuBLASLt's heuristic offered an algorithm with the epilogue
  bool fusedNotSupported = false;  // cublasLtMatmul then answered CUBLAS_STATUS_NOT_SUPPORTED
  bool betaZero = true;
  int64_t batch = 1, m = 0, n = 0, strideC = 0;
};

// How it runs. fused: cuBLASLt's epilogue. Otherwise the plain GEMM writes `intoAux ? aux : C`
// (C's old values copied into aux first when beta != 0 and intoAux, so beta·C is still added) and
// the epilogue follows as kernels, over the whole [batch·M, N] block or one matrix at a time when
// the batch is strided (C's batch stride is not M·N).
struct EpiloguePlan {
  bool fused = false;
  bool intoAux = false;
  bool copyCToAux = false;
  bool perMatrix = false;
};

inline bool isGeluForward(int e) { return e == kGelu || e == kGeluBias; }

inline EpiloguePlan planEpilogue(const EpilogueCase& c) {
  EpiloguePlan p;
  if (c.epilogue == kNone) return p;
  p.fused = c.fusedAllowed && c.auxFits && c.heuristicFound && !c.fusedNotSupported;
  if (p.fused) return p;
  p.intoAux = isGeluForward(c.epilogue) && c.aux;
  p.copyCToAux = p.intoAux && !c.betaZero;
  // The bias kernel takes the batch stride itself; bgrad and dgelu+bgrad take one matrix.
  p.perMatrix = c.batch > 1 && c.strideC != c.m * c.n && isGeluForward(c.epilogue);
  return p;
}

// The cuBLASLt workspaces of one device, one per stream (GEMMs on different streams may overlap).
// A stream's workspace is allocated by its first GEMM and released when the stream is destroyed
// (a graph's side stream with the graph) or at teardown. P is the pointer type.
template <typename P>
class WorkspaceTable {
 public:
  // The stream's workspace, or null (then the caller allocates one and add()s it).
  P find(int64_t stream) const {
    auto it = byStream_.find(stream);
    return it == byStream_.end() ? P{} : it->second.first;
  }
  // Records `p` of `bytes` for `stream`; false (and nothing recorded) when the stream already has
  // one (another thread won the race: the caller frees its own).
  bool add(int64_t stream, P p, size_t bytes) {
    if (!byStream_.emplace(stream, std::make_pair(p, bytes)).second) return false;
    bytes_ += bytes;
    return true;
  }
  // Removes the stream's workspace and returns it (null when it had none) for the caller to free.
  P remove(int64_t stream) {
    auto it = byStream_.find(stream);
    if (it == byStream_.end()) return P{};
    P p = it->second.first;
    bytes_ -= it->second.second;
    byStream_.erase(it);
    return p;
  }
  // Removes them all (teardown) and returns them.
  std::vector<P> removeAll() {
    std::vector<P> out;
    for (auto& [s, e] : byStream_) out.push_back(e.first);
    byStream_.clear();
    bytes_ = 0;
    return out;
  }
  size_t count() const { return byStream_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  std::map<int64_t, std::pair<P, size_t>> byStream_;
  size_t bytes_ = 0;
};

}  // namespace nt::cuda::lt
