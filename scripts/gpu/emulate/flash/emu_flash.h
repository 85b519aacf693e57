// Extras for emulating native/cuda/kernels/flash_attention.cu under ../emu_cuda.h: dynamic shared memory
// (one buffer; test_flash.cc fills it with 0xFF before each launch, so an uninitialized read shows as NaN), __syncwarp,
// the bf16/f16 MMA element types, and nvcuda::wmma with every lane holding the whole 16x16 fragment
// (loads and stores bracketed by warp barriers, one lane storing).
#pragma once
#define __launch_bounds__(x)
#define __align__(x)
inline std::vector<unsigned char> g_dyn(1 << 20);
inline void __syncwarp(unsigned = 0xffffffffu) { g_warps[threadIdx.x / 32]->arrive_and_wait(); }
struct __nv_bfloat16 { uint16_t x; };
struct __half { uint16_t x; };
inline __nv_bfloat16 __float2bfloat16(float f) { return {nt::f32ToBf16(f)}; }
inline __half __float2half(float f) { return {nt::f32ToF16(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return nt::bf16ToF32(h.x); }
inline float __half2float(__half h) { return nt::f16ToF32(h.x); }
inline float emuF(__nv_bfloat16 h) { return __bfloat162float(h); }
inline float emuF(__half h) { return __half2float(h); }
inline float emuF(float f) { return f; }
typedef int cudaFuncAttribute;
constexpr int cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaSuccess = 0;
inline const char* cudaGetErrorString(int) { return "?"; }
template <class F> int cudaFuncSetAttribute(F, int, int) { return 0; }
namespace nvcuda::wmma {
struct row_major {}; struct col_major {}; struct matrix_a {}; struct matrix_b {}; struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class L = void>
struct fragment { float v[16][16]; };
inline void wsync() { g_warps[threadIdx.x / 32]->arrive_and_wait(); }
template <class Use, class T, class L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float x) { for (auto& r : f.v) for (auto& e : r) e = x; }
template <class Use, class T, class P>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major>& f, const P* p, unsigned ld) {
  wsync(); for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) f.v[i][j] = emuF(p[i * ld + j]); wsync();
}
template <class Use, class T, class P>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major>& f, const P* p, unsigned ld) {
  wsync(); for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) f.v[i][j] = emuF(p[j * ld + i]); wsync();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float, void>& f, const float* p, unsigned ld, layout_t l) {
  wsync(); for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) f.v[i][j] = l == mem_row_major ? p[i * ld + j] : p[j * ld + i]; wsync();
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float, void>& f, unsigned ld, layout_t l) {
  wsync();
  if (threadIdx.x % 32 == 0) for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) (l == mem_row_major ? p[i * ld + j] : p[j * ld + i]) = f.v[i][j];
  wsync();
}
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float, void>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a, const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float, void>& c) {
  float r[16][16];
  for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) { float s = c.v[i][j]; for (int k = 0; k < 16; k++) s += a.v[i][k] * b.v[k][j]; r[i][j] = s; }
  for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) d.v[i][j] = r[i][j];
}
}
