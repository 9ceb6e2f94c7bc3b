"""One run across processes: torch.distributed's data parallelism, started by torchrun.

`torchrun --nproc-per-node N -m ffnlab train ...` starts N processes and tells each its RANK, WORLD_SIZE and
LOCAL_RANK; `join` reads them and starts the process group (gloo on the CPU, NCCL on GPUs). `launch` is what
`ffnlab train --nproc N` and a study's runs use: it starts torchrun's own launcher (`elastic_launch`, a
standalone rendezvous on this machine) with `rank_main` in each process, and hands back rank 0's result.

Every rank builds the same model from the same seed, draws the same global batch and keeps its share, and
DDP averages the gradients over the ranks, so the run computes what one process computes at the same global
batch (batch_size x nproc x grad_accum). Rank 0 alone writes (checkpoints, weights, the result); a sharded run's
(`shard`) model and optimizer state are gathered whole first, by every rank, into the files an unsharded run writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ffnlab._util.children import die_with_parent, safe_child_pythons
from ffnlab._util.signals import stop_within
from ffnlab._util.text import one_line_warning

if TYPE_CHECKING:
    from ffnlab.run.config import TrainConfig
    from ffnlab.run.result import RunResult


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in a run: its rank, the number of processes, and its rank on this machine."""

    rank: int = 0
    world: int = 1
    local: int = 0

    @property
    def main(self) -> bool:
        """Rank 0, which alone writes checkpoints, weights and results."""
        return self.rank == 0


def started_by_torchrun() -> bool:
    """Whether torchrun (or `launch`) started this process as one rank of a run."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def this_rank() -> Ranks:
    """This process's ranks, as torchrun set them; Ranks() for one process."""
    if not started_by_torchrun():
        return Ranks()
    return Ranks(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))


def join(device: str) -> Ranks:
    """`this_rank`; the first call in a rank of several starts the process group: gloo on the CPU, NCCL on CUDA,
    each rank on its own GPU (LOCAL_RANK)."""
    ranks = this_rank()
    if ranks.world > 1 and not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(ranks.local)  # so 'cuda' is this rank's GPU
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return ranks


