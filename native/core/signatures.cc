// Checking a kernel call against its declared signature (signatures.h), and reading its arguments by name.
#include "signatures.h"

#include <cstring>

#include "arg_lists.h"

namespace nt {

static ParsedSignature parse(const KernelSignature& sig) {
  ParsedSignature out{sig.name, sig.args, {}, 0};
  bool optional = false;
  for (const char* p = sig.args; *p;) {
    while (*p == ' ') p++;
    if (!*p) break;
    if (*p == '?') { optional = true; p++; continue; }
    const char* colon = std::strchr(p, ':');
    out.params.push_back({std::string(p, size_t(colon - p)), colon[1]});
    p = colon + 2;
    if (!optional) out.required++;
  }
  return out;
}

// Every signature parsed once (a function-local static: initialized once, thread-safe).
static const ParsedSignature& find(const char* name) {
  static const std::vector<ParsedSignature> parsed = [] {
    std::vector<ParsedSignature> v;
    for (const auto& s : kKernelSignatures) v.push_back(parse(s));
    return v;
  }();
  for (const auto& s : parsed)
    if (std::strcmp(s.kernel, name) == 0) return s;
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
  const ParsedSignature& sig = find(name);
  size_t required = sig.required, total = sig.params.size();
  size_t got = info.Length();
  if (got < required || got > total) {
    fail(Err::Argument, std::string(name) + ": expected " + (required == total ? std::to_string(total) : std::to_string(required) + " to " + std::to_string(total)) +
                            " arguments (" + sig.text + "), got " + std::to_string(got), name);
  }
  for (size_t i = 0; i < got; i++) {
    if (!matches(sig.params[i].kind, info[i]))
      fail(Err::Argument, std::string(name) + ": argument " + std::to_string(i) + " (" + sig.params[i].name + ") must be " + describe(sig.params[i].kind), name);
  }
  return Args{info, name, &sig};
}

size_t Args::at(std::string_view name, const char* kinds) const {
  if (!sig) fail(Err::Native, std::string(call) + ": reads argument '" + std::string(name) + "' by name without a kernel signature", call);
  for (size_t i = 0; i < sig->params.size(); i++) {
    if (sig->params[i].name != name) continue;
    if (!std::strchr(kinds, sig->params[i].kind))
      fail(Err::Native, std::string(call) + ": argument '" + std::string(name) + "' is declared as " + describe(sig->params[i].kind) +
                            ", which this read does not accept (native/core/signatures.h)", call);
    return i;
  }
  fail(Err::Native, std::string(call) + ": no argument '" + std::string(name) + "' in its signature (" + sig->text + ")", call);
}

bool Args::given(std::string_view name) const {
  size_t i = at(name, "sonifdbItSA");
  return i < info.Length() && !info[i].IsNull() && !info[i].IsUndefined();
}

std::vector<int64_t> Args::ints(std::string_view name, int64_t expected) const { return intList(info, at(name, "I"), call, expected); }

}  // namespace nt
