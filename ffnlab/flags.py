"""Command-line flags and TOML files derived from the config dataclasses, so the two never drift apart.

Every field of `TrainConfig` and `ModelConfig` becomes a flag (`n_layers` -> `--n-layers`) with its
type, its choices (from the `Literal`) and its help (from the comment beside the field). A flag's
default is None, meaning "not given": the preset or the `--config` file keeps its value.
`--config FILE.toml` holds the same fields (a `[model]` table for the model, `[study]` for compare).
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import stat
import tokenize
import tomllib
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path

from ffnlab._util.names import closest

# short names that predate the derived ones; both work
ALIASES = {"n_layers": "--layers", "n_heads": "--heads", "max_steps": "--steps", "warmup_steps": "--warmup",
           "ffn_match": "--match", "init_from": "--from"}  # fmt: skip
# fields a run computes, never read from a file: a value there would change the run's identity, not what it trains
COMPUTED = {"vocab_size": "set from the tokenizer", "init_digest": "computed from the --from folder"}
# nested, a file path of its own, computed
NOT_FLAGS = ("model", "hf_config", *COMPUTED)
# a config file holds a few KiB of settings (a Hugging Face config's table included): a larger file is
# something else given by mistake (a data set), and reading stops here instead of filling memory
MAX_CONFIG_BYTES = 2**20


def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment beside it}, continuation comment lines included, read from the source."""
    lines = inspect.getsource(cls).splitlines()
    names = {f.name for f in fields(cls)}
    docs: dict[str, str] = {}
    last = None
    for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines)).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.string in names:
            last = tok.string
        elif tok.type == tokenize.COMMENT and last is not None:
            docs[last] = (docs.get(last, "") + " " + tok.string.lstrip("# ")).strip()
        elif tok.type == tokenize.NAME and tok.start[1] == 4:
            last = None  # a method or something else: comments below it are not a field's
    return docs


def flag_type(hint) -> tuple[type | None, tuple | None]:
    """(python type, choices) of a field's type hint: `X | None` -> X, `Literal[...]` -> str and its values."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return str, tuple(typing.get_args(hint))
    if args and type(None) in typing.get_args(hint):
        return flag_type(args[0])
    return (hint, None) if hint in (int, float, str, bool) else (None, None)


def add_config_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the dataclass `cls` (but `skip` and NOT_FLAGS), default None. A field's metadata
    may name its flag ("flag": advise's Situation.stage is --situation) and the parser of its text ("parse":
    a size such as '7B')."""
    hints, docs = typing.get_type_hints(cls), field_comments(cls)
    for f in fields(cls):
        kind, choices = flag_type(hints[f.name])
        if f.name in skip or f.name in NOT_FLAGS or kind is None:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        names = [flag] + ([ALIASES[f.name]] if f.name in ALIASES else [])
        default = f.default if f.default is not MISSING else None
        help = docs.get(f.name, f.name.replace("_", " "))
        if default is not None:  # None means unset, which the comment says where it matters
            help += f" (config default: {default})"
        if kind is bool:
            parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parse = flag_parser(f.metadata["parse"]) if "parse" in f.metadata else kind
            parser.add_argument(*names, dest=f.name, type=parse, choices=choices, default=None, help=help)


def flag_parser(parse: Callable[[str], object]) -> Callable[[str], object]:
    """`parse` as a flag's type, its ValueError's message kept (argparse would print 'invalid parse value')."""

    def parse_flag(text: str) -> object:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse_flag.__name__ = parse.__name__
    return parse_flag


def given(args: argparse.Namespace, cls: type) -> dict:
    """The fields of `cls` the command line set (flags left out are None)."""
    return {
        f.name: getattr(args, f.name)
        for f in fields(cls)
        if f.name not in NOT_FLAGS and getattr(args, f.name, None) is not None
    }


# ---- TOML files -------------------------------------------------------------------------------------


def read_toml(path: str | Path, tables: dict[str, type | dict]) -> dict:
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
    top = {**table_types(tables[""]), **{table: valid for table, valid in tables.items() if table}}
    return checked_table(data, top, path, "")


def config_text(path: Path) -> str:
    """The text of a config file: a regular file of UTF-8 text, at most MAX_CONFIG_BYTES; FileNotFoundError or
    ValueError naming the file otherwise."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):  # a device (/dev/zero) may never end, a pipe may block
            raise ValueError(f"config file {path} is {'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}")
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except OSError as e:  # a symlink loop, a permission
        raise ValueError(f"config file {path} cannot be read: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"config file {path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; is it a config file?")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None


def table_types(hint) -> dict | None:
    """{key: type} of a table's type, a dataclass (its fields) or a dict {key: type}; None for other types."""
    if is_dataclass(hint):
        return typing.get_type_hints(hint)
    return hint if isinstance(hint, dict) else None


def checked_table(data: dict, types: dict, path: Path, table: str) -> dict:
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


def checked_value(value, hint, path: Path, table: str, key: str):
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
        return checked_table(value, table_types(hint), path, inner)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{what} must be a list ([...]), got {value!r}")
        return [scalar_value(v, args[0], f"{what} (item {i + 1})") for i, v in enumerate(value)]
    return scalar_value(value, hint, what)


def scalar_value(value, hint, what: str):
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


def field_types(cls: type) -> dict:
    """The type of every field of a config dataclass by its path, a nested config's as 'model.d_model'."""
    types = {}
    for name, hint in typing.get_type_hints(cls).items():
        types |= {f"{name}.{k}": v for k, v in field_types(hint).items()} if is_dataclass(hint) else {name: hint}
    return types


def file_fields(cfg) -> dict:
    """A config dataclass's fields as a --config file holds them (what read_toml reads back to the same
    config): a nested config as a dict, for a [table]; the COMPUTED fields left out."""
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in COMPUTED}
    return {name: file_fields(v) if is_dataclass(v) else v for name, v in values.items()}


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def to_toml(data: dict, table: str = "") -> str:
    """`data` as TOML (None values left out: they mean "the default"), nested dicts as [tables]."""
    scalars = [f"{k} = {toml_value(v)}" for k, v in data.items() if v is not None and not isinstance(v, dict)]
    out = ([f"[{table}]"] if table and scalars else []) + scalars
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out += ["", to_toml(value, f"{table}.{key}" if table else key)]
    return "\n".join(out)
