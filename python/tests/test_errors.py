"""Errors are Python exceptions carrying Loom's message and status code."""

import inspect
import json
import os
import types

import numpy as np
import pytest

import loom
from conftest import PROMPTS, STORIES, run_loom


def test_exception_classes():
    assert issubclass(loom.LoomError, RuntimeError)
    assert issubclass(loom.InvalidArgumentError, loom.LoomError)
    assert issubclass(loom.InvalidArgumentError, ValueError)
    assert issubclass(loom.NotFoundError, loom.LoomError)
    assert issubclass(loom.NotFoundError, FileNotFoundError)
    assert issubclass(loom.ResourceExhaustedError, loom.LoomError)
    assert issubclass(loom.ResourceExhaustedError, MemoryError)
    assert loom.LoomError.__module__ == "loom"


def test_bad_hook_is_invalid_argument_with_loms_message(model, tmp_path):
    with pytest.raises(loom.InvalidArgumentError) as e:
        model.extract(PROMPTS, "blocks.1.hook_no_such_thing")
    assert e.value.code == "INVALID_ARGUMENT"
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    cli = run_loom("extract", "--model", STORIES, "--input", inp, "--out", tmp_path / "o",
                   "--hooks", "blocks.1.hook_no_such_thing", check=False)
    assert cli.returncode != 0
    assert str(e.value) in cli.stderr, (str(e.value), cli.stderr)


def test_missing_model_is_not_found(tmp_path):
    missing = tmp_path / "no-model-here"
    with pytest.raises(loom.NotFoundError) as e:
        loom.Model(missing)
    assert isinstance(e.value, FileNotFoundError)
    assert e.value.code == "NOT_FOUND"
    assert os.fspath(missing) in str(e.value)


def test_plan_that_does_not_fit_is_resource_exhausted(model):
    with pytest.raises(loom.ResourceExhaustedError) as e:
        loom.Model(STORIES, device="cpu=64KiB")
    assert isinstance(e.value, MemoryError)
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert "does not fit" in str(e.value) or "fit" in str(e.value)


def test_bad_options_raise_value_errors(model):
    with pytest.raises(loom.InvalidArgumentError, match="selector"):
        model.extract(PROMPTS, "blocks.1.hook_resid_post", select="middle")
    with pytest.raises(loom.InvalidArgumentError, match="^dtype: 'f64' is not one of 'f32'"):
        model.extract(PROMPTS, "blocks.1.hook_resid_post", dtype="f64")
    with pytest.raises(loom.InvalidArgumentError, match="protocol"):
        model.perplexity("Once upon a time", protocol="nope")
    with pytest.raises(loom.InvalidArgumentError):
        loom.Model(STORIES, precision="f8")
    with pytest.raises(TypeError, match=r"^prompts\[0\]: expected a str or a sequence"):
        model.extract([3.5], "blocks.1.hook_resid_post")
    # The model is still usable after errors.
    assert model.extract(PROMPTS[:1], "blocks.1.hook_resid_post")["blocks.1.hook_resid_post"].shape == (1, 64)


def test_window_and_extract_keywords_are_the_parameter_table(model):
    # Model.perplexity's window keywords, defaults and ranges are the
    # library's window parameters (src/eval/params.h), as `loom perplexity`'s
    # flags are; 0 asks for the computed default where the flag is left out.
    keywords = inspect.signature(loom.Model.perplexity).parameters
    for name, default in loom._loom._params("windows").items():
        assert name in keywords, name
        assert keywords[name].default == default, name
    for kwargs, message in [
            (dict(ctx=1), r"^ctx: got 1, expected an integer >= 2, or 0 \(the default\)"),
            (dict(stride=-1), r"^stride: got -1, expected an integer >= 1, or 0"),
            (dict(chunk_rows=0), r"^chunk_rows: got 0, expected an integer >= 1$")]:
        with pytest.raises(loom.InvalidArgumentError, match=message):
            model.perplexity("Once upon a time", **kwargs)
    keywords = inspect.signature(loom.Model.extract).parameters
    for name, default in loom._loom._params("extract_rows").items():
        assert name in keywords, name
        assert keywords[name].default == default, name
    for kwargs, message in [
            (dict(batch_tokens=-1), r"^batch_tokens: got -1, expected an integer >= 1, or 0"),
            (dict(commit_every=0), r"^commit_every: got 0, expected an integer >= 1$"),
            (dict(streaming_chunk_size=-4), r"^streaming_chunk_size: got -4, expected an integer >= 0$"),
            (dict(on_error="maybe"), r"on_error 'maybe'|on-error 'maybe'|'maybe'")]:
        with pytest.raises(loom.InvalidArgumentError, match=message):
            model.extract(PROMPTS, "blocks.1.hook_resid_post", **kwargs)
    # Model.lens_grid's topk and kl are `loom lens`'s --topk and --kl.
    keywords = inspect.signature(loom.Model.lens_grid).parameters
    for name, default in loom._loom._params("lens_grid").items():
        assert name in keywords, name
        assert keywords[name].default == default, name
    with pytest.raises(loom.InvalidArgumentError, match=r"^topk: got 0, expected an integer >= 1"):
        model.lens_grid([1, 403, 407], topk=0)
    with pytest.raises(loom.InvalidArgumentError, match="no parameter group"):
        loom._loom._params("nope")


