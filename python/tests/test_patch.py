"""Model.patch (docs/python.md): activation patching as `loom patch` computes
it. The golden grids of Hugging Face (../shared/golden/interventions/
*__activation_patch, README there) through the Python module in f32: the
answer tokens, the clean and corrupted logit differences and every cell's
(1e-4), the recovery grid (1e-3, the README's tolerance) and every patched
run's last logits (atol = rtol = 1e-4); the result is the CLI's
(`loom patch --out DIR`: patch.json and the .npy files) bit for bit; and bad
arguments are errors naming them. The golden part is skipped, saying so,
when ../shared is absent."""

import json
import os

import numpy as np
import pytest

import loom
from loom.activations import read_safetensors
from conftest import SHARED, STORIES, run_loom

GOLDEN = os.path.join(SHARED, "golden", "interventions")
TOL = 1e-4
CLEAN = "The cat sat on the mat"
CORRUPTED = "The dog sat on the mat"  # as many tokens (10)


@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen3_moe"])
def test_golden_grid(name):
    case_dir = os.path.join(GOLDEN, name + "__activation_patch")
    if not os.path.isdir(case_dir):
        pytest.skip("SKIPPED LOUDLY: no activation-patching golden at %s (../shared is absent); "
                    "Model.patch is not compared with Hugging Face here" % case_dir)
    with open(os.path.join(case_dir, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    model = loom.Model(os.path.join(SHARED, "golden", "tiny", name), precision="f32")
    clean = spec["clean_input_ids"][0]
    r = model.patch(clean, np.array(spec["corrupted_input_ids"][0]))
    tensors, _ = read_safetensors(os.path.join(case_dir, "expected.safetensors"))
    L, T = tensors["patched.logit_diff"].shape
    assert r["hooks"] == ["blocks.%d.hook_resid_pre" % k for k in range(L)]
    assert r["positions"] == list(range(T)) and T == len(clean)
    assert (r["answer"], r["wrong"]) == (spec["answer_token_ids"]["A"],
                                         spec["answer_token_ids"]["B"])
    for key in ("clean_logit_diff", "corrupted_logit_diff"):
        assert abs(r[key] - spec[key]) <= TOL, (name, key, r[key], spec[key])
    assert r["logit_diff"].dtype == np.float64 and r["recovery"].dtype == np.float64
    np.testing.assert_allclose(r["logit_diff"], tensors["patched.logit_diff"], rtol=0, atol=TOL,
                               err_msg="%s: logit_diff" % name)
    np.testing.assert_allclose(r["recovery"], tensors["recovery"], rtol=0, atol=1e-3,
                               err_msg="%s: recovery" % name)
    want = np.asarray(tensors["patched.logits_last"], np.float32)
    assert r["patched_logits_last"].dtype == np.float32
    assert r["patched_logits_last"].shape == want.shape == (L, T, model.config["vocab_size"])
    np.testing.assert_allclose(r["patched_logits_last"], want, rtol=TOL, atol=TOL,
                               err_msg="%s: patched.logits_last" % name)
    assert r["clean_logits_last"].shape == r["corrupted_logits_last"].shape == want.shape[2:]


def cli_patch(tmp_path, *args):
    """`loom patch` on stories260K into tmp_path/cli: (patch.json, the .npy
    files by name)."""
    out = tmp_path / "cli"
    run_loom("patch", "--model", STORIES, "--out", out, "--quiet", *args)
    with open(out / "patch.json", encoding="utf-8") as f:
        j = json.load(f)
    arrays = {n: np.load(out / (n + ".logits_last.npy"))
              for n in ("patched", "clean", "corrupted")}
    return j, arrays


def assert_same_as_cli(r, j, arrays):
    for key in ("hooks", "positions", "clean_logit_diff", "corrupted_logit_diff", "forwards"):
        assert r[key] == j[key], (key, r[key], j[key])
    assert (r["answer"], r["wrong"]) == (j["answer_token_ids"]["A"], j["answer_token_ids"]["B"])
    for key in ("logit_diff", "recovery"):  # JSON doubles read back exactly
        assert r[key].tolist() == j[key], key
    for name, a in arrays.items():
        got = r[name + "_logits_last"]
        want = a if name == "patched" else a[0]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), "%s logits differ from the CLI's" % name


# precision and hf_bf16 are the model's (loom.Model's), as the CLI's flags.
@pytest.mark.parametrize("precision,hf_bf16", [("f32", False), ("bf16", True)])
def test_text_prompts_equal_the_cli(tmp_path, precision, hf_bf16):
    model = loom.Model(STORIES, precision=precision, hf_bf16=hf_bf16)
    r = model.patch(CLEAN, CORRUPTED)
    extra = ["--hf-bf16"] if hf_bf16 else []
    j, arrays = cli_patch(tmp_path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--precision",
                          precision, *extra)
    assert j["clean_input_ids"] == model.tokenize(CLEAN)  # special tokens added
    assert r["patched_logits_last"].shape == (5, 10, 512)
    assert_same_as_cli(r, j, arrays)


def test_token_prompts_and_options_equal_the_cli(tmp_path):
    model = loom.Model(STORIES, precision="f32")
    clean, corrupted = [1, 403, 407, 261, 378, 275], [1, 403, 407, 261, 379, 275]
    hooks = ["blocks.0.hook_resid_pre", "blocks.-3.hook_resid_pre", "blocks.1.hook_mlp_out"]
    r = model.patch(clean, np.array(corrupted, np.int64), hooks=hooks, positions=[3, -1],
                    answer=260, wrong=429, batch_tokens=12)
    j, arrays = cli_patch(tmp_path, "--clean-tokens", ",".join(map(str, clean)),
                          "--corrupted-tokens", ",".join(map(str, corrupted)),
                          "--hooks", hooks[0], "--hooks", hooks[1], "--hooks", hooks[2],
                          "--positions", "3,-1",
                          "--answer", 260, "--wrong", 429, "--batch-tokens", 12,
                          "--precision", "f32")
    assert r["hooks"] == ["blocks.0.hook_resid_pre", "blocks.1.hook_mlp_out",
                          "blocks.2.hook_resid_pre"]
    assert r["positions"] == [3, 5] and (r["answer"], r["wrong"]) == (260, 429)
    assert r["forwards"] == 2 + 3  # 6 cells, 2 of 6 tokens per forward
    assert_same_as_cli(r, j, arrays)
    # At the first layer's input, the differing token (position 4, an int
    # position from the end) gives back the clean run, the last one (the
    # same token in both) the corrupted run.
    first = model.patch(clean, corrupted, hooks="blocks.0.hook_resid_pre", positions=-2)
    assert first["positions"] == [4]
    np.testing.assert_array_equal(first["patched_logits_last"][0, 0], first["clean_logits_last"])
    np.testing.assert_allclose(first["recovery"], [[1.0]], atol=1e-5)
    last = model.patch(clean, corrupted, hooks="blocks.0.hook_resid_pre", positions="last")
    assert last["positions"] == [5]
    np.testing.assert_allclose(last["recovery"], [[0.0]], atol=1e-5)


def test_per_head_grid_equals_the_cli_and_patch_head_interventions(tmp_path):
    # One row per head of blocks.1.attn.hook_z over the span 3:5; each cell
    # is the corrupted run with only that head's columns at that position
    # taken from the clean run, which is also what `interventions=` gives
    # with a patch_head entry whose rows are the clean run's recorded z.
    model = loom.Model(STORIES, precision="f32")
    heads = model.config["num_heads"]
    clean, corrupted = [1, 403, 407, 261, 378, 275], [1, 403, 407, 261, 379, 275]
    z = "blocks.1.attn.hook_z"
    r = model.patch(clean, corrupted, hooks=z, positions=slice(3, 5), per_head=True)
    assert r["hooks"] == [z] * heads and r["heads"] == list(range(heads))
    assert r["positions"] == [3, 4]
    assert r["patched_logits_last"].shape == (heads, 2, 512)
    j, arrays = cli_patch(tmp_path, "--clean-tokens", ",".join(map(str, clean)),
                          "--corrupted-tokens", ",".join(map(str, corrupted)),
                          "--hooks", z, "--positions", "3:5", "--per-head", "--precision", "f32")
    assert j["heads"] == r["heads"]
    assert_same_as_cli(r, j, arrays)
    recorded = model.extract([clean], z, select="all")[z]  # [T, heads * head_dim]
    for head in (0, heads - 1):
        for col, p in enumerate(r["positions"]):
            iv = {"hook": z, "mode": "patch_head", "head": head, "positions": [p],
                  "vector": recorded[p:p + 1]}
            got = model.extract([corrupted], "logits", select="last", interventions=[iv])
            # The same sequence alone or in the grid's batch: the same bytes
            # (batch invariance, docs/design/cpu-backend.md).
            np.testing.assert_array_equal(got["logits"][0], r["patched_logits_last"][head, col],
                                          err_msg="head %d position %d" % (head, p))
    # Every head patched at once is the whole-row patch.
    whole = model.patch(clean, corrupted, hooks=z, positions="3:5")
    assert whole["heads"] == [-1]
    all_heads = [{"hook": z, "mode": "patch_head", "head": h, "positions": slice(4, 5),
                  "vector": recorded[4:5]} for h in range(heads)]
    got = model.extract([corrupted], "logits", select="last", interventions=all_heads)
    np.testing.assert_array_equal(got["logits"][0], whole["patched_logits_last"][0, 1])
    assert abs(got["logits"][0] - r["patched_logits_last"][0, 1]).max() > 1e-4


@pytest.fixture(scope="module")
def model():
    return loom.Model(STORIES, precision="f32")


@pytest.mark.parametrize("kwargs,names", [
    (dict(corrupted=[1, 403, 407]), ["clean prompt has 4 tokens", "corrupted one 3"]),
    (dict(hooks="blocks.0.attn.hook_pattern"), ["blocks.0.attn.hook_pattern",
                                                 "cannot be patched"]),
    (dict(hooks="blocks.7.hook_resid_pre"), ["blocks.7.hook_resid_pre", "5 layers"]),
    (dict(answer=512), ["answer", "512", "vocabulary [0, 512)"]),
    (dict(wrong=10 ** 6), ["wrong", "1000000", "vocabulary"]),
    (dict(answer=-1), ["answer", "-1"]),
    (dict(clean=[1, 403, 407, 9999]), ["clean[3]", "9999", "vocabulary"]),
    (dict(positions=[9]), ["positions", "9", "4 tokens"]),
    (dict(positions="first"), ["positions", "'first'"]),
    (dict(positions="2:9"), ["positions", "span [2, 9)", "4 tokens"]),
    (dict(positions=[]), ["positions", "empty"]),
    (dict(batch_tokens=0), ["batch_tokens", "got 0"]),
    (dict(corrupted=[1, 403, 407, 261]), ["prompts are the same 4 tokens", "0/0"]),
    (dict(answer=5, wrong=5), ["answer and wrong are the same token 5"]),
])
def test_errors_name_the_argument(model, kwargs, names):
    args = dict(clean=[1, 403, 407, 261], corrupted=[1, 403, 407, 262])
    args.update(kwargs)
    with pytest.raises(ValueError) as e:
        model.patch(**args)
    assert isinstance(e.value, loom.InvalidArgumentError)
    for n in names:
        assert n in str(e.value), (n, str(e.value))


@pytest.mark.parametrize("kwargs,name", [
    (dict(clean=1.5), "clean"),
    (dict(corrupted=None), "corrupted"),
    (dict(positions=1.5), "positions"),
    (dict(hooks=3), "hooks"),
    (dict(answer="A"), "answer"),
])
def test_wrong_types_are_type_errors(model, kwargs, name):
    args = dict(clean=[1, 403, 407, 261], corrupted=[1, 403, 407, 262])
    args.update(kwargs)
    with pytest.raises(TypeError, match="^" + name + ": "):
        model.patch(**args)


def test_progress_bar_over_the_cells(model, capfd):
    args = dict(clean=[1, 403, 407, 261], corrupted=[1, 403, 407, 262])
    model.patch(**args)  # stderr captured: not a terminal, no bar
    assert "patch [" not in capfd.readouterr().err
    r = model.patch(**args, progress=True)
    err = capfd.readouterr().err
    cells = len(r["hooks"]) * len(r["positions"])
    assert "patch [" in err and "%d/%d cells" % (cells, cells) in err, err


def test_cli_bare_sites_take_layers_as_extract(tmp_path):
    # `loom patch --hooks hook_resid_pre --layers 0,-1` is extract's --hooks /
    # --layers pair: the same grid as the two hooks named in full.
    clean, corrupted = "1,403,407,261", "1,403,407,262"
    bare, _ = cli_patch(tmp_path / "bare", "--clean-tokens", clean, "--corrupted-tokens",
                        corrupted, "--hooks", "hook_resid_pre", "--layers", "0,-1")
    full, _ = cli_patch(tmp_path / "full", "--clean-tokens", clean, "--corrupted-tokens",
                        corrupted, "--hooks", "blocks.0.hook_resid_pre,blocks.4.hook_resid_pre")
    assert bare["hooks"] == ["blocks.0.hook_resid_pre", "blocks.4.hook_resid_pre"]
    assert bare["hooks"] == full["hooks"] and bare["recovery"] == full["recovery"]
