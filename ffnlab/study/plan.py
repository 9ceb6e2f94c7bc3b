"""What a study is and which runs it takes: variants x seeds x axes on a base config, each run a `TrainConfig`.

A run's identity is the hash of its config's JSON, so re-running a study skips finished runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, replace

from ffnlab._util.names import closest
from ffnlab._util.text import shorten
from ffnlab.core.ffn import get_ffn_spec, layer_variants
from ffnlab.run.config import TrainConfig, identity
from ffnlab.run.device import resolve_precision
from ffnlab.run.train import resolve_init

# The default study compares the three FFNs the field moved through (ReLU 2017, GELU in BERT and GPT-2,
# SwiGLU in LLaMA) with 4 seeds: with fewer variants Holm's correction spends less of alpha, and 4
# paired seeds separate SwiGLU from ReLU (measured seed variance in the README, "The default study")
# within the time budget of a 2-core CPU without AMX. `--variants` adds silu, reglu, geglu, ...
DEFAULT_VARIANTS = ("relu", "gelu", "swiglu")
DEFAULT_SEEDS = 4
# axes a "tuned" summary chooses per variant (on validation, reported on test): ffnlab.study.summary.tuned_cells
TUNED_AXES = ("lr", "warmup")
# axis name -> the TrainConfig field it sets ("model." for the model config)
AXES = {
    "depth": "model.n_layers",
    "width": "model.d_model",
    "placement": "model.placement",
    "norm": "model.norm",
    "task": "model.task",
    "data": "data",
    "init": "model.init",
    "lr": "lr",
    "warmup": "warmup_steps",
    "context": "model.context",
    "attn_act": "model.attn_act",  # values ';'-separated on the command line: a spec holds commas
    "tokens": "max_tokens",
}
# axes that change a run's training compute, so `--scale` may fit loss against compute over them
SCALE_AXES = ("width", "depth", "tokens")
# the most runs a study may plan: all are planned before the first starts, each given an id and claimed in the
# store with its config (about 1 KiB), so 10^5 runs are already some 100 MiB of store and minutes of planning;
# and more is not a study that finishes (10^5 runs of even the smoke preset, seconds each, are days of a core)
MAX_RUNS = 100_000
# what `--preset scaling` scales when --scale is not given: sizes chosen from measurements (README,
# "Scaling: compute multipliers")
PRESET_SCALES = {"scaling": {"width": [24, 48, 96, 192]}}


@dataclass
class Study:
    """What to compare: variants x seeds x axes on a base TrainConfig. Variant and baseline names
    are stored in their canonical spelling ('SwiGLU' -> 'swiglu')."""

    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    seeds: int = DEFAULT_SEEDS
    base: TrainConfig = field(default_factory=TrainConfig)
    axes: dict[str, list] = field(default_factory=dict)  # e.g. {"depth": [2, 6]}
    baseline: str | None = None  # None: relu where it is run, else the first variant (`default_baseline`)
    noise_floor: int = 0  # extra baseline-only seeds to show the seed-to-seed spread
    per_variant: dict[str, dict] = field(default_factory=dict)  # variant -> {config path: value}, e.g. the
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
            axis: [config_value(set_field(self.base, AXES[axis], value).to_dict(), AXES[axis]) for value in values]
            for axis, values in self.axes.items()
        }
        self.baseline = get_ffn_spec(self.baseline).name
        per_variant: dict[str, dict] = {}
        for variant, overrides in self.per_variant.items():  # 'GELU' and 'gelu' are one variant
            per_variant.setdefault(get_ffn_spec(variant).name, {}).update(overrides)
        self.per_variant = per_variant

    def to_dict(self) -> dict:
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
    def from_dict(cls, d: dict) -> Study:
        return cls(**d)


def default_baseline(variants: list[str]) -> str:
    """The variant others are compared with when none is named: relu where it is run, else the first."""
    canon = [get_ffn_spec(v).name for v in variants]
    return "relu" if "relu" in canon or not canon else canon[0]


def study_id(study: Study) -> str:
    """Identity of a study: sha256 of its JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(study.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def check_study(study: Study) -> None:
    """ValueError naming the first problem of a study and the valid choices; changes nothing."""
    if not study.variants:
        raise ValueError("no variants given; e.g. --variants relu,gelu,swiglu")
    canon = [get_ffn_spec(v).name for v in study.variants]
    if len(set(canon)) != len(canon):
        raise ValueError(f"variants repeat: {', '.join(study.variants)}")
    if get_ffn_spec(study.baseline).name not in canon:
        raise ValueError(f"baseline '{shorten(study.baseline)}' is not among the variants; valid: {', '.join(canon)}")
    if study.seeds < 1 or study.noise_floor < 0:
        raise ValueError(f"seeds must be >= 1 and noise floor >= 0, got {study.seeds}, {study.noise_floor}")
    cells = math.prod(len(values) for values in study.axes.values())
    runs = cells * (len(canon) * study.seeds + study.noise_floor)
    if runs > MAX_RUNS:  # before anything is planned: a study of 10^11 runs was planned until memory ran out
        per_cell = f"{len(canon)} variants x {study.seeds:,} seeds"
        per_cell += f" + {study.noise_floor:,} noise-floor seeds" if study.noise_floor else ""
        raise ValueError(
            f"the study has {runs:,} runs ({f'{cells:,} cells x ({per_cell})' if cells > 1 else per_cell}); at most "
            f"{MAX_RUNS:,}, as every run is planned and stored before the first starts"
        )
    for axis, values in study.axes.items():
        if axis not in AXES:
            raise ValueError(f"unknown axis '{shorten(axis)}'{closest(axis, AXES)}; valid: {', '.join(AXES)}")
        if not values:
            raise ValueError(f"axis '{axis}' has no values")
        seen: dict[str, object] = {}
        for value in values:  # each value is validated by the config dataclasses now, not by a failed run
            rid = run_id(set_field(study.base, AXES[axis], value))
            if rid in seen:  # two cells of the same runs would be compared as if they were two settings
                twice = f"{shorten(repr(seen[rid]))} and {shorten(repr(value))}"
                raise ValueError(f"axis '{axis}' repeats a setting: {twice} train the same runs")
            seen[rid] = value
    check_scale(study)
    for n_layers in study.axes.get("depth", [study.base.model.n_layers]):  # a schedule fits every depth
        for variant in canon:
            layer_variants(variant, n_layers)
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


def set_field(cfg: TrainConfig, path: str, value) -> TrainConfig:
    """Copy of cfg with 'model.x' or 'x' set to value (validated by the dataclasses)."""
    if path.startswith("model."):
        return replace(cfg, model=replace(cfg.model, **{path.removeprefix("model."): value}))
    return replace(cfg, **{path: value})


def config_value(config: dict, path: str):
    """The value at 'model.x' or 'x' in a config dict (a stored run's config); KeyError if absent."""
    for part in path.split("."):
        config = config[part]
    return config


def run_id(cfg: TrainConfig) -> str:
    """Identity of a run: sha256 of the JSON (keys sorted) of its identity fields (`ffnlab.run.config.identity`)."""
    return hashlib.sha256(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:16]


def plan_precision(base: TrainConfig) -> str:
    """The precision runs are planned with: 'auto' resolved here, so a run's identity says whether
    it trains in bf16 or fp32."""
    return resolve_precision(base.precision, base.device)


def plan(study: Study) -> list[TrainConfig]:
    """Every run of the study: axes x variants x seeds, then the noise-floor baseline seeds."""
    axis_names = list(study.axes)
    runs = []
    base = resolve_init(replace(study.base, precision=plan_precision(study.base)))  # a changed folder: new ids
    for values in itertools.product(*(study.axes[a] for a in axis_names)):
        cfg = base
        for axis, value in zip(axis_names, values):
            cfg = set_field(cfg, AXES[axis], value)
        for variant in study.variants:
            own = cfg
            for path, value in study.per_variant.get(variant, {}).items():
                own = set_field(own, path, value)
            for seed in range(study.seeds):
                runs.append(set_field(replace(own, seed=seed), "model.ffn", variant))
        for seed in range(study.seeds, study.seeds + study.noise_floor):
            runs.append(set_field(replace(cfg, seed=seed), "model.ffn", study.baseline))
    return runs


def group_key(cfg: TrainConfig, study: Study) -> tuple:
    """The axis values of a run (its cell in the study), for grouping statistics."""
    config = cfg.to_dict()
    return tuple((axis, config_value(config, AXES[axis])) for axis in study.axes)