def test_placement_keywords_are_the_parameter_table(tmp_path):
    # loom.plan's placement keywords are the table's (as `loom plan`'s flags
    # are), Model's the ones a loaded model takes; device "auto" is the
    # table's empty list (this machine's RAM).
    placement = loom._loom._params("placement")
    plan_keywords = inspect.signature(loom.plan).parameters
    model_keywords = inspect.signature(loom.Model).parameters
    for name in ["device", "max_memory", "reserve", "offload"]:
        assert name in plan_keywords, name
    for name in ["device", "max_memory", "reserve"]:
        assert name in model_keywords, name
    assert placement["device"] == [] and plan_keywords["device"].default == "auto"
    assert placement["offload"] is plan_keywords["offload"].default is False
    assert placement["max_memory"] == plan_keywords["max_memory"].default == ""
    with pytest.raises(TypeError, match="offload"):
        loom.plan(str(tmp_path), offload="yes")
    with pytest.raises(TypeError, match="max_memory"):
        loom.plan(str(tmp_path), max_memory=5)


def test_model_keywords_are_the_parameter_table(tmp_path):
    # threads and hf_bf16 are read by the model group's declarations, with
    # the range `loom --threads` checks, before anything is loaded.
    with pytest.raises(loom.InvalidArgumentError,
                       match=r"threads: got -1, expected an integer in \[0, 4096\]"):
        loom.Model(str(tmp_path), threads=-1)
    with pytest.raises(loom.InvalidArgumentError, match="threads: got 5000"):
        loom.Model(str(tmp_path), threads=5000)
    with pytest.raises(TypeError, match="hf_bf16"):
        loom.Model(str(tmp_path), hf_bf16="yes")


def test_unknown_isa_cap_is_refused_like_the_cli(monkeypatch):
    monkeypatch.setenv("LOOM_CPU_ISA", "avx9000")
    with pytest.raises(loom.InvalidArgumentError, match="LOOM_CPU_ISA='avx9000'") as e:
        loom.Model(STORIES)
    cli = run_loom("devices", check=False)
    assert cli.returncode == 2
    assert str(e.value) in cli.stderr, (str(e.value), cli.stderr)


@pytest.fixture(scope="module")
def model1():
    # One thread: the calls below compare Python with Python, and are many
    # small forwards (OpenMP's barriers cost most on a busy machine).
    return loom.Model(STORIES, threads=1)


def fake_torch_dtype(name):
    """An object typed as torch's dtype class (torch itself is not needed)."""
    cls = types.new_class("dtype")
    cls.__module__ = "torch"
    cls.__str__ = lambda self: "torch." + name
    return cls()


@pytest.mark.parametrize("want,spellings", [
    ("f16", [np.float16, np.dtype("float16"), "float16", "fp16", "half", "F16", "torch.float16",
             fake_torch_dtype("float16"), fake_torch_dtype("half")]),
    ("bf16", ["bfloat16", "BF16", "torch.bfloat16", fake_torch_dtype("bfloat16")]),
    ("f32", [np.float32, np.dtype("<f4"), "float32", "fp32", "float", "torch.float32"]),
])
def test_dtypes_take_numpy_torch_and_alias_spellings(model1, want, spellings):
    model = model1
    hook = "blocks.1.hook_resid_post"
    ref = model.extract(PROMPTS[:2], hook, dtype=want)
    plan_ref = loom.plan(STORIES, hooks=hook, dtype=want, kv_dtype=want, assume_dtype=want)
    for spelling in spellings:
        got = model.extract(PROMPTS[:2], hook, dtype=spelling)
        assert got.dtype == ref.dtype, spelling
        assert got[hook].tobytes() == ref[hook].tobytes(), spelling
        assert loom.plan(STORIES, hooks=hook, dtype=spelling, kv_dtype=spelling,
                         assume_dtype=spelling) == plan_ref, spelling


