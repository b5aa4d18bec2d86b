#!/usr/bin/env python3
"""Regenerates the seed corpora under fuzz/corpus/ from the files in the repo
(and ../shared when present). The result is committed; run this only to
refresh the seeds. Usage: python3 fuzz/seeds.py BUILD_DIR

Each seed is the harness's mode byte followed by a real file (see the harness
sources for the modes). Large files are left out: a seed should be small
enough for the fuzzer to mutate quickly.
"""
import glob
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
MAX_SEED = 48 * 1024


def read(path):
    with open(path, "rb") as f:
        return f.read()


def add(harness, mode, payload):
    data = bytes([mode]) + payload
    if len(data) > MAX_SEED:
        return
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def shared(*parts):
    return glob.glob(os.path.join(SHARED, *parts))


def shrink_safetensors(path, keep=6):
    """The header of `path` with at most `keep` tensors, each given a tiny
    shape of its dtype, and matching data: a small valid file of the same
    structure (dtypes, names, metadata)."""
    raw = read(path)
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    out, offset = {}, 0
    sizes = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "F16": 2, "BF16": 2,
             "I16": 2, "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1,
             "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
    for name in sorted(header)[:keep]:
        t = header[name]
        shape = [min(d, 2) for d in t["shape"]]
        size = sizes.get(t["dtype"], 1)
        for d in shape:
            size *= d
        out[name] = {"dtype": t["dtype"], "shape": shape,
                     "data_offsets": [offset, offset + size]}
        offset += size
    if meta is not None:
        out["__metadata__"] = meta
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(range(256)) * (offset // 256) \
        + bytes(range(offset % 256))


def safetensors():
    files = [os.path.join(ROOT, "models/stories260K/model.safetensors")]
    files += shared("golden/tiny/*/model*.safetensors")
    files += shared("models/moe-fixtures-atenia/*.safetensors")
    for f in files:
        add("fuzz_safetensors", 0, shrink_safetensors(f))
    index = {"metadata": {"total_size": 24},
             "weight_map": {"a": "shard-1.safetensors",
                            "b": "shard-1.safetensors"}}
    add("fuzz_safetensors", 1, json.dumps(index).encode())
    for f in glob.glob(os.path.join(ROOT, "tests/data/configs/*/*.index.json")):
        add("fuzz_safetensors", 1, read(f)[:MAX_SEED - 1])


def configs():
    files = glob.glob(os.path.join(ROOT, "tests/data/configs/*/config.json"))
    files += [os.path.join(ROOT, "models/stories260K/config.json")]
    files += glob.glob(os.path.join(ROOT, "tests/data/constructed/*/config.json"))
    files += shared("golden/tiny/*/config.json")
    files += shared("models/configs/*/config.json")
    for f in files:
        data = read(f)
        add("fuzz_config", data[0], data[1:])  # the mode byte is unused


def plan_args():
    for text in [
            "cpu=24GiB\n\n\nbalanced\n\n512\n2048\n1.5GiB",
            "cuda:0=80GiB;cuda:1=80GiB,disk\ncuda:0=70GiB\n2GiB\nsequential\n"
            "20,28\n4096\n8192\n80GB",
            "cuda:0=80GiB,cuda:1=40GiB\ncpu=100GiB\ncuda:0=1GiB,cpu=2GiB\n"
            "manual\n10,14\n1024\n1024\n123456789",
            "cpu\n\n\n\n\n\n\n0", "disk\n64MiB\n\nbalanced\n\n1\n1\n1KiB"]:
        add("fuzz_plan_args", text.encode()[0], text.encode()[1:])


def tokenizers():
    t = os.path.join(ROOT, "tests/data/tokenizers")
    for d in ["tiny_bytebpe512_gpt2", "tiny_bytebpe512_qwen2"]:
        add("fuzz_tokenizer", 0, read(os.path.join(t, d, "tokenizer.json")))
    add("fuzz_tokenizer", 0,
        read(os.path.join(ROOT, "models/stories260K/tokenizer.json")))
    add("fuzz_tokenizer", 1, read(os.path.join(t, "tiny_spm512/tokenizer.model")))
    for f in glob.glob(os.path.join(t, "*/tokenizer_config.json")) + \
            shared("models/tokenizers/*/tokenizer_config.json"):
        add("fuzz_tokenizer", 2, read(f))
    texts = ["Hello world", "  leading spaces\tand tabs\n\nnew lines",
             "ünïcödé 你好 🙂 \u0301\u200d", "<s>special</s><|endoftext|>",
             "The little dog ran to the park. It's 3.14!", "\xff\xfe bad"]
    for i, s in enumerate(texts):
        add("fuzz_tokenizer", 3, bytes([i]) + s.encode("utf-8", "surrogatepass"))
    add("fuzz_tokenizer", 3, bytes([1]) + b"bad \xff\xc3 utf8 \xe4\xbd")
    for k in range(4):
        add("fuzz_tokenizer", 4, bytes([k]) + struct.pack("<8i", 1, 2, 3, 0,
                                                          100, 511, 512, -1))


def chat_templates():
    d = os.path.join(ROOT, "tests/data/chat_templates")
    for f in sorted(glob.glob(os.path.join(d, "*.jinja"))):
        add("fuzz_chat_template", 0, read(f))
    conv = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Yo",
                          "thinking": "hm"},
                         {"role": "user", "content": [{"type": "text",
                                                       "text": "x"}]}],
            "add_generation_prompt": True}
    for k in range(6):
        add("fuzz_chat_template", 1, bytes([k]) + json.dumps(conv).encode())


