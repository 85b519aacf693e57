// What the emulation build (run.sh) uses as native/cuda/runtime.h: the few declarations of nt.h and
// runtime.h that common.cuh and the kernels need, with host memory for device allocations.
#pragma once
#include "../../emu_cuda.h"  // (this file is native/cuda/runtime.h in the emulation build)
#include <vector>
#include <string>
#include "../core/half.h"
namespace nt {
enum class DType : int32_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3, U8 = 4 };
enum class Err { Argument, Shape, DType, Device, Disposed, OutOfMemory, BackendUnavailable, Native, Comm, Timeout };
[[noreturn]] inline void fail(Err, const std::string& m) { throw std::runtime_error(m); }
inline const char* dtypeName(DType) { return "?"; }
inline size_t dtypeSize(DType t) { return t == DType::F32 || t == DType::I32 ? 4 : t == DType::U8 ? 1 : 2; }
inline int64_t product(const std::vector<int64_t>& s) { int64_t p = 1; for (auto v : s) p *= v; return p; }
}
namespace nt::cuda {
inline long g_allocs = 0;
inline void check(int st, const char* c) { if (st) throw std::runtime_error(c); }
inline void* deviceAlloc(int, size_t b, const char*) { g_allocs++; return std::aligned_alloc(256, (b + 255) / 256 * 256 + 256); }
inline void deviceFree(int, void* p) { std::free(p); }
}
