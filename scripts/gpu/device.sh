#!/usr/bin/env bash
# The one command on the GPU machine (no Node.js, no network there), from the repository root of a copy
# that carries .device/bundle.tar.xz (made here by scripts/gpu/bundle.sh):
#   bash scripts/gpu/device.sh [run.mjs arguments]
# Unpacks the bundle (with xz, or python's tarfile where the machine has no xz), puts the bundled node and
# the libraries on the paths (runtime/env.sh), then runs scripts/gpu/run.mjs, whose results go to $OUT
# (the only folder the machine sends back). NODETRON_UNPACK=python forces the tarfile path (rehearsals).
# The bundle's and the CUDA wheels' library folders go on LD_LIBRARY_PATH for node alone (run.mjs gives
# the python children the machine's own path back). Scratch goes to .device/work (NODETRON_GPU_RUN_WORK),
# which a second command on the still-warm machine finds: the torch steps start from the GPT-2 weights the
# first one wrote. NODETRON_CUDA_EPILOGUES, NODETRON_FLASH_SIMT and NODETRON_CUDA_SYNC pass through.
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=${NODETRON_BUNDLE:-.device/bundle.tar.xz}
if [ ! -f "$bundle" ]; then
  echo "device.sh: $bundle is missing: make it with scripts/gpu/bundle.sh and carry it (carry: [\".device/bundle.tar.xz\"])" >&2
  exit 2
fi
dest=$(mktemp -d "${TMPDIR:-/tmp}/ntb.XXXXXX")
t0=$(date +%s.%N)
if [ "${NODETRON_UNPACK:-}" != python ] && command -v xz >/dev/null 2>&1; then
  how=xz
  tar -xJf "$bundle" -C "$dest" || { echo "device.sh: tar -xJf $bundle failed" >&2; exit 2; }
else
  how="python tarfile"
  py=$(command -v python3 || command -v python) || { echo "device.sh: neither xz nor python is here to unpack $bundle" >&2; exit 2; }
  "$py" - "$bundle" "$dest" <<'PY' || { echo "device.sh: python could not unpack $bundle" >&2; exit 2; }
import sys, tarfile
with tarfile.open(sys.argv[1], 'r:xz') as t:
    if hasattr(tarfile, 'tar_filter'):
        t.extractall(sys.argv[2], filter='tar')
    else:
        t.extractall(sys.argv[2])
PY
fi
echo "unpacked $bundle with $how in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s into $dest"
# shellcheck source=/dev/null
source "$dest/runtime/env.sh"
export NODETRON_GPU_RUN_WORK="${NODETRON_GPU_RUN_WORK:-$PWD/.device/work}"
LD_LIBRARY_PATH="$NODETRON_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" node scripts/gpu/run.mjs "$@"
rc=$?
rm -rf "$dest"
exit $rc
