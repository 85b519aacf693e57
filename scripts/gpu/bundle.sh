#!/usr/bin/env bash
# Packs what a GPU machine without Node.js needs to run scripts/gpu/run.mjs, and nothing more; builds
# nothing (run `node scripts/setup.mjs` first). Into .device/bundle.tar.xz (.device/ is git-ignored).
# The device machine receives the repository's tree plus the carried bundle, 64 MiB at most together:
# this script fails when the two pass 60 MiB, so the margin stays.
#   runtime/node           this machine's node, stripped
#   runtime/lib/           the addons' non-system libraries (OpenBLAS, Gloo and their deps; the CUDA
#                          libraries come from the device's own driver and pip wheels)
#   runtime/env.sh         sourced on the device: PATH, the library path for node (NODETRON_LD_LIBRARY_PATH;
#                          device.sh sets it for node alone), the commit, an ldd/glibc preflight
#   runtime/COMMIT         the git commit (with "-dirty" when the tree has changes)
#   project/               build/Release/{nodetron,nodetron_cuda}.node, dist/ and the node_modules needed at
#                          run time (runtime dependencies, tsx for the parallel step's .ts fixtures)
# On the GPU machine, from a copy of the repository carrying .device/bundle.tar.xz (see docs/gpu.md):
#   bash scripts/gpu/device.sh         (unpacks with xz or python's tarfile, then runs scripts/gpu/run.mjs)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ -d dist ] && [ -f build/Release/nodetron.node ] || { echo "bundle.sh: build/Release/nodetron.node or dist/ missing: run node scripts/setup.mjs first" >&2; exit 1; }
[ -f build/Release/nodetron_cuda.node ] || echo "bundle.sh: warning: build/Release/nodetron_cuda.node is missing (no nvcc here?): the device run will find no cuda backend" >&2
# The GPU machines are Hopper (H100/H200): the cuda addon must hold sm_90 code (a test set-up may
# have built one other architecture only; scripts/test.mjs).
archs=$(grep -o 'archs [^,]*' build/cuda-status.txt 2>/dev/null | cut -c7- || true)
if [ -f build/Release/nodetron_cuda.node ] && [ -n "$archs" ]; then
  case ";$archs;" in
    *\;90\;*|*\;90-real\;*|*\;90-virtual\;*|*\;90a\;*|*\;90a-real\;*|*\;90a-virtual\;*) ;;
    *\;native\;*|*\;all\;*|*\;all-major\;*) echo "bundle.sh: warning: the cuda addon was built for '$archs': make sure that includes sm_90" >&2 ;;
    *) echo "bundle.sh: the cuda addon was built without Hopper code (archs $archs): run node scripts/setup.mjs --release first" >&2; exit 1 ;;
  esac
fi
# What travels must be what HEAD's sources build: dist/ older than lib/ is stale.
if [ -n "$(find lib -newer dist/index.js -name '*.ts' -print -quit)" ]; then
  echo "bundle.sh: dist/ is older than lib/: run node scripts/setup.mjs first" >&2; exit 1
fi
limit_mib=${NODETRON_BUNDLE_LIMIT_MIB:-60}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/runtime/lib" "$stage/project/build/Release"

cp "$(command -v node)" "$stage/runtime/node"
strip "$stage/runtime/node" 2>/dev/null || true

# Addons: the cpu and cuda ones (lib/native.ts loads build/Release first; prebuilds/ would be a second
# copy), build/cuda-status.txt and build/cuda-libs.json (lib/native.ts reads them).
for a in nodetron nodetron_cuda; do [ -f "build/Release/$a.node" ] && cp -a "build/Release/$a.node" "$stage/project/build/Release/"; done
for f in cuda-status.txt cuda-libs.json; do [ -f "build/$f" ] && cp "build/$f" "$stage/project/build/"; done
cp -a dist "$stage/project/"

# Non-system libraries the addons link, resolved here. The CUDA driver/runtime, cuBLASLt and NCCL stay out.
mapfile -t addons < <(find "$stage/project/build/Release" -name '*.node' -type f)
for addon in "${addons[@]}"; do
  ldd "$addon" | awk '/=> \//{print $3}' |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    grep -vE '/(libcuda|libcudart|libnccl|libcublas|libcublasLt|libnvrtc|libnvJitLink)\.so' |
    while read -r lib; do cp -Ln "$lib" "$stage/runtime/lib/" 2>/dev/null || true; done || true
done

# node_modules needed at run time: the production dependency tree (less the build-only packages) and
# the tree of tsx, as npm resolves them.
mods=$( { npm ls --omit=dev --all --parseable 2>/dev/null; npm ls tsx --all --parseable 2>/dev/null; } |
  grep '/node_modules/' | sed "s|^$root/||" | sort -u |
  grep -vE '^node_modules/(cmake-js|node-addon-api|@stdlib)(/|$)' || true)
