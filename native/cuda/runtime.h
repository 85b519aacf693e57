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

// Argument helper of a kernel call: storages must live on one device; the call runs on that
// device's current stream. launched() turns a failed launch into a typed error.
class KernelCall {
 public:
  // Checks the call against the kernel's signature (native/core/signatures.h) first.
  KernelCall(const Napi::CallbackInfo& info, const char* call) : info_(info), call_(call), args{kernelArgs(info, call)} {}
  // Pointer of storage argument i holding at least `count` elements of dtype (offset in elements).
  template <typename T = void>
  T* data(size_t i, DType dtype, int64_t count, int64_t offset = 0) {
    return reinterpret_cast<T*>(bytesOf(i, dtype, count, offset));
  }
  // Like data(), but null/undefined gives nullptr (optional inputs such as a bias).
  template <typename T = void>
  T* optional(size_t i, DType dtype, int64_t count) {
    if (info_[i].IsNull() || info_[i].IsUndefined()) return nullptr;
    return data<T>(i, dtype, count);
  }
  int device() const { return device_ < 0 ? 0 : device_; }
  cudaStream_t stream();
  void launched();
  const char* name() const { return call_; }

 private:
  uint8_t* bytesOf(size_t i, DType dtype, int64_t count, int64_t offset);
  const Napi::CallbackInfo& info_;
  const char* call_;
  int device_ = -1;

 public:
  Args args;
};

}  // namespace nt::cuda
