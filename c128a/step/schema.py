"""Dataclasses from plain JSON, every field checked against its annotation.

The schema of a saved case is the dataclasses themselves: :func:`from_json`
walks ``dataclasses.fields`` and their type hints, so a field added to
:class:`~c128a.step.batch.Batch` or a case is read and checked without a
second list to keep in step. Integers carry their allowed range in the
annotation (``Annotated[int, Range(0, 8192)]``), checked before anything is
built from them; a bad value is a :class:`~c128a.failures.CaseError` naming
the field and the rule.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from ..failures import CaseError, HarnessError


@dataclass(frozen=True)
class Range:
    """An integer field's allowed values, both ends included."""

    low: int
    high: int

    def __str__(self) -> str:
        return f"[{self.low:,}, {self.high:,}]"


INT32 = Range(-(2**31), 2**31 - 1)
INT64 = Range(-(2**63), 2**63 - 1)
Int32 = Annotated[int, INT32]
Int64 = Annotated[int, INT64]


@functools.lru_cache(maxsize=None)
def type_hints(cls) -> dict[str, Any]:
    """A dataclass's field annotations, resolved (with their ``Annotated`` extras)."""
    return typing.get_type_hints(cls, include_extras=True)


def from_json(cls, data: Any, path, field: str, converters=None):
    """An instance of dataclass ``cls`` from its JSON ``data``.

    Unknown and missing required fields, wrong types and integers out of
    range raise :class:`CaseError` naming ``field.name``; fields with
    ``metadata={"json": False}`` are not read. ``converters``
    maps a field name to a function (value, path, field) -> value for
    fields whose JSON form is not their annotation (a nested object).
    """
    converters = converters or {}
    if not isinstance(data, dict):
        raise CaseError(path, field, f"must be a JSON object, got {_json_type(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.metadata.get("json", True)}
    for name in sorted(set(data) - set(fields)):
        raise CaseError(path, _join(field, name), f"unknown field (not a {cls.__name__} field)")
    values = {}
    for name, spec in fields.items():
        where = _join(field, name)
        if name not in data:
            required = (
                spec.default is dataclasses.MISSING
                and spec.default_factory is dataclasses.MISSING
            )
            if required:
                raise CaseError(path, where, "missing (required)")
            continue
        if name in converters:
            values[name] = converters[name](data[name], path, where)
        else:
            values[name] = read_value(type_hints(cls)[name], data[name], path, where)
    return cls(**values)


def read_value(annotation, value: Any, path, where: str):
    """``value`` checked against ``annotation``: int (with its Range), str,
    bool, float, ``Literal[...]`` (one of its strings), ``tuple[T, ...]``,
    ``dict[str, T]``, ``T | None``, and a nested dataclass."""
    bounds = None
    if typing.get_origin(annotation) is Annotated:
        annotation, *extras = typing.get_args(annotation)
        bounds = next((e for e in extras if isinstance(e, Range)), None)
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return read_value(inner, value, path, where)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if not (isinstance(value, str) and value in choices):
            listed = ", ".join(repr(c) for c in choices)
            raise CaseError(path, where, f"must be one of {listed}, got {value!r:.40}")
        return value
    if annotation is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise CaseError(path, where, f"must be an integer, got {_json_type(value)} {value!r:.40}")
        if bounds is not None and not bounds.low <= value <= bounds.high:
            raise CaseError(path, where, f"{value} is outside {bounds}")
        return value
    if dataclasses.is_dataclass(annotation):
        # A nested record (a Batch in a list of steps): its own reader where
        # it has one (Batch bounds its sizes too), else field by field.
        reader = getattr(annotation, "from_json", None)
        if reader is not None:
            return reader(value, path, where)
        return from_json(annotation, value, path, where)
    if annotation in (str, bool):
        if type(value) is not annotation:
            raise CaseError(path, where, f"must be a {annotation.__name__}, got {_json_type(value)}")
        return value
    if annotation is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise CaseError(path, where, f"must be a number, got {_json_type(value)}")
        return float(value)
    if origin is tuple:
        inner, *rest = typing.get_args(annotation)
        if rest != [Ellipsis]:
            raise HarnessError(f"{where}: the schema reads tuple[T, ...] only, not {annotation!r}")
        if not isinstance(value, list):
            raise CaseError(path, where, f"must be a list, got {_json_type(value)}")
        return tuple(read_value(inner, v, path, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        _, inner = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise CaseError(path, where, f"must be an object, got {_json_type(value)}")
        return {str(k): read_value(inner, v, path, f"{where}.{k}") for k, v in value.items()}
    raise HarnessError(f"{where}: the schema has no reader for {annotation!r}")


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data, the inverse of :func:`from_json`: a
    dataclass through its own ``to_json`` where it has one, else field by
    field (fields with ``metadata={"json": False}`` left out); tuples as
    lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "to_json", None)
        if own is not None:
            return own()
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.metadata.get("json", True)}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _json_type(value: Any) -> str:
    return {
        dict: "an object", list: "a list", str: "a string", bool: "a boolean",
        int: "an integer", float: "a number", type(None): "null",
    }.get(type(value), type(value).__name__)
