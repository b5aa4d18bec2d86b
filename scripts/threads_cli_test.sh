#!/usr/bin/env bash
# Outputs must not depend on the thread count: `loom extract` (several
# batches and commit windows, every selector), `loom perplexity --json` and
# `loom generate --json` at --threads 1, 2 and 3 must give identical bytes,
# on the bundled model and, when ../shared is present, on the HF golden tiny
# models (dense, MoE and quantized; f32 and bf16 compute).
# Usage: threads_cli_test.sh path/to/loom
set -euo pipefail
source "$(dirname "$0")/cli_test_lib.sh"

# Token-id prompts of lengths 1..45 (several batches at --batch-tokens 64).
tokens_input() {  # VOCAB OUT
  python3 - "$1" "$2" <<'PY'
import json, random, sys
vocab, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(7)
with open(out, "w") as f:
    for i, n in enumerate([1, 45, 7, 30, 12, 3, 40, 9, 22, 5, 17]):
        f.write(json.dumps({"id": i, "tokens": [rng.randrange(vocab) for _ in range(n)]}) + "\n")
PY
}

# A --json result without its timings (wall-clock fields differ run to run).
untimed() {  # FILE
  python3 - "$1" <<'PY'
import json, re, sys
def drop(v):
    if isinstance(v, dict):
        return {k: drop(x) for k, x in v.items()
                if not re.search(r"second|time|elapsed|per_s", k)}
    if isinstance(v, list):
        return [drop(x) for x in v]
    return v
path = sys.argv[1]
v = drop(json.load(open(path)))
json.dump(v, open(path, "w"), sort_keys=True)
PY
}

same() {  # NAME A B (files or directories)
  if diff -r -x manifest.json "$2" "$3" > /dev/null; then
    echo "ok   $1"
  else
    echo "FAIL $1: $2 and $3 differ"
    diff -r -x manifest.json "$2" "$3" | head -3 || true
    fail=1
  fi
}

run_model() {  # NAME DIR PRECISION
  local name=$1 dir=$2 prec=$3 d="$work/$1.$3"
  mkdir -p "$d"
  local vocab
  vocab=$(vocab_of "$dir")
  tokens_input "$vocab" "$d/in.jsonl"
  python3 -c "import json,sys; print(' '.join(str(t) for l in open(sys.argv[1]) for t in json.loads(l)['tokens']))" "$d/in.jsonl" > "$d/ids.txt"
  for t in 1 2 3; do
    "$loom" extract --model "$dir" --input "$d/in.jsonl" --out "$d/x$t" \
      --hooks 'blocks.*.hook_resid_post' --select last --select mean \
      --select all --batch-tokens 64 --commit-every 4 --precision "$prec" \
      --threads "$t" --quiet
    "$loom" perplexity --model "$dir" --tokens "$d/ids.txt" --ctx 32 \
      --precision "$prec" --threads "$t" --json > "$d/ppl$t.json"
    untimed "$d/ppl$t.json"
  done
  same "$name $prec extract, threads 1 vs 2" "$d/x1" "$d/x2"
  same "$name $prec extract, threads 1 vs 3" "$d/x1" "$d/x3"
  same "$name $prec perplexity, threads 1 vs 2" "$d/ppl1.json" "$d/ppl2.json"
  same "$name $prec perplexity, threads 1 vs 3" "$d/ppl1.json" "$d/ppl3.json"
}

run_model stories260K "$here/models/stories260K" f32
run_model stories260K "$here/models/stories260K" bf16
for t in 1 2 3; do
  "$loom" generate --model "$here/models/stories260K" --prompt "Once upon a time" \
    --max-tokens 24 --temperature 0.8 --seed 3 --threads "$t" --json > "$work/gen$t.json"
  untimed "$work/gen$t.json"
done
same "stories260K generate, threads 1 vs 2" "$work/gen1.json" "$work/gen2.json"
same "stories260K generate, threads 1 vs 3" "$work/gen1.json" "$work/gen3.json"

if [ -d "$tiny" ]; then
  for m in llama qwen3 gpt2 gemma2 mixtral qwen3_moe gpt_oss_mxfp4 \
           llama_nvfp4_modelopt qwen3_fp8_block llama3rope_bf16; do
    [ -d "$tiny/$m" ] || { echo "FAIL $m: missing from $tiny"; fail=1; continue; }
    run_model "$m" "$tiny/$m" f32
    run_model "$m" "$tiny/$m" bf16
  done
else
  echo "SKIP the HF golden tiny models: $tiny is not here (a fresh clone without ../shared)"
fi
exit $fail
