// Shared core of the nodetron addon: dtypes, typed errors, the export registry and host storage.
// Every native file includes this; nothing here decides policy (that lives in lib/).
#pragma once

#include <napi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include "half.h"

namespace nt {

// ---- dtypes (codes shared with lib/dtype.ts) ---------------------------------------------------
enum class DType : int32_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3, U8 = 4 };
size_t dtypeSize(DType t);
const char* dtypeName(DType t);

// bf16/f16 conversions: half.h (shared with the cuda kernels).

// ---- typed errors ------------------------------------------------------------------------------
// Codes mirror lib/errors.ts. The JS side registers a factory that builds the right NodetronError
// subclass, so the error carries the caller's JS stack and a `call` naming the failed native call.
enum class Err { Argument, Shape, DType, Device, Disposed, OutOfMemory, BackendUnavailable, Native, Comm, Timeout };

// Thrown from helpers that do not hold an Env; converted to a JS error at the binding boundary.
struct Error {
  Err code;
  std::string message;
  std::string call;
};

[[noreturn]] void fail(Err code, const std::string& message, const std::string& call = "");
Napi::Error makeError(Napi::Env env, Err code, const std::string& message, const std::string& call);
void setErrorFactory(const Napi::Function& factory);

// ---- export registry ---------------------------------------------------------------------------
// A native file registers its functions with NT_EXPORT; the module init exports them all, so new
// kernel families need no edit to a central list. Each wrapped call turns nt::Error and
// std::bad_alloc into typed JS errors.
using Fn = Napi::Value (*)(const Napi::CallbackInfo&);
struct Registration {
  Registration(const char* name, Fn fn);
};
using ClassInit = void (*)(Napi::Env, Napi::Object);
struct ClassRegistration {
  explicit ClassRegistration(ClassInit init);
};
Napi::Value guarded(const char* name, Fn fn, const Napi::CallbackInfo& info);
// Runs after every registered call that returned normally, inside guarded(), so what it throws
// becomes that call's typed error. Unset by default; the cuda addon's debug mode
// (NODETRON_CUDA_SYNC=1) synchronizes there.
using AfterCall = void (*)(const char* name);
void setAfterCallHook(AfterCall hook);

// An on/off environment flag's value: "1", "true", "yes", "on" (any case) are on; unset, empty and
// anything else are off.
bool envFlag(const char* value);

#define NT_CONCAT_(a, b) a##b
#define NT_CONCAT(a, b) NT_CONCAT_(a, b)
#define NT_EXPORT(name, fn) static ::nt::Registration NT_CONCAT(nt_reg_, __LINE__)(name, fn)
#define NT_EXPORT_CLASS(init) static ::nt::ClassRegistration NT_CONCAT(nt_creg_, __LINE__)(init)

// ---- argument helpers (throw nt::Error with the call's name) -----------------------------------
// A kernel's declared signature, parsed (signatures.h): what Args reads arguments by name from.
struct ParsedSignature;
struct Args {
  const Napi::CallbackInfo& info;
  const char* call;
  // Set by kernelArgs() (signatures.h); the by-name readers below need it.
  const ParsedSignature* sig = nullptr;
  void count(size_t n) const;
  double number(size_t i) const;
  int64_t int64(size_t i) const;          // integral, finite
  int64_t size(size_t i) const;           // integral, >= 0, < 2^53
  bool boolean(size_t i) const;
  DType dtype(size_t i) const;
  std::string string(size_t i) const;

  // The same reads by the argument's name in the kernel's signature (signatures.cc): the name must be
  // declared there with a kind the read accepts (`kinds`: signature kind letters), else a typed
  // Native error naming the kernel and the argument; so a kernel body never counts positions.
  size_t at(std::string_view name, const char* kinds) const;
  double number(std::string_view name) const { return number(at(name, "f")); }
  int64_t int64(std::string_view name) const { return int64(at(name, "i")); }
  int64_t size(std::string_view name) const { return size(at(name, "n")); }
  bool boolean(std::string_view name) const { return boolean(at(name, "b")); }
  DType dtype(std::string_view name) const { return dtype(at(name, "d")); }
  // Whether argument `name` was passed and is not null/undefined (optional storages and arguments).
  bool given(std::string_view name) const;
  // An Int32Array argument (kind I) as int64 values; `expected` >= 0 demands that many entries.
  std::vector<int64_t> ints(std::string_view name, int64_t expected = -1) const;
};

