"""loom.Model's calls give the CLI's values: extract (byte for byte, every
selector kind, text and token-id prompts, f32/bf16/f16), tokenize,
perplexity, plan; the model is loaded once; arrays are handed over without
a copy."""

import json

import numpy as np
import pytest

import loom
from conftest import (PROMPTS, STORIES, assert_same_bytes, cli_extract, run_loom)

HOOKS = ["blocks.1.hook_resid_post", "blocks.4.hook_resid_post", "ln_final.hook_normalized"]


def test_tokenize_equals_cli(model):
    for text in ["Once upon a time, there was a little girl named Lily.", "Sam and  Tom\nran!", ""]:
        cli = json.loads(run_loom("tokenize", STORIES, "--text", text, "--json").stdout)
        assert model.tokenize(text) == cli["ids"], text
        cli = json.loads(run_loom("tokenize", STORIES, "--text", text, "--json",
                                  "--no-special").stdout)
        assert model.tokenize(text, add_special_tokens=False) == cli["ids"], text


@pytest.mark.parametrize("dtype", [None, "bf16", "f16"])
def test_extract_equals_cli_fixed_and_ragged(model, tmp_path, dtype):
    selects = ["last", "first", "mean", "max", "pos:0,-1", "all", "span:1:-1"]
    extra = ["--dtype", dtype] if dtype else []
    out = cli_extract(tmp_path, PROMPTS, HOOKS, selects, *extra)
    got = model.extract(PROMPTS, HOOKS, select=selects, dtype=dtype, bf16="bits")
    manifest = json.loads((out / "manifest.json").read_text())
    assert got.hooks == manifest["settings"]["hooks"]
    assert got.dtype == manifest["settings"]["output_dtype"]
    n_arrays = 0
    for entry in manifest["arrays"]:
        key = entry["file"][: -len(".npy")]
        assert_same_bytes(got[key], np.load(out / entry["file"]), key)
        n_arrays += 1
        if "offsets_file" in entry:
            sel = entry["offsets_file"][: -len(".offsets.npy")]
            assert_same_bytes(got[sel + ".offsets"], np.load(out / entry["offsets_file"]), sel)
            assert_same_bytes(got.offsets[entry["selector"]], np.load(out / entry["offsets_file"]),
                              sel)
    assert n_arrays == len(HOOKS) * len(selects)
    assert len(got) == n_arrays + 2  # + all.offsets, span_1_-1.offsets
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert got.rows == rows
    if dtype == "bf16":
        assert got[HOOKS[0] + ".last"].dtype == np.uint16
        f = loom.bf16_to_float32(got[HOOKS[0] + ".last"])
        assert f.dtype == np.float32 and np.all(np.isfinite(f))


def test_bf16_comes_back_as_a_dtype_numpy_computes_with(model, monkeypatch):
    bits = model.extract(PROMPTS[:2], HOOKS, select=["last", "all"], dtype="bf16",
                         bf16="bits")
    as_f32 = model.extract(PROMPTS[:2], HOOKS, select=["last", "all"], dtype="bf16",
                           bf16="float32")
    assert as_f32.dtype == "bfloat16"  # what the values are
    for key in bits:
        if key.endswith(".offsets"):
            assert as_f32[key].dtype == np.int64
            continue
        assert bits[key].dtype == np.uint16
        assert as_f32[key].dtype == np.float32
        np.testing.assert_array_equal(as_f32[key], loom.bf16_to_float32(bits[key]))
    # "auto": ml_dtypes.bfloat16 when installed (a view of the same bits),
    # else float32.
    import sys
    import types
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # not installed
    auto = model.extract(PROMPTS[:2], HOOKS[0], dtype="bf16")
    assert auto[HOOKS[0] + ".last"].dtype == np.float32
    fake = types.ModuleType("ml_dtypes")
    fake.bfloat16 = np.float16  # any 2-byte dtype stands in for it here
    monkeypatch.setitem(sys.modules, "ml_dtypes", fake)
    auto = model.extract(PROMPTS[:2], HOOKS[0], dtype="bf16")
    got = auto[HOOKS[0] + ".last"]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), bits[HOOKS[0] + ".last"])
    with pytest.raises(ValueError, match="bf16: expected 'auto', 'float32' or 'bits'"):
        model.extract(PROMPTS[:1], HOOKS[0], bf16="uint16")


