// Optimizer kernels on the cpu backend: fused AdamW, LAMB and SGD steps over lists of parameters, and the
// per-tensor sums of squares and in-place scaling that gradient clipping is built from. Policy (which
// parameters, hyperparameters, schedules, clipping thresholds) lives in lib/optim.
#include <chrono>
#include <cmath>

#include "../../core/arg_lists.h"
#include "convert.h"
#include "util.h"

namespace nt::cpu {

namespace {

// A JS array of storages, each checked to hold counts[k] elements of dtypes[k].
std::vector<uint8_t*> storageList(const Napi::CallbackInfo& info, size_t i, const char* call, const char* what,
                                  const std::vector<int64_t>& counts, const std::vector<DType>& dtypes) {
  Napi::Array arr = storageArray(info, i, call, what, counts.size());
  std::vector<uint8_t*> out(counts.size());
  for (uint32_t k = 0; k < arr.Length(); k++) {
    Storage* s = Storage::From(arr.Get(k), call, i);
    s->checkRange(0, size_t(counts[k]) * dtypeSize(dtypes[k]), call);
    out[k] = s->data();
  }
  return out;
}

// Moment buffers are always f32: the state ZeRO shards and checkpoints.
std::vector<float*> stateList(const Napi::CallbackInfo& info, size_t i, const char* call, const char* what,
                              const std::vector<int64_t>& counts) {
  std::vector<DType> f32(counts.size(), DType::F32);
  std::vector<uint8_t*> raw = storageList(info, i, call, what, counts, f32);
  std::vector<float*> out(raw.size());
  for (size_t k = 0; k < raw.size(); k++) out[k] = reinterpret_cast<float*>(raw[k]);
  return out;
}

// The lists every step binding starts with: params[], grads[], counts[], paramDtypes[] and gradDtypes[]
// (read by name), each storage checked against its count.
struct ParamGradLists {
  std::vector<int64_t> counts;
  std::vector<DType> pdt, gdt;
  std::vector<uint8_t*> params, grads;
};

ParamGradLists paramGradLists(const Args& a) {
  const Napi::CallbackInfo& info = a.info;
  const char* call = a.call;
  ParamGradDtypes d = paramGradDtypes(info, a.at("counts", "A"), call);
  std::vector<uint8_t*> params = storageList(info, a.at("params", "S"), call, "params", d.counts, d.pdt);
  std::vector<uint8_t*> grads = storageList(info, a.at("grads", "S"), call, "grads", d.counts, d.gdt);
  return ParamGradLists{std::move(d.counts), std::move(d.pdt), std::move(d.gdt), std::move(params), std::move(grads)};
}

// Runs body(k, n, p, g) over each parameter as f32 (p, g: converted copies for bf16/f16), then stores p back.
template <typename Body>
void eachParam(const ParamGradLists& l, Body body) {
  for (size_t k = 0; k < l.counts.size(); k++) {
    int64_t n = l.counts[k];
    F32View P(l.params[k], l.pdt[k], n, true);
    F32View G(l.grads[k], l.gdt[k], n, true);
    body(k, n, P.data(), static_cast<const float*>(G.data()));
    P.commit();
  }
}

// What adamw_step and lamb_step read the same way: the lists, the f32 moments (expAvg, expAvgSq), lr,
// beta1, beta2, eps, weightDecay, step and gradScale.
struct AdamArgs {
  Args a;
  ParamGradLists l;
  std::vector<float*> ms, vs;
  double lr, b1, b2, eps, wd;
  int64_t step;
  float scale;
};

AdamArgs adamArgs(const Napi::CallbackInfo& info, const char* call) {
  Args a = kernelArgs(info, call);
  ParamGradLists l = paramGradLists(a);
  std::vector<float*> ms = stateList(info, a.at("expAvg", "S"), call, "expAvg", l.counts);
  std::vector<float*> vs = stateList(info, a.at("expAvgSq", "S"), call, "expAvgSq", l.counts);
  double lr = a.number("lr"), b1 = a.number("beta1"), b2 = a.number("beta2"), eps = a.number("eps"), wd = a.number("weightDecay");
  int64_t step = a.int64("step");
  float scale = float(a.number("gradScale"));
  return AdamArgs{a, std::move(l), std::move(ms), std::move(vs), lr, b1, b2, eps, wd, step, scale};
}

}  // namespace

// AdamW's per-step constants, computed once per call: decoupled decay 1 − lr·wd, the step size
// lr / (1 − β1ᵗ), 1/√(1 − β2ᵗ), the betas, eps and the gradient scale.
struct AdamwConsts {
  float decay, stepSize, invSqrtBc2, b1, b2, eps, scale;
};

// Elements per block of the threaded AdamW loop (a multiple of the vector width; 64 KiB per array).
static constexpr int64_t kAdamBlock = 16384;

// One pass over n elements: read p, g, m, v once, write p, m, v once. Distinct arrays (restrict) so
// the loop vectorizes; one copy per instruction-set level (NT_SIMD).
NT_SIMD_BODY void adamwRangeBody(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                                 const AdamwConsts c) {
  const float omb1 = 1.0f - c.b1, omb2 = 1.0f - c.b2;
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * c.scale;
    float mi = c.b1 * m[i] + omb1 * gi;
    float vi = c.b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay - c.stepSize * mi / (std::sqrt(vi) * c.invSqrtBc2 + c.eps);
  }
}
NT_SIMD(adamwRange, (float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n, const AdamwConsts c),
        (p, g, m, v, n, c))

