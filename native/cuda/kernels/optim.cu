// Multi-tensor AdamW and LAMB on the cuda backend: one launch updates every parameter of a list
// (a device table of tensor pointers and fixed-size chunks), with f32 moments, parameters in f32 or
// bf16/f16, gradients in any float dtype and an optional gradient scale (1 / loss scale).
#include <map>
#include <vector>

#include "../../core/arg_lists.h"
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

// AdamW's metadata on the device (adamw_step_meta): 16 bytes, lr as f64 at 0, the step as i32 at 8.
// Null for adamw_step, whose lr and bias corrections come in Hyper.
struct DeviceMeta {
  const uint8_t* meta;
  double beta1, beta2;
};

// One chunk of the multi-tensor AdamW update (the body of both kernels below).
template <typename P, typename G>
__device__ __forceinline__ void adamwChunk(const TensorEntry* tensors, const Chunk* chunks, const Hyper& h) {
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

template <typename P, typename G>
__global__ void adamwKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h) {
  adamwChunk<P, G>(tensors, chunks, h);
}

// adamw_step_meta: lr and step read when the kernel runs (a captured graph replays with the values
// written before the replay), the bias corrections in the same double arithmetic as adamw_step's host code.
template <typename P, typename G>
__global__ void adamwMetaKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h, DeviceMeta dm) {
  double lr = *reinterpret_cast<const double*>(dm.meta);
  int32_t step = *reinterpret_cast<const int32_t*>(dm.meta + 8);
  h.lr = float(lr);
  h.bias1 = float(1.0 - pow(dm.beta1, double(step)));
  h.bias2 = float(1.0 - pow(dm.beta2, double(step)));
  adamwChunk<P, G>(tensors, chunks, h);
}

// LAMB phase 1: moments, and per chunk the squared norms of the weights and of the update (double,
// as the cpu kernel), at chunkNorms[2·chunk] and [2·chunk + 1]: no atomics, so phase 1b adds them in
// chunk order and the norms are the same on every run.
template <typename P, typename G>
__global__ void lambNormsKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h, double* chunkNorms) {
  __shared__ double scratch[32];
  Chunk c = chunks[blockIdx.x];
  TensorEntry t = tensors[c.tensor];
  int64_t end = min(c.start + kChunk, t.n);
  const P* p = static_cast<const P*>(t.param);
  double pw = 0.0, uu = 0.0;
  for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
    float w = toF32(p[i]);
    float u = adamUpdate<G>(t, i, h) + h.weightDecay * w;
    pw += double(w) * double(w);
    uu += double(u) * double(u);
  }
  pw = blockSumD(pw, scratch);
  uu = blockSumD(uu, scratch);
  if (threadIdx.x == 0) {
    chunkNorms[2 * blockIdx.x] = pw;
    chunkNorms[2 * blockIdx.x + 1] = uu;
  }
}

// LAMB phase 1b: tensor k's norms = the sums of its chunks' (chunks firstChunk[k] .. firstChunk[k + 1] - 1)
// in chunk order.
__global__ void lambTensorNormsKernel(const double* chunkNorms, const int32_t* firstChunk, double* norms, int64_t count) {
  NT_GRID_STRIDE(k, count) {
    double pw = 0.0, uu = 0.0;
    for (int32_t c = firstChunk[k]; c < firstChunk[k + 1]; c++) {
      pw += chunkNorms[2 * c];
      uu += chunkNorms[2 * c + 1];
    }
    norms[2 * k] = pw;
    norms[2 * k + 1] = uu;
  }
}

// LAMB phase 2: the update recomputed from the new moments, scaled by the trust ratio |w| / |u| (in
// double, as the cpu kernel: p -= float(lr · ratio) · u).
template <typename P>
__global__ void lambApplyKernel(const TensorEntry* tensors, const Chunk* chunks, Hyper h, const double* norms) {
  Chunk c = chunks[blockIdx.x];
  TensorEntry t = tensors[c.tensor];
  int64_t end = min(c.start + kChunk, t.n);
  double pw = norms[2 * c.tensor], uu = norms[2 * c.tensor + 1];
  double trust = pw > 0.0 && uu > 0.0 ? sqrt(pw) / sqrt(uu) : 1.0;
  float stepSize = float(double(h.lr) * trust);
  P* p = static_cast<P*>(t.param);
  for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
    float w = toF32(p[i]);
    float u = (t.m[i] / h.bias1) / (sqrtf(t.v[i] / h.bias2) + h.eps) + h.weightDecay * w;
    p[i] = fromF32<P>(w - stepSize * u);
  }
}

