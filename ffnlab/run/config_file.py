"""A run's configuration from its sources: a base (a preset), a `--config` TOML file and the flags given.

The file holds the fields of `TrainConfig` (a `[model]` table for `ModelConfig`; `compare` adds `[study]`,
ffnlab.study.plan), each key checked against its field's type as it is read; `--print-config` writes the
same form back (`file_fields`, `to_toml`), so what it prints is what a file reads. The flags themselves are
derived from the same fields (ffnlab.flags).
"""

from __future__ import annotations

import json
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ffnlab._util.names import closest
from ffnlab._util.reading import read_text
from ffnlab.core.model import ModelConfig
from ffnlab.data.checkpoint_tokenizer import check_tokenizer_files, has_tokenizer
from ffnlab.run.config import TrainConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# fields a run computes, never read from a file: a value there would change the run's identity, not what it trains
COMPUTED = {
    "vocab_size": "set from the tokenizer",
    "init_digest": "computed from the --from folder",
    "special_tokens": "set from the tokenizer and task",
}
# a config file holds a few KiB of settings (a Hugging Face config's table included): a larger file is
# something else given by mistake (a data set), and reading stops here instead of filling memory
MAX_CONFIG_BYTES = 2**20
# a table's type: a config dataclass (its fields are the table's keys), or a dict of each key's type hint
TableType = type | dict[str, Any]
# the tables of a run's config file: its top level and [model]
RUN_TABLES: dict[str, TableType] = {"": TrainConfig, "model": ModelConfig}
# TrainConfig's own fields, ModelConfig's in their table
RUN_FIELDS = [f.name for f in fields(TrainConfig) if f.name != "model"]


def config_from_sources(base: TrainConfig, file: dict[str, Any], flags: dict[str, Any]) -> TrainConfig:
    """Copy of `base` (a preset's config) with the --config file's fields, then every flag given over them.
    `file` and `flags` have one shape, the file's: TrainConfig's fields, 'model' for ModelConfig's (other
    tables are not the run's). Then the rules a run adds: max_seconds alone sets max_steps to 10**9, so that
    time is the only limit; a Hugging Face config given as a path is read (its architecture checked now, before
    any run); and fine-tuning (init_from) keeps the folder's activation unless model.ffn is given, its own
    tokenizer (tokenizer.json or a fast tokenizer's vocabulary files) unless tokenizer is, and its model's context
    unless model.context is (ValueError where that is longer than the model's positions)."""
    run = {k: v for source in (file, flags) for k, v in source.items() if k in RUN_FIELDS}
    model = {**file.get("model", {}), **flags.get("model", {})}
    if "max_seconds" in run and "max_steps" not in run and "max_tokens" not in run:
        run["max_steps"] = 10**9
    hf_config = run.pop("hf_config", None)
    if hf_config:  # a path (--hf-config) or the file's [hf_config] table
        from ffnlab.tools.hf import load_hf_config, model_family

        run["hf_config"] = load_hf_config(hf_config)
        model_family(run["hf_config"])  # an unsupported architecture fails here, before any run
    init_from = run.get("init_from", base.init_from)
    if init_from and "ffn" not in model:  # fine-tuning keeps the folder's activation unless --ffn swaps it
        from ffnlab.tools.pretrained import pretrained_ffn

        model["ffn"] = pretrained_ffn(init_from)
    if init_from:  # and the context of the folder's model unless --context is given, and no longer than it
        from ffnlab.tools.pretrained import pretrained_context

        model["context"] = pretrained_context(init_from, model.get("context"))
    if init_from and "tokenizer" not in run and has_tokenizer(init_from):
        # the folder's own tokenizer, unless --tokenizer says otherwise; a FIFO or a dangling link there is
        # refused, not passed over for the char tokenizer
        check_tokenizer_files(init_from)
        run["tokenizer"] = "pretrained"
    return replace(base, model=replace(base.model, **model), **run)


