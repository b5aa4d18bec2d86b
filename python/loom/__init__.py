"""Loom from Python: hidden states, perplexity, generation, activation
patching and memory plans of Hugging Face models, computed by Loom's engine
(the same code and the same values as the `loom` command). API reference:
docs/python.md.

    import loom
    model = loom.Model("models/stories260K")          # loads the weights once
    acts = model.extract(["Once upon a time", [1, 403, 407]],
                         hooks=["blocks.4.hook_resid_post"], select="last")
    acts["blocks.4.hook_resid_post.last"]            # numpy [2, 64] float32
    acts["blocks.-1.hook_resid_post"]                # the same array
"""

import os
import sys

import numpy as np

# The OpenMP runtime reads its wait settings once, as it loads (with _loom):
# idle threads sleep instead of spinning, so that a core taken by another
# process does not stall every parallel region (`loom` itself does the same;
# OMP_WAIT_POLICY or GOMP_SPINCOUNT set by the user are kept).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "passive"

from . import _loom  # noqa: E402
from ._args import check_bool as _check_bool
from ._args import invalid as _invalid
from ._args import dtype_name as _dtype_name
from ._args import interventions_json as _interventions_json
from ._args import layer_specs as _layer_specs
from ._keys import ArrayDict, KeyResolver, OffsetsDict
from ._loom import (
    InvalidArgumentError,
    LoomError,
    NotFoundError,
    ResourceExhaustedError,
)
from .activations import Activations, bf16_to_float32, open_activations


class Sae(_loom.Sae):
    """An SAE or transcoder loaded from its published files (SAELens 6.x and
    older, EleutherAI sparsify, Gemma Scope 1 and 2; docs/saes.md).

      sae = loom.Sae("saes/blocks.6.hook_resid_post")     # hook from its files
      sae = loom.Sae("layers.6", hook="blocks.6.hook_resid_post")
      out = sae.encode(acts, topk=16)   # acts [rows, d_in] float32
      out["feature_acts"], out["topk_indices"], out["reconstruction"], ...
      sae.decoder_row(37)               # the direction steering by 37 adds

    Attributes: path, format, architecture, hook (Loom's name), hook_out
    (transcoders), d_in, d_sae, d_out, k (TopK), apply_b_dec_to_input,
    normalize_activations.
    """

    def __init__(self, path, hook=None):
        super().__init__(os.fspath(path), hook)
        for key, value in self._info().items():
            setattr(self, key, value)

    def __repr__(self):
        return (f"loom.Sae({self.path!r}, {self.architecture}, hook={self.hook!r}, "
                f"d_in={self.d_in}, d_sae={self.d_sae})")

__all__ = [
    "Model",
    "ExtractResult",
    "GenerateResult",
    "plan",
    "open_activations",
    "Activations",
    "bf16_to_float32",
    "Sae",
    "LoomError",
    "InvalidArgumentError",
    "NotFoundError",
    "ResourceExhaustedError",
]

__version__ = "0.1.0"


def _progress(progress):
    """A call's `progress`: None means "when stderr is a terminal" (a bar
    where someone watches, none in a log or a notebook's captured stream)."""
    if progress is None:
        try:
            return bool(sys.stderr is not None and sys.stderr.isatty())
        except (AttributeError, ValueError):
            return False
    return _check_bool(progress, "progress")


