"""Model.lens: the shared lens goldens (golden/lens) through Python, given
HF's residual streams: the logit lens on llama, qwen3, gemma2 (softcap) and
olmoe, the tuned lens on llama; logits within 1e-5 of the largest, top-10
ids exact; from a Model.extract's own residuals, the last layer's lens is the
model's logits; errors naming the argument."""

import json
import os

import numpy as np
import pytest

import loom
from conftest import SHARED
from test_sae import read_safetensors

LENS_ROOT = os.path.join(SHARED, "golden", "lens")


def case(name):
    root = os.path.join(LENS_ROOT, name)
    if not os.path.isdir(root):
        pytest.skip("SKIPPED LOUDLY: no lens goldens at %s (../shared is absent)" % LENS_ROOT)
    m = json.load(open(os.path.join(root, "manifest.json")))
    g = read_safetensors(os.path.join(root, "golden.safetensors"))
    model = loom.Model(os.path.join(SHARED, "golden", "tiny", m["model"]), precision="f32")
    return root, m, g, model


def near(got, want):
    tol = 1e-5 * np.abs(want).max() + 1e-6
    assert np.abs(got - want).max() <= tol


def decided_ids_equal(got, want, gap, decided):
    ok = gap >= decided
    ok[..., 1:] &= gap[..., :-1] >= decided
    assert np.array_equal(got[ok], want[ok])


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "olmoe"])
def test_logit_lens_given_hf_residuals(name):
    root, m, g, model = case(name)
    for seq in m["inputs"]:
        for i, hook in enumerate(m["layers"]):
            out = model.lens(g[seq + ".resid"][i], hook, 10, logits=True)
            near(out["logits"], g[seq + ".logits_lens"][i])
            near(out["topk_logits"], g[seq + ".top10_logits"][i])
            assert out["topk_ids"].dtype == np.int32
            decided_ids_equal(out["topk_ids"], g[seq + ".top10_ids"][i],
                              g[seq + ".top10_gap"][i], 1e-5)


@pytest.mark.parametrize("where", ["", "params.pt", "params.safetensors"])
def test_tuned_lens_given_hf_residuals(where):
    root, m, g, model = case("llama__tuned_lens")
    tuned = os.path.join(root, where) if where else root
    for seq in m["inputs"]:
        for i, hook in enumerate(m["layers"]):
            out = model.lens(g[seq + ".resid"][i], hook, tuned=tuned, logits=True)
            near(out["logits"], g[seq + ".logits_tuned"][i])
            decided_ids_equal(out["topk_ids"], g[seq + ".top10_ids"][i],
                              g[seq + ".top10_gap"][i], 1e-5)
            assert "logits" not in model.lens(g[seq + ".resid"][i], hook, 3, tuned=tuned)


def test_last_layer_lens_is_the_models_logits():
    root, m, g, model = case("llama")
    last = m["layers"][-1]
    ids = m["inputs"]["seq2"]["input_ids"]
    r = model.extract([ids], [last, "logits"], select="all")
    resid = np.asarray(r[last])
    assert resid.shape == (len(ids), model.config["hidden_size"])
    out = model.lens(resid, last, 5, logits=True)
    assert out["logits"].tobytes() == np.asarray(r["logits"]).tobytes()


def test_grid_is_the_lens_of_the_extracted_residuals():
    # Bundled model, no shared data: one forward's grid equals Model.lens on
    # the residuals Model.extract captures, bit for bit.
    from conftest import STORIES
    model = loom.Model(STORIES, precision="f32")
    ids = [1, 403, 407, 261, 378]
    g = model.lens_grid(ids, topk=4)
    assert g["hooks"][0] == "blocks.0.hook_resid_pre"
    assert g["topk_ids"].shape == (len(g["hooks"]), len(ids), 4)
    assert g["tokens"][1] == "Once" and len(g["topk_tokens"][0][0]) == 4
    r = model.extract([ids], g["hooks"], select="all")
    for i, hook in enumerate(g["hooks"]):
        out = model.lens(r[hook], hook, 4)
        assert np.array_equal(out["topk_ids"], g["topk_ids"][i]), hook
        assert out["topk_logits"].tobytes() == g["topk_logits"][i].tobytes(), hook
    # KL(final || hook): the CLI's numbers; 0 at the final hook, >= 0 elsewhere.
    k = model.lens_grid(ids, topk=4, kl=True)
    assert k["hooks"] == g["hooks"] and k["kl_to_final"].shape == (len(g["hooks"]), len(ids))
    assert k["kl_to_final"].dtype == np.float32
    assert not k["kl_to_final"][-1].any() and (k["kl_to_final"] >= 0).all()
    assert k["kl_to_final"][:-1].max() > 0
    assert np.array_equal(k["topk_ids"], g["topk_ids"])
    mid = model.lens_grid("Once upon a time", "hook_resid_mid", layers="0,-1", topk=1)
    assert mid["hooks"] == ["blocks.0.hook_resid_mid", "blocks.4.hook_resid_mid"]
    with pytest.raises(loom.InvalidArgumentError, match="a lens reads a residual stream"):
        model.lens_grid(ids, "blocks.0.hook_mlp_out")


def test_errors_name_the_argument():
    root, m, g, model = case("llama")
    x = g["seq1.resid"][0]
    with pytest.raises(loom.InvalidArgumentError, match="x: rows of 3 values"):
        model.lens(x[:, :3], "blocks.0.hook_resid_pre")
    with pytest.raises(loom.InvalidArgumentError, match="a lens reads a residual stream"):
        model.lens(x, "blocks.0.hook_attn_out")
    with pytest.raises(loom.InvalidArgumentError, match="topk"):
        model.lens(x, "blocks.0.hook_resid_pre", -1)
    with pytest.raises(loom.InvalidArgumentError, match="translators for"):
        model.lens(x, "blocks.0.hook_resid_mid",
                   tuned=os.path.join(LENS_ROOT, "llama__tuned_lens"))
    with pytest.raises(loom.NotFoundError, match="no such tuned lens"):
        model.lens(x, "blocks.0.hook_resid_pre", tuned="/nonexistent/lens")


def test_extract_with_the_lens_in_the_forward():
    # Model.extract(lens="logit", lens_topk=10): HOOK.hook_lens_logits and the
    # top-10 ids (int32) of every residual hook asked; the last layer's lens
    # is the model's logits, bit for bit.
    root, m, g, model = case("llama")
    ids = m["inputs"]["seq2"]["input_ids"]
    hooks = list(m["layers"])
    out = model.extract([ids], hooks + ["logits", hooks[-1] + ".hook_lens_logits"],
                        select="all", lens="logit", lens_topk=10)
    assert np.array_equal(out[hooks[-1] + ".hook_lens_logits"], out["logits"])
    for i, h in enumerate(hooks):
        top = out[h + ".lens_topk_ids"]
        assert top.dtype == np.int32 and top.shape == (len(ids), 10)
        decided_ids_equal(top, g["seq2.top10_ids"][i], g["seq2.top10_gap"][i], 1e-4)
        want = g["seq2.top10_logits"][i]
        assert np.abs(out[h + ".lens_topk_values"] - want).max() <= 1e-4 + 1e-4 * np.abs(want).max()
    with pytest.raises(loom.InvalidArgumentError, match="expected logit or tuned:FILE"):
        model.extract([ids], hooks[0] + ".hook_lens_logits", lens="bogus")
