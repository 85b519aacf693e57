// GEMM on the cuda backend through cuBLASLt: f32 (tf32 when allowed), bf16/f16 with f32
// accumulation, transposes, strided batches, and bias / GELU epilogues. Row-major like the cpu gemm.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "../gemm_plan.h"
#include "common.cuh"

namespace nt::cuda {

// A failed cuBLASLt status as the typed error of `op` naming the cuBLASLt function.
static void checkLt(cublasStatus_t s, const char* ltCall, const char* op) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  Err code = s == CUBLAS_STATUS_ALLOC_FAILED ? Err::OutOfMemory : Err::Native;
  fail(code, std::string(op) + ": " + ltCall + ": " + cublasLtGetStatusString(s) + " (" + cublasLtGetStatusName(s) + ")", ltCall);
}

static bool allowTf32 = false;
static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
static constexpr size_t kPlanCacheSize = 512;  // plans per device; a GPT step uses a few dozen shapes

// What repeated GEMMs of one kind share: descriptor, layouts and the heuristic's algorithm, built
// once per key (native/cuda/gemm_plan.h) and kept in a bounded per-device cache. The bias and aux
// pointers are set on the shared descriptor for every call, under `mutex`.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt offers no algorithm for this key (cached too)
  std::mutex mutex;
  ~LtPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  std::map<int64_t, void*> workspaces;  // per stream: gemms on different streams may overlap
  lt::LruCache<lt::PlanKey, LtPlan> plans{kPlanCacheSize};  // the handle is per device, so per handle too
};
static std::mutex ltMutex;
// Never destroyed: at process exit cuBLASLt may already be unloading.
static std::map<int, LtDevice>& ltDevices = *new std::map<int, LtDevice>();

static cublasLtHandle_t ltHandle(int device, const char* op) {
  std::lock_guard<std::mutex> lock(ltMutex);
  LtDevice& d = ltDevices[device];
  if (!d.handle) checkLt(cublasLtCreate(&d.handle), "cublasLtCreate", op);
  return d.handle;
}

static void* workspace(int device) {
  int64_t stream = currentStreamId(device);
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    auto it = ltDevices[device].workspaces.find(stream);
    if (it != ltDevices[device].workspaces.end()) return it->second;
  }
  void* p = deviceAlloc(device, kWorkspaceBytes, "gemm workspace");
  std::lock_guard<std::mutex> lock(ltMutex);
  ltDevices[device].workspaces[stream] = p;
  return p;
}

template <typename T>
static void setAttr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* op) {
  checkLt(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(T)), "cublasLtMatmulDescSetAttribute", op);
}

static cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                                     const char* op) {
  cublasLtMatrixLayout_t l;
  checkLt(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate", op);
  if (batch > 1) {
    int32_t count = int32_t(batch);
    cublasStatus_t s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride));
    if (s != CUBLAS_STATUS_SUCCESS) cublasLtMatrixLayoutDestroy(l);
    checkLt(s, "cublasLtMatrixLayoutSetAttribute", op);
  }
  return l;
}

struct LtPreference {
  cublasLtMatmulPreference_t p = nullptr;
  ~LtPreference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
  void set(cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t bytes, const char* op) {
    checkLt(cublasLtMatmulPreferenceSetAttribute(p, attr, v, bytes), "cublasLtMatmulPreferenceSetAttribute", op);
  }
};

