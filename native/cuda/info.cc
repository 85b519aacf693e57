// libraryInfo(): versions of the CUDA runtime and driver, cuBLASLt and NCCL this addon runs with
// (works without a GPU: the driver version reads 0 when there is none).
#include <cublasLt.h>
#include <nccl.h>

#include "runtime.h"

namespace nt::cuda {

static std::string dotted(int v, int majorDiv, int minorDiv, int minorMod) {
  return std::to_string(v / majorDiv) + "." + std::to_string((v / minorDiv) % minorMod);
}

static Napi::Value LibraryInfo(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  int runtime = 0, driver = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  if (deviceCount() > 0) cudaDriverGetVersion(&driver);
  o.Set("cudaRuntime", dotted(runtime, 1000, 10, 100));
  o.Set("cudaDriver", driver ? dotted(driver, 1000, 10, 100) : std::string("none"));
  size_t lt = cublasLtGetVersion();
  o.Set("cublasLt", std::to_string(lt / 10000) + "." + std::to_string((lt / 100) % 100) + "." + std::to_string(lt % 100));
  if (ncclGetVersion(&nccl) == ncclSuccess)
    o.Set("nccl", std::to_string(nccl / 10000) + "." + std::to_string((nccl / 100) % 100) + "." + std::to_string(nccl % 100));
  return o;
}
NT_EXPORT("libraryInfo", LibraryInfo);

}  // namespace nt::cuda
