#!/usr/bin/env bash
# Threads on a shared machine: `loom perplexity` on the bundled model, alone
# and beside a busy-loop process that keeps one core busy, with Loom's
# sleeping OpenMP threads (the default, OMP_WAIT_POLICY=passive), with
# libgomp's own default spin (OMP_WAIT_POLICY=active, what Loom ran with
# before) and with --threads 1.
# Prints the CPU model and, per setting, the best of REPS wall times alone
# and beside the neighbour, and their ratio, all measured in this run.
# Usage: bench/threads_neighbour.sh [path/to/loom] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
loom=${1:-$here/build/loom}
reps=${2:-3}
text=$here/tests/data/wikitext2/wiki.test.raw.first16000chars.txt
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cpus)"

# best ENV_ASSIGNMENT [EXTRA_FLAGS...]: best wall seconds of $reps runs.
best() {
  local env_var=$1
  shift
  local b=1e9 s e
  for _ in $(seq "$reps"); do
    s=$(date +%s.%N)
    env "$env_var" "$loom" perplexity --model "$here/models/stories260K" \
      --text "$text" --ctx 256 --stride 128 --quiet "$@" > /dev/null
    e=$(date +%s.%N)
    b=$(python3 -c "print(min($b, $e - $s))")
  done
  echo "$b"
}
measure() {
  echo "$(best LOOM_BENCH=1) $(best OMP_WAIT_POLICY=active) $(best LOOM_BENCH=1 --threads 1)"
}
read -r a1 a2 a3 <<< "$(measure)"
(while :; do :; done) &
spinner=$!
trap 'kill $spinner 2>/dev/null || true' EXIT
read -r b1 b2 b3 <<< "$(measure)"
python3 - "$a1" "$b1" "$a2" "$b2" "$a3" "$b3" <<'PY'
import sys
v = [float(x) for x in sys.argv[1:]]
print(f"{'setting':<30} {'alone_s':>8} {'busy_s':>8} {'busy/alone':>10}")
for i, name in enumerate(["loom default (passive wait)",
                          "OMP_WAIT_POLICY=active", "--threads 1"]):
    a, b = v[2 * i], v[2 * i + 1]
    print(f"{name:<30} {a:8.3f} {b:8.3f} {b / a:9.2f}x")
PY
