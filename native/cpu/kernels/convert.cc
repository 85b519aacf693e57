// Conversions between dtypes (cast kernel family) and host transfers to and from JS typed arrays.
#include "convert.h"

#include <cmath>
#include <limits>

#include "util.h"

namespace nt::cpu {

// bf16 <-> f32 runs, compiled per SIMD level (util.h NT_SIMD) and split over the kernel threads when
// long: every 16-bit kernel's F32View and every cast go through them. The rounding is f32ToBf16's
// (nearest even, NaN kept quiet with its sign), written without a branch so that it vectorizes.
NT_SIMD_BODY void bf16RunToF32Body(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = bf16ToF32(s[i]);
}
NT_SIMD(bf16RunToF32, (const uint16_t* s, float* d, int64_t n), (s, d, n))

NT_SIMD_BODY void f32RunToBf16Body(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    std::memcpy(&u, s + i, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    d[i] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}
NT_SIMD(f32RunToBf16, (const float* s, uint16_t* d, int64_t n), (s, d, n))

// Elements per part below which a conversion stays on one thread.
static constexpr int64_t kConvertMinPart = int64_t(1) << 16;

template <class F>
static void convertRuns(int64_t n, F run) {
  if (n < 2 * kConvertMinPart) {
    run(int64_t(0), n);
    return;
  }
  parallelRows(n, 1, run);  // n >= kParallelMinWork: one range per thread
}

void toF32(const uint8_t* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::BF16: {
      auto s = reinterpret_cast<const uint16_t*>(src);
      convertRuns(n, [&](int64_t b, int64_t e) { bf16RunToF32(s + b, dst + b, e - b); });
      break;
    }
    case DType::F16: {
      auto s = reinterpret_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = f16ToF32(s[i]);
      break;
    }
    case DType::I32: {
      auto s = reinterpret_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = float(s[i]);
      break;
    }
    case DType::U8:
      for (int64_t i = 0; i < n; i++) dst[i] = float(src[i]);
      break;
  }
}

template <typename I>
static I saturate(float v) {
  if (std::isnan(v)) return 0;
  float lo = float(std::numeric_limits<I>::min()), hi = float(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

void fromF32(const float* src, uint8_t* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::BF16: {
      auto d = reinterpret_cast<uint16_t*>(dst);
      convertRuns(n, [&](int64_t b, int64_t e) { f32RunToBf16(src + b, d + b, e - b); });
      break;
    }
    case DType::F16: {
      auto d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = f32ToF16(src[i]);
      break;
    }
    case DType::I32: {
      auto d = reinterpret_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = saturate<int32_t>(src[i]);
      break;
    }
    case DType::U8:
      for (int64_t i = 0; i < n; i++) dst[i] = saturate<uint8_t>(src[i]);
      break;
  }
}

F32View::F32View(uint8_t* data, DType dtype, int64_t n, bool load)
    : raw_(data), dtype_(dtype), n_(n), ptr_(nullptr), owned_(dtype != DType::F32) {
  if (!owned_) {
    ptr_ = reinterpret_cast<float*>(data);
  } else if (n > 0) {
    ptr_ = static_cast<float*>(hostAlloc(size_t(n) * 4, "F32View"));
    if (load) toF32(raw_, dtype_, ptr_, n_);
  }
}
F32View::~F32View() {
  if (owned_) hostFree(ptr_, size_t(n_) * 4);
}
void F32View::commit() {
  if (owned_ && n_ > 0) fromF32(ptr_, raw_, dtype_, n_);
}

// cast(src, srcDtype, dst, dstDtype, n): element conversion through f32 (i32 -> i32 copies exactly).
NT_KERNEL("cast", Cast) {
  DType st = a.dtype("srcDtype"), dt = a.dtype("dstDtype");
  int64_t n = a.size("n");
  uint8_t* src = storageData(info, a.at("src", "so"), call, st, n);
  uint8_t* dst = storageData(info, a.at("dst", "so"), call, dt, n);
  if (st == dt) {
    std::memmove(dst, src, size_t(n) * dtypeSize(st));
  } else if (dt == DType::F32) {  // to f32 (autocast's casts back): straight into the output
    toF32(src, st, reinterpret_cast<float*>(dst), n);
  } else if (st == DType::F32) {  // from f32 (autocast's casts to bf16/f16)
    fromF32(reinterpret_cast<const float*>(src), dst, dt, n);
  } else if (st == DType::I32 && dt == DType::U8) {
    auto s = reinterpret_cast<const int32_t*>(src);
    for (int64_t i = 0; i < n; i++) dst[i] = uint8_t(s[i] < 0 ? 0 : s[i] > 255 ? 255 : s[i]);
  } else if (st == DType::U8 && dt == DType::I32) {
    auto d = reinterpret_cast<int32_t*>(dst);
    for (int64_t i = 0; i < n; i++) d[i] = src[i];
  } else {
    const int64_t chunk = 4096;
    float tmp[chunk];
    for (int64_t i = 0; i < n; i += chunk) {
      int64_t m = std::min(chunk, n - i);
      toF32(src + i * dtypeSize(st), st, tmp, m);
      fromF32(tmp, dst + i * dtypeSize(dt), dt, m);
    }
  }
}

// write(storage, offsetBytes, typedArray): copies the typed array's bytes into the storage.
static Napi::Value Write(const Napi::CallbackInfo& info) {
  TypedArrayRange<Storage> r = typedArrayRange<Storage>(info, "write");
  if (r.array.bytes) std::memcpy(r.storage->data() + r.offset, r.array.data, r.array.bytes);
  return info.Env().Undefined();
}
NT_EXPORT("write", Write);

// read(storage, offsetBytes, typedArray): copies storage bytes into the typed array (its length).
static Napi::Value Read(const Napi::CallbackInfo& info) {
  TypedArrayRange<Storage> r = typedArrayRange<Storage>(info, "read");
  if (r.array.bytes) std::memcpy(r.array.data, r.storage->data() + r.offset, r.array.bytes);
  return info.Env().Undefined();
}
NT_EXPORT("read", Read);

// copy(dst, dstOffsetBytes, src, srcOffsetBytes, bytes)
NT_KERNEL("copy", Copy) {
  Storage* d = Storage::From(info[a.at("dst", "s")], call, a.at("dst", "s"));
  int64_t doff = a.size("dstOffsetBytes");
  Storage* s = Storage::From(info[a.at("src", "s")], call, a.at("src", "s"));
  int64_t soff = a.size("srcOffsetBytes");
  int64_t bytes = a.size("bytes");
  d->checkRange(size_t(doff), size_t(bytes), call);
  s->checkRange(size_t(soff), size_t(bytes), call);
  if (bytes) std::memmove(d->data() + doff, s->data() + soff, size_t(bytes));
}

// fill(storage, dtype, n, value)
NT_KERNEL("fill", Fill) {
  DType dt = a.dtype("dtype");
  int64_t n = a.size("n");
  double v = a.number("value");
  uint8_t* d = storageData(info, a.at("storage", "so"), call, dt, n);
  switch (dt) {
    case DType::F32: {
      float f = float(v);
      auto p = reinterpret_cast<float*>(d);
      for (int64_t i = 0; i < n; i++) p[i] = f;
      break;
    }
    case DType::I32: {
      int32_t x = saturate<int32_t>(float(v));
      if (std::fabs(v) < 2147483648.0) x = int32_t(v);
      auto p = reinterpret_cast<int32_t*>(d);
      for (int64_t i = 0; i < n; i++) p[i] = x;
      break;
    }
    case DType::U8: std::memset(d, saturate<uint8_t>(float(v)), size_t(n)); break;
    default: {
      uint16_t h = dt == DType::BF16 ? f32ToBf16(float(v)) : f32ToF16(float(v));
      auto p = reinterpret_cast<uint16_t*>(d);
      for (int64_t i = 0; i < n; i++) p[i] = h;
    }
  }
}

// arange(storage, dtype, n, start, step): element i = start + i * step, computed in double.
NT_KERNEL("arange", Arange) {
  DType dt = a.dtype("dtype");
  int64_t n = a.size("n");
  double start = a.number("start"), step = a.number("step");
  uint8_t* d = storageData(info, a.at("storage", "so"), call, dt, n);
  if (dt == DType::I32) {
    auto p = reinterpret_cast<int32_t*>(d);
    for (int64_t i = 0; i < n; i++) p[i] = int32_t(start + double(i) * step);
  } else {
    const int64_t chunk = 4096;
    float tmp[chunk];
    for (int64_t i = 0; i < n; i += chunk) {
      int64_t m = std::min(chunk, n - i);
      for (int64_t j = 0; j < m; j++) tmp[j] = float(start + double(i + j) * step);
      fromF32(tmp, d + i * dtypeSize(dt), dt, m);
    }
  }
}

}  // namespace nt::cpu
