#!/usr/bin/env bash
# A sequence's outputs must not depend on what shares its batch: `loom
# extract` of one prompt alone, and of the same prompt first, in the middle
# and last among 24 other prompts of other lengths, at --batch-tokens 128
# and 4096, must give that prompt identical bytes in every array (every
# layer's residual stream, the final norm; last, mean and all selectors).
# On the bundled model and, when ../shared is present, on the HF golden tiny
# models (dense, sliding window, MoE, MLA, MXFP4, FP8, NVFP4; f32 and bf16).
# Usage: batch_cli_test.sh path/to/loom
set -euo pipefail
source "$(dirname "$0")/cli_test_lib.sh"

# in.jsonl files: alone, first, mid, last (token ids; the prompt of interest
# has 37 tokens, the others 1 to 90).
inputs() {  # VOCAB DIR
  python3 - "$1" "$2" <<'PY'
import json, random, sys
vocab, d = int(sys.argv[1]), sys.argv[2]
rng = random.Random(11)
target = [rng.randrange(vocab) for _ in range(37)]
others = [[rng.randrange(vocab) for _ in range(rng.choice([1, 5, 17, 40, 63, 90]))]
          for _ in range(23)]
def write(name, rows):
    with open(f"{d}/{name}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"tokens": r}) + "\n")
write("alone", [target])
write("first", [target] + others)
write("mid", others[:11] + [target] + others[11:])
write("last", others + [target])
PY
}

# The bytes of row ROW of every array of an extract output (fixed-shape
# arrays: row ROW; ragged ones: its span from the offsets file), one file per
# array in OUT.
rows_of() {  # EXTRACT_DIR ROW OUT
  python3 - "$1" "$2" "$3" <<'PY'
import json, os, struct, sys
src, row, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(out, exist_ok=True)
def npy(path):
    with open(path, "rb") as f:
        data = f.read()
    major = data[6]
    n = struct.unpack("<H" if major == 1 else "<I", data[8:10] if major == 1 else data[8:12])[0]
    start = (10 if major == 1 else 12) + n
    header = eval(data[start - n:start].decode("latin1"))
    return header, data[start:]
manifest = json.load(open(os.path.join(src, "manifest.json")))
for a in manifest["arrays"]:
    header, body = npy(os.path.join(src, a["file"]))
    width = 1
    for d in a["row_shape"]:
        width *= d
    item = {"<f4": 4, "<f2": 2, "<u2": 2}[header["descr"]] * width
    if "offsets_file" in a:
        _, offs = npy(os.path.join(src, a["offsets_file"]))
        b, e = struct.unpack_from("<qq", offs, 8 * row)
        piece = body[b * item:e * item]
    else:
        piece = body[row * item:(row + 1) * item]
    with open(os.path.join(out, a["file"] + ".row"), "wb") as f:
        f.write(piece)
PY
}

run_model() {  # NAME DIR PRECISION
  local name=$1 dir=$2 prec=$3 d="$work/$1.$3"
  mkdir -p "$d"
  local vocab
  vocab=$(vocab_of "$dir")
  inputs "$vocab" "$d"
  for bt in 128 4096; do
    for v in alone first mid last; do
      "$loom" extract --model "$dir" --input "$d/$v.jsonl" --out "$d/$v.$bt" \
        --hooks 'blocks.*.hook_resid_post' --hooks ln_final.hook_normalized \
        --select last --select mean --select all --batch-tokens "$bt" \
        --precision "$prec" --quiet
    done
    rows_of "$d/alone.$bt" 0 "$d/r.alone.$bt"
    rows_of "$d/first.$bt" 0 "$d/r.first.$bt"
    rows_of "$d/mid.$bt" 11 "$d/r.mid.$bt"
    rows_of "$d/last.$bt" 23 "$d/r.last.$bt"
    for v in first mid last; do
      if diff -r "$d/r.alone.$bt" "$d/r.$v.$bt" > /dev/null; then
        echo "ok   $name $prec --batch-tokens $bt: alone == $v of 24"
      else
        echo "FAIL $name $prec --batch-tokens $bt: alone != $v of 24"
        diff -r "$d/r.alone.$bt" "$d/r.$v.$bt" | head -3 || true
        fail=1
      fi
    done
  done
  # Alone at 128 vs alone at 4096 (other batch plans, one sequence).
  if ! diff -r "$d/r.alone.128" "$d/r.alone.4096" > /dev/null; then
    echo "FAIL $name $prec: alone at --batch-tokens 128 != 4096"
    fail=1
  fi
}

run_model stories260K "$here/models/stories260K" f32
run_model stories260K "$here/models/stories260K" bf16

if [ -d "$tiny" ]; then
  for m in llama qwen3 gemma2 mistral_sw16_sharded mixtral qwen3_moe \
           deepseek_v3 gpt_oss_mxfp4 qwen3_fp8_block llama_nvfp4_modelopt \
           llama3rope_bf16; do
    [ -d "$tiny/$m" ] || { echo "FAIL $m: missing from $tiny"; fail=1; continue; }
    run_model "$m" "$tiny/$m" f32
    run_model "$m" "$tiny/$m" bf16
  done
else
  echo "SKIP the HF golden tiny models: $tiny is not here (a fresh clone without ../shared)"
fi
exit $fail