def prompts():
    lines = read(os.path.join(ROOT, "models/prompts/stories.jsonl")).splitlines(True)
    add("fuzz_prompts", 0, b"".join(lines[:20]))
    add("fuzz_prompts", 2, b"".join(lines[:20]))
    add("fuzz_prompts", 0, b'{"text": "a", "id": "x"}\n{"tokens": [1, 2, 3]}\n'
        b'{"text": 5}\n\n{"tokens": [999999]}\n{"id": [1], "text": "b"}\n')
    wiki = sorted(glob.glob(os.path.join(ROOT, "tests/data/wikitext2/*")))
    for f in wiki[:1]:
        add("fuzz_prompts", 1, read(f)[:4000])
    add("fuzz_prompts", 1, b"Once upon a time\n\nThe dog\r\nran \xff away\n")
    add("fuzz_prompts", 3, b"[1, 2, 3, 4]\n")


def npy(build):
    tmp = tempfile.mkdtemp()
    arrays = [np.zeros((0, 4), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3),
              np.arange(4, dtype=np.int64), np.ones((2, 2), np.float16),
              np.array([[1, 2]], np.uint16), np.arange(3, dtype=np.int32),
              np.zeros((2, 2, 2), np.int8), np.array([True, False])]
    for i, a in enumerate(arrays):
        p = os.path.join(tmp, "a.npy")
        np.save(p, a)
        add("fuzz_npy", 2 * i, read(p))
        add("fuzz_npy", 2 * i + 1, read(p))
    p = os.path.join(tmp, "b.npy")
    np.lib.format.write_array(open(p, "wb"), np.ones((2, 2), np.float32),
                              version=(2, 0))
    add("fuzz_npy", 0, read(p))
    # Arrays NpyWriter wrote (a header with room for a growing row count).
    for f in sorted(glob.glob(os.path.join(build, "fuzz-seed-job", "*.npy"))):
        add("fuzz_npy", 0, read(f))
        add("fuzz_npy", 3, read(f))


def resume(build):
    job = os.path.join(build, "fuzz-seed-job")
    exe = os.path.join(build, "fuzz", "fuzz_resume")
    empty = os.path.join(tempfile.mkdtemp(), "empty")
    open(empty, "wb").close()
    subprocess.run([exe, empty], check=True,
                   env=dict(os.environ, LOOM_FUZZ_DUMP_TEMPLATE=job))
    for mode, name in enumerate(["manifest.json", "rows.jsonl",
                                 "blocks.0.hook_resid_post.last.npy",
                                 "all.offsets.npy"]):
        add("fuzz_resume", mode, read(os.path.join(job, name)))


