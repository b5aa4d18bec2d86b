#!/usr/bin/env bash
# The main job on the bundled model: extract the residual stream at 25 %, 50 %
# and 100 % depth (last token and mean over the prompt) for the bundled prompts,
# then print where the results are and how to open them.
set -euo pipefail
LOOM="${1:-build/loom}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${LOOM_DEMO_OUT:-$ROOT/out/demo}"
rm -rf "$OUT"
"$LOOM" inspect "$ROOT/models/stories260K"
echo
"$LOOM" extract --model "$ROOT/models/stories260K" --input "$ROOT/models/prompts/stories.jsonl" \
  --out "$OUT" --hooks hook_resid_post --layers 0.25,0.5,1.0 --select last --select mean \
  --progress
echo
echo "Results: $OUT"
ls -l "$OUT"
echo
echo "Open them with numpy, e.g.:"
echo "  python3 -c \"import numpy as np; a = np.load('$OUT/blocks.4.hook_resid_post.last.npy', mmap_mode='r'); print(a.shape, a.dtype)\""
