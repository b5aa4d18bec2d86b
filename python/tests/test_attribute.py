"""Model.attribute and Model.grad (docs/attribution.md) against the shared
attribution goldens (../shared/golden/attribution, HF autograd in f32): the
AtP grid and per-head AtP within the README's rule, the metric values, the
gradients at every hook of a case for both metrics, exact and linearized;
the result is the CLI's (`loom attribute`) value for value, for AtP*
(method="atp-star") and integrated gradients too; bad arguments are errors
naming them. The golden part is skipped, saying so, when
../shared is absent."""

import json
import os

import numpy as np
import pytest

import loom
from loom.activations import read_safetensors
from conftest import SHARED, run_loom

GOLDEN = os.path.join(SHARED, "golden", "attribution")


def within(got, want, atol_abs, atol_rel, rtol):
    want = np.asarray(want, np.float64)
    atol = max(atol_abs, atol_rel * float(np.abs(want).max()))
    np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want),
                                 atol + rtol * np.abs(want) + 1e-300)


def case(name):
    d = os.path.join(GOLDEN, name)
    if not os.path.isdir(d):
        pytest.skip("SKIPPED LOUDLY: no attribution golden at %s (../shared is absent)" % d)
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    tensors, _ = read_safetensors(os.path.join(d, "golden.safetensors"))
    model = loom.Model(os.path.join(SHARED, "golden", "tiny", m["model"]), precision="f32")
    return m, tensors, model


@pytest.mark.parametrize("name", ["llama__two_diffs", "gemma2__single_diff",
                                  "gpt_neox__two_diffs"])
@pytest.mark.parametrize("linear", [False, True])
def test_atp_and_grads_match_the_golden(name, linear):
    m, t, model = case(name)
    hooks = m["hooks"] + m["extra_hooks"]
    freeze = ("attn_pattern", "norm_scale") if linear else ()
    kind = "lin_atp" if linear else "atp"
    r = model.attribute(m["clean_input_ids"], np.array(m["corrupted_input_ids"]), hooks=hooks,
                        freeze=freeze, per_head=True)
    assert r["hooks"] == hooks and r["atp"].shape == (len(hooks), m["T"])
    assert (r["answer"], r["wrong"]) == (m["answer_token_ids"]["answer"],
                                         m["answer_token_ids"]["wrong"])
    assert abs(r["metric_clean"] - float(t["metric.clean"][0])) <= 1e-4
    for i, h in enumerate(hooks):
        within(r["atp"][i], t[kind + "." + h], 1e-4, 1e-3, 1e-3)
        if "attn.hook_z" in h:
            within(r["atp_head"][h], t[kind + "_head." + h], 1e-4, 1e-3, 1e-3)
    g = model.grad(m["corrupted_input_ids"], hooks, metric="logprob", freeze=freeze)
    assert abs(g["metric"] - float(t["seq_logprob.metric.corrupted"][0])) <= 3e-4
    for h in hooks:
        assert g[h].dtype == np.float32 and g[h].shape == t["seq_logprob.grad." + h].shape
        within(g[h], t["seq_logprob." + ("lin_grad." if linear else "grad.") + h],
               1e-7, 1e-4, 1e-3)


def test_the_cli_gives_the_same_numbers(tmp_path):
    m, t, model = case("llama__single_diff")
    ids = lambda v: ",".join(str(x) for x in v)
    out = tmp_path / "cli"
    run_loom("attribute", "--model", os.path.join(SHARED, "golden", "tiny", "llama"),
             "--clean-tokens", ids(m["clean_input_ids"]), "--corrupted-tokens",
             ids(m["corrupted_input_ids"]), "--hooks", "blocks.*.hook_resid_pre", "--quiet",
             "--out", str(out))
    with open(out / "attribution.json", encoding="utf-8") as f:
        cli = json.load(f)
    r = model.attribute(m["clean_input_ids"], m["corrupted_input_ids"])
    assert cli["hooks"] == r["hooks"]
    assert np.array_equal(np.array(cli["atp"]), r["atp"])


