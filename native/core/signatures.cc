// Checking a kernel call against its declared signature (signatures.h).
#include "signatures.h"

#include <cstring>

namespace nt {

static const KernelSignature& find(const char* name) {
  for (const auto& s : kKernelSignatures)
    if (std::strcmp(s.name, name) == 0) return s;
  fail(Err::Native, std::string(name) + ": no kernel signature is declared for it (native/core/signatures.h)", name);
}

static bool isStorage(const Napi::Value& v) { return v.IsObject() && !v.IsArray() && !v.IsTypedArray(); }

static const char* describe(char kind) {
  switch (kind) {
    case 's': return "a storage";
    case 'o': return "a storage or null";
    case 'n': return "a size (an integer >= 0)";
    case 'i': return "an integer";
    case 'f': return "a number";
    case 'b': return "a boolean";
    case 'd': return "a dtype code";
    case 'I': return "an Int32Array";
    case 't': return "a typed array";
    case 'S': return "an array of storages";
    case 'A': return "an array of numbers";
  }
  return "?";
}

static bool matches(char kind, const Napi::Value& v) {
  switch (kind) {
    case 's': return isStorage(v);
    case 'o': return v.IsNull() || v.IsUndefined() || isStorage(v);
    case 'n': case 'i': case 'f': case 'd': return v.IsNumber();
    case 'b': return v.IsBoolean();
    case 'I': return v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_int32_array;
    case 't': return v.IsTypedArray() || v.IsDataView();
    case 'S': case 'A': return v.IsArray();
  }
  return false;
}

Args kernelArgs(const Napi::CallbackInfo& info, const char* name) {
  const KernelSignature& sig = find(name);
  size_t required = 0, total = 0;
  bool optional = false;
  struct Param { std::string name; char kind; };
  std::vector<Param> params;
  for (const char* p = sig.args; *p;) {
    while (*p == ' ') p++;
    if (!*p) break;
    if (*p == '?') { optional = true; p++; continue; }
    const char* colon = std::strchr(p, ':');
    params.push_back({std::string(p, size_t(colon - p)), colon[1]});
    p = colon + 2;
    total++;
    if (!optional) required++;
  }
  size_t got = info.Length();
  if (got < required || got > total) {
    fail(Err::Argument, std::string(name) + ": expected " + (required == total ? std::to_string(total) : std::to_string(required) + " to " + std::to_string(total)) +
                            " arguments (" + sig.args + "), got " + std::to_string(got), name);
  }
  for (size_t i = 0; i < got; i++) {
    if (!matches(params[i].kind, info[i]))
      fail(Err::Argument, std::string(name) + ": argument " + std::to_string(i) + " (" + params[i].name + ") must be " + describe(params[i].kind), name);
  }
  return Args{info, name};
}

}  // namespace nt
