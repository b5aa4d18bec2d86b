"""Loom from Python: hidden states, perplexity and memory plans of Hugging
Face models, computed by Loom's engine (the same code and the same values as
the `loom` command). API reference: docs/python.md.

    import loom
    model = loom.Model("models/stories260K")          # loads the weights once
    acts = model.extract(["Once upon a time", [1, 403, 407]],
                         hooks=["blocks.4.hook_resid_post"], select="last")
    acts["blocks.4.hook_resid_post"]                 # numpy [2, 64] float32
"""

import os

from . import _loom
from ._loom import (
    InvalidArgumentError,
    LoomError,
    NotFoundError,
    ResourceExhaustedError,
)
from .activations import Activations, bf16_to_float32, open_activations

__all__ = [
    "Model",
    "ExtractResult",
    "plan",
    "open_activations",
    "Activations",
    "bf16_to_float32",
    "LoomError",
    "InvalidArgumentError",
    "NotFoundError",
    "ResourceExhaustedError",
]

__version__ = "0.1.0"


def _strings(value):
    """None, a str or an iterable of str -> None or a list."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [os.fspath(v) for v in value]


class ExtractResult(dict):
    """What `Model.extract` returns: a dict of numpy arrays.

    Keys: the hook name when one selector was asked for
    ("blocks.4.hook_resid_post"), else "<hook>.<selector>" as `loom extract`
    names its files ("blocks.4.hook_resid_post.mean"); for each ragged
    selector (all, span:A:B) also "<selector>.offsets" ("all.offsets"): int64
    [prompts + 1], prompt i's rows being array[offsets[i]:offsets[i + 1]].

    Attributes: `offsets` ({selector spec: offsets}), `rows` (one record per
    prompt as rows.jsonl has it: row, id, tokens, status and, for a skipped
    prompt, reason), `hooks` (the resolved hook names), `dtype` ("float32",
    "bfloat16", "float16"; bfloat16 arrays hold the raw bits as uint16, see
    `bf16_to_float32`), `tokens` (tokens run).
    """

    offsets = None
    rows = None
    hooks = None
    dtype = None
    tokens = 0


class Model(_loom.Model):
    """A model loaded once (weights and tokenizer) and reused by every call.

    Args:
      path: a Hugging Face model directory (config.json, *.safetensors,
        tokenizer.json or tokenizer.model).
      device: "auto" (the CLI's default: this machine's RAM), or what
        `--device` takes ("cpu", "cpu=24GiB", "cuda:0=80GiB", "disk"), one
        string or a list.
      precision: "auto", "f32", "bf16" or "f16" (`--precision`).
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
        path = os.fspath(path)
        super().__init__(path, device, precision, max_memory or "", reserve or "",
                         int(threads), bool(hf_bf16))
        self._max_memory = max_memory or ""
        self._reserve = reserve or ""

    def __repr__(self):
        return "loom.Model(%r, compute_dtype=%r)" % (self.path, self.compute_dtype)

    def extract(self, prompts, hooks, *, layers=None, select="last", dtype=None,
                template=None, add_bos="auto", batch_tokens=0, commit_every=256,
                on_error="fail", streaming_chunk_size=0, max_row_tokens=0,
                replace_invalid_utf8=False):
        """Hidden states at `hooks` for every prompt, as `loom extract` computes
        them (the same batches, hence the same bits).

        Args:
          prompts: a list of prompts, each a str (tokenized with the model's
            tokenizer, `add_bos` deciding BOS) or a sequence of token ids
            (used as given); a single str is one prompt.
          hooks: hook names or patterns, a str or a list
            ("blocks.{0.5}.hook_resid_post", "blocks.-1.hook_resid_post",
            "ln_final.hook_normalized", "logits", or a bare site with `layers`).
          layers: for bare sites: indices, negative indices, fractions, "*".
          select: one selector or a list: "last", "first", "mean", "max",
            "all", "pos:I[,J...]", "span:A:B".
          dtype: "f32", "bf16" or "f16" (default: the compute dtype).
          template, add_bos, batch_tokens, commit_every, streaming_chunk_size,
          max_row_tokens, replace_invalid_utf8: as the `loom extract` flags.
          on_error: "fail" (default: a bad prompt raises InvalidArgumentError
            before anything runs) or "skip" (its row is NaN, or has no rows in
            a ragged array, and its record says why).

        Returns: an ExtractResult (a dict of numpy arrays that own Loom's
        buffers: no copy is made).
        """
        raw = self._extract(
            prompts, _strings(hooks), _strings(layers), _strings(select), dtype,
            template or "", add_bos, int(batch_tokens), int(commit_every), on_error,
            int(streaming_chunk_size), int(max_row_tokens), bool(replace_invalid_utf8))
        several = not isinstance(select, str)
        result = ExtractResult()
        for a in raw["arrays"]:
            key = a["hook"] + "." + a["selector_file"] if several else a["hook"]
            result[key] = a["array"]
        result.offsets = {}
        for o in raw["offsets"]:
            result[o["selector_file"] + ".offsets"] = o["offsets"]
            result.offsets[o["selector"]] = o["offsets"]
        result.rows = raw["rows"]
        result.hooks = raw["hooks"]
        result.dtype = raw["dtype"]
        result.tokens = raw["tokens"]
        return result

    def perplexity(self, text=None, *, tokens=None, protocol="hf-stride", ctx=0,
                   stride=0, max_windows=0, add_bos="auto", chunk_rows=256):
        """Perplexity of `text` (a str) or `tokens` (token ids) under a protocol
        ("hf-stride", "llama-cpp", "all-tokens"), as `loom perplexity --json`
        computes it; returns that JSON as a dict (perplexity, nll_mean,
        nll_sum, tokens_scored, windows, protocol, ctx, stride, ...). ctx 0:
        min(512, max_position_embeddings); stride 0: the protocol's default."""
        return self._perplexity(text, None if tokens is None else list(tokens), protocol,
                                int(ctx), int(stride), int(max_windows), add_bos,
                                int(chunk_rows))

    def plan(self, **options):
        """`loom plan --json` for this model as a dict; the model's devices,
        max_memory and reserve unless given. Options: those of `loom.plan`."""
        options.setdefault("device", self.devices or "auto")
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
    weight. Arguments are `loom plan`'s flags (0 / "" / None: its defaults).
    A plan that does not fit is returned with "fits": false."""
    return _loom._plan(os.fspath(path), device, max_memory or "", reserve or "",
                       bool(offload), _strings(hooks), _strings(layers), select, mode,
                       int(batch_tokens), int(ctx), int(seqs_per_batch), dtype,
                       capture_to, int(capture_buffers), bool(logits), int(logits_chunk),
                       kv_dtype or "", int(kv_context), assume_dtype or "", strategy,
                       layers_per_device or "", solve or "")
