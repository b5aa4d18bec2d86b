"""Arguments of the Python API that take more than one spelling: dtypes and
precisions (Loom's names, torch-style names, numpy and torch dtypes) and
layers (ints, fractions as floats, strings, lists of them), and
interventions (dicts with numpy vectors, turned into the JSON document the
extension parses). Everything else is type-checked by the extension, whose
errors name the argument."""

import json
import math
import numbers
import os
from collections.abc import Mapping

from ._loom import InvalidArgumentError

# Loom's name -> every spelling accepted for it (compared lower-case, after
# "torch." is dropped).
_DTYPE_SPELLINGS = {
    "f32": ("f32", "fp32", "float32", "float", "single"),
    "bf16": ("bf16", "bfloat16"),
    "f16": ("f16", "fp16", "float16", "half"),
}
_DTYPE_OF = {alias: name for name, aliases in _DTYPE_SPELLINGS.items() for alias in aliases}

DTYPE_ALIASES_TEXT = ("'f32' (float32, fp32, float, np.float32, torch.float32), "
                      "'bf16' (bfloat16, torch.bfloat16) or "
                      "'f16' (float16, fp16, half, np.float16, torch.float16)")


def invalid(message):
    """A loom.InvalidArgumentError (a ValueError) with code INVALID_ARGUMENT."""
    e = InvalidArgumentError(message)
    e.code = "INVALID_ARGUMENT"
    return e


def _dtype_text(value, arg):
    """The name a dtype argument spells: a str as given, a numpy dtype's or
    scalar type's name ("float16"), a torch dtype's ("float16" for
    torch.float16). Other types: TypeError naming `arg`."""
    if isinstance(value, str):
        return value
    cls = type(value)
    if cls.__module__ == "torch" and cls.__name__ == "dtype":  # torch.float16
        return str(value)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = None
    if np is not None and (isinstance(value, np.dtype) or
                           (isinstance(value, type) and issubclass(value, np.generic))):
        return np.dtype(value).name
    raise TypeError("%s: expected a dtype name ('f32', 'bf16', 'f16', 'float16', ...), a "
                    "numpy dtype (np.float16) or a torch dtype, got %s"
                    % (arg, cls.__name__))


def dtype_name(value, arg, auto=False, others=False):
    """Loom's name ("f32", "bf16", "f16"; "auto" when `auto`) for a dtype
    argument, None for None. A name outside these is an InvalidArgumentError
    naming `arg`, unless `others` (loom.plan's kv_dtype and assume_dtype,
    which take any safetensors dtype name): then it is passed on as given,
    for Loom to check."""
    if value is None:
        return None
    text = _dtype_text(value, arg)
    key = text.strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if auto and key == "auto":
        return "auto"
    name = _DTYPE_OF.get(key)
    if name is not None:
        return name
    if others:
        return text
    raise invalid("%s: %r is not one of %s%s" % (arg, text, DTYPE_ALIASES_TEXT,
                                                  " or 'auto'" if auto else ""))


def _layer_spec(value, arg):
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise TypeError("%s: expected an int, a float or a str, got %s"
                        % (arg, type(value).__name__))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise invalid("%s: %r is not a layer fraction" % (arg, f))
        text = repr(f)  # "0.5", "1.0": a '.' makes Loom read a fraction
        if "e" in text or "E" in text:
            text = ("%.20f" % f).rstrip("0")
            if text.endswith("."):
                text += "0"
        return text
    raise TypeError("%s: expected an int (a layer; negative from the end), a float (a "
                    "fraction: 0.5, 1.0 = the last layer), a str ('0,-1', '*') or a list of "
                    "them, got %s" % (arg, type(value).__name__))


def layer_specs(value, arg="layers"):
    """`layers` as the list of strings Loom parses, None for None: an int is
    a layer (negative: from the end), a float a fraction of the layers (0.5;
    1.0 the last layer, whereas 1 is layer 1), a str anything `--layers`
    takes ("0,-1", "0.25", "*"); or a list of these."""
    if value is None:
        return None
    if isinstance(value, (str, numbers.Number)) or type(value).__name__ in ("bool_", "bool"):
        return [_layer_spec(value, arg)]
    try:
        items = list(value)
    except TypeError:
        raise TypeError("%s: expected an int, a float, a str or a list of them, got %s"
                        % (arg, type(value).__name__)) from None
    return [_layer_spec(v, "%s[%d]" % (arg, i)) for i, v in enumerate(items)]


