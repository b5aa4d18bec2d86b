"""loom.Sae: the shared SAE goldens (golden/sae) through the Python class,
given HF's activations: every output within 1e-5 of the tensor's largest
magnitude, the top-16 indices exactly; a Model extract's hook through an SAE
end to end; steering by feature from Python; errors naming the argument."""

import json
import os
import struct

import numpy as np
import pytest

import loom
from conftest import SHARED

SAE_ROOT = os.path.join(SHARED, "golden", "sae")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(t["shape"])
    return out


def cases():
    if not os.path.isdir(SAE_ROOT):
        pytest.skip("SKIPPED LOUDLY: no SAE goldens at %s (../shared is absent)" % SAE_ROOT)
    return sorted(d for d in os.listdir(SAE_ROOT)
                  if os.path.exists(os.path.join(SAE_ROOT, d, "manifest.json")))


def test_every_golden_case_through_the_python_class():
    names = cases()
    assert len(names) >= 7
    for name in names:
        root = os.path.join(SAE_ROOT, name)
        m = json.load(open(os.path.join(root, "manifest.json")))
        sae = loom.Sae(os.path.join(root, m["sae_dir"]))
        assert sae.hook == m["hook"] and sae.architecture == m["architecture"], name
        assert (sae.d_in, sae.d_sae) == (m["dims"]["d_in"], m["dims"]["d_sae"])
        g = read_safetensors(os.path.join(root, "golden.safetensors"))
        for inp in m["inputs"]:
            x = g[inp + ".x"]
            target = g.get(inp + ".target")
            out = sae.encode(x, target=target, topk=16)
            for key, golden in [("hidden_pre", "hidden_pre"), ("feature_acts", "feature_acts"),
                                ("hook_sae_recons", "hook_sae_recons"),
                                ("reconstruction", "reconstruction"), ("error", "error"),
                                ("topk_values", "topk_values")]:
                want = g[inp + "." + golden]
                tol = 1e-5 * np.abs(want).max() + 1e-6
                assert np.abs(out[key] - want).max() <= tol, (name, inp, key)
            assert out["topk_indices"].dtype == np.int32
            np.testing.assert_array_equal(out["topk_indices"], g[inp + ".topk_indices"])


def test_one_row_decoder_rows_and_errors():
    names = cases()
    root = os.path.join(SAE_ROOT, "llama__saelens_standard_relu")
    m = json.load(open(os.path.join(root, "manifest.json")))
    sae = loom.Sae(os.path.join(root, m["sae_dir"]))
    g = read_safetensors(os.path.join(root, "golden.safetensors"))
    x = g["seq1.x"]
    one = sae.encode(x[3])
    np.testing.assert_array_equal(one["feature_acts"][0], sae.encode(x)["feature_acts"][3])
    assert "topk_indices" not in one
    # The steering link: c * W_dec[f] is the linked case's scale * v.
    row = sae.decoder_row(m["steer"]["feature"])
    assert row.shape == (64,) and row.dtype == np.float32
    with pytest.raises(loom.InvalidArgumentError, match=r"^x: rows of 63 values, the SAE takes 64"):
        sae.encode(np.zeros((2, 63), np.float32))
    with pytest.raises(loom.InvalidArgumentError, match=r"^feature: 256 is not a feature of"):
        sae.decoder_row(256)
    with pytest.raises(loom.InvalidArgumentError, match=r"^topk: 257 is outside"):
        sae.encode(x, topk=257)
    with pytest.raises(TypeError, match="x"):
        sae.encode("not an array")
    with pytest.raises(loom.NotFoundError, match="no such file or directory"):
        loom.Sae(os.path.join(root, "absent"))
    with pytest.raises(loom.InvalidArgumentError, match="names hook blocks.2.hook_resid_post"):
        loom.Sae(os.path.join(root, m["sae_dir"]), hook="blocks.2.hook_resid_post")


def test_extract_then_encode_end_to_end():
    # Loom's own activations at the hook through the SAE: within 1e-4 of the
    # golden computed from HF's.
    names = cases()
    root = os.path.join(SAE_ROOT, "qwen3__saelens_topk")
    m = json.load(open(os.path.join(root, "manifest.json")))
    sae = loom.Sae(os.path.join(root, m["sae_dir"]))
    model = loom.Model(os.path.join(SHARED, "golden", "tiny", "qwen3"), precision="f32")
    ids = m["inputs"]["seq2"]["input_ids"]
    acts = model.extract([ids], sae.hook, select="all")[sae.hook]
    out = sae.encode(np.asarray(acts), topk=16)
    g = read_safetensors(os.path.join(root, "golden.safetensors"))
    want = g["seq2.feature_acts"]
    assert np.abs(out["feature_acts"] - want).max() <= 1e-4 + 1e-4 * np.abs(want).max()


def test_extract_with_saes_in_the_forward():
    # Model.extract(saes=..., sae_topk=...): the SAE's hooks computed inside
    # the forward, the same arrays as `loom extract --sae`; indices int32.
    cases()
    root = os.path.join(SAE_ROOT, "qwen3__saelens_topk")
    m = json.load(open(os.path.join(root, "manifest.json")))
    hook = m["hook"]
    model = loom.Model(os.path.join(SHARED, "golden", "tiny", "qwen3"), precision="f32")
    ids = m["inputs"]["seq2"]["input_ids"]
    out = model.extract([ids], [hook, hook + ".hook_sae_acts_post", hook + ".hook_sae_error"],
                        select="all", saes=os.path.join(root, m["sae_dir"]), sae_topk=16)
    g = read_safetensors(os.path.join(root, "golden.safetensors"))
    want = g["seq2.feature_acts"]
    got = out[hook + ".hook_sae_acts_post"]
    assert got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-4 + 1e-4 * np.abs(want).max()
    top = out[hook + ".hook_sae_acts_post.topk_indices"]
    assert top.dtype == np.int32 and top.shape == (len(ids), 16)
    ok = g["seq2.topk_gap"] >= 1e-4
    ok[:, 1:] &= g["seq2.topk_gap"][:, :-1] >= 1e-4
    assert np.array_equal(top[ok], g["seq2.topk_indices"][ok])
    err = out[hook + ".hook_sae_error"]
    assert np.abs(err - (out[hook] - g["seq2.reconstruction"])).max() <= 1e-4
    # A loom.Sae object instead of the path: loaded once, the same bytes on
    # every call; beside a path of another SAE at the same hook, refused.
    sae = loom.Sae(os.path.join(root, m["sae_dir"]))
    names = [hook + ".hook_sae_acts_post", hook + ".hook_sae_error"]
    for _ in range(2):
        again = model.extract([ids], [hook] + names, select="all", saes=sae, sae_topk=16)
        for k in names + [hook + ".hook_sae_acts_post.topk_indices",
                          hook + ".hook_sae_acts_post.topk_values"]:
            assert np.array_equal(again[k], out[k]), k
    with pytest.raises(loom.InvalidArgumentError, match="one SAE per hook"):
        model.extract([ids], names[0], saes=[os.path.join(root, m["sae_dir"]), sae])
    with pytest.raises(loom.InvalidArgumentError, match="sae_topk"):
        model.extract([ids], hook, saes=os.path.join(root, m["sae_dir"]), sae_topk=-1)
    with pytest.raises(loom.InvalidArgumentError, match="exceeds"):
        model.extract([ids], names[0], saes=sae, sae_topk=sae.d_sae + 1)
    with pytest.raises(loom.InvalidArgumentError, match="no --sae reads"):
        model.extract([ids], hook + ".hook_sae_acts_post")
