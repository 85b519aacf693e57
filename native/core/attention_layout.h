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

// The arguments both flash kernels share, read by their names in the signature (batch heads tq tk dim
// scale causal window dtype, and the qLayout kLayout vLayout outLayout); extents[0..3] get their extents.
struct FlashProblem {
  int64_t B, H, tq, tk, D;
  float scale;
  AttentionMask mask;
  DType dt;
  HeadLayout q, k, v, o;
};
inline FlashProblem flashProblem(const Args& a, int64_t extents[4], const char* call) {
  FlashProblem p;
  p.B = a.size("batch");
  p.H = a.size("heads");
  p.tq = a.size("tq");
  p.tk = a.size("tk");
  p.D = a.size("dim");
  p.scale = float(a.number("scale"));
  bool causal = a.boolean("causal");
  int64_t window = a.size("window");
  p.dt = a.dtype("dtype");
  if (p.dt != DType::F32 && p.dt != DType::BF16 && p.dt != DType::F16)
    fail(Err::DType, std::string(call) + ": dtype " + dtypeName(p.dt) + " is not supported (f32, bf16, f16)");
  if (causal && p.tq > p.tk) fail(Err::Shape, std::string(call) + ": causal attention needs tq <= tk");
  p.mask = AttentionMask{p.tq, p.tk, causal, window};
  p.q = headLayout(a.info, a.at("qLayout", "I"), call, p.B, p.H, p.tq, p.D, extents[0]);
  p.k = headLayout(a.info, a.at("kLayout", "I"), call, p.B, p.H, p.tk, p.D, extents[1]);
  p.v = headLayout(a.info, a.at("vLayout", "I"), call, p.B, p.H, p.tk, p.D, extents[2]);
  p.o = headLayout(a.info, a.at("outLayout", "I"), call, p.B, p.H, p.tq, p.D, extents[3]);
  return p;
}

}  // namespace nt
