// The smallest native call: measures the JS-to-native dispatch floor in `nodetron bench gemm`.
#include "../../core/nt.h"

namespace nt::cpu {
static Napi::Value Noop(const Napi::CallbackInfo& info) { return info.Env().Undefined(); }
NT_EXPORT("noop", Noop);
}  // namespace nt::cpu