// ---- host storage ------------------------------------------------------------------------------
// 64-byte aligned host memory with statistics; blocks of 64 KiB and more are cached after free
// (reserved counts the cache; emptyHostCache() returns it to the system).
struct HostStats {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak = 0;
  int64_t allocations = 0;
};
HostStats& hostStats();
void* hostAlloc(size_t bytes, const char* call);
void hostFree(void* p, size_t bytes);
void emptyHostCache();
// Storages the garbage collector reclaimed without dispose() (the leak backstop).
int64_t leakedStorageCount();

// The bytes behind a JS Storage object, shared by the cpu Storage and the cuda DeviceStorage: the
// pointer, the size, and whether it was disposed (an empty storage is live until released).
// A storage either allocates its bytes or is an alias: a view of the range [offset, offset + bytes)
// of another storage's allocation (what gradient buckets hand out as parameters' gradients). Both
// hold the allocation through `block_`, so the bytes are freed when the allocating storage and
// every alias of it are released, in any order: disposing one never leaves another dangling.
class StorageBytes {
 public:
  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool disposed() const { return data_ == nullptr && !empty_; }
  bool isAlias() const { return alias_; }
  // Checks that [offsetBytes, offsetBytes + nbytes) lies inside the storage.
  void checkRange(size_t offsetBytes, size_t nbytes, const char* call) const;

 protected:
  // Makes this storage an alias of [offsetBytes, offsetBytes + nbytes) of `parent` (live; range checked).
  void aliasOf(const StorageBytes& parent, size_t offsetBytes, size_t nbytes, const char* call);
  // Drops this storage's hold on its bytes (the allocation is freed with its last holder).
  void dropBytes() {
    data_ = nullptr;
    block_.reset();
    empty_ = false;
    bytes_ = 0;
  }

  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  bool empty_ = false;
  bool alias_ = false;
  // The allocation (its deleter frees it); shared by the allocating storage and its aliases.
  std::shared_ptr<uint8_t> block_;
};

// Argument argIndex of `call` as a live storage of class S (JS class `ctor`), or a typed error
// saying it is not a `kind` Storage ("cpu", "cuda") or was disposed.
template <class S>
S* liveStorage(const Napi::FunctionReference& ctor, const Napi::Value& v, const char* call, size_t argIndex,
               const char* kind) {
  if (!v.IsObject() || !v.As<Napi::Object>().InstanceOf(ctor.Value()))
    fail(Err::Argument, std::string(call) + ": argument " + std::to_string(argIndex) + " must be a " + kind + " Storage");
  S* s = Napi::ObjectWrap<S>::Unwrap(v.As<Napi::Object>());
  if (s->disposed()) fail(Err::Disposed, std::string(call) + ": argument " + std::to_string(argIndex) + " was disposed");
  return s;
}

class Storage : public Napi::ObjectWrap<Storage>, public StorageBytes {
 public:
  static Napi::FunctionReference ctor;
  static void Init(Napi::Env env, Napi::Object exports);
  static Storage* From(const Napi::Value& v, const char* call, size_t argIndex) {
    return liveStorage<Storage>(ctor, v, call, argIndex, "cpu");
  }
  explicit Storage(const Napi::CallbackInfo& info);
  ~Storage() override;

  void release();

  template <typename T>
  T* as() const { return reinterpret_cast<T*>(data_); }

 private:
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  Napi::Value Bytes(const Napi::CallbackInfo& info);
  Napi::Value Disposed(const Napi::CallbackInfo& info);

  int64_t reportedExternal_ = 0;
  napi_env env_ = nullptr;
};

// Storage plus an element count check: returns the data pointer of a live storage holding at least
// `count` elements of `dtype`.
uint8_t* storageData(const Napi::CallbackInfo& info, size_t i, const char* call, DType dtype, int64_t count);

// A JS typed array's raw bytes.
struct RawBytes {
  uint8_t* data;
  size_t bytes;
};
RawBytes typedArrayBytes(const Napi::Value& v, const char* call, size_t argIndex);

}  // namespace nt
