"""The registry: every commit rule, cache policy, proposal and model family by name.

A method is one frozen dataclass that registers itself; its parameters are its fields::

    @register("rule", "eb")
    @dataclass(frozen=True)
    class EntropyBounded(CommitRule):
        gamma: float = field(default=0.1, metadata=param("entropy budget per step", min=0.0))

Field metadata (:func:`param`): ``help`` (one line, required for a user parameter), ``min`` /
``max`` (``open_min``: the minimum itself excluded; a float is finite unless ``max`` is ``inf``),
``choices``, ``sweep`` (the values the ``sweep`` grid walks) and ``tag`` (its short name in a
cell's name), ``probe`` (the value the contract tests run, when the default would not exercise the
method on a tiny random model), ``derived``: the field is filled from the sampler spec, not by the
user (``"steps_per_block"``, ``"block_length"``, ``"at_block"``).

Everything that lists methods reads them from here: the CLI flags and ``--help``
(``harness.cli``), the :class:`dlm.spec.Sampler` options, lm-eval ``model_args``, the grids
and the contract tests. The method packages register on import; :func:`load` imports every
package named in the ``dlm.methods`` entry-point group (``pyproject.toml``), so a new module in
one of them is found without being named anywhere else.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import lru_cache
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

try:
    import tomllib  # Python >= 3.11; on 3.10 the fallback needs the install's entry points
except ModuleNotFoundError:  # pragma: no cover
    tomllib = None

KINDS = ("rule", "policy", "proposal", "family")
_ENTRIES: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}
_LOADED = False
_ORDER: dict[type, int] = {}  # registration order (source order within a module)
_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def param(help: str, *, min: Optional[float] = None, max: Optional[float] = None, open_min: bool = False,
          choices: Optional[tuple] = None, sweep: tuple = (), tag: Optional[str] = None, probe: Any = None,
          derived: Optional[str] = None) -> dict:
    """The metadata of a registered parameter (a dataclass field's ``metadata``)."""
    return dict(help=help, min=min, max=max, open_min=open_min, choices=choices, sweep=sweep, tag=tag, probe=probe,
                derived=derived)


@dataclass(frozen=True)
class Param:
    """One parameter of a registered method, read from its dataclass field."""

    name: str
    type: type
    optional: bool  # None is a value (``Optional[...]``)
    default: Any
    help: str
    min: Optional[float] = None
    max: Optional[float] = None
    open_min: bool = False
    choices: Optional[tuple] = None
    sweep: tuple = ()
    tag: str = ""  # the short name in a sweep cell's name (``thr`` of ``sw_dual_thr0p9``)
    probe: Any = None  # the value the contract tests run (one that exercises the method on a tiny random model)
    derived: Optional[str] = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, owner: str, value):
        """``value`` validated and normalised (an int given for a float becomes a float);
        TypeError / ValueError naming ``owner`` and this parameter."""
        where = f"{self.name} (an option of {owner})"
        if value is None:
            if self.optional:
                return None
            raise TypeError(f"{where} must be a {self.type.__name__}, got None")
        if self.type is bool:
            if not isinstance(value, bool):
                raise TypeError(f"{where} must be a bool, got {type(value).__name__}")
            return value
        if self.type is str:
            if not isinstance(value, str):
                raise TypeError(f"{where} must be a str, got {type(value).__name__}")
        elif isinstance(value, bool) or not isinstance(value, numbers.Real) or (
                self.type is int and not isinstance(value, numbers.Integral)):
            raise TypeError(f"{where} must be {'an int' if self.type is int else 'a real number'}, "
                            f"got {type(value).__name__}")
        else:
            value = self.type(value)
            low_bad = self.min is not None and (value < self.min or (self.open_min and value == self.min))
            infinite = self.type is float and not math.isfinite(value) and not (value == math.inf == self.max)
            if infinite or low_bad or (self.max is not None and value > self.max):
                lo = "-inf" if self.min is None else f"{self.min:g}"
                hi = "inf" if self.max is None else f"{self.max:g}"
                raise ValueError(f"{where} must be in {'(' if self.open_min else '['}{lo}, {hi}], got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{where} must be one of {self.choices}, got {value!r}")
        return value


def _param(f) -> Param:
    type_name = f.type if isinstance(f.type, str) else f.type.__name__
    optional = type_name.startswith("Optional[")
    base = type_name[len("Optional["):-1] if optional else type_name
    if base not in _TYPES:
        raise TypeError(f"registered field {f.name}: type {type_name!r} is not one of int, float, bool, str "
                        "(optionally Optional[...])")
    meta = dict(f.metadata)
    default = f.default if f.default is not MISSING else None
    if not meta.get("derived") and not meta.get("help"):
        raise TypeError(f"registered field {f.name} has no help: use field(metadata=param('...'))")
    return Param(f.name, _TYPES[base], optional, default, meta.get("help", ""), meta.get("min"), meta.get("max"),
                 meta.get("open_min", False), meta.get("choices"), tuple(meta.get("sweep", ())),
                 meta.get("tag") or f.name, meta.get("probe"), meta.get("derived"))


