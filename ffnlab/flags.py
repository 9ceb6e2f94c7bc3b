"""Command-line flags derived from the config dataclasses, so the flags and the configs never drift apart.

Every field of `TrainConfig` and `ModelConfig` becomes a flag of `train` and `compare` (`n_layers` ->
`--n-layers`), and every plain field of `Study` a flag of `compare` (`seeds` -> `--seeds`), with its type,
its choices (from the `Literal`) and its help (from the comment beside the field); a study's axes are
`--NAME-axis` flags typed by the config field each sets. A flag's default is None, meaning "not given":
the preset or the `--config` file keeps its value. `run_flags` and `study_flags` hand what was given to
the one merge of preset, file and flags (ffnlab.run.config_file, `Study.from_sources`), in the file's shape.
"""

from __future__ import annotations

import argparse
import inspect
import io
import math
import tokenize
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from typing import Any, TypeVar

from ffnlab._util.names import closest
from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig, flag_of
from ffnlab.run.config_file import COMPUTED, TYPE_NAMES, field_types, flag_type
from ffnlab.study.plan import AXES, OPT_FIELDS, SCALE_AXES, Study

# short names that predate the derived ones; both work
ALIASES = {"n_layers": "--layers", "n_heads": "--heads", "max_steps": "--steps", "warmup_steps": "--warmup",
           "ffn_match": "--match", "init_from": "--from"}  # fmt: skip
# nested, a file path of its own, computed
NOT_FLAGS = ("model", "hf_config", *COMPUTED)
# axis names from before every axis ended in -axis; both work
OLD_AXIS_NAMES = {"depth": "--depth", "width": "--width"}


class UsageError(Exception):
    """A mistake in what the user asked for (a flag's value, flags that contradict each other); the CLI prints it
    as one line and exits 2."""


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


# ---- how a flag reads its value ----------------------------------------------------------------------


Number = TypeVar("Number", int, float)


def positive(kind: type[Number], what: str, rule: str) -> Callable[[str], Number]:
    """An argparse type for one positive number of `kind` (a float also finite), named `positive_<kind>`."""

    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got '{text}'") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{rule}, got {value}")
        return value

    parse.__name__ = f"positive_{kind.__name__}"
    return parse


positive_int = positive(int, "integer", "must be positive")
positive_float = positive(float, "number", "must be a positive finite number")


