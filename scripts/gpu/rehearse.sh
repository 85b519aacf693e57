#!/usr/bin/env bash
# Rehearses the device run here, without a GPU, as the GPU machine will see it: a clean copy of the tree
# that travels (tracked and untracked-not-ignored files, plus the carried .device/bundle.tar.xz), a PATH
# with no node on it, $OUT set; the bundle unpacked by scripts/gpu/device.sh (once with python's tarfile,
# once with xz), the dry-run path (NODETRON_GPU_RUN_DRY=1: every step's code, the device-only blocks
# included, with the cpu as the "device" at small shapes): the first command, then the second command it
# printed, as an operator would paste it, into a fresh $OUT; then checks what landed in each $OUT against
# the machine's limits on what comes back (at most 8 files, 16 MiB each, two folders down, names of
# letters, digits, '.', '_', '-').
#   bash scripts/gpu/rehearse.sh            (makes the bundle first when .device/bundle.tar.xz is missing
#                                            or was made from another commit than HEAD)
#   bash scripts/gpu/rehearse.sh --keep-bundle   (rehearses the bundle there is, whatever its commit: for a
#                                            shared tree whose other changes would remake it every time)
#   bash scripts/gpu/rehearse.sh [--keep-bundle] --budget 1200   (further arguments go to the first command's
#                                            run.mjs: a loaded machine needs a longer budget, whose phases scale)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
# A bundle of an older commit would rehearse (and on the device, run) old code: remake it.
# A tree with uncommitted changes always gets a new one (its "-dirty" commit says nothing of which changes).
bundled=$( [ -f .device/bundle.tar.xz ] && tar -xJOf .device/bundle.tar.xz runtime/COMMIT 2>/dev/null || true)
head=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
keep=0
if [ "${1:-}" = --keep-bundle ]; then keep=1; shift; fi
if [ $keep = 1 ] && [ -n "$bundled" ]; then
  echo "rehearse.sh: rehearsing the bundle of $bundled as it is (the tree is $head)"
elif [ "$bundled" != "$head" ] || [ "${head%-dirty}" != "$head" ]; then
  echo "rehearse.sh: the bundle is from ${bundled:-nothing (missing or unreadable)}, the tree is $head: making it again"
  bash scripts/gpu/bundle.sh
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo/.device" "$work/bin" "$work/out-python" "$work/out-xz" "$work/out-second"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$work/repo"
cp .device/bundle.tar.xz "$work/repo/.device/"
echo "tree that travels: $(du -sm "$work/repo" | cut -f1) MiB (bundle included)"
# The python that has the nvidia wheels here stands for the device's (env.sh finds the CUDA libraries
# through it); then every command of this machine but node, npm and npx: the bundle brings its own node.
py=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || true)
[ -n "$py" ] && ln -s "$py" "$work/bin/python3"
for d in /usr/local/bin /usr/bin /bin; do
  for f in "$d"/*; do
    n=$(basename "$f")
    case "$n" in node|nodejs|npm|npx|corepack) continue ;; esac
    [ -e "$work/bin/$n" ] || ln -s "$f" "$work/bin/$n"
  done
done
run() {  # run <unpack> <out> <run.mjs args...>
  local how=$1 out=$2; shift 2
  (cd "$work/repo" && env -i HOME="$HOME" PATH="$work/bin" TMPDIR="${TMPDIR:-/tmp}" OUT="$out" NODETRON_GPU_RUN_DRY=1 NODETRON_UNPACK="$how" \
     bash scripts/gpu/device.sh "$@")
}
echo "== unpacked with python's tarfile, preflight only"
run python "$work/out-python" --only preflight | tail -n 4
bad=0
landed() {  # landed <out> <run output>: what came back, against the machine's limits
  local out=$1 f rel depth count
  count=$(find "$out" -type f | wc -l)
  (cd "$out" && find . -type f -printf '%P %s bytes\n')
  [ "$count" -le 8 ] || { echo "REHEARSAL FAIL: $count files in OUT (at most 8 come back)"; bad=1; }
  while IFS= read -r f; do
    rel=${f#"$out"/}
    depth=$(awk -F/ '{print NF - 1}' <<<"$rel")
    [ "$depth" -le 2 ] || { echo "REHEARSAL FAIL: $rel is $depth folders down"; bad=1; }
    [[ $(basename "$rel") =~ ^[A-Za-z0-9._-]+$ ]] || { echo "REHEARSAL FAIL: $rel has a name that would not come back"; bad=1; }
    [ "$(stat -c %s "$f")" -le $((16 << 20)) ] || { echo "REHEARSAL FAIL: $rel is over 16 MiB"; bad=1; }
  done < <(find "$out" -type f)
  for f in results.json run.log; do [ -s "$out/$f" ] || { echo "REHEARSAL FAIL: $f missing in OUT"; bad=1; }; done
  grep -q 'from the bundle' "$2" || { echo "REHEARSAL FAIL: the bundled node did not run"; bad=1; }
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const ran = r.steps.filter((s) => s.status !== "skipped" && s.status !== "not run");
    const time = (ph) => r.steps.filter((s) => s.phase === ph).reduce((t, s) => t + s.wallS, 0).toFixed(0);
    console.log(`results.json: ${r.steps.length} steps (${ran.map((s) => s.step + " " + s.status).join(", ") || "all skipped"}), ${r.checks.filter((c) => c.ok).length} of ${r.checks.length} checks passed, ${r.elapsedS.toFixed(0)} s (correctness ${time("correctness")} s), commit ${r.commit}`);
    if (r.steps.length < Number(process.argv[2]) || r.checks.some((c) => !c.ok)) process.exit(1);
  ' "$out/results.json" "$3" || { echo "REHEARSAL FAIL: results.json is incomplete or a dry check failed"; bad=1; }
}
echo "== unpacked with xz, the first command (dry)"
set +e
run xz "$work/out-xz" "$@" | tee "$work/run.out" | tail -n 40
rc=${PIPESTATUS[0]}
set -e
echo "== what landed in \$OUT (exit code $rc)"
landed "$work/out-xz" "$work/run.out" 10
# The second command as the first one printed it (its last line), pasted.
second=$(tail -n 1 "$work/run.out" | sed -n 's/^  bash scripts\/gpu\/device.sh //p')
if [ -z "$second" ]; then
  echo "REHEARSAL FAIL: the first command printed no second command"; bad=1
else
  echo "== the second command: device.sh $second"
  set +e
  # shellcheck disable=SC2086
  run xz "$work/out-second" $second | tee "$work/second.out" | tail -n 16
  set -e
  landed "$work/out-second" "$work/second.out" 3
fi
[ $bad -eq 0 ] && echo "rehearsal passed" || { echo "rehearsal failed"; exit 1; }
