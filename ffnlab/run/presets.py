"""Named run configurations: one typed function per preset, each returning a `TrainConfig`.

`standard` is the default study's (README, "The default study"). `paper` keeps the shape of Shazeer
2020's setup (pre-norm, no dropout, gated widths matched to 4x dense in parameters, equal steps,
6 layers) at the largest size one CPU trains in hours, not weeks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ffnlab._util.names import closest
from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig


def smoke() -> TrainConfig:
    """Seconds per run: for tests and trying the commands."""
    return TrainConfig(
        model=ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32),
        batch_size=8, max_steps=30, eval_every=10, eval_batches=2, final_eval_batches=2, warmup_steps=5,
        checkpoint_every=10,
    )  # fmt: skip


def quick() -> TrainConfig:
    """About ten seconds per run on 2 cores."""
    return TrainConfig(
        model=ModelConfig(n_layers=2, n_heads=2, d_model=64, context=64),
        batch_size=16, max_steps=150, eval_every=50, eval_batches=4, final_eval_batches=8, warmup_steps=10,
        checkpoint_every=50,
    )  # fmt: skip


def standard() -> TrainConfig:
    """The default study's runs: 480 steps of 16 x 64 tokens, 32 final evaluation batches."""
    return TrainConfig(
        model=ModelConfig(n_layers=2, n_heads=4, d_model=128, context=64),
        batch_size=16, max_steps=480, eval_every=100, eval_batches=8, final_eval_batches=32, warmup_steps=20,
        checkpoint_every=100,
    )  # fmt: skip


def paper() -> TrainConfig:
    """Shazeer 2020's shape (6 layers, pre-norm, no dropout) at a CPU-sized width and budget."""
    return TrainConfig(
        model=ModelConfig(n_layers=6, n_heads=8, d_model=256, context=256),
        batch_size=32, max_steps=5000, eval_every=250, eval_batches=16, final_eval_batches=64, warmup_steps=200,
        lr=1e-3, checkpoint_every=250,
    )  # fmt: skip


PRESETS: dict[str, Callable[[], TrainConfig]] = {"smoke": smoke, "quick": quick, "standard": standard, "paper": paper}


def preset_config(name: str, model: dict | None = None, **overrides) -> TrainConfig:
    """The preset's TrainConfig with `model=` fields and other fields overridden (validated by the dataclasses)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{name}'{closest(name, PRESETS)}; valid: {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    return replace(cfg, model=replace(cfg.model, **(model or {})), **overrides)
