#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a LOOM_FUZZ build (docs/design/fuzzing.md).
#   fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]
# Each harness runs SECONDS from its seed corpus (fuzz/corpus/NAME) and its
# regressions (fuzz/regressions/NAME); new inputs go to BUILD_DIR/fuzz-work/NAME,
# crashes, leaks, timeouts and OOMs to BUILD_DIR/fuzz-artifacts/NAME, logs to
# BUILD_DIR/fuzz-logs/NAME.log. FUZZ_JOBS harnesses run at once (default: the
# number of cores). Prints executions and coverage per harness; exits non-zero
# if any harness found a failure.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}"
seconds="${2:?usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}"
shift 2
build="$(cd "$build" && pwd)"
if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  mapfile -t harnesses < <(cd "$build/fuzz" && ls fuzz_* 2>/dev/null | grep -v '\.' | sort)
fi
if [ ${#harnesses[@]} -eq 0 ]; then
  echo "fuzz/run.sh: no harnesses in $build/fuzz (configure with -DLOOM_FUZZ=ON and build loom_fuzzers)" >&2
  exit 1
fi
jobs="${FUZZ_JOBS:-$(nproc)}"
# Scratch files of the harnesses on a RAM disk when there is one.
scratch="${TMPDIR:-/tmp}"
[ -d /dev/shm ] && [ -w /dev/shm ] && scratch=/dev/shm
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

run_one() {
  local name="$1" exe="$build/fuzz/$1"
  local work="$build/fuzz-work/$name" art="$build/fuzz-artifacts/$name"
  local log="$build/fuzz-logs/$name.log"
  mkdir -p "$work" "$art" "$(dirname "$log")"
  local dirs=("$work" "$root/fuzz/corpus/$name")
  [ -d "$root/fuzz/regressions/$name" ] && dirs+=("$root/fuzz/regressions/$name")
  local dict=()
  [ -f "$root/fuzz/dict/$name.dict" ] && dict=("-dict=$root/fuzz/dict/$name.dict")
  TMPDIR="$scratch" "$exe" -max_total_time="$seconds" -timeout=30 \
    -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$art/" "${dict[@]}" "${dirs[@]}" >"$log" 2>&1
  echo $? >"$log.rc"
}

running=0
for h in "${harnesses[@]}"; do
  if [ ! -x "$build/fuzz/$h" ]; then
    echo "fuzz/run.sh: $build/fuzz/$h is not built" >&2
    exit 1
  fi
  run_one "$h" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
printf '%-20s %6s %12s %9s %8s %8s %s\n' harness status executions exec/s cov ft corpus
for h in "${harnesses[@]}"; do
  log="$build/fuzz-logs/$h.log"
  rc="$(cat "$log.rc" 2>/dev/null || echo '?')"
  execs="$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')"
  rate="$(grep -o 'exec/s: [0-9]*' "$log" | tail -1 | awk '{print $2}')"
  cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)"
  corpus="$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 | awk '{print $2}')"
  status=ok
  if [ "$rc" != 0 ]; then status=FAILED; failed=1; fi
  printf '%-20s %6s %12s %9s %8s %8s %s\n' "$h" "$status" "${execs:-?}" \
    "${rate:-?}" "$(echo "$cov" | awk '{print $2}')" "$(echo "$cov" | awk '{print $4}')" "${corpus:-?}"
done
if [ "$failed" -ne 0 ]; then
  for h in "${harnesses[@]}"; do
    log="$build/fuzz-logs/$h.log"
    [ "$(cat "$log.rc" 2>/dev/null)" = 0 ] && continue
    echo "---- $h failed (log $log; inputs in $build/fuzz-artifacts/$h):"
    grep -E 'ERROR|SUMMARY|fuzz property|runtime error|Test unit written' "$log" | head -20
  done
  echo "Reproduce: $build/fuzz/NAME ARTIFACT; keep the input as a regression:" \
       "cp ARTIFACT fuzz/regressions/NAME/" >&2
fi
exit "$failed"