# A package's folder holds its nested node_modules too: copy top-level ones and let nesting follow.
printf '%s\n' $mods | awk '{ keep=1; for (p in seen) if (index($0, p "/") == 1) keep=0; if (keep) { print; seen[$0]=1 } }' |
  while read -r m; do mkdir -p "$stage/project/$(dirname "$m")"; cp -a "$m" "$stage/project/$m"; done
cp package.json "$stage/project/"

commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
echo "$commit" >"$stage/runtime/COMMIT"

cat >"$stage/runtime/env.sh" <<'ENV'
# Sourced on the GPU machine from the repository root: node on PATH, the packed project files
# restored here, the bundled and the device's CUDA wheel libraries in NODETRON_LD_LIBRARY_PATH (device.sh
# puts them in front of LD_LIBRARY_PATH for node alone: torch's children keep the machine's own path,
# kept in NODETRON_SYSTEM_LD_LIBRARY_PATH, and load the CUDA libraries torch was built with), a preflight.
_ntb=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$_ntb:$PATH"
export NODETRON_COMMIT="$(cat "$_ntb/COMMIT")"
cp -a "$_ntb/../project/." .
# The nvidia wheels' lib folders: where pip puts them (venvs, conda, system and user site-packages)
# first, then whatever python imports `nvidia` (the first python3 on PATH may not be the one with torch).
_nv=""
for _d in ${VIRTUAL_ENV:+$VIRTUAL_ENV/lib} ${CONDA_PREFIX:+$CONDA_PREFIX/lib} /opt/conda/lib /opt/*/lib /usr/local/lib /usr/lib \
          "$HOME"/.local/lib "$HOME"/.venv/lib /workspace/*/lib; do
  for _l in "$_d"/python3*/*-packages/nvidia/*/lib; do [ -d "$_l" ] && _nv="$_nv:$_l"; done
done
if [ -z "$_nv" ]; then
  for _py in python3 python /usr/bin/python3 /opt/conda/bin/python; do
    command -v "$_py" >/dev/null 2>&1 || continue
    _nv=$("$_py" -c 'import nvidia,os;print(":".join(os.path.join(b,d,"lib") for b in nvidia.__path__ for d in sorted(os.listdir(b)) if os.path.isdir(os.path.join(b,d,"lib"))))' 2>/dev/null) && [ -n "$_nv" ] && break
  done
fi
_nv=${_nv#:}
export NODETRON_SYSTEM_LD_LIBRARY_PATH="${LD_LIBRARY_PATH-}"
export NODETRON_LD_LIBRARY_PATH="$_ntb/lib${_nv:+:$_nv}"
_nodepath="$NODETRON_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "node $(node --version) from the bundle (commit $NODETRON_COMMIT); CUDA wheel libs: ${_nv:-none found}"
# Preflight: libraries ldd cannot resolve, and the glibc/libstdc++ versions the addons need vs have.
echo "glibc here: $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}'); GLIBCXX here: $(strings "$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')" 2>/dev/null | grep -E '^GLIBCXX_3' | sort -V | tail -1)"
for _a in $(find build/Release -name '*.node' 2>/dev/null); do
  _miss=$(LD_LIBRARY_PATH="$_nodepath" ldd "$_a" 2>&1 | grep -E 'not found|GLIBC' || true)
  [ -z "$_miss" ] || echo "preflight: $_a: $_miss"
  _need=$(objdump -T "$_a" 2>/dev/null | grep -oE 'GLIBC(XX)?_[0-9.]+' | sort -uV | awk -F_ '{v[$1]=$0} END {for (k in v) printf "%s ", v[k]}')
  [ -z "$_need" ] || echo "preflight: $_a needs at most: $_need"
done
ENV

mkdir -p .device
rm -f .device/bundle.tar.xz
tar -C "$stage" -cf - runtime project | xz -T0 -6 >.device/bundle.tar.xz.tmp
mv .device/bundle.tar.xz.tmp .device/bundle.tar.xz
# What travels: the repository's tree (tracked and untracked files git does not ignore) plus the bundle.
bundle_b=$(stat -c %s .device/bundle.tar.xz)
tree_b=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "wrote .device/bundle.tar.xz ($(mib "$bundle_b") MiB, commit $commit); repository tree $(mib "$tree_b") MiB; together $(mib $((bundle_b + tree_b))) MiB of the 64 MiB that may travel (limit here: ${limit_mib} MiB)"
echo "addons: $(ls "$stage/project/build/Release" | tr '\n' ' ')libraries: $(ls "$stage/runtime/lib" | tr '\n' ' ')"
echo "node_modules: $(ls "$stage/project/node_modules" | wc -l) packages, $(du -sm "$stage/project/node_modules" | cut -f1) MiB before compression"
if [ $((bundle_b + tree_b)) -gt $((limit_mib * 1048576)) ]; then
  echo "bundle.sh: the bundle and the tree come to $(mib $((bundle_b + tree_b))) MiB, over ${limit_mib} MiB: they would not travel within 64 MiB; trim what the bundle carries" >&2
  rm -f .device/bundle.tar.xz
  exit 1
fi
