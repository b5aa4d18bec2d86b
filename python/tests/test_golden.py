"""loom.Model.extract against Hugging Face's goldens (../shared/golden, see
its README): a tiny llama, token-id prompts, every residual stream, the final
norm and the logits, at tests/golden_parity_test.cc's f32 tolerances (atol
1e-4, rtol 1e-4). Skipped, saying so, when ../shared is absent."""

import json
import os

import numpy as np
import pytest

import loom
from loom.activations import read_safetensors
from conftest import SHARED

GOLDEN = os.path.join(SHARED, "golden", "tiny", "llama")


@pytest.fixture(scope="module")
def golden():
    if not os.path.isdir(GOLDEN):
        pytest.skip("SKIPPED LOUDLY: no goldens at %s (../shared is absent); the Python "
                    "module's values are not compared with Hugging Face here" % GOLDEN)
    tensors, _ = read_safetensors(os.path.join(GOLDEN, "goldens_f32.safetensors"))
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        manifest = json.load(f)
    return tensors, manifest


def close(actual, expected, what, atol=1e-4, rtol=1e-4):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, "%s: shape %s vs %s" % (what, actual.shape,
                                                                  expected.shape)
    bad = np.abs(actual - expected) > atol + rtol * np.abs(expected)
    assert not bad.any(), "%s: %d of %d values outside atol %g rtol %g (max diff %g)" % (
        what, bad.sum(), bad.size, atol, rtol, np.abs(actual - expected).max())


def test_extract_matches_hf_goldens(golden):
    tensors, manifest = golden
    L = manifest["num_layers"]
    seqs = [s["name"] for s in manifest["sequences"] if s.get("has_full_logits")
            and s.get("has_all_hidden") and s["length"] > 1]
    assert seqs, "no sequences with hidden states and logits in the golden manifest"
    prompts = [[int(i) for i in np.asarray(tensors[s + ".input_ids"]).reshape(-1)] for s in seqs]
    model = loom.Model(GOLDEN, precision="f32")
    hooks = (["blocks.%d.hook_resid_pre" % k for k in range(L)] +
             ["blocks.%d.hook_resid_post" % (L - 1), "ln_final.hook_normalized", "logits"])
    got = model.extract(prompts, hooks, select="all")
    offsets = got["all.offsets"]
    assert list(np.diff(offsets)) == [len(p) for p in prompts]
    checked = 0
    for i, s in enumerate(seqs):
        rows = slice(offsets[i], offsets[i + 1])
        for k in range(L):
            close(got["blocks.%d.hook_resid_pre" % k][rows], tensors["%s.hidden.%d" % (s, k)][0],
                  "%s hidden.%d" % (s, k))
        close(got["blocks.%d.hook_resid_post" % (L - 1)][rows],
              tensors["%s.layer_out.%d" % (s, L - 1)][0], "%s layer_out" % s)
        close(got["ln_final.hook_normalized"][rows], tensors["%s.hidden.%d" % (s, L)][0],
              "%s final norm" % s)
        close(got["logits"][rows], tensors[s + ".logits"][0], "%s logits" % s)
        checked += 1
    assert checked == len(seqs) >= 3