def serve():
    bodies = [
        (0, {"prompt": "Once", "max_tokens": 3, "temperature": 0}),
        (0, {"prompt": [1, 2, 3], "max_tokens": 2, "return_hidden_states": True,
             "hidden_state_layers": [0, -1], "hidden_state_format": "base64"}),
        (1, {"prompt": "The cat", "max_tokens": 0, "return_full_sequence": True,
             "hooks": ["blocks.0.hook_resid_post"], "select": ["last", "all"]}),
        (2, {"prompt": "Once", "max_tokens": 4, "top_p": 0.9, "top_k": 5,
             "temperature": 0.7, "seed": 3}),
        (3, {"prompts": ["a", "b c"], "max_tokens": 2}),
        (4, {"text": "The cat sat", "pooling": "mean", "normalize": True}),
        (5, {"texts": ["The cat sat", "A dog"], "pooling": "last_token",
             "layers": "all"}),
        (6, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
             "temperature": 0}),
        (9, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
             "stream": True, "stream_format": "theloom"}),
        (7, {"embedding": [1.0, 2.0, 3.0, 4.0, 0.0]}),
        (8, {"model": "stories260K"}),
        (13, {"model": "stories260K", "clean_input": [1, 403, 407, 261],
              "corrupted_input": [1, 403, 407, 300], "layers": [0, -1],
              "components": ["resid_pre", "attn", "mlp_post"]}),
        (13, {"clean_input": "Once upon a time", "corrupted_input": "Once upon a dog",
              "positions": "last", "answer_token_ids": {"A": 10, "B": 20}}),
        (14, {"experiment_name": "x", "layers": [1, 2],
              "components": ["resid_post"], "positions": [0, -1]}),
        (15, {"model": "", "prompt": ["Once", [1, 403, 407]], "max_tokens": 3,
              "temperature": 0, "stop": ["\n"], "seed": 2}),
        (15, {"prompt": "Once", "max_tokens": 2, "stream": True}),
        (16, {"input": ["The cat sat", [1, 403]], "encoding_format": "base64",
              "pooling": "mean", "layer": 2}),
    ]
    for mode, body in bodies:
        add("fuzz_serve", mode, json.dumps(body).encode())
    neuronpedia = [
        (0, {"prompt": "Once upon a time", "source": "2-res-fuzz", "topK": 3,
             "ignoreBos": True}),
        (1, {"prompt": "Once upon", "sourceSet": "res-fuzz",
             "selectedSources": [], "sortByTokenIndexes": [1],
             "ignoreBos": True, "numResults": 5}),
        (2, {"prompt": "Once", "source": "1-res-fuzz", "index": "3"}),
        (2, {"prompt": "Once", "vector": [0.5] * 64,
             "hook": "blocks.1.hook_resid_post"}),
        (3, {"text": "Once upon", "prependBos": False}),
        (4, {"prompt": "Once", "types": ["STEERED", "DEFAULT"],
             "features": [{"source": "2-res-fuzz", "index": 3, "strength": 4}],
             "nCompletionTokens": 3, "temperature": 0, "seed": 1}),
        (5, {"prompt": [{"role": "user", "content": "Hi"}], "types": ["DEFAULT"],
             "vectors": [{"steeringVector": [0.1] * 64, "strength": 2,
                          "hook": "blocks.2.hook_resid_post"}],
             "nCompletionTokens": 2}),
        (6, {"type": ["LOGIT_LENS"], "prompt": "Once upon a", "topN": 3,
             "layers": [1], "stream": False}),
        (6, {"type": ["LOGIT_LENS"], "inputTokenIds": [1, 403, 407],
             "numCompletionTokens": 2, "cachedTokenIds": [1, 403],
             "filterNonWordTokens": False}),
    ]
    for route, body in neuronpedia:
        add("fuzz_serve", 27, bytes([route]) + json.dumps(body).encode())
    add("fuzz_serve", 0, b'{"prompt": "a", "max_tokens": "ten"}')
    add("fuzz_serve", 6, b'{"messages": [{"role": 5}]}')
    cfg = ("server:\n  http_port: 9001\n  auth_token: \"t\"\n  max_body_bytes: 16MiB\n"
           "  cors_origins: [\"http://localhost:3000\"]\ngpu:\n  devices: [0, 2]\n"
           "  default_device: 2\nmodels:\n  dirs: [/srv/models]\n  max_loaded: 2\n"
           "hidden_states:\n  default_layers: [0, -1]\n  precision: bfloat16\n"
           "batching:\n  slots: 4\n  context: 1024\n  kv_tokens: 4096\n"
           "  page_size: 32\nlogging:\n  level: WARNING\n")
    add("fuzz_serve", 10, cfg.encode())
    add("fuzz_serve", 11, b"LOOM_SERVER__HTTP_PORT=9000\nLOOM_GPU__DEVICES=[0,1]\n"
        b"LOOM_MAX_MODELS=2\nLOOM_BATCHING__SLOTS=3\nLOOM_OTHER=1")
    serve_theloom()


