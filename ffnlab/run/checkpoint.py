"""Checkpoints of a training run: safetensors weights, the trainer state, and `latest.json` naming
the step to resume from. Every file is written through `atomic_path`, so a kill at any moment leaves
the previous checkpoint usable, and a checkpoint that cannot be read is discarded, never trusted.

A checkpoint folder holds one pair, `model-<step>.safetensors` and `state-<step>.pt` (the
dict `trainer_state` builds: step, elapsed seconds, history, optimizer state, data and torch RNG),
`latest.json`, and the marker `.ffnlab-checkpoints`, written with the first checkpoint.

The folder rule: ffnlab deletes only the files it names (`is_own`), never by a wildcard, and only in a
folder it marked. A folder is used when it is new or empty, marked, or written by ffnlab before the
marker existed (only ffnlab's names, and a latest.json whose checkpoint loads). Any other folder, and one
holding a link, FIFO or device under ffnlab's names, is refused before training (`check_checkpoint_folder`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import stat
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ffnlab._util.files import atomic_path, write_atomic
from ffnlab._util.reading import read_text
from ffnlab._util.text import first_few

MARKER = ".ffnlab-checkpoints"
LATEST = "latest.json"
MARKER_TEXT = "ffnlab's checkpoints of one training run; ffnlab deletes only the files it wrote here.\n"
# what `trainer_state` builds and `load_checkpoint` returns: a plain dict of tensors and plain data, the form
# torch.load(weights_only=True) reads back (a record type would not load under weights_only)
TrainerState = dict[str, Any]


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and was discarded."""


class DamagedCheckpoint(Exception):
    """Raised by load_checkpoint after discarding a checkpoint it could not read."""


def pair_step(name: str) -> int | None:
    """The step of a checkpoint pair's file name (`model-<step>.safetensors`, `state-<step>.pt`, the step
    written as ffnlab writes it); None for any other name."""
    found = re.fullmatch(r"model-(0|[1-9][0-9]*)\.safetensors|state-(0|[1-9][0-9]*)\.pt", name)
    return None if found is None else int(found[1] or found[2])


def is_own(name: str) -> bool:
    """Whether ffnlab writes a file of this name into a checkpoint folder: the marker, latest.json, a pair's
    file, or the temporary file `atomic_path` writes one of them through (left there by a kill -9)."""
    temporary = re.fullmatch(r"\.(.+)\.[0-9]+\.tmp", name)
    name = temporary[1] if temporary else name
    return name in (MARKER, LATEST) or pair_step(name) is not None


def entry_kind(path: Path) -> str | None:
    """What `path` is when it is not a regular file ("a symbolic link to /dev/zero"), judged without
    following links: ffnlab never writes one, and `atomic_path` would write through a link to its target."""
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return f"a symbolic link to {os.readlink(path)}"
    return {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO"}.get(stat.S_IFMT(mode), "a device or socket")


def own_files(directory: Path) -> list[Path]:
    """The regular files of `directory` that ffnlab wrote (`is_own`), the marker aside."""
    return [p for p in directory.iterdir() if is_own(p.name) and p.name != MARKER and entry_kind(p) is None]


def check_checkpoint_folder(directory: Path) -> Path:
    """`directory` if ffnlab may checkpoint there (the module's folder rule); else ValueError in one line
    naming it and what is in the way. A folder it may use but not write to is refused too, before training."""
    if not directory.exists():
        if directory.is_symlink():
            raise ValueError(
                f"the checkpoint folder {directory} is a link to {os.readlink(directory)}, which does not exist"
            )
        home = directory.parent
        while not home.exists():
            home = home.parent
        if not home.is_dir() or not os.access(home, os.W_OK | os.X_OK):
            raise ValueError(f"cannot create the checkpoint folder {directory}: {home} is not a writable folder")
        return directory
    if not directory.is_dir():
        raise ValueError(f"the checkpoint folder {directory} is a file; give a folder")
    names = sorted(os.listdir(directory))
    for name in filter(is_own, names):
        kind = entry_kind(directory / name)
        if kind is not None:
            raise ValueError(
                f"the checkpoint folder {directory} holds {name}, which is {kind}; "
                "ffnlab writes only regular files there: remove it or give another folder"
            )
    if names and MARKER not in names:
        foreign = [name for name in names if not is_own(name)]
        if foreign:
            raise ValueError(
                f"the checkpoint folder {directory} holds files ffnlab did not write ({first_few(foreign, 3)}); "
                "give a new or empty folder, or one that holds only ffnlab's checkpoints"
            )
        if LATEST not in names:
            raise ValueError(
                f"the checkpoint folder {directory} holds {first_few(names, 3)} but no {LATEST} and no {MARKER} "
                "marker, so ffnlab cannot tell they are its own; give a new or empty folder"
            )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"the checkpoint folder {directory} is not writable")
    return directory


