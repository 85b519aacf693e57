// Implementation of the addon core: error factory, export registry, argument checks, host storage.
#include "nt.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace nt {

// ---- dtypes ------------------------------------------------------------------------------------
size_t dtypeSize(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
  }
  return "?";
}

// ---- errors ------------------------------------------------------------------------------------
static Napi::FunctionReference& errorFactory() {
  static Napi::FunctionReference ref;
  return ref;
}

static const char* errCode(Err c) {
  switch (c) {
    case Err::Argument: return "ERR_ARGUMENT";
    case Err::Shape: return "ERR_SHAPE";
    case Err::DType: return "ERR_DTYPE";
    case Err::Device: return "ERR_DEVICE";
    case Err::Disposed: return "ERR_DISPOSED";
    case Err::OutOfMemory: return "ERR_OUT_OF_MEMORY";
    case Err::BackendUnavailable: return "ERR_BACKEND_UNAVAILABLE";
    case Err::Native: return "ERR_NATIVE";
    case Err::Comm: return "ERR_COMM";
    case Err::Timeout: return "ERR_TIMEOUT";
  }
  return "ERR_NATIVE";
}

void fail(Err code, const std::string& message, const std::string& call) { throw Error{code, message, call}; }

void setErrorFactory(const Napi::Function& factory) {
  errorFactory() = Napi::Persistent(factory);
  errorFactory().SuppressDestruct();
}

Napi::Error makeError(Napi::Env env, Err code, const std::string& message, const std::string& call) {
  if (!errorFactory().IsEmpty()) {
    Napi::Value e = errorFactory().Call({Napi::String::New(env, errCode(code)), Napi::String::New(env, message),
                                         Napi::String::New(env, call)});
    if (e.IsObject()) return Napi::Error(env, e);
  }
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, errCode(code)));
  e.Set("call", Napi::String::New(env, call));
  return e;
}

// ---- registry ----------------------------------------------------------------------------------
struct Entry {
  const char* name;
  Fn fn;
};
static std::vector<Entry>& entries() {
  static std::vector<Entry> v;
  return v;
}
static std::vector<ClassInit>& classInits() {
  static std::vector<ClassInit> v;
  return v;
}
Registration::Registration(const char* name, Fn fn) { entries().push_back({name, fn}); }
ClassRegistration::ClassRegistration(ClassInit init) { classInits().push_back(init); }

static AfterCall afterCallHook = nullptr;
void setAfterCallHook(AfterCall hook) { afterCallHook = hook; }

bool envFlag(const char* value) {
  if (!value) return false;
  std::string v(value);
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

Napi::Value guarded(const char* name, Fn fn, const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  try {
    Napi::Value result = fn(info);
    if (afterCallHook) afterCallHook(name);
    return result;
  } catch (const Error& e) {
    makeError(env, e.code, e.message, e.call.empty() ? name : e.call).ThrowAsJavaScriptException();
  } catch (const std::bad_alloc&) {
    makeError(env, Err::OutOfMemory, "out of host memory", name).ThrowAsJavaScriptException();
  } catch (const Napi::Error& e) {
    throw;
  } catch (const std::exception& e) {
    makeError(env, Err::Native, e.what(), name).ThrowAsJavaScriptException();
  }
  return env.Undefined();
}

// ---- arguments ---------------------------------------------------------------------------------
void Args::count(size_t n) const {
  if (info.Length() < n)
    fail(Err::Argument, std::string(call) + ": expected " + std::to_string(n) + " arguments, got " +
                            std::to_string(info.Length()));
}
// Argument i of a.call when it is there and passes `is`, else "<call>: argument i must be <what>".
static Napi::Value argOfKind(const Args& a, size_t i, bool (Napi::Value::*is)() const, const char* what) {
  if (i >= a.info.Length() || !(a.info[i].*is)())
    fail(Err::Argument, std::string(a.call) + ": argument " + std::to_string(i) + " must be " + what);
  return a.info[i];
}
double Args::number(size_t i) const {
  return argOfKind(*this, i, &Napi::Value::IsNumber, "a number").As<Napi::Number>().DoubleValue();
}
int64_t Args::int64(size_t i) const {
  double d = number(i);
  if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9007199254740991.0)
    fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must be an integer, got " +
                            std::to_string(d));
  return static_cast<int64_t>(d);
}
int64_t Args::size(size_t i) const {
  int64_t v = int64(i);
  if (v < 0) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must be >= 0");
  return v;
}
bool Args::boolean(size_t i) const {
  return argOfKind(*this, i, &Napi::Value::IsBoolean, "a boolean").As<Napi::Boolean>().Value();
}
DType Args::dtype(size_t i) const {
  int64_t v = int64(i);
  if (v < 0 || v > 4) fail(Err::DType, std::string(call) + ": unknown dtype code " + std::to_string(v));
  return static_cast<DType>(v);
}
std::string Args::string(size_t i) const {
  return argOfKind(*this, i, &Napi::Value::IsString, "a string").As<Napi::String>().Utf8Value();
}

