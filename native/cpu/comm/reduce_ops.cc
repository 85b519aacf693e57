// Reduction kernels for collectives: plain loops the compiler vectorizes for f32/i32/u8, and a
// load-reduce-round path for f16/bf16 so half-precision sums do not accumulate in half.
#include "reduce_ops.h"

#include <algorithm>

namespace nt::comm {

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::Sum: return "sum";
    case RedOp::Avg: return "avg";
    case RedOp::Max: return "max";
    case RedOp::Min: return "min";
    case RedOp::Prod: return "prod";
  }
  return "?";
}

RedOp parseRedOp(int64_t code, const char* call) {
  if (code < 0 || code > 4) fail(Err::Argument, std::string(call) + ": unknown reduce op code " + std::to_string(code));
  return static_cast<RedOp>(code);
}

namespace {

struct SumOp { template <typename T> static T apply(T a, T b) { return a + b; } };
struct ProdOp { template <typename T> static T apply(T a, T b) { return a * b; } };
struct MaxOp { template <typename T> static T apply(T a, T b) { return a > b ? a : b; } };
struct MinOp { template <typename T> static T apply(T a, T b) { return a < b ? a : b; } };

template <typename T, typename Op>
void reduceDirect(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);  // may alias x: Gloo reduces in place (c == a)
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; i++) out[i] = static_cast<T>(Op::apply(x[i], y[i]));
}

template <typename Op, float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduceHalf(void* c, const void* a, const void* b, size_t n) {
  uint16_t* out = static_cast<uint16_t*>(c);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; i++) out[i] = Store(Op::apply(Load(x[i]), Load(y[i])));
}

template <typename Op>
ReduceFn forDtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return &reduceDirect<float, Op>;
    case DType::I32: return &reduceDirect<int32_t, Op>;
    case DType::U8: return &reduceDirect<uint8_t, Op>;
    case DType::F16: return &reduceHalf<Op, f16ToF32, f32ToF16>;
    case DType::BF16: return &reduceHalf<Op, bf16ToF32, f32ToBf16>;
  }
  return nullptr;
}

}  // namespace

ReduceFn reduceFunction(DType dtype, RedOp op) {
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg: return forDtype<SumOp>(dtype);
    case RedOp::Prod: return forDtype<ProdOp>(dtype);
    case RedOp::Max: return forDtype<MaxOp>(dtype);
    case RedOp::Min: return forDtype<MinOp>(dtype);
  }
  return nullptr;
}

void divideInPlace(void* data, DType dtype, size_t n, int divisor) {
  switch (dtype) {
    case DType::F32: {
      float* p = static_cast<float*>(data);
      for (size_t i = 0; i < n; i++) p[i] /= float(divisor);
      break;
    }
    case DType::I32: {
      int32_t* p = static_cast<int32_t*>(data);
      for (size_t i = 0; i < n; i++) p[i] /= divisor;
      break;
    }
    case DType::U8: {
      uint8_t* p = static_cast<uint8_t*>(data);
      for (size_t i = 0; i < n; i++) p[i] = static_cast<uint8_t>(p[i] / divisor);
      break;
    }
    case DType::F16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; i++) p[i] = f32ToF16(f16ToF32(p[i]) / float(divisor));
      break;
    }
    case DType::BF16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; i++) p[i] = f32ToBf16(bf16ToF32(p[i]) / float(divisor));
      break;
    }
  }
}

}  // namespace nt::comm
