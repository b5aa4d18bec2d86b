"""interventions=[...] of Model.extract, Model.perplexity and Model.generate
(docs/interventions.md): every single-run case of Hugging Face's intervention
goldens (../shared/golden/interventions, README there) through the Python
module in f32 at atol = rtol = 1e-4, the intervention's effect against HF's
too; a numpy vector is its .npy file bit for bit; perplexity and generation
under an intervention are the CLI's (`--intervene FILE`); and bad entries are
errors naming their field. The golden part is skipped, saying so, when
../shared is absent."""

import glob
import json
import math
import os

import numpy as np
import pytest

import loom
from loom.activations import read_safetensors
from conftest import SHARED, STORIES, run_loom

GOLDEN = os.path.join(SHARED, "golden", "interventions")
TOL = 1e-4
PROMPT = "Once upon a time"


def golden_cases():
    """The single-run cases (activation patching is `loom patch`'s)."""
    dirs = sorted(glob.glob(os.path.join(GOLDEN, "*__*")))
    return [d for d in dirs if os.path.isdir(d) and "activation_patch" not in d]


@pytest.fixture(scope="module")
def golden_models():
    if not os.path.isdir(GOLDEN):
        pytest.skip("SKIPPED LOUDLY: no intervention goldens at %s (../shared is absent); "
                    "interventions through the Python module are not compared with Hugging "
                    "Face here" % GOLDEN)
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = loom.Model(os.path.join(SHARED, "golden", "tiny", name),
                                     precision="f32")
        return cache[name]
    return get


def with_numpy_vectors(spec, case_dir):
    """The spec's interventions with each vector_file loaded as a numpy
    array (the Python way of giving a vector)."""
    out = []
    for entry in spec["interventions"]:
        entry = dict(entry)
        if "vector_file" in entry:
            entry["vector"] = np.load(os.path.join(case_dir, entry.pop("vector_file")))
        out.append(entry)
    return out


def check_rows(name, ours, ours_base, offsets, expected, baseline):
    """Ours (intervened, and not) against HF's (expected, baseline) over each
    row's valid tokens: the values, and the intervention's effect."""
    T = expected.shape[1]
    expected = np.asarray(expected, np.float64).reshape(expected.shape[0], T, -1)
    ours = np.asarray(ours, np.float64).reshape(ours.shape[0], -1)
    ours_base = np.asarray(ours_base, np.float64).reshape(ours_base.shape[0], -1)
    if baseline is not None:
        baseline = np.asarray(baseline, np.float64).reshape(expected.shape)
    for r in range(len(offsets) - 1):
        rows = slice(offsets[r], offsets[r + 1])
        n = offsets[r + 1] - offsets[r]
        a, e = ours[rows], expected[r, :n]
        assert a.shape == e.shape, "%s row %d: shape %s vs %s" % (name, r, a.shape, e.shape)
        over = np.abs(a - e) - (TOL + TOL * np.abs(e))
        assert over.max() <= 0, "%s row %d: beyond atol = rtol = 1e-4 by %g" % (
            name, r, over.max())
        if baseline is not None:
            da, de = a - ours_base[rows], e - baseline[r, :n]
            over = np.abs(da - de) - TOL * (1 + np.abs(de))
            assert over.max() <= 0, (
                "%s row %d: the intervention's effect differs from HF's by %g beyond the "
                "tolerance (HF's effect is up to %g)" % (name, r, over.max(), np.abs(de).max()))


