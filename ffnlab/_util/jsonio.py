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


def field_problem(record: dict[str, Any], cls: type) -> str | None:
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


_hints = functools.cache(typing.get_type_hints)


def json_problem(value: Any, hint: Any, where: str = "") -> str | None:
    """Where the JSON `value` is not what the type `hint` describes, in words ("rows[0].latency.median_s is a
    string, not a number"; `where` names `value`, "" the whole document); None where it is what it describes.

    Unlike `field_problem` it descends: a dataclass is an object holding its fields (those without a default
    present; keys it does not declare are left to its reader), a list or a dict element by element (an int key
    as JSON writes one, a string of digits). A null is allowed where the hint allows None, a float may be
    `json_safe`'s 'nan', 'inf' or '-inf', and Any, or a hint JSON has no kind for, allows anything."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    here = where or "it"
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [json_problem(value, a, where) for a in args if a is not type(None)]
        return None if None in problems else problems[0]
    if hint is Any or (value is None and hint is type(None)):
        return None
    wanted = {**JSON_KINDS, int: "an integer"}.get(origin or hint)
    if value is None:
        return f"{here} is null, not {'an object' if dataclasses.is_dataclass(hint) else wanted or 'a value'}"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            return f"{here} is {json_kind(value)}, not an object"
        hints = _hints(hint)
        for f in dataclasses.fields(hint):
            if f.name in value:
                problem = json_problem(value[f.name], hints[f.name], f"{where}.{f.name}" if where else f.name)
                if problem:
                    return problem
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return f"{here} has no '{f.name}'"
        return None
    if origin is typing.Literal:
        return None if value in args else f"{here} is {value!r}, not one of {', '.join(map(repr, args))}"
    if hint is float and value in ("nan", "inf", "-inf"):
        return None
    kinds = {float: (int, float), int: (int,), bool: (bool,), str: (str,), list: (list,), dict: (dict,)}
    allowed = kinds.get(origin or hint)
    if allowed is None:  # a hint JSON has no kind for
        return None
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        return f"{here} is {json_kind(value)}, not {wanted}"
    if isinstance(value, list) and args:
        for i, item in enumerate(value):
            if problem := json_problem(item, args[0], f"{where}[{i}]"):
                return problem
    if isinstance(value, dict) and args:
        for key, item in value.items():
            if args[0] is int and not (isinstance(key, str) and key.lstrip("-").isdigit()):
                return f"{here} has the key {key!r}, not an integer"
            if problem := json_problem(item, args[1], f"{where}[{key!r}]"):
                return problem
    return None