// ---- host memory -------------------------------------------------------------------------------
HostStats& hostStats() {
  static HostStats s;
  return s;
}

// Requests beyond this are refused before asking the system: Linux overcommit would otherwise
// "succeed" for absurd sizes and kill the process on first touch.
static size_t hostLimitBytes() {
  static size_t limit = [] {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : (size_t(1) << 40);
  }();
  return limit;
}

// Host caching: blocks of 64 KiB and more are kept after free and reused for requests of the same
// size class. glibc serves such sizes with fresh mmap()s, whose page faults cost more than the
// GEMM or kernel that fills them (measured: a new 4 MiB output per 1024^3 matmul lost 8%).
// Size classes are multiples of 1/8 of the request's power of two, bounding waste to 12.5%.
// The cache holds at most a quarter of the machine's memory; emptyCache() returns it all.
static constexpr size_t kCacheMin = 64 * 1024;
static std::mutex hostMutex;
static std::unordered_map<size_t, std::vector<void*>> hostCache;
static size_t hostCachedBytes = 0;

static size_t sizeClass(size_t bytes) {
  if (bytes < kCacheMin) return (bytes + 63) / 64 * 64;
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes));
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

static void emptyHostCacheLocked() {
  for (auto& [cls, blocks] : hostCache)
    for (void* p : blocks) std::free(p);
  hostCache.clear();
  HostStats& s = hostStats();
  s.reserved -= static_cast<int64_t>(hostCachedBytes);
  hostCachedBytes = 0;
}

void emptyHostCache() {
  std::lock_guard<std::mutex> lock(hostMutex);
  emptyHostCacheLocked();
}

// NODETRON_MEMORY_LIMIT (set through the cpu addon's setHostMemoryLimit by lib/native.ts): the most
// bytes of host storage (counted in size classes, as memoryStats' allocated) live at once; 0: no limit.
// A process can thus be given less memory than the machine's, e.g. to show a sequence that does not
// fit one process training under context parallelism.
static size_t userHostLimit = 0;