def serve_theloom():
    """Seeds of fuzz_serve's modes 17..26 (TheLoom's analysis, experiments,
    loaders and device routes, binary replies, return_attention)."""
    rng = random.Random(7)

    def rows(n, d, scale=1.0):
        return [[round(rng.gauss(0, scale), 4) for _ in range(d)]
                for _ in range(n)]

    geometry = [
        {"vectors": [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0],
                     [0.5, -0.5, 2]], "seed": 3},
        {"vectors": rows(40, 8)},
        {"vectors": rows(12, 3) + [[50.0, 50.0, 50.0]] * 4, "seed": 0},
        {"vectors": [[1, 1], [1, 1], [1, 1], [1, 1]]},
        {"vectors": [[0, 0, 0]] * 5},
        {"vectors": [[0.0] * 1000] * 2 + [[1.0] * 1000]},
        {"vectors": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "seed": 4294967295},
        {"vectors": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "seed": -1},
        {"vectors": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "seed": 1.5},
        {"vectors": [[1, 2, 3], [4, 5, 6]]},
        {"vectors": [[1, 2, 3], [1, 2], [4, 5, 6]]},
        {"vectors": []},
        {"vectors": [[], [], []]},
        {"vectors": [["1", 2, 3], [4, 5, 6], [7, 8, 9]]},
        {"vectors": [[[1]], [[2]], [[3]]]},
        {"vectors": "abc"},
        {"vectors": [[1e39, 0], [0, 1], [1, 1]]},
        {"vectors": [[1e-50, 3.4028234e38], [-3.4028234e38, 1], [1, 1]]},
    ]
    for body in geometry:
        add("fuzz_serve", 17, json.dumps(body).encode())
    for raw in [b'{"vectors": [[1, 2, 3], [1e, 2, 3], [4, 5, 6]]}',
                b'{"vectors": [[01, -0, 1.], [.5, +1, 2], [3, 4, 5]]}',
                b'{"vectors": [[NaN, Infinity, -Infinity], [1, 2, 3], [4, 5, 6]]}',
                b'{"vectors": [[1, 2], [3, 4], [5, 6]], "vectors": [[1]]}',
                b'{"vec\\u0074ors": [[1, 2], [3, 4], [5, 6]]}',
                b'{"vectors": [[1,2],[3,4],[5,6]',
                b'{"vectors": [[1 2], [3, 4], [5, 6]]}',
                b'{"vectors": [[1e400, -1e400], [1, 2], [3, 4]]}',
                b'{"vectors": [[-0.0, 0e0], [0E-0, 1], [2, 3]], "seed": null}']:
        add("fuzz_serve", 17, raw)
    bilateral = [
        {"sender_vectors": rows(6, 4), "receiver_vectors": rows(5, 4),
         "seed": 1},
        {"sender_vectors": rows(30, 6), "receiver_vectors": rows(30, 6, 3.0)},
        {"sender_vectors": rows(4, 3), "receiver_vectors": rows(4, 5)},
        {"sender_vectors": rows(4, 3), "receiver_vectors": []},
        {"sender_vectors": rows(4, 3)},
        {"sender_vectors": [[1, 2]] * 4, "receiver_vectors": [[1, 2]] * 4},
        {"sender_vectors": [[1, 2, 3], [4, 5], [6, 7, 8]],
         "receiver_vectors": [[1, 2, 3]] * 3},
    ]
    for body in bilateral:
        add("fuzz_serve", 18, json.dumps(body).encode())
    add("fuzz_serve", 18, b'{"sender_vectors": [[1, 2], [3, 4], [5, 6]], '
        b'"receiver_vectors": [[1, 2], [3, -Infinity], [5, 6]]}')
    # /analyze (mode 7): TheLoom's text form and the vector form.
    for body in [{"text": "The cat sat", "model": "stories260K", "layer": -1,
                  "pooling": "mean"},
                 {"text": "", "layer": 0, "normalize": True},
                 {"text": 5},
                 {"vector": [1, 2, 1e39, -3]},
                 {"data": []},
                 {"embedding": [1e308, -1e308, 5e-324, 0]}]:
        add("fuzz_serve", 7, json.dumps(body).encode())
    # /experiments (mode 19): a GET path after /experiments.
    for path in ["", "?limit=5&offset=0&model=stories260K&status=completed",
                 "?limit=0", "?limit=1001&offset=-1", "?limit=abc",
                 "?limit=99999999999999999999",
                 "?date_from=2026-11-26&date_to=2026-11-26T23:59:59Z",
                 "?date_from=2026-13-45T25:61", "?date_to=2026-11-26T11:42:42.123+02:00",
                 "/{id}", "/{id2}", "/{id}/conversations?role=user",
                 "/{id}/hidden_states?layer=-1",
                 "/{id}/hidden_states?layer=2147483649",
                 "/{id}/metrics?metric_name=loss", "/{id2}/metrics",
                 "/nope", "/..%2F..%2Fetc", "/%00/metrics",
                 "/{id}'; DROP TABLE experiments;--",
                 "/{id}/conversations?role=%27%20OR%201=1--&role=x",
                 "/\u20ac/hidden_states", "/{id}/unknown", "/%zz"]:
        add("fuzz_serve", 19, path.encode())
    exports = [
        (20, {"experiment_id": "{id}", "format": "json",
              "include_hidden_states": True}),
        (20, {"experiment_id": "{id}", "format": "csv",
              "output_path": "sub/dir"}),
        (20, {"experiment_id": "{id2}", "format": "parquet"}),
        (20, {"experiment_id": "{id}", "output_path": "../../escape"}),
        (20, {"experiment_id": "{id}", "output_path": "/etc"}),
        (20, {"experiment_id": "nope"}),
        (20, {"experiment_id": 5}),
        (20, {"experiment_id": "{id}", "format": "xml"}),
        (21, {"experiment_ids": ["{id}", "{id2}"], "format": "csv",
              "output_dir": "batch"}),
        (21, {"experiment_ids": []}),
        (21, {"experiment_ids": ["{id}", "nope"]}),
        (21, {"experiment_ids": "{id}"}),
        (21, {"experiment_ids": ["{id}"], "output_dir": "../.."}),
        (22, {"format": "csv", "limit": 10, "output_path": "s/summary.csv"}),
        (22, {"format": "json"}),
        (22, {"limit": 0}),
        (22, {"limit": 1e9}),
        (22, {"output_path": ""}),
        (22, {"output_path": "."}),
        (22, {"output_path": "a/../../b.csv"}),
        (22, {"output_path": "x\u0000y.csv"}),
    ]
    for mode, body in exports:
        add("fuzz_serve", mode, json.dumps(body).encode())
    # /loaders/probe/{id} (mode 23; empty: GET /loaders).
    for probe in ["", "stories260K", "prompts", "..", "..--..--etc", "nope",
                  "stories260K/../stories260K", "%2e%2e%2f", "/abs", "a--b",
                  "a" * 300]:
        add("fuzz_serve", 23, probe.encode())
    for body in [{"allowed_devices": [0], "default_device": 0},
                 {"allowed_devices": []}, {"default_device": "cpu"},
                 {"default_device": -1}, {"allowed_devices": [1e20]},
                 {"allowed_devices": "all"}, {},
                 {"allowed_devices": [0, 0], "default_device": "cuda:0"},
                 {"allowed_devices": None, "default_device": None}]:
        add("fuzz_serve", 24, json.dumps(body).encode())
    # Binary replies (mode 25): route byte, Accept line, body.
    gen = {"prompt": "Once", "max_tokens": 2, "temperature": 0,
           "hidden_state_layers": [-1]}
    gen2 = dict(gen, hidden_state_layers=[0, -1], return_full_sequence=True)
    accepts = [
        (0, "application/x-npy", gen),
        (0, "application/safetensors", gen2),
        (1, "application/x-npy", gen2),
        (2, "application/x-npy;q=0.9, application/json;q=0.1",
         {"text": "The cat"}),
        (3, "application/safetensors;q=1.0",
         {"texts": ["a", "b"], "hidden_state_dtype": "bfloat16"}),
        (4, "application/*;q=0.5, application/x-npy;q=0.7",
         {"input": ["The cat", "A dog"], "hidden_state_dtype": "float16"}),
        (1, "text/html", gen),
        (2, "application/x-npy;q=0", {"text": "a"}),
        (2, ";;;,,q=abc, */*;q=-1", {"text": "a"}),
        (3, "application/x-npy;q=1e400, application/safetensors;q=0.001",
         {"texts": ["a"]}),
        (0, "APPLICATION/X-NPY ; Q=0.5 ; charset=utf-8", gen),
        (4, "application/safetensors", {"input": "a",
                                        "encoding_format": "base64"}),
        (0, "application/safetensors",
         dict(gen, return_attention=True, hooks=["blocks.0.hook_resid_post"],
              select=["last", "all"])),
    ]
    for route, accept, body in accepts:
        add("fuzz_serve", 25, bytes([route]) + accept.encode() + b"\n" +
            json.dumps(body).encode())
    # return_attention's layers (mode 26).
    for layers in ["[-1]", "[0, -1, 0]", '"all"', "[]", "null", "[99]",
                   "[-99]", "-9223372036854775808", "[9223372036854775807]",
                   "[1.5]", '["0"]', "18446744073709551615", "3"]:
        add("fuzz_serve", 26, layers.encode())


