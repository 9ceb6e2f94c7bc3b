"""Named run configurations: one typed function per preset, each returning a `TrainConfig`.

`standard` is the default study's (README, "The default study"). `paper` keeps the shape of Shazeer
2020's setup (pre-norm, no dropout, gated widths matched to 4x dense in parameters, equal steps,
6 layers) at the largest size one CPU trains in hours, not weeks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ffnlab._util.names import closest
from ffnlab._util.text import shorten
from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig


def smoke() -> TrainConfig:
    """Seconds per run: for tests and trying the commands."""
    model = ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32)
    return run(model, batch_size=8, max_steps=30, every=10, eval_batches=2, final_eval_batches=2, warmup_steps=5)


def quick() -> TrainConfig:
    """About ten seconds per run on 2 cores."""
    model = ModelConfig(n_layers=2, n_heads=2, d_model=64, context=64)
    return run(model, batch_size=16, max_steps=150, every=50, eval_batches=4, final_eval_batches=8, warmup_steps=10)


def standard() -> TrainConfig:
    """The default study's runs: 480 steps of 16 x 64 tokens, 32 final evaluation batches."""
    model = ModelConfig(n_layers=2, n_heads=4, d_model=128, context=64)
    return run(model, batch_size=16, max_steps=480, every=100, eval_batches=8, final_eval_batches=32, warmup_steps=20)


def paper() -> TrainConfig:
    """Shazeer 2020's shape (6 layers, pre-norm, no dropout) at a CPU-sized width and budget."""
    model = ModelConfig(n_layers=6, n_heads=8, d_model=256, context=256)
    return run(model, batch_size=32, max_steps=5000, every=250, eval_batches=16, final_eval_batches=64,
               warmup_steps=200, lr=1e-3)  # fmt: skip


def scaling() -> TrainConfig:
    """The base of `compare --preset scaling`: the standard run, whose width the study scales
    (`ffnlab.study.plan.PRESET_SCALES`), so one fit spans about two decades of compute."""
    return standard()


def run(model: ModelConfig, every: int, **fields) -> TrainConfig:
    """A preset's TrainConfig: evaluated and checkpointed `every` steps."""
    return TrainConfig(model=model, eval_every=every, checkpoint_every=every, **fields)


PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "smoke": smoke,
    "quick": quick,
    "standard": standard,
    "paper": paper,
    "scaling": scaling,
}
DEFAULT_PRESET = "standard"  # what `compare` starts from without --preset


def preset_config(name: str, model: dict | None = None, **overrides) -> TrainConfig:
    """The preset's TrainConfig with `model=` fields and other fields overridden (validated by the dataclasses)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{shorten(name)}'{closest(name, PRESETS)}; valid: {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    return replace(cfg, model=replace(cfg.model, **(model or {})), **overrides)
