#!/usr/bin/env bash
# A bf16 and an f16 checkpoint run with their weights as stored, on every ISA
# (no f32 copy of the model): `loom extract --verify-plan` on a synthetic
# TinyLlama (8 of its layers, full vocabulary) must find the peak resident
# memory within 1 % of the plan, and below 1.5x the stored bytes (an f32
# copy would add twice them). Run at the CPU's own ISA level.
# Usage: verify_plan_cli_test.sh path/to/loom
set -euo pipefail
loom=$(realpath "$1")
models_dir="$(cd "$(dirname "$0")/.." && pwd)/models"
if grep -q "AddressSanitizer" "$loom"; then
  # ASan's shadow memory and redzones are resident memory no plan describes.
  echo "SKIP: $loom is built with AddressSanitizer; resident memory is only measured in a plain build"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail=0
python3 - <<'PY'
import json, random
r = random.Random(5)
with open("in.jsonl", "w") as f:
    for i in range(16):  # 2048 tokens: one full batch
        f.write(json.dumps({"id": i, "tokens": [r.randrange(32000) for _ in range(128)]}) + "\n")
PY
for dtype in bf16 f16; do
  "$loom" synth "m_$dtype" --preset tinyllama-1.1b --layers 8 --dtype "$dtype" > /dev/null
  stored=$(stat -c %s "m_$dtype/model.safetensors")
  "$loom" extract --model "m_$dtype" --input in.jsonl --out "out_$dtype" \
    --hooks hook_resid_post --layers 1.0 --select last --verify-plan > "sum_$dtype.json"
  python3 - "$dtype" "$stored" "sum_$dtype.json" <<'PY' || fail=1
import json, sys
dtype, stored, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = json.load(open(path))
v = s["verify_plan"]
print(f"{dtype}: planned {v['planned_bytes']} resident {v['resident_bytes']} "
      f"ratio {v['ratio']:.4f}; checkpoint {stored} bytes")
ok = v["within_1_percent"]
# An f32 copy of the weights would need twice the stored bytes on top.
ok = ok and v["resident_bytes"] < 1.5 * stored
if not ok:
    print(f"FAIL {dtype}: resident memory is not the plan's, or the weights were expanded")
sys.exit(0 if ok else 1)
PY
done
# Generation is planned like extract (its KV cache, batch and logits head):
# the bf16 model with the bundled tokenizer (ids below 512), the prompt's
# forward through the cache.
mkdir gen_model
cp m_bf16/config.json gen_model/
ln -s "$work/m_bf16/model.safetensors" gen_model/model.safetensors
cp "$models_dir/stories260K/tokenizer.json" "$models_dir/stories260K/tokenizer_config.json" gen_model/
"$loom" generate --model gen_model --prompt "Once upon a time, there was a little girl who" \
  --max-tokens 0 --precision bf16 --json --show-plan --verify-plan > gen.json 2> gen_err.txt || fail=1
python3 - gen_err.txt <<'PY' || fail=1
import json, re, sys
err = open(sys.argv[1]).read()
if "loom generate: memory plan" not in err:
    print("FAIL generate: --show-plan printed no plan:\n" + err); sys.exit(1)
m = re.search(r"loom generate: verify-plan: (\{.*\})", err)
if not m:
    print("FAIL generate: no verify-plan report:\n" + err); sys.exit(1)
v = json.loads(m.group(1))
print(f"generate: planned {v['planned_bytes']} resident {v['resident_bytes']} ratio {v['ratio']:.4f}")
if not v["within_1_percent"]:
    print("FAIL generate: resident memory is not the plan's"); sys.exit(1)
PY
# Verification that fails says so on stderr (a tiny model: the libraries'
# fixed heap outweighs its plan), and one that passes prints no warning.
printf 'Once upon a time\n' > tiny.txt
"$loom" extract --model "$models_dir/stories260K" --input tiny.txt --out out_tiny \
  --hooks blocks.0.hook_resid_post --verify-plan > sum_tiny.json 2> err_tiny.txt
python3 - sum_tiny.json err_tiny.txt sum_bf16.json <<'PY' || fail=1
import json, sys
v = json.load(open(sys.argv[1]))["verify_plan"]
err = open(sys.argv[2]).read()
warned = "warning: --verify-plan: resident" in err
if v["within_1_percent"] == warned:
    print(f"FAIL: within_1_percent {v['within_1_percent']} but warning printed: {warned}: {err}")
    sys.exit(1)
assert json.load(open(sys.argv[3]))["verify_plan"]["library_bytes"] >= 0
print(f"tiny: ratio {v['ratio']:.3f}, warning printed: {warned}")
PY
exit $fail
