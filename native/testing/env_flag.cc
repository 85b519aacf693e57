// envFlag (native/core/nt.h), the parser of on/off environment flags such as NODETRON_CUDA_SYNC,
// exported for tests: envFlag(value | undefined) -> boolean.
#include "../core/nt.h"

namespace nt::testing {

static Napi::Value EnvFlag(const Napi::CallbackInfo& info) {
  if (info.Length() == 0 || info[0].IsUndefined() || info[0].IsNull()) return Napi::Boolean::New(info.Env(), envFlag(nullptr));
  if (!info[0].IsString()) fail(Err::Argument, "envFlag: argument 0 must be a string or undefined");
  std::string v = info[0].As<Napi::String>().Utf8Value();
  return Napi::Boolean::New(info.Env(), envFlag(v.c_str()));
}
NT_EXPORT("envFlag", EnvFlag);

}  // namespace nt::testing
