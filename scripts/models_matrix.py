#!/usr/bin/env python3
"""Renders docs/models.md, the correctness matrix, from measured runs.

Inputs (nothing in the table is typed by hand except the checkpoint names
people use, CHECKPOINTS below):
  --matrix DIR   the files tests/golden_parity_test.cc writes with
                 LOOM_MODEL_MATRIX=DIR: per golden case and dtype, the worst
                 |Loom - HF| and the largest |HF| of every hook it compared;
  --loom BIN     `loom inspect --json` of each case's model: the model type,
                 the HF class (config.json's architectures) and the structure;
  --golden DIR   the golden root (tiny/<case>/ holds each case's model);
  --bundled DIR  the repository's models/ (stories260K);
  --cpu TEXT     the CPU the runs were measured on (lscpu's model name).
scripts/models_matrix.sh runs the parity test and this script together.
"""
import argparse
import json
import os
import subprocess
import sys

# The checkpoints each family's users load (Hugging Face ids).
CHECKPOINTS = {
    "bloom": "bigscience/bloom-560m, bloom-1b7, bloom-7b1, bloomz-*",
    "codegen": "Salesforce/codegen-350M-mono, codegen-2B-multi, codegen-6B-nl",
    "cohere": "CohereForAI/c4ai-command-r-v01, c4ai-command-r-plus, aya-23-8B",
    "deepseek_v3": "deepseek-ai/DeepSeek-V3, DeepSeek-R1, Moonlight-16B-A3B",
    "falcon": "tiiuae/falcon-7b (multi-query, one LayerNorm), falcon-40b, "
              "falcon-11B (new decoder layout)",
    "gemma": "google/gemma-2b, gemma-7b, gemma-1.1-2b-it",
    "gemma2": "google/gemma-2-2b, gemma-2-9b, gemma-2-27b (-it)",
    "gemma3_text": "google/gemma-3-1b-pt, gemma-3-1b-it, gemma-3-270m",
    "glm": "THUDM/glm-4-9b-hf, glm-4-9b-chat-hf",
    "gpt2": "openai-community/gpt2, gpt2-medium, gpt2-xl; distilgpt2",
    "gpt_bigcode": "bigcode/santacoder, bigcode/starcoderbase-1b, starcoder",
    "gpt_neo": "EleutherAI/gpt-neo-125m, gpt-neo-1.3B, gpt-neo-2.7B",
    "gpt_neox": "EleutherAI/pythia-70m ... pythia-12b, gpt-neox-20b",
    "gpt_oss": "openai/gpt-oss-20b, gpt-oss-120b (MXFP4 experts)",
    "gptj": "EleutherAI/gpt-j-6b",
    "granite": "ibm-granite/granite-3.0-2b-base, granite-3.1-8b-instruct",
    "granitemoe": "ibm-granite/granite-3.0-1b-a400m-base, granite-3.0-3b-a800m",
    "llama": "meta-llama/Llama-2-7b-hf, Llama-3.1-8B, Llama-3.2-1B; TinyLlama",
    "mistral": "mistralai/Mistral-7B-v0.1, Mistral-7B-Instruct-v0.3",
    "mixtral": "mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B",
    "nemotron": "nvidia/Minitron-4B-Base, Nemotron-4-Minitron-8B",
    "olmo": "allenai/OLMo-1B-hf, OLMo-7B-hf",
    "olmo2": "allenai/OLMo-2-1124-7B, OLMo-2-1124-13B",
    "olmoe": "allenai/OLMoE-1B-7B-0924",
    "opt": "facebook/opt-125m, opt-1.3b, opt-6.7b, opt-13b (not opt-350m)",
    "persimmon": "adept/persimmon-8b-base, persimmon-8b-chat",
    "phi": "microsoft/phi-1, phi-1_5, phi-2",
    "phi3": "microsoft/Phi-3-mini-4k-instruct, Phi-3-medium-4k-instruct",
    "qwen2": "Qwen/Qwen2-0.5B ... Qwen2.5-72B (-Instruct)",
    "qwen2_moe": "Qwen/Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B",
    "qwen3": "Qwen/Qwen3-0.6B ... Qwen3-32B; Qwen3-*-FP8",
    "qwen3_moe": "Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B",
    "stablelm": "stabilityai/stablelm-2-1_6b, stablelm-3b-4e1t, stablelm-2-12b",
    "starcoder2": "bigcode/starcoder2-3b, starcoder2-7b, starcoder2-15b",
}


