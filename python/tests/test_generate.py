"""Model.generate continues a prompt as `loom generate` does, on the model
already loaded: the same token ids, text and stop reason (greedy, sampled,
stop strings, a full context), and with hooks the same hidden states, bit
for bit, as `loom generate --hooks --json`."""

import json

import numpy as np
import pytest

import loom
from conftest import STORIES, run_loom

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def model():
    # One thread here and in the CLI: generation is many tiny forwards, whose
    # OpenMP barriers cost most when other processes hold the cores.
    return loom.Model(STORIES, threads=1)


def cli_generate(*args):
    return json.loads(run_loom("generate", "--model", STORIES, "--precision", "auto", "--json",
                               "--threads", "1", *args).stdout)


def test_greedy_equals_hugging_face_and_the_cli(model):
    with open(STORIES + "/reference/greedy.json", encoding="utf-8") as f:
        ref = json.load(f)
    before = loom._loom._load_count()
    got = model.generate(ref["prompt"], max_tokens=ref["max_new_tokens"])
    assert loom._loom._load_count() == before  # no second load
    assert isinstance(got, loom.GenerateResult)
    assert got["prompt_ids"] + got["token_ids"] == ref["greedy_ids"]
    assert model.decode(got["prompt_ids"] + got["token_ids"],
                        skip_special_tokens=True) == ref["generated_text"]
    assert ref["generated_text"].endswith(got.text)
    cli = cli_generate("--prompt", ref["prompt"], "--max-tokens", ref["max_new_tokens"])
    assert got == cli
    # Token ids as the prompt: the same continuation.
    ids = model.generate(ref["prompt_ids"], max_tokens=ref["max_new_tokens"])
    assert ids["token_ids"] == got["token_ids"] and ids["prompt"] == ref["prompt_ids"]


@pytest.mark.parametrize("kw,flags", [
    (dict(temperature=0.9, top_k=40, top_p=0.9, seed=7, max_tokens=24),
     ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.9", "--seed", "7",
      "--max-tokens", "24"]),
    (dict(temperature=1.0, seed=3, max_tokens=48, stop=["park", "ball", "Lily"]),
     ["--temperature", "1.0", "--seed", "3", "--max-tokens", "48", "--stop", "park",
      "--stop", "ball", "--stop", "Lily"]),
    (dict(max_tokens=64, ctx=12, prefill_chunk=2),
     ["--max-tokens", "64", "--ctx", "12", "--prefill-chunk", "2"]),
])
def test_sampling_stops_and_context_equal_the_cli(model, kw, flags):
    got = model.generate(PROMPT, **kw)
    assert got == cli_generate("--prompt", PROMPT, *flags)
    if "ctx" in kw:
        assert got["stop_reason"] == "context"
        assert len(got["prompt_ids"]) + len(got["token_ids"]) == kw["ctx"] + 1


def test_hidden_states_equal_the_cli_bit_for_bit(model):
    hooks = ["blocks.{0.5}.hook_resid_post", "blocks.-1.attn.hook_z", "ln_final.hook_normalized"]
    selects = ["last", "first", "mean", "max", "all", "pos:0,-1", "span:1:-2"]
    got = model.generate(PROMPT, max_tokens=6, hooks=hooks, select=selects, prefill_chunk=3)
    flags = ["--hooks", ",".join(hooks), "--max-tokens", "6", "--prefill-chunk", "3"]
    for s in selects:
        flags += ["--select", s]
    cli = cli_generate("--prompt", PROMPT, *flags)
    acts = got.pop("activations")
    cli_acts = cli.pop("activations")
    assert got == cli
    assert got["activation_rows"] == len(got["prompt_ids"]) + 5
    assert len(acts) == len(hooks) * len(selects)
    for hook, per in cli_acts.items():
        for spec, arr in per.items():
            want = np.asarray(arr["data"] if isinstance(arr, dict) else arr, np.float32)
            if isinstance(arr, dict):
                want = want.reshape(arr["shape"])
            a = acts[hook, spec]
            assert a.dtype == np.float32 and a.shape == want.shape, (hook, spec)
            assert a.tobytes() == want.tobytes(), (hook, spec)
    # Keys: the scheme of extract, with the same lookups.
    assert "blocks.2.hook_resid_post.pos_0_-1" in acts
    assert acts["blocks.{0.5}.hook_resid_post.all"].shape == (got["activation_rows"], 64)
    assert acts["blocks.4.attn.hook_z", "last"].shape == (1, 64)


