#!/usr/bin/env python3
"""SAEs and lenses inside an extraction, beside the bare extraction, timed in
one process (the model loaded once; runs alternate, the median of each kept):

  PYTHONPATH=build/python bench/derived_bench.py MODEL_DIR [TOKENS] [REPEATS]

on TOKENS seeded-random token ids (default 512), every row selected (`all`):
  1. bare: blocks.{L/2}.hook_resid_post
     + SAE: the same with a seeded random 16,384-wide TopK SAE (k 32, f32
       weights, SAELens 6 layout, written to a temporary folder) at that
       hook and sae_topk=32 (the top-32 indices and values per token; no
       dense feature array): given as its path (loaded by each call), then
       as a loom.Sae loaded once
  2. bare: every residual hook (blocks.0.hook_resid_pre and each
     hook_resid_post)
     + lens: the same with lens="logit", lens_topk=10 at each of them
Prints the CPU model, each median and the ratios (with / bare); for the
SAE also the time its loader takes alone and the ratio without it.
"""

import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

import loom


def write_sae(folder, d_in, d_sae, k, hook, seed=1):
    rng = np.random.default_rng(seed)
    tensors = {
        "W_enc": (rng.standard_normal((d_in, d_sae), dtype=np.float32) / np.sqrt(d_in)),
        "W_dec": (rng.standard_normal((d_sae, d_in), dtype=np.float32) / np.sqrt(d_sae)),
        "b_enc": np.zeros(d_sae, np.float32),
        "b_dec": np.zeros(d_in, np.float32),
    }
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        b = np.ascontiguousarray(t).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(folder, "sae_weights.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    cfg = {"architecture": "topk", "d_in": d_in, "d_sae": d_sae, "k": k,
           "dtype": "float32", "apply_b_dec_to_input": False,
           "normalize_activations": "none",
           "metadata": {"sae_lens_version": "6.18.0", "hook_name": hook}}
    with open(os.path.join(folder, "cfg.json"), "w") as f:
        json.dump(cfg, f)


def median_pair(model, ids, repeats, bare, with_):
    """Alternating runs of extract(**bare) and extract(**with_): medians."""
    a, b = [], []
    for _ in range(repeats):
        for args, out in ((bare, a), (with_, b)):
            t = time.perf_counter()
            model.extract([ids], select="all", **args)
            out.append(time.perf_counter() - t)
    return float(np.median(a)), float(np.median(b))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    model_dir = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    layers, hidden, vocab = (cfg["num_hidden_layers"], cfg["hidden_size"],
                             cfg["vocab_size"])
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((l.split(":", 1)[1].strip() for l in cpu.splitlines()
                 if l.startswith("Model name")), "?")
    print("cpu: %s, %d cores" % (name, os.cpu_count()))
    print("model: %s (%d layers, hidden %d, vocab %d), %d tokens, select all"
          % (model_dir, layers, hidden, vocab, tokens))
    random.seed(1)
    ids = [random.randrange(3, vocab) for _ in range(tokens)]
    model = loom.Model(model_dir)
    model.extract([ids], "blocks.0.hook_resid_post", select="all")  # warm
    hook = "blocks.%d.hook_resid_post" % (layers // 2)
    with tempfile.TemporaryDirectory() as sae_dir:
        write_sae(sae_dir, hidden, 16384, 32, hook)
        bare, sae = median_pair(
            model, ids, repeats, {"hooks": hook},
            {"hooks": hook, "saes": sae_dir, "sae_topk": 32})
        # Each extract call given the path loads the SAE (its 256 MB of f32
        # weights) before planning; the same loader alone, for the
        # compute-only ratio.
        loads = []
        for _ in range(repeats):
            t = time.perf_counter()
            loaded = loom.Sae(sae_dir)
            loads.append(time.perf_counter() - t)
        load = float(np.median(loads))
        # A loom.Sae given instead: loaded once, shared by the calls.
        bare2, held = median_pair(
            model, ids, repeats, {"hooks": hook},
            {"hooks": hook, "saes": loaded, "sae_topk": 32})
    print("SAE 16k TopK at %s, top-32:   bare %.3f s, with %.3f s (of which "
          "loading the SAE %.3f s), ratio %.3fx, without the load %.3fx"
          % (hook, bare, sae, load, sae / bare, (sae - load) / bare))
    print("  the same SAE loaded once (saes=loom.Sae): bare %.3f s, with %.3f s, "
          "ratio %.3fx" % (bare2, held, held / bare2))
    resid = ["blocks.0.hook_resid_pre"] + [
        "blocks.%d.hook_resid_post" % i for i in range(layers)]
    bare, lens = median_pair(model, ids, repeats, {"hooks": resid},
                             {"hooks": resid, "lens": "logit", "lens_topk": 10})
    print("logit lens at %d residual hooks, top-10: bare %.3f s, with %.3f s, "
          "ratio %.3fx" % (len(resid), bare, lens, lens / bare))


if __name__ == "__main__":
    main()
