"""Reading `params.yaml` as DVC reads it, and building typed settings from its sections.

Every section becomes a frozen dataclass through `typed`, the one loader behind the pipeline, the CLI and
a notebook run by hand. The dataclass says what a section holds: each key is a field, checked against the
field's type and, where its metadata says so (`choice`, `bounded`, `checked`), its allowed values. A key the class
does not know is refused, and so is a missing one unless its field has a default: the learning settings
have none, so their values live in `params.yaml` only. Every error names the file and the key.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dl2.errors import Dl2Error
from dl2.paths import repo_root


def default_params_path() -> Path:
    return repo_root() / "params.yaml"


def load_params(path: str | Path | None = None) -> dict[str, Any]:
    """Read a params file (default: the project's `params.yaml`) as a dict, as YAML 1.2 like DVC, which
    rewrites it for `dvc exp run -S` (so `off` stays the string "off")."""
    path = Path(path) if path is not None else default_params_path()
    if not path.is_file():
        raise Dl2Error(f"{path}: params file not found")
    try:
        params = _parse_yaml(path.read_text())
    except UnicodeDecodeError:
        raise Dl2Error(f"{path}: not a YAML text file") from None
    except YAMLError as exc:
        raise Dl2Error(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(params, dict):
        raise Dl2Error(f"{path}: expected a mapping of sections at the top level")
    return copy.deepcopy(params)


@functools.lru_cache(maxsize=8)
def _parse_yaml(text: str) -> Any:
    """YAML 1.2, parsed once per distinct text (the pure-Python parser takes ~0.2 s for params.yaml)."""
    return YAML(typ="safe", pure=True).load(text)


def section(params: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    """The mapping `params[name]` itself, or an error naming it."""
    value = params.get(name)
    if value is None:
        raise Dl2Error(f"{where}: section {name!r} is missing")
    if not isinstance(value, Mapping):
        raise Dl2Error(f"{where}: {name}: expected a mapping of keys, got {value!r}")
    return value


class Checked:
    """Base of typed settings: every field is checked against its metadata (`choice`, `bounded`, `checked`)
    however the object is built, from `params.yaml` by `typed` or in code. Errors name the field; `typed`
    adds the file and section. A subclass with checks of its own calls `super().__post_init__()` first."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "check" in f.metadata:  # stores what the check returns: a name as its owner spells it
                object.__setattr__(self, f.name, _checked(value, f))
            else:
                _checked(value, f)


def choice(*options: str) -> Any:
    """A field whose value (or each value of a tuple) is one of `options` (no default)."""
    return dataclasses.field(metadata={"choices": options})


def checked(check: Callable[..., Any], **options: Any) -> Any:
    """A field whose value (or each value of a tuple) `check(value, key=field name, **options)` returns as it is
    to be stored, or refuses with a Dl2Error naming the key (no default): a check that other settings and
    commands share, such as `dl2.schedulers.names.check_policy`."""
    return dataclasses.field(metadata={"check": functools.partial(check, **options)})


def bounded(at_least: float | None = None, above: float | None = None, below: float | None = None,
            at_most: float | None = None, default: Any = dataclasses.MISSING) -> Any:
    """A number field (or each number of a tuple field) within bounds: `at_least` and `at_most` (inclusive),
    `above` and `below` (exclusive)."""
    return dataclasses.field(default=default, metadata={"at_least": at_least, "above": above, "below": below,
                                                       "at_most": at_most})


def check_keys(cls: type, values: Mapping[str, Any], keys: Iterable[str], where: str, prefix: str) -> None:
    """Check the keys `keys` of the mapping `values` as `typed` checks those fields of `cls`, without building
    one: keys a section holds for another reader (another learner's, say). Each must be there."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in keys:
        if key not in values:
            raise Dl2Error(f"{where}: {prefix}.{key} is missing")
        value = _as_type(values[key], hints[key], f"{where}: {prefix}.{key}")
        try:
            _checked(value, fields[key])
        except Dl2Error as exc:
            raise Dl2Error(f"{where}: {prefix}.{exc}") from None


def typed(cls: type, values: Mapping[str, Any], where: str, prefix: str, **given: Any) -> Any:
    """Dataclass `cls` (a `Checked`) from the mapping `values`, the keys `prefix.*` of file `where`. Fields in
    `given` are supplied by the caller (an object the section names, a seed) and taken as they are."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in values:
        if key not in fields:
            known = ", ".join(k for k in fields if k in values or k not in given)
            raise Dl2Error(f"{where}: {prefix}.{key}: unknown key (known: {known})")
    kwargs = dict(given)
    for key, f in fields.items():
        if key in given:
            continue
        if key not in values:
            if f.default is dataclasses.MISSING:
                raise Dl2Error(f"{where}: {prefix}.{key} is missing")
            continue
        kwargs[key] = _as_type(values[key], hints[key], f"{where}: {prefix}.{key}")
    try:
        return cls(**kwargs)
    except Dl2Error as exc:
        raise Dl2Error(f"{where}: {prefix}.{exc}") from None


def _as_type(value: Any, kind: Any, where: str) -> Any:
    """`value` as type `kind`: int, float (an int is taken), bool, str, dict, tuple[X, ...] (from a
    non-empty list), or X | None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        (kind,) = [a for a in args if a is not type(None)]
        args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, (list, tuple)) or not value:
            raise Dl2Error(f"{where}: expected a non-empty list, got {value!r}")
        return tuple(_as_type(v, args[0], where) for v in value)
    if kind is dict:
        if not isinstance(value, Mapping):
            raise Dl2Error(f"{where}: expected a mapping, got {value!r}")
        return copy.deepcopy(dict(value))
    if kind is bool:
        if not isinstance(value, bool):
            raise Dl2Error(f"{where}: expected true or false, got {value!r}")
        return value
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise Dl2Error(f"{where}: expected {'an integer' if kind is int else 'a number'}, got {value!r}")
        return kind(value)
    if kind is str:
        if not isinstance(value, str):
            raise Dl2Error(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: typed() cannot read a field of type {kind!r}; pass it in `given`")


def _checked(value: Any, f: dataclasses.Field) -> Any:
    """`value` (or each value of a tuple) checked against field `f`'s metadata, as `f.metadata["check"]` returns it."""
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        _within(item, f.metadata, f.name)
    check = f.metadata.get("check")
    if check is None:
        return value
    items = tuple(check(item, key=f.name) for item in items)
    return items if isinstance(value, tuple) else items[0]


def _within(value: Any, meta: Mapping[str, Any], key: str) -> None:
    """Raise unless `value` is one of `meta`'s choices and within its bounds (None: nothing to check)."""
    options = meta.get("choices")
    if options and value not in options:
        raise Dl2Error(f"{key}: expected one of {', '.join(options)}, got {value!r}")
    if value is None or isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        return
    limits = ((meta.get("at_least"), value >= (meta.get("at_least") or 0), "at least"),
              (meta.get("above"), value > (meta.get("above") or 0), "above"),
              (meta.get("below"), value < (meta.get("below") or 0), "below"),
              (meta.get("at_most"), value <= (meta.get("at_most") or 0), "at most"))
    for bound, ok, words in limits:
        if bound is not None and not ok:
            raise Dl2Error(f"{key}: expected a number {words} {bound:g}, got {value!r}")
