// List arguments shared by the cpu and cuda kernels (one parser, so both backends accept and reject
// the same calls): Int32Array shapes/strides, JS arrays of sizes and floating dtype codes, arrays of storages.
#pragma once
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "nt.h"
#include "signatures.h"

namespace nt {

// An Int32Array argument as int64 values; `expected` < 0 accepts any length.
inline std::vector<int64_t> intList(const Napi::CallbackInfo& info, size_t i, const char* call, int64_t expected = -1) {
  RawBytes r = typedArrayBytes(info[i], call, i);
  if (r.bytes % 4 != 0) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " must be an Int32Array");
  int64_t n = int64_t(r.bytes / 4);
  if (expected >= 0 && n != expected)
    fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " has " + std::to_string(n) + " entries, expected " + std::to_string(expected));
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; k++) {
    int32_t v;
    std::memcpy(&v, r.data + 4 * k, 4);
    out[size_t(k)] = v;
  }
  return out;
}

// Elements a strided walk over `shape` can touch: max offset + 1 (0 for an empty shape).
inline int64_t stridedExtent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, const char* call) {
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); d++) {
    if (shape[d] < 0 || strides[d] < 0) fail(Err::Argument, std::string(call) + ": negative size or stride");
    if (shape[d] == 0) return 0;
    last += (shape[d] - 1) * strides[d];
  }
  return last + 1;
}

inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A JS array of non-negative integers (element counts of a tensor list).
inline std::vector<int64_t> sizeArray(const Napi::CallbackInfo& info, size_t i, const char* call, const char* what) {
  if (!info[i].IsArray()) fail(Err::Argument, std::string(call) + ": " + what + " must be an array");
  Napi::Array arr = info[i].As<Napi::Array>();
  std::vector<int64_t> out(arr.Length());
  for (uint32_t k = 0; k < arr.Length(); k++) {
    Napi::Value v = arr.Get(k);
    double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1.0;
    if (!(d >= 0) || d != std::floor(d) || d > 9007199254740992.0)
      fail(Err::Argument, std::string(call) + ": " + what + "[" + std::to_string(k) + "] must be a non-negative integer");
    out[k] = int64_t(d);
  }
  return out;
}

// A JS array of n floating dtype codes (f32, f16, bf16).
inline std::vector<DType> floatDtypeArray(const Napi::CallbackInfo& info, size_t i, const char* call, const char* what, size_t n) {
  std::vector<int64_t> codes = sizeArray(info, i, call, what);
  if (codes.size() != n) fail(Err::Argument, std::string(call) + ": " + what + " has " + std::to_string(codes.size()) + " entries, expected " + std::to_string(n));
  std::vector<DType> out(n);
  for (size_t k = 0; k < n; k++) {
    if (codes[k] != int64_t(DType::F32) && codes[k] != int64_t(DType::F16) && codes[k] != int64_t(DType::BF16))
      fail(Err::DType, std::string(call) + ": " + what + "[" + std::to_string(k) + "] is not a floating dtype");
    out[k] = DType(codes[k]);
  }
  return out;
}

// The tensor-list calls (sum_squares, scale_in_place): the call checked against its signature, then
// counts[] at argument 1 and a floating dtypes[] of as many entries at argument 2.
struct TensorListArgs {
  Args a;
  std::vector<int64_t> counts;
  std::vector<DType> dtypes;
};
inline TensorListArgs tensorListArgs(const Napi::CallbackInfo& info, const char* call) {
  Args a = kernelArgs(info, call);
  std::vector<int64_t> counts = sizeArray(info, 1, call, "counts");
  std::vector<DType> dtypes = floatDtypeArray(info, 2, call, "dtypes", counts.size());
  return TensorListArgs{a, std::move(counts), std::move(dtypes)};
}

// The optimizer steps' counts[], paramDtypes[] and gradDtypes[] from argument i on.
struct ParamGradDtypes {
  std::vector<int64_t> counts;
  std::vector<DType> pdt, gdt;
};
inline ParamGradDtypes paramGradDtypes(const Napi::CallbackInfo& info, size_t i, const char* call) {
  ParamGradDtypes l;
  l.counts = sizeArray(info, i, call, "counts");
  l.pdt = floatDtypeArray(info, i + 1, call, "paramDtypes", l.counts.size());
  l.gdt = floatDtypeArray(info, i + 2, call, "gradDtypes", l.counts.size());
  return l;
}

// Argument i as a JS array of `n` storages (each then checked by the backend).
inline Napi::Array storageArray(const Napi::CallbackInfo& info, size_t i, const char* call, const char* what, size_t n) {
  if (!info[i].IsArray()) fail(Err::Argument, std::string(call) + ": " + what + " must be an array of storages");
  Napi::Array arr = info[i].As<Napi::Array>();
  if (arr.Length() != n)
    fail(Err::Argument, std::string(call) + ": " + what + " has " + std::to_string(arr.Length()) + " storages, expected " + std::to_string(n));
  return arr;
}

}  // namespace nt
