"""loom.open_activations reads `loom extract` outputs (npy and safetensors)
as numpy gives them."""

import json
import shutil

import numpy as np
import pytest

import loom
from conftest import PROMPTS, assert_same_bytes, cli_extract

HOOKS = ["blocks.0.hook_resid_post", "ln_final.hook_normalized"]
SELECTS = ["last", "pos:0,-1", "all", "span:1:-1"]


def test_npy_output_opens_as_memmaps(tmp_path):
    out = cli_extract(tmp_path, PROMPTS, HOOKS, SELECTS)
    acts = loom.open_activations(out)
    assert acts.complete and acts.rows == len(PROMPTS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert acts.manifest == manifest
    for entry in manifest["arrays"]:
        key = entry["file"][: -len(".npy")]
        a = acts[key]
        assert isinstance(a, np.memmap) or isinstance(a.base, np.memmap)
        assert_same_bytes(a, np.load(out / entry["file"]), key)
        assert acts[entry["hook"], entry["selector"]] is a
    assert_same_bytes(acts.offsets["all"], np.load(out / "all.offsets.npy"), "all")
    assert_same_bytes(acts.offsets["span_1_-1"], np.load(out / "span_1_-1.offsets.npy"), "span")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_safetensors_output_equals_npy_output(tmp_path, dtype):
    npy = cli_extract(tmp_path, PROMPTS, HOOKS, SELECTS, "--dtype", dtype, "--commit-every", "4",
                      name="npy")
    st = cli_extract(tmp_path, PROMPTS, HOOKS, SELECTS, "--dtype", dtype, "--commit-every", "4",
                     "--format", "safetensors", name="st")
    a, b = loom.open_activations(npy), loom.open_activations(st)
    assert sorted(a.arrays) == sorted(b.arrays)
    for key in a.arrays:
        assert len(b.shards[key]) == 2  # 6 rows, 4 per commit
        assert_same_bytes(b[key], a[key], key)
    for sel in a.offsets:
        assert_same_bytes(b.offsets[sel], a.offsets[sel], sel)
    if dtype == "bf16":
        bits = a[HOOKS[0] + ".last"]
        assert bits.dtype == np.uint16
        f = loom.bf16_to_float32(bits)
        assert f.dtype == np.float32
        assert np.array_equal(f.view(np.uint32) >> 16, bits.astype(np.uint32))


def test_incomplete_job_is_refused_or_opened_at_its_commit(tmp_path):
    out = cli_extract(tmp_path, PROMPTS, HOOKS[:1], ["last", "all"], "--commit-every", "4")
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    m = json.loads((partial / "manifest.json").read_text())
    # As a job killed after its first commit of 4 rows records it.
    m["complete"] = False
    m.pop("rows", None)
    m.pop("row_count", None)
    full_offsets = np.load(out / "all.offsets.npy")
    m["progress"]["rows_committed"] = 4
    m["progress"]["ragged_rows"] = {HOOKS[0] + ".all.npy": int(full_offsets[4])}
    (partial / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="not complete"):
        loom.open_activations(partial)
    acts = loom.open_activations(partial, allow_incomplete=True)
    assert acts.rows == 4 and not acts.complete
    full = loom.open_activations(out)
    assert_same_bytes(acts[HOOKS[0] + ".last"], full[HOOKS[0] + ".last"][:4], "last")
    assert_same_bytes(acts[HOOKS[0] + ".all"], full[HOOKS[0] + ".all"][: full_offsets[4]], "all")
    assert_same_bytes(acts.offsets["all"], full_offsets[:5], "offsets")


def test_not_an_output(tmp_path):
    with pytest.raises(FileNotFoundError):
        loom.open_activations(tmp_path)


def test_arrays_are_keyed_and_found_as_model_extract_keys_and_finds_them(model, tmp_path):
    hook, selects = "blocks.{0.5}.hook_resid_post", ["last", "pos:0,-1", "all"]
    out = cli_extract(tmp_path, PROMPTS[:3], [hook], selects)
    acts = loom.open_activations(out)
    got = model.extract(PROMPTS[:3], hook, select=selects)
    # One key scheme: Model.extract's keys are the files' names.
    assert sorted(got) == sorted(list(acts.keys()) + ["all.offsets"])
    key = "blocks.2.hook_resid_post.pos_0_-1"
    for spelling in [key, "blocks.{0.5}.hook_resid_post.pos:0,-1", "blocks.-3.hook_resid_post.pos_0_-1",
                     ("blocks.{0.5}.hook_resid_post", "pos:0,-1")]:
        assert acts[spelling] is acts.arrays[key], spelling
        assert spelling in acts and acts.key_of(spelling) == got.key_of(spelling) == key
        assert_same_bytes(acts[spelling], got[spelling], str(spelling))
    assert acts["all.offsets"] is acts.offsets["all"]
    with pytest.raises(KeyError, match="3 selectors"):
        acts[hook]
    with pytest.raises(KeyError, match="no such array"):
        acts["blocks.1.hook_resid_post.last"]
    assert acts.get("blocks.1.hook_resid_post.last") is None
