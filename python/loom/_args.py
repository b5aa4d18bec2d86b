"""Arguments of the Python API that take more than one spelling: dtypes and
precisions (Loom's names, torch-style names, numpy and torch dtypes) and
layers (ints, fractions as floats, strings, lists of them). Everything else
is type-checked by the extension, whose errors name the argument."""

import math
import numbers

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