def test_progress_bar_only_when_asked_or_on_a_terminal(model, capfd):
    model.extract(PROMPTS[:2], HOOKS[0])  # stderr captured: not a terminal
    assert "extract [" not in capfd.readouterr().err
    model.extract(PROMPTS[:2], HOOKS[0], progress=True)
    err = capfd.readouterr().err
    assert "extract [" in err and "2/2 prompts" in err, err
    with pytest.raises(TypeError, match="progress: expected a bool"):
        model.extract(PROMPTS[:1], HOOKS[0], progress="yes")


def test_attention_patterns_have_the_clis_width(model, tmp_path):
    # One batch-budget rule for both: a short input plans its own tokens, so
    # the pattern rows ([heads, keys]) are as wide in Python as on the CLI.
    hooks = ["blocks.0.attn.hook_pattern"]
    out = cli_extract(tmp_path, PROMPTS, hooks, ["all"])
    got = model.extract(PROMPTS, hooks, select="all")
    want = np.load(out / "blocks.0.attn.hook_pattern.all.npy")
    assert got["blocks.0.attn.hook_pattern.all"].shape == want.shape
    assert_same_bytes(got["blocks.0.attn.hook_pattern.all"], want, "pattern")
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert want.shape[-1] == min(settings["batch_tokens"], model.config["max_position_embeddings"])


def test_extract_keys_are_hook_dot_selector_for_one_selector_too(model, tmp_path):
    out = cli_extract(tmp_path, PROMPTS, HOOKS[:1], ["all"], "--batch-tokens", "48",
                      "--commit-every", "2")
    got = model.extract(PROMPTS, HOOKS[0], select="all", batch_tokens=48, commit_every=2)
    # One scheme whatever the type of `select` (a str or a list): the file
    # names of `loom extract`, as open_activations keys them.
    assert sorted(got) == sorted([HOOKS[0] + ".all", "all.offsets"])
    as_list = model.extract(PROMPTS, HOOKS[0], select=["all"], batch_tokens=48, commit_every=2)
    assert sorted(as_list) == sorted(got)
    assert sorted(loom.open_activations(out).keys()) == [HOOKS[0] + ".all"]
    assert_same_bytes(got[HOOKS[0] + ".all"], np.load(out / (HOOKS[0] + ".all.npy")), "all")
    # The hook alone still finds its one selector's array.
    assert got[HOOKS[0]] is got[HOOKS[0] + ".all"]
    assert_same_bytes(got["all.offsets"], np.load(out / "all.offsets.npy"), "offsets")
    offsets = got["all.offsets"]
    assert offsets[0] == 0 and offsets[-1] == got[HOOKS[0]].shape[0]
    assert [r["tokens"] for r in got.rows] == list(np.diff(offsets))