def csv_list(text: str, sep: str = ",") -> list[str]:
    items = [t.strip() for t in text.split(sep) if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a '{sep}'-separated list, got '{text}'")
    return items


def semicolon_list(text: str) -> list[str]:
    """Items separated by ';', for axis values that hold commas themselves (attn_act specs)."""
    return csv_list(text, ";")


def number_list(kind: type[Number], what: str) -> Callable[[str], list[Number]]:
    """An argparse type for comma-separated positive numbers of `kind`, named `<kind>_list`."""

    def parse(text: str) -> list[Number]:
        try:
            values = [kind(t) for t in csv_list(text)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got '{text}'") from None
        if any(not v > 0 for v in values):
            raise argparse.ArgumentTypeError(f"values must be positive, got '{text}'")
        return values

    parse.__name__ = f"{kind.__name__}_list"
    return parse


int_list = number_list(int, "integers")
float_list = number_list(float, "numbers")
# a list field's flag: comma-separated items of the list's type
ListParser = Callable[[str], list[int]] | Callable[[str], list[float]] | Callable[[str], list[str]]
LIST_TYPES: dict[type | None, ListParser] = {int: int_list, float: float_list, str: csv_list}


def flag_parser(hint: object) -> tuple[Callable[[str], object] | None, tuple[object, ...] | None]:
    """(how the flag reads its value, choices) for a field typed `hint`: a scalar as its type, `list[X]`
    comma-separated (LIST_TYPES); (None, None) for a field no flag sets (a table, a nested config)."""
    if typing.get_origin(hint) is list:
        return LIST_TYPES.get(flag_type(typing.get_args(hint)[0])[0]), None
    return flag_type(hint)


# ---- flags from dataclasses ------------------------------------------------------------------------


def add_config_flags(
    parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (), default_note: str = "config default"
) -> None:
    """One flag per field of the dataclass `cls` (but `skip`, NOT_FLAGS and tables), default None; the help
    is the comment beside the field and the field's default, after `default_note`. A field's metadata may
    name its flag ("flag": advise's Situation.stage is --situation) and the parser of its text ("parse": a
    size such as '7B')."""
    hints, docs = typing.get_type_hints(cls), field_comments(cls)
    for f in fields(cls):
        parse, choices = flag_parser(hints[f.name])
        if f.name in skip or f.name in NOT_FLAGS or parse is None:
            continue
        flag = flag_of(f)
        names = [flag] + ([ALIASES[f.name]] if f.name in ALIASES else [])
        help = docs.get(f.name, f.name.replace("_", " "))
        if default_text(f) != "None":  # None means unset, which the comment says where it matters
            help += f" ({default_note}: {default_text(f)})"
        if parse is bool:
            parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parse = kept_message(f.metadata["parse"]) if "parse" in f.metadata else parse
            parser.add_argument(*names, dest=f.name, type=parse, choices=choices, default=None, help=help)


def kept_message(parse: Callable[[str], object]) -> Callable[[str], object]:
    """`parse` as a flag's type, its ValueError's message kept (argparse would print 'invalid parse value')."""

    def parse_flag(text: str) -> object:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse_flag.__name__ = parse.__name__
    return parse_flag


def default_text(f: Field[Any]) -> str:
    """A field's default as its flag's help shows it: a list comma-separated, as the flag takes it."""
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    default = None if default is MISSING else default
    return ",".join(map(str, default)) if isinstance(default, list) else str(default)


def add_axis_flags(parser: argparse.ArgumentParser) -> None:
    """--NAME-axis for each study axis (ffnlab.study.plan.AXES), typed by the config field it sets: integers,
    numbers or names."""
    types = field_types(TrainConfig)
    for axis, path in AXES.items():
        values = LIST_TYPES.get(flag_type(types[path])[0], csv_list)
        what = "comma-separated " + {int_list: "integers", float_list: "numbers"}.get(values, "names")
        if axis == "attn_act":  # a spec holds commas
            values = semicolon_list
            what = "';'-separated Q/K/V activations, e.g. 'none;gelu;q=gelu,k=gelu' (none: no activation)"
        old = OLD_AXIS_NAMES.get(axis)
        parser.add_argument(
            f"--{axis.replace('_', '-')}-axis",
            *([old] if old else []),
            dest=f"{axis}_axis",
            type=values,
            default=None,
            help=f"axis: {what} for {path}" + (f" ({old} is its old name)" if old else ""),
        )


def add_study_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a `Study`: its plain fields (add_config_flags), its axes, --opt for its per-variant
    settings, --scale for its compute axes and --glue-tasks for GLUE's."""
    add_config_flags(parser, Study, skip=("scale",), default_note="default")
    add_axis_flags(parser)
    parser.add_argument(
        "--glue-tasks",
        type=csv_list,
        default=None,
        help="with --data glue:DIR, the GLUE tasks to run, e.g. cola,sst2,stsb (default: all nine: cola, sst2, mrpc, "
        "qqp, stsb, mnli, qnli, rte, wnli); each a cell of the data axis, trained as its task (cls, pair, reg), "
        "tested on GLUE's dev set with its official metrics, and the GLUE score over them",
    )
    parser.add_argument(
        "--opt",
        dest="per_variant",
        metavar="OPT",
        type=opt_arg,
        action="append",
        default=None,
        help=f"per-variant optimiser settings, e.g. --opt gelu:lr=1e-4,beta2=0.98 (repeatable; keys: "
        f"{', '.join(OPT_FIELDS)}); part of each run's identity and shown in the output as not held equal",
    )
    parser.add_argument(
        "--scale",
        type=scale_arg,
        action="append",
        default=None,
        help="a compute axis to fit loss against compute over: width=32,64,128,256 (d_model), depth=..., "
        "tokens=... (repeatable); adds the power-law fits and compute multipliers (docs: Scaling and compute multipliers)",
    )


def opt_arg(text: str) -> tuple[str, dict[str, Any]]:
    """'gelu:lr=1e-4,beta2=0.98' -> ('gelu', {'lr': 0.0001, 'beta2': 0.98})."""
    variant, sep, settings = text.partition(":")
    if not sep or not variant.strip() or not settings.strip():
        raise argparse.ArgumentTypeError(f"expected VARIANT:KEY=VALUE[,KEY=VALUE...], e.g. gelu:lr=1e-4, got '{text}'")
    values: dict[str, Any] = {}
    for item in csv_list(settings):
        key, sep, value = (s.strip() for s in item.partition("="))
        if key not in OPT_FIELDS or not sep:
            raise argparse.ArgumentTypeError(
                f"'{item}' in --opt {text}: expected KEY=VALUE with KEY one of {', '.join(OPT_FIELDS)}"
            )
        if key in values:  # which of the two holds would be a guess
            raise argparse.ArgumentTypeError(f"--opt {text} sets {key} twice; give each setting once")
        kind, _ = flag_type(OPT_FIELDS[key])
        assert kind is not None  # OPT_FIELDS are numbers
        try:
            values[key] = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{item}' in --opt {text}: {key} needs {TYPE_NAMES[kind]}") from None
    return variant.strip(), values


def scale_arg(text: str) -> tuple[str, list[int]]:
    """'width=64,128,256' -> ('width', [64, 128, 256]); 'tokens=2e5,4e5,8e5' -> ('tokens', [200000, ...])."""
    axis, sep, values = (part.strip() for part in text.partition("="))
    if not sep or not axis or not values:
        raise argparse.ArgumentTypeError(f"expected AXIS=V1,V2,..., e.g. width=64,128,256, got '{text}'")
    axis = axis.lower()  # as variant names: 'Width' is width
    if axis not in SCALE_AXES:
        raise argparse.ArgumentTypeError(
            f"cannot scale '{axis}'{closest(axis, SCALE_AXES)}; valid: {', '.join(SCALE_AXES)}"
        )
    try:
        numbers = [float(v) for v in csv_list(values)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scale {text}: values must be numbers") from None
    if any(not (n > 0 and n == int(n)) for n in numbers):
        raise argparse.ArgumentTypeError(f"--scale {text}: values must be positive whole numbers")
    return axis, [int(n) for n in numbers]


# ---- what the user gave ----------------------------------------------------------------------------


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` the command line set (flags left out are None)."""
    return {
        f.name: getattr(args, f.name)
        for f in fields(cls)
        if f.name not in NOT_FLAGS and getattr(args, f.name, None) is not None
    }


def run_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The run's fields the command line set, in a --config file's shape (ffnlab.run.config_file): TrainConfig's,
    ModelConfig's under 'model', and --hf-config's file."""
    hf_config = {"hf_config": args.hf_config} if args.hf_config else {}
    return {**given(args, TrainConfig), **hf_config, "model": given(args, ModelConfig)}


def study_flags(args: argparse.Namespace) -> dict[str, Any]:
    """What `compare`'s command line set, in the shape `Study.from_sources` reads: the run's fields
    (run_flags) and under 'study' the study's, --scale's axes as {axis: values} and --opt's settings as
    (variant, settings) pairs in order."""
    study = given(args, Study)
    study["axes"] = {axis: getattr(args, f"{axis}_axis") for axis in AXES if getattr(args, f"{axis}_axis")}
    study["scale"] = dict(args.scale or [])
    study["per_variant"] = args.per_variant or []
    if getattr(args, "glue_tasks", None):
        study["glue_tasks"] = args.glue_tasks
    if args.no_stats:
        study["no_stats"] = True
    return {**run_flags(args), "study": study}