// adamw_step(params[], grads[], expAvg[], expAvgSq[], counts[], paramDtypes[], gradDtypes[],
//           lr, beta1, beta2, eps, weightDecay, step, gradScale)
// Decoupled weight decay (p *= 1 - lr*wd), then the bias-corrected Adam update; grads are multiplied
// by gradScale first (how clipping or loss-scale unscaling folds into the same pass).
static Napi::Value AdamwStep(const Napi::CallbackInfo& info) {
  AdamArgs A = adamArgs(info, "adamw_step");
  if (A.step < 1) fail(Err::Argument, "adamw_step: step must be >= 1");
  AdamwConsts c{float(1.0 - A.lr * A.wd), float(A.lr / (1.0 - std::pow(A.b1, double(A.step)))),
                float(1.0 / std::sqrt(1.0 - std::pow(A.b2, double(A.step)))), float(A.b1), float(A.b2), float(A.eps), A.scale};
  eachParam(A.l, [&](size_t k, int64_t n, float* p, const float* g) {
    float* m = A.ms[k];
    float* v = A.vs[k];
    // Fixed-size blocks over the pool: each element's update is the same whichever thread runs it.
    int64_t blocks = (n + kAdamBlock - 1) / kAdamBlock;
    parallelBlocks(blocks, kAdamBlock * 8, [&](int64_t b) {
      int64_t i = b * kAdamBlock;
      adamwRange(p + i, g + i, m + i, v + i, std::min(kAdamBlock, n - i), c);
    });
  });
  return info.Env().Undefined();
}
NT_EXPORT("adamw_step", AdamwStep);

// The 16 bytes of AdamW's device metadata (adamw_step_meta): lr as a little-endian f64, the step as an
// i32, 4 bytes of zero. The host path's lr (a double) and step travel unrounded, so both paths compute
// the same constants.
static constexpr size_t kAdamMetaBytes = 16;

// adamw_step_meta(params[], grads[], expAvg[], expAvgSq[], counts[], paramDtypes[], gradDtypes[], meta,
//                 beta1, beta2, eps, weightDecay, gradScale)
// adamw_step with lr and step read from `meta` (a storage of at least 16 bytes, see kAdamMetaBytes)
// when the step runs instead of when it is recorded: the cuda kernel reads them on the device, so a
// captured CUDA graph replays with the lr and step written into meta before each replay. Here the
// storage is host memory and the constants are adamw_step's, bit for bit.
NT_KERNEL("adamw_step_meta", AdamwStepMeta) {
  ParamGradLists l = paramGradLists(a);
  std::vector<float*> ms = stateList(info, a.at("expAvg", "S"), call, "expAvg", l.counts);
  std::vector<float*> vs = stateList(info, a.at("expAvgSq", "S"), call, "expAvgSq", l.counts);
  const uint8_t* meta = storageData(info, a.at("meta", "s"), call, DType::U8, kAdamMetaBytes);
  double lr;
  int32_t step;
  std::memcpy(&lr, meta, sizeof lr);
  std::memcpy(&step, meta + 8, sizeof step);
  double b1 = a.number("beta1"), b2 = a.number("beta2"), eps = a.number("eps"), wd = a.number("weightDecay");
  float scale = float(a.number("gradScale"));
  if (step < 1) fail(Err::Argument, "adamw_step_meta: the step in meta must be >= 1 (write the metadata before the step)");
  AdamwConsts c{float(1.0 - lr * wd), float(lr / (1.0 - std::pow(b1, double(step)))), float(1.0 / std::sqrt(1.0 - std::pow(b2, double(step)))),
                float(b1), float(b2), float(eps), scale};
  eachParam(l, [&](size_t k, int64_t n, float* p, const float* g) {
    float* m = ms[k];
    float* v = vs[k];
    int64_t blocks = (n + kAdamBlock - 1) / kAdamBlock;
    parallelBlocks(blocks, kAdamBlock * 8, [&](int64_t b) {
      int64_t i = b * kAdamBlock;
      adamwRange(p + i, g + i, m + i, v + i, std::min(kAdamBlock, n - i), c);
    });
  });
}