def st_bytes(tensors):
    """A safetensors file of `tensors` (name -> float32 numpy array)."""
    header, data = {}, b""
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def saes():
    """fuzz_sae: small SAELens (mode bit 0) and sparsify directories of every
    architecture, with and without a given hook (bit 1)."""
    rng = np.random.default_rng(7)
    d, n, o = 4, 8, 3

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    meta = {"sae_lens_version": "6.18.0", "hook_name": "blocks.2.hook_resid_post"}
    base = {"W_enc": w(d, n), "W_dec": w(n, d), "b_enc": w(n), "b_dec": w(d)}
    cases = [
        ({"architecture": "standard", "d_in": d, "d_sae": n,
          "apply_b_dec_to_input": True, "metadata": meta}, base),
        ({"architecture": "jumprelu", "d_in": d, "d_sae": n,
          "normalize_activations": "layer_norm", "metadata": meta},
         dict(base, threshold=w(n))),
        ({"architecture": "topk", "d_in": d, "d_sae": n, "k": 2,
          "rescale_acts_by_decoder_norm": True, "metadata": meta}, base),
        ({"architecture": "gated", "d_in": d, "d_sae": n,
          "normalize_activations": "constant_norm_rescale", "metadata": meta},
         {"W_enc": w(d, n), "W_dec": w(n, d), "b_dec": w(d), "b_gate": w(n),
          "b_mag": w(n), "r_mag": w(n)}),
        ({"architecture": "skip_transcoder", "d_in": d, "d_sae": n, "d_out": o,
          "apply_b_dec_to_input": False,
          "metadata": dict(meta, hook_name_out="blocks.2.hook_mlp_out")},
         {"W_enc": w(d, n), "W_dec": w(n, o), "b_enc": w(n), "b_dec": w(o),
          "W_skip": w(o, d)}),
        ({"d_in": d, "d_sae": n, "activation_fn_str": "topk",
          "activation_fn_kwargs": {"k": 3}, "normalize_activations": False,
          "hook_point": "blocks.2.hook_resid_post"}, base),
    ]
    for cfg, tensors in cases:
        payload = json.dumps(cfg).encode() + b"\n--\n" + st_bytes(tensors)
        add("fuzz_sae", 1, payload)
        add("fuzz_sae", 3, payload)
    sparsify = {"activation": "topk", "num_latents": n, "k": 2, "d_in": d,
                "expansion_factor": 2}
    payload = json.dumps(sparsify).encode() + b"\n--\n" + st_bytes(
        {"encoder.weight": w(n, d), "encoder.bias": w(n), "W_dec": w(n, d),
         "b_dec": w(d)})
    add("fuzz_sae", 0, payload)
    add("fuzz_sae", 2, payload)
    # Gemma Scope 2: a JumpReLU SAE and an affine (skip) transcoder.
    gs2 = {"architecture": "jump_relu", "hf_hook_point_in": "model.layers.2.output",
           "hf_hook_point_out": "model.layers.2.output"}
    payload = json.dumps(gs2).encode() + b"\n--\n" + st_bytes(
        {"w_enc": w(d, n), "w_dec": w(n, d), "b_enc": w(n), "b_dec": w(d),
         "threshold": w(n)})
    add("fuzz_sae", 4, payload)
    tc = {"architecture": "jump_relu",
          "hf_hook_point_in": "model.layers.2.pre_feedforward_layernorm.output",
          "hf_hook_point_out": "model.layers.2.post_feedforward_layernorm.output",
          "affine_connection": True}
    payload = json.dumps(tc).encode() + b"\n--\n" + st_bytes(
        {"w_enc": w(d, n), "w_dec": w(n, o), "b_enc": w(n), "b_dec": w(o),
         "threshold": w(n), "affine_skip_connection": w(o, d)})
    add("fuzz_sae", 4, payload)
    add("fuzz_sae", 6, payload)
    # Llama Scope: hyperparams.json + checkpoints/final.safetensors (bit 4),
    # dataset-wise norms, an SAE and a transcoder.
    for hook_out in ("blocks.2.hook_resid_post", "blocks.2.hook_mlp_out"):
        ls = {"d_model": d, "d_sae": n, "act_fn": "jumprelu",
              "jump_relu_threshold": 0.25, "norm_activation": "dataset-wise",
              "dataset_average_activation_norm": {"in": 1.5, "out": 3.0},
              "sparsity_include_decoder_norm": True, "use_decoder_bias": True,
              "apply_decoder_bias_to_pre_encoder": False,
              "hook_point_in": "blocks.2.ln2.hook_normalized"
              if hook_out.endswith("mlp_out") else hook_out,
              "hook_point_out": hook_out}
        payload = json.dumps(ls).encode() + b"\n--\n" + st_bytes(
            {"encoder.weight": w(n, d), "encoder.bias": w(n),
             "decoder.weight": w(d, n), "decoder.bias": w(d)})
        add("fuzz_sae", 16, payload)
        add("fuzz_sae", 18, payload)
    # Gemma Scope: params.npz (stored and deflated), the hook given.
    import io
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, W_enc=w(d, n), W_dec=w(n, d), b_enc=w(n), b_dec=w(d),
             threshold=w(n))
        add("fuzz_sae", 10, b"\n--\n" + buf.getvalue())


