"""Checkpoints of a training run: safetensors weights, the trainer state, and `latest.json` naming
the step to resume from. Every file is written through `atomic_path`, so a kill at any moment leaves
the previous checkpoint usable, and a checkpoint that cannot be read is discarded, never trusted.

A checkpoint directory holds one pair, `model-<step>.safetensors` and `state-<step>.pt` (the
dict `trainer_state` builds: step, elapsed seconds, history, optimizer state, data and torch RNG).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

from ffnlab._util.files import atomic_path, write_atomic


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and was discarded."""


class DamagedCheckpoint(Exception):
    """Raised by load_checkpoint after discarding a checkpoint it could not read."""


def save_weights(model: nn.Module, path: Path) -> None:
    """Weights as safetensors, written atomically (never half-written); creates the folder."""
    from safetensors.torch import save_model

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_model(model, str(tmp))


def trainer_state(
    step: int,
    elapsed: float,
    hist: dict,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    scaler: torch.amp.GradScaler,
) -> dict:
    """What a run needs besides the weights to go on from `step` exactly as if never stopped."""
    return {
        "step": step,
        "elapsed": elapsed,
        "hist": hist,
        "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict(),  # fp16's loss scale; empty for a disabled scaler
        "data_rng": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def save_checkpoint(directory: Path, model: nn.Module, state: dict) -> None:
    """Weights to safetensors and the trainer state (`trainer_state`) to a torch file, each written
    atomically; `latest.json` is switched last, so a kill leaves the previous pair usable."""
    step = state["step"]
    save_weights(model, directory / f"model-{step}.safetensors")
    with atomic_path(directory / f"state-{step}.pt") as tmp:
        torch.save(state, tmp)
    write_atomic(directory / "latest.json", json.dumps({"step": step}))
    for old in directory.glob("*-*.*"):  # older pairs are no longer needed
        if old.stem.split("-")[-1] != str(step) and not old.name.endswith(".tmp"):
            old.unlink(missing_ok=True)


def load_checkpoint(
    directory: Path, model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, scaler: torch.amp.GradScaler
) -> dict | None:
    """Resume from the latest checkpoint: weights into `model`, optimizer and gradient-scaler state, data and
    torch RNG; returns the trainer state, or None when there is no checkpoint.

    A checkpoint that cannot be read or applied whole (truncated, not safetensors, a pickle that
    weights_only refuses, weights of another model) is discarded with a warning naming it, and
    DamagedCheckpoint is raised: `model` and `opt` may be half-set, so the caller starts from a
    fresh model at step 0, which ends with the same result as an uninterrupted run.
    """
    from safetensors.torch import load_model

    latest = directory / "latest.json"
    if not latest.exists():
        return None
    try:
        step = int(json.loads(latest.read_text())["step"])
        state = torch.load(directory / f"state-{step}.pt", weights_only=True)
        if not isinstance(state, dict) or state.get("step") != step:
            raise ValueError(f"state-{step}.pt is not the trainer state of step {step}")
        load_model(model, str(directory / f"model-{step}.safetensors"), strict=True)
        opt.load_state_dict(state["optimizer"])
        if "scaler" in state:  # checkpoints written before fp16 have none
            scaler.load_state_dict(state["scaler"])
        gen.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
    except Exception as e:  # any damage: a resumed run must not fail on it forever
        warnings.warn(
            f"discarding the unreadable checkpoint in {directory} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else '-'}); the run starts again from step 0",
            CheckpointWarning,
            stacklevel=2,
        )
        for stale in directory.glob("*"):
            if stale.is_file():
                stale.unlink(missing_ok=True)
        raise DamagedCheckpoint(str(directory)) from None
    return state