def inspect(loom, model_dir):
    out = subprocess.run([loom, "inspect", model_dir, "--json"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit("loom inspect %s failed: %s" % (model_dir, out.stderr))
    return json.loads(out.stdout)


def structure(j):
    parts = []
    if j.get("moe"):
        m = j["moe"]
        parts.append("MoE %s experts top %s, router %s" % (
            m.get("num_experts"), m.get("experts_per_token"), m.get("router")))
    if j.get("attention") == "mla":
        parts.append("MLA")
    heads, kv = j["num_attention_heads"], j["num_key_value_heads"]
    parts.append("%s heads x %s, %s" % (heads, j["head_dim"],
                                        "MQA" if kv == 1 else
                                        "%s kv" % kv))
    if j.get("block") and j["block"] != "sequential":
        parts.append("block " + j["block"])
    parts.append(j.get("norms", ""))
    if j.get("fused_qkv"):
        parts.append("fused qkv " + j["fused_qkv"])
    parts.append("positions " + j.get("positions", "").split(", max")[0])
    if any(w > 0 for w in j.get("sliding_window", [])):
        parts.append("sliding window on %d/%d layers" % (
            sum(1 for w in j["sliding_window"] if w > 0), j["num_layers"]))
    parts.append(j.get("activation", ""))
    if j.get("multipliers"):
        parts.append(j["multipliers"])
    if j.get("quantization"):
        parts.append("weights " + j["quantization"])
    return "; ".join(p for p in parts if p)


def cell(text):
    """A markdown table cell: a literal | is escaped."""
    return text.replace("|", "\\|")


def fmt(x):
    return "%.1e" % x if x > 0 else "0"


def worst(hooks, relative):
    best, where = 0.0, ""
    for hook, v in hooks.items():
        e = v["max_abs_err"] / v["max_abs_hf"] if relative and v[
            "max_abs_hf"] > 0 else v["max_abs_err"]
        if e >= best:
            best, where = e, hook
    return best, where


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", required=True)
    ap.add_argument("--loom", required=True)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--bundled", required=True)
    ap.add_argument("--constructed", required=True)
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    runs = {}
    for f in sorted(os.listdir(a.matrix)):
        if f.endswith(".json"):
            with open(os.path.join(a.matrix, f)) as fh:
                r = json.load(fh)
            runs.setdefault(r["model"], {})[r["dtype"]] = r
    if not runs:
        raise SystemExit("no parity results in " + a.matrix)
    cases = []
    for name in sorted(runs):
        d = os.path.join(a.golden, "tiny", name)
        constructed = os.path.join(a.constructed, name)
        if os.path.isdir(constructed):
            d = constructed
        elif not os.path.isdir(d):
            d = os.path.join(a.bundled, name)
        j = inspect(a.loom, d)
        j["constructed"] = d == constructed
        cases.append((name, j, runs[name]))
    types = {}
    for name, j, _ in cases:
        types.setdefault(j["model_type"], (j, []))[1].append(name)
    missing = sorted(set(types) - set(CHECKPOINTS))
    if missing:
        raise SystemExit("CHECKPOINTS lacks " + ", ".join(missing))
    failed = [n for n, _, r in cases if not all(x["passed"] for x in r.values())]
    if failed:
        raise SystemExit("parity failed for " + ", ".join(failed))

    o = []
    o.append("# Supported models: the correctness matrix\n")
    o.append("Generated by `scripts/models_matrix.sh` from the golden parity "
             "runs (`tests/golden_parity_test.cc` against Hugging Face "
             "transformers' own outputs, `../shared/golden`); do not edit by "
             "hand. Measured on: %s.\n" % a.cpu)
    o.append("Every case compares, for every stored sequence, the hooks listed "
             "below; f32 must match within atol/rtol 1e-4 (attention "
             "probabilities 1e-5), bf16 within 5 % of each tensor's largest "
             "value (log-probs 0.25), the bounds HF's own bf16-vs-f32 spread "
             "gives. MoE cases in bf16 are compared on the tokens whose "
             "routing matches HF's, and are not listed in the bf16 column. "
             "Cases marked *constructed* have no HF goldens yet: their "
             "reference is our own float64 NumPy forward written from HF's "
             "modeling file (`tests/data/constructed/make_goldens.py`), also "
             "used for their bf16 column.\n")
    o.append("## Model types (%d)\n" % len(types))
    o.append("| model_type | HF class | structure (`loom inspect`) | golden "
             "cases | checkpoints people use |")
    o.append("|---|---|---|---|---|")
    for t in sorted(types):
        j, names = types[t]
        o.append("| `%s` | %s | %s | %s | %s |" % (
            t, j.get("architecture") or "", cell(structure(j)),
            ", ".join("`%s`" % n for n in names), CHECKPOINTS[t]))
    o.append("")
    o.append("## Measured error against HF (%d golden cases)\n" % len(cases))
    o.append("| case | model_type | hooks verified | f32: worst abs error "
             "(at) | bf16: worst error / max abs (at) |")
    o.append("|---|---|---|---|---|")
    for name, j, r in cases:
        f32 = r.get("f32")
        hooks = sorted(f32["hooks"]) if f32 else []
        e32 = worst(f32["hooks"], False) if f32 else None
        b = r.get("bf16")
        e16 = worst(b["hooks"], True) if b else None
        o.append("| `%s`%s | `%s` | %s | %s | %s |" % (
            name, " (*constructed*)" if j["constructed"] else "",
            j["model_type"], ", ".join("`%s`" % h for h in hooks),
            "%s (`%s`)" % (fmt(e32[0]), e32[1]) if e32 else "not run",
            "%s (`%s`)" % (fmt(e16[0]), e16[1]) if e16 else "—"))
    o.append("")
    with open(a.out, "w") as fh:
        fh.write("\n".join(o))
    print("wrote %s: %d model types, %d cases" % (a.out, len(types), len(cases)))


if __name__ == "__main__":
    sys.exit(main())
