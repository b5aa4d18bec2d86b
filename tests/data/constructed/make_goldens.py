#!/usr/bin/env python3
"""Builds the constructed test models and their reference outputs.

For model types the shared HF goldens do not cover (cohere, glm), this writes
a tiny random checkpoint in the Hugging Face layout (config.json,
model.safetensors) and the outputs of an independent float64 NumPy forward
written from transformers' modeling files (modeling_cohere.py,
modeling_glm.py; the conventions are listed beside each function), in the
shared goldens' layout (goldens_f32.safetensors, manifest.json), so
tests/golden_parity_test.cc compares them hook by hook like HF's own.
There is no goldens_bf16: Loom's bf16 forward is compared with the same
float64 reference within the bf16 bound (5 % of each tensor's largest value).
These are our own references, not HF's: the withheld HF references check
them later. Deterministic: a rerun writes the same bytes.

Usage: python3 make_goldens.py [OUT_DIR]   (default: this file's directory)
"""
import json
import os
import struct
import sys

import numpy as np

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 512, 64, 2, 4, 2, 16, 128
SEQ_LENGTHS = [1, 7, 13, 24]


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = tensors[name]
        dtype = {np.float32: "F32", np.int64: "I64"}[a.dtype.type]
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def rms_norm(x, w, eps):  # GlmRMSNorm: x * rsqrt(mean(x^2) + eps) * w
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm_no_bias(x, w, eps):  # CohereLayerNorm: centred, gain only
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w


def rope_pairs(x, positions, rotary_dim, theta):
    """Adjacent pairs (x[2i], x[2i+1]) of the first rotary_dim dims rotate by
    position * theta^(-2i / rotary_dim): both files' rotate_half takes
    x[0::2], x[1::2] and the frequencies are repeat_interleave'd."""
    # The inverse frequencies in float32, as ROPE_INIT_FUNCTIONS computes them.
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, rotary_dim, 2,
                                                  dtype=np.float32) /
                                        np.float32(rotary_dim)))).astype(
                                            np.float32)
    ang = positions[:, None].astype(np.float64) * inv.astype(np.float64)
    cos, sin = np.cos(ang), np.sin(ang)  # [T, rotary_dim / 2]
    out = x.copy()
    a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]  # [T, heads, r/2]
    out[..., 0:rotary_dim:2] = a * cos[:, None, :] - b * sin[:, None, :]
    out[..., 1:rotary_dim:2] = b * cos[:, None, :] + a * sin[:, None, :]
    return out


def attention(h, w, p, cfg, kind):
    T = h.shape[0]
    lin = lambda x, n: x @ w[p + n + ".weight"].T + (
        w[p + n + ".bias"] if p + n + ".bias" in w else 0.0)
    q = lin(h, "q_proj").reshape(T, HEADS, HEAD_DIM)
    k = lin(h, "k_proj").reshape(T, KV_HEADS, HEAD_DIM)
    v = lin(h, "v_proj").reshape(T, KV_HEADS, HEAD_DIM)
    if kind == "cohere" and cfg["use_qk_norm"]:
        # q_norm [heads, head_dim]: each head its own gain, over head_dim.
        q = layer_norm_no_bias(q, w[p + "q_norm.weight"], cfg["layer_norm_eps"])
        k = layer_norm_no_bias(k, w[p + "k_norm.weight"], cfg["layer_norm_eps"])
    rd = HEAD_DIM if kind == "cohere" else int(HEAD_DIM *
                                               cfg["partial_rotary_factor"])
    pos = np.arange(T)
    q = rope_pairs(q, pos, rd, cfg["rope_theta"])
    k = rope_pairs(k, pos, rd, cfg["rope_theta"])
    g = HEADS // KV_HEADS
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * HEAD_DIM ** -0.5
    s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    probs = s / s.sum(-1, keepdims=True)  # [heads, T, T]
    z = np.einsum("hts,shd->thd", probs, v).reshape(T, HEADS * HEAD_DIM)
    return lin(z, "o_proj"), probs


def rope_half(x, positions, theta):
    """Llama's rotate_half over the whole head: x[i] pairs with x[i + d/2]
    (FalconRotaryEmbedding, cat(freqs, freqs))."""
    d = x.shape[-1]
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32)
                                        / np.float32(d)))).astype(np.float64)
    ang = positions[:, None].astype(np.float64) * inv
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def layer_norm(x, w, b, eps):
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + b


