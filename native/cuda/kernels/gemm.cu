// GEMM on the cuda backend through cuBLASLt: f32 (tf32 when allowed), bf16/f16 with f32
// accumulation, transposes, strided batches, and bias / GELU epilogues. Row-major like the cpu gemm.
#include <cublasLt.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
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

// NODETRON_CUDA_EPILOGUES=0 (or false/no/off), read once at load: every epilogue runs composed (the
// plain GEMM, then the bias / GELU / bias-gradient kernels) instead of as cuBLASLt's fused one.
static const bool fusedEpilogues = [] {
  const char* v = std::getenv("NODETRON_CUDA_EPILOGUES");
  if (!v) return true;
  std::string s(v);
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return !(s == "0" || s == "false" || s == "no" || s == "off");
}();
bool gemmFusedEpilogues() { return fusedEpilogues; }

static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
static constexpr size_t kPlanCacheSize = 512;  // plans per device; a GPT step uses a few dozen shapes

// What repeated GEMMs of one kind share: descriptor, layouts and the heuristic's algorithm, built
// once per key (native/cuda/gemm_plan.h) and kept in a bounded per-device cache. The bias and aux
// pointers are set on the shared descriptor for every call, under `mutex`.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // false: cuBLASLt offers no algorithm for this key, or its cublasLtMatmul answered NOT_SUPPORTED
  // (cached too). Set once by buildPlan, cleared under `mutex`; read under `mutex`.
  bool found = false;
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
  lt::WorkspaceTable<void*> workspaces;  // per stream: gemms on different streams may overlap
  lt::LruCache<lt::PlanKey, LtPlan> plans{kPlanCacheSize};  // the handle is per device, so per handle too
};
static std::mutex ltMutex;
// Not destroyed by a static destructor (at process exit cuBLASLt may already be unloading): the
// Node environments' cleanup hook below releases what it holds.
static std::map<int, LtDevice>& ltDevices = *new std::map<int, LtDevice>();

// The Node environments (main thread, workers) that ran a GEMM. When the last one is torn down, the
// workspaces go back to the allocator, the plans and the cuBLASLt handles are destroyed (a later
// environment makes them again).
static std::set<napi_env>& ltEnvs = *new std::set<napi_env>();

static void ltTeardown(void* arg) {
  std::map<int, std::vector<void*>> freed;
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    ltEnvs.erase(static_cast<napi_env>(arg));
    if (!ltEnvs.empty()) return;
    for (auto& [device, d] : ltDevices) {
      freed[device] = d.workspaces.removeAll();
      d.plans.clear();
      if (d.handle) cublasLtDestroy(d.handle);
      d.handle = nullptr;
    }
  }
  for (auto& [device, ps] : freed)
    for (void* p : ps) {
      try { deviceFree(device, p); } catch (...) {}  // teardown cannot report; the allocator's books stay consistent
    }
}

static void ltRegisterEnv(napi_env env) {
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    if (!ltEnvs.insert(env).second) return;
  }
  napi_add_env_cleanup_hook(env, ltTeardown, env);
}

void releaseGemmWorkspace(int device, int64_t stream) {
  void* p;
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    auto it = ltDevices.find(device);
    if (it == ltDevices.end()) return;
    p = it->second.workspaces.remove(stream);
  }
  if (p) deviceFree(device, p);
}

static cublasLtHandle_t ltHandle(int device, const char* op) {
  std::lock_guard<std::mutex> lock(ltMutex);
  LtDevice& d = ltDevices[device];
  if (!d.handle) checkLt(cublasLtCreate(&d.handle), "cublasLtCreate", op);
  return d.handle;
}

