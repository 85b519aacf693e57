// Row softmax shared by the softmax and attention kernel families (one definition of the math).
#pragma once
#include "util.h"

namespace nt::cpu {

// y = softmax(x) over n entries (or log-softmax when `log`); returns log Σ exp(x).
inline float softmaxRow(const float* x, float* y, int64_t n, bool log) {
  float mx = maxLanes(x, n);
  if (mx == -INFINITY) {  // every entry masked: define the row as all zeros
    for (int64_t j = 0; j < n; j++) y[j] = log ? -INFINITY : 0.0f;
    return -INFINITY;
  }
  for (int64_t j = 0; j < n; j++) y[j] = fastExp(x[j] - mx);
  float s = sumLanes(n, [&](int64_t j) { return y[j]; });
  float lse = mx + std::log(s);
  if (log) for (int64_t j = 0; j < n; j++) y[j] = x[j] - lse;
  else { float inv = 1.0f / s; for (int64_t j = 0; j < n; j++) y[j] *= inv; }
  return lse;
}

// gradIn of a softmax row from its output y and gradOut g (log-softmax when `log`).
inline void softmaxRowBackward(const float* y, const float* g, float* gi, int64_t n, bool log) {
  if (log) {
    float s = sumLanes(n, [&](int64_t j) { return g[j]; });
    for (int64_t j = 0; j < n; j++) gi[j] = g[j] - fastExp(y[j]) * s;
  } else {
    float s = sumLanes(n, [&](int64_t j) { return g[j] * y[j]; });
    for (int64_t j = 0; j < n; j++) gi[j] = y[j] * (g[j] - s);
  }
}

}  // namespace nt::cpu