def gelu(x):  # exact (erf) gelu
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def falcon_attention(h, w, p):
    """FalconAttention with multi_query and the old layout: the fused rows
    are [q (all heads) | k (one head) | v (one head)], full half-split
    rotary, scores / sqrt(head_dim), dense without bias."""
    T = h.shape[0]
    qkv = h @ w[p + "query_key_value.weight"].T
    q = qkv[:, :HIDDEN].reshape(T, HEADS, HEAD_DIM)
    k = qkv[:, HIDDEN:HIDDEN + HEAD_DIM].reshape(T, 1, HEAD_DIM)
    v = qkv[:, HIDDEN + HEAD_DIM:].reshape(T, 1, HEAD_DIM)
    pos = np.arange(T)
    q, k = rope_half(q, pos, 10000.0), rope_half(k, pos, 10000.0)
    k, v = np.repeat(k, HEADS, axis=1), np.repeat(v, HEADS, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * HEAD_DIM ** -0.5
    s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    probs = s / s.sum(-1, keepdims=True)
    z = np.einsum("hts,shd->thd", probs, v).reshape(T, HIDDEN)
    return z @ w[p + "dense.weight"].T, probs


def falcon_forward(w, cfg, ids):
    """FalconDecoderLayer, old layout with parallel_attn: one
    input_layernorm feeds attention and MLP, x + attn + mlp."""
    out = {}
    eps = cfg["layer_norm_epsilon"]
    x = w["transformer.word_embeddings.weight"][ids]
    for l in range(LAYERS):
        p = "transformer.h.%d." % l
        out["hidden.%d" % l] = x
        h = layer_norm(x, w[p + "input_layernorm.weight"],
                       w[p + "input_layernorm.bias"], eps)
        a, probs = falcon_attention(h, w, p + "self_attention.")
        m = gelu(h @ w[p + "mlp.dense_h_to_4h.weight"].T) @ w[
            p + "mlp.dense_4h_to_h.weight"].T
        x = x + a + m
        out["attn_out.%d" % l], out["mlp_out.%d" % l] = a, m
        if l == 0:
            out["attn_probs.0"] = probs[None]
    out["layer_out.%d" % (LAYERS - 1)] = x
    f = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"],
                   eps)
    return finish(out, f, f @ w["transformer.word_embeddings.weight"].T, ids)


BLOOM_HIDDEN, BLOOM_HEADS = 96, 6  # 6 heads: not a power of two


def alibi_slopes(n):
    """build_alibi_tensor's slopes: base^1..base^p for the largest power of
    two p <= n, base = 2^-(8/p); then the odd powers of 2^-(4/p)."""
    import math
    p = 2 ** math.floor(math.log2(n))
    base = np.float32(2 ** (-(2 ** -(math.log2(p) - 3))))
    slopes = [np.float32(base ** k) for k in range(1, p + 1)]
    if p != n:
        extra = np.float32(2 ** (-(2 ** -(math.log2(2 * p) - 3))))
        slopes += [np.float32(extra ** k)
                   for k in range(1, 1 + 2 * min(p, n - p), 2)]
    return np.array(slopes, np.float64)


