// dlopenGlobal(path): loads a shared library into the process with RTLD_GLOBAL, so a later addon
// whose DT_NEEDED names the same soname binds to it instead of searching the loader's paths. The
// cuda addon's libraries (cuBLASLt, NCCL) live in pip wheels, toolkits or LD_LIBRARY_PATH
// depending on the machine; lib/native.ts finds them and preloads them through this call.
#include <dlfcn.h>

#include "../core/nt.h"

namespace nt::cpu {
static Napi::Value DlopenGlobal(const Napi::CallbackInfo& info) {
  const char* call = "dlopenGlobal";
  Args a{info, call};
  a.count(1);
  std::string path = a.string(0);
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* why = dlerror();
    fail(Err::BackendUnavailable, std::string(call) + ": " + (why ? why : path + " could not be loaded"), call);
  }
  return info.Env().Undefined();
}
NT_EXPORT("dlopenGlobal", DlopenGlobal);
}  // namespace nt::cpu