def test_prompt_only_hidden_states_match_extract(model):
    got = model.generate(PROMPT, max_tokens=0, hooks="blocks.3.hook_resid_post", select="all")
    assert got["token_ids"] == [] and got["stop_reason"] == "prompt"
    cli = cli_generate("--prompt", PROMPT, "--max-tokens", "0")
    assert model.generate(PROMPT, max_tokens=0) == cli
    rows = got["activations"]["blocks.3.hook_resid_post"]
    assert got["activation_rows"] == rows.shape[0] == len(model.tokenize(PROMPT))
    ref = model.extract(PROMPT, "blocks.3.hook_resid_post", select="all")
    # The prompt's rows from generate's prefill and from extract: the same
    # bytes (batch invariance).
    np.testing.assert_array_equal(rows, ref["blocks.3.hook_resid_post"])


def test_sampling_keywords_are_the_parameter_table():
    # Model.generate's sampling keywords and defaults are the library's
    # generation parameters (src/eval/params.h): `loom generate`'s flags and
    # loom serve's fields of the same names.
    import inspect
    keywords = inspect.signature(loom.Model.generate).parameters
    for name, default in loom._loom._params("generation").items():
        assert name in keywords, name
        want = None if default == [] else default
        assert keywords[name].default == want, name


def test_sampling_ranges_are_the_parameter_table(model):
    for kwargs, message in [
            (dict(top_p=0), r"^top_p: got 0, expected a number in \(0, 1\]"),
            (dict(temperature=3), r"^temperature: got 3, expected a number in \[0, 2\]"),
            (dict(top_k=-1), r"^top_k: got -1, expected an integer in \[0, 1073741824\]"),
            (dict(max_tokens=-2), r"^max_tokens: got -2, expected an integer in \[0, "),
            (dict(seed=-1), r"^seed: -1 is outside \[0, 2\^64\)")]:
        with pytest.raises(loom.InvalidArgumentError, match=message):
            model.generate(PROMPT, **kwargs)


def test_errors_name_the_python_arguments(model):
    with pytest.raises(loom.InvalidArgumentError, match="^hooks: blocks.0.attn.hook_pattern"):
        model.generate(PROMPT, hooks="blocks.0.attn.hook_pattern")
    with pytest.raises(loom.InvalidArgumentError, match=r"more than the context \(ctx\) of 3"):
        model.generate(PROMPT, ctx=3)
    with pytest.raises(loom.InvalidArgumentError, match="^layers: "):
        model.generate(PROMPT, layers=[0])
    with pytest.raises(loom.InvalidArgumentError, match=r"^prompt\[1\]: token id -1"):
        model.generate([1, -1])
    with pytest.raises(loom.InvalidArgumentError, match="outside the vocabulary"):
        model.generate([1, 600])
    with pytest.raises(TypeError, match="^prompt: expected a str or a sequence"):
        model.generate(3)
    with pytest.raises(TypeError, match=r"got a list of 2 prompts \(str first\).*once per prompt"):
        model.generate(["a", "b"])
    with pytest.raises(TypeError, match=r"got a tuple of 1 prompts \(list first\)"):
        model.generate(([1, 2],))
    with pytest.raises(loom.InvalidArgumentError, match="^prompt: empty text"):
        model.generate("")
    with pytest.raises(loom.InvalidArgumentError, match="selector"):
        model.generate(PROMPT, max_tokens=2, hooks="blocks.0.hook_resid_post", select="pos:40")