def test_every_single_run_golden_case(golden_models):
    cases = golden_cases()
    assert len(cases) >= 15, "every single-run case of the README: %s" % cases
    for case_dir in cases:
        with open(os.path.join(case_dir, "spec.json"), encoding="utf-8") as f:
            spec = json.load(f)
        model = golden_models(spec["model"])
        L = model.config["num_layers"]
        mask = spec.get("attention_mask")
        prompts = [[int(t) for j, t in enumerate(row) if mask is None or mask[i][j] == 1]
                   for i, row in enumerate(spec["input_ids"])]
        extra = [iv["hook"] for iv in spec["interventions"] if "resid" not in iv["hook"]]
        hooks = ["blocks.*.hook_resid_pre", "blocks.*.hook_resid_post", "logits"] + extra
        on = model.extract(prompts, hooks, select="all",
                           interventions=with_numpy_vectors(spec, case_dir))
        off = model.extract(prompts, hooks, select="all")
        offsets = on["all.offsets"]
        assert list(np.diff(offsets)) == [len(p) for p in prompts]
        tensors, _ = read_safetensors(os.path.join(case_dir, "expected.safetensors"))
        pairs = [("logits", "logits")]
        for k in range(L):
            pairs += [("blocks.%d.hook_resid_pre" % k, "resid_pre.%d" % k),
                      ("blocks.%d.hook_resid_post" % k, "resid_post.%d" % k)]
        pairs += [(h, "hook." + h) for h in extra]
        for hook, key in pairs:
            assert key in tensors, "%s: no %s in expected.safetensors" % (case_dir, key)
            check_rows("%s %s" % (os.path.basename(case_dir), hook), on[hook], off[hook],
                       offsets, tensors[key], tensors.get("baseline." + key))


