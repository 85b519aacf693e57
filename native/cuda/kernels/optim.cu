// Multi-tensor AdamW and LAMB on the cuda backend: one launch updates every parameter of a list
// (a device table of tensor pointers and fixed-size chunks), with f32 moments, parameters in f32 or
// bf16/f16, gradients in any float dtype and an optional gradient scale (1 / loss scale).
#include <vector>

#include "common.cuh"

namespace nt::cuda {

constexpr int64_t kChunk = 65536;

struct TensorEntry {
  void* param;
  const void* grad;
  float* m;
  float* v;
  int64_t n;
};
struct Chunk {
  int32_t tensor;
  int64_t start;
};
struct Hyper {
  float lr, beta1, beta2, eps, weightDecay, gradScale, bias1, bias2;
};

// The AdamW direction of one element after updating its moments (weight decay decoupled).
template <typename G>
__device__ __forceinline__ float adamUpdate(const TensorEntry& t, int64_t i, const Hyper& h) {
  float g = toF32(static_cast<const G*>(t.grad)[i]) * h.gradScale;
  float m = h.beta1 * t.m[i] + (1.0f - h.beta1) * g;
  float v = h.beta2 * t.v[i] + (1.0f - h.beta2) * g * g;
  t.m[i] = m;
  t.v[i] = v;
  return (m / h.bias1) / (sqrtf(v / h.bias2) + h.eps);
}

template <typename P, typename G>
__global__ void adamwKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h) {
  Chunk c = chunks[blockIdx.x];
  TensorEntry t = tensors[c.tensor];
  int64_t end = min(c.start + kChunk, t.n);
  P* p = static_cast<P*>(t.param);
  for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
    float u = adamUpdate<G>(t, i, h);
    float w = toF32(p[i]);
    p[i] = fromF32<P>(w - h.lr * (u + h.weightDecay * w));
  }
}

// LAMB phase 1: moments, and per tensor the squared norms of the weights and of the update.
template <typename P, typename G>
__global__ void lambNormsKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h, float* norms) {
  __shared__ float scratch[32];
  Chunk c = chunks[blockIdx.x];
  TensorEntry t = tensors[c.tensor];
  int64_t end = min(c.start + kChunk, t.n);
  const P* p = static_cast<const P*>(t.param);
  float pw = 0.0f, uu = 0.0f;
  for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
    float w = toF32(p[i]);
    float u = adamUpdate<G>(t, i, h) + h.weightDecay * w;
    pw += w * w;
    uu += u * u;
  }
  pw = blockSum(pw, scratch);
  uu = blockSum(uu, scratch);
  if (threadIdx.x == 0) {
    atomicAdd(norms + 2 * c.tensor, pw);
    atomicAdd(norms + 2 * c.tensor + 1, uu);
  }
}

// LAMB phase 2: the update recomputed from the new moments, scaled by the trust ratio |w| / |u|.
template <typename P>
__global__ void lambApplyKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h, const float* norms) {
  Chunk c = chunks[blockIdx.x];
  TensorEntry t = tensors[c.tensor];
  int64_t end = min(c.start + kChunk, t.n);
  float wn = sqrtf(norms[2 * c.tensor]), un = sqrtf(norms[2 * c.tensor + 1]);
  float trust = wn > 0.0f && un > 0.0f ? wn / un : 1.0f;
  P* p = static_cast<P*>(t.param);
  for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
    float w = toF32(p[i]);
    float u = (t.m[i] / h.bias1) / (sqrtf(t.v[i] / h.bias2) + h.eps) + h.weightDecay * w;
    p[i] = fromF32<P>(w - h.lr * trust * u);
  }
}

static Napi::Array storageList(const Napi::CallbackInfo& info, size_t i, const char* call) {
  if (!info[i].IsArray()) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must be an array of storages");
  return info[i].As<Napi::Array>();
}