// Builds the plan for `key`: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// cuBLASLt's "A" is our B (and its alignment), its "B" our A. `bias` and `aux` are this call's
// pointers: the heuristic reads their alignment (the key holds it); later calls set their own.
static std::shared_ptr<LtPlan> buildPlan(cublasLtHandle_t handle, const lt::PlanKey& key, cudaDataType_t type, void* bias, void* aux,
                                         const char* op) {
  auto p = std::make_shared<LtPlan>();
  checkLt(cublasLtMatmulDescCreate(&p->op, cublasComputeType_t(key.compute), CUDA_R_32F), "cublasLtMatmulDescCreate", op);
  const int64_t M = key.m, N = key.n, K = key.k, batch = key.batch;
  cublasOperation_t opA = key.transB ? CUBLAS_OP_T : CUBLAS_OP_N, opB = key.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  setAttr(p->op, CUBLASLT_MATMUL_DESC_TRANSA, opA, op);
  setAttr(p->op, CUBLASLT_MATMUL_DESC_TRANSB, opB, op);
  p->a = layout(type, key.transB ? K : N, key.transB ? N : K, key.transB ? K : N, batch, key.strideB, op);
  p->b = layout(type, key.transA ? M : K, key.transA ? K : M, key.transA ? M : K, batch, key.strideA, op);
  p->c = layout(type, N, M, N, batch, key.strideC, op);
  cublasLtEpilogue_t e = cublasLtEpilogue_t(key.epilogue);
  if (e != CUBLASLT_EPILOGUE_DEFAULT) {
    setAttr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, e, op);
    if (bias) {
      setAttr(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, op);
      if (batch > 1) setAttr(p->op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t(0), op);
    }
    if (aux) {
      setAttr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, op);
      setAttr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, N, op);
      if (batch > 1) setAttr(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, key.strideC, op);
    }
  }
  LtPreference pref;
  checkLt(cublasLtMatmulPreferenceCreate(&pref.p), "cublasLtMatmulPreferenceCreate", op);
  uint64_t wsBytes = kWorkspaceBytes;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof(wsBytes), op);
  uint32_t alignA = key.alignB, alignB = key.alignA, alignC = key.alignC;  // cuBLASLt's A is our B
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignA, sizeof(alignA), op);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alignB, sizeof(alignB), op);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignC, sizeof(alignC), op);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignC, sizeof(alignC), op);  // D is C
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->c, pref.p, 1, &result, &found);
  if (s != CUBLAS_STATUS_NOT_SUPPORTED) checkLt(s, "cublasLtMatmulAlgoGetHeuristic", op);
  p->found = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p->found) p->algo = result.algo;
  return p;
}

// The cached plan for `key`, built on a miss.
static std::shared_ptr<LtPlan> planFor(int device, cublasLtHandle_t handle, const lt::PlanKey& key, cudaDataType_t type, void* bias,
                                       void* aux, const char* op) {
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    if (auto p = ltDevices[device].plans.find(key)) return p;
  }
  std::shared_ptr<LtPlan> p = buildPlan(handle, key, type, bias, aux, op);
  std::lock_guard<std::mutex> lock(ltMutex);
  ltDevices[device].plans.insert(key, p);
  return p;
}

template <typename T>
__global__ void scaleKernel(T* c, float beta, int64_t n) {
  NT_GRID_STRIDE(i, n) c[i] = fromF32<T>(beta == 0.0f ? 0.0f : beta * toF32(c[i]));
}

// c[b][r][j] += bias[j] for the batch's [M, N] matrices (batch stride sC): the fallback when
// cuBLASLt has no algorithm with the BIAS epilogue for a shape.
template <typename T>
__global__ void addBiasKernel(T* c, const T* bias, int64_t batch, int64_t mn, int64_t n, int64_t sC) {
  NT_GRID_STRIDE(i, batch * mn) {
    int64_t b = i / mn, r = i - b * mn;
    T& x = c[b * sC + r];
    x = fromF32<T>(__fadd_rn(toF32(x), toF32(bias[r % n])));
  }
}

enum Epilogue { kNone = 0, kBias = 1, kGelu = 2, kGeluBias = 3 };

