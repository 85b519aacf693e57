// Bias + GELU (tanh approximation, as GPT-2 uses) on the cuda backend: forward y = gelu(x + bias)
// and backward dx = dy * gelu'(x + bias); bias is per column of a [rows, cols] view and optional.
#include "call.cuh"

namespace nt::cuda {

__device__ __forceinline__ float geluTanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float geluTanhGrad(float x) {
  const float c = 0.7978845608028654f;
  float u = c * (x + 0.044715f * x * x * x), t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

struct GeluF {
  __device__ __forceinline__ float operator()(float x, float, float) const { return geluTanh(x); }
};
// (dy, x) -> dy · gelu'(x)
struct GeluGradF {
  __device__ __forceinline__ float operator()(float dy, float x, float) const { return dy * geluTanhGrad(x); }
};

// gelu_forward(inp, out, n, dtype) and gelu_backward(inp, gradOut, gradIn, n, dtype): the cpu
// backend's signatures (no bias) over the same kernels.
NT_CUDA_KERNEL("gelu_forward", GeluForward) {
  int64_t n = k.args.size("n");
  DType dt = k.args.dtype("dtype");
  void* x = k.data("inp", dt, n);
  void* y = k.data("out", dt, n);
  mapCall(k, dt, GeluF{}, x, nullptr, nullptr, y, n);
}

NT_CUDA_KERNEL("gelu_backward", GeluBackward) {
  int64_t n = k.args.size("n");
  DType dt = k.args.dtype("dtype");
  void* x = k.data("inp", dt, n);
  void* dy = k.data("gradOut", dt, n);
  void* dx = k.data("gradIn", dt, n);
  mapCall(k, dt, GeluGradF{}, dy, x, nullptr, dx, n);
}

// pre += bias per column (stored in pre's dtype), out = gelu(pre as stored); bias non-null. Rows are
// walked by blockIdx.y (in strides of gridDim.y), a row's columns by the x threads, so no index is
// divided. vec: cols is a multiple of vecWidth<T>() and every pointer is 16-byte aligned (so is every
// row), and the columns go in 16-byte packs.
template <typename T>
__global__ void biasGeluForwardKernel(T* pre, const T* bias, T* y, int64_t rows, int64_t cols, bool vec) {
  constexpr int N = vecWidth<T>();
  using P = Pack<T, N>;
  int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    T* pr = pre + r * cols;
    T* yr = y + r * cols;
    if (vec) {
      for (int64_t c = first; c < cols / N; c += stride) {
        P p = reinterpret_cast<const P*>(pr)[c], b = reinterpret_cast<const P*>(bias)[c], o;
#pragma unroll
        for (int k = 0; k < N; k++) {
          p.v[k] = fromF32<T>(toF32(p.v[k]) + toF32(b.v[k]));
          o.v[k] = fromF32<T>(geluTanh(toF32(p.v[k])));
        }
        reinterpret_cast<P*>(pr)[c] = p;
        reinterpret_cast<P*>(yr)[c] = o;
      }
    } else {
      for (int64_t c = first; c < cols; c += stride) {
        T stored = fromF32<T>(toF32(pr[c]) + toF32(bias[c]));
        pr[c] = stored;
        yr[c] = fromF32<T>(geluTanh(toF32(stored)));
      }
    }
  }
}

// Launches bias_gelu_forward over a non-empty [rows, cols] on `st` (bias may be null).
template <typename T>
static void launchBiasGeluForward(cudaStream_t st, T* pre, const T* bias, T* y, int64_t rows, int64_t cols) {
  if (!bias) {
    launchMap3<T>(st, GeluF{}, pre, nullptr, nullptr, y, rows * cols);
    return;
  }
  bool vec = cols % vecWidth<T>() == 0 && alignedTo(pre, 16) && alignedTo(bias, 16) && alignedTo(y, 16);
  int64_t units = vec ? cols / vecWidth<T>() : cols;
  unsigned threads = units >= 256 ? 256 : unsigned((units + 31) / 32 * 32);
  int64_t bx = (units + threads - 1) / threads;
  dim3 grid(unsigned(bx < 65535 ? bx : 65535), unsigned(rows < 65535 ? rows : 65535));
  biasGeluForwardKernel<T><<<grid, threads, 0, st>>>(pre, bias, y, rows, cols, vec);
}

// Row r, column j of the stored gradPre for the bias gradient's column sums (launchColumnSums).
template <typename T>
struct ColumnRead {
  const T* g;
  int64_t cols;
  __device__ __forceinline__ int64_t column(int64_t c) const { return c; }
  __device__ __forceinline__ void add(int64_t j, int64_t r, double* acc) const { acc[0] += double(toF32(g[r * cols + j])); }
};

// Host helpers for gemm.cu's epilogue fallbacks (cuBLASLt offers no algorithm for an epilogue, or
// the aux leading dimension is not a multiple of 8): the kernels of bias_gelu_forward/backward.
// pre += bias, y = gelu(pre) over a [rows, cols] view (bias may be null; y may be pre).
void launchGeluEpilogue(DType dt, cudaStream_t st, void* pre, const void* bias, void* y, int64_t rows, int64_t cols, const char* call) {
  if (rows <= 0 || cols <= 0) return;
  NT_DISPATCH_FLOAT(dt, call, T, launchBiasGeluForward<T>(st, static_cast<T*>(pre), static_cast<const T*>(bias), static_cast<T*>(y), rows, cols));
}
// d = dy · gelu'(pre) over a [rows, cols] view (d may be dy), then dbias (if not null) = d's column sums.
void launchGeluGrad(int device, DType dt, cudaStream_t st, const void* pre, const void* dy, void* d, void* dbias, int64_t rows, int64_t cols,
                    const char* call) {
  if (cols <= 0) return;
  NT_DISPATCH_FLOAT(dt, call, T, {
    launchMap3<T>(st, GeluGradF{}, static_cast<const T*>(dy), static_cast<const T*>(pre), nullptr, static_cast<T*>(d), rows * cols);
    if (dbias)
      launchColumnSums<1>(device, st, ColumnRead<T>{static_cast<const T*>(d), cols}, rows, cols, static_cast<T*>(dbias),
                          static_cast<T*>(nullptr), call);
  });
}
// d = d · gelu'(pre) in place, then dbias (if not null) = its column sums.
void launchDGeluBGrad(int device, DType dt, cudaStream_t st, const void* pre, void* d, void* dbias, int64_t rows, int64_t cols,
                      const char* call) {
  launchGeluGrad(device, dt, st, pre, d, d, dbias, rows, cols, call);
}


// bias_gelu_forward(pre, bias|null, out, rows, cols, dtype): pre += bias in place, out = gelu(pre).
NT_CUDA_KERNEL("bias_gelu_forward", BiasGeluForward) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols"), n = rows * cols;
  DType dt = k.args.dtype("dtype");
  void* pre = k.data("pre", dt, n);
  void* bias = k.optional("bias", dt, cols);
  void* y = k.data("out", dt, n);
  if (n == 0) return;
  launchGeluEpilogue(dt, k.stream(), pre, bias, y, rows, cols, call);
}

// bias_gelu_backward(pre, gradOut, gradPre, gradBias|null, rows, cols, dtype): gradPre = gradOut · gelu'(pre),
// gradBias (overwritten) = column sums of gradPre as stored.
NT_CUDA_KERNEL("bias_gelu_backward", BiasGeluBackward) {
  int64_t rows = k.args.size("rows"), cols = k.args.size("cols"), n = rows * cols;
  DType dt = k.args.dtype("dtype");
  void* pre = k.data("pre", dt, n);
  void* dy = k.data("gradOut", dt, n);
  void* dpre = k.data("gradPre", dt, n);
  void* dbias = k.optional("gradBias", dt, cols);
  if (cols == 0) return;
  launchGeluGrad(k.device(), dt, k.stream(), pre, dy, dpre, dbias, rows, cols, call);
}

}  // namespace nt::cuda
