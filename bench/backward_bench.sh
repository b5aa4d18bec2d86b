#!/usr/bin/env bash
# The backward's time and memory beside the forward's, in one run:
#   bench/backward_bench.sh LOOM_BIN MODEL_DIR [TOKENS] [THREADS]
# runs, on one row of TOKENS token ids (default 2048), at f32:
#   1. `loom extract --hooks logits` (the forward, every layer and the head);
#   2. `loom extract --grad-of logprob --hooks blocks.0.hook_resid_pre.grad`
#      (the same forward, the metric, one backward with per-layer recompute);
#   3. `loom attribute` over every blocks.*.hook_resid_pre x every position
#      (the clean forward, the corrupted forward and one backward);
# each under /usr/bin/time, with --verify-plan, and prints with the CPU model:
# wall seconds and their ratios to (1), peak RSS and its ratio to (1), and the
# planned bytes' difference to (1) beside the measured RSS difference.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n 2,12p "$0"
  exit 2
fi
loom=$1
model=$2
tokens=${3:-2048}
threads=${4:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
python3 - "$vocab" "$tokens" "$work" <<'PY'
import json, random, sys
vocab, n, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(1)
a = [random.randrange(3, vocab) for _ in range(n)]
b = list(a)
b[n // 2] = (a[n // 2] + 1) % vocab
open(work + "/row.jsonl", "w").write(json.dumps({"id": 0, "tokens": a}) + "\n")
open(work + "/a", "w").write(",".join(map(str, a)))
open(work + "/b", "w").write(",".join(map(str, b)))
PY
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, threads ${threads} (0 = all); ${tokens} tokens"
measure() {  # name, command... -> "name wall_s rss_kb planned_bytes"
  local name=$1
  shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/out" 2>"$work/err" || {
    cat "$work/err" >&2
    exit 1
  }
  local planned  # the plan's host bytes, from --verify-plan's report
  planned=$(cat "$work/out" "$work/err" | grep -o '"planned_bytes": *[0-9]*' | head -1 |
    grep -o '[0-9]*$')
  echo "$name $(cat "$work/time") ${planned:-0}"
}
common=(--model "$model" --precision f32 --threads "$threads")
ex=(extract "${common[@]}" --input "$work/row.jsonl" --add-bos no --batch-tokens "$tokens"
  --select last --verify-plan)
{
  measure forward "$loom" "${ex[@]}" --out "$work/f" --hooks logits
  measure grad "$loom" "${ex[@]}" --out "$work/g" --hooks blocks.0.hook_resid_pre.grad \
    --grad-of logprob
  measure attribute "$loom" attribute "${common[@]}" --clean-tokens "$(cat "$work/a")" \
    --corrupted-tokens "$(cat "$work/b")" --hooks 'blocks.*.hook_resid_pre' \
    --positions all --metric logprob --verify-plan --quiet --out "$work/a_out"
} >"$work/rows"
python3 - "$work/rows" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
base = rows[0]
print("%-10s %9s %7s %11s %7s %16s %16s" % ("job", "wall s", "x fwd", "peak MiB", "x fwd",
                                           "planned - fwd", "measured - fwd"))
for name, wall, rss, planned in rows:
    print("%-10s %9.2f %7.2f %11.1f %7.3f %13.1f MiB %13.1f MiB" % (
        name, float(wall), float(wall) / float(base[1]), int(rss) / 1024,
        int(rss) / int(base[2]), (int(planned) - int(base[3])) / 2**20,
        (int(rss) - int(base[2])) / 1024))
PY