// Shared by gemm and gemm_epilogue: argument layout of the cpu gemm, then (bias, epilogue, aux).
static Napi::Value runGemm(const Napi::CallbackInfo& info, const char* call, bool withEpilogue) {
  KernelCall k(info, call);
  DType dt = k.args.dtype(3);
  int64_t batch = k.args.size(4), M = k.args.size(5), N = k.args.size(6), K = k.args.size(7);
  bool ta = k.args.boolean(8), tb = k.args.boolean(9);
  float alpha = float(k.args.number(10)), beta = float(k.args.number(11));
  int64_t sA = k.args.size(12), sB = k.args.size(13), sC = k.args.size(14);
  if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16)
    fail(Err::DType, std::string(call) + ": dtype " + dtypeName(dt) + " is not supported (f32, bf16, f16)");
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
    fail(Err::Argument, std::string(call) + ": dimensions must be below 2^31");
  // gemm's optional outDtype (C in another dtype than A and B) is the cpu backend's only.
  if (!withEpilogue && info.Length() > 15 && k.args.dtype(15) != dt)
    fail(Err::DType, std::string(call) + ": an output dtype other than the inputs' (" + dtypeName(dt) + " into " + dtypeName(k.args.dtype(15)) +
                         ") is not supported on the cuda backend");
  auto extent = [&](int64_t stride, int64_t mat) { return batch == 0 ? 0 : (batch - 1) * stride + mat; };
  void* pa = k.data(0, dt, extent(sA, M * K));
  void* pb = k.data(1, dt, extent(sB, K * N));
  void* pc = k.data(2, dt, extent(sC, M * N));
  int64_t epilogue = withEpilogue ? k.args.int64(16) : kNone;
  if (epilogue < kNone || epilogue > kGeluBias) fail(Err::Argument, std::string(call) + ": unknown epilogue " + std::to_string(epilogue));
  bool hasBias = epilogue == kBias || epilogue == kGeluBias;
  void* bias = hasBias ? k.data(15, dt, N) : nullptr;
  void* aux = withEpilogue && (epilogue == kGelu || epilogue == kGeluBias) ? k.optional(17, dt, extent(sC, M * N)) : nullptr;
  if (batch == 0 || M == 0 || N == 0) return info.Env().Undefined();
  cudaStream_t stream = k.stream();
  if (K == 0) {
    if (epilogue != kNone) fail(Err::Argument, std::string(call) + ": K = 0 with an epilogue");
    int64_t n = extent(sC, M * N);
    NT_DISPATCH_FLOAT(dt, call, T, scaleKernel<T><<<gridFor(n), kThreads, 0, stream>>>(static_cast<T*>(pc), beta, n));
    k.launched();
    return info.Env().Undefined();
  }
  cudaDataType_t type = dt == DType::F32 ? CUDA_R_32F : dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  int64_t es = int64_t(dtypeSize(dt));
  lt::PlanKey key;
  key.dtype = int32_t(dt);
  key.compute = int32_t(dt == DType::F32 && allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  key.batch = batch;
  key.m = M;
  key.n = N;
  key.k = K;
  // A batch of one reads no stride: normalize so such calls share a plan.
  key.strideA = batch > 1 ? sA : 0;
  key.strideB = batch > 1 ? sB : 0;
  key.strideC = batch > 1 ? sC : 0;
  key.transA = ta;
  key.transB = tb;
  key.epilogue = epilogue == kNone ? CUBLASLT_EPILOGUE_DEFAULT
                 : epilogue == kBias ? CUBLASLT_EPILOGUE_BIAS
                 : epilogue == kGelu ? (aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU)
                                     : (aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS);
  key.alignA = lt::alignmentBytes(reinterpret_cast<uintptr_t>(pa), batch, sA * es);
  key.alignB = lt::alignmentBytes(reinterpret_cast<uintptr_t>(pb), batch, sB * es);
  key.alignC = lt::alignmentBytes(reinterpret_cast<uintptr_t>(pc), batch, sC * es);
  if (bias) key.alignBias = lt::alignmentBytes(reinterpret_cast<uintptr_t>(bias));
  if (aux) key.alignAux = lt::alignmentBytes(reinterpret_cast<uintptr_t>(aux), batch, sC * es);
  int device = k.device();
  cublasLtHandle_t handle = ltHandle(device, call);
  void* ws = workspace(device);
  std::shared_ptr<LtPlan> plan = planFor(device, handle, key, type, bias, aux, call);
  bool biasAfter = false;
  if (!plan->found && epilogue == kBias) {
    // No algorithm with the BIAS epilogue for this shape: the plain GEMM, then a bias pass.
    key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    key.alignBias = 256;
    plan = planFor(device, handle, key, type, nullptr, nullptr, call);
    biasAfter = true;
  }
  if (!plan->found)
    fail(Err::Native, std::string(call) + ": cuBLASLt has no algorithm for " + dtypeName(dt) + " " + std::to_string(M) + "x" +
                          std::to_string(N) + "x" + std::to_string(K) + " (epilogue " + std::to_string(epilogue) + ")",
         "cublasLtMatmulAlgoGetHeuristic");
  {
    std::lock_guard<std::mutex> lock(plan->mutex);
    if (!biasAfter && bias) setAttr(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, call);
    if (!biasAfter && aux) setAttr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, call);
    checkLt(cublasLtMatmul(handle, plan->op, &alpha, pb, plan->a, pa, plan->b, &beta, pc, plan->c, pc, plan->c, &plan->algo, ws,
                           kWorkspaceBytes, stream),
            "cublasLtMatmul", call);
  }
  if (biasAfter) {
    int64_t total = batch * M * N;
    int64_t stride = batch > 1 ? sC : M * N;
    NT_DISPATCH_FLOAT(dt, call, T,
                      addBiasKernel<T><<<gridFor(total), kThreads, 0, stream>>>(static_cast<T*>(pc), static_cast<const T*>(bias), batch,
                                                                               M * N, N, stride));
    k.launched();
  }
  return info.Env().Undefined();
}