def register(kind: str, name: str):
    """Class decorator: ``cls`` (a frozen dataclass) is the ``kind`` named ``name``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def add(cls: type) -> type:
        if not is_dataclass(cls) or not cls.__dataclass_params__.frozen:
            raise TypeError(f"{kind} {name!r}: {cls.__name__} must be a frozen dataclass")
        old = _ENTRIES[kind].get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"{kind} {name!r} is registered twice: {old.__module__}.{old.__qualname__} "
                             f"and {cls.__module__}.{cls.__qualname__}")
        cls.name = name
        cls.params = tuple(_param(f) for f in fields(cls) if f.init)
        init = cls.__init__

        def __init__(self, *args, **kwargs):  # every construction checks the user parameters
            init(self, *args, **kwargs)
            for p in user_params(cls):
                p.check(f"{kind} {name!r}", getattr(self, p.name))

        cls.__init__ = __init__
        _ENTRIES[kind][name] = cls
        _ORDER[cls] = len(_ORDER)
        return cls

    return add


@lru_cache(maxsize=None)
def _method_modules() -> tuple[tuple[str, str], ...]:
    """``(name, module)`` of the ``dlm.methods`` entry points, in name order; from the checkout's
    ``pyproject.toml`` when the project is not installed (the same table, one source)."""
    found = {ep.name: ep.value for ep in entry_points(group="dlm.methods")}
    if not found:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        if pyproject.is_file() and tomllib is not None:
            table = tomllib.loads(pyproject.read_text()).get("project", {}).get("entry-points", {})
            found = dict(table.get("dlm.methods", {}))
    return tuple(sorted(found.items()))


@lru_cache(maxsize=None)
def _packages() -> tuple[str, ...]:
    """The method packages' top-level names: the core first, then the entry points' in name order."""
    return tuple(dict.fromkeys(["dlm"] + [module.split(".")[0] for _, module in _method_modules()]))


def load() -> None:
    """Import every method package of the ``dlm.methods`` entry points (once)."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for _, module in _method_modules():
            import_module(module)


def names(kind: str) -> tuple[str, ...]:
    """Registered names of ``kind`` in a fixed order whatever the import order: by package (the
    core first), module, then place in the module."""
    load()
    return _sorted_names(kind, len(_ORDER))  # cached until the next registration


@lru_cache(maxsize=None)
def _sorted_names(kind: str, registrations: int) -> tuple[str, ...]:
    packages = _packages()

    def key(item):
        cls = item[1]
        top = cls.__module__.split(".")[0]
        return (packages.index(top) if top in packages else len(packages), cls.__module__, _ORDER[cls])

    return tuple(name for name, _ in sorted(_ENTRIES[kind].items(), key=key))


def get(kind: str, name: str) -> type:
    load()
    if name not in _ENTRIES[kind]:
        raise ValueError(f"unknown {kind} {name!r}; registered: {', '.join(_ENTRIES[kind])}")
    return _ENTRIES[kind][name]


def user_params(cls: type) -> tuple[Param, ...]:
    return tuple(p for p in cls.params if p.derived is None)


def build(kind: str, name: str, options: Mapping[str, Any], derived: Mapping[str, Any] = {}):
    """The ``kind`` ``name`` with the given ``options`` (each one of its user parameters, checked)
    and its derived fields from ``derived``; unknown options raise naming the method."""
    cls = get(kind, name)
    own = {p.name: p for p in user_params(cls)}
    for key in options:
        if key not in own:
            raise ValueError(f"{key} is not an option of {kind} {name!r} (its options: {', '.join(own) or 'none'})")
    values = {k: own[k].check(f"{kind} {name!r}", v) for k, v in options.items()}
    values.update({p.name: derived[p.derived] for p in cls.params if p.derived is not None and p.derived in derived})
    return cls(**values)


def every_param(kinds: Iterable[str] = KINDS) -> dict[str, list[tuple[str, str, Param]]]:
    """``{parameter name: [(kind, method name, Param), ...]}`` over every registered user
    parameter (one CLI flag per name)."""
    out: dict[str, list] = {}
    for kind in kinds:
        for name in names(kind):
            for p in user_params(_ENTRIES[kind][name]):
                out.setdefault(p.name, []).append((kind, name, p))
    return out
