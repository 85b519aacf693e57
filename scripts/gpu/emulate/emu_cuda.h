// A CPU emulation of the CUDA execution model for testing kernels without a GPU: blocks run one after
// another, the threads of a block run as real std::threads, __syncthreads is a block barrier and
// __shfl_xor_sync a warp barrier around a shared exchange buffer.
#pragma once
#include <barrier>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <algorithm>
using std::max;
using std::min;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 { unsigned x, y, z; };
inline thread_local uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
typedef void* cudaStream_t;
typedef int cudaError_t;
inline std::barrier<>* g_block;
inline std::vector<std::unique_ptr<std::barrier<>>> g_warps;
alignas(16) inline unsigned char g_shfl[1024 * 8];
inline long g_launches = 0, g_blocksRun = 0;
inline void __syncthreads() { g_block->arrive_and_wait(); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int o) {
  T* buf = reinterpret_cast<T*>(g_shfl);
  auto& w = *g_warps[threadIdx.x / 32];
  buf[threadIdx.x] = v;
  w.arrive_and_wait();
  T r = buf[threadIdx.x ^ unsigned(o)];
  w.arrive_and_wait();
  return r;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { std::memset(p, v, n); return 0; }
template <class... P, class... A>
void emuLaunch(void (*k)(P...), dim3 grid, dim3 block, size_t, cudaStream_t, A... args) {
  if (block.x < 1 || block.x > 1024 || block.y != 1 || block.z != 1) throw std::runtime_error("bad block " + std::to_string(block.x));
  if (grid.x < 1 || grid.y < 1 || grid.y > 65535 || grid.z != 1 || grid.x > 2147483647u) throw std::runtime_error("bad grid");
  g_launches++;
  gridDim = grid;
  blockDim = block;
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      std::barrier<> bar(block.x);
      g_block = &bar;
      g_warps.clear();
      for (unsigned w = 0; w * 32 < block.x; w++) g_warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, block.x - w * 32)));
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < block.x; t++)
        ts.emplace_back([=] {
          threadIdx = uint3{t, 0, 0};
          blockIdx = uint3{bx, by, 0};
          k(args...);
        });
      for (auto& t : ts) t.join();
      g_blocksRun++;
    }
}