// gemm(A, B, C, dtype, batch, M, N, K, transA, transB, alpha, beta, strideA, strideB, strideC)
static Napi::Value Gemm(const Napi::CallbackInfo& info) { return runGemm(info, "gemm", false); }
NT_EXPORT("gemm", Gemm);

// gemm_epilogue(...gemm arguments, bias, epilogue, aux): epilogue 0 none, 1 +bias[N] per row,
// 2 gelu, 3 gelu(. + bias); aux (optional, like C) receives the pre-GELU values for the backward.
// GELU is cuBLASLt's tanh approximation.
static Napi::Value GemmEpilogue(const Napi::CallbackInfo& info) { return runGemm(info, "gemm_epilogue", true); }
NT_EXPORT("gemm_epilogue", GemmEpilogue);

// gemmPlanCache(device) -> { size, capacity, hits, misses, evictions }: the cuBLASLt plan cache.
static Napi::Value GemmPlanCache(const Napi::CallbackInfo& info) {
  Args a{info, "gemmPlanCache"};
  int device = info.Length() > 0 && !info[0].IsUndefined() ? int(a.size(0)) : 0;
  lt::CacheStats st;
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    auto it = ltDevices.find(device);
    if (it != ltDevices.end()) st = it->second.plans.stats();
  }
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("size", double(st.size));
  o.Set("capacity", double(kPlanCacheSize));
  o.Set("hits", double(st.hits));
  o.Set("misses", double(st.misses));
  o.Set("evictions", double(st.evictions));
  return o;
}
NT_EXPORT("gemmPlanCache", GemmPlanCache);

// setMatmulTf32(allow): f32 GEMMs may use TF32 tensor cores (setFloat32MatmulPrecision('high')).
static Napi::Value SetMatmulTf32(const Napi::CallbackInfo& info) {
  Args a{info, "setMatmulTf32"};
  allowTf32 = a.boolean(0);
  return info.Env().Undefined();
}
NT_EXPORT("setMatmulTf32", SetMatmulTf32);

}  // namespace nt::cuda