def leave() -> None:
    """End this rank's process group (torch warns at exit about one left open)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def check_ranks(nproc: int, ranks: Ranks, device: str) -> None:
    """ValueError when a config's nproc is not the processes torchrun started (1 is 'whatever torchrun started'),
    or when CUDA ranks outnumber the GPUs."""
    if nproc not in (1, ranks.world):
        raise ValueError(
            f"nproc {nproc} asks for {nproc} processes, but torchrun started {ranks.world}; "
            f"give --nproc {ranks.world} or leave it out"
        )
    if device == "cuda" and ranks.world > torch.cuda.device_count():
        raise ValueError(f"{ranks.world} processes need a GPU each; this machine has {torch.cuda.device_count()}")


# ---- what the training loop calls ------------------------------------------------------------------------


def replicate(module: nn.Module, ranks: Ranks, device: str) -> nn.Module:
    """The module the training steps call: wrapped in DDP (gradients averaged over the ranks in backward) where
    the run has more than one process, else the module itself."""
    if ranks.world == 1:
        return module
    return DistributedDataParallel(module, device_ids=[ranks.local] if device == "cuda" else None)


def shard(model: nn.Module, opt: torch.optim.Optimizer, ranks: Ranks) -> None:
    """Shard `model` over the ranks in place (FSDP2's fully_shard: each block, then the rest), and move `opt` onto
    the sharded parameters, its state (a resumed run's) sharded alike."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    before = list(model.parameters())
    for block in getattr(model, "blocks", []):
        fully_shard(block)
    fully_shard(model)
    after = dict(zip(map(id, before), model.parameters()))
    for group in opt.param_groups:
        group["params"] = [after[id(p)] for p in group["params"]]
    for old in before:
        state = opt.state.pop(old, None)
        if state:
            new = after[id(old)]
            assert isinstance(new, DTensor)  # fully_shard's parameters
            opt.state[new] = {
                k: distribute_tensor(v, new.device_mesh, new.placements) if v.dim() > 0 else v for k, v in state.items()
            }


def whole_weights(model: nn.Module, ranks: Ranks) -> dict[str, torch.Tensor]:
    """A sharded model's state dict gathered whole onto rank 0's CPU (empty on the other ranks, which must call it
    too: it is a collective), each tied parameter under the one name safetensors' save_model keeps (the first in
    sorted order), so the file is the one an unsharded run writes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not ranks.main:  # cpu_offload leaves the others nothing
        return {}
    names: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():  # a tied head is the embedding's parameter
        names.setdefault(id(tensor), []).append(name)
    kept = {min(group) for group in names.values()}
    return {name: cast(torch.Tensor, tensor) for name, tensor in whole.items() if name in kept}


def whole_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, ranks: Ranks) -> dict[str, Any]:
    """A sharded model's optimizer state gathered whole onto rank 0's CPU (empty on the others; a collective), in
    the unsharded optimizer's `state_dict()` form (parameters numbered in the order of its groups), so a run with
    or without --shard resumes from it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    by_name = cast(dict[str, Any], get_optimizer_state_dict(model, opt, options=options))  # keyed by parameter name
    if not ranks.main:
        return {}
    groups: list[dict[str, Any]] = by_name["param_groups"]
    number = {name: i for i, name in enumerate(name for group in groups for name in group["params"])}
    return {
        "state": {number[name]: state for name, state in by_name["state"].items()},
        "param_groups": [{**group, "params": [number[name] for name in group["params"]]} for group in groups],
    }


def gradient_sync(module: object, sync: bool) -> contextlib.AbstractContextManager[None]:
    """Where a step accumulates micro-batches, DDP's `no_sync` for all but the last: the gradients are averaged
    over the ranks once, when the last backward has added its part."""
    if sync or not isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext()
    return module.no_sync()


def mean_over_ranks(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """A scalar averaged over the ranks (gloo has no AVG: the sum over the world size)."""
    if ranks.world == 1:
        return value
    value = value.clone()
    dist.all_reduce(value)
    return value / ranks.world


def rank_zero_value(value: float, ranks: Ranks) -> float:
    """Rank 0's `value` on every rank: a decision every rank must take alike (the clock of a time budget)."""
    if ranks.world == 1:
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def gathered(value: object, ranks: Ranks) -> list[object]:
    """Every rank's `value`, in rank order, on every rank."""
    if ranks.world == 1:
        return [value]
    out: list[object] = [None] * ranks.world
    dist.all_gather_object(out, value)
    return out


@contextlib.contextmanager
def rank_zero_first(ranks: Ranks) -> Iterator[None]:
    """Rank 0 runs the block, then the others: what rank 0 decides on the disk (a damaged checkpoint discarded)
    is what the others find."""
    if ranks.world > 1 and not ranks.main:
        dist.barrier()
    yield
    if ranks.world > 1 and ranks.main:
        dist.barrier()


# ---- starting a run's processes ---------------------------------------------------------------------------


class RankFailed(Exception):
    """A rank of a run died or failed; the others were stopped. Its message is one line."""


def launch(
    cfg: TrainConfig,
    show_progress: bool = False,
    weights_path: str | os.PathLike[str] | None = None,
    pretrained_path: str | os.PathLike[str] | None = None,
) -> RunResult:
    """Train `cfg` in cfg.nproc processes started by torchrun's launcher (a standalone rendezvous on this
    machine, no restarts) and return rank 0's result. Each rank runs one thread unless cfg.threads says more,
    as torchrun's default. ValueError for a rank's ValueError (every rank reads the same config and data);
    RankFailed, in one line, for a rank that died or failed otherwise: its checkpoint stays for a rerun."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # torchrun --standalone: a free port
        max_restarts=0,
        start_method="spawn",
    )
    threads = {"OMP_NUM_THREADS": str(cfg.threads or 1)}
    args = (cfg.to_dict(), os.getpid(), show_progress, weights_path, pretrained_path)
    with safe_child_pythons(), environment(threads), elastic_logs_quiet():
        try:
            returned = elastic_launch(config, rank_main)(*args)
        except ChildFailedError as e:
            raise failure(e, cfg) from None
    result: RunResult = returned[0]  # rank 0's return value (the launcher's dict of them is untyped)
    return result


def failure(e: Exception, cfg: TrainConfig) -> Exception:
    """The one-line error of a failed launch: the first rank that failed, and how."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    assert isinstance(e, ChildFailedError)
    rank, first = e.get_first_failure()
    if first.exitcode < 0:
        message = f"was killed by {first.signal_name()}"
    elif os.path.isfile(first.error_file):  # the exception the rank raised, recorded by torch's launcher
        text = first.message.get("message", "") if isinstance(first.message, dict) else first.message
        message = text.strip().splitlines()[0] if str(text).strip() else "failed"
        if message.startswith("ValueError: "):  # a user error (a bad config or data), the same in every rank
            return ValueError(message.removeprefix("ValueError: "))
        message = f"failed: {message}"
    else:
        message = f"exited with status {first.exitcode}"
    resume = f"; the checkpoint in {cfg.checkpoint_dir} is kept: run again to resume" if cfg.checkpoint_dir else ""
    return RankFailed(f"rank {rank} of {cfg.nproc} {message}, and the run stopped{resume}")


def rank_main(
    cfg_dict: dict[str, Any],
    parent: int,
    show_progress: bool,
    weights_path: str | os.PathLike[str] | None,
    pretrained_path: str | os.PathLike[str] | None,
) -> RunResult | None:
    """One rank of `launch`: train, and return the result from rank 0 (the others return None)."""
    from ffnlab.run.config import TrainConfig
    from ffnlab.run.train import progress_bar, train

    die_with_parent(parent)  # a launcher killed by SIGKILL leaves no rank training on
    warnings.formatwarning = one_line_warning
    cfg = TrainConfig.from_dict(cfg_dict)
    main = this_rank().main
    show = progress_bar(f"{cfg.model.ffn} seed {cfg.seed}: ") if show_progress and main else None
    try:
        with stop_within():  # SIGTERM (the launcher stopping the ranks) unwinds, as in the CLI
            result = train(cfg, progress=show, weights_path=weights_path, pretrained_path=pretrained_path)
    finally:
        leave()
    return result if main else None


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set where unset, for the processes started in the block."""
    added = {name: value for name, value in values.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


QUIET_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing.spawn")  # "Terminating process ... via SIGTERM"


@contextlib.contextmanager
def elastic_logs_quiet() -> Iterator[None]:
    """torchrun's launcher without its log lines (its configuration, each rank's failure in a block of text, the
    ranks it stops): `launch` says what failed in one line."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