NT_SIMD_BODY void triadRangeBody(float* __restrict a, const float* __restrict b, const float* __restrict c, int64_t n) {
  for (int64_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
}
NT_SIMD(triadRange, (float* __restrict a, const float* __restrict b, const float* __restrict c, int64_t n), (a, b, c, n))

// streamTriadLoop(a, b, c, n, iterations) -> seconds of the loop: a = b + 3·c over n f32 elements,
// split over the pool in AdamW's blocks: the memory-bandwidth yardstick `nodetron bench ops` puts
// AdamW's bytes per second beside (STREAM's triad, 12 bytes per element).
static Napi::Value StreamTriadLoop(const Napi::CallbackInfo& info) {
  Args a{info, "streamTriadLoop"};
  a.count(5);
  int64_t n = a.size(3), it = a.size(4);
  float* A = reinterpret_cast<float*>(storageData(info, 0, "streamTriadLoop", DType::F32, n));
  const float* B = reinterpret_cast<const float*>(storageData(info, 1, "streamTriadLoop", DType::F32, n));
  const float* C = reinterpret_cast<const float*>(storageData(info, 2, "streamTriadLoop", DType::F32, n));
  int64_t blocks = (n + kAdamBlock - 1) / kAdamBlock;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < it; k++)
    parallelBlocks(blocks, kAdamBlock * 8, [&](int64_t blk) {
      int64_t i = blk * kAdamBlock;
      triadRange(A + i, B + i, C + i, std::min(kAdamBlock, n - i));
    });
  auto t1 = std::chrono::steady_clock::now();
  return Napi::Number::New(info.Env(), std::chrono::duration<double>(t1 - t0).count());
}
NT_EXPORT("streamTriadLoop", StreamTriadLoop);

// lamb_step(params[], grads[], expAvg[], expAvgSq[], counts[], paramDtypes[], gradDtypes[],
//          lr, beta1, beta2, eps, weightDecay, step, gradScale, biasCorrection) -> Float64Array of trust ratios
// Per tensor: u = m^/(sqrt(v^)+eps) + wd*p, then p -= lr * (||p|| / ||u||) * u (ratio 1 when a norm is 0).
// Two passes over each tensor (norms, then update) so no update buffer is needed.
static Napi::Value LambStep(const Napi::CallbackInfo& info) {
  AdamArgs A = adamArgs(info, "lamb_step");
  bool biasCorrection = A.a.boolean("biasCorrection");
  if (A.step < 1) fail(Err::Argument, "lamb_step: step must be >= 1");
  const float invBc1 = biasCorrection ? float(1.0 / (1.0 - std::pow(A.b1, double(A.step)))) : 1.0f;
  const float invBc2 = biasCorrection ? float(1.0 / (1.0 - std::pow(A.b2, double(A.step)))) : 1.0f;
  const float fb1 = float(A.b1), fb2 = float(A.b2), feps = float(A.eps), fwd = float(A.wd), scale = A.scale;
  const double lr = A.lr;
  Napi::Float64Array ratios = Napi::Float64Array::New(info.Env(), A.l.counts.size());
  eachParam(A.l, [&](size_t k, int64_t n, float* p, const float* g) {
    float* m = A.ms[k];
    float* v = A.vs[k];
    double pNormSq = 0, uNormSq = 0;
    for (int64_t i = 0; i < n; i++) {
      float gi = g[i] * scale;
      m[i] = fb1 * m[i] + (1.0f - fb1) * gi;
      v[i] = fb2 * v[i] + (1.0f - fb2) * gi * gi;
      float u = (m[i] * invBc1) / (std::sqrt(v[i] * invBc2) + feps) + fwd * p[i];
      pNormSq += double(p[i]) * p[i];
      uNormSq += double(u) * u;
    }
    double ratio = (pNormSq > 0 && uNormSq > 0) ? std::sqrt(pNormSq) / std::sqrt(uNormSq) : 1.0;
    ratios[k] = ratio;
    const float stepSize = float(lr * ratio);
    for (int64_t i = 0; i < n; i++) {
      float u = (m[i] * invBc1) / (std::sqrt(v[i] * invBc2) + feps) + fwd * p[i];
      p[i] -= stepSize * u;
    }
  });
  return ratios;
}
NT_EXPORT("lamb_step", LambStep);

