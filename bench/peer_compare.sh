#!/usr/bin/env bash
# Loom's prefill beside llama.cpp's, back to back on this machine:
#   bench/peer_compare.sh LOOM_BIN MODEL_DIR GGUF [THREADS] [TOKENS] [PAIRS]
# runs `loom bench MODEL_DIR --json` and the peer script's llama-bench
# (shared/peers/llamacpp.sh bench GGUF THREADS TOKENS), then prints one row
# per prompt length: both tok/s and the ratio Loom / llama.cpp, with the CPU
# model and flags. The peer script is found at $LOOM_PEERS (default: the
# shared/peers folder beside the repository); without it, or without a built
# llama-bench, the script says so and exits 77 (skipped).
# GGUF: the same checkpoint converted by `llamacpp.sh gguf MODEL_DIR OUT.gguf`.
# PAIRS (default 1): repeat the pair and end with the median ratio per length.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,11p "$0"
  exit 2
fi
loom=$1
model=$2
gguf=$3
threads=${4:-$(nproc)}
tokens=${5:-128,512}
pairs=${6:-1}
here="$(cd "$(dirname "$0")" && pwd)"
peers="${LOOM_PEERS:-$here/../../shared/peers}"
if [ ! -x "$peers/llamacpp.sh" ] && [ ! -f "$peers/llamacpp.sh" ]; then
  echo "SKIP: no peer script at $peers/llamacpp.sh (set LOOM_PEERS)"
  exit 77
fi
if [ ! -f "$gguf" ]; then
  echo "SKIP: no GGUF at $gguf (make it with: llamacpp.sh gguf $model $gguf)"
  exit 77
fi
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | \
  grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512_bf16|avx512_fp16|amx_bf16)$' | tr '\n' ' ')"
echo "threads: $threads"
# One pair = loom bench, then llama-bench, back to back; with PAIRS > 1 the
# pairs repeat and the median ratio per length closes the table (on a noisy
# machine one pair is one sample).
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for pair in $(seq 1 "$pairs"); do
  loom_json=$("$loom" bench "$model" --tokens "$tokens" --threads "$threads" --json)
  if ! peer_md=$(bash "$peers/llamacpp.sh" bench "$gguf" "$threads" "$tokens" 2>&1); then
    echo "SKIP: llama-bench did not run:"
    echo "$peer_md"
    exit 77
  fi
  [ "$pair" -eq 1 ] && { echo "$peer_md" | grep -E '^\|' || true; }
  python3 - "$loom_json" "$peer_md" "$pair" "$results" <<'PY'
import json, re, sys
loom = json.loads(sys.argv[1])
pair, results = int(sys.argv[3]), sys.argv[4]
peer = {}
for line in sys.argv[2].splitlines():
    # | model | size | params | backend | threads | test | t/s |
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if len(cells) < 2:
        continue
    m = re.fullmatch(r'pp(\d+)', cells[-2])
    if m:
        peer[int(m.group(1))] = float(cells[-1].split('±')[0])
if pair == 1:
    print(f"loom: {loom['precision']}, kernels {loom['isa']}, load {loom['load_seconds']:.2f} s")
    print(f"{'pair':>4} {'tokens':>8} {'loom tok/s':>12} {'llama.cpp tok/s':>16} {'ratio':>7} {'loom of dense ref':>18}")
with open(results, 'a') as out:
    for p in loom['prefill']:
        t = p['tokens']
        ref = peer.get(t)
        ratio = f"{p['tokens_per_second'] / ref:.2f}" if ref else "n/a"
        peer_txt = f"{ref:.1f}" if ref else "n/a"
        frac = p['tokens_per_second'] / p['dense_reference_tokens_per_second']
        print(f"{pair:>4} {t:>8} {p['tokens_per_second']:>12.1f} {peer_txt:>16} {ratio:>7} {frac:>18.2f}")
        if ref:
            out.write(f"{t} {p['tokens_per_second'] / ref}\n")
PY
done
if [ "$pairs" -gt 1 ]; then
  python3 - "$results" <<'PY'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    t, r = line.split()
    by.setdefault(int(t), []).append(float(r))
for t in sorted(by):
    rs = by[t]
    print(f"median ratio at {t} tokens over {len(rs)} pairs: {statistics.median(rs):.2f} "
          f"(min {min(rs):.2f}, max {max(rs):.2f})")
PY
fi