// adamw|lamb(params[], grads[], expAvg[], expAvgSq[], paramDtype, gradDtype, lr, beta1, beta2, eps,
//            weightDecay, step, gradScale): moments are f32; element counts come from the params.
static Napi::Value multiTensor(const Napi::CallbackInfo& info, const char* call, bool lamb) {
  Args a{info, call};
  a.count(13);
  Napi::Array ps = storageList(info, 0, call), gs = storageList(info, 1, call), ms = storageList(info, 2, call),
              vs = storageList(info, 3, call);
  DType pt = a.dtype(4), gt = a.dtype(5);
  uint32_t count = ps.Length();
  if (gs.Length() != count || ms.Length() != count || vs.Length() != count)
    fail(Err::Argument, std::string(call) + ": params, grads and both moment lists must have the same length");
  double step = a.number(11);
  if (!(step >= 1)) fail(Err::Argument, std::string(call) + ": step counts from 1");
  Hyper h{float(a.number(6)), float(a.number(7)), float(a.number(8)), float(a.number(9)), float(a.number(10)),
          float(a.number(12)), 0.0f, 0.0f};
  h.bias1 = float(1.0 - std::pow(double(h.beta1), step));
  h.bias2 = float(1.0 - std::pow(double(h.beta2), step));
  std::vector<TensorEntry> tensors(count);
  std::vector<Chunk> chunks;
  int device = -1;
  for (uint32_t t = 0; t < count; t++) {
    DeviceStorage* p = DeviceStorage::From(ps.Get(t), call, 0);
    int64_t n = int64_t(p->bytes() / dtypeSize(pt));
    DeviceStorage* parts[4] = {p, DeviceStorage::From(gs.Get(t), call, 1), DeviceStorage::From(ms.Get(t), call, 2),
                               DeviceStorage::From(vs.Get(t), call, 3)};
    if (device < 0) device = p->device();
    for (DeviceStorage* s : parts)
      if (s->device() != device) fail(Err::Device, std::string(call) + ": all tensors must be on one device");
    parts[1]->checkRange(0, size_t(n) * dtypeSize(gt), call);
    parts[2]->checkRange(0, size_t(n) * 4, call);
    parts[3]->checkRange(0, size_t(n) * 4, call);
    tensors[t] = {p->data(), parts[1]->data(), reinterpret_cast<float*>(parts[2]->data()),
                  reinterpret_cast<float*>(parts[3]->data()), n};
    for (int64_t s = 0; s < n; s += kChunk) chunks.push_back({int32_t(t), s});
  }
  if (chunks.empty()) return info.Env().Undefined();
  useDevice(device);
  cudaStream_t st = currentStream(device);
  size_t tableBytes = tensors.size() * sizeof(TensorEntry), chunkBytes = chunks.size() * sizeof(Chunk);
  size_t normBytes = lamb ? size_t(count) * 2 * sizeof(float) : 0;
  auto* table = static_cast<uint8_t*>(deviceAlloc(device, tableBytes + chunkBytes + normBytes + 16, call));
  // Pageable-to-device copies return once the host data is staged, so the vectors may go out of scope.
  check(cudaMemcpyAsync(table, tensors.data(), tableBytes, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
  auto* dChunks = reinterpret_cast<Chunk*>(table + (tableBytes + 15) / 16 * 16);
  check(cudaMemcpyAsync(dChunks, chunks.data(), chunkBytes, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
  float* norms = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(dChunks) + chunkBytes);
  auto* dTensors = reinterpret_cast<TensorEntry*>(table);
  unsigned blocks = unsigned(chunks.size());
  try {
    if (lamb) check(cudaMemsetAsync(norms, 0, normBytes, st), "cudaMemsetAsync");
    NT_DISPATCH_FLOAT(pt, call, P, NT_DISPATCH_FLOAT(gt, call, G, {
      if (!lamb) {
        adamwKernel<P, G><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h);
      } else {
        lambNormsKernel<P, G><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h, norms);
        lambApplyKernel<P><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h, norms);
      }
    }));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail(Err::Native, std::string(call) + ": kernel launch failed: " + cudaGetErrorString(e));
  } catch (...) {
    deviceFree(device, table);
    throw;
  }
  deviceFree(device, table);  // stream-ordered: reused only by later work on this stream
  return info.Env().Undefined();
}

static Napi::Value Adamw(const Napi::CallbackInfo& info) { return multiTensor(info, "adamw", false); }
static Napi::Value Lamb(const Napi::CallbackInfo& info) { return multiTensor(info, "lamb", true); }
NT_EXPORT("adamw", Adamw);
NT_EXPORT("lamb", Lamb);

}  // namespace nt::cuda
