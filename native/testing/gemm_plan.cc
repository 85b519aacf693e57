// The host-only parts of the cuBLASLt GEMM (native/cuda/gemm_plan.h) exported for tests:
//   gemmAlignment(address, batch, strideBytes) -> bytes declared to cuBLASLt for that matrix
//   gemmPlanCacheTrace(capacity, keys) -> { hits: boolean[], size, hitCount, misses, evictions,
//     heldSurvives: boolean }
// The trace looks each key up and inserts it on a miss, as gemm.cu does with plans. heldSurvives:
// the first key's value, held by the caller throughout, is still valid at the end (even if evicted).
#include <memory>

#include "../core/nt.h"
#include "../cuda/gemm_plan.h"

namespace nt::testing {

static Napi::Value GemmAlignment(const Napi::CallbackInfo& info) {
  Args a{info, "gemmAlignment"};
  a.count(3);
  uint32_t bytes = cuda::lt::alignmentBytes(uintptr_t(a.size(0)), a.size(1), a.size(2));
  return Napi::Number::New(info.Env(), bytes);
}
NT_EXPORT("gemmAlignment", GemmAlignment);

static Napi::Value GemmPlanCacheTrace(const Napi::CallbackInfo& info) {
  Args a{info, "gemmPlanCacheTrace"};
  a.count(2);
  size_t capacity = size_t(a.size(0));
  if (!info[1].IsArray()) fail(Err::Argument, "gemmPlanCacheTrace: argument 1 must be an array of keys");
  Napi::Array keys = info[1].As<Napi::Array>();
  cuda::lt::LruCache<cuda::lt::PlanKey, int64_t> cache(capacity);
  Napi::Array hits = Napi::Array::New(info.Env(), keys.Length());
  std::shared_ptr<int64_t> held;
  std::weak_ptr<int64_t> heldWeak;
  for (uint32_t i = 0; i < keys.Length(); i++) {
    cuda::lt::PlanKey key;
    key.m = int64_t(keys.Get(i).As<Napi::Number>().DoubleValue());
    std::shared_ptr<int64_t> v = cache.find(key);
    hits.Set(i, Napi::Boolean::New(info.Env(), bool(v)));
    if (!v) {
      v = std::make_shared<int64_t>(key.m);
      cache.insert(key, v);
    }
    if (i == 0) {
      held = v;
      heldWeak = v;
    }
  }
  bool heldSurvives = !held || (heldWeak.lock() && *held == int64_t(keys.Get(0u).As<Napi::Number>().DoubleValue()));
  cuda::lt::CacheStats st = cache.stats();
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("hits", hits);
  o.Set("size", double(st.size));
  o.Set("hitCount", double(st.hits));
  o.Set("misses", double(st.misses));
  o.Set("evictions", double(st.evictions));
  o.Set("heldSurvives", heldSurvives);
  return o;
}
NT_EXPORT("gemmPlanCacheTrace", GemmPlanCacheTrace);

}  // namespace nt::testing