def check_bool(value, arg):
    """`value` if it is a bool (Python's or numpy's, or 0 / 1), else
    TypeError naming `arg` (as the extension checks its bool arguments)."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError("%s: expected a bool, got %s" % (arg, type(value).__name__))


def _json_plain(value, where):
    """`value` as plain JSON data (numpy scalars and arrays, tuples and
    os.PathLike made lists, numbers and str); a non-finite float is an
    InvalidArgumentError naming `where`, any other type a TypeError."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise invalid("%s: %r is not a finite number" % (where, f))
        return f
    if isinstance(value, Mapping):
        return {str(k): _json_plain(v, "%s.%s" % (where, k)) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray)):
        return _json_plain(value.tolist(), where)  # a numpy array or scalar
    if isinstance(value, (list, tuple)):
        return [_json_plain(v, "%s[%d]" % (where, i)) for i, v in enumerate(value)]
    raise TypeError("%s: expected JSON-like data (numbers, str, lists, dicts), got %s"
                    % (where, type(value).__name__))


def _vector(value, where, rows=False):
    """An intervention's `vector` as a list of Python floats: a numpy array
    of any float dtype (or anything numpy takes: a list, a torch CPU tensor),
    1-D or [1, width], finite; with `rows` (modes patch and patch_head) also
    [n, width], as a list of rows. f32 values convert to JSON exactly (a
    double holds them, and json writes the shortest repr that reads back)."""
    import numpy as np
    if isinstance(value, (str, bytes)) or isinstance(value, Mapping):
        raise TypeError("%s: expected a 1-D array or a list of numbers, got %s"
                        % (where, type(value).__name__))
    try:
        a = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError("%s: expected a 1-D array or a list of numbers (%s)" % (where, e)) from None
    if a.dtype.kind not in "fiu":
        raise TypeError("%s: expected floats, got an array of %s" % (where, a.dtype))
    if a.ndim == 2 and a.shape[0] == 1 and not rows:
        a = a[0]
    if a.ndim != 1 and not (rows and a.ndim == 2):
        raise invalid("%s: has shape %s; expected %s" % (
            where, tuple(a.shape), "rows [n, width]" if rows
            else "one vector ([width] or [1, width])"))
    a = a.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        i = int(bad[0])
        raise invalid("%s: value %d of %d is %s" % (where, i, a.size,
                                                    "nan" if np.isnan(a[i]) else "infinite"))
    return a.tolist()


def interventions_json(value, arg="interventions"):
    """The JSON text of the intervention document (docs/interventions.md) of
    the `interventions` argument, None for None or an empty list. `value`: a
    list of dicts with the file format's fields (hook, mode, scale,
    norm_match, positions (a slice is a span), vector or vector_file,
    tensor, head, rows, apply_to), or a whole
    document ({"interventions": [...]}, e.g. a loaded spec.json). `vector`
    may be a numpy array; `vector_file` (a str or os.PathLike) is read
    relative to the working directory. The extension parses the text against
    the model's config: its errors name the entry and the field
    ("interventions[0].vector: has 3 values but ... is 64 wide")."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if "interventions" not in value:
            raise TypeError("%s: expected a list of dicts (or a document with an "
                            "'interventions' list), got a dict without 'interventions'" % arg)
        value = value["interventions"]
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise TypeError("%s: expected a list of dicts, got %s" % (arg, type(value).__name__))
    entries = []
    for i, entry in enumerate(value):
        where = "%s[%d]" % (arg, i)
        if not isinstance(entry, Mapping):
            raise TypeError("%s: expected a dict, got %s" % (where, type(entry).__name__))
        plain = {}
        rows = entry.get("mode") in ("patch", "patch_head")
        for key, v in entry.items():
            if not isinstance(key, str):
                raise TypeError("%s: field names are str, got %r" % (where, key))
            field = "%s.%s" % (where, key)
            if key == "vector":
                plain[key] = _vector(v, field, rows)
            elif key == "positions" and isinstance(v, slice):  # p[a:b]: a span
                if v.step is not None:
                    raise invalid("%s: a slice with a step" % field)
                plain[key] = {"span": [_json_plain(v.start or 0, field),
                                       _json_plain(v.stop, field)]}
            else:
                plain[key] = _json_plain(v, field)
        entries.append(plain)
    if not entries:
        return None
    return json.dumps({"interventions": entries}, allow_nan=False)