def save_weights(model: nn.Module | dict[str, torch.Tensor], path: Path) -> None:
    """A module's weights as safetensors, or a state dict gathered from a sharded model's (tied parameters under
    one name, as save_model leaves them), written atomically (never half-written); creates the folder."""
    from safetensors.torch import save_file, save_model

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if isinstance(model, nn.Module):
            save_model(model, str(tmp))
        else:
            save_file({name: tensor.contiguous() for name, tensor in model.items()}, str(tmp))


def trainer_state(
    step: int,
    elapsed: float,
    hist: dict[str, list[Any]],
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    scaler: torch.amp.GradScaler,
) -> TrainerState:
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


def save_checkpoint(directory: Path, model: nn.Module | dict[str, torch.Tensor], state: TrainerState) -> None:
    """Weights to safetensors (`save_weights`: a module, or a sharded model's gathered state dict) and the trainer
    state (`trainer_state`) to a torch file, each written atomically; `latest.json` is switched last, so a kill
    leaves the previous pair usable. The marker comes first: from then on the folder is ffnlab's, which deletes the
    older pairs, by name."""
    step = state["step"]
    check_checkpoint_folder(directory).mkdir(parents=True, exist_ok=True)
    if not (directory / MARKER).exists():
        write_atomic(directory / MARKER, MARKER_TEXT)
    save_weights(model, directory / f"model-{step}.safetensors")
    with atomic_path(directory / f"state-{step}.pt") as tmp:
        torch.save(state, tmp)
    write_atomic(directory / LATEST, json.dumps({"step": step}))
    for old in own_files(directory):
        if pair_step(old.name) not in (None, step):
            old.unlink(missing_ok=True)


def remove_checkpoints(directory: Path) -> None:
    """Delete a finished run's checkpoints: ffnlab's own files (`is_own`) and the marker, then the folder
    if that left it empty. Anything else a user put there stays, and so does the folder."""
    if not directory.is_dir():
        return
    for path in [*own_files(directory), directory / MARKER]:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: the user's files stay, and the folder with them
        directory.rmdir()


def load_checkpoint(
    directory: Path, model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, scaler: torch.amp.GradScaler
) -> TrainerState | None:
    """Resume from the latest checkpoint: weights into `model`, optimizer and gradient-scaler state, data and
    torch RNG; returns the trainer state, or None when there is no checkpoint. ValueError for a folder
    `check_checkpoint_folder` refuses.

    A checkpoint that cannot be read or applied whole (truncated, not safetensors, a pickle that
    weights_only refuses, weights of another model) is discarded with a warning naming it, and
    DamagedCheckpoint is raised: `model` and `opt` may be half-set, so the caller starts from a
    fresh model at step 0, which ends with the same result as an uninterrupted run. Only in a folder
    ffnlab marked: in an unmarked one the files may be the user's, so ValueError says so and nothing is deleted.
    """
    from safetensors.torch import load_model

    latest = check_checkpoint_folder(directory) / LATEST
    if not latest.exists():
        return None
    try:
        step = json.loads(read_text(latest, "the checkpoint index"))["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"{LATEST} names no step ({step!r})")
        state = load_state(directory / f"state-{step}.pt")
        if not isinstance(state, dict) or state.get("step") != step:
            raise ValueError(f"state-{step}.pt is not the trainer state of step {step}")
        load_model(model, str(directory / f"model-{step}.safetensors"), strict=True)
        opt.load_state_dict(state["optimizer"])
        if "scaler" in state:  # checkpoints written before fp16 have none
            scaler.load_state_dict(state["scaler"])
        gen.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
    except Exception as e:  # any damage: a resumed run must not fail on it forever
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else '-'}"
        if not (directory / MARKER).exists():
            raise ValueError(
                f"the checkpoint folder {directory} holds a checkpoint ffnlab cannot read ({reason}) and no "
                f"{MARKER} marker, so its files may not be ffnlab's and are kept; remove them or give another folder"
            ) from None
        warnings.warn(
            f"discarding the unreadable checkpoint in {directory} ({reason}); the run starts again from step 0",
            CheckpointWarning,
            stacklevel=2,
        )
        for stale in own_files(directory):
            stale.unlink(missing_ok=True)
        raise DamagedCheckpoint(str(directory)) from None
    return state


def load_state(path: Path) -> object:
    """What a trainer state file holds (load_checkpoint checks that it is one), loaded with weights_only (tensors
    and plain data: a pickle cannot run code); ValueError in ffnlab's words where torch refuses the file, whose
    own message advises the unsafe way round it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on the pickle protocol of a file it then refuses
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(
            f"{path.name} holds objects other than tensors and plain data, which ffnlab never loads"
        ) from None
