// Attention on the cuda backend (native/cpu/kernels/attention.cc is the reference): the masked,
// scaled softmax between the two per-head GEMMs (scores = q·kᵀ and out = probs·v run through the
// gemm kernel; lib/ops/attention.ts composes them). Causal and sliding-window masks.
#include "softmax.cuh"

namespace nt::cuda {

// Row r of [batch·tq, tk] scores: query i = r mod tq (aligned to the last tq keys) sees keys [lo, hi);
// probs = softmax(scale · scores) there and 0 elsewhere (rows that see no key are all 0).
template <typename T>
__global__ void attentionSoftmaxKernel(const T* scores, T* probs, int64_t tq, int64_t tk, float scale, bool causal, int64_t window) {
  __shared__ float scratch[32];
  int64_t r = blockIdx.x, i = r % tq, shift = tk - tq;
  int64_t hi = causal ? (i + shift + 1 < tk ? i + shift + 1 : tk) : tk;
  int64_t lo = window > 0 && i + shift - window + 1 > 0 ? i + shift - window + 1 : 0;
  const T* x = scores + r * tk;
  T* y = probs + r * tk;
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) mx = fmaxf(mx, toF32(x[j]) * scale);
  mx = blockMax(mx, scratch);
  float s = 0.0f;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) s += expf(toF32(x[j]) * scale - mx);
  s = blockSum(s, scratch);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < tk; j += blockDim.x)
    y[j] = fromF32<T>(j >= lo && j < hi ? expf(toF32(x[j]) * scale - mx) * inv : 0.0f);
}

// attention_softmax_forward(scores, probs, batch, tq, tk, scale, causal, window, dtype): see attentionSoftmaxKernel.
NT_CUDA_KERNEL("attention_softmax_forward", AttentionSoftmaxForward) {
  int64_t batch = k.args.size("batch"), tq = k.args.size("tq"), tk = k.args.size("tk");
  float scale = float(k.args.number("scale"));
  bool causal = k.args.boolean("causal");
  int64_t window = k.args.size("window");
  DType dt = k.args.dtype("dtype");
  if (tq > tk && causal) fail(Err::Shape, "attention_softmax_forward: causal attention needs tq <= tk");
  int64_t n = batch * tq * tk;
  void* s = k.data("scores", dt, n);
  void* p = k.data("probs", dt, n);
  if (n == 0) return;
  NT_LAUNCH_FLOAT(k, dt, attentionSoftmaxKernel, unsigned(batch * tq), rowThreads(tk),
                  static_cast<const T*>(s), static_cast<T*>(p), tq, tk, scale, causal, window);
}

// attention_softmax_backward(probs, gradProbs, gradScores, batch, tq, tk, scale, dtype): masked entries (probs 0) get 0.
NT_CUDA_KERNEL("attention_softmax_backward", AttentionSoftmaxBackward) {
  int64_t batch = k.args.size("batch"), tq = k.args.size("tq"), tk = k.args.size("tk");
  float scale = float(k.args.number("scale"));
  DType dt = k.args.dtype("dtype");
  int64_t n = batch * tq * tk;
  void* p = k.data("probs", dt, n);
  void* g = k.data("gradProbs", dt, n);
  void* o = k.data("gradScores", dt, n);
  if (n == 0) return;
  NT_LAUNCH_FLOAT(k, dt, softmaxBackwardKernel, unsigned(batch * tq), rowThreads(tk),
                  static_cast<const T*>(p), static_cast<const T*>(g), static_cast<T*>(o), tk, false, scale);
}

}  // namespace nt::cuda
