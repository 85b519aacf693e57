// Element conversion between storage dtypes and f32, shared by the cpu kernels that compute in f32.
#pragma once
#include "../../core/nt.h"
#include "../../core/signatures.h"

namespace nt::cpu {

// Reads n elements of `dtype` at src into f32 at dst.
void toF32(const uint8_t* src, DType dtype, float* dst, int64_t n);
// Writes n f32 values into `dtype` elements at dst (integers: rounded toward zero, saturated).
void fromF32(const float* src, uint8_t* dst, DType dtype, int64_t n);

// A contiguous f32 view of a storage range: the storage itself for f32, else a converted copy that
// can be written back with commit().
class F32View {
 public:
  F32View(uint8_t* data, DType dtype, int64_t n, bool load);
  // The storage at argument i of a kernel call, checked to hold n elements (storageData); an empty
  // view, with no argument read, when !present.
  F32View(const Napi::CallbackInfo& info, size_t i, const char* call, DType dtype, int64_t n, bool load,
          bool present = true)
      : F32View(present ? storageData(info, i, call, dtype, n) : nullptr, dtype, present ? n : 0, load) {}
  // The same for the kernel's argument `name` in its signature (signatures.h), read by that name.
  F32View(const Args& a, std::string_view name, DType dtype, int64_t n, bool load, bool present = true)
      : F32View(a.info, a.at(name, "so"), a.call, dtype, n, load, present) {}
  ~F32View();
  F32View(const F32View&) = delete;
  F32View& operator=(const F32View&) = delete;
  float* data() const { return ptr_; }
  void commit();

 private:
  uint8_t* raw_;
  DType dtype_;
  int64_t n_;
  float* ptr_;
  bool owned_;
};

}  // namespace nt::cpu
