#!/usr/bin/env bash
# The curl examples of README.md, docs/server.md and docs/saes.md, run as
# written against `loom serve` on the bundled model (with the bundled random
# SAE as source 2-res-random): every one sends JSON with
# `Content-Type: application/json` and gets HTTP 200 and a JSON body (the
# DELETE examples run last, since they unload the model).
# Usage: docs_curl_test.sh path/to/loom
set -euo pipefail
loom=$(realpath "$1")
repo="$(cd "$(dirname "$0")/.." && pwd)"
command -v curl > /dev/null || { echo "SKIP: curl is not installed"; exit 77; }
work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$loom" serve --model "$repo/models/stories260K" --port "$port" \
  --sae "2-res-random=$repo/models/saes/stories260K-res2" > "$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -s -o /dev/null "127.0.0.1:$port/health" && break
  sleep 0.1
done
python3 - "$port" "$repo/README.md" "$repo/docs/server.md" "$repo/docs/saes.md" <<'PY'
import json, os, re, shlex, subprocess, sys, tempfile
scratch = tempfile.mkdtemp(prefix="loom-docs-curl-")
port, docs = sys.argv[1], sys.argv[2:]
commands = []
for doc in docs:
    text = open(doc).read()
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("curl "):
                cmd = lines[i]
                while cmd.count("'") % 2 and i + 1 < len(lines):
                    i += 1
                    cmd += "\n" + lines[i]
                commands.append((doc, cmd))
            i += 1
assert len(commands) >= 10, f"found only {len(commands)} curl examples"
commands.sort(key=lambda c: "-X DELETE" in c[1])  # stable: DELETEs last
failed = 0
for doc, cmd in commands:
    argv = shlex.split(cmd.replace("localhost:8080", f"127.0.0.1:{port}"))
    if "-d" in argv and "Content-Type: application/json" not in argv:
        print(f"FAIL {doc}: sends a body without Content-Type: application/json:\n{cmd}")
        failed += 1
        continue
    if "-o" in argv:
        # A binary reply saved to a file (docs/server.md's npy / safetensors
        # examples): written to a scratch folder, then its format checked.
        i = argv.index("-o")
        name = argv[i + 1]
        argv[i + 1] = os.path.join(scratch, os.path.basename(name))
        out = subprocess.run(argv + ["-w", "%{http_code}"], capture_output=True, text=True)
        code, body = out.stdout, ""
        data = open(argv[i + 1], "rb").read() if os.path.exists(argv[i + 1]) else b""
        if name.endswith(".npy"):
            ok = code == "200" and data.startswith(b"\x93NUMPY")
        elif name.endswith(".safetensors"):
            n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
            try:
                ok = code == "200" and n > 0 and isinstance(json.loads(data[8:8 + n]), dict)
            except ValueError:
                ok = False
        else:
            ok = False
        body = data[:200].decode("latin-1")
    else:
        out = subprocess.run(argv + ["-w", "\n%{http_code}"], capture_output=True, text=True)
        body, _, code = out.stdout.rpartition("\n")
        try:
            json.loads(body)
            ok = code == "200"
        except ValueError:
            ok = False
    print(("ok  " if ok else "FAIL") + f" {code} {doc.rsplit('/', 2)[-1]}: {cmd.splitlines()[0][:90]}")
    if not ok:
        print(body[:500])
        failed += 1
print(f"{len(commands)} curl examples, {failed} failed")
for f in os.listdir(scratch):
    os.remove(os.path.join(scratch, f))
os.rmdir(scratch)
sys.exit(1 if failed else 0)
PY
