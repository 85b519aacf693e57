// GEMM on the cuda backend through cuBLASLt: f32 (tf32 when allowed), bf16/f16 with f32
// accumulation, transposes, strided batches, and bias / GELU epilogues. Row-major like the cpu gemm.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <utility>

#include "common.cuh"

namespace nt::cuda {

static void checkLt(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  Err code = s == CUBLAS_STATUS_ALLOC_FAILED ? Err::OutOfMemory : Err::Native;
  fail(code, std::string(call) + ": " + cublasLtGetStatusString(s) + " (" + cublasLtGetStatusName(s) + ")", call);
}

static bool allowTf32 = false;
static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  std::map<int64_t, void*> workspaces;  // per stream: gemms on different streams may overlap
};
static std::mutex ltMutex;
static std::map<int, LtDevice> ltDevices;

static cublasLtHandle_t ltHandle(int device) {
  std::lock_guard<std::mutex> lock(ltMutex);
  LtDevice& d = ltDevices[device];
  if (!d.handle) checkLt(cublasLtCreate(&d.handle), "cublasLtCreate");
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

// Owns cuBLASLt descriptors for one call.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename T>
static void setAttr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* call) {
  checkLt(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(T)), call);
}

static cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l;
  checkLt(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    int32_t count = int32_t(batch);
    checkLt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
            "cublasLtMatrixLayoutSetAttribute");
    checkLt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
            "cublasLtMatrixLayoutSetAttribute");
  }
  return l;
}

template <typename T>
__global__ void scaleKernel(T* c, float beta, int64_t n) {
  NT_GRID_STRIDE(i, n) c[i] = fromF32<T>(beta == 0.0f ? 0.0f : beta * toF32(c[i]));
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
  cublasComputeType_t compute = dt == DType::F32 && allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B.
  LtCall c;
  checkLt(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublasOperation_t opA = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opB = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  setAttr(c.op, CUBLASLT_MATMUL_DESC_TRANSA, opA, call);
  setAttr(c.op, CUBLASLT_MATMUL_DESC_TRANSB, opB, call);
  c.a = layout(type, tb ? K : N, tb ? N : K, tb ? K : N, batch, sB);
  c.b = layout(type, ta ? M : K, ta ? K : M, ta ? M : K, batch, sA);
  c.c = layout(type, N, M, N, batch, sC);
  if (epilogue != kNone) {
    cublasLtEpilogue_t e = epilogue == kBias ? CUBLASLT_EPILOGUE_BIAS
                           : epilogue == kGelu ? (aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU)
                                               : (aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS);
    setAttr(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, e, call);
    if (bias) {
      setAttr(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, call);
      if (batch > 1) setAttr(c.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t(0), call);
    }
    if (aux) {
      setAttr(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, call);
      setAttr(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, N, call);
      if (batch > 1) setAttr(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, sC, call);
    }
  }
  int device = k.device();
  cublasLtHandle_t handle = ltHandle(device);
  void* ws = workspace(device);
  checkLt(cublasLtMatmulPreferenceCreate(&c.pref), "cublasLtMatmulPreferenceCreate");
  size_t wsBytes = kWorkspaceBytes;
  checkLt(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof(wsBytes)),
          "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  checkLt(cublasLtMatmulAlgoGetHeuristic(handle, c.op, c.a, c.b, c.c, c.c, c.pref, 1, &result, &found),
          "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    fail(Err::Native, std::string(call) + ": cuBLASLt has no algorithm for " + dtypeName(dt) + " " + std::to_string(M) + "x" +
                          std::to_string(N) + "x" + std::to_string(K) + " (epilogue " + std::to_string(epilogue) + ")");
  checkLt(cublasLtMatmul(handle, c.op, &alpha, pb, c.a, pa, c.b, &beta, pc, c.c, pc, c.c, &result.algo, ws, kWorkspaceBytes,
                         stream),
          "cublasLtMatmul");
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

// setMatmulTf32(allow): f32 GEMMs may use TF32 tensor cores (setFloat32MatmulPrecision('high')).
static Napi::Value SetMatmulTf32(const Napi::CallbackInfo& info) {
  Args a{info, "setMatmulTf32"};
  allowTf32 = a.boolean(0);
  return info.Env().Undefined();
}
NT_EXPORT("setMatmulTf32", SetMatmulTf32);

}  // namespace nt::cuda
