#!/usr/bin/env bash
# Runs the cuda backend's elementwise, reduction, norm (forward, backward, gradients), softmax,
# cross-entropy, bias+GELU, SwiGLU, RoPE and cast kernels (and the launch helpers that choose their
# grids and paths, 16-byte or scalar) on the CPU under an emulation of the CUDA execution
# model (emu_cuda.h: blocks in turn, a block's threads as real threads, __syncthreads and warp shuffles
# as barriers), built with AddressSanitizer and UBSan, against scalar references (test.cc). For
# developing kernels on a machine without a GPU; it checks index math, vector/scalar paths, grid
# limits and the reduction trees, not speed or the GPU memory model (the GPU run's correctness stage
# and compute-sanitizer do that).   bash scripts/gpu/emulate/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/native/cuda/kernels" "$out/native/core"
cp "$root/native/core/half.h" "$root/native/core/hd.h" "$root/native/core/op_codes.h" "$out/native/core/"
cp "$here/emu_cuda.h" "$out/"
cp "$here/runtime_stub.h" "$out/native/cuda/runtime.h"
python3 "$here/prep.py" "$root" "$out"
g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -pthread -Wno-unknown-pragmas \
  -I"$out" -o "$out/test" "$here/test.cc"
"$out/test"
