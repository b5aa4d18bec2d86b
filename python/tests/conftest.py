"""Shared fixtures of the Python module's tests (run by CTest, label
`python`, with PYTHONPATH=build/python and LOOM_BIN, LOOM_MODELS_DIR,
LOOM_SHARED_DIR set by python/CMakeLists.txt)."""

import json
import os
import subprocess

import numpy as np
import pytest

import loom

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = os.environ.get("LOOM_MODELS_DIR", os.path.join(REPO, "models"))
STORIES = os.path.join(MODELS, "stories260K")
# Absolute: test_docs runs commands from another working directory.
LOOM_BIN = os.path.abspath(os.environ.get("LOOM_BIN", os.path.join(REPO, "build", "loom")))
SHARED = os.environ.get("LOOM_SHARED_DIR", os.path.join(os.path.dirname(REPO), "shared"))

# Prompts of both kinds: texts (tokenized with BOS) and token ids as given.
PROMPTS = [
    "Once upon a time, there was a little girl named Lily.",
    [1, 403, 407, 261, 378, 275, 260, 429],
    "The cat sat on the mat. It was",
    "One day, Tom went to the park with his mom. They played on the swings and ate ice cream.",
    [1, 5, 6],
    "Sam",
]


def run_loom(*args, check=True):
    """Runs the loom binary; returns the CompletedProcess (text)."""
    p = subprocess.run([LOOM_BIN] + [str(a) for a in args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError("loom %s failed (%d):\n%s" % (" ".join(map(str, args)), p.returncode,
                                                           p.stderr))
    return p


def write_jsonl(path, prompts):
    """The prompts as `loom extract` input rows (id = row number)."""
    with open(path, "w", encoding="utf-8") as f:
        for i, p in enumerate(prompts):
            row = {"id": i, "text": p} if isinstance(p, str) else {"id": i, "tokens": list(p)}
            f.write(json.dumps(row) + "\n")


def cli_extract(tmp_path, prompts, hooks, selects, *extra, name="cli"):
    """`loom extract` on `prompts` into tmp_path/name; returns the directory."""
    inp = tmp_path / (name + ".jsonl")
    out = tmp_path / name
    write_jsonl(inp, prompts)
    args = ["extract", "--model", STORIES, "--input", inp, "--out", out, "--quiet",
            "--hooks", ",".join(hooks)]
    for s in selects:
        args += ["--select", s]
    run_loom(*args, *extra)
    return out


@pytest.fixture(scope="session")
def model():
    return loom.Model(STORIES)


def assert_same_bytes(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, "%s: dtype %s vs %s" % (what, a.dtype, b.dtype)
    assert a.shape == b.shape, "%s: shape %s vs %s" % (what, a.shape, b.shape)
    assert a.tobytes() == b.tobytes(), "%s: values differ (max abs diff %s)" % (
        what, np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0)
