// One declarative signature per kernel, shared by the cpu and cuda bindings: each kernel's arguments
// in order, as `name:kind` pairs. kernelArgs() checks a call against its signature (how many
// arguments, and what kind each is) and the bindings then read the arguments by these names (Args::at),
// so both backends accept and reject exactly the same calls and the table is the one place a kernel's
// arguments are declared (the TypeScript side declares the same interface in lib/native.ts). Kinds:
//   s storage   o storage or null   n size (integer >= 0)   i integer   f number   b boolean
//   d dtype code   I Int32Array   t typed array   S array of storages   A array of numbers
// Arguments after a `?` are optional.
#pragma once
#include "nt.h"

namespace nt {

struct KernelSignature {
  const char* name;
  const char* args;
};

// The kernels of both backends (gemm_epilogue is the cuda addon's only).
inline constexpr KernelSignature kKernelSignatures[] = {
    {"read", "storage:s offsetBytes:n out:t"},
    {"write", "storage:s offsetBytes:n src:t"},
    {"copy", "dst:s dstOffsetBytes:n src:s srcOffsetBytes:n bytes:n"},
    {"cast", "src:s srcDtype:d dst:s dstDtype:d n:n"},
    {"fill", "storage:s dtype:d n:n value:f"},
    {"arange", "storage:s dtype:d n:n start:f step:f"},
    {"random_fill", "storage:s dtype:d n:n kind:i seedHi:n seedLo:n baseBlock:n firstElement:n a:f b:f"},
    {"gemm", "a:s b:s c:s dtype:d batch:n m:n n:n k:n transA:b transB:b alpha:f beta:f strideA:n strideB:n strideC:n ? outDtype:d"},
    {"gemm_epilogue",
     "a:s b:s c:s dtype:d batch:n m:n n:n k:n transA:b transB:b alpha:f beta:f strideA:n strideB:n strideC:n bias:o epilogue:i aux:o ? cDtype:d"},
    {"binary", "op:i a:s b:s out:s dtype:d outShape:I aStrides:I bStrides:I"},
    {"unary", "op:i inp:s out:s n:n dtype:d p:f"},
    {"unary_backward", "op:i inp:o out:o gradOut:s gradIn:s n:n dtype:d p:f"},
    {"sum_to", "inp:s out:s dtype:d inShape:I outStrides:I outCount:n"},
    {"max_dim", "inp:s out:s argmax:s outer:n red:n inner:n dtype:d"},
    {"max_dim_backward", "gradOut:s argmax:s gradIn:s outer:n red:n inner:n dtype:d"},
    {"copy_strided", "src:s dst:s dtype:d shape:I srcStrides:I srcOffset:n dstStrides:I dstOffset:n"},
    {"gelu_forward", "inp:s out:s n:n dtype:d"},
    {"gelu_backward", "inp:s gradOut:s gradIn:s n:n dtype:d"},
    {"swiglu_forward", "gate:s up:o out:s n:n dtype:d"},
    {"swiglu_backward", "gate:s up:o gradOut:s gradGate:s gradUp:o n:n dtype:d"},
    {"rope", "inp:s out:s positions:o posCount:n batch:n seq:n heads:n dim:n offset:n theta:f inverse:b dtype:d"},
    {"bias_gelu_forward", "pre:s bias:o out:s rows:n cols:n dtype:d"},
    {"bias_gelu_backward", "pre:s gradOut:s gradPre:s gradBias:o rows:n cols:n dtype:d"},
    {"softmax_forward", "inp:s out:s rows:n cols:n dtype:d log:b"},
    {"softmax_backward", "out:s gradOut:s gradIn:s rows:n cols:n dtype:d log:b"},
    {"cross_entropy_forward", "logits:s targets:s losses:s lse:s rows:n vocab:n ignoreIndex:i dtype:d"},
    {"cross_entropy_backward", "logits:s targets:s lse:s gradLoss:s gradLogits:s rows:n vocab:n ignoreIndex:i scale:f dtype:d"},
    {"cross_entropy_shard_backward", "logits:s targets:s lse:s gradLoss:s gradLogits:s rows:n vocab:n ignoreIndex:i scale:f dtype:d"},
    {"attention_softmax_forward", "scores:s probs:s batch:n tq:n tk:n scale:f causal:b window:n dtype:d"},
    {"attention_softmax_backward", "probs:s gradProbs:s gradScores:s batch:n tq:n tk:n scale:f dtype:d"},
    {"flash_attention_forward",
     "q:s k:s v:s out:s lse:s qLayout:I kLayout:I vLayout:I outLayout:I batch:n heads:n tq:n tk:n dim:n scale:f causal:b window:n dtype:d"},
    {"flash_attention_backward",
     "q:s k:s v:s out:s gradOut:s lse:s gradQ:s gradK:s gradV:s qLayout:I kLayout:I vLayout:I outLayout:I batch:n heads:n tq:n tk:n dim:n "
     "scale:f causal:b window:n dtype:d"},
    {"embedding_forward", "ids:s weight:s out:s n:n vocab:n dim:n dtype:d"},
    {"embedding_backward", "ids:s gradOut:s gradWeight:s n:n vocab:n dim:n dtype:d"},
    {"layernorm_forward", "x:s weight:s bias:o out:s mean:s rstd:s rows:n cols:n eps:f dtype:d"},
    {"add_layernorm_forward", "x:s residual:s weight:s bias:o sum:s out:s mean:s rstd:s rows:n cols:n eps:f dtype:d"},
    {"layernorm_backward", "x:s weight:s mean:s rstd:s gradOut:s gradX:s gradW:s gradB:o rows:n cols:n dtype:d"},
    {"rmsnorm_forward", "x:s weight:s out:s rstd:s rows:n cols:n eps:f dtype:d"},
    {"rmsnorm_backward", "x:s weight:s rstd:s gradOut:s gradX:s gradW:s rows:n cols:n dtype:d"},
    {"adamw_step",
     "params:S grads:S expAvg:S expAvgSq:S counts:A paramDtypes:A gradDtypes:A lr:f beta1:f beta2:f eps:f weightDecay:f step:i gradScale:f"},
    {"adamw_step_meta",
     "params:S grads:S expAvg:S expAvgSq:S counts:A paramDtypes:A gradDtypes:A meta:s beta1:f beta2:f eps:f weightDecay:f gradScale:f"},
    {"lamb_step",
     "params:S grads:S expAvg:S expAvgSq:S counts:A paramDtypes:A gradDtypes:A lr:f beta1:f beta2:f eps:f weightDecay:f step:i gradScale:f "
     "biasCorrection:b"},
    {"sgd_step",
     "params:S grads:S momentumBufs:S counts:A paramDtypes:A gradDtypes:A lr:f momentum:f dampening:f weightDecay:f nesterov:b firstStep:b "
     "gradScale:f"},
    {"sum_squares", "storages:S counts:A dtypes:A"},
    {"scale_in_place", "storages:S counts:A dtypes:A alpha:f"},
};

// A signature parsed once: each argument's name and kind, and how many are required.
struct ParsedSignature {
  struct Param {
    std::string name;
    char kind;
  };
  const char* kernel;
  const char* text;  // the declaration as written (quoted in errors)
  std::vector<Param> params;
  size_t required;
};

// Args for kernel `name`, after checking the call against its signature (a typed error naming the
// kernel, the argument and what it must be); they read arguments by their declared names
// (a.size("n"), a.dtype("dtype"), a.ints("outShape")). A name without a signature is an internal error.
Args kernelArgs(const Napi::CallbackInfo& info, const char* name);

// A kernel binding that owns the call's name, the check against its signature and the return:
//   NT_KERNEL("gelu_forward", GeluForward) { ...views and math... }
// defines GeluForward(info, a, call) with `a` = kernelArgs(info, call) and `call` the kernel's name,
// registers the binding with NT_EXPORT and returns undefined to JS after the body.
#define NT_KERNEL(name, Fn)                                                          \
  static void Fn(const Napi::CallbackInfo& info, const ::nt::Args& a, const char* call); \
  static Napi::Value NT_CONCAT(Fn, Binding)(const Napi::CallbackInfo& info) {        \
    Fn(info, ::nt::kernelArgs(info, name), name);                                    \
    return info.Env().Undefined();                                                   \
  }                                                                                  \
  NT_EXPORT(name, NT_CONCAT(Fn, Binding));                                           \
  static void Fn(const Napi::CallbackInfo& info, const ::nt::Args& a, const char* call)

// The arguments of write and read (storage, offsetBytes, typedArray) on storage class S (Storage,
// DeviceStorage): the storage, the offset and the typed array's bytes, checked against the
// signature and to lie inside the storage.
template <class S>
struct TypedArrayRange {
  S* storage;
  size_t offset;
  RawBytes array;
};
template <class S>
TypedArrayRange<S> typedArrayRange(const Napi::CallbackInfo& info, const char* call) {
  Args a = kernelArgs(info, call);
  S* s = S::From(info[0], call, 0);
  size_t off = size_t(a.size(1));
  RawBytes array = typedArrayBytes(info[2], call, 2);
  s->checkRange(off, array.bytes, call);
  return {s, off, array};
}

}  // namespace nt
