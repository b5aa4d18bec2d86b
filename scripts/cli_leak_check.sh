#!/usr/bin/env bash
# Runs every `loom` command on the bundled model under LeakSanitizer (a
# LOOM_SANITIZE build), successes and error exits alike, and fails if any run
# leaks, trips ASan/UBSan, or exits with another code than expected.
#   scripts/cli_leak_check.sh LOOM_BINARY
# Registered with CTest as `cli_leak_check` in sanitizer builds.
set -uo pipefail
loom="${1:?usage: scripts/cli_leak_check.sh LOOM_BINARY}"
root="$(cd "$(dirname "$0")/.." && pwd)"
model="$root/models/stories260K"
text="$root/tests/data/wikitext2/wiki.test.raw.first16000chars.txt"
prompts="$root/models/prompts/stories.jsonl"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Leaks are reported at exit with this code, so they cannot pass as an exit 1.
export ASAN_OPTIONS="detect_leaks=1:exitcode=86:abort_on_error=0"
export LSAN_OPTIONS="exitcode=86"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

runs=0
failures=0
# expect CODE NAME -- ARGS...: runs loom ARGS, expecting exit CODE.
expect() {
  local want="$1" name="$2"
  shift 3
  local log="$work/$name.log"
  "$loom" "$@" >"$log" 2>&1 </dev/null
  local rc=$?
  runs=$((runs + 1))
  if [ "$rc" -ne "$want" ] || grep -qE 'LeakSanitizer|AddressSanitizer|runtime error' "$log"; then
    failures=$((failures + 1))
    echo "FAIL $name: exit $rc (expected $want): loom $*"
    grep -E 'ERROR|SUMMARY|runtime error|#[0-9]+ ' "$log" | head -30
    tail -5 "$log"
  else
    echo "ok   $name (exit $rc)"
  fi
}

head -c 3000 "$text" >"$work/short.txt"
head -n 12 "$prompts" >"$work/prompts.jsonl"

expect 0 version -- --version
expect 0 inspect -- inspect "$model"
expect 0 plan -- plan "$model" --batch-tokens 256 --device cpu=1GiB
expect 0 plan_solve -- plan "$model" --solve max-batch-tokens --ctx 256 --device cpu=64MiB
expect 0 tokenize -- tokenize "$model" --text "Once upon a time" --json
expect 0 extract -- extract --model "$model" --input "$work/prompts.jsonl" \
  --out "$work/x" --hooks blocks.1.hook_resid_post --select last --select all \
  --commit-every 5 --threads 1 --quiet
expect 0 extract_resume_complete -- extract --model "$model" --input "$work/prompts.jsonl" \
  --out "$work/x" --hooks blocks.1.hook_resid_post --select last --select all \
  --commit-every 5 --threads 1 --quiet --resume
expect 0 extract_safetensors -- extract --model "$model" --input "$work/prompts.jsonl" \
  --out "$work/xs" --hooks hook_resid_post --layers -1 --select mean --format safetensors \
  --threads 1 --quiet
for i in 0 1; do
  expect 0 "extract_shard_$i" -- extract --model "$model" --input "$work/prompts.jsonl" \
    --out "$work/shard$i" --hooks blocks.1.hook_resid_post --select last --select all \
    --commit-every 5 --threads 1 --quiet --shard "$i/2"
done
expect 0 merge -- merge "$work/merged" "$work/shard1" "$work/shard0" --quiet
RANK=0 WORLD_SIZE=1 expect 0 extract_shard_auto -- extract --model "$model" \
  --input "$work/prompts.jsonl" --out "$work/auto" --hooks blocks.1.hook_resid_post \
  --threads 1 --quiet --shard auto
expect 0 perplexity -- perplexity --model "$model" --text "$work/short.txt" --ctx 64 \
  --max-windows 3 --threads 1
expect 0 compare -- compare --model "$model" --reference "$model" --text "$work/short.txt" \
  --ctx 64 --max-windows 2 --threads 1
expect 0 generate -- generate --model "$model" --prompt "Once upon a time" --max-tokens 8 \
  --threads 1
expect 0 generate_hooks -- generate --model "$model" --prompt "Once" --max-tokens 4 \
  --hooks blocks.2.hook_resid_post --threads 1 --json
expect 0 synth -- synth "$work/synth" --layers 1 --vocab 256 --dtype bf16
expect 0 devices -- devices

# Error exits must not leak either.
expect 2 bad_flag -- extract --no-such-flag
expect 1 missing_model -- inspect "$work/absent"
expect 1 bad_hook -- extract --model "$model" --input "$work/prompts.jsonl" \
  --out "$work/bad" --hooks blocks.99.hook_resid_post --quiet
expect 1 job_exists -- extract --model "$model" --input "$work/prompts.jsonl" \
  --out "$work/x" --hooks blocks.1.hook_resid_post --quiet
expect 1 merge_missing_shard -- merge "$work/merged2" "$work/shard0"
expect 1 does_not_fit -- plan "$model" --batch-tokens 256 --device cpu=1KiB
expect 1 missing_text -- perplexity --model "$model" --text "$work/absent.txt"

# serve: start, one request of each kind, SIGTERM; a clean exit (0).
"$loom" serve --model "$model" --port 0 --threads 1 >"$work/serve.log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 600); do
  port="$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+' "$work/serve.log" | grep -oE '[0-9]+$')"
  [ -n "$port" ] && break
  sleep 0.1
done
runs=$((runs + 1))
if [ -z "$port" ]; then
  failures=$((failures + 1))
  echo "FAIL serve: did not start"
  cat "$work/serve.log"
  kill -9 "$pid" 2>/dev/null
else
  post() {
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf 'POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
      "$1" "${#2}" "$2" >&3
    cat <&3 >>"$work/serve.replies"
    echo >>"$work/serve.replies"
    exec 3>&-
  }
  post /generate '{"prompt":"Once","max_tokens":3,"return_hidden_states":true}'
  post /embed '{"text":"The cat","pooling":"mean"}'
  post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}'
  post /generate/stream '{"prompt":"Once","max_tokens":2}'
  post /generate '{"prompt":5}'
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  if [ "$rc" -ne 0 ] || grep -qE 'LeakSanitizer|AddressSanitizer|runtime error' "$work/serve.log"; then
    failures=$((failures + 1))
    echo "FAIL serve: exit $rc"
    grep -E 'ERROR|SUMMARY|runtime error|#[0-9]+ ' "$work/serve.log" | head -30
  elif [ "$(grep -c '^HTTP/1.1 200' "$work/serve.replies")" -ne 4 ] ||
       [ "$(grep -c '^HTTP/1.1 400' "$work/serve.replies")" -ne 1 ]; then
    failures=$((failures + 1))
    echo "FAIL serve: unexpected replies"
    grep -aE "^HTTP/1.1|detail" "$work/serve.replies" | head -20
  else
    echo "ok   serve (exit 0, 4 x 200, 1 x 400)"
  fi
fi
echo "cli_leak_check: $runs runs, $failures failed"
[ "$failures" -eq 0 ]
