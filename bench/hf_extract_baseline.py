#!/usr/bin/env python3
"""Hugging Face transformers baseline for bench/gpu_bench.cc.

Modes (each prints one JSON line on stdout; --prefill, --extract and
--truncate can be combined and share one model load):
  --write-prompts PATH  write the benchmark's 1000 prompts (token ids,
                        100-500 tokens, fixed seed) as JSONL; the same
                        generator as gpu_bench.cc's, so both read the same
                        prompts whether or not LOOM_GPU_BENCH_INPUT is set.
  --extract             the extraction job: forward hooks on
                        model.model.layers[L/2-1, L/2, L/2+1] capture the
                        hidden state of the last real token of every prompt
                        (copied to the host in bf16); prompts/s and tokens/s.
  --truncate            the extraction job with model.model.layers cut after
                        the deepest hooked layer (what Loom's executor does
                        by itself); runs after the others.
  --prefill             one forward of 2048 tokens (1 x 2048 and 4 x 512):
                        tokens/s and MFU, for comparison with BM_GpuPrefill.

The model is loaded with AutoModelForCausalLM.from_pretrained(dir,
torch_dtype=torch.bfloat16, attn_implementation="sdpa") on cuda. The forward
runs through model.model (the decoder stack and final norm, no lm_head), as
an extraction job would.
"""

import argparse
import json
import os
import sys
import time

NUM_PROMPTS = 1000
MIN_PROMPT_TOKENS = 100
MAX_PROMPT_TOKENS = 500
PROMPT_SEED = 20240611
MASK64 = (1 << 64) - 1
DEFAULT_PEAK_FLOPS = 989e12  # H100 SXM, dense bf16


class Lcg:
    """64-bit LCG (Knuth's MMIX constants), high bits out: gpu_bench.cc's."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state * 6364136223846793005 +
                      1442695040888963407) & MASK64
        return self.state >> 33


def generate_prompts(vocab_size):
    rng = Lcg(PROMPT_SEED)
    prompts = []
    span = MAX_PROMPT_TOKENS - MIN_PROMPT_TOKENS + 1
    for i in range(NUM_PROMPTS):
        n = MIN_PROMPT_TOKENS + rng.next() % span
        prompts.append({"id": i,
                        "tokens": [rng.next() % vocab_size for _ in range(n)]})
    return prompts


def write_prompts(path, prompts):
    with open(path, "w") as f:
        for p in prompts:
            f.write('{"id": %d, "tokens": [%s]}\n' %
                    (p["id"], ",".join(str(t) for t in p["tokens"])))


def read_prompts(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def forward_flops(cfg, layers, lengths):
    """Projections (2 FLOPs per multiply-add) plus causal attention."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    q_dim = heads * head_dim
    kv_dim = cfg["num_key_value_heads"] * head_dim
    proj = h * q_dim + 2 * h * kv_dim + q_dim * h + \
        3 * h * cfg["intermediate_size"]
    total = 0.0
    for n in lengths:
        attn = 4.0 * q_dim * n * (n + 1) / 2
        total += layers * (2.0 * proj * n + attn)
    return total


def peak_flops():
    env = os.environ.get("LOOM_GPU_PEAK_FLOPS", "")
    try:
        v = float(env)
        if v > 0:
            return v
    except ValueError:
        pass
    return DEFAULT_PEAK_FLOPS


def load_model(model_dir):
    import torch
    from transformers import AutoModelForCausalLM
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to("cuda").eval()
    torch.cuda.synchronize()
    return model, time.time() - t0


