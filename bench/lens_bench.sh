#!/usr/bin/env bash
# The lens grid's cost beside the bare forward, in one run:
#   bench/lens_bench.sh LOOM_BIN MODEL_DIR [TOKENS] [TOPK] [REPEATS] [THREADS]
# runs `loom lens --json` on TOKENS seeded-random token ids (default 512;
# every residual hook: blocks.0.hook_resid_pre and each hook_resid_post) and
# prints, with the CPU model, the forward's seconds, the seconds inside the
# lens (head GEMMs and top-k of every hook) and the ratio grid / bare forward
# (seconds / (seconds - lens_seconds)), both from the same process; then the
# same with one hook (the last layer's: the model's own logits), whose ratio
# is the head's share of a forward. REPEATS runs each (default 3), the median
# printed.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n 2,11p "$0"
  exit 2
fi
loom=$1
model=$2
tokens=${3:-512}
topk=${4:-10}
repeats=${5:-3}
threads=${6:-0}
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
layers=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$model/config.json")
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, $vocab)) for _ in range($tokens)))")
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, threads ${threads} (0 = all)"
run() {  # hooks -> "seconds lens_seconds" medians
  for _ in $(seq "$repeats"); do
    "$loom" lens --model "$model" --prompt-tokens "$ids" --topk "$topk" --json --quiet \
      --threads "$threads" $1 | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['seconds'], j['lens_seconds'])"
  done | sort -n | awk -v n="$repeats" 'NR == int((n + 1) / 2) {print}'
}
report() {  # name hooks
  read -r s l < <(run "$2")
  python3 -c "
s, l = $s, $l
print('%-34s forward+lens %.3f s, lens %.3f s, bare forward %.3f s, ratio %.2fx' % ('$1', s, l, s - l, s / (s - l)))"
}
echo "model: $model ($layers layers, vocab $vocab), $tokens tokens, top-$topk"
report "every residual hook ($((layers + 1)) hooks)" ""
report "last hook_resid_post (1 hook)" "--hooks blocks.$((layers - 1)).hook_resid_post"
