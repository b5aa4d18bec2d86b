"""The one key scheme of arrays returned or opened by loom, and the lookup of
the names users write.

Every array is keyed "<hook>.<selector>": the resolved hook name and the
selector's file-name part, as `loom extract` names its files
("blocks.2.hook_resid_post.last", "logits.pos_0_-1"); the offsets of a
ragged selector are "<selector>.offsets" ("all.offsets"). Model.extract,
Model.generate and open_activations all use it.

A lookup also takes the names as the user wrote them:
  - the hook as any spelling that names that one hook: the pattern given
    ("blocks.{0.5}.hook_resid_post", "blocks.-1.hook_resid_post"), or its
    resolved name;
  - the selector as its spec ("pos:0,-1") or its file-name part
    ("pos_0_-1"), or left out when the hook was captured with one selector;
  - (hook, selector) as a tuple.
"""

from . import _loom

__all__ = ["KeyResolver", "ArrayDict", "OffsetsDict"]


class KeyResolver:
    """Resolves user spellings to the canonical keys of a set of arrays.

    entries: (key, hook, selector spec, selector file part) of each array;
    num_layers: the model's layers (None: hook patterns are not resolved)."""

    def __init__(self, entries, num_layers):
        self.num_layers = num_layers
        self.by_hook = {}  # hook -> {selector file part: key}
        self.selector_file = {}  # spec or file part -> file part
        for key, hook, spec, part in entries:
            self.by_hook.setdefault(hook, {})[part] = key
            self.selector_file[spec] = part
            self.selector_file[part] = part
        # Longest first: "span_1_-1" before a shorter suffix of it.
        self._suffixes = sorted(self.selector_file, key=len, reverse=True)

    def hook(self, name):
        """The resolved hook `name` spells, or None."""
        if name in self.by_hook:
            return name
        if self.num_layers is None or not isinstance(name, str):
            return None
        try:
            names = _loom._hook_pattern_names(name, self.num_layers)
        except (ValueError, TypeError, _loom.LoomError):
            return None
        return names[0] if len(names) == 1 and names[0] in self.by_hook else None

    def _for_hook(self, hook_name, part, original):
        hook = self.hook(hook_name)
        if hook is None:
            return None
        parts = self.by_hook[hook]
        if part is not None:
            return parts.get(part)
        if len(parts) == 1:
            return next(iter(parts.values()))
        raise KeyError("%r: %s was captured with %d selectors; ask for one of %s"
                       % (original, hook, len(parts),
                          ", ".join(repr(k) for k in parts.values())))

    def resolve(self, key, offsets=()):
        """The canonical key of `key`, or None. `offsets`: the offsets keys
        ("all.offsets"), resolved from a selector spec too. Raises KeyError
        for a hook captured with several selectors and no selector named."""
        if isinstance(key, tuple) and len(key) == 2:
            hook, selector = key
            part = self.selector_file.get(selector)
            if part is None:
                try:
                    part = _loom._selector_names(selector)[1]
                except (ValueError, TypeError, _loom.LoomError):
                    return None
            return self._for_hook(hook, part, key)
        if not isinstance(key, str):
            return None
        if key.endswith(".offsets"):
            part = self.selector_file.get(key[: -len(".offsets")])
            if part is not None and part + ".offsets" in offsets:
                return part + ".offsets"
        for selector in self._suffixes:
            if key.endswith("." + selector):
                found = self._for_hook(key[: -len(selector) - 1], self.selector_file[selector],
                                       key)
                if found is not None:
                    return found
        return self._for_hook(key, None, key)


def _missing(key, keys):
    return KeyError("%r: no such array (keys: %s)" % (key, ", ".join(keys)))


class LookupMixin:
    """`in` and get() for a mapping whose [] resolves several spellings."""

    def __contains__(self, key):
        try:
            self[key]
            return True
        except KeyError:
            return False

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default


class ArrayDict(LookupMixin, dict):
    """A dict of numpy arrays keyed "<hook>.<selector>" (and
    "<selector>.offsets") whose lookups (`d[key]`, `key in d`, `d.get`) also
    take the user's spellings (see loom._keys)."""

    _resolver = None

    def _canonical(self, key):
        if dict.__contains__(self, key):
            return key
        if self._resolver is None:
            return None
        return self._resolver.resolve(key, offsets=self)

    def __getitem__(self, key):
        try:
            return dict.__getitem__(self, key)
        except (KeyError, TypeError):
            pass
        found = self._canonical(key)
        if found is None:
            raise _missing(key, self.keys())
        return dict.__getitem__(self, found)

    def __contains__(self, key):
        try:
            return self._canonical(key) is not None
        except KeyError:
            return False


    def key_of(self, key):
        """The canonical key a spelling resolves to (KeyError if none)."""
        found = self._canonical(key)
        if found is None:
            raise _missing(key, self.keys())
        return found


class OffsetsDict(LookupMixin, dict):
    """{selector file part: int64 offsets} whose lookups also take the
    selector's spec ("span:1:-1" for "span_1_-1")."""

    _selector_file = None

    def __getitem__(self, key):
        try:
            return dict.__getitem__(self, key)
        except (KeyError, TypeError):
            pass
        part = (self._selector_file or {}).get(key) if isinstance(key, str) else None
        if part is None or not dict.__contains__(self, part):
            raise KeyError("%r: no offsets for this selector (ragged selectors: %s)"
                           % (key, ", ".join(self.keys())))
        return dict.__getitem__(self, part)


