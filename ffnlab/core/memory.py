"""Memory a training step needs, counted from the tensors themselves, not read off the process.

A run's figure is the sum of four parts, each deterministic for a model and batch shape, so it does
not depend on what ran before in the same process (the process's peak RSS did):

    params      bytes of the distinct parameters (tied weights once)
    grads       bytes of their gradients (one per trainable parameter, same dtype)
    optimizer   bytes of the optimizer's state tensors (AdamW: two moments and a step count each)
    saved       bytes autograd keeps for backward in one training forward pass (activations)

On CUDA the allocator's peak, reset at the run's start, is recorded beside it.

Before anything is allocated, `build_on_meta` counts what sizes the user asked for would take, and
`ffnlab._util.machine.check_memory` refuses what this machine cannot hold. A depth past MAX_LAYERS is
refused before even that: meta-device layers are still built one by one (~2 ms each), so 10^8 of them
ran for minutes before any check saw them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypedDict, TypeVar

import torch
from torch import nn

from ffnlab._util.text import first_line


def saved_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes autograd keeps for backward while fn() runs, each tensor once, tensors sharing storage
    with `exclude` (the weights, kept anyway) left out. Measured with saved_tensors_hooks."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[tuple[int, int, tuple[int, ...]], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[(ptr, int(t.storage_offset()), tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct tensors (a tensor listed twice, such as a tied weight, counts once)."""
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of an optimizer's state tensors (empty before its first step)."""
    return tensor_bytes(v for state in opt.state.values() for v in state.values() if torch.is_tensor(v))


class TrainingMemory(TypedDict):
    """A training step's memory in bytes, by part and in all (the fields of the same names of a run's
    `ffnlab.run.result.Memory`)."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    saved_bytes: int
    train_mem_bytes: int  # the sum of the four above


def training_memory(model: nn.Module, opt: torch.optim.Optimizer, saved: int) -> TrainingMemory:
    """The memory of a training step of a model whose optimizer has stepped at least once; `saved`
    comes from `saved_bytes` on a real step."""
    params = list(model.parameters())
    param_bytes, grad_bytes = tensor_bytes(params), tensor_bytes(p for p in params if p.requires_grad)
    state_bytes = optimizer_bytes(opt)
    total = param_bytes + grad_bytes + state_bytes + saved
    return TrainingMemory(
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=state_bytes,
        saved_bytes=saved,
        train_mem_bytes=total,
    )


# NOTE: ten times the deepest Transformer trained (DeepNet, 1,000 layers: Wang et al. 2022, arXiv:2203.00555)
MAX_LAYERS = 10_000


def check_layer_count(n_layers: int, what: str = "n_layers") -> None:
    """ValueError naming `what` (the flag or config key) unless 1 <= n_layers <= MAX_LAYERS."""
    if n_layers <= 0:
        raise ValueError(f"{what} must be positive, got {n_layers}")
    if n_layers > MAX_LAYERS:
        raise ValueError(
            f"{what} is {n_layers:,}, more than the {MAX_LAYERS:,} layers ffnlab builds (ten times the deepest "
            f"Transformer trained); use 1 to {MAX_LAYERS:,} layers"
        )


M = TypeVar("M", bound=nn.Module)


def build_on_meta(build: Callable[[], M], advice: str) -> M:
    """The module `build()` makes, on the meta device: shapes without storage, so parameters are
    counted for any size in microseconds and nothing is allocated. ValueError ending in `advice` (what
    to make smaller) when a tensor of it has more elements than torch can index."""
    try:
        with torch.device("meta"):
            return build()
    except (RuntimeError, OverflowError, TypeError) as e:  # NOTE: torch says TypeError for a size past int64
        raise ValueError(f"the model's sizes overflow ({first_line(e)}); {advice}") from None
