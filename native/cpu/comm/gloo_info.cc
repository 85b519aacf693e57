// Reports the Gloo library compiled into the cpu addon, for `nodetron info`.
#include <gloo/config.h>

#include "../../core/nt.h"

namespace nt::cpu {
static Napi::Value GlooInfo(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("version", std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
                       std::to_string(GLOO_VERSION_PATCH));
  o.Set("transport", "tcp");
  return o;
}
NT_EXPORT("glooInfo", GlooInfo);
}  // namespace nt::cpu
