#!/usr/bin/env bash
# Runs a command under an ISA cap: LOOM_CPU_ISA=LEVEL (Loom's own kernel
# dispatch), to exercise a lower level's code paths on a bigger CPU. Exits 77
# (CTest: skipped) when LEVEL is not below this CPU's own level: the plain,
# uncapped run covers that one.
# Usage: isa_cap.sh baseline|avx2|avx512|avx512bf16 COMMAND [ARGS...]
set -euo pipefail
level=$1
shift
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() {
  local f
  for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done
}
detected=baseline
if has avx2 fma f16c; then
  detected=avx2
  if has avx512f avx512bw avx512dq avx512vl; then
    detected=avx512
    if has avx512_bf16; then
      detected=avx512bf16
      # (Loom also needs the kernel's permission for the tiles; without it
      # the amx run is the avx512bf16 one, and this cap a repeat of it.)
      if has amx_tile amx_bf16; then detected=amx; fi
    fi
  fi
fi
rank() {
  case $1 in
    baseline) echo 0 ;; avx2) echo 1 ;; avx512) echo 2 ;; avx512bf16) echo 3 ;;
    amx) echo 4 ;;
    *) echo "isa_cap.sh: unknown level '$1'" >&2; exit 2 ;;
  esac
}
if [ "$(rank "$level")" -ge "$(rank "$detected")" ]; then
  echo "SKIP: this CPU is $detected; LOOM_CPU_ISA=$level would be the native run"
  exit 77
fi
echo "LOOM_CPU_ISA=$level (this CPU: $detected)"
LOOM_CPU_ISA=$level exec "$@"