def test_precision_takes_the_same_spellings():
    for spelling in [np.float32, "float32", "fp32", fake_torch_dtype("float32"), "auto"]:
        assert loom.Model(STORIES, precision=spelling).compute_dtype == "F32", spelling
    with pytest.raises(loom.InvalidArgumentError, match="^precision: 'int8' is not one of"):
        loom.Model(STORIES, precision=np.int8)


def test_wrong_dtypes_name_the_argument(model1):
    model = model1
    hook = "blocks.1.hook_resid_post"
    with pytest.raises(TypeError, match="^dtype: expected a dtype name"):
        model.extract(PROMPTS[:1], hook, dtype=5)
    with pytest.raises(TypeError, match="^dtype: expected a dtype name"):
        model.extract(PROMPTS[:1], hook, dtype=[np.float16])
    with pytest.raises(loom.InvalidArgumentError, match="^dtype: 'float64' is not one of") as e:
        model.extract(PROMPTS[:1], hook, dtype=np.float64)
    assert e.value.code == "INVALID_ARGUMENT" and isinstance(e.value, ValueError)
    with pytest.raises(TypeError, match="^kv_dtype: expected a dtype name"):
        loom.plan(STORIES, kv_dtype=3)


def test_a_str_that_is_not_unicode_is_a_clear_error(model1, tmp_path):
    model = model1
    with pytest.raises(loom.InvalidArgumentError, match=r"^text: .*lone surrogate \(U\+DCFF at "
                                                        r"index 1\)") as e:
        model.tokenize("a\udcff")
    assert isinstance(e.value, ValueError) and "Unable to cast" not in str(e.value)
    # Replaced as the undecodable byte it escapes is, as the CLI replaces it.
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"a\xff")
    cli = json.loads(run_loom("tokenize", STORIES, "--file", raw, "--json",
                              "--replace-invalid-utf8").stdout)["ids"]
    assert model.tokenize("a\udcff", replace_invalid_utf8=True) == cli
    assert model.tokenize(b"a\xff", replace_invalid_utf8=True) == cli
    # A prompt is a bad row (on_error decides), or replaced on request.
    with pytest.raises(loom.InvalidArgumentError, match="^prompt 1: .*UTF-8"):
        model.extract(["ok", "a\udcff"], "logits")
    got = model.extract(["ok", "a\udcff"], "logits", on_error="skip")
    assert [r["status"] for r in got.rows] == ["ok", "skipped"]
    got = model.extract(["ok", "a\udcff"], "logits", replace_invalid_utf8=True)
    assert [r["tokens"] for r in got.rows] == [len(model.tokenize("ok")), len(cli)]
    with pytest.raises(loom.InvalidArgumentError, match="^text: .*lone surrogate"):
        model.perplexity("Once upon a time \ud800 there")


