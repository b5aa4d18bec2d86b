#!/usr/bin/env bash
# The official OpenAI SDK for JavaScript (npm `openai`, pinned in
# tests/node/package.json, installed by scripts/install-deps.sh) driving
# `loom serve` on the bundled model: tests/node/openai_sdk_test.mjs.
# Without node or the installed SDK it skips (exit 77) and says so loudly.
# Usage: openai_sdk_test.sh path/to/loom
set -euo pipefail
loom=$(realpath "$1")
repo="$(cd "$(dirname "$0")/.." && pwd)"
skip() {
  echo "=================================================================="
  echo "SKIP: the OpenAI SDK test did not run: $1"
  echo "      run scripts/install-deps.sh (it installs node, npm and the"
  echo "      pinned SDK into tests/node/node_modules)"
  echo "=================================================================="
  exit 77
}
command -v node > /dev/null || skip "node is not installed"
[ -f "$repo/tests/node/node_modules/openai/package.json" ] ||
  skip "the openai package is not installed in tests/node/node_modules"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || skip "node $major is older than 18 (the SDK needs fetch)"
cd "$repo/tests/node"
exec node openai_sdk_test.mjs "$loom" "$repo/models/stories260K"
