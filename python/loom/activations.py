"""Reading what `loom extract` wrote (docs/formats/activations.md) with numpy
(the extension only resolves hook patterns in lookups).

`open_activations(out_dir)` returns an `Activations`: the manifest, and every
array as a read-only memmap (`.npy` output), or per shard (safetensors
output), plus the offsets of ragged selectors. Nothing is read into memory
until it is indexed, except where safetensors shards are joined.
"""

import json
import os
import struct

import numpy as np

from ._keys import KeyResolver, LookupMixin, OffsetsDict

__all__ = ["Activations", "open_activations", "bf16_to_float32"]

# safetensors dtype names -> numpy (bf16: its raw bits as uint16).
_SAFETENSORS_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}


def bf16_to_float32(bits):
    """bfloat16 values stored as uint16 bits (loom's bf16 arrays) -> float32,
    exactly: the bits are the high half of the float32."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError("bits: expected the uint16 bits of bfloat16 values, got %s" % bits.dtype)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    """{name: read-only memmap} and the __metadata__ of a safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("%s: not a safetensors file (shorter than 8 bytes)" % path)
        (n,) = struct.unpack("<Q", head)
        header = json.loads(f.read(n))
    base = 8 + n
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError("%s: tensor %s has dtype %s, which this reader does not map"
                             % (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == begin:
            tensors[name] = np.zeros(shape, dtype)
            continue
        tensors[name] = np.memmap(path, dtype=dtype, mode="r", offset=base + begin, shape=shape)
    return tensors, meta


class Activations(LookupMixin):
    """A `loom extract` output directory.

    Attributes:
      manifest: the parsed manifest.json.
      arrays: {"<hook>.<selector>": array}, the names of the .npy files
        without ".npy" (e.g. "blocks.4.hook_resid_post.last"): the key
        scheme of Model.extract's results; npy output: read-only memmaps;
        safetensors: the shards joined (a memmap when there is one shard).
      shards: safetensors output only: {"<hook>.<selector>": [memmap, ...]}
        per shard, in row order.
      offsets: {"<selector>": int64 [rows + 1]} for ragged selectors (all,
        span:A:B), keyed by the selector's file-name part ("all",
        "span_1_-1"; the spec "span:1:-1" is looked up too); rows[i]'s
        tokens are data[offsets[i]:offsets[i+1]].
      rows: the number of rows committed.
      complete: whether the job finished.
    `acts[key]` is `acts.arrays[key]`, and takes the spellings
    Model.extract's results take: the hook as given to `--hooks`
    ("blocks.{0.5}.hook_resid_post", "blocks.-1.hook_resid_post"), the
    selector spec ("pos:0,-1"), the hook alone when it has one selector,
    `acts[hook, selector]`, and "<selector>.offsets".
    """

    def __init__(self, manifest, arrays, offsets, shards, rows):
        self.manifest = manifest
        self.arrays = arrays
        self.shards = shards
        self.rows = rows
        self.complete = bool(manifest.get("complete", False))
        entries = []
        selector_file = {}
        for a, key in zip(manifest["arrays"], arrays):
            part = key[len(a["hook"]) + 1:]
            entries.append((key, a["hook"], a["selector"], part))
            selector_file[a["selector"]] = part
        num_layers = manifest.get("settings", {}).get("model", {}).get("num_layers")
        self._resolver = KeyResolver(entries, num_layers)
        self.offsets = OffsetsDict(offsets)
        self.offsets._selector_file = selector_file

    def key_of(self, key):
        """The key of `arrays` a spelling resolves to (KeyError if none)."""
        if isinstance(key, str) and key in self.arrays:
            return key
        found = self._resolver.resolve(key)
        if found is None:
            raise KeyError("%r: no such array (keys: %s)" % (key, ", ".join(self.arrays)))
        return found

    def __getitem__(self, key):
        if isinstance(key, str) and key.endswith(".offsets") and key not in self.arrays:
            selector = key[: -len(".offsets")]
            if selector in self.offsets:
                return self.offsets[selector]
        return self.arrays[self.key_of(key)]



    def __iter__(self):
        return iter(self.arrays)

    def __len__(self):
        return len(self.arrays)

    def keys(self):
        return self.arrays.keys()

    def __repr__(self):
        return "Activations(%d rows%s: %s)" % (
            self.rows, "" if self.complete else ", incomplete", ", ".join(self.arrays))


def _selector_part(array_entry):
    """The selector's file-name part of a manifest array ("last", "pos_0_-1")."""
    if "file" in array_entry:
        stem = array_entry["file"][: -len(".npy")]
        return stem[len(array_entry["hook"]) + 1:]
    if "offsets_file" in array_entry:
        return array_entry["offsets_file"][: -len(".offsets.npy")]
    return None


def open_activations(out_dir, allow_incomplete=False):
    """Opens the output of `loom extract --out OUT_DIR`.

    A job that has not completed (manifest "complete" false: still running,
    or interrupted and not resumed) is refused with ValueError, unless
    `allow_incomplete` is true: then only its committed rows are opened
    (what the manifest's progress records; later bytes are ignored).
    """
    try:
        out_dir = os.fspath(out_dir)
    except TypeError:
        raise TypeError("out_dir: expected a path (str, bytes or os.PathLike), got %s"
                        % type(out_dir).__name__) from None
    path = os.path.join(out_dir, "manifest.json")
    try:
        with open(path, "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError("%s: no manifest.json (not a loom extract output)" % out_dir) from None
    if manifest.get("format") != "loom-activations":
        raise ValueError("%s: not a loom-activations manifest" % path)
    complete = bool(manifest.get("complete", False))
    progress = manifest.get("progress", {})
    rows = int(manifest["row_count"]) if complete and "row_count" in manifest else int(
        progress.get("rows_committed", 0))
    if not complete and not allow_incomplete:
        raise ValueError(
            "%s: the job is not complete (%d rows committed); finish it with "
            "`loom extract --resume`, or pass allow_incomplete=True to open the "
            "committed rows only" % (out_dir, rows))
    fmt = manifest.get("settings", {}).get("format", "npy")
    entries = manifest["arrays"]
    arrays, offsets, shards = {}, {}, None
    if fmt == "npy":
        ragged_rows = progress.get("ragged_rows", {})
        for a in entries:
            key = a["file"][: -len(".npy")]
            data = np.load(os.path.join(out_dir, a["file"]), mmap_mode="r")
            n = rows
            if "offsets_file" in a:
                n = int(ragged_rows.get(a["file"], data.shape[0]))
                sel = _selector_part(a)
                if sel not in offsets:
                    offs = np.load(os.path.join(out_dir, a["offsets_file"]), mmap_mode="r")
                    offsets[sel] = offs[: rows + 1]
            arrays[key] = data[:n]
    elif fmt == "safetensors":
        shards = {}
        files = manifest.get("files", [])
        k = len(entries)
        nshards = int(progress.get("shards", len(files) // k if k else 0))
        ragged_parts = {}
        for i, a in enumerate(entries):
            names = [files[s * k + i] for s in range(nshards)]
            sel = _selector_part(a)
            if sel is None:  # from the shard name: <hook>.<selector>.shard-N
                sel = names[0][len(a["hook"]) + 1: names[0].rindex(".shard-")] if names else a["selector"]
            key = a["hook"] + "." + sel
            parts, offs = [], []
            for name in names:
                tensors, _ = read_safetensors(os.path.join(out_dir, name))
                parts.append(tensors["activations"])
                if "offsets" in tensors:
                    offs.append(np.asarray(tensors["offsets"]))
            shards[key] = parts
            if len(parts) == 1:
                arrays[key] = parts[0]
            elif parts:
                arrays[key] = np.concatenate(parts)
            else:
                width = a["row_shape"]
                arrays[key] = np.zeros([0] + list(width), _SAFETENSORS_DTYPES.get(
                    {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}.get(a["dtype"], "F32")))
            if "offsets_file" in a and sel not in ragged_parts:
                ragged_parts[sel] = offs
        for sel, offs in ragged_parts.items():
            joined, base = [np.zeros(1, np.int64)], 0
            for o in offs:
                joined.append(o[1:].astype(np.int64) + base)
                base += int(o[-1])
            offsets[sel] = np.concatenate(joined)
    else:
        raise ValueError("%s: unknown output format %r" % (path, fmt))
    return Activations(manifest, arrays, offsets, shards, rows)