def test_extract_results_are_found_by_the_names_the_user_gave(model):
    got = model.extract(PROMPTS[:3], ["blocks.{0.5}.hook_resid_post", "blocks.-1.hook_mlp_out"],
                        select=["last", "pos:0,-1", "span:1:-1"])
    assert got.hooks == ["blocks.2.hook_resid_post", "blocks.4.hook_mlp_out"]
    last = got["blocks.2.hook_resid_post.last"]
    for spelling in ["blocks.{0.5}.hook_resid_post.last", "blocks.2.hook_resid_post.last",
                     "blocks.-3.hook_resid_post.last", ("blocks.{0.5}.hook_resid_post", "last")]:
        assert got[spelling] is last, spelling
        assert spelling in got
        assert got.key_of(spelling) == "blocks.2.hook_resid_post.last"
    pos = got["blocks.4.hook_mlp_out.pos_0_-1"]
    assert got["blocks.-1.hook_mlp_out.pos:0,-1"] is pos
    assert got["blocks.{1.0}.hook_mlp_out", "pos:0,-1"] is pos
    assert got["span:1:-1.offsets"] is got["span_1_-1.offsets"]
    assert got.offsets["span:1:-1"] is got.offsets["span_1_-1"]
    # Several selectors: the hook alone is ambiguous, and says so.
    with pytest.raises(KeyError, match="3 selectors"):
        got["blocks.{0.5}.hook_resid_post"]
    assert "blocks.{0.5}.hook_resid_post" not in got
    for missing in ["blocks.1.hook_resid_post.last", "blocks.{0.5}.hook_resid_post.mean",
                    "blocks.*.hook_resid_post.last", "nonsense"]:
        assert missing not in got and got.get(missing) is None
        with pytest.raises(KeyError, match="no such array"):
            got[missing]
    one = model.extract(PROMPTS[:3], "blocks.{0.5}.hook_resid_post", select="mean")
    assert one["blocks.{0.5}.hook_resid_post"] is one["blocks.2.hook_resid_post.mean"]


@pytest.mark.parametrize("layers,want", [
    ([0, -1], [0, 4]),
    ((0.5, 1.0), [2, 4]),
    (0.5, [2]),
    (1, [1]),  # the int 1 is layer 1 ...
    (1.0, [4]),  # ... the float 1.0 the last layer
    (np.int64(-2), [3]),
    ([np.float32(0.25), "3", "-1"], [1, 3, 4]),
    ("0,-1", [0, 4]),
    (range(2), [0, 1]),
])
def test_layers_take_ints_floats_strings_and_lists(model, layers, want):
    hooks = ["blocks.%d.hook_resid_post" % k for k in want]
    got = model.extract(PROMPTS[:2], "hook_resid_post", layers=layers)
    assert got.hooks == hooks
    assert loom.plan(STORIES, hooks="hook_resid_post", layers=layers) == loom.plan(
        STORIES, hooks=hooks)


def test_bad_layers_name_the_argument(model):
    with pytest.raises(TypeError, match=r"^layers\[1\]: expected an int"):
        model.extract(PROMPTS[:1], "hook_resid_post", layers=[0, None])
    with pytest.raises(TypeError, match="^layers: "):
        model.extract(PROMPTS[:1], "hook_resid_post", layers=True)
    with pytest.raises(loom.InvalidArgumentError, match="^layers: nan"):
        model.extract(PROMPTS[:1], "hook_resid_post", layers=float("nan"))
    with pytest.raises(loom.InvalidArgumentError, match="fraction 1.5 is outside"):
        model.extract(PROMPTS[:1], "hook_resid_post", layers=1.5)


def test_devices_are_where_the_layers_were_placed(model):
    # As `loom plan` places them (the CPU on a machine without a GPU).
    cli = json.loads(run_loom("plan", STORIES, "--json").stdout)
    placed = [d["name"] for d in cli["devices"] if d["computes"]]
    assert model.devices == placed
    assert model.devices == ["cpu"]


def test_hook_names_lists_the_models_hooks(model):
    names = model.hook_names
    assert names[0] == "hook_embed" and names[-2:] == ["ln_final.hook_normalized", "logits"]
    assert "hook_pos_embed" not in names  # llama: rotary, no learned positions
    per_layer = [n for n in names if n.startswith("blocks.0.")]
    assert per_layer[0] == "blocks.0.hook_resid_pre"
    assert per_layer[-1] == "blocks.0.hook_resid_post"
    assert "blocks.0.attn.hook_rot_q" in per_layer
    assert "blocks.0.ln1_post.hook_normalized" not in names
    assert len(names) == 1 + 5 * len(per_layer) + 2
    # Every hook listed but the attention pattern is extracted as named.
    rows = [n for n in names if not n.endswith("hook_pattern")]
    got = model.extract(PROMPTS[:1], rows, select="last")
    assert sorted(got.hooks) == sorted(rows)


