// Strided head layouts of the flash attention kernels (native/cpu/kernels/flash_attention.cc and
// native/cuda/kernels/flash_attention.cu parse them here, so both accept and reject the same calls).
// A layout is an Int32Array [offset, batchStride, headStride, tokenStride] in elements: element d of
// token t of head h of batch b sits at offset + b·batchStride + h·headStride + t·tokenStride + d (the
// head dimension is contiguous). [B, H, T, D] contiguous is [0, H·T·D, T·D, D]; the packed QKV
// projection [B, T, 3, H, D] gives q, k, v as [i·H·D, T·3·H·D, D, 3·H·D] for i = 0, 1, 2; heads
// merged back to [B, T, H·D] is [0, T·H·D, D, H·D].
#pragma once
#include <string>

#include "arg_lists.h"
#include "hd.h"

namespace nt {

struct HeadLayout {
  int64_t offset, batch, head, token;
  // Element offset of (b, h, t, 0).
  NT_HD int64_t at(int64_t b, int64_t h, int64_t t) const { return offset + b * batch + h * head + t * token; }
};

// The layout at argument i, checked (four non-negative entries); `extent` gets the elements a walk
// over [B, H, T, D] touches (0 when any of them is 0), for the storage size check.
inline HeadLayout headLayout(const Napi::CallbackInfo& info, size_t i, const char* call, int64_t B, int64_t H, int64_t T, int64_t D,
                             int64_t& extent) {
  std::vector<int64_t> l = intList(info, i, call, 4);
  for (int64_t v : l)
    if (v < 0) fail(Err::Argument, std::string(call) + ": argument " + std::to_string(i) + " (a layout) has a negative entry");
  HeadLayout out{l[0], l[1], l[2], l[3]};
  extent = (B == 0 || H == 0 || T == 0 || D == 0) ? 0 : out.at(B - 1, H - 1, T - 1) + D;
  return out;
}

// The visible keys [lo, hi) of query i (aligned to the last tq of tk keys): key j is visible iff
// (!causal || j <= i + tk - tq) and (window == 0 || j > i + tk - tq - window).
struct AttentionMask {
  int64_t tq, tk;
  bool causal;
  int64_t window;
  NT_HD int64_t lo(int64_t i) const {
    int64_t v = i + tk - tq - window + 1;
    return window > 0 && v > 0 ? v : 0;
  }
  NT_HD int64_t hi(int64_t i) const {
    int64_t v = i + tk - tq + 1;
    return !causal ? tk : v < 0 ? 0 : v < tk ? v : tk;
  }
};

// The arguments both flash kernels share: sizes from `firstSize` (batch heads tq tk dim scale causal
// window dtype) and the q, k, v, out layouts from `firstLayout`; extents[0..3] get their extents.
struct FlashProblem {
  int64_t B, H, tq, tk, D;
  float scale;
  AttentionMask mask;
  DType dt;
  HeadLayout q, k, v, o;
};
inline FlashProblem flashProblem(const Args& a, const Napi::CallbackInfo& info, size_t firstLayout, size_t firstSize, int64_t extents[4],
                                 const char* call) {
  FlashProblem p;
  p.B = a.size(firstSize);
  p.H = a.size(firstSize + 1);
  p.tq = a.size(firstSize + 2);
  p.tk = a.size(firstSize + 3);
  p.D = a.size(firstSize + 4);
  p.scale = float(a.number(firstSize + 5));
  bool causal = a.boolean(firstSize + 6);
  int64_t window = a.size(firstSize + 7);
  p.dt = a.dtype(firstSize + 8);
  if (p.dt != DType::F32 && p.dt != DType::BF16 && p.dt != DType::F16)
    fail(Err::DType, std::string(call) + ": dtype " + dtypeName(p.dt) + " is not supported (f32, bf16, f16)");
  if (causal && p.tq > p.tk) fail(Err::Shape, std::string(call) + ": causal attention needs tq <= tk");
  p.mask = AttentionMask{p.tq, p.tk, causal, window};
  p.q = headLayout(info, firstLayout, call, p.B, p.H, p.tq, p.D, extents[0]);
  p.k = headLayout(info, firstLayout + 1, call, p.B, p.H, p.tk, p.D, extents[1]);
  p.v = headLayout(info, firstLayout + 2, call, p.B, p.H, p.tk, p.D, extents[2]);
  p.o = headLayout(info, firstLayout + 3, call, p.B, p.H, p.tq, p.D, extents[3]);
  return p;
}

}  // namespace nt
