"""JSON that survives NaN and inf (strict JSON has no literal for them, so they travel as strings),
and the shape check of a JSON record read back into a dataclass."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from typing import Any

import numpy as np

# a JSON value's kind in JSON's own words, by the Python type json.loads gives it
JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
              float: "a number", type(None): "null"}  # fmt: skip


def json_safe(obj: Any) -> Any:
    """A copy of `obj` that strict JSON can hold, and that compares equal after a round trip.

    Non-finite floats become 'nan', 'inf' or '-inf'; tuples become lists; numpy scalars become
    the Python value they hold. Dicts and lists are copied recursively; anything else is returned
    as it is.
    """
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # str gives exactly 'nan', 'inf', '-inf'
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_number(value: Any) -> Any:
    """A float that `json_safe` wrote as 'nan', 'inf' or '-inf', back as the float; anything else as it is."""
    return float(value) if value in ("nan", "inf", "-inf") else value


def strict_dumps(obj: Any, indent: int | None = 1) -> str:
    """JSON text that every parser reads: `json_safe(obj)`, with no NaN or Infinity literal left."""
    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)


def json_kind(value: Any) -> str:
    """'an object', 'an array', 'a string', 'a number', 'a boolean' or 'null': what a JSON value is."""
    return JSON_KINDS.get(type(value), type(value).__name__)


def _kinds(hint: Any) -> tuple[type, ...]:
    """The Python types of the JSON values a type hint allows: any number for int and float (JSON has
    one number), an object for a dict or a dataclass, the literals' types for a Literal."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return tuple({type(a) for a in args})
    if origin in (typing.Union, types.UnionType):
        return tuple(kind for a in args for kind in _kinds(a))
    if hint in (int, float):
        return (int, float)
    if dataclasses.is_dataclass(hint):
        return (dict,)
    return (origin or hint,)


@functools.cache
def _field_kinds(cls: type) -> dict[str, tuple[type, ...]]:
    # only the kinds JSON has: a hint such as Any or os.PathLike does not constrain a stored value
    hints = typing.get_type_hints(cls)
    return {name: tuple(k for k in _kinds(hint) if k in JSON_KINDS) for name, hint in hints.items()}


def field_problem(record: dict, cls: type) -> str | None:
    """The first field of `record` whose JSON value is not of the kind the dataclass `cls` declares
    for it ("'learned' is a string, not an object"); None when every field is. Nulls and fields
    `cls` does not declare are left alone: older records lack fields, or hold null where a newer
    ffnlab measures something."""
    kinds = _field_kinds(cls)
    for name, value in record.items():
        allowed = kinds.get(name, ())
        if value is not None and allowed and not isinstance(value, allowed):
            return f"'{name}' is {json_kind(value)}, not {JSON_KINDS[allowed[0]]}"
    return None