def test_atp_star_and_integrated_gradients_are_the_clis(tmp_path):
    m, _, model = case("llama__two_diffs")
    ids = lambda v: ",".join(str(x) for x in v)
    llama = os.path.join(SHARED, "golden", "tiny", "llama")
    out = tmp_path / "star"
    run_loom("attribute", "--model", llama, "--clean-tokens", ids(m["clean_input_ids"]),
             "--corrupted-tokens", ids(m["corrupted_input_ids"]), "--hooks",
             "blocks.*.hook_resid_post,blocks.*.attn.hook_z", "--per-head", "--method",
             "atp-star", "--quiet", "--out", str(out))
    with open(out / "attribution.json", encoding="utf-8") as f:
        cli = json.load(f)
    r = model.attribute(m["clean_input_ids"], m["corrupted_input_ids"],
                        hooks="blocks.*.hook_resid_post,blocks.*.attn.hook_z", per_head=True,
                        method="atp-star")
    assert r["method"] == cli["method"] == "atp-star"
    assert np.array_equal(np.array(cli["atp_star"]), r["atp_star"])
    z = "blocks.1.attn.hook_z"
    assert np.array_equal(np.array(cli["atp_star_head"][cli["hooks"].index(z)]),
                          r["atp_star_head"][z])
    # No drop reaches the last layer's output: atp_star = |atp| L / (L - 1).
    L = 3
    last = r["hooks"].index("blocks.2.hook_resid_post")
    np.testing.assert_allclose(r["atp_star"][last], np.abs(r["atp"][last]) * L / (L - 1),
                               rtol=1e-12, atol=1e-15)
    out = tmp_path / "ig"
    run_loom("attribute", "--model", llama, "--clean-tokens", ids(m["clean_input_ids"]),
             "--method", "ig", "--steps", "32", "--quiet", "--out", str(out))
    with open(out / "attribution.json", encoding="utf-8") as f:
        cli = json.load(f)
    ig = model.integrated_gradients(m["clean_input_ids"], steps=32)
    assert np.array_equal(np.array(cli["ig"]), ig["ig"])
    assert ig["completeness_error"] == cli["completeness_error"]
    change = ig["metric_input"] - ig["metric_baseline"]
    assert abs(ig["ig"].sum() - change) <= 1e-4 + 1e-3 * abs(change)


def test_extract_grad_of_gives_the_golden_gradients():
    m, t, model = case("llama__two_diffs")
    hooks = m["hooks"] + m["extra_hooks"]
    a = m["answer_token_ids"]
    got = model.extract([m["corrupted_input_ids"]], [h + ".grad" for h in hooks],
                        select="all", grad_of="logit-diff", answer=a["answer"],
                        wrong=a["wrong"])
    for h in hooks:
        g = got[h + ".grad.all"]
        assert g.dtype == np.float32 and g.shape == t["grad." + h].shape
        within(g, t["grad." + h], 1e-7, 1e-4, 1e-3)
    lp = model.extract([m["corrupted_input_ids"]], "blocks.1.hook_resid_pre.grad",
                       select="all", grad_of="logprob")
    within(lp["blocks.1.hook_resid_pre.grad.all"],
           t["seq_logprob.grad.blocks.1.hook_resid_pre"], 1e-7, 1e-4, 1e-3)
    with pytest.raises(ValueError, match="give answer A and wrong B"):
        model.extract([[1, 2, 3]], "blocks.0.hook_resid_pre.grad", grad_of="logit-diff")
    with pytest.raises(ValueError, match="needs --grad-of"):
        model.extract([[1, 2, 3]], "blocks.0.hook_resid_pre.grad")


def test_inject_grad_below_a_cut_is_the_metrics_gradient():
    m, t, model = case("gpt_neox__two_diffs")
    ids = m["corrupted_input_ids"]
    a = m["answer_token_ids"]
    hooks = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out"]
    full = model.grad(ids, hooks + ["blocks.2.hook_resid_post"], answer=a["answer"],
                      wrong=a["wrong"])
    seed = full["blocks.2.hook_resid_post"]
    got = model.inject_grad(ids, {"blocks.2.hook_resid_post": seed}, hooks)
    for h in hooks:
        assert np.array_equal(got[h], full[h]), h
    both = model.inject_grad(ids, [{"blocks.2.hook_resid_post": seed},
                                   {"blocks.2.hook_resid_post": 2 * seed}], hooks)
    assert isinstance(both, list) and len(both) == 2
    for h in hooks:
        assert np.array_equal(both[1][h], 2 * both[0][h]), h
    with pytest.raises(ValueError, match="hook's width"):
        model.inject_grad(ids, {"blocks.2.hook_resid_post": seed[:, :3]}, hooks)


def test_bad_arguments_are_named():
    _, _, model = case("llama__single_diff")
    with pytest.raises(ValueError, match="metric"):
        model.attribute([1, 2], [1, 3], metric="kl")
    with pytest.raises(ValueError, match="freeze"):
        model.attribute([1, 2], [1, 3], freeze=["mlp"])
    with pytest.raises(ValueError, match="answer, wrong"):
        model.grad([1, 2, 3], "blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match="one length"):
        model.attribute([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="^method: 'ig'"):
        model.attribute([1, 2], [1, 3], method="ig")
    with pytest.raises(ValueError, match="steps"):
        model.integrated_gradients([1, 2, 3], steps=0)
