// Element-wise reductions used by the Gloo collectives, per dtype and op (half types reduce in f32).
#pragma once

#include <cstddef>
#include <functional>

#include "core/nt.h"

namespace nt::comm {

// Codes shared with lib/distributed/collectives.ts (REDUCE_OP_CODES).
enum class RedOp : int32_t { Sum = 0, Avg = 1, Max = 2, Min = 3, Prod = 4 };
const char* redOpName(RedOp op);
RedOp parseRedOp(int64_t code, const char* call);

// c[i] = a[i] (op) b[i] for n elements; c may alias a or b. Avg reduces as Sum (see divideInPlace).
using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;
ReduceFn reduceFunction(DType dtype, RedOp op);

// data[i] /= divisor (integers truncate toward zero), the second half of an average.
void divideInPlace(void* data, DType dtype, size_t n, int divisor);

}  // namespace nt::comm
