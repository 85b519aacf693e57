# Builds the emulated sources in OUT (argv[2]) from the repository at ROOT (argv[1]): common.cuh as is
# and the launch helpers, functors and kernels of the .cu files (cut at the comments that precede and
# follow them, so an edit there shows here as a missing marker), each <<<...>>> launch rewritten as a
# call of emuLaunch.
import os, sys
ROOT, OUT = sys.argv[1], sys.argv[2]
SRC=os.path.join(ROOT, 'native/cuda/kernels/')
def launches(s):
    # kernel<...><<<cfg>>>(args)  ->  emuLaunch(kernel<...>, cfg, args)
    out=[]; i=0
    while True:
        j=s.find('<<<', i)
        if j<0: out.append(s[i:]); break
        # walk back over the kernel expression (identifier with optional template args)
        k=j; depth=0
        while k>0:
            c=s[k-1]
            if c=='>': depth+=1
            elif c=='<': depth-=1
            elif depth==0 and not (c.isalnum() or c in '_:'): break
            k-=1
        e=s.find('>>>(', j)
        out.append(s[i:k]); out.append('emuLaunch('+s[k:j]+', '+s[j+3:e]+', ')
        i=e+4
    return ''.join(out)
def between(text, start, end):
    a=text.index(start); b=text.index(end, a)
    return text[a:b]
common=open(SRC+'common.cuh').read()
open(os.path.join(OUT,'native/cuda/kernels/common.cuh'),'w').write(launches(common))
# The pieces of each .cu file, in order: (file, the text a piece starts with, the text that follows it).
CUTS=[
    ('reduce.cu','// The general case: one thread per output element','// sum_to(inp, out, dtype, inShape: Int32Array, outStrides: Int32Array, outCount)\n//   out[Σ idx_d·outStrides_d] += inp[idx] over inShape, out first zeroed'),
    ('elementwise.cu','__device__ __forceinline__ float binary(int op','// binary(op, a, b, out, dtype, outShape'),
    ('gelu.cu','__device__ __forceinline__ float geluTanh','// gelu_forward(inp, out, n, dtype)'),
    ('gelu.cu','// pre += bias per column','// Host helpers for gemm.cu'),
    # The epilogue fallbacks of gemm.cu: the bgrad column reader (its host code calls the kernels above).
    ('gemm.cu','// Row i of op(A) for transA','static const char* epilogueName'),
    ('norm.cu','// Forward of one row','// ---- the cpu backend'),
    # The row kernels with 16-byte packs: softmax.cuh's row pieces, softmax and cross-entropy.
    ('softmax.cuh','// log(sum(exp(row)))','}  // namespace nt::cuda'),
    ('softmax.cu','template <typename T, int W>\n__global__ void softmaxForwardKernel','// ---- the cpu backend'),
    ('cross_entropy.cu','template <typename T, int W>\n__global__ void crossEntropyForwardKernel','// ---- the cpu backend'),
    ('convert.cu','// Elements per access of castKernel','template <typename T>\n__global__ void arangeKernel'),
    ('optim.cu','// x *= alpha (map3Kernel functor','// The tensors of sum_squares and scale_in_place'),
    ('optim.cu','constexpr int64_t kChunk','// Runs AdamW (or LAMB) over'),
    ('swiglu.cu','__device__ __forceinline__ float sigmoidF','NT_CUDA_KERNEL("swiglu_forward"'),
    ('rope.cu','// One thread per (row, i < half) pair','// rope(inp, out, positions|null'),
]
parts=[between(open(SRC+f).read(), a, b) for f, a, b in CUTS]
# The op codes come from native/core/op_codes.h (both backends compile it; run.sh copies it).
body='#include "native/core/op_codes.h"\n#include "native/cuda/kernels/common.cuh"\nnamespace nt::cuda {\n'+launches('\n'.join(parts))+'\n}\n'
open(os.path.join(OUT,'kernels_emu.h'),'w').write(body)

