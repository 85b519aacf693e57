// Random fills on the cpu backend from the shared Philox generator (native/core/philox.h).
#include "../../core/philox.h"
#include "convert.h"

namespace nt::cpu {

static uint64_t seedArg(const Args& a, size_t i) {
  // Seeds travel as two 32-bit halves: JS numbers cannot hold every 64-bit value.
  return (uint64_t(a.size(i)) << 32) | uint64_t(a.size(i + 1));
}

// random_fill(storage, dtype, n, kind, seedHi, seedLo, baseBlock, firstElement, a, b)
//   element i of the storage is element firstElement + i of the draw that starts at baseBlock
//   kind 0: uniform in [a, b); kind 1: normal with mean a and std b; kind 2: bernoulli(p=a) as 0/1
NT_KERNEL("random_fill", RandomFill) {
  DType dt = a.dtype("dtype");
  int64_t n = a.size("n");
  int64_t kind = a.int64("kind");
  uint64_t seed = seedArg(a, 4);
  uint64_t base = uint64_t(a.size("baseBlock"));
  uint64_t first = uint64_t(a.size("firstElement"));
  float p0 = float(a.number("a")), p1 = float(a.number("b"));
  if (kind < 0 || kind > 2) fail(Err::Argument, "random_fill: unknown distribution " + std::to_string(kind));
  uint8_t* d = storageData(info, a.at("storage", "so"), call, dt, n);
  F32View out(d, dt, n, false);
  float* o = out.data();
  if (kind == 0) {
    for (int64_t i = 0; i < n; i++) o[i] = p0 + (p1 - p0) * philox::uniform(seed, base, first + uint64_t(i));
  } else if (kind == 1) {
    for (int64_t i = 0; i < n; i++) o[i] = p0 + p1 * philox::normal(seed, base, first + uint64_t(i));
  } else {
    for (int64_t i = 0; i < n; i++) o[i] = philox::uniform(seed, base, first + uint64_t(i)) < p0 ? 1.0f : 0.0f;
  }
  out.commit();
}

}  // namespace nt::cpu
