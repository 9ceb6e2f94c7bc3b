"""The `ffnlab compare` command an advice suggests: the variants to measure, on the user's data, or with every
setting that reproduces a measured cell (its task, data, tokenizer, model, schedule and the variants' own
settings), so that running it measures the same question again."""

from __future__ import annotations

import shlex
from dataclasses import fields, replace
from typing import Any

from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig, flag_of
from ffnlab.run.config_file import COMPUTED
from ffnlab.run.presets import DEFAULT_PRESET, PRESETS, preset_config

# fields a suggested command leaves to `compare`: --seeds and --variants set the seed and the FFN, the
# computed ones are computed again, and checkpoints go where the new store says
LEFT_TO_COMPARE = ("seed", "ffn", "checkpoint_dir", *COMPUTED)
FLAGS = {f.name: flag_of(f) for f in (*fields(TrainConfig), *fields(ModelConfig))}  # each setting's flag


def compare_command(
    variants: list[str],
    data: str | None,
    depth: int | None,
    seeds: int = 3,
    cell: TrainConfig | None = None,
    per_variant: dict[str, dict[str, Any]] | None = None,
    task: str | None = None,
) -> str:
    """The `ffnlab compare` command that measures these variants: with `cell`, at every setting of that measured
    cell (`depth` layers where given) and each variant's own settings; else on `data` (YOUR_DATA when no data is
    known) at `depth` layers, for `task` where it is not compare's default."""
    parts = [
        "ffnlab compare",
        f"--variants {shlex.quote(','.join(variants))}",  # quoted where a schedule's '*' would glob
        f"--seeds {seeds}",
    ]
    if cell is not None:
        return " ".join(parts + cell_flags(cell, depth, per_variant or {}))
    parts.append(f"--data {shlex.quote(data)}" if data else "--data YOUR_DATA")
    if task:
        parts.append(f"--task {task}")
    if depth:
        parts.append(f"--layers {depth}")
    return " ".join(parts)


def settings_of(cfg: TrainConfig) -> dict[str, Any]:
    """A run's settings by field name, TrainConfig's and ModelConfig's together (as `compare`'s flags take them),
    but those LEFT_TO_COMPARE."""
    model = {f.name: getattr(cfg.model, f.name) for f in fields(ModelConfig)}
    own = {f.name: getattr(cfg, f.name) for f in fields(TrainConfig) if f.name != "model"}
    return {name: value for name, value in {**own, **model}.items() if name not in LEFT_TO_COMPARE}


def changed(cfg: TrainConfig, preset: str) -> dict[str, Any]:
    """The settings of `cfg` that differ from the preset's."""
    base = settings_of(preset_config(preset))
    return {name: value for name, value in settings_of(cfg).items() if value != base.get(name)}


def flag(name: str, value: Any) -> str | None:
    """`--name value` as `compare` reads it; None for a value no flag can give (None: a preset's is kept)."""
    option = FLAGS[name]
    if value is None:
        return None
    if name == "hf_config":  # the flag takes a file: the store holds the config, not the file's path
        return "--hf-config YOUR_HF_CONFIG.json"
    if isinstance(value, bool):
        return option if value else f"--no-{option.removeprefix('--')}"
    if isinstance(value, list):
        value = ",".join(map(str, value))
    return f"{option} {shlex.quote(str(value))}"


def cell_flags(cell: TrainConfig, depth: int | None, per_variant: dict[str, dict[str, Any]]) -> list[str]:
    """The flags that make `compare` run the measured cell's settings: the preset that leaves fewest to set
    (only none, where a setting is None and the preset's is not), every setting that differs from it, and
    --opt for each variant's own settings. `depth` replaces the cell's number of layers."""
    cfg = replace(cell, model=replace(cell.model, n_layers=depth)) if depth else cell

    def cost(preset: str) -> tuple[int, int, bool]:
        differences = changed(cfg, preset)
        unsettable = sum(flag(name, value) is None for name, value in differences.items())
        return unsettable, len(differences), preset != DEFAULT_PRESET

    preset = min(PRESETS, key=cost)
    out = [] if preset == DEFAULT_PRESET else [f"--preset {preset}"]
    out += [f for name, value in changed(cfg, preset).items() if (f := flag(name, value))]
    for variant, settings in per_variant.items():
        own = ",".join(f"{path}={value}" for path, value in settings.items())
        out.append(f"--opt {shlex.quote(f'{variant}:{own}')}")
    return out
