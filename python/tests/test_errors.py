"""Errors are Python exceptions carrying Loom's message and status code."""

import os

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
    with pytest.raises(loom.InvalidArgumentError, match="--dtype"):
        model.extract(PROMPTS, "blocks.1.hook_resid_post", dtype="f64")
    with pytest.raises(loom.InvalidArgumentError, match="protocol"):
        model.perplexity("Once upon a time", protocol="nope")
    with pytest.raises(loom.InvalidArgumentError):
        loom.Model(STORIES, precision="f8")
    with pytest.raises(TypeError):
        model.extract([3.5], "blocks.1.hook_resid_post")
    # The model is still usable after errors.
    assert model.extract(PROMPTS[:1], "blocks.1.hook_resid_post")["blocks.1.hook_resid_post"].shape == (1, 64)


def test_unknown_isa_cap_is_refused_like_the_cli(monkeypatch):
    monkeypatch.setenv("LOOM_CPU_ISA", "avx9000")
    with pytest.raises(loom.InvalidArgumentError, match="LOOM_CPU_ISA='avx9000'") as e:
        loom.Model(STORIES)
    cli = run_loom("devices", check=False)
    assert cli.returncode == 2
    assert str(e.value) in cli.stderr, (str(e.value), cli.stderr)