void* hostAlloc(size_t bytes, const char* call) {
  if (bytes == 0) return nullptr;
  if (bytes > hostLimitBytes())
    fail(Err::OutOfMemory,
         "cannot allocate " + std::to_string(bytes) + " bytes on cpu: the machine has " +
             std::to_string(hostLimitBytes()) + " bytes of memory",
         call);
  size_t cls = sizeClass(bytes);
  std::lock_guard<std::mutex> lock(hostMutex);
  HostStats& s = hostStats();
  if (userHostLimit && static_cast<size_t>(s.allocated) + cls > userHostLimit)
    fail(Err::OutOfMemory,
         "cannot allocate " + std::to_string(bytes) + " bytes on cpu: NODETRON_MEMORY_LIMIT is " + std::to_string(userHostLimit) +
             " bytes and " + std::to_string(s.allocated) + " are allocated",
         call);
  void* p = nullptr;
  if (cls >= kCacheMin) {
    auto it = hostCache.find(cls);
    if (it != hostCache.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      hostCachedBytes -= cls;
      s.reserved -= static_cast<int64_t>(cls);
    }
  }
  if (!p) {
    p = std::aligned_alloc(64, cls);
    if (!p && hostCachedBytes) {  // free the cache and retry once
      emptyHostCacheLocked();
      p = std::aligned_alloc(64, cls);
    }
    if (!p)
      fail(Err::OutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes on cpu (aligned_alloc failed)", call);
  }
  s.allocated += static_cast<int64_t>(cls);
  s.reserved += static_cast<int64_t>(cls);
  s.allocations++;
  if (s.allocated > s.peak) s.peak = s.allocated;
  return p;
}

void hostFree(void* p, size_t bytes) {
  if (!p) return;
  size_t cls = sizeClass(bytes);
  std::lock_guard<std::mutex> lock(hostMutex);
  HostStats& s = hostStats();
  s.allocated -= static_cast<int64_t>(cls);
  if (cls >= kCacheMin && hostCachedBytes + cls <= hostLimitBytes() / 4) {
    hostCache[cls].push_back(p);
    hostCachedBytes += cls;
    return;
  }
  s.reserved -= static_cast<int64_t>(cls);
  std::free(p);
}

// ---- Storage -----------------------------------------------------------------------------------
Napi::FunctionReference Storage::ctor;

void Storage::Init(Napi::Env env, Napi::Object exports) {
  Napi::Function fn = DefineClass(env, "Storage",
                                  {InstanceMethod("dispose", &Storage::Dispose),
                                   InstanceAccessor("bytes", &Storage::Bytes, nullptr),
                                   InstanceAccessor("disposed", &Storage::Disposed, nullptr)});
  ctor = Napi::Persistent(fn);
  ctor.SuppressDestruct();
  exports.Set("Storage", fn);
}

// new Storage(bytes, zero), or new Storage(parent, offsetBytes, bytes): an alias of a range of parent.
Storage::Storage(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Storage>(info), env_(info.Env()) {
  try {
    Args a{info, "Storage"};
    if (info.Length() > 0 && info[0].IsObject()) {
      a.count(3);
      aliasOf(*Storage::From(info[0], "Storage", 0), static_cast<size_t>(a.size(1)), static_cast<size_t>(a.size(2)), "Storage");
      return;
    }
    int64_t bytes = a.size(0);
    bool zero = info.Length() > 1 && info[1].ToBoolean().Value();
    bytes_ = static_cast<size_t>(bytes);
    empty_ = bytes_ == 0;
    data_ = static_cast<uint8_t*>(hostAlloc(bytes_, "Storage"));
    size_t n = bytes_;
    block_ = std::shared_ptr<uint8_t>(data_, [n](uint8_t* p) { if (p) hostFree(p, n); });
    if (zero && data_) std::memset(data_, 0, bytes_);
    // Let V8 see large host buffers so the GC backstop runs under memory pressure.
    reportedExternal_ = bytes_ >= kCacheMin ? static_cast<int64_t>(bytes_) : 0;
    if (reportedExternal_) Napi::MemoryManagement::AdjustExternalMemory(info.Env(), reportedExternal_);
  } catch (const Error& e) {
    makeError(info.Env(), e.code, e.message, e.call.empty() ? "Storage" : e.call).ThrowAsJavaScriptException();
  } catch (const std::bad_alloc&) {
    makeError(info.Env(), Err::OutOfMemory, "out of host memory", "Storage").ThrowAsJavaScriptException();
  }
}

// A storage reaching its destructor still holding memory was never disposed: the garbage collector
// found it. Counting here is the leak backstop (cheaper per tensor than a FinalizationRegistry).
static std::atomic<int64_t> leakedStorages{0};
int64_t leakedStorageCount() { return leakedStorages.load(); }

Storage::~Storage() {
  if (data_ || empty_) leakedStorages++;
  release();
}

void Storage::release() {
  dropBytes();  // a released empty storage reads as disposed too
  if (reportedExternal_ && env_) {
    int64_t adj;
    napi_adjust_external_memory(env_, -reportedExternal_, &adj);
    reportedExternal_ = 0;
  }
}

Napi::Value Storage::Dispose(const Napi::CallbackInfo& info) {
  release();
  return info.Env().Undefined();
}
Napi::Value Storage::Bytes(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(bytes_)); }
Napi::Value Storage::Disposed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), disposed()); }

void StorageBytes::aliasOf(const StorageBytes& parent, size_t offsetBytes, size_t nbytes, const char* call) {
  parent.checkRange(offsetBytes, nbytes, call);
  block_ = parent.block_;
  data_ = parent.data_ ? parent.data_ + offsetBytes : nullptr;
  bytes_ = nbytes;
  empty_ = nbytes == 0;
  if (empty_) data_ = nullptr;
  alias_ = true;
}

void StorageBytes::checkRange(size_t offsetBytes, size_t nbytes, const char* call) const {
  if (offsetBytes > bytes_ || nbytes > bytes_ - offsetBytes)
    fail(Err::Argument, std::string(call) + ": range [" + std::to_string(offsetBytes) + ", " +
                            std::to_string(offsetBytes + nbytes) + ") lies outside a storage of " +
                            std::to_string(bytes_) + " bytes");
}

uint8_t* storageData(const Napi::CallbackInfo& info, size_t i, const char* call, DType dtype, int64_t count) {
  Storage* s = Storage::From(info[i], call, i);
  s->checkRange(0, static_cast<size_t>(count) * dtypeSize(dtype), call);
  return s->data();
}

