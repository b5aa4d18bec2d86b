#!/usr/bin/env bash
# Regenerates docs/models.md, the correctness matrix: runs the golden parity
# test (f32 and bf16, every golden case) with LOOM_MODEL_MATRIX set, so each
# case records its worst measured error per hook, then renders the table from
# those records and `loom inspect --json` (scripts/models_matrix.py).
# Usage: scripts/models_matrix.sh [BUILD_DIR]   (default build; needs ../shared)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
golden="${LOOM_SHARED_DIR:-$(cd .. && pwd)/shared}/golden"
if [[ ! -d "$golden/tiny" ]]; then
  echo "models_matrix.sh: $golden/tiny not found: the matrix needs the shared goldens" >&2
  exit 1
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
LOOM_MODEL_MATRIX="$dir" "$build/tests/golden_parity_test" \
  --gtest_filter='Models/GoldenParityTest.*' >"$dir/log" 2>&1 || {
  tail -40 "$dir/log" >&2
  echo "models_matrix.sh: the parity test failed; docs/models.md left as it was" >&2
  exit 1
}
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
isa="$("$build/loom" devices 2>/dev/null | sed -n "s/^cpu isa: \([a-z0-9_]*\).*/isa \1/p" | head -1 || true)"
python3 scripts/models_matrix.py --matrix "$dir" --loom "$build/loom" \
  --golden "$golden" --bundled models --constructed tests/data/constructed --cpu "${cpu:-unknown CPU}${isa:+, $isa}, $(date -u +%Y-%m-%d)" \
  --out docs/models.md
