# Sourced by the CLI tests (scripts/*_cli_test.sh) after `set -euo pipefail`:
# the loom binary ($1 of the test), the repository root, a scratch directory
# removed at exit, the failure flag, and helpers.
loom=$(realpath "$1")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
# The shared HF golden tiny models (absent on a fresh clone).
tiny="$here/../shared/golden/tiny"

# The vocabulary size of a model directory (text models and VLM wrappers).
vocab_of() {  # MODEL_DIR
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('vocab_size') or c['text_config']['vocab_size'])" "$1/config.json"
}