RawBytes typedArrayBytes(const Napi::Value& v, const char* call, size_t argIndex) {
  if (v.IsTypedArray()) {
    // The C call gives the data pointer of views on a SharedArrayBuffer too (Napi::ArrayBuffer refuses those).
    Napi::TypedArray t = v.As<Napi::TypedArray>();
    napi_typedarray_type type;
    size_t length = 0, offset = 0;
    void* data = nullptr;
    napi_value buffer;
    if (napi_get_typedarray_info(v.Env(), v, &type, &length, &data, &buffer, &offset) != napi_ok) {
      fail(Err::Argument, std::string(call) + ": argument " + std::to_string(argIndex) + " is a typed array whose memory cannot be read");
    }
    if (t.ByteLength() == 0) return {nullptr, 0};
    return {static_cast<uint8_t*>(data), t.ByteLength()};
  }
  if (v.IsArrayBuffer()) {
    Napi::ArrayBuffer buf = v.As<Napi::ArrayBuffer>();
    return {static_cast<uint8_t*>(buf.Data()), buf.ByteLength()};
  }
  fail(Err::Argument, std::string(call) + ": argument " + std::to_string(argIndex) + " must be a typed array");
}

// ---- module init -------------------------------------------------------------------------------
static Napi::Value SetErrorFactory(const Napi::CallbackInfo& info) {
  if (!info[0].IsFunction()) fail(Err::Argument, "setErrorFactory: expected a function");
  setErrorFactory(info[0].As<Napi::Function>());
  return info.Env().Undefined();
}
NT_EXPORT("setErrorFactory", SetErrorFactory);

// Host memory statistics; the cuda addon exports its allocator's statistics under these names.
#ifndef NT_BACKEND_CUDA
static Napi::Value MemoryStats(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  HostStats& s = hostStats();
  o.Set("allocated", double(s.allocated));
  o.Set("reserved", double(s.reserved));
  o.Set("peak", double(s.peak));
  o.Set("allocations", double(s.allocations));
  o.Set("leaked", double(leakedStorageCount()));
  return o;
}
NT_EXPORT("memoryStats", MemoryStats);

static Napi::Value LeakedStorages(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), double(leakedStorageCount()));
}
NT_EXPORT("leakedStorages", LeakedStorages);

static Napi::Value ResetPeak(const Napi::CallbackInfo& info) {
  hostStats().peak = hostStats().allocated;
  return info.Env().Undefined();
}
NT_EXPORT("resetPeakMemory", ResetPeak);

static Napi::Value EmptyCache(const Napi::CallbackInfo& info) {
  emptyHostCache();
  return info.Env().Undefined();
}
NT_EXPORT("emptyCache", EmptyCache);

// setHostMemoryLimit(bytes): NODETRON_MEMORY_LIMIT (0: none).
static Napi::Value SetHostMemoryLimit(const Napi::CallbackInfo& info) {
  if (!info[0].IsNumber()) fail(Err::Argument, "setHostMemoryLimit: expected a number of bytes");
  double v = info[0].As<Napi::Number>().DoubleValue();
  if (!(v >= 0) || v > 9.0e15) fail(Err::Argument, "setHostMemoryLimit: bytes must be a non-negative integer");
  std::lock_guard<std::mutex> lock(hostMutex);
  userHostLimit = static_cast<size_t>(v);
  return info.Env().Undefined();
}
NT_EXPORT("setHostMemoryLimit", SetHostMemoryLimit);
#endif

// setParentDeathSignal(signal): the kernel sends `signal` to this process when its parent (the thread
// that started it) ends: a worker of `nodetron launch` does not outlive a launcher killed with
// SIGKILL. Returns false where the kernel has no such setting (not Linux); the caller decides what
// to do when the parent is already gone (this never ends the process itself).
static Napi::Value SetParentDeathSignal(const Napi::CallbackInfo& info) {
  if (!info[0].IsNumber()) fail(Err::Argument, "setParentDeathSignal: expected a signal number");
  double v = info[0].As<Napi::Number>().DoubleValue();
  if (!(v >= 1 && v <= 64) || v != double(int(v))) fail(Err::Argument, "setParentDeathSignal: the signal must be an integer in [1, 64]");
#ifdef __linux__
  if (prctl(PR_SET_PDEATHSIG, static_cast<unsigned long>(v), 0, 0, 0) != 0) {
    fail(Err::Native, std::string("prctl(PR_SET_PDEATHSIG) failed: ") + std::strerror(errno), "setParentDeathSignal");
  }
  return Napi::Boolean::New(info.Env(), true);
#else
  return Napi::Boolean::New(info.Env(), false);
#endif
}
NT_EXPORT("setParentDeathSignal", SetParentDeathSignal);

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  Storage::Init(env, exports);
  for (ClassInit init : classInits()) init(env, exports);
  for (const Entry& e : entries()) {
    Fn fn = e.fn;
    const char* name = e.name;
    exports.Set(name, Napi::Function::New(
                          env, [name, fn](const Napi::CallbackInfo& info) { return guarded(name, fn, info); }, name));
  }
  return exports;
}

}  // namespace nt

static Napi::Object InitAll(Napi::Env env, Napi::Object exports) { return nt::Init(env, exports); }
NODE_API_MODULE(nodetron, InitAll)