def test_a_golden_spec_is_itself_an_interventions_argument(golden_models, monkeypatch):
    # The loaded spec.json as it is (a document; vector_file relative to the
    # working directory), its list, and numpy vectors: the same bits.
    case_dir = os.path.join(GOLDEN, "llama__steer_add_positions")
    with open(os.path.join(case_dir, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    model = golden_models("llama")
    monkeypatch.chdir(case_dir)
    doc = model.extract(spec["input_ids"], "logits", select="all", interventions=spec)
    listed = model.extract(spec["input_ids"], "logits", select="all",
                           interventions=spec["interventions"])
    arrays = model.extract(spec["input_ids"], "logits", select="all",
                           interventions=with_numpy_vectors(spec, case_dir))
    assert doc["logits"].tobytes() == listed["logits"].tobytes() == arrays["logits"].tobytes()


# ---- stories260K: no ../shared needed ---------------------------------------

@pytest.fixture(scope="module")
def model():
    return loom.Model(STORIES, threads=1)


@pytest.fixture(scope="module")
def vector():
    v = np.random.default_rng(24).standard_normal(64).astype(np.float32)
    return v / np.linalg.norm(v)


def steer(v, scale=8.0, **extra):
    return dict(hook="blocks.2.hook_resid_post", mode="add", scale=scale, vector=v, **extra)


def write_intervention_file(tmp_path, v, name="steer", **extra):
    """An --intervene file with `v` as a .npy beside it; returns its path."""
    np.save(tmp_path / (name + ".npy"), v)
    entry = dict(steer(None, **extra), vector_file=name + ".npy")
    del entry["vector"]
    path = tmp_path / (name + ".json")
    path.write_text(json.dumps({"interventions": [entry]}))
    return path


def test_numpy_vector_equals_its_npy_file(model, vector, tmp_path, monkeypatch):
    np.save(tmp_path / "v.npy", vector)
    hooks = ["blocks.*.hook_resid_post", "logits"]
    base = model.extract(PROMPT, hooks, select="all")
    got = {}
    got["numpy"] = model.extract(PROMPT, hooks, select="all", interventions=[steer(vector)])
    got["[1, width]"] = model.extract(PROMPT, hooks, select="all",
                                      interventions=[steer(vector[None, :])])
    got["list"] = model.extract(PROMPT, hooks, select="all",
                                interventions=[steer([float(x) for x in vector])])
    got["float64"] = model.extract(PROMPT, hooks, select="all",
                                   interventions=[steer(vector.astype(np.float64))])
    absolute = dict(steer(None), vector_file=str(tmp_path / "v.npy"))
    del absolute["vector"]
    got["vector_file"] = model.extract(PROMPT, hooks, select="all", interventions=[absolute])
    monkeypatch.chdir(tmp_path)
    relative = dict(absolute, vector_file="v.npy")
    got["relative vector_file"] = model.extract(PROMPT, hooks, select="all",
                                                interventions=[relative])
    for key in ("blocks.4.hook_resid_post", "logits"):
        want = got["numpy"][key]
        assert not np.array_equal(want, base[key]), "the intervention changed nothing"
        for how, r in got.items():
            assert r[key].tobytes() == want.tobytes(), "%s: %s differs" % (how, key)
    # Before the steered layer nothing changes; the last position's edit only.
    assert np.array_equal(got["numpy"]["blocks.1.hook_resid_post"],
                          base["blocks.1.hook_resid_post"])
    last = model.extract(PROMPT, hooks, select="all",
                         interventions=[steer(vector, positions="last")])
    assert np.array_equal(last["logits"][:-1], base["logits"][:-1])
    assert not np.array_equal(last["logits"][-1], base["logits"][-1])


def test_rows_pick_the_prompts(model, vector):
    prompts = [PROMPT, "The cat sat on the mat."]
    base = model.extract(prompts, "logits", select="last")["logits"]
    one = model.extract(prompts, "logits", select="last",
                        interventions=[steer(vector, rows=[1])])["logits"]
    assert np.array_equal(one[0], base[0]) and not np.array_equal(one[1], base[1])


def test_perplexity_changes_and_equals_the_cli(model, vector, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("Once upon a time, there was a little girl named Lily. She loved to play "
                    "outside in the park with her friends. One day, she found a big red ball "
                    "under a tree. " * 3)
    kw = dict(ctx=32, stride=16, max_windows=4)
    plain = model.perplexity(text, **kw)
    steered = model.perplexity(text, interventions=[steer(vector)], **kw)
    assert abs(steered["perplexity"] - plain["perplexity"]) > 1e-3 * plain["perplexity"]
    path = write_intervention_file(tmp_path, vector)
    cli = json.loads(run_loom("perplexity", "--model", STORIES, "--text", text, "--ctx", 32,
                              "--stride", 16, "--max-windows", 4, "--threads", 1, "--json",
                              "--quiet", "--intervene", path).stdout)
    for key in ("perplexity", "nll_mean", "nll_sum"):
        assert math.isclose(steered[key], cli[key], rel_tol=1e-6), (key, steered[key], cli[key])
    assert steered["tokens_scored"] == cli["tokens_scored"]
    # rows = window indices: steering window 1 only is between none and all.
    one = model.perplexity(text, interventions=[steer(vector, rows=[1])], **kw)
    assert one["nll_sum"] not in (plain["nll_sum"], steered["nll_sum"])


def cli_generate(*args):
    return json.loads(run_loom("generate", "--model", STORIES, "--precision", "auto", "--json",
                               "--threads", "1", *args).stdout)


@pytest.mark.parametrize("apply_to", ["both", "prompt", "generated"])
def test_generate_changes_and_equals_the_cli(model, vector, tmp_path, apply_to):
    plain = model.generate(PROMPT, max_tokens=24)
    got = model.generate(PROMPT, max_tokens=24,
                         interventions=[steer(vector, scale=30.0, apply_to=apply_to)])
    assert got["token_ids"] != plain["token_ids"], "the steering changed nothing"
    path = write_intervention_file(tmp_path, vector, scale=30.0, apply_to=apply_to)
    cli = cli_generate("--prompt", PROMPT, "--max-tokens", 24, "--intervene", path)
    assert got["token_ids"] == cli["token_ids"] and got.text == cli["text"]
    assert got["stop_reason"] == cli["stop_reason"]


def test_generate_with_hooks_captures_the_edited_values(model, vector):
    ids = model.tokenize(PROMPT)
    iv = [steer(vector, apply_to="prompt")]
    got = model.generate(ids, max_tokens=8, hooks="blocks.3.hook_resid_post", select="all",
                         interventions=iv)
    assert got["token_ids"] == model.generate(ids, max_tokens=8, interventions=iv)["token_ids"]
    # The prompt's rows are extract's with the same edits, byte for byte
    # (another batch shape and KV layout: batch invariance).
    want = model.extract([ids], "blocks.3.hook_resid_post", select="all",
                         interventions=iv)["blocks.3.hook_resid_post"]
    rows = got["activations"]["blocks.3.hook_resid_post"][:len(ids)]
    np.testing.assert_array_equal(rows, want)
    plain = model.extract([ids], "blocks.3.hook_resid_post", select="all")
    assert not np.allclose(rows, plain["blocks.3.hook_resid_post"], atol=1e-3)


def test_no_interventions_is_the_plain_run(model):
    a = model.extract(PROMPT, "logits", select="all")["logits"]
    for none in (None, []):
        assert model.extract(PROMPT, "logits", select="all",
                             interventions=none)["logits"].tobytes() == a.tobytes()


@pytest.mark.parametrize("entry,field,fragment", [
    (dict(mode="add", vector=np.ones(3, np.float32)), "interventions[0].vector", "3 values"),
    (dict(mode="add", vector=np.array([np.nan] + [0.0] * 63)), "interventions[0].vector",
     "nan"),
    (dict(mode="add", vector=np.ones((2, 64))), "interventions[0].vector", "shape"),
    (dict(mode="add", vector=np.ones(64), scale=float("inf")), "interventions[0].scale",
     "finite"),
    (dict(mode="nope"), "interventions[0].mode", "nope"),
    (dict(mode="zero", hook="blocks.9.hook_resid_post"), "interventions[0].hook", ""),
    (dict(mode="zero", positions=[0, 0]), "interventions[0].positions", "twice"),
    (dict(mode="zero_head", head=99, hook="blocks.0.attn.hook_z"), "interventions[0].head",
     "99"),
    # A misspelt field is refused, not run with the default (scale 1).
    (dict(mode="add", vector=np.ones(64), scael=3), "interventions[0]",
     'unknown field "scael" (did you mean "scale"?)'),
    (dict(mode="zero", hook="blocks.0.hook_resid_pots"), "interventions[0].hook",
     "did you mean 'blocks.0.hook_resid_post'?"),
])
def test_bad_entries_are_value_errors_naming_the_field(model, entry, field, fragment):
    entry = dict(dict(hook="blocks.1.hook_resid_post"), **entry)
    for call in (lambda iv: model.extract(PROMPT, "logits", interventions=iv),
                 lambda iv: model.perplexity(PROMPT, interventions=iv),
                 lambda iv: model.generate(PROMPT, max_tokens=2, interventions=iv)):
        with pytest.raises(ValueError) as e:
            call([entry])
        assert isinstance(e.value, loom.InvalidArgumentError)
        assert e.value.code == "INVALID_ARGUMENT"
        assert field in str(e.value) and fragment in str(e.value), str(e.value)


def test_other_errors(model, tmp_path):
    with pytest.raises(TypeError, match="interventions"):
        model.extract(PROMPT, "logits", interventions="steer.json")
    with pytest.raises(TypeError, match=r"interventions\[0\]"):
        model.extract(PROMPT, "logits", interventions=[42])
    with pytest.raises(TypeError, match=r"interventions\[0\].vector"):
        model.extract(PROMPT, "logits",
                      interventions=[dict(hook="blocks.0.hook_resid_post", mode="add",
                                          vector="v.npy")])
    missing = dict(hook="blocks.0.hook_resid_post", mode="add",
                   vector_file=str(tmp_path / "missing.npy"))
    with pytest.raises(FileNotFoundError, match=r"interventions\[0\].vector_file"):
        model.extract(PROMPT, "logits", interventions=[missing])
    # A position outside a prompt: that prompt's error (or skipped with it).
    far = [dict(hook="blocks.0.hook_resid_post", mode="zero", positions=[40])]
    with pytest.raises(ValueError, match="position 40"):
        model.extract(PROMPT, "logits", interventions=far)
    with pytest.raises(ValueError, match="position 40"):
        model.generate(PROMPT, max_tokens=2, interventions=far)
    r = model.extract([PROMPT, (PROMPT + " ") * 12], "logits", interventions=far, on_error="skip")
    assert [row["status"] for row in r.rows] == ["skipped", "ok"]
    # Rows past the call's prompts (or windows) would edit nothing: refused, as
    # serve refuses them.
    row3 = [dict(hook="blocks.0.hook_resid_post", mode="zero", rows=[3])]
    with pytest.raises(ValueError, match=r"lists row 3 in `rows`, but this job has 2 prompts"):
        model.extract([PROMPT, PROMPT], "logits", interventions=row3)
    with pytest.raises(ValueError, match=r"lists row 3 in `rows`, but this job has 1 prompt "):
        model.generate(PROMPT, max_tokens=2, interventions=row3)
    with pytest.raises(ValueError, match=r"lists row 3 in `rows`, but this job has 1 window "):
        model.perplexity(PROMPT, interventions=row3)
    generated = [dict(hook="blocks.0.hook_resid_post", mode="zero", apply_to="generated")]
    with pytest.raises(ValueError, match="generates no tokens"):
        model.extract(PROMPT, "logits", interventions=generated)