def flag_type(hint: object) -> tuple[type | None, tuple[str, ...] | None]:
    """(python type, choices) of a field's type hint, as a flag takes it and a file's value is checked:
    `X | None` -> X, `Literal[...]` -> str and its values; (None, None) for any other type."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return str, tuple(typing.get_args(hint))
    if args and type(None) in typing.get_args(hint):
        return flag_type(args[0])
    return (hint, None) if isinstance(hint, type) and hint in (int, float, str, bool) else (None, None)


def read_toml(path: str | Path, tables: Mapping[str, TableType]) -> dict[str, Any]:
    """A config file as a dict, every key checked against its type: top-level keys against tables[''], each
    [table] against its own. A table's type is a dataclass (its fields) or a dict {key: type}. ValueError
    naming the file and the first problem."""
    path = Path(path)
    try:
        data = tomllib.loads(config_text(path))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {path} is not valid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and tables by recursion
        raise ValueError(f"config file {path} is not valid TOML: arrays or tables nested too deeply") from None
    top = {**types_of(tables[""]), **{table: valid for table, valid in tables.items() if table}}
    return checked_table(data, top, path, "")


def config_text(path: Path) -> str:
    """The text of a config file: a regular file of UTF-8 text, at most MAX_CONFIG_BYTES
    (`ffnlab._util.reading.read_text`); FileNotFoundError or ValueError naming the file otherwise."""
    try:
        return read_text(path, "config file", MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None


def table_types(hint: Any) -> dict[str, Any] | None:
    """{key: type} of a table's type, a dataclass (its fields) or a dict {key: type}; None for other types."""
    if is_dataclass(hint):
        return typing.get_type_hints(hint)
    return hint if isinstance(hint, dict) else None


def types_of(table: Any) -> dict[str, Any]:
    """`table_types` of a type known to be a table."""
    types = table_types(table)
    if types is None:
        raise TypeError(f"{table!r} is not a table's type")
    return types


def checked_table(data: dict[str, Any], types: Mapping[str, Any], path: Path, table: str) -> dict[str, Any]:
    """`data`, the [table] of the config file `path` ('' its top level), with each key known to `types` and
    its value checked against its type (checked_value); ValueError naming the first unknown key."""
    where = f"[{table}] " if table else ""
    for key, value in data.items():
        if key not in types:
            raise ValueError(
                f"config file {path}: unknown key {where}'{key}'{closest(key, types)}; valid: {', '.join(sorted(types))}"
            )
        if key in COMPUTED:
            raise ValueError(f"config file {path}: {where}'{key}' is {COMPUTED[key]}, not read from a file; drop it")
        data[key] = checked_value(value, types[key], path, table, key)
    return data


TYPE_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}


def checked_value(value: object, hint: object, path: Path, table: str, key: str) -> object:
    """The value of `key` in the [table] of the config file `path`, checked against its type `hint`: a table
    key by key, `list[X]` and `dict[str, X]` item by item, a flag's type as the flag takes it (scalar_value).
    ValueError naming the file, the key and the type otherwise."""
    what = f"config file {path}: " + (f"[{table}] " if table else "") + f"'{key}'"
    inner = f"{table}.{key}" if table else key
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if table_types(hint) is not None or origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{what} must be a table ([{inner}]), got {value!r}")
        if origin is dict:  # any keys, each value of one type (the variants of [study.per_variant])
            return {k: checked_value(v, args[1], path, inner, k) for k, v in value.items()}
        return checked_table(value, types_of(hint), path, inner)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{what} must be a list ([...]), got {value!r}")
        return [scalar_value(v, args[0], f"{what} (item {i + 1})") for i, v in enumerate(value)]
    return scalar_value(value, hint, what)


def scalar_value(value: object, hint: object, what: str) -> object:
    """`value` read from a file for a field typed `hint` (an int where a float belongs becomes a float, so
    the run's identity is the flag's); ValueError naming `what`, the type and the choices otherwise."""
    kind, choices = flag_type(hint)
    if kind is None:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{what} must be {TYPE_NAMES[kind]}, got {value!r}")
    if choices and value not in choices:
        raise ValueError(f"{what} is {value!r}; valid: {', '.join(choices)}")
    return value


def field_types(cls: Any) -> dict[str, Any]:
    """The type of every field of a config dataclass by its path, a nested config's as 'model.d_model'."""
    types: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls).items():
        types |= {f"{name}.{k}": v for k, v in field_types(hint).items()} if is_dataclass(hint) else {name: hint}
    return types


def file_fields(cfg: DataclassInstance) -> dict[str, Any]:
    """A config dataclass's fields as a --config file holds them (what read_toml reads back to the same
    config): a nested config as a dict, for a [table]; the COMPUTED fields left out."""
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in COMPUTED}
    # a nested config is a dataclass instance (is_dataclass is also true of a dataclass's class)
    return {name: file_fields(v) if is_dataclass(v) and not isinstance(v, type) else v for name, v in values.items()}


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def to_toml(data: Mapping[str, object], table: str = "") -> str:
    """`data` as TOML (None values left out: they mean "the default"), nested dicts as [tables]."""
    scalars = [f"{k} = {toml_value(v)}" for k, v in data.items() if v is not None and not isinstance(v, dict)]
    out = ([f"[{table}]"] if table and scalars else []) + scalars
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out += ["", to_toml(value, f"{table}.{key}" if table else key)]
    return "\n".join(out)