// Runs AdamW (or LAMB) over `tensors` (all with parameter dtype pt, gradient dtype gt) on the device's
// current stream. For LAMB, `norms` (when given) receives each tensor's squared weight and update norms,
// which makes the call wait for the stream.
static void launchMultiTensor(int device, const std::vector<TensorEntry>& tensors, DType pt, DType gt, const Hyper& h, bool lamb,
                              std::vector<double>* norms, const char* call, DeviceMeta dm = {nullptr, 0.0, 0.0}) {
  std::vector<Chunk> chunks;
  std::vector<int32_t> firstChunk;  // tensor k's chunks: firstChunk[k] .. firstChunk[k + 1] - 1
  for (size_t t = 0; t < tensors.size(); t++) {
    firstChunk.push_back(int32_t(chunks.size()));
    for (int64_t s = 0; s < tensors[t].n; s += kChunk) chunks.push_back({int32_t(t), s});
  }
  firstChunk.push_back(int32_t(chunks.size()));
  if (norms) norms->assign(tensors.size() * 2, 0.0);
  if (chunks.empty()) return;
  useDevice(device);
  cudaStream_t st = currentStream(device);
  size_t count = tensors.size();
  auto align16 = [](size_t b) { return (b + 15) / 16 * 16; };
  // One allocation: tensor table | chunks | LAMB: per-chunk norms | per-tensor norms | firstChunk.
  size_t tableBytes = align16(count * sizeof(TensorEntry)), chunkBytes = align16(chunks.size() * sizeof(Chunk));
  size_t chunkNormBytes = lamb ? align16(chunks.size() * 2 * sizeof(double)) : 0, normBytes = lamb ? align16(count * 2 * sizeof(double)) : 0;
  size_t firstBytes = lamb ? align16(firstChunk.size() * sizeof(int32_t)) : 0;
  unsigned blocks = unsigned(chunks.size());
  if (dm.meta && !lamb) {
    std::string key(reinterpret_cast<const char*>(tensors.data()), count * sizeof(TensorEntry));
    key.append(reinterpret_cast<const char*>(chunks.data()), chunks.size() * sizeof(Chunk));
    // adamw_step_meta's device tables (tensor table | chunks), kept for the process: keyed by their
    // exact bytes (pointers, sizes, chunk starts), so a hit is always the table this call would upload.
    // A captured CUDA graph cannot upload one (a copy from pageable host memory, freed after the call),
    // so a capture reuses the table its eager warm-up step uploaded. At most kMetaTables tables (a few
    // KiB each); past that, calls upload per call as adamw_step does, and a capture of such a call is refused.
    constexpr size_t kMetaTables = 64;
    static auto* tables = new std::map<std::pair<int, std::string>, uint8_t*>();  // never destroyed: lives as the process
    auto& cache = *tables;
    auto it = cache.find({device, key});
    uint8_t* cached = it == cache.end() ? nullptr : it->second;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(st, &capture), "cudaStreamIsCapturing");
    if (!cached && capture != cudaStreamCaptureStatusNone) {
      fail(Err::Native, std::string(call) + ": no device table for these parameters yet (run one step eagerly before capturing it into a CUDA graph)", call);
    }
    if (!cached && cache.size() < kMetaTables) {
      cached = static_cast<uint8_t*>(deviceAlloc(device, tableBytes + chunkBytes, call));
      try {
        check(cudaMemcpyAsync(cached, tensors.data(), count * sizeof(TensorEntry), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
        check(cudaMemcpyAsync(cached + tableBytes, chunks.data(), chunks.size() * sizeof(Chunk), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
      } catch (...) {
        deviceFree(device, cached);
        throw;
      }
      cache[{device, key}] = cached;
    }
    if (cached) {
      NT_DISPATCH_FLOAT(pt, call, P, NT_DISPATCH_FLOAT(gt, call, G, {
        adamwMetaKernel<P, G><<<blocks, kThreads, 0, st>>>(reinterpret_cast<const TensorEntry*>(cached), reinterpret_cast<const Chunk*>(cached + tableBytes), h, dm);
      }));
      checkLaunch(call);
      return;
    }
  }
  auto* table = static_cast<uint8_t*>(deviceAlloc(device, tableBytes + chunkBytes + chunkNormBytes + normBytes + firstBytes, call));
  auto* dTensors = reinterpret_cast<TensorEntry*>(table);
  auto* dChunks = reinterpret_cast<Chunk*>(table + tableBytes);
  auto* chunkNorms = reinterpret_cast<double*>(table + tableBytes + chunkBytes);
  auto* normsDev = reinterpret_cast<double*>(table + tableBytes + chunkBytes + chunkNormBytes);
  auto* dFirst = reinterpret_cast<int32_t*>(table + tableBytes + chunkBytes + chunkNormBytes + normBytes);
  try {
    // Pageable-to-device copies return once the host data is staged, so the vectors may go out of scope.
    check(cudaMemcpyAsync(dTensors, tensors.data(), count * sizeof(TensorEntry), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(dChunks, chunks.data(), chunks.size() * sizeof(Chunk), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
    if (lamb)
      check(cudaMemcpyAsync(dFirst, firstChunk.data(), firstChunk.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
    NT_DISPATCH_FLOAT(pt, call, P, NT_DISPATCH_FLOAT(gt, call, G, {
      if (!lamb) {
        if (dm.meta) adamwMetaKernel<P, G><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h, dm);
        else adamwKernel<P, G><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h);
      } else {
        lambNormsKernel<P, G><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h, chunkNorms);
        lambTensorNormsKernel<<<gridFor(int64_t(count)), kThreads, 0, st>>>(chunkNorms, dFirst, normsDev, int64_t(count));
        lambApplyKernel<P><<<blocks, kThreads, 0, st>>>(dTensors, dChunks, h, normsDev);
      }
    }));
    checkLaunch(call);
    if (lamb && norms) {
      check(cudaMemcpyAsync(norms->data(), normsDev, count * 2 * sizeof(double), cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
      check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    }
  } catch (...) {
    deviceFree(device, table);
    throw;
  }
  deviceFree(device, table);  // stream-ordered: reused only by later work on this stream
}

// ---- the cpu backend's signatures (lib/optim calls both backends the same way) --------------------

// A JS array of device storages on one device (`device`, -1 until the first), each holding counts[k]
// elements of dtypes[k].
static std::vector<uint8_t*> deviceStorages(const KernelCall& k, const char* what, const std::vector<int64_t>& counts,
                                            const std::vector<DType>& dtypes, int& device) {
  const char* call = k.name();
  size_t i = k.args.at(what, "S");
  Napi::Array arr = storageArray(k.info(), i, call, what, counts.size());
  std::vector<uint8_t*> out(counts.size());
  for (uint32_t j = 0; j < arr.Length(); j++) {
    DeviceStorage* s = DeviceStorage::From(arr.Get(j), call, i);
    if (device < 0) device = s->device();
    if (s->device() != device) fail(Err::Device, std::string(call) + ": all tensors must be on one device");
    s->checkRange(0, size_t(counts[j]) * dtypeSize(dtypes[j]), call);
    out[j] = s->data();
  }
  return out;
}

// adamw_step / lamb_step(params[], grads[], expAvg[], expAvgSq[], counts[], paramDtypes[], gradDtypes[],
//   lr, beta1, beta2, eps, weightDecay, step, gradScale[, biasCorrection]): one multi-tensor launch per
//   (param dtype, grad dtype) pair. lamb_step returns the trust ratios (Float64Array), so it waits for the stream.
static Napi::Value adamFamilyStep(KernelCall& k, const char* call, bool lamb, bool meta = false) {
  const Args& a = k.args;
  auto [counts, pdt, gdt] = paramGradDtypes(k.info(), a.at("counts", "A"), call);
  std::vector<DType> f32(counts.size(), DType::F32);
  int device = -1;
  std::vector<uint8_t*> params = deviceStorages(k, "params", counts, pdt, device);
  std::vector<uint8_t*> grads = deviceStorages(k, "grads", counts, gdt, device);
  std::vector<uint8_t*> ms = deviceStorages(k, "expAvg", counts, f32, device);
  std::vector<uint8_t*> vs = deviceStorages(k, "expAvgSq", counts, f32, device);
  // adamw_step_meta: lr and step are read on the device from meta's 16 bytes when the kernel runs.
  DeviceMeta dm{nullptr, 0.0, 0.0};
  if (meta) {
    dm.meta = k.data<const uint8_t>("meta", DType::U8, 16);
    if (device >= 0 && k.device() != device) fail(Err::Device, std::string(call) + ": meta must be on the parameters' device");
  }
  int64_t step = meta ? 1 : a.int64("step");
  if (step < 1) fail(Err::Argument, std::string(call) + ": step must be >= 1");
  bool biasCorrection = lamb ? a.boolean("biasCorrection") : true;
  double beta1 = a.number("beta1"), beta2 = a.number("beta2");
  dm.beta1 = beta1;
  dm.beta2 = beta2;
  Hyper h{meta ? 0.0f : float(a.number("lr")), float(beta1), float(beta2), float(a.number("eps")), float(a.number("weightDecay")),
          float(a.number("gradScale")), 1.0f, 1.0f};
  if (biasCorrection && !meta) {
    h.bias1 = float(1.0 - std::pow(beta1, double(step)));
    h.bias2 = float(1.0 - std::pow(beta2, double(step)));
  }
  std::map<std::pair<DType, DType>, std::vector<size_t>> groups;
  for (size_t j = 0; j < counts.size(); j++) groups[{pdt[j], gdt[j]}].push_back(j);
  Napi::Float64Array ratios = Napi::Float64Array::New(k.info().Env(), counts.size());
  for (auto& [dtypes, members] : groups) {
    std::vector<TensorEntry> tensors;
    for (size_t j : members)
      tensors.push_back({params[j], grads[j], reinterpret_cast<float*>(ms[j]), reinterpret_cast<float*>(vs[j]), counts[j]});
    std::vector<double> norms;
    launchMultiTensor(device, tensors, dtypes.first, dtypes.second, h, lamb, lamb ? &norms : nullptr, call, dm);
    if (lamb)
      for (size_t j = 0; j < members.size(); j++) {
        double pw = norms[2 * j], uu = norms[2 * j + 1];
        ratios[members[j]] = pw > 0 && uu > 0 ? std::sqrt(pw) / std::sqrt(uu) : 1.0;
      }
  }
  return ratios;
}
NT_CUDA_KERNEL("adamw_step", AdamwStep) { adamFamilyStep(k, call, false); }
// adamw_step_meta(params[], grads[], expAvg[], expAvgSq[], counts[], paramDtypes[], gradDtypes[], meta,
//   beta1, beta2, eps, weightDecay, gradScale): adamw_step with lr and step read on the device from meta.
NT_CUDA_KERNEL("adamw_step_meta", AdamwStepMeta) { adamFamilyStep(k, call, false, true); }
NT_CUDA_KERNEL_VALUE("lamb_step", LambStep) { return adamFamilyStep(k, call, true); }

template <typename P, typename G>
__global__ void sgdKernel(P* p, const G* g, float* buf, int64_t n, float lr, float momentum, float keep, float weightDecay,
                          bool nesterov, bool first, float gradScale) {
  NT_GRID_STRIDE(i, n) {
    float w = toF32(p[i]);
    float d = toF32(g[i]) * gradScale + weightDecay * w;
    if (buf) {
      buf[i] = first ? d : momentum * buf[i] + keep * d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] = fromF32<P>(w - lr * d);
  }
}

// sgd_step(params[], grads[], momentumBufs[], counts[], paramDtypes[], gradDtypes[], lr, momentum, dampening,
//   weightDecay, nesterov, firstStep, gradScale): PyTorch's SGD, one launch per tensor.
NT_CUDA_KERNEL("sgd_step", SgdStep) {
  const Args& a = k.args;
  auto [counts, pdt, gdt] = paramGradDtypes(k.info(), a.at("counts", "A"), call);
  int device = -1;
  std::vector<uint8_t*> params = deviceStorages(k, "params", counts, pdt, device);
  std::vector<uint8_t*> grads = deviceStorages(k, "grads", counts, gdt, device);
  double lr = a.number("lr"), mom = a.number("momentum"), damp = a.number("dampening"), wd = a.number("weightDecay");
  bool nesterov = a.boolean("nesterov"), first = a.boolean("firstStep");
  float scale = float(a.number("gradScale"));
  std::vector<uint8_t*> bufs;
  if (mom != 0) bufs = deviceStorages(k, "momentumBufs", counts, std::vector<DType>(counts.size(), DType::F32), device);
  if (device < 0) return;
  useDevice(device);
  cudaStream_t st = currentStream(device);
  for (size_t j = 0; j < counts.size(); j++) {
    int64_t n = counts[j];
    if (n == 0) continue;
    float* buf = mom != 0 ? reinterpret_cast<float*>(bufs[j]) : nullptr;
    NT_DISPATCH_FLOAT(pdt[j], call, P, NT_DISPATCH_FLOAT(gdt[j], call, G, {
      sgdKernel<P, G><<<gridFor(n), kThreads, 0, st>>>(reinterpret_cast<P*>(params[j]), reinterpret_cast<const G*>(grads[j]), buf, n,
                                                      float(lr), float(mom), float(1.0 - damp), float(wd), nesterov, first, scale);
    }));
  }
  checkLaunch(call);
}

// x *= alpha (map3Kernel functor: contiguous, 16-byte packs where aligned).
struct ScaleF {
  float alpha;
  __device__ __forceinline__ float operator()(float x, float, float) const { return x * alpha; }
};

// The tensors of sum_squares and scale_in_place: (storages[], counts[], dtypes[], ...) on one
// device (-1 when the list is empty).
struct DeviceTensorList {
  std::vector<int64_t> counts;
  std::vector<DType> dts;
  std::vector<uint8_t*> data;
  int device = -1;
};
static DeviceTensorList deviceTensorList(const KernelCall& k) {
  auto [a, counts, dts] = tensorListArgs(k.info(), k.name());
  DeviceTensorList l{std::move(counts), std::move(dts), {}};
  l.data = deviceStorages(k, "storages", l.counts, l.dts, l.device);
  return l;
}
// Calls launch(k) for each non-empty tensor k, then checks the launches.
template <typename F>
static void launchEach(const DeviceTensorList& l, const char* call, F launch) {
  for (size_t k = 0; k < l.counts.size(); k++) {
    if (l.counts[k] == 0) continue;
    launch(k);
  }
  checkLaunch(call);
}

// sum_squares(storages[], counts[], dtypes[]) -> Float64Array: returns values, so it waits for the stream.
NT_CUDA_KERNEL_VALUE("sum_squares", SumSquares) {
  DeviceTensorList l = deviceTensorList(k);
  const size_t count = l.counts.size();
  Napi::Float64Array out = Napi::Float64Array::New(k.info().Env(), count);
  if (l.device < 0) return out;
  useDevice(l.device);
  cudaStream_t st = currentStream(l.device);
  DeviceScratch sums(l.device, count * sizeof(double), call);
  check(cudaMemsetAsync(sums.as<double>(), 0, count * sizeof(double), st), "cudaMemsetAsync");
  // Each tensor's sum of squares by the block-parallel row sum of common.cuh (one row): double
  // partials combined in a fixed order, so the norm is the same on every run.
  launchEach(l, call, [&](size_t k) {
    NT_DISPATCH_FLOAT(l.dts[k], call, T,
                      (launchRowSums<T, true, double>(l.device, st, reinterpret_cast<const T*>(l.data[k]), 1, l.counts[k],
                                                      sums.as<double>() + k, call)));
  });
  check(cudaMemcpyAsync(out.Data(), sums.as<double>(), count * sizeof(double), cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  return out;
}

// scale_in_place(storages[], counts[], dtypes[], alpha): x *= alpha for every tensor.
NT_CUDA_KERNEL("scale_in_place", ScaleInPlace) {
  DeviceTensorList l = deviceTensorList(k);
  float alpha = float(k.args.number("alpha"));
  if (l.device < 0) return;
  useDevice(l.device);
  cudaStream_t st = currentStream(l.device);
  launchEach(l, call, [&](size_t k) {
    NT_DISPATCH_FLOAT(l.dts[k], call, T,
                      launchMap3<T>(st, ScaleF{alpha}, reinterpret_cast<const T*>(l.data[k]), nullptr, nullptr,
                                    reinterpret_cast<T*>(l.data[k]), l.counts[k]));
  });
}

}  // namespace nt::cuda