// The current stream's workspace, allocated by its first GEMM and freed when the stream is
// destroyed (releaseGemmWorkspace, from streamDestroy) or at teardown.
static void* workspace(int device) {
  int64_t stream = currentStreamId(device);
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    if (void* p = ltDevices[device].workspaces.find(stream)) return p;
  }
  void* p = deviceAlloc(device, kWorkspaceBytes, "gemm workspace");
  bool added;
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    added = ltDevices[device].workspaces.add(stream, p, kWorkspaceBytes);
  }
  if (added) return p;
  deviceFree(device, p);
  std::lock_guard<std::mutex> lock(ltMutex);
  return ltDevices[device].workspaces.find(stream);
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
static std::shared_ptr<LtPlan> buildPlan(cublasLtHandle_t handle, const lt::PlanKey& key, cudaDataType_t type, cudaDataType_t ctype,
                                         void* bias, void* aux, const char* op) {
  auto p = std::make_shared<LtPlan>();
  checkLt(cublasLtMatmulDescCreate(&p->op, cublasComputeType_t(key.compute), CUDA_R_32F), "cublasLtMatmulDescCreate", op);
  const int64_t M = key.m, N = key.n, K = key.k, batch = key.batch;
  cublasOperation_t opA = key.transB ? CUBLAS_OP_T : CUBLAS_OP_N, opB = key.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  setAttr(p->op, CUBLASLT_MATMUL_DESC_TRANSA, opA, op);
  setAttr(p->op, CUBLASLT_MATMUL_DESC_TRANSB, opB, op);
  p->a = layout(type, key.transB ? K : N, key.transB ? N : K, key.transB ? K : N, batch, key.strideB, op);
  p->b = layout(type, key.transA ? M : K, key.transA ? K : M, key.transA ? M : K, batch, key.strideA, op);
  p->c = layout(ctype, N, M, N, batch, key.strideC, op);
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
static std::shared_ptr<LtPlan> planFor(int device, cublasLtHandle_t handle, const lt::PlanKey& key, cudaDataType_t type,
                                       cudaDataType_t ctype, void* bias, void* aux, const char* op) {
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    if (auto p = ltDevices[device].plans.find(key)) return p;
  }
  std::shared_ptr<LtPlan> p = buildPlan(handle, key, type, ctype, bias, aux, op);
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

using lt::kNone, lt::kBias, lt::kGelu, lt::kGeluBias, lt::kBGrad, lt::kDGeluBGrad;

// gelu.cu's kernels, for the epilogue fallbacks below.
void launchGeluEpilogue(DType dt, cudaStream_t st, void* pre, const void* bias, void* y, int64_t rows, int64_t cols, const char* call);
void launchDGeluBGrad(int device, DType dt, cudaStream_t st, const void* pre, void* d, void* dbias, int64_t rows, int64_t cols,
                      const char* call);

// Row i of op(A) for transA (A stored [K, M]): column i of the stored A, summed over its K rows by
// launchColumnSums (the BGRAD fallback: bias[i] = sum_k op(A)[i, k]).
template <typename T>
struct StoredColumns {
  const T* a;
  int64_t cols;
  __device__ __forceinline__ int64_t column(int64_t c) const { return c; }
  __device__ __forceinline__ void add(int64_t j, int64_t r, double* acc) const { acc[0] += double(toF32(a[r * cols + j])); }
};

static const char* epilogueName(int64_t e) {
  switch (e) {
    case kNone: return "none";
    case kBias: return "bias";
    case kGelu: return "gelu";
    case kGeluBias: return "gelu+bias";
    case kBGrad: return "bgrad";
    case kDGeluBGrad: return "dgelu+bgrad";
  }
  return "?";
}

// Shared by gemm and gemm_epilogue: argument layout of the cpu gemm, then (bias, epilogue, aux, cDtype).
static void runGemm(KernelCall& k, const char* call, bool withEpilogue) {
  DType dt = k.args.dtype("dtype");
  int64_t batch = k.args.size("batch"), M = k.args.size("m"), N = k.args.size("n"), K = k.args.size("k");
  bool ta = k.args.boolean("transA"), tb = k.args.boolean("transB");
  float alpha = float(k.args.number("alpha")), beta = float(k.args.number("beta"));
  int64_t sA = k.args.size("strideA"), sB = k.args.size("strideB"), sC = k.args.size("strideC");
  if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16)
    fail(Err::DType, std::string(call) + ": dtype " + dtypeName(dt) + " is not supported (f32, bf16, f16)");
  // C's dtype: A's, or f32 for 16-bit A and B (f32 accumulation into an f32 output, e.g. a gradient summed over chunks).
  DType cdt = withEpilogue && k.args.given("cDtype") ? k.args.dtype("cDtype") : dt;
  if (cdt != dt && !(cdt == DType::F32 && dt != DType::F32))
    fail(Err::DType, std::string(call) + ": C dtype " + dtypeName(cdt) + " with A/B " + dtypeName(dt) + " (C is A's dtype, or f32 for bf16/f16 A and B)");
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
    fail(Err::Argument, std::string(call) + ": dimensions must be below 2^31");
  // gemm's optional outDtype (C in another dtype than A and B) is the cpu backend's only.
  if (!withEpilogue && k.args.given("outDtype") && k.args.dtype("outDtype") != dt)
    fail(Err::DType, std::string(call) + ": an output dtype other than the inputs' (" + dtypeName(dt) + " into " + dtypeName(k.args.dtype("outDtype")) +
                         ") is not supported on the cuda backend");
  auto extent = [&](int64_t stride, int64_t mat) { return batch == 0 ? 0 : (batch - 1) * stride + mat; };
  void* pa = k.data("a", dt, extent(sA, M * K));
  void* pb = k.data("b", dt, extent(sB, K * N));
  void* pc = k.data("c", cdt, extent(sC, M * N));
  int64_t epilogue = withEpilogue ? k.args.int64("epilogue") : kNone;
  if (epilogue < kNone || epilogue > kDGeluBGrad) fail(Err::Argument, std::string(call) + ": unknown epilogue " + std::to_string(epilogue));
  const std::string ename = epilogueName(epilogue);
  bool geluFwd = epilogue == kGelu || epilogue == kGeluBias, grad = epilogue == kBGrad || epilogue == kDGeluBGrad;
  if ((geluFwd || epilogue == kDGeluBGrad) && cdt != dt)
    fail(Err::DType, std::string(call) + ": epilogue " + ename + " needs C in A's dtype, got " + dtypeName(cdt) + " for " + dtypeName(dt));
  if (grad && batch > 1) fail(Err::Argument, std::string(call) + ": epilogue " + ename + " takes one matrix (batch 1), got batch " + std::to_string(batch));
  if (epilogue == kBGrad && !ta)
    fail(Err::Argument, std::string(call) + ": epilogue bgrad sums op(A) over K and needs transA (A stored [K, M])");
  if (epilogue == kBGrad && alpha != 1.0f) fail(Err::Argument, std::string(call) + ": epilogue bgrad needs alpha = 1");
  if (epilogue == kDGeluBGrad && beta != 0.0f) fail(Err::Argument, std::string(call) + ": epilogue dgelu+bgrad needs beta = 0");
  bool hasBias = epilogue == kBias || epilogue == kGeluBias || grad;
  // The bias (or bias gradient) in C's dtype: N long, or M for bgrad (one entry per row of op(A)).
  void* bias = hasBias ? k.data("bias", cdt, epilogue == kBGrad ? M : N) : nullptr;
  void* aux = geluFwd ? k.optional("aux", dt, extent(sC, M * N))
              : epilogue == kDGeluBGrad ? k.data("aux", dt, M * N)
                                        : nullptr;
  if (batch == 0 || M == 0 || N == 0) {
    // An empty product: a bias gradient over no columns is empty, over no rows of K (K > 0) nothing to do.
    if (epilogue == kBGrad && M > 0 && N == 0 && batch > 0 && K > 0) {
      // The sums are still due (C is empty): bias = row sums of op(A).
      NT_DISPATCH_FLOAT(dt, call, T, {
        if (cdt == DType::F32)
          launchColumnSums<1>(k.device(), k.stream(), StoredColumns<T>{static_cast<const T*>(pa), M}, K, M, static_cast<float*>(bias),
                              static_cast<float*>(nullptr), call);
        else
          launchColumnSums<1>(k.device(), k.stream(), StoredColumns<T>{static_cast<const T*>(pa), M}, K, M, static_cast<T*>(bias),
                              static_cast<T*>(nullptr), call);
      });
      k.launched();
    }
    return;
  }
  cudaStream_t stream = k.stream();
  if (K == 0) {
    if (epilogue != kNone) fail(Err::Argument, std::string(call) + ": K = 0 with an epilogue");
    int64_t n = extent(sC, M * N);
    NT_DISPATCH_FLOAT(cdt, call, T, scaleKernel<T><<<gridFor(n), kThreads, 0, stream>>>(static_cast<T*>(pc), beta, n));
    k.launched();
    return;
  }
  auto typeOf = [](DType d) { return d == DType::F32 ? CUDA_R_32F : d == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; };
  cudaDataType_t type = typeOf(dt), ctype = typeOf(cdt);
  int64_t es = int64_t(dtypeSize(dt)), ces = int64_t(dtypeSize(cdt));
  lt::PlanKey key;
  key.dtype = int32_t(dt);
  key.cdtype = int32_t(cdt);
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
  // Our row-major C = op(A) op(B) is cuBLASLt's column-major C^T = op(B)^T op(A)^T: its "B" is our A,
  // so the sums of op(A) over K are BGRADB (bias length = columns of cuBLASLt's D = our M); the
  // bias vector of BIAS and DGELU_BGRAD runs along cuBLASLt's rows (our N, per column of our C).
  key.epilogue = epilogue == kNone        ? CUBLASLT_EPILOGUE_DEFAULT
                 : epilogue == kBias      ? CUBLASLT_EPILOGUE_BIAS
                 : epilogue == kGelu      ? (aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU)
                 : epilogue == kGeluBias  ? (aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS)
                 : epilogue == kBGrad     ? CUBLASLT_EPILOGUE_BGRADB
                                          : CUBLASLT_EPILOGUE_DGELU_BGRAD;
  key.alignA = lt::alignmentBytes(reinterpret_cast<uintptr_t>(pa), batch, sA * es);
  key.alignB = lt::alignmentBytes(reinterpret_cast<uintptr_t>(pb), batch, sB * es);
  key.alignC = lt::alignmentBytes(reinterpret_cast<uintptr_t>(pc), batch, sC * ces);
  if (bias) key.alignBias = lt::alignmentBytes(reinterpret_cast<uintptr_t>(bias));
  if (aux) key.alignAux = lt::alignmentBytes(reinterpret_cast<uintptr_t>(aux), batch, sC * es);
  int device = k.device();
  ltRegisterEnv(k.info().Env());
  cublasLtHandle_t handle = ltHandle(device, call);
  void* ws = workspace(device);
  lt::EpilogueCase ec;
  ec.epilogue = int(epilogue);
  ec.fusedAllowed = fusedEpilogues;
  ec.aux = aux != nullptr;
  // cuBLASLt's GELU aux must have a leading dimension (our N) divisible by 8, and a batch stride too.
  ec.auxFits = !aux || (N % 8 == 0 && (batch <= 1 || sC % 8 == 0) && key.alignAux >= 16);
  ec.betaZero = beta == 0.0f;
  ec.batch = batch;
  ec.m = M;
  ec.n = N;
  ec.strideC = batch > 1 ? sC : M * N;
  lt::EpiloguePlan ep = lt::planEpilogue(ec);
  if (ep.fused) {
    // cuBLASLt's fused epilogue, unless its heuristic offers no algorithm or cublasLtMatmul refuses
    // the one it offered (CUBLAS_STATUS_NOT_SUPPORTED: the plan remembers, later calls go composed).
    std::shared_ptr<LtPlan> plan = planFor(device, handle, key, type, ctype, bias, aux, call);
    std::lock_guard<std::mutex> lock(plan->mutex);
    ec.heuristicFound = plan->found;
    if (plan->found) {
      if (bias) setAttr(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, call);
      if (aux) setAttr(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, call);
      cublasStatus_t st = cublasLtMatmul(handle, plan->op, &alpha, pb, plan->a, pa, plan->b, &beta, pc, plan->c, pc, plan->c, &plan->algo, ws,
                                         kWorkspaceBytes, stream);
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
        checkLt(st, "cublasLtMatmul", call);
        return;
      }
      plan->found = false;
      ec.fusedNotSupported = true;
    }
    ep = lt::planEpilogue(ec);
  }
  // The plain GEMM (into C, or into aux for a GELU forward that keeps its pre-activation there),
  // then the epilogue as kernels.
  void* target = ep.intoAux ? aux : pc;
  key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  key.alignBias = 256;
  key.alignAux = 256;
  if (ep.intoAux) key.alignC = lt::alignmentBytes(reinterpret_cast<uintptr_t>(aux), batch, sC * es);
  if (ep.copyCToAux)  // beta·C is added to the product: C's values go where the product is made
    check(cudaMemcpyAsync(aux, pc, size_t(extent(sC, M * N) * es), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  std::shared_ptr<LtPlan> plan = planFor(device, handle, key, type, ctype, nullptr, nullptr, call);
  {
    std::lock_guard<std::mutex> lock(plan->mutex);
    if (!plan->found)
      fail(Err::Native, std::string(call) + ": cuBLASLt has no algorithm for " + dtypeName(dt) + (cdt != dt ? "->f32 " : " ") +
                            std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " (epilogue " + ename + ")",
           "cublasLtMatmulAlgoGetHeuristic");
    checkLt(cublasLtMatmul(handle, plan->op, &alpha, pb, plan->a, pa, plan->b, &beta, target, plan->c, target, plan->c, &plan->algo,
                           ws, kWorkspaceBytes, stream),
            "cublasLtMatmul", call);
  }
  if (epilogue == kNone) return;
  if (epilogue == kBias) {
    int64_t total = batch * M * N;
    NT_DISPATCH_FLOAT(cdt, call, T,
                      addBiasKernel<T><<<gridFor(total), kThreads, 0, stream>>>(static_cast<T*>(pc), static_cast<const T*>(bias), batch,
                                                                               M * N, N, ec.strideC));
  } else if (geluFwd) {  // C has A's dtype here (checked above)
    if (ep.perMatrix) {
      for (int64_t b = 0; b < batch; b++)
        launchGeluEpilogue(dt, stream, static_cast<uint8_t*>(target) + b * sC * es, bias, static_cast<uint8_t*>(pc) + b * sC * es, M, N,
                           call);
    } else {
      launchGeluEpilogue(dt, stream, target, bias, pc, batch * M, N, call);  // contiguous batches: one [batch·M, N] matrix
    }
  } else if (epilogue == kDGeluBGrad) {
    launchDGeluBGrad(device, dt, stream, aux, pc, bias, M, N, call);  // batch 1 (checked above)
  } else {  // kBGrad: bias[i] = sum over the K rows of the stored A [K, M] of column i
    NT_DISPATCH_FLOAT(dt, call, T, {
      if (cdt == DType::F32)
        launchColumnSums<1>(device, stream, StoredColumns<T>{static_cast<const T*>(pa), M}, K, M, static_cast<float*>(bias),
                            static_cast<float*>(nullptr), call);
      else
        launchColumnSums<1>(device, stream, StoredColumns<T>{static_cast<const T*>(pa), M}, K, M, static_cast<T*>(bias),
                            static_cast<T*>(nullptr), call);
    });
  }
  k.launched();
}

// gemm(A, B, C, dtype, batch, M, N, K, transA, transB, alpha, beta, strideA, strideB, strideC)
NT_CUDA_KERNEL("gemm", Gemm) { runGemm(k, call, false); }

// gemm_epilogue(...gemm arguments, bias, epilogue, aux, cDtype?): epilogue 0 none, 1 +bias[N] per row,
// 2 gelu, 3 gelu(. + bias) (aux, optional and like C, receives the pre-GELU values for the backward),
// 4 bgrad: bias[M] = the row sums of op(A) (sum over K; transA, batch 1, alpha 1: the bias gradient
// made by the weight-gradient GEMM, cuBLASLt's BGRADB), 5 dgelu+bgrad: C = op(A)op(B)·gelu'(aux),
// bias[N] = C's column sums (batch 1, beta 0; aux the forward's pre-activation [M, N]: cuBLASLt's
// DGELU_BGRAD). cDtype (default A's dtype) may be f32 for bf16/f16 A and B (f32 accumulation and
// output; bias in C's dtype). GELU is cuBLASLt's tanh approximation. Where cuBLASLt has no
// algorithm for an epilogue, its cublasLtMatmul answers NOT_SUPPORTED for the one its heuristic
// offered, N is not a multiple of 8 with an aux, or NODETRON_CUDA_EPILOGUES=0, the plain GEMM runs
// and the epilogue follows as the kernels of bias_gelu_forward/backward and a column sum
// (lt::planEpilogue in gemm_plan.h decides).
NT_CUDA_KERNEL("gemm_epilogue", GemmEpilogue) { runGemm(k, call, true); }

// gemmPlanCache(device) -> { size, capacity, hits, misses, evictions, workspaces, workspaceBytes }: the
// cuBLASLt plan cache, and the GEMM workspaces held (one per stream that ran a GEMM and still exists).
static Napi::Value GemmPlanCache(const Napi::CallbackInfo& info) {
  Args a{info, "gemmPlanCache"};
  int device = info.Length() > 0 && !info[0].IsUndefined() ? int(a.size(0)) : 0;
  lt::CacheStats st;
  size_t workspaces = 0, workspaceBytes = 0;
  {
    std::lock_guard<std::mutex> lock(ltMutex);
    auto it = ltDevices.find(device);
    if (it != ltDevices.end()) {
      st = it->second.plans.stats();
      workspaces = it->second.workspaces.count();
      workspaceBytes = it->second.workspaces.bytes();
    }
  }
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("size", double(st.size));
  o.Set("capacity", double(kPlanCacheSize));
  o.Set("hits", double(st.hits));
  o.Set("misses", double(st.misses));
  o.Set("evictions", double(st.evictions));
  o.Set("workspaces", double(workspaces));
  o.Set("workspaceBytes", double(workspaceBytes));
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