def test_decode_and_to_str_tokens(model):
    with open(STORIES + "/tokenizer_test_vectors.json", encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    for case in cases:
        assert model.decode(case["ids"]) == case["decoded"], case["text"]
    ids = model.tokenize("Once upon a time, Lily.")
    assert model.decode(ids) == "<s> Once upon a time, Lily."
    assert model.decode(ids, skip_special_tokens=True) == "Once upon a time, Lily."
    assert model.decode(np.array(ids)) == model.decode(ids)
    pieces = model.to_str_tokens("Once upon a time, Lily.")
    assert pieces == model.to_str_tokens(ids) == [model.decode([i]) for i in ids]
    assert pieces[:3] == ["<s>", "Once", "upon"] and len(pieces) == len(ids)
    assert model.to_str_tokens("Lily", add_special_tokens=False) == ["Lily"]
    with pytest.raises(loom.InvalidArgumentError, match="^ids"):
        model.decode([1, 99999])
    with pytest.raises(TypeError, match=r"^ids\[1\]: expected an int"):
        model.decode([1, "a"])


def test_extract_bare_sites_with_layers_and_template(model, tmp_path):
    out = cli_extract(tmp_path, PROMPTS[:3], ["hook_resid_post"], ["mean"], "--layers",
                      "0.25,1.0", "--template", "Story: {text}")
    got = model.extract(PROMPTS[:3], "hook_resid_post", layers=["0.25", "1.0"], select="mean",
                        template="Story: {text}")
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(got) == [h + ".mean" for h in manifest["settings"]["hooks"]]
    for entry in manifest["arrays"]:
        assert_same_bytes(got[entry["file"][:-4]], np.load(out / entry["file"]), entry["hook"])


def test_bad_prompt_fails_or_is_skipped(model, tmp_path):
    prompts = ["A good one.", "", [1, 600], "Another."]
    with pytest.raises(loom.InvalidArgumentError, match="prompt 1: empty text"):
        model.extract(prompts, HOOKS[0])
    out = cli_extract(tmp_path, prompts, HOOKS[:1], ["last", "all"], "--on-error", "skip")
    got = model.extract(prompts, HOOKS[0], select=["last", "all"], on_error="skip")
    last = got[HOOKS[0] + ".last"]
    assert np.all(np.isnan(last[1])) and np.all(np.isnan(last[2]))
    assert np.all(np.isfinite(last[0])) and np.all(np.isfinite(last[3]))
    assert_same_bytes(last, np.load(out / (HOOKS[0] + ".last.npy")), "last")
    assert_same_bytes(got["all.offsets"], np.load(out / "all.offsets.npy"), "offsets")
    assert [r["status"] for r in got.rows] == ["ok", "skipped", "skipped", "ok"]
    assert "outside the vocabulary" in got.rows[2]["reason"]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert got.rows == rows


def test_arrays_are_handed_over_without_copy(model):
    got = model.extract(PROMPTS * 20, "logits", select="all")
    a = got["logits"]
    assert not a.flags.owndata
    assert type(a.base).__name__ == "PyCapsule"
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.shape == (int(got["all.offsets"][-1]), 512)
    # The buffer lives as long as the array does.
    view = a[5]
    del got, a
    assert np.all(np.isfinite(view))


def test_model_loads_once(model, tmp_path):
    before = loom._loom._load_count()
    m = loom.Model(STORIES)
    assert loom._loom._load_count() == before + 1
    first = m.extract(PROMPTS, HOOKS[0])
    m.perplexity("Once upon a time there was a cat.", ctx=8)
    m.tokenize("hello")
    m.plan()
    again = m.extract(PROMPTS, HOOKS[0])
    assert loom._loom._load_count() == before + 1
    assert_same_bytes(first[HOOKS[0]], again[HOOKS[0]], "second extract")


TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the sunshine. One day, she saw a big, red ball in the park. She ran to it and kicked "
        "it high into the sky. The ball flew over the trees and landed in a pond. ") * 3


