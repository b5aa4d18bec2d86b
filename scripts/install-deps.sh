#!/usr/bin/env bash
# Installs the Debian (bookworm) packages Loom needs to build and test.
# Safe to re-run: packages already present are skipped.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  ccache               # compiler cache (CMake uses it when present)
  libdnnl-dev          # oneDNN: CPU GEMM (bf16/f32 matmul)
  nlohmann-json3-dev   # JSON (config.json, safetensors headers, manifests)
  libfmt-dev           # formatting
  libcli11-dev         # command-line parsing
  libpcre2-dev         # Unicode regex for pre-tokenizers (UTF + UCP + JIT)
  libicu-dev           # Unicode normalisation (NFC/NFKC)
  libsentencepiece-dev # tokenizer.model support
  libssl-dev           # SHA-256 of inputs and configs recorded in manifests
  libzip-dev           # .npz archives (Gemma Scope's params.npz)
  libgtest-dev libgmock-dev
  libbenchmark-dev
  python3 python3-numpy  # tests open our .npy output with numpy
  python3-dev pybind11-dev  # the Python module `loom` (python/, docs/python.md)
  python3-pytest python3-venv  # its tests (pytest) and the tested virtualenv install
  python3-jinja2       # regenerates expected chat template renders; tests do not need it
  libcpp-httplib-dev   # HTTP server of `loom serve` (and the client its tests drive it with)
  libyaml-cpp-dev      # `loom serve --config` (YAML)
  libeigen3-dev        # `loom serve`'s /analyze/geometry and /analyze/bilateral
                       # (Gram matrices, symmetric eigen-decompositions)
  libsqlite3-dev       # `loom serve`'s /experiments store (SQLite, WAL)
  curl                 # the docs' curl examples run against `loom serve` (docs_curl)
  nodejs               # the OpenAI SDK test of `loom serve` (serve_openai_sdk;
                       # npm and the SDK: below)
  openmpi-bin libopenmpi-dev  # `extract --shard auto` under mpirun (rank 0
                       # merges after a barrier) and its test (mpirun -np 2)
  clang libclang-rt-14-dev libomp-dev llvm  # `make asan` / `make fuzz`: clang, its
                       # ASan/UBSan/libFuzzer runtimes, OpenMP, llvm-symbolizer
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm: Debian's nodejs lacks it (package npm); NodeSource's nodejs bundles it
# and conflicts with Debian's npm, so it is installed only when missing.
if ! command -v npm > /dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing npm"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    --no-install-recommends npm || echo "install-deps: npm could not be installed"
fi

# npm packages of the tests, at the versions of tests/node/package-lock.json
# (the official OpenAI SDK), into tests/node/node_modules (git-ignored).
node_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/node"
if ! command -v npm > /dev/null; then
  echo "install-deps: npm is missing: the serve_openai_sdk test will skip"
elif [ "$(node -p "require('$node_dir/package.json').dependencies.openai" 2>&1)" != \
       "$(node -p "require('$node_dir/node_modules/openai/package.json').version" 2>&1)" ]; then
  echo "install-deps: npm ci in tests/node"
  npm ci --prefix "$node_dir" --no-audit --no-fund --loglevel=error ||
    echo "install-deps: npm ci failed: the serve_openai_sdk test will skip"
else
  echo "install-deps: tests/node/node_modules is up to date"
fi
