// CUDA runtime layer of the cuda addon: status checks that become typed errors, devices, streams and
// events (as numeric handles for lib/cuda/streams.ts), device Storage and the kernel-call helper.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "../core/nt.h"
#include "../core/signatures.h"
#include "allocator.h"

namespace nt::cuda {

// Turns a failed CUDA status into a typed error naming the call ("cudaMalloc: out of memory").
void check(cudaError_t status, const char* call);
// Turns a failed kernel launch (cudaGetLastError) into a typed error naming `call`.
void checkLaunch(const char* call);

// Number of usable GPUs; 0 when there is no driver or no device (driverStatus() says why).
int deviceCount();
// "ok", or why CUDA cannot be used: "no NVIDIA driver found (libcuda.so.1 missing)", ...
std::string driverStatus();
// Fails with BackendUnavailableError (no driver/GPU) or DeviceError (index out of range).
void requireDevice(int device, const char* call);
// Makes `device` current on this thread (cheap when it already is).
void useDevice(int device);

// Streams are numbered: 0 is a device's default (legacy) stream, created streams get ids from 1.
int64_t currentStreamId(int device);
cudaStream_t streamById(int64_t id, int device, const char* call);
cudaStream_t currentStream(int device);
// A non-blocking stream for library work (NCCL), owned by the runtime; returns its id.
int64_t createStream(int device, int priority);

// Graph capture (graph.cc): the stream a capture runs on for the device, -1 when none.
int64_t capturingStream(int device);
// Staging (runtime.cc): replaces the device's staging events after a discarded capture.
void resetStagingEvents(int device);

// cuBLASLt (kernels/gemm.cu): frees the stream's GEMM workspace (streamDestroy, after the stream's
// work finished), and whether fused epilogues are allowed (NODETRON_CUDA_EPILOGUES is not 0).
void releaseGemmWorkspace(int device, int64_t stream);
bool gemmFusedEpilogues();
// Whether the row kernels may use 16-byte loads (NODETRON_CUDA_VECTOR is not 0; kernels/common.cuh).
bool rowVectorLoads();

// Events are numbered too (from 1); JS destroys them with eventDestroy.
int64_t eventCreateId(int device, bool timing);
cudaEvent_t eventHandle(int64_t id, const char* call);

// Device memory held by a JS Storage object: new Storage(bytes, zero, deviceIndex).
class DeviceStorage : public Napi::ObjectWrap<DeviceStorage>, public StorageBytes {
 public:
  static Napi::FunctionReference ctor;
  static void Init(Napi::Env env, Napi::Object exports);
  static DeviceStorage* From(const Napi::Value& v, const char* call, size_t argIndex) {
    return liveStorage<DeviceStorage>(ctor, v, call, argIndex, "cuda");
  }
  explicit DeviceStorage(const Napi::CallbackInfo& info);
  ~DeviceStorage() override;

  int device() const { return device_; }
  void release();

 private:
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  Napi::Value Bytes(const Napi::CallbackInfo& info);
  Napi::Value Disposed(const Napi::CallbackInfo& info);
  Napi::Value Device(const Napi::CallbackInfo& info);

  int device_ = 0;
};

// Argument helper of a kernel call: reads the arguments by their names in the kernel's signature
// (native/core/signatures.h); storages must live on one device; the call runs on that device's
// current stream. launched() turns a failed launch into a typed error.
class KernelCall {
 public:
  // Checks the call against the kernel's signature first.
  KernelCall(const Napi::CallbackInfo& info, const char* call) : info_(info), call_(call), args{kernelArgs(info, call)} {}
  // Pointer of storage argument `name` holding at least `count` elements of dtype (offset in elements).
  template <typename T = void>
  T* data(std::string_view name, DType dtype, int64_t count, int64_t offset = 0) {
    return reinterpret_cast<T*>(bytesOf(args.at(name, "so"), dtype, count, offset));
  }
  // Like data(), but null/undefined gives nullptr (optional inputs such as a bias).
  template <typename T = void>
  T* optional(std::string_view name, DType dtype, int64_t count) {
    return args.given(name) ? data<T>(name, dtype, count) : nullptr;
  }
  int device() const { return device_ < 0 ? 0 : device_; }
  cudaStream_t stream();
  void launched();
  // What NT_CUDA_KERNEL runs after the body: checks the launches when the body asked for a stream.
  void finish() {
    if (streamUsed_) launched();
  }
  const char* name() const { return call_; }
  const Napi::CallbackInfo& info() const { return info_; }

 private:
  uint8_t* bytesOf(size_t i, DType dtype, int64_t count, int64_t offset);
  const Napi::CallbackInfo& info_;
  const char* call_;
  int device_ = -1;
  bool streamUsed_ = false;

 public:
  Args args;
};

// A cuda kernel binding declared the way the cpu backend's NT_KERNEL declares it (signatures.h):
//   NT_CUDA_KERNEL("gelu_forward", GeluForward) { int64_t n = k.args.size("n"); ... launch ... }
// defines GeluForward(k, call) with `k` the KernelCall (the call checked against the kernel's
// signature, arguments read by name) and `call` the kernel's name, registers the binding with
// NT_EXPORT, checks the launches of a body that used a stream and returns undefined to JS.
#define NT_CUDA_KERNEL(name, Fn)                                          \
  static void Fn(::nt::cuda::KernelCall& k, const char* call);            \
  static Napi::Value NT_CONCAT(Fn, Binding)(const Napi::CallbackInfo& info) { \
    ::nt::cuda::KernelCall k(info, name);                                 \
    Fn(k, name);                                                          \
    k.finish();                                                           \
    return info.Env().Undefined();                                        \
  }                                                                       \
  NT_EXPORT(name, NT_CONCAT(Fn, Binding));                                \
  static void Fn(::nt::cuda::KernelCall& k, const char* call)

// The same for a kernel that returns a value to JS (sum_squares, lamb_step): the body returns it.
#define NT_CUDA_KERNEL_VALUE(name, Fn)                                    \
  static Napi::Value Fn(::nt::cuda::KernelCall& k, const char* call);     \
  static Napi::Value NT_CONCAT(Fn, Binding)(const Napi::CallbackInfo& info) { \
    ::nt::cuda::KernelCall k(info, name);                                 \
    Napi::Value result = Fn(k, name);                                     \
    k.finish();                                                           \
    return result;                                                        \
  }                                                                       \
  NT_EXPORT(name, NT_CONCAT(Fn, Binding));                                \
  static Napi::Value Fn(::nt::cuda::KernelCall& k, const char* call)

}  // namespace nt::cuda