@pytest.mark.parametrize("protocol,extra", [("hf-stride", ["--ctx", "64"]),
                                            ("llama-cpp", ["--ctx", "48"]),
                                            ("all-tokens", ["--ctx", "32", "--stride", "8"])])
def test_perplexity_equals_cli(model, tmp_path, protocol, extra):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    cli = json.loads(run_loom("perplexity", "--model", STORIES, "--text", path, "--json",
                              "--quiet", "--protocol", protocol, *extra).stdout)
    kw = dict(protocol=protocol, ctx=int(extra[1]))
    if "--stride" in extra:
        kw["stride"] = int(extra[3])
    got = model.perplexity(TEXT, **kw)
    for key in ("seconds", "tokens_per_second"):
        cli.pop(key), got.pop(key)
    assert got == cli


def test_perplexity_of_token_ids_equals_cli(model, tmp_path):
    ids = model.tokenize(TEXT)
    path = tmp_path / "ids.txt"
    path.write_text(" ".join(map(str, ids)))
    cli = json.loads(run_loom("perplexity", "--model", STORIES, "--tokens", path, "--json",
                              "--quiet", "--ctx", "64").stdout)
    got = model.perplexity(tokens=ids, ctx=64)
    for key in ("seconds", "tokens_per_second"):
        cli.pop(key), got.pop(key)
    assert got == cli
    assert got["bos"] is True and got["tokens"] == len(ids)


@pytest.mark.parametrize("flags,kw", [
    ([], {}),
    (["--hooks", "hook_resid_post", "--layers", "0,-1", "--select", "last", "--batch-tokens",
      "256", "--dtype", "bf16"],
     dict(hooks="hook_resid_post", layers=["0", "-1"], select="last", batch_tokens=256,
          dtype="bf16")),
    (["--device", "cpu=64MiB", "--solve", "max-batch-tokens", "--hooks", "logits"],
     dict(device="cpu=64MiB", solve="max-batch-tokens", hooks="logits")),
    (["--mode", "generation", "--ctx", "128", "--device", "cpu=1MiB"],
     dict(mode="generation", ctx=128, device="cpu=1MiB")),
])
def test_plan_equals_cli(model, flags, kw):
    cli = run_loom("plan", STORIES, "--json", *flags, check=False)
    assert cli.returncode in (0, 1), cli.stderr
    want = json.loads(cli.stdout)
    assert loom.plan(STORIES, **kw) == want
    assert model.plan(**kw) == want
    assert want["fits"] == (cli.returncode == 0)


def test_short_text_is_one_window_as_in_the_cli(model, tmp_path):
    text = "Once upon a time there was a cat."
    path = tmp_path / "short.txt"
    path.write_bytes(text.encode())
    cli = json.loads(run_loom("perplexity", "--model", STORIES, "--text", path, "--json",
                              "--quiet").stdout)
    got = model.perplexity(text)
    for key in ("seconds", "tokens_per_second"):
        cli.pop(key), got.pop(key)
    assert got == cli
    # Hugging Face's strided recipe: one window of the whole text, every
    # token after the first scored.
    assert got["windows"] == 1 and got["ctx"] == 512
    assert got["tokens_scored"] == got["tokens"] - 1 == len(model.tokenize(text)) - 1
    # A path (the file's bytes, as --text reads them) and bytes: the same.
    assert model.perplexity(path)["nll_sum"] == got["nll_sum"]
    assert model.perplexity(text.encode())["nll_sum"] == got["nll_sum"]
    with pytest.raises(loom.InvalidArgumentError, match="nothing to score"):
        model.perplexity(tokens=[1])
    # llama-cpp still needs a whole chunk; the error names ctx, not --ctx.
    with pytest.raises(loom.InvalidArgumentError) as e:
        model.perplexity(text, protocol="llama-cpp", ctx=64)
    assert "use a smaller ctx" in str(e.value) and "--" not in str(e.value)