// sgd_step(params[], grads[], momentumBufs[], counts[], paramDtypes[], gradDtypes[],
//         lr, momentum, dampening, weightDecay, nesterov, firstStep, gradScale)
// PyTorch's SGD: d = g + wd*p; with momentum, buf = d on the first step, else momentum*buf + (1-dampening)*d,
// and d = nesterov ? d + momentum*buf : buf; then p -= lr*d. momentumBufs is [] when momentum is 0.
NT_KERNEL("sgd_step", SgdStep) {
  ParamGradLists l = paramGradLists(a);
  double lr = a.number("lr"), mom = a.number("momentum"), damp = a.number("dampening"), wd = a.number("weightDecay");
  bool nesterov = a.boolean("nesterov"), first = a.boolean("firstStep");
  float scale = float(a.number("gradScale"));
  std::vector<float*> bufs;
  if (mom != 0) bufs = stateList(info, a.at("momentumBufs", "S"), call, "momentumBufs", l.counts);
  const float flr = float(lr), fmom = float(mom), fdamp = float(1.0 - damp), fwd = float(wd);
  eachParam(l, [&](size_t k, int64_t n, float* p, const float* g) {
    float* buf = mom != 0 ? bufs[k] : nullptr;
    for (int64_t i = 0; i < n; i++) {
      float d = g[i] * scale + fwd * p[i];
      if (buf) {
        buf[i] = first ? d : fmom * buf[i] + fdamp * d;
        d = nesterov ? d + fmom * buf[i] : buf[i];
      }
      p[i] -= flr * d;
    }
  });
}

// sum_squares(storages[], counts[], dtypes[]) -> Float64Array: each tensor's sum of squares, accumulated in f64.
static Napi::Value SumSquares(const Napi::CallbackInfo& info) {
  const char* call = "sum_squares";
  auto [a, counts, dts] = tensorListArgs(info, call);
  std::vector<uint8_t*> data = storageList(info, a.at("storages", "S"), call, "storages", counts, dts);
  Napi::Float64Array out = Napi::Float64Array::New(info.Env(), counts.size());
  for (size_t k = 0; k < counts.size(); k++) {
    F32View X(data[k], dts[k], counts[k], true);
    const float* x = X.data();
    double acc = 0;
    for (int64_t i = 0; i < counts[k]; i++) acc += double(x[i]) * x[i];
    out[k] = acc;
  }
  return out;
}
NT_EXPORT("sum_squares", SumSquares);

// scale_in_place(storages[], counts[], dtypes[], alpha): x *= alpha for every tensor.
static Napi::Value ScaleInPlace(const Napi::CallbackInfo& info) {
  const char* call = "scale_in_place";
  auto [a, counts, dts] = tensorListArgs(info, call);
  std::vector<uint8_t*> data = storageList(info, a.at("storages", "S"), call, "storages", counts, dts);
  float alpha = float(a.number("alpha"));
  for (size_t k = 0; k < counts.size(); k++) {
    F32View X(data[k], dts[k], counts[k], true);
    float* x = X.data();
    for (int64_t i = 0; i < counts[k]; i++) x[i] *= alpha;
    X.commit();
  }
  return info.Env().Undefined();
}
NT_EXPORT("scale_in_place", ScaleInPlace);

}  // namespace nt::cpu
