// NT_HD marks a function that both backends compile: __host__ __device__ (inlined) under nvcc, a
// plain inline function in the cpu addon. For code that must give identical results on cpu and cuda.
#pragma once

#ifdef __CUDACC__
#define NT_HD __host__ __device__ __forceinline__
#else
#define NT_HD inline
#endif