# A valid value of every argument of every entry point, and the call that
# uses them (the wrong-type audit below replaces one at a time).
VALID = {
    "loom.Model": (lambda **kw: loom.Model(**kw),
                   dict(path=STORIES, device="auto", precision="auto", max_memory=None,
                        reserve=None, threads=0, hf_bf16=False)),
    "tokenize": ("tokenize", dict(text="Once", add_special_tokens=True,
                                  replace_invalid_utf8=False)),
    "decode": ("decode", dict(ids=[1, 403], skip_special_tokens=False)),
    "to_str_tokens": ("to_str_tokens", dict(text_or_ids=[1, 403], add_special_tokens=True)),
    "extract": ("extract", dict(prompts=["Once"], hooks="logits", layers=None, select="last",
                                dtype=None, template=None, add_bos="auto", batch_tokens=0,
                                commit_every=256, on_error="fail", streaming_chunk_size=0,
                                max_row_tokens=0, replace_invalid_utf8=False,
                                grad_of=None, answer=None, wrong=None)),
    "perplexity": ("perplexity", dict(text="Once upon a time", protocol="hf-stride", ctx=0,
                                      stride=0, max_windows=0, add_bos="auto", chunk_rows=256)),
    "perplexity(tokens)": ("perplexity", dict(tokens=[1, 403, 407])),
    "generate": ("generate", dict(prompt="Once", max_tokens=2, temperature=0.0, top_k=0,
                                  top_p=1.0, seed=0, stop=None, ctx=0, prefill_chunk=256,
                                  hooks="blocks.0.hook_resid_post", layers=None,
                                  select="last")),
    "patch": ("patch", dict(clean=[1, 403, 407], corrupted=[1, 403, 408],
                            hooks="blocks.0.hook_resid_pre", positions="all", answer=None,
                            wrong=None, batch_tokens=None)),
    "attribute": ("attribute", dict(clean=[1, 403, 407], corrupted=[1, 403, 408],
                                    hooks="blocks.0.hook_resid_pre", positions="all",
                                    metric="logit-diff", answer=None, wrong=None, freeze=[],
                                    per_head=False, check_top=0, method="atp")),
    "integrated_gradients": ("integrated_gradients",
                             dict(prompt=[1, 403, 407], metric="logit-diff", answer=None,
                                  wrong=None, steps=4, baseline_token=0, freeze=[])),
    "grad": ("grad", dict(prompt=[1, 403, 407], hooks="blocks.0.hook_resid_pre",
                          metric="logprob", answer=None, wrong=None, freeze=[])),
    "inject_grad": ("inject_grad",
                    dict(prompt=[1, 403, 407],
                         injections={"blocks.1.hook_resid_post": np.zeros((3, 64), np.float32)},
                         hooks="blocks.0.hook_resid_pre", freeze=[])),
    "lens": ("lens", dict(x=np.zeros(64, np.float32), hook="blocks.0.hook_resid_post",
                          topk=3, tuned=None, logits=False)),
    "lens_grid": ("lens_grid", dict(prompt=[1, 403, 407], hooks=None, layers=None, topk=3,
                                    tuned=None, kl=True)),
    "loom.plan": (lambda **kw: loom.plan(**kw),
                  dict(path=STORIES, device="auto", max_memory="", reserve="", offload=False,
                       hooks=None, layers=None, select="all", mode="analysis", batch_tokens=0,
                       ctx=0, seqs_per_batch=0, dtype="f32", capture_to="host",
                       capture_buffers=1, logits=False, logits_chunk=256, kv_dtype="",
                       kv_context=0, assume_dtype="", strategy="balanced",
                       layers_per_device="", solve="")),
    "loom.open_activations": (lambda **kw: loom.open_activations(**kw),
                              dict(out_dir="/nonexistent")),
    "loom.bf16_to_float32": (lambda **kw: loom.bf16_to_float32(**kw),
                             dict(bits=np.zeros(2, np.uint16))),
}


class Unconvertible:
    """No argument of Loom's takes this."""


def test_every_argument_of_the_wrong_type_is_a_type_error_naming_it(model1):
    model = model1
    # Every public entry point is covered, with all of its arguments.
    covered = {name for name, (call, _) in VALID.items() if isinstance(call, str)}
    public = {n for n, f in inspect.getmembers(loom.Model, callable)
              if not n.startswith("_") and n != "plan"}
    assert public <= covered, public - covered
    for name, (call, kwargs) in VALID.items():
        f = getattr(model, call) if isinstance(call, str) else call
        params = (inspect.signature(getattr(loom.Model, call)).parameters
                  if isinstance(call, str) else kwargs)
        for arg in params:
            if arg == "self" or arg not in kwargs or (name == "perplexity" and arg == "tokens"):
                continue
            bad = dict(kwargs, **{arg: Unconvertible()})
            with pytest.raises(TypeError) as e:
                f(**bad)
            message = str(e.value)
            assert message.startswith(arg + ": ") or message.startswith(arg + "["), (
                name, arg, message)
            for dump in ("incompatible function arguments", "Unable to cast", "C++ type"):
                assert dump not in message, (name, arg, message)
    for name, (call, kwargs) in VALID.items():  # the valid values are valid
        if name not in ("loom.open_activations",):
            (getattr(model, call) if isinstance(call, str) else call)(**kwargs)


def test_errors_name_python_arguments_not_cli_flags(model1):
    model = model1
    cases = [
        (lambda: model.perplexity("Once upon a time", ctx=600), "ctx"),
        (lambda: model.extract(PROMPTS[:1], "hook_resid_post"), "layers"),
        (lambda: model.extract(PROMPTS[:1], []), "hooks"),
        (lambda: model.extract(PROMPTS[:1], "logits", select=[]), "select"),
        (lambda: model.extract(["a b c d e f g"], "logits", batch_tokens=4), "batch_tokens"),
        (lambda: loom.plan(STORIES, strategy="manual"), "layers_per_device"),
        (lambda: model.extract(["a"], "logits", batch_tokens=64, max_row_tokens=8),
         "max_row_tokens"),
        (lambda: model.generate("Once upon a time", ctx=3), "ctx"),
        (lambda: model.generate("Once", layers=1), "layers"),
    ]
    for call, arg in cases:
        with pytest.raises(loom.LoomError) as e:
            call()
        message = str(e.value)
        assert arg in message and "--" not in message, message
