"""What a study is and which runs it takes: variants x seeds x axes on a base config, each run a `TrainConfig`.

A run's identity is the hash of its config's JSON, so re-running a study skips finished runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import GenericAlias
from typing import Any

from ffnlab._util.names import closest
from ffnlab._util.text import shorten
from ffnlab.core.ffn import get_ffn_spec, layer_variants
from ffnlab.data.glue import glue_data, glue_tasks, is_glue, parse_glue
from ffnlab.run.config import Precision, TrainConfig, identity
from ffnlab.run.config_file import RUN_TABLES, config_from_sources, field_types, file_fields, read_toml, to_toml
from ffnlab.run.device import resolve_precision
from ffnlab.run.presets import DEFAULT_PRESET, PRESETS, preset_config
from ffnlab.run.train import resolve_init

# The default study compares the three FFNs the field moved through (ReLU 2017, GELU in BERT and GPT-2,
# SwiGLU in LLaMA) with 4 seeds: with fewer variants Holm's correction spends less of alpha, and 4
# paired seeds separate SwiGLU from ReLU (measured seed variance: docs/explanation/default-study.md)
# within the time budget of a 2-core CPU without AMX. `--variants` adds silu, reglu, geglu, ...; a preset may
# name its own (ffnlab.run.presets.PRESETS: gpt2-small's four, shazeer's eight)
DEFAULT_VARIANTS = ("relu", "gelu", "swiglu")
DEFAULT_SEEDS = 4
# axes a "tuned" summary chooses per variant (on validation, reported on test): ffnlab.study.summary.tuned_cells
TUNED_AXES = ("lr", "warmup")
# axis name -> the TrainConfig field it sets ("model." for the model config)
AXES = {
    "depth": "model.n_layers",
    "width": "model.d_model",
    "placement": "model.placement",
    "glu_norm": "model.glu_norm",
    "act_position": "model.act_position",
    "norm": "model.norm",
    "task": "model.task",
    "data": "data",
    "init": "model.init",
    "lr": "lr",
    "warmup": "warmup_steps",
    "context": "model.context",
    "attn_act": "model.attn_act",  # values ';'-separated on the command line: a spec holds commas
    "tokens": "max_tokens",
    "checkpointing": "model.activation_checkpointing",  # memory and time knobs: the same numbers at other costs
    "precision": "precision",  # 'auto' planned as what it resolves to here (plan_precision)
}
# axes that change a run's training compute, so `--scale` may fit loss against compute over them
SCALE_AXES = ("width", "depth", "tokens")
# the most runs a study may plan: each is claimed in the store with its config (about 1 KiB) as its turn comes, and
# its summary reads every one back, so 10^5 runs are some 100 MiB of store and minutes of reading; and more is not
# a study that finishes (10^5 runs of even the smoke preset, seconds each, are days of a core)
MAX_RUNS = 100_000
# a cell of a study: its axis values as (axis, value) pairs, in the study's axis order (`group_key`)
CellKey = tuple[tuple[str, Any], ...]


@dataclass
class Study:
    """What to compare: variants x seeds x axes on a base TrainConfig. Variant and baseline names
    are stored in their canonical spelling ('SwiGLU' -> 'swiglu')."""

    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))  # FFN variants: names, mix:a+b,
    # switch_x:a+b+c or per-layer schedules a*2+b*2; with --from, 'keep' (the folder's own, always run) and swaps
    seeds: int = DEFAULT_SEEDS  # seeds per variant, paired: seed s of each variant shares all but its FFN
    base: TrainConfig = field(default_factory=TrainConfig)
    axes: dict[str, list[Any]] = field(default_factory=dict)  # e.g. {"depth": [2, 6]}
    baseline: str | None = None  # the variant the others are compared with; None: relu where it is run,
    # else the first variant
    noise_floor: int = 0  # extra baseline-only seeds to show the seed-to-seed spread
    per_variant: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant -> {config path: value}, e.g. the
    # lr the protocol tuned for it; empty in a plain comparison, where every variant shares the base
    scale: list[str] = field(default_factory=list)  # axes fitted as compute (ffnlab.study.scaling), e.g. ["width"]

    def __post_init__(self) -> None:
        if isinstance(self.base, dict):
            self.base = TrainConfig.from_dict(self.base)
        if self.baseline is None:
            self.baseline = default_baseline(self.variants)
        check_study(self)
        self.variants = [get_ffn_spec(v).name for v in self.variants]
        # each axis value as its runs' configs hold it ('k=gelu,q=gelu' -> 'q=gelu,k=gelu'), so that the
        # settings and the cells name a setting alike
        self.axes = {
            axis: [
                config_value(planned(set_field(self.base, AXES[axis], value)).to_dict(), AXES[axis]) for value in values
            ]
            for axis, values in self.axes.items()
        }
        self.baseline = get_ffn_spec(self.baseline).name
        per_variant: dict[str, dict[str, Any]] = {}
        for variant, overrides in self.per_variant.items():  # 'GELU' and 'gelu' are one variant
            per_variant.setdefault(get_ffn_spec(variant).name, {}).update(overrides)
        self.per_variant = per_variant

    def to_dict(self) -> dict[str, Any]:
        return {
            "variants": self.variants,
            "seeds": self.seeds,
            "base": self.base.to_dict(),
            "axes": self.axes,
            "baseline": self.baseline,
            "noise_floor": self.noise_floor,
            "per_variant": self.per_variant,
            **({"scale": self.scale} if self.scale else {}),  # absent otherwise: older studies keep their ids
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Study:
        return cls(**d)

    @classmethod
    def from_sources(cls, preset: str | None, file: str | Path | None, flags: dict[str, Any]) -> Study:
        """The study `compare` runs: the preset (None: the file's, else standard), then the --config `file`,
        then the flags given. `flags` has the file's shape (ffnlab.flags.study_flags): the run's fields
        (ffnlab.run.config_file.config_from_sources), and under 'study' the [study] keys, but 'scale' as
        {axis: values} and 'per_variant' as (variant, settings) pairs, each --opt one. ValueError naming the
        first problem."""
        contents = read_toml(file, STUDY_TABLES) if file else {}
        in_file, in_flags = contents.get("study", {}), flags.get("study", {})

        def setting(key: str, default: Any = None) -> Any:
            return in_flags.get(key, in_file.get(key, default))  # a flag over the file

        preset = preset if preset is not None else in_file.get("preset", DEFAULT_PRESET)
        base = config_from_sources(preset_config(preset), contents, flags)
        scale = scale_of(in_flags.get("scale"), in_file, preset)
        axes = axes_of(in_file.get("axes", {}), scale, in_flags.get("axes", {}))
        base, axes = glue_axis(base, axes, in_flags.get("glue_tasks"))  # a file names its tasks in its data axis
        seeds = setting("seeds", DEFAULT_SEEDS)
        if seeds < 2 and not setting("no_stats"):
            raise ValueError(
                f"statistics need at least 2 seeds per variant (p-values 3), got --seeds {seeds}; "
                "use --seeds 3 or more, or --no-stats"
            )
        in_both = [
            (f"config file {file}", in_file.get("per_variant", {}).items()),
            ("--opt", in_flags.get("per_variant", [])),
        ]
        per_variant = per_variant_of(in_both)
        variants = setting("variants", list(PRESETS[preset].variants or DEFAULT_VARIANTS))
        baseline = setting("baseline")
        if folder := base.init_from:
            from ffnlab.tools.pretrained import check_context_axis

            base = resolve_init(base)  # the folder's digest is part of the study
            check_context_axis(folder, axes.get("context", []))  # now, not as failed runs
            variants, baseline = finetune_variants(base.model.ffn, setting("variants"))
        return cls(
            variants=variants,
            seeds=seeds,
            base=base,
            axes=axes,
            baseline=baseline,
            noise_floor=setting("noise_floor", 0),
            per_variant=per_variant,
            scale=list(scale),
        )


# every config field's type by its path ('lr', 'model.d_model'), which axes and per-variant settings name
FIELD_TYPES = field_types(TrainConfig)
# what a variant's own settings may set (`--opt VARIANT:KEY=VALUE,...`), and their types: the optimiser and
# its schedule
OPT_FIELDS = {key: FIELD_TYPES[key] for key in ("lr", "min_lr", "warmup_steps", "weight_decay", "beta2", "grad_clip")}
# a --config file's [study] table: each key's type, checked as the file is read (ffnlab.run.config_file.read_toml):
# Study's own fields, an axis's values and a variant's settings typed as the config fields they set, and the
# preset and no_stats, which are not the study's but choose its base and allow it a single seed
STUDY_KEYS = {
    "preset": str,
    **{
        name: hint for name, hint in typing.get_type_hints(Study).items() if name not in ("base", "axes", "per_variant")
    },
    # list[T] and dict[str, T] spelled GenericAlias(...): T is a value known at run time, which a type checker
    # cannot read as a type (they are the same objects)
    "axes": {axis: GenericAlias(list, (FIELD_TYPES[path],)) for axis, path in AXES.items()},
    "per_variant": GenericAlias(dict, (str, OPT_FIELDS)),  # variant -> its settings
    "no_stats": bool,
}
STUDY_TABLES = {**RUN_TABLES, "study": STUDY_KEYS}


def scale_of(flagged: dict[str, list[int]] | None, in_file: dict[str, Any], preset: str) -> dict[str, list[int]]:
    """The compute axes of a study and their values: the --scale flags' (`flagged`), else the --config file's
    [study] `scale` (its values in [study.axes]), else the preset's own (`--preset scaling`; ffnlab.run.presets)."""
    if flagged:
        return dict(flagged)
    if in_file.get("scale"):
        return {axis: in_file.get("axes", {}).get(axis, []) for axis in in_file["scale"]}
    return dict(PRESETS[preset].scale)


def axes_of(
    in_file: dict[str, list[Any]], scale: dict[str, list[int]], flagged: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    """A study's axes: the file's, then the compute axes (`scale`), then the --NAME-axis flags; ValueError
    where a compute axis is also flagged (which values would hold is a guess)."""
    both = sorted(set(scale) & set(flagged))
    if both:
        raise ValueError(f"--scale {both[0]}=... and --{both[0]}-axis both set the {both[0]} axis; drop one")
    return {**in_file, **scale, **flagged}


def glue_axis(
    base: TrainConfig, axes: dict[str, list[Any]], tasks: list[str] | None
) -> tuple[TrainConfig, dict[str, list[Any]]]:
    """A GLUE study's data axis: with data 'glue:DIR' (--data), one value per GLUE task, 'glue:DIR:TASK'
    (ffnlab.data.glue), the tasks `tasks` names (--glue-tasks) or all nine, in GLUE's order; each run trains as its
    task does (cls, a pair, reg for STS-B: ffnlab.run.config.TrainConfig takes them from its data). The base config
    becomes the first task's. ValueError for --glue-tasks without GLUE data, beside a data axis or a single task of
    its own, an unknown task name, or a task without its folder."""
    if not is_glue(base.data):
        if tasks:
            raise ValueError("--glue-tasks picks tasks of GLUE's suite: add --data glue:DIR (the folder of the tasks)")
        return base, axes
    folder, task = parse_glue(base.data)
    if task is not None and not tasks:  # one task, 'glue:DIR:cola': a study of it alone
        return base, axes
    if task is not None:
        raise ValueError(
            f"--data names the GLUE task {task.name} and --glue-tasks others; give --data glue:{folder} with "
            "--glue-tasks, or one task alone"
        )
    if "data" in axes:
        raise ValueError(f"--data glue:{folder} makes the data axis of GLUE's tasks; drop --data-axis")
    values = [glue_data(folder, t) for t in glue_tasks(folder, tasks)]
    return replace(base, data=values[0]), {"data": values, **axes}


def per_variant_of(sources: list[tuple[str, Iterable[tuple[str, dict[str, Any]]]]]) -> dict[str, dict[str, Any]]:
    """Each variant's own settings from (where, (variant, settings) pairs) sources, a later source overriding
    an earlier one, variants by their canonical name. A setting given twice for one variant by one source (two
    --opt, or 'gelu' and 'GELU' in the file) is refused: which would hold is a guess."""
    merged: dict[str, dict[str, Any]] = {}
    for where, pairs in sources:
        given: dict[str, dict[str, Any]] = {}
        for variant, values in pairs:
            name = get_ffn_spec(variant).name
            own = given.setdefault(name, {})
            for key in own.keys() & values.keys():
                raise ValueError(f"{where} sets {name}'s {key} twice ({own[key]} and {values[key]}); give it once")
            own.update(values)
        for variant, values in given.items():
            merged.setdefault(variant, {}).update(values)
    return merged


KEEP = "keep"  # compare --from's name for the folder's own activation: keep,silu is silu against what it runs


def finetune_variants(own: str, given: list[str] | None) -> tuple[list[str], str]:
    """(variants, baseline) of a study from a pretrained folder (`compare --from`): the folder's activation
    `own`, the baseline, then each swap `given` names ('keep', or `own` itself, is the baseline)."""
    swaps = [v for v in given or [] if v.strip().lower() != KEEP and get_ffn_spec(v).name != get_ffn_spec(own).name]
    if not swaps:
        raise ValueError(
            f"compare --from needs --variants with an activation to swap to, e.g. keep,silu (the model runs {own})"
        )
    return [own, *swaps], own


def study_toml(study: Study) -> str:
    """A study as a --config file, which `Study.from_sources` reads back to the same study: the base config's
    fields, [model] and [study]."""
    head = {k: v for k, v in study.to_dict().items() if k in STUDY_KEYS}
    if study.seeds < 2:  # the file loads only with it
        head["no_stats"] = True
    return to_toml({**file_fields(study.base), "study": head})


def default_baseline(variants: list[str]) -> str:
    """The variant others are compared with when none is named: relu where it is run, else the first."""
    canon = [get_ffn_spec(v).name for v in variants]
    return "relu" if "relu" in canon or not canon else canon[0]


def study_id(study: Study) -> str:
    """Identity of a study: sha256 of its JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(study.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def gated_variants(study: Study) -> list[str]:
    """The study's variants with a gated FFN in some layer (a schedule's layers each count)."""
    n_layers = study.base.model.n_layers
    return [v for v in study.variants if any(get_ffn_spec(layer).gated for layer in layer_variants(v, n_layers))]


def check_study(study: Study) -> None:
    """ValueError naming the first problem of a study and the valid choices; changes nothing."""
    if not study.variants:
        raise ValueError("no variants given; e.g. --variants relu,gelu,swiglu")
    canon = [get_ffn_spec(v).name for v in study.variants]
    if len(set(canon)) != len(canon):
        raise ValueError(f"variants repeat: {', '.join(study.variants)}")
    baseline = default_baseline(study.variants) if study.baseline is None else study.baseline
    if get_ffn_spec(baseline).name not in canon:
        raise ValueError(f"baseline '{shorten(baseline)}' is not among the variants; valid: {', '.join(canon)}")
    if study.seeds < 1 or study.noise_floor < 0:
        raise ValueError(f"seeds must be >= 1 and noise floor >= 0, got {study.seeds}, {study.noise_floor}")
    cells = math.prod(len(values) for values in study.axes.values())
    runs = run_count(study)
    if runs > MAX_RUNS:  # before anything is planned: a study of 10^11 runs was planned until memory ran out
        per_cell = f"{len(canon)} variants x {study.seeds:,} seeds"
        per_cell += f" + {study.noise_floor:,} noise-floor seeds" if study.noise_floor else ""
        raise ValueError(
            f"the study has {runs:,} runs ({f'{cells:,} cells x ({per_cell})' if cells > 1 else per_cell}); at most "
            f"{MAX_RUNS:,}, as each is stored and read back for the summary"
        )
    for axis, values in study.axes.items():
        if axis not in AXES:
            raise ValueError(f"unknown axis '{shorten(axis)}'{closest(axis, AXES)}; valid: {', '.join(AXES)}")
        if not values:
            raise ValueError(f"axis '{axis}' has no values")
        seen: dict[str, object] = {}
        for value in values:  # each value is validated by the config dataclasses now, not by a failed run
            rid = run_id(planned(set_field(study.base, AXES[axis], value)))
            if rid in seen:  # two cells of the same runs would be compared as if they were two settings
                twice = f"{shorten(repr(seen[rid]))} and {shorten(repr(value))}"
                raise ValueError(f"axis '{axis}' repeats a setting: {twice} train the same runs")
            seen[rid] = value
    check_scale(study)
    for n_layers in study.axes.get("depth", [study.base.model.n_layers]):  # a schedule fits every depth
        for variant in canon:
            layer_variants(variant, n_layers)
    if ("glu_norm" in study.axes or study.base.model.glu_norm != "none") and not gated_variants(study):
        raise ValueError(
            f"glu_norm puts norms around a gated FFN's gate; {', '.join(canon)} have none, so every glu_norm "
            "setting trains the same model: add a gated variant (swiglu, geglu, reglu) or drop the glu_norm setting"
        )
    for variant, overrides in study.per_variant.items():
        if get_ffn_spec(variant).name not in canon:
            raise ValueError(
                f"per-variant settings for '{variant}', which is not among the variants: {', '.join(canon)}"
            )
        for path, value in overrides.items():
            set_field(study.base, path, value)


def check_scale(study: Study) -> None:
    """ValueError unless the scale axes are compute axes with values, at least 3 compute points in all
    (a power law has 3 parameters) and no other axis beside them (one fit per variant)."""
    for axis in study.scale:
        if axis not in SCALE_AXES:
            raise ValueError(
                f"cannot scale '{shorten(axis)}'{closest(axis, SCALE_AXES)}; valid: {', '.join(SCALE_AXES)}"
            )
        if axis not in study.axes:
            raise ValueError(f"scale axis '{axis}' has no values; e.g. --scale {axis}=64,128,256")
    if not study.scale:
        return
    others = [a for a in study.axes if a not in study.scale]
    if others:
        raise ValueError(
            f"--scale fits one curve per variant; drop the other axes ({', '.join(others)}) or run one scaling study each"
        )
    points = math.prod(len(set(study.axes[a])) for a in study.scale)
    if points < 3:
        raise ValueError(f"--scale needs at least 3 sizes or budgets (a power law has 3 parameters), got {points}")


def set_field(cfg: TrainConfig, path: str, value: Any) -> TrainConfig:
    """Copy of cfg with 'model.x' or 'x' set to value (validated by the dataclasses)."""
    if path.startswith("model."):
        return replace(cfg, model=replace(cfg.model, **{path.removeprefix("model."): value}))
    return replace(cfg, **{path: value})


def config_value(config: dict[str, Any], path: str) -> Any:
    """The value at 'model.x' or 'x' in a config dict (a stored run's config); KeyError if absent."""
    value: Any = config
    for part in path.split("."):
        value = value[part]
    return value


def run_id(cfg: TrainConfig) -> str:
    """Identity of a run: sha256 of the JSON (keys sorted) of its identity fields (`ffnlab.run.config.identity`)."""
    return hashlib.sha256(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:16]


def plan_precision(base: TrainConfig) -> Precision:
    """The precision runs are planned with: 'auto' resolved here, so a run's identity says whether
    it trains in bf16 or fp32; ValueError for fp16 where this machine has no fp16 autocast."""
    return resolve_precision(base.precision, base.device)


def planned(cfg: TrainConfig) -> TrainConfig:
    """cfg as a study plans it: its precision resolved (`plan_precision`)."""
    return replace(cfg, precision=plan_precision(cfg))


def run_count(study: Study) -> int:
    """How many runs `plan` gives, by arithmetic: cells x (variants x seeds + noise-floor seeds)."""
    cells = math.prod(len(values) for values in study.axes.values())
    return cells * (len(study.variants) * study.seeds + study.noise_floor)


def plan(study: Study) -> list[TrainConfig]:
    """Every run of the study: axes x variants x seeds, then the noise-floor baseline seeds (`iter_plan`)."""
    return list(iter_plan(study))


def iter_plan(study: Study, seeds: int | None = None) -> Iterator[TrainConfig]:
    """The runs of `plan`, in its order, one at a time as they are asked for: a sweep of 10^5 runs starts its
    first at once (planning them all first took minutes). `seeds`: the first that many seeds of each variant
    and no noise floor, e.g. 1 for a run of each cell and variant."""
    axis_names = list(study.axes)
    base = resolve_init(planned(study.base))  # a changed folder: new ids
    for values in itertools.product(*(study.axes[a] for a in axis_names)):
        cfg = base
        for axis, value in zip(axis_names, values):
            cfg = set_field(cfg, AXES[axis], value)  # a precision axis's values are resolved already
        for variant in study.variants:
            own = cfg
            for path, value in study.per_variant.get(variant, {}).items():
                own = set_field(own, path, value)
            own = set_field(own, "model.ffn", variant)
            for seed in range(study.seeds if seeds is None else min(seeds, study.seeds)):
                yield replace(own, seed=seed)
        if seeds is None:
            for seed in range(study.seeds, study.seeds + study.noise_floor):
                yield set_field(replace(cfg, seed=seed), "model.ffn", study.baseline)


def group_key(cfg: TrainConfig, study: Study) -> CellKey:
    """The axis values of a run (its cell in the study), for grouping statistics."""
    config = cfg.to_dict()
    return tuple((axis, config_value(config, AXES[axis])) for axis in study.axes)