def bloom_gelu(x):  # bloom_gelu_forward
    return x * 0.5 * (1.0 + np.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def bloom_forward(w, cfg, ids):
    """BloomModel: word_embeddings_layernorm after the embedding; per block
    input_layernorm, fused query_key_value viewed [T, heads, 3, head_dim],
    scores q.k / sqrt(head_dim) + slope_h * key position (the alibi baddbmm),
    dense + residual, post_attention_layernorm, the gelu MLP + residual;
    ln_f, head tied to word_embeddings."""
    out = {}
    eps = cfg["layer_norm_epsilon"]
    H, nh = BLOOM_HIDDEN, BLOOM_HEADS
    hd = H // nh
    slopes = alibi_slopes(nh)
    e = "transformer."
    x = layer_norm(w[e + "word_embeddings.weight"][ids],
                   w[e + "word_embeddings_layernorm.weight"],
                   w[e + "word_embeddings_layernorm.bias"], eps)
    T = len(ids)
    for l in range(LAYERS):
        p = e + "h.%d." % l
        out["hidden.%d" % l] = x
        h = layer_norm(x, w[p + "input_layernorm.weight"],
                       w[p + "input_layernorm.bias"], eps)
        qkv = (h @ w[p + "self_attention.query_key_value.weight"].T +
               w[p + "self_attention.query_key_value.bias"]).reshape(
                   T, nh, 3, hd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + \
            slopes[:, None, None] * np.arange(T)[None, None, :]
        s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        probs = s / s.sum(-1, keepdims=True)
        z = np.einsum("hts,shd->thd", probs, v).reshape(T, H)
        a = z @ w[p + "self_attention.dense.weight"].T + \
            w[p + "self_attention.dense.bias"]
        x = x + a
        h = layer_norm(x, w[p + "post_attention_layernorm.weight"],
                       w[p + "post_attention_layernorm.bias"], eps)
        m = bloom_gelu(h @ w[p + "mlp.dense_h_to_4h.weight"].T +
                       w[p + "mlp.dense_h_to_4h.bias"]) @ w[
                           p + "mlp.dense_4h_to_h.weight"].T + \
            w[p + "mlp.dense_4h_to_h.bias"]
        x = x + m
        out["attn_out.%d" % l], out["mlp_out.%d" % l] = a, m
        if l == 0:
            out["attn_probs.0"] = probs[None]
    out["layer_out.%d" % (LAYERS - 1)] = x
    f = layer_norm(x, w[e + "ln_f.weight"], w[e + "ln_f.bias"], eps)
    return finish(out, f, f @ w[e + "word_embeddings.weight"].T, ids)


def bloom_weights(rng):
    H = BLOOM_HIDDEN
    w = {}
    lin = lambda o, i: rng.normal(0, 1 / np.sqrt(i), (o, i))
    e = "transformer."
    w[e + "word_embeddings.weight"] = rng.normal(0, 0.5, (VOCAB, H))
    ln = lambda n: (w.__setitem__(n + ".weight", rng.normal(1, 0.1, H)),
                    w.__setitem__(n + ".bias", rng.normal(0, 0.1, H)))
    ln(e + "word_embeddings_layernorm")
    for l in range(LAYERS):
        p = e + "h.%d." % l
        ln(p + "input_layernorm")
        w[p + "self_attention.query_key_value.weight"] = lin(3 * H, H)
        w[p + "self_attention.query_key_value.bias"] = rng.normal(0, 0.1,
                                                                  3 * H)
        w[p + "self_attention.dense.weight"] = lin(H, H)
        w[p + "self_attention.dense.bias"] = rng.normal(0, 0.1, H)
        ln(p + "post_attention_layernorm")
        w[p + "mlp.dense_h_to_4h.weight"] = lin(4 * H, H)
        w[p + "mlp.dense_h_to_4h.bias"] = rng.normal(0, 0.1, 4 * H)
        w[p + "mlp.dense_4h_to_h.weight"] = lin(H, 4 * H)
        w[p + "mlp.dense_4h_to_h.bias"] = rng.normal(0, 0.1, H)
    ln(e + "ln_f")
    return {k: v.astype(np.float32) for k, v in w.items()}


def finish(out, f, logits, ids):
    out["hidden.%d" % LAYERS] = f
    out["final_norm"] = f
    out["logits"], out["logits_last"] = logits, logits[-1:]
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + \
        logits.max(-1)
    out["logprob_next"] = (logits[np.arange(len(ids) - 1), ids[1:]] -
                           lse[:-1])[None]
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(w, cfg, kind, ids):
    """Every stored tensor of one sequence: hidden.K (resid_pre of layer K,
    hidden.L the final norm's output), attn_out.K, mlp_out.K, layer_out.L-1,
    logits, logprob_next and the layer-0 attention probabilities."""
    out = {}
    x = w["model.embed_tokens.weight"][ids]
    for l in range(LAYERS):
        p = "model.layers.%d." % l
        out["hidden.%d" % l] = x
        if kind == "cohere":
            # CohereDecoderLayer: x + attn(ln(x)) + mlp(ln(x)), one norm.
            h = layer_norm_no_bias(x, w[p + "input_layernorm.weight"],
                                   cfg["layer_norm_eps"])
            a, probs = attention(h, w, p + "self_attn.", cfg, kind)
            m = (silu(h @ w[p + "mlp.gate_proj.weight"].T) *
                 (h @ w[p + "mlp.up_proj.weight"].T)) @ w[
                     p + "mlp.down_proj.weight"].T
            x = x + a + m
        else:
            # GlmDecoderLayer: sequential; GlmMLP chunks gate_up into
            # (gate, up) and computes up * silu(gate).
            h = rms_norm(x, w[p + "input_layernorm.weight"], cfg["rms_norm_eps"])
            a, probs = attention(h, w, p + "self_attn.", cfg, kind)
            x = x + a
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"],
                         cfg["rms_norm_eps"])
            gu = h @ w[p + "mlp.gate_up_proj.weight"].T
            m = (gu[:, INTER:] * silu(gu[:, :INTER])) @ w[
                p + "mlp.down_proj.weight"].T
            x = x + m
        out["attn_out.%d" % l], out["mlp_out.%d" % l] = a, m
        if l == 0:
            out["attn_probs.0"] = probs[None]
    out["layer_out.%d" % (LAYERS - 1)] = x
    if kind == "cohere":
        f = layer_norm_no_bias(x, w["model.norm.weight"], cfg["layer_norm_eps"])
        logits = (f @ w["model.embed_tokens.weight"].T) * cfg["logit_scale"]
    else:
        f = rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"])
        logits = f @ w["lm_head.weight"].T
    return finish(out, f, logits, ids)


def falcon_weights(rng):
    w = {}
    lin = lambda o, i: rng.normal(0, 1 / np.sqrt(i), (o, i))
    w["transformer.word_embeddings.weight"] = rng.normal(0, 0.5,
                                                         (VOCAB, HIDDEN))
    for l in range(LAYERS):
        p = "transformer.h.%d." % l
        w[p + "input_layernorm.weight"] = rng.normal(1, 0.1, HIDDEN)
        w[p + "input_layernorm.bias"] = rng.normal(0, 0.1, HIDDEN)
        w[p + "self_attention.query_key_value.weight"] = lin(
            HIDDEN + 2 * HEAD_DIM, HIDDEN)
        w[p + "self_attention.dense.weight"] = lin(HIDDEN, HIDDEN)
        w[p + "mlp.dense_h_to_4h.weight"] = lin(INTER, HIDDEN)
        w[p + "mlp.dense_4h_to_h.weight"] = lin(HIDDEN, INTER)
    w["transformer.ln_f.weight"] = rng.normal(1, 0.1, HIDDEN)
    w["transformer.ln_f.bias"] = rng.normal(0, 0.1, HIDDEN)
    return {k: v.astype(np.float32) for k, v in w.items()}


def weights(kind, cfg, rng):
    """normal(0, 1/sqrt(in)) projections, normal(0, 0.5) embeddings,
    normal(1, 0.1) gains, normal(0, 0.1) biases: every path has signal."""
    w = {}
    lin = lambda o, i: rng.normal(0, 1 / np.sqrt(i), (o, i))
    w["model.embed_tokens.weight"] = rng.normal(0, 0.5, (VOCAB, HIDDEN))
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for l in range(LAYERS):
        p = "model.layers.%d." % l
        a = p + "self_attn."
        w[p + "input_layernorm.weight"] = rng.normal(1, 0.1, HIDDEN)
        w[a + "q_proj.weight"] = lin(q, HIDDEN)
        w[a + "k_proj.weight"] = lin(kv, HIDDEN)
        w[a + "v_proj.weight"] = lin(kv, HIDDEN)
        w[a + "o_proj.weight"] = lin(HIDDEN, q)
        if kind == "glm":
            for n, d in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                w[a + n + ".bias"] = rng.normal(0, 0.1, d)
            w[p + "post_attention_layernorm.weight"] = rng.normal(1, 0.1, HIDDEN)
            w[p + "mlp.gate_up_proj.weight"] = lin(2 * INTER, HIDDEN)
        else:
            w[a + "q_norm.weight"] = rng.normal(1, 0.1, (HEADS, HEAD_DIM))
            w[a + "k_norm.weight"] = rng.normal(1, 0.1, (KV_HEADS, HEAD_DIM))
            w[p + "mlp.gate_proj.weight"] = lin(INTER, HIDDEN)
            w[p + "mlp.up_proj.weight"] = lin(INTER, HIDDEN)
        w[p + "mlp.down_proj.weight"] = lin(HIDDEN, INTER)
    w["model.norm.weight"] = rng.normal(1, 0.1, HIDDEN)
    if kind == "glm":
        w["lm_head.weight"] = lin(VOCAB, HIDDEN)
    # Stored as f32; the reference reads the stored values.
    return {k: v.astype(np.float32) for k, v in w.items()}


# Fixed per model, so that adding one leaves the others' files as they are.
SEEDS = {"cohere": 201, "falcon_mq": 202, "glm": 203, "bloom": 204}

CONFIGS = {
    "bloom": {
        "architectures": ["BloomForCausalLM"], "model_type": "bloom",
        "apply_residual_connection_post_layernorm": False,
        "bos_token_id": 1, "eos_token_id": 2, "layer_norm_epsilon": 1e-05,
        "n_head": BLOOM_HEADS, "n_layer": LAYERS, "pretraining_tp": 1,
        "slow_but_exact": False, "tie_word_embeddings": True,
    },
    "cohere": {
        "architectures": ["CohereForCausalLM"], "model_type": "cohere",
        "attention_bias": False, "bos_token_id": 5, "eos_token_id": 255001,
        "hidden_act": "silu", "layer_norm_eps": 1e-05, "logit_scale": 0.0625,
        "rope_theta": 10000.0, "tie_word_embeddings": True,
        "use_qk_norm": True,
    },
    # Falcon-7B's layout: multi-query, one LayerNorm, parallel attention.
    "falcon_mq": {
        "architectures": ["FalconForCausalLM"], "model_type": "falcon",
        "activation": "gelu", "alibi": False, "bias": False,
        "bos_token_id": 11, "eos_token_id": 11, "ffn_hidden_size": INTER,
        "layer_norm_epsilon": 1e-05, "multi_query": True,
        "new_decoder_architecture": False, "parallel_attn": True,
        "rope_theta": 10000.0, "tie_word_embeddings": True,
    },
    "glm": {
        "architectures": ["GlmForCausalLM"], "model_type": "glm",
        "attention_bias": True, "bos_token_id": None, "eos_token_id": 2,
        "head_dim": HEAD_DIM, "hidden_act": "silu",
        "partial_rotary_factor": 0.5, "rms_norm_eps": 1.5625e-07,
        "rope_theta": 10000.0, "tie_word_embeddings": False,
    },
}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.abspath(__file__))
    for kind, extra in sorted(CONFIGS.items()):
        seed = SEEDS[kind]
        cfg = dict(extra)
        cfg.update({"vocab_size": VOCAB, "torch_dtype": "float32"})
        if kind == "bloom":
            cfg["hidden_size"] = BLOOM_HIDDEN
        else:
            cfg.update({"hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
                        "num_attention_heads": HEADS,
                        "max_position_embeddings": 512})
        if kind not in ("falcon_mq", "bloom"):
            cfg.update({"intermediate_size": INTER,
                        "num_key_value_heads": KV_HEADS})
        rng = np.random.default_rng(seed)
        w = (falcon_weights(rng) if kind == "falcon_mq" else
             bloom_weights(rng) if kind == "bloom" else weights(kind, cfg, rng))
        w64 = {k: v.astype(np.float64) for k, v in w.items()}
        d = os.path.join(root, kind)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"), w)
        goldens, seqs = {}, []
        for i, T in enumerate(SEQ_LENGTHS):
            ids = rng.integers(0, VOCAB, T)
            name = "seq%d" % i
            goldens[name + ".input_ids"] = ids[None].astype(np.int64)
            ref = (falcon_forward(w64, cfg, ids) if kind == "falcon_mq" else
                   bloom_forward(w64, cfg, ids) if kind == "bloom" else
                   forward(w64, cfg, kind, ids))
            for k, v in ref.items():
                goldens[name + "." + k] = (v if v.ndim > 2 or k in (
                    "logits_last", "logprob_next") else v[None]).astype(
                        np.float32)
            seqs.append({"name": name, "length": T,
                         "input_ids": [int(t) for t in ids]})
        write_safetensors(os.path.join(d, "goldens_f32.safetensors"), goldens)
        manifest = {
            "model": kind, "model_type": kind, "seed": seed,
            "oracle": "make_goldens.py: an independent float64 NumPy forward "
                      "written from transformers' modeling_%s.py (not HF's "
                      "own outputs)" % cfg["model_type"],
            "goldens_bf16_note": "none: the bf16 forward is compared with "
                                 "goldens_f32 within the bf16 bound",
            "sequences": seqs,
        }
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        print("wrote", d)


if __name__ == "__main__":
    main()