def environment():
    import torch
    import transformers
    return {"torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0)}


def pack_batches(prompts, batch_tokens):
    """Prompts sorted by length, packed so rows x longest <= batch_tokens."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]["tokens"]))
    batches, current = [], []
    for i in order:
        n = len(prompts[i]["tokens"])
        if current and (len(current) + 1) * n > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def run_extract(args, model, load_s, truncate):
    import torch
    cfg = read_config(args.model)
    num_layers = cfg["num_hidden_layers"]
    prompts = read_prompts(args.input) if args.input else \
        generate_prompts(cfg["vocab_size"])
    mid = num_layers // 2
    layers = [l for l in (mid - 1, mid, mid + 1) if 0 <= l < num_layers]
    decoder = model.model
    layers_run = num_layers
    if truncate:
        layers_run = layers[-1] + 1
        decoder.layers = decoder.layers[:layers_run]
        decoder.config.num_hidden_layers = layers_run

    captured = {}
    last_index = {}

    def make_hook(layer):
        def hook(module, inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            captured[layer] = hidden[rows, last_index["idx"]].to(
                torch.bfloat16)
        return hook

    handles = [decoder.layers[l].register_forward_hook(make_hook(l))
               for l in layers]
    batches = pack_batches(prompts, args.batch_tokens)
    results = {l: [None] * len(prompts) for l in layers}

    def run_batch(members):
        lengths = [len(prompts[i]["tokens"]) for i in members]
        width = max(lengths)
        ids = torch.zeros((len(members), width), dtype=torch.long)
        mask = torch.zeros((len(members), width), dtype=torch.long)
        for r, i in enumerate(members):
            n = lengths[r]
            ids[r, :n] = torch.tensor(prompts[i]["tokens"], dtype=torch.long)
            mask[r, :n] = 1
        ids = ids.to("cuda", non_blocking=True)
        mask = mask.to("cuda", non_blocking=True)
        # Right padding: the last real token of row r is at lengths[r] - 1.
        last_index["idx"] = mask.sum(dim=1) - 1
        captured.clear()
        decoder(input_ids=ids, attention_mask=mask, use_cache=False)
        for l in layers:
            host = captured[l].cpu()
            for r, i in enumerate(members):
                results[l][i] = host[r]

    with torch.inference_mode():
        run_batch(batches[-1])  # warm-up: the longest prompts
        torch.cuda.synchronize()
        t0 = time.time()
        for b in batches:
            run_batch(b)
        torch.cuda.synchronize()
        seconds = time.time() - t0
    for h in handles:
        h.remove()
    lengths = [len(p["tokens"]) for p in prompts]
    tokens = sum(lengths)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    out = {"mode": "extract_truncated" if truncate else "extract",
           "prompts": len(prompts), "tokens": tokens,
           "padded_tokens": padded, "batches": len(batches),
           "hook_layers": layers, "layers_run": layers_run,
           "seconds": seconds, "load_seconds": load_s,
           "prompts_per_s": len(prompts) / seconds,
           "tokens_per_s": tokens / seconds,
           "mfu": forward_flops(cfg, layers_run, lengths) / seconds /
           peak_flops()}
    out.update(environment())
    return out


def run_prefill(args, model, load_s):
    import torch
    cfg = read_config(args.model)
    num_layers = cfg["num_hidden_layers"]
    decoder = model.model
    out = {"mode": "prefill", "load_seconds": load_s, "cases": []}
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    with torch.inference_mode():
        for seqs, seq_len in ((1, 2048), (4, 512)):
            ids = torch.randint(0, cfg["vocab_size"], (seqs, seq_len),
                                generator=gen).to("cuda")
            for _ in range(2):
                decoder(input_ids=ids, use_cache=False)
            torch.cuda.synchronize()
            t0 = time.time()
            for _ in range(args.iters):
                decoder(input_ids=ids, use_cache=False)
            torch.cuda.synchronize()
            seconds = (time.time() - t0) / args.iters
            flops = forward_flops(cfg, num_layers, [seq_len] * seqs)
            out["cases"].append({"seqs": seqs, "len": seq_len,
                                 "ms": seconds * 1e3,
                                 "tokens_per_s": seqs * seq_len / seconds,
                                 "mfu": flops / seconds / peak_flops()})
    out["layers"] = num_layers
    out.update(environment())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="synthetic checkpoint directory")
    p.add_argument("--input", help="JSONL prompts (default: generated)")
    p.add_argument("--write-prompts", metavar="PATH",
                   help="write the prompts as JSONL and exit")
    p.add_argument("--vocab", type=int, default=0,
                   help="vocabulary for --write-prompts (default: --model's)")
    p.add_argument("--extract", action="store_true")
    p.add_argument("--prefill", action="store_true")
    p.add_argument("--truncate", action="store_true",
                   help="the extraction job again with the layers after the "
                   "deepest hook dropped (runs last)")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="--extract: padded tokens per batch")
    p.add_argument("--iters", type=int, default=10,
                   help="--prefill: timed forwards per shape")
    args = p.parse_args()
    if args.write_prompts:
        vocab = args.vocab or read_config(args.model)["vocab_size"]
        prompts = generate_prompts(vocab)
        write_prompts(args.write_prompts, prompts)
        print(json.dumps({"mode": "write_prompts", "path": args.write_prompts,
                          "prompts": len(prompts),
                          "tokens": sum(len(x["tokens"]) for x in prompts)}))
        return 0
    if not args.model or not (args.extract or args.prefill or args.truncate):
        p.error("give --model and --prefill, --extract and/or --truncate")
    model, load_s = load_model(args.model)
    # One JSON line per mode; the truncated extraction last (it drops layers).
    if args.prefill:
        print(json.dumps(run_prefill(args, model, load_s)), flush=True)
    if args.extract:
        print(json.dumps(run_extract(args, model, load_s, False)), flush=True)
    if args.truncate:
        print(json.dumps(run_extract(args, model, load_s, True)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
