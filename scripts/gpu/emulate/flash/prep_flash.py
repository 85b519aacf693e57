# Builds OUT/flash_emu.h (argv[2]) from the repository at ROOT (argv[1]): the head layout and mask structs
# of native/core/attention_layout.h and the SIMT and tensor-core kernels of flash_attention.cu (cut at the
# comments around them; the host launchers stay out: test_flash.cc launches the kernels itself), with
# dynamic shared memory read from emu_flash.h's buffer.
import sys
ROOT, OUT = sys.argv[1], sys.argv[2]
src=open(ROOT+'/native/cuda/kernels/flash_attention.cu').read()
# launches() from prep.py
P=open(ROOT+'/scripts/gpu/emulate/prep.py').read()
exec('def launches' + P.split('def launches')[1].split('def between')[0])
lay=open(ROOT+'/native/core/attention_layout.h').read()
structs=lay[lay.index('struct HeadLayout {'):lay.index('// The layout at argument i')]+lay[lay.index('struct AttentionMask {'):lay.index('// The arguments both flash kernels share')]
a=src.index('constexpr int kWarps = 8;')
b=src.index('// Runs body with the compile-time chunk count')
c=src.index('// ---- tensor-core forward')
d=src.index('template <typename T, int D>\nvoid launchForwardTc')
e=src.index('// ---- tensor-core backward')
f=src.index('template <typename T, int D>\nvoid launchBackwardTc')
body=src[a:b]+src[c:d]+src[e:f]
body=body.replace('extern __shared__ float smem[];','float* smem = reinterpret_cast<float*>(g_dyn.data());')
body=body.replace('extern __shared__ __align__(128) unsigned char flashTcSmem[];','unsigned char* flashTcSmem = g_dyn.data();')
out='#include "native/cuda/kernels/common.cuh"\n#include "emu_flash.h"\nnamespace nt {\n'+structs+'}\nnamespace nt::cuda {\n'+launches(body)+'\n}\n'
open(OUT+'/flash_emu.h','w').write(out)