# A state dict of one [2, 2] f32 tensor, as torch.save's data.pkl spells it
# (protocol 2), built by hand: the unpickler's happy path.
MINIMAL_STATE_DICT = (
    b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(X\x01\x00\x00\x00w"
    b"ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storage"
    b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"
    b"K\x00K\x02K\x02\x86K\x02K\x01\x86\x89h\x00)RtRu.")


def torch_pickles():
    """data.pkl of the tuned lens's params.pt (shared), the hand-built state
    dict, and plain pickles of protocols 2-5 (frames, memoize, stack
    globals), which the unpickler must refuse or read without a crash."""
    import collections
    import pickle
    import zipfile
    for path in shared("golden", "lens", "*", "params.pt"):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith("/data.pkl"):
                    add("fuzz_torch_pickle", 0, z.read(name))
    add("fuzz_torch_pickle", 7, MINIMAL_STATE_DICT)
    for proto in (2, 3, 4, 5):
        add("fuzz_torch_pickle", proto, pickle.dumps(collections.OrderedDict(), protocol=proto))
        add("fuzz_torch_pickle", proto, pickle.dumps({"a": (1, 2.5, "x", None, True)},
                                                     protocol=proto))
    add("fuzz_torch_pickle", 1, b"cos\nsystem\n(X\x02\x00\x00\x00lstR.")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    safetensors()
    configs()
    plan_args()
    tokenizers()
    chat_templates()
    prompts()
    resume(build)
    npy(build)
    serve()
    saes()
    torch_pickles()
    for d in sorted(os.listdir(CORPUS)):
        print(d, len(os.listdir(os.path.join(CORPUS, d))))


if __name__ == "__main__":
    main()
