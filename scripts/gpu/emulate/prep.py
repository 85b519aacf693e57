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
parts=[]
r=open(SRC+'reduce.cu').read()
parts.append(between(r,'// The general case: one thread per output element','// sum_to(inp, out, dtype, inShape: Int32Array, outStrides: Int32Array, outCount)\n//   out[Σ idx_d·outStrides_d] += inp[idx] over inShape, out first zeroed'))
e=open(SRC+'elementwise.cu').read()
parts.append(between(e,'__device__ __forceinline__ float binary(int op','// binary(op, a, b, out, dtype, outShape'))
g=open(SRC+'gelu.cu').read()
parts.append(between(g,'__device__ __forceinline__ float geluTanh','// gelu_forward(inp, out, n, dtype)'))
parts.append(between(g,'// pre += bias per column','// Host helpers for gemm.cu'))
# The epilogue fallbacks of gemm.cu: the bgrad column reader (its host code calls the kernels above).
gm=open(SRC+'gemm.cu').read()
parts.append(between(gm,'// Row i of op(A) for transA','static const char* epilogueName'))
nm=open(SRC+'norm.cu').read()
parts.append(between(nm,'// Forward of one row','// ---- the cpu backend'))
# The row kernels with 16-byte packs: softmax.cuh's row pieces, softmax and cross-entropy.
sh=open(SRC+'softmax.cuh').read()
parts.append(between(sh,'// log(sum(exp(row)))','}  // namespace nt::cuda'))
sm=open(SRC+'softmax.cu').read()
parts.append(between(sm,'template <typename T, int W>\n__global__ void softmaxForwardKernel','// ---- the cpu backend'))
ce=open(SRC+'cross_entropy.cu').read()
parts.append(between(ce,'template <typename T, int W>\n__global__ void crossEntropyForwardKernel','// ---- the cpu backend'))
c=open(SRC+'convert.cu').read()
parts.append(between(c,'// Elements per access of castKernel','template <typename T>\n__global__ void arangeKernel'))
o=open(SRC+'optim.cu').read()
parts.append(between(o,'// x *= alpha (map3Kernel functor','// The tensors of sum_squares and scale_in_place'))
parts.append(between(o,'constexpr int64_t kChunk','// Runs AdamW (or LAMB) over'))
sw=open(SRC+'swiglu.cu').read()
parts.append(between(sw,'__device__ __forceinline__ float sigmoidF','NT_CUDA_KERNEL("swiglu_forward"'))
rp=open(SRC+'rope.cu').read()
parts.append(between(rp,'// One thread per (row, i < half) pair','// rope(inp, out, positions|null'))
# The op codes come from native/core/op_codes.h (both backends compile it; run.sh copies it).
body='#include "native/core/op_codes.h"\n#include "native/cuda/kernels/common.cuh"\nnamespace nt::cuda {\n'+launches('\n'.join(parts))+'\n}\n'
open(os.path.join(OUT,'kernels_emu.h'),'w').write(body)