def _bf16_dtype():
    """ml_dtypes.bfloat16 when ml_dtypes is installed, else None."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def _path_list(paths):
    """None, a path or a list of paths as a list of str (loom.Sae objects, in
    saes=, are kept as they are)."""
    if paths is None:
        return []
    if isinstance(paths, (str, os.PathLike, _loom.Sae)):
        paths = [paths]
    return [os.fspath(p) if isinstance(p, os.PathLike) else p for p in paths]


def _arrays(raw_arrays, num_layers, result):
    """Fills `result` (an ArrayDict) with the arrays of the extension's
    answer, keyed "<hook>.<selector>", and gives it the lookup of user
    spellings."""
    entries = []
    for a in raw_arrays:
        key = a["hook"] + "." + a["selector_file"]
        dict.__setitem__(result, key, a["array"])
        entries.append((key, a["hook"], a["selector"], a["selector_file"]))
    result._resolver = KeyResolver(entries, num_layers)
    return result


class ExtractResult(ArrayDict):
    """What `Model.extract` returns: a dict of numpy arrays.

    Keys: "<hook>.<selector>", the resolved hook name and the selector's
    file-name part, as `loom extract` names its files and `open_activations`
    keys them ("blocks.2.hook_resid_post.last", "logits.pos_0_-1"); for each
    ragged selector (all, span:A:B) also "<selector>.offsets"
    ("all.offsets"): int64 [prompts + 1], prompt i's rows being
    array[offsets[i]:offsets[i + 1]].

    Lookups also take the names as written in the call: the hook pattern
    ("blocks.{0.5}.hook_resid_post", "blocks.-1.hook_resid_post"), the
    selector spec ("pos:0,-1"), the hook alone when it has one selector, or
    (hook, selector). `key_of(name)` gives the key a name resolves to.

    Attributes: `offsets` ({selector: offsets}, by file-name part or spec),
    `rows` (one record per prompt as rows.jsonl has it: row, id, tokens,
    status and, for a skipped prompt, reason), `hooks` (the resolved hook
    names), `dtype` ("float32", "bfloat16", "float16": what the values
    are; bfloat16 arrays come back as Model.extract's `bf16` says), `tokens`
    (tokens run).
    """

    offsets = None
    rows = None
    hooks = None
    dtype = None
    tokens = 0


class GenerateResult(dict):
    """What `Model.generate` returns: `loom generate --json`'s object as a
    dict (model, prompt, prompt_ids, token_ids, text, stop_reason) and, with
    hooks, activation_rows and activations (an ArrayDict keyed
    "<hook>.<selector>", each float32 [rows selected, width])."""

    @property
    def text(self):
        return self["text"]

    @property
    def token_ids(self):
        return self["token_ids"]


class Model(_loom.Model):
    """A model loaded once (weights and tokenizer) and reused by every call.

    Args:
      path: a Hugging Face model directory (config.json, *.safetensors,
        tokenizer.json or tokenizer.model).
      device: "auto" (the CLI's default: this machine's RAM), or what
        `--device` takes ("cpu", "cpu=24GiB", "cuda:0=80GiB", "disk"), one
        string or a list.
      precision: "auto", "f32", "bf16" or "f16" (`--precision`), or any
        alias of these ("float32", "bfloat16", "fp16", "half", np.float16,
        torch.bfloat16, ...).
      max_memory, reserve: as `--max-memory` / `--reserve`
        ("cpu=20GiB", "1GiB").
      threads: CPU threads (0: all cores).
      hf_bf16: round activations to bf16 where Hugging Face's bf16 forward
        does (`--hf-bf16`).

    Every call plans its own activations against the devices (refusing with
    ResourceExhaustedError what does not fit) and releases the GIL while it
    computes; Ctrl-C interrupts it between forwards (KeyboardInterrupt) and
    leaves the model usable. Calls on one model run one at a time.
    """

    def __init__(self, path, device="auto", precision="auto", max_memory=None,
                 reserve=None, threads=0, hf_bf16=False):
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        super().__init__(path, device, _dtype_name(precision, "precision", auto=True),
                         max_memory or None, reserve or None, threads, hf_bf16)
        self._max_memory = max_memory or ""
        self._reserve = reserve or ""

    def __repr__(self):
        return "loom.Model(%r, compute_dtype=%r)" % (self.path, self.compute_dtype)

    def tokenize(self, text, add_special_tokens=True, replace_invalid_utf8=False):
        """Token ids of `text` (a str, or bytes taken as UTF-8), as
        `loom tokenize DIR --text ...` gives them (add_special_tokens=False:
        `--no-special`). A str holding a lone surrogate (not Unicode text) is
        an InvalidArgumentError unless replace_invalid_utf8."""
        return self._tokenize(text, add_special_tokens, replace_invalid_utf8)

    def decode(self, ids, skip_special_tokens=False):
        """The text of token ids (a list, a numpy array), as Hugging Face's
        tokenizer.decode(ids, skip_special_tokens) gives it."""
        return self._decode(ids, skip_special_tokens)

    def to_str_tokens(self, text_or_ids, add_special_tokens=True):
        """One str per token, each id decoded alone (special tokens kept), as
        TransformerLens's to_str_tokens: of a text (tokenized as `tokenize`
        does) or of token ids."""
        add_special_tokens = _check_bool(add_special_tokens, "add_special_tokens")
        if isinstance(text_or_ids, (str, bytes)):
            text_or_ids = self.tokenize(text_or_ids, add_special_tokens=add_special_tokens)
        return self._str_tokens(text_or_ids)

    def lens(self, x, hook, topk=10, *, tuned=None, logits=False):
        """The logit lens (or, with `tuned`, the tuned lens) of residual-stream
        rows `x` ([rows, hidden] or [hidden], any float dtype) read at `hook`
        (blocks.i.hook_resid_pre / hook_resid_mid / hook_resid_post): the
        model's own final norm and unembedding (softcap, logit scaling
        included) applied to each row, as docs/saes.md ("Lenses") states.

        tuned: a tuned lens (the folder tuned-lens saves, with params.pt or
          params.safetensors, or one of those files; params.pt is read as
          a zip of tensors, never executed); translator i acts on
          blocks.i.hook_resid_pre, and the last layer's hook_resid_post has
          none (the model's own logits).
        Returns {"topk_ids": int32 [rows, topk], "topk_logits": float32
        [rows, topk]} (descending, ties to the lower id), plus "logits"
        float32 [rows, vocab] when logits=True. Computed 64 rows at a time.
        """
        if isinstance(tuned, os.PathLike):
            tuned = os.fspath(tuned)
        return self._lens(x, hook, topk, tuned, logits)

    def lens_grid(self, prompt, hooks=None, *, layers=None, topk=10, tuned=None,
                  kl=False):
        """`loom lens` on this model: one forward of `prompt` (a str,
        tokenized with special tokens, or token ids used as given), planned on
        the model's devices, each residual hook read through the logit lens
        (or the tuned lens at `tuned`) as the forward delivers it.

        hooks: residual hook patterns (default blocks.0.hook_resid_pre and
          every blocks.i.hook_resid_post), `layers` for bare sites.
        Returns {"hooks": [names], "input_ids", "topk_ids": int32 [hooks,
        tokens, topk], "topk_logits": float32 [hooks, tokens, topk],
        "tokens" and "topk_tokens" (each id decoded alone) when the model has
        a tokenizer, "seconds", "lens_seconds"}. With kl=True also
        "kl_to_final": float32 [hooks, tokens], KL(final || hook) in nats
        (the grid then always holds the last blocks.i.hook_resid_post).
        """
        if isinstance(tuned, os.PathLike):
            tuned = os.fspath(tuned)
        return self._lens_grid(prompt, hooks, layers, topk, tuned, kl)

    def extract(self, prompts, hooks, *, layers=None, select="last", dtype=None,
                template=None, add_bos="auto", batch_tokens=0, commit_every=256,
                on_error="fail", streaming_chunk_size=0, max_row_tokens=0,
                replace_invalid_utf8=False, interventions=None, progress=None,
                bf16="auto", saes=None, sae_topk=0, lens=None, lens_topk=0, grad_of=None,
                answer=None, wrong=None):
        """Hidden states at `hooks` for every prompt, as `loom extract` computes
        them (the same batches, hence the same bits).

        Args:
          prompts: a list of prompts, each a str (tokenized with the model's
            tokenizer, `add_bos` deciding BOS) or a sequence of token ids
            (used as given); a single str is one prompt.
          hooks: hook names or patterns, a str or a list
            ("blocks.{0.5}.hook_resid_post", "blocks.-1.hook_resid_post",
            "ln_final.hook_normalized", "logits", or a bare site with `layers`).
          layers: for bare sites: an int (a layer; negative from the end), a
            float (a fraction: 0.5; 1.0 the last layer), a str ("0,-1", "*")
            or a list of these.
          select: one selector or a list: "last", "first", "mean", "max",
            "all", "pos:I[,J...]", "span:A:B".
          dtype: "f32", "bf16" or "f16", an alias ("float16", "fp16",
            "bfloat16", "half", ...) or a numpy / torch dtype (default: the
            compute dtype).
          template, add_bos, batch_tokens, commit_every, streaming_chunk_size,
          max_row_tokens, replace_invalid_utf8: as the `loom extract` flags.
          on_error: "fail" (default: a bad prompt raises InvalidArgumentError
            before anything runs) or "skip" (its row is NaN, or has no rows in
            a ragged array, and its record says why).
          interventions: edits applied inside the forward pass, as
            `loom extract --intervene FILE` applies the file's list: a list
            of dicts with the file's fields (hook, mode, scale, positions,
            vector or vector_file, head, rows; docs/interventions.md), where
            `vector` may be a numpy array ([width] or [1, width], any float
            dtype) and `vector_file` is relative to the working directory;
            `rows` are indices into `prompts`. The captured values are the
            edited ones. A bad entry is an InvalidArgumentError naming its
            field; a position outside a prompt is that prompt's error.
          progress: a bar over the prompts on stderr (None: when stderr is
            a terminal; False: never).
          bf16: how bfloat16 arrays (dtype "bf16", or a bf16 compute dtype)
            come back: "auto" (default) as ml_dtypes.bfloat16 when ml_dtypes
            is installed (a view of the bits, no copy), else float32 (exact,
            a copy); "float32"; or "bits" (the raw bits as uint16, as the
            CLI's .npy files hold them).
          saes: SAEs or transcoders run inside the forward, as
            `loom extract --sae`: a path or a list ("DIR" or "DIR@HOOK" when
            the format names no hook) or loom.Sae objects (loaded once and
            shared by every call given them: a path is loaded by each call
            again, 1.4-1.7 s for 256 MB of f32 weights on a 2-core EPYC);
            their outputs are then hooks
            ("HOOK.hook_sae_acts_post", ".hook_sae_recons", ".hook_sae_error",
            ".hook_sae_acts_pre", ".hook_sae_input"; docs/saes.md).
          sae_topk: K > 0 adds each SAE's "HOOK.hook_sae_acts_post.topk_indices"
            (int32) and ".topk_values".
          lens: "logit" or "tuned:PATH": "HOOK.hook_lens_logits" is then a
            hook at every residual hook.
          lens_topk: K > 0 adds "HOOK.lens_topk_ids" (int32) and
            "HOOK.lens_topk_values" for every residual hook asked.
          grad_of: "logit-diff" (with answer and wrong token ids) or
            "logprob" (each prompt's log-likelihood): "HOOK.grad" is then a
            hook, d metric / d HOOK per prompt, each prompt alone through the
            backward at f32 (docs/attribution.md), as `loom extract
            --grad-of`.

        Returns: an ExtractResult (a dict of numpy arrays that own Loom's
        buffers: no copy is made, but for bfloat16 made float32), keyed
        "<hook>.<selector>".
        """
        if bf16 not in ("auto", "float32", "bits"):
            raise _invalid("bf16: expected 'auto', 'float32' or 'bits', got %r" % (bf16,))
        raw = self._extract(
            prompts, hooks, _layer_specs(layers), select, _dtype_name(dtype, "dtype"),
            template, add_bos, batch_tokens, commit_every, on_error,
            streaming_chunk_size, max_row_tokens, replace_invalid_utf8,
            _interventions_json(interventions), _progress(progress),
            _path_list(saes), sae_topk, lens, lens_topk, grad_of, answer, wrong)
        if raw["dtype"] == "bfloat16" and bf16 != "bits":
            as_bf16 = _bf16_dtype() if bf16 == "auto" else None
            for a in raw["arrays"]:
                if a["array"].dtype.kind != "u":
                    continue  # int32 indices
                a["array"] = (a["array"].view(as_bf16) if as_bf16 is not None
                              else bf16_to_float32(a["array"]))
        result = _arrays(raw["arrays"], self._num_layers, ExtractResult())
        result.offsets = OffsetsDict()
        result.offsets._selector_file = {}
        for o in raw["offsets"]:
            dict.__setitem__(result, o["selector_file"] + ".offsets", o["offsets"])
            dict.__setitem__(result.offsets, o["selector_file"], o["offsets"])
            result.offsets._selector_file[o["selector"]] = o["selector_file"]
        result.rows = raw["rows"]
        result.hooks = raw["hooks"]
        result.dtype = raw["dtype"]
        result.tokens = raw["tokens"]
        return result

    def perplexity(self, text=None, *, tokens=None, protocol="hf-stride", ctx=0,
                   stride=0, max_windows=0, add_bos="auto", chunk_rows=256,
                   interventions=None):
        """Perplexity under a protocol ("hf-stride", "llama-cpp",
        "all-tokens"), as `loom perplexity --json` computes it; returns that
        JSON as a dict (perplexity, nll_mean, nll_sum, tokens_scored, windows,
        protocol, ctx, stride, ...).

        text: a str, bytes (taken as they are) or a path (os.PathLike, e.g.
          pathlib.Path: the file's bytes, as `--text FILE` reads them; a
          file read with open() in text mode has lost its "\r\n" line
          ends); or tokens: token ids. ctx 0: min(512,
          max_position_embeddings); stride 0: the protocol's default. With
          hf-stride, a text shorter than ctx is one window of its length.
        interventions: as Model.extract's, applied in every window (each
          window is one sequence: `rows` are window indices, positions are
          positions in the window), as `loom perplexity --intervene`."""
        if isinstance(text, os.PathLike):
            with open(os.fspath(text), "rb") as f:
                text = f.read()
        return self._perplexity(text, tokens, protocol, ctx, stride, max_windows, add_bos,
                                chunk_rows, _interventions_json(interventions))

    def generate(self, prompt, *, max_tokens=32, temperature=0.0, top_k=0, top_p=1.0,
                 seed=0, stop=None, ctx=0, prefill_chunk=256, hooks=None, layers=None,
                 select="last", interventions=None):
        """Continues `prompt` as `loom generate` does, on this model (loaded
        once; the CPU backend).

        prompt: a str (tokenized with the special tokens, as `--prompt`) or
          token ids. max_tokens, temperature (0: greedy), top_k (0: off),
          top_p (1: off), seed, stop (a str or a list: stop strings), ctx
          (KV positions; 0: min(2048, max positions)), prefill_chunk: the
          `loom generate` flags of the same names.
        hooks, layers, select: as `loom generate --hooks/--layers/--select`:
          hidden states at every position fed (the prompt, then each
          generated token but the last), reduced by each selector.
        interventions: as Model.extract's (the prompt is row 0), as
          `loom generate --intervene` applies them: `apply_to` "prompt" (its
          positions of the prompt), "generated" (every generated token fed
          back) or "both" (the default with positions "all", else "prompt").
          With hooks, the captured values are the edited ones.

        Returns a GenerateResult: `loom generate --json`'s object (model,
        prompt, prompt_ids, token_ids, text, stop_reason) and, with hooks,
        activation_rows and activations ({"<hook>.<selector>": float32
        [rows selected, width]}, with the lookups of ExtractResult)."""
        raw = self._generate(prompt, max_tokens, temperature, top_k, top_p, seed, stop, ctx,
                             prefill_chunk, hooks, _layer_specs(layers), select,
                             _interventions_json(interventions))
        result = GenerateResult(model=self.path, prompt=prompt,
                                prompt_ids=raw["prompt_ids"], token_ids=raw["token_ids"],
                                text=raw["text"], stop_reason=raw["stop_reason"])
        if "arrays" in raw:
            result["activation_rows"] = raw["activation_rows"]
            result["activations"] = _arrays(raw["arrays"], self._num_layers, ArrayDict())
        return result

    def patch(self, clean, corrupted, *, hooks="blocks.*.hook_resid_pre", positions="all",
              answer=None, wrong=None, batch_tokens=None, per_head=False, progress=None):
        """Activation patching, as `loom patch` computes it: the (hook x
        position) grid of a clean and a corrupted prompt of one length. Each
        cell is the corrupted prompt with hook h at position p replaced by
        the clean run's value there, scored by the logit difference
        ld = logits_last[answer] - logits_last[wrong] and its recovery
        (ld - corrupted ld) / (clean ld - corrupted ld).

        clean, corrupted: a str (tokenized with the special tokens, as
          `--clean TEXT`) or token ids (a list or a numpy array, as
          `--clean-tokens`); the two must have as many tokens.
        hooks: a str or a list of extract's hook patterns, each a site that
          can be patched (the residual stream, hook_attn_out, hook_mlp_out,
          attn.hook_z, mlp.hook_post); the grid's rows, in layer order.
        positions: "all", "last", an int, a list of ints (negative from
          the end), or a span: "A:B" or slice(A, B) (B exclusive, None for
          the end); the grid's columns.
        per_head: each attn.hook_z hook gives one row per head, whose cells
          patch only that head's columns (mode patch_head).
        answer, wrong: token ids A and B (None: the clean run's argmax, and
          the corrupted run's argmax, or its runner-up when that is A).
        batch_tokens: tokens per forward (None: min(4096, max positions));
          the patched runs are batched as sequences of shared forwards.

        Returns a dict: logit_diff and recovery (float64 [rows, P]),
        patched_logits_last (float32 [rows, P, vocab]), clean_logits_last
        and corrupted_logits_last (float32 [vocab]), hooks (each row's hook
        name), heads (each row's head, -1 for a whole hook),
        positions (resolved, ascending), answer, wrong, clean_logit_diff,
        corrupted_logit_diff, forwards and seconds.

        progress: a bar over the grid's cells on stderr (None: when stderr
          is a terminal; False: never)."""
        return self._patch(clean, corrupted, hooks, positions, answer, wrong, batch_tokens,
                           bool(per_head), _progress(progress))

    def attribute(self, clean, corrupted, *, hooks="blocks.*.hook_resid_pre", positions="all",
                  metric="logit-diff", answer=None, wrong=None, freeze=(), per_head=False,
                  check_top=0, method="atp"):
        """Attribution patching, as `loom attribute` computes it
        (docs/attribution.md): Model.patch's grid estimated from one
        backward, atp[h][p] = sum over the hook's width of (clean - corrupted)
        * d metric / d activation on the corrupted run. Runs at f32 (load the
        model with precision="f32").

        clean, corrupted, positions, answer, wrong: as Model.patch.
        hooks: extract's hook patterns, any hook with a gradient.
        metric: "logit-diff" or "logprob" (the sequence log-likelihood).
        freeze: ("attn_pattern", "norm_scale") or a subset: circuit-tracer's
          linearization.
        per_head: also atp_head {hook: float64 [P, heads]} for attn.hook_z.
        check_top: run the true patch of the N largest patchable cells.
        method: "atp", or "atp-star": also AtP*'s GradDrop estimate
          atp_star (float64 [rows, P]; per_head: atp_star_head), one more
          backward per layer.

        Returns a dict: method, atp (float64 [rows, P]), hooks, positions,
        answer, wrong, metric_clean, metric_corrupted, checks, seconds."""
        return self._attribute(clean, corrupted, hooks, positions, metric, answer, wrong,
                               freeze, per_head, check_top, method)

    def integrated_gradients(self, prompt, *, metric="logit-diff", answer=None, wrong=None,
                             steps=32, baseline_token=0, freeze=()):
        """Integrated gradients over a prompt's tokens (str or ids), as `loom
        attribute --method ig` computes them (docs/attribution.md), at f32:
        the block input against the prompt with every token replaced by
        baseline_token, by a steps-point Gauss-Legendre rule. answer and
        wrong default to the prompt's last-position argmax and runner-up.

        Returns a dict: ig (float64 [T], summing to metric_input -
        metric_baseline up to completeness_error), answer, wrong,
        metric_input, metric_baseline, completeness_error, steps, seconds."""
        return self._integrated_gradients(prompt, metric, answer, wrong, steps, baseline_token,
                                          freeze)

    def grad(self, prompt, hooks, *, metric="logit-diff", answer=None, wrong=None, freeze=()):
        """d metric / d activation at `hooks` on one prompt (str or ids), at
        f32: {hook name: float32 [T, width]} and "metric" (its value).
        metric "logit-diff" needs answer and wrong; "logprob" is the
        prompt's log-likelihood. freeze as Model.attribute."""
        return self._grad(prompt, hooks, metric, answer, wrong, freeze)

    def inject_grad(self, prompt, injections, hooks, *, freeze=()):
        """The custom-gradient backward (docs/attribution.md): one forward of
        `prompt` (str or ids), then one backward per entry of `injections`,
        each a dict {hook name: float32 [T, width]} of d objective / d hook
        (an objective linear in those activations, e.g. a feature's encoder
        row at one position; several hooks in one dict sum), with no metric.
        Returns, per entry, {hook: float32 [T, width]}: d objective / d each
        of `hooks` (zeros above the seeds). A dict in gives a dict back; a
        list gives a list, all from one forward. freeze as Model.attribute.
        At f32."""
        return self._inject_grad(prompt, injections, hooks, freeze)

    def plan(self, **options):
        """`loom plan --json` for this model as a dict; the model's devices,
        max_memory and reserve unless given. Options: those of `loom.plan`."""
        options.setdefault("device", self._device_flags or "auto")
        options.setdefault("max_memory", self._max_memory)
        options.setdefault("reserve", self._reserve)
        return plan(self.path, **options)


def plan(path, *, device="auto", max_memory="", reserve="", offload=False, hooks=None,
         layers=None, select="all", mode="analysis", batch_tokens=0, ctx=0,
         seqs_per_batch=0, dtype="f32", capture_to="host", capture_buffers=1,
         logits=False, logits_chunk=256, kv_dtype="", kv_context=0, assume_dtype="",
         strategy="balanced", layers_per_device="", solve=""):
    """The memory plan of a job, as `loom plan --json` prints it (a dict),
    computed from config.json and the safetensors headers without loading a
    weight. Arguments are `loom plan`'s flags (0 / "" / None: its defaults);
    dtype, kv_dtype and assume_dtype take the aliases of Model.extract's
    dtype, layers what Model.extract's layers take. A plan that does not fit
    is returned with "fits": false."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    return _loom._plan(path, device, max_memory or None, reserve or None, offload, hooks,
                       _layer_specs(layers), select, mode, batch_tokens, ctx, seqs_per_batch,
                       _dtype_name(dtype, "dtype", others=True) or "f32", capture_to, capture_buffers,
                       logits, logits_chunk, _dtype_name(kv_dtype or None, "kv_dtype",
                                                         others=True),
                       kv_context, _dtype_name(assume_dtype or None, "assume_dtype",
                                               others=True),
                       strategy, layers_per_device or None, solve or None)
