#!/usr/bin/env bash
# Runs native/cuda/kernels/flash_attention.cu's kernels on the CPU under the CUDA emulation (see
# ../run.sh): SIMT and tensor-core paths, forward and backward, against float64 (test_flash.cc).
# Checks index math, masks, tiling, synchronization and the wmma data flow, not speed or the GPU
# memory model.   bash scripts/gpu/emulate/flash/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
emu="$(cd "$here/.." && pwd)"
root="$(cd "$here/../../../.." && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/native/cuda/kernels" "$out/native/core"
cp "$root/native/core/half.h" "$root/native/core/hd.h" "$out/native/core/"
cp "$emu/emu_cuda.h" "$here/emu_flash.h" "$out/"
cp "$emu/runtime_stub.h" "$out/native/cuda/runtime.h"
python3 - "$root" "$out" <<'PY'
import os, sys
root, out = sys.argv[1], sys.argv[2]
P = open(os.path.join(root, 'scripts/gpu/emulate/prep.py')).read()
exec('def launches' + P.split('def launches')[1].split('def between')[0])
common = open(os.path.join(root, 'native/cuda/kernels/common.cuh')).read()
open(os.path.join(out, 'native/cuda/kernels/common.cuh'), 'w').write(launches(common))
PY
python3 "$here/prep_flash.py" "$root" "$out"
g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -pthread -Wno-unknown-pragmas \
  -I"$out" -o "$out/test" "$here/test_flash.cc"
"$out/test"
