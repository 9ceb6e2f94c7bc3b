"""Executing a study crash-safely: each run claimed, locked, trained (resuming from its checkpoint) and
recorded in the store in one transaction; in-process, in local worker processes (`jobs`) or as Ray tasks.

A run killed half-way resumes from its checkpoint, kept under the store's folder until it finishes.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ffnlab._util.children import die_with_parent, safe_child_pythons
from ffnlab._util.files import write_atomic
from ffnlab._util.machine import check_threads
from ffnlab._util.text import first_line, one_line_warning
from ffnlab.core.ffn import single_ffn_spec
from ffnlab.data.batches import check_data
from ffnlab.data.load import load_data
from ffnlab.run.checkpoint import remove_checkpoints
from ffnlab.run.config import TrainConfig
from ffnlab.run.device import check_fits, resolve_device
from ffnlab.run.result import RunResult
from ffnlab.run.train import Progress, check_shard, data_args, data_model_config, train
from ffnlab.study.mirror import mirror_runs
from ffnlab.study.plan import Study, iter_plan, plan, plan_precision, run_count, run_id, study_id
from ffnlab.study.records import RunStatus, Summary
from ffnlab.study.store import DEFAULT_PATH, Store
from ffnlab.study.summary import summarize_study

# ---- executing one run --------------------------------------------------------------------------


def checkpoint_dir(store_path: Path, rid: str) -> Path:
    return store_path.parent / "checkpoints" / rid


def lock_path(store_path: Path, rid: str) -> Path:
    return Path(store_path).parent / "checkpoints" / f"{rid}.lock"


@contextlib.contextmanager
def run_lock(store_path: Path, rid: str, wait: bool) -> Iterator[bool]:
    """An exclusive lock on one run, so two sweeps on one store never train the same run at once.
    Yields False (without waiting) when another process holds it and wait is False. The OS drops
    the lock when its holder dies, even by kill -9 (its file stays until the next holder's turn ends).

    The lock file lasts only while held: its holder deletes it before letting go. NOTE: a process that
    opened the file before that deletion may lock it just after; it finds the path gone (or a new file
    there) and tries again on the path's file, so only a lock on the file the path names counts."""
    path = lock_path(store_path, rid)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        os.close(fd)
    try:
        yield True
    finally:
        path.unlink(missing_ok=True)  # missing only where someone removed the folder
        os.close(fd)  # lets go


def record(store: Store, rid: str, run: RunResult, env: dict[str, Any] | None = None) -> None:
    """Write a run's curves, events and result to the store; the status is written last."""
    hist = run.history
    rows = [(i + 1, "train_loss", v) for i, v in enumerate(hist.train_loss)]
    rows += [(i + 1, "grad_norm", v) for i, v in enumerate(hist.grad_norm)]
    for point in hist.val:  # val_loss, val_acc, ..., val_time
        rows += [(point.step, f"val_{k}", v) for k, v in point.to_json().items() if k != "step"]
    for grads in hist.grad_ffn:
        rows += [(grads.step, k, v) for k, v in grads.stats.items()]
    store.add_metrics(rid, rows)
    store.add_events(rid, [e.to_json() for e in run.events])
    store.finish(rid, run, env)


# NOTE: matmul reductions round differently with another thread count, so a run trains on one thread unless
# its config says otherwise: how a study is scheduled (--jobs, Ray) never changes its numbers, and one
# single-threaded worker per core (--jobs auto) keeps the cores busy.
SWEEP_THREADS = 1


def execute(cfg_dict: dict[str, Any], store_path: str, progress: Progress | None = None) -> str:
    """Run one config unless finished, on SWEEP_THREADS threads (or its own `threads`); resume from
    its checkpoint; store the result. Returns the run's final status, or 'busy' when another process
    is training it right now. The process's thread count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    cfg = TrainConfig.from_dict(cfg_dict)
    torch.set_num_threads(check_threads(cfg.threads or SWEEP_THREADS))
    try:
        return execute_run(cfg, Path(store_path), progress)
    finally:
        torch.set_num_threads(before)


def execute_run(cfg: TrainConfig, store_path: Path, progress: Progress | None) -> str:
    """`execute` without the thread setting: claim, lock, train (resuming), record."""
    rid = run_id(cfg)
    with Store(store_path) as store:
        status = RunStatus(store.claim(rid, cfg.to_dict()))
        if status.done:
            return status
        with run_lock(store_path, rid, wait=False) as locked:
            if not locked:
                return "busy"
            status = claimed_status(store, rid)  # another sweep may have finished it meanwhile
            if status.done:
                return status
            ckpt = checkpoint_dir(store_path, rid)
            store.start(rid)
            try:
                # final weights are written before record(), so a finished run always has them
                result = train(
                    replace(cfg, checkpoint_dir=str(ckpt)),
                    progress=progress,
                    weights_path=weights_path(store_path, rid),
                )
            except Exception as e:  # a bug or a bad input in one run must not stop the sweep
                store.fail(rid, f"{type(e).__name__}: {e}")
                return "failed"
            except BaseException:  # Ctrl-C or SIGTERM (SystemExit): no failure, the run resumes from its checkpoint
                store.release(rid)
                raise
            record(store, rid, result)
            remove_checkpoints(ckpt)
            return claimed_status(store, rid)


def claimed_status(store: Store, rid: str) -> RunStatus:
    """The status of a run this sweep has claimed; ValueError if it is gone (the store was edited meanwhile)."""
    claimed = store.get(rid)
    if claimed is None:
        raise ValueError(f"run {rid} was claimed in {store.path} but is gone from it; the store was edited")
    return claimed.status


def weights_path(store_path: Path, rid: str) -> Path:
    """Where a finished run's final weights live: `<store dir>/weights/<run id>.safetensors`."""
    return Path(store_path).parent / "weights" / f"{rid}.safetensors"


def wait_for(store_path: Path, rid: str) -> None:
    """Block until the process holding a run's lock lets go (it finished or died)."""
    with run_lock(store_path, rid, wait=True):
        pass


# ---- executing a study ----------------------------------------------------------------------------


def resolve_jobs(jobs: int | str, device: str = "cpu", nproc: int = 1) -> int:
    """Runs at once for `jobs`: 'auto' is one single-threaded process per core on the CPU (chosen by
    measurement: docs/explanation/default-study.md), each run's `nproc` processes counted, and one run on a GPU;
    a number is taken as it is."""
    if jobs == "auto":
        if device != "cpu" and resolve_device(device) == "cuda":
            return 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, cores // nproc)
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive number or 'auto', got {jobs!r}")
    return jobs


def run_study(
    study: Study,
    store_path: str | os.PathLike[str] = DEFAULT_PATH,
    jobs: int | str = 1,
    backend: str = "local",
    address: str | None = None,
    quiet: bool = False,
    log_to: str | None = None,
) -> Summary:
    """Execute every planned run (skipping finished ones) and return the summary. Runs are planned and claimed
    one at a time as their turn comes (`unfinished`), so the first starts at once however many there are; a
    sweep stopped by Ctrl-C or SIGTERM leaves none of its runs marked running (`release_stopped`)."""
    if backend not in ("local", "ray"):
        raise ValueError(f"unknown backend '{backend}'; valid: local, ray")
    if study.base.shard:  # refused once, before the first run, not in each
        check_shard(study.base)
    workers = resolve_jobs(jobs, study.base.device, study.base.nproc)
    if backend == "local":  # on a Ray cluster the data may live only where the workers are
        preflight(iter_plan(study, seeds=1))  # a run's seed changes neither its data nor its model's size
    path = Path(store_path)
    display = SweepProgress(run_count(study), quiet, path)
    handed: list[str] = []  # the runs given to a backend, which a stopped sweep may leave running
    with Store(path) as store:
        recorded = replace(study, base=replace(study.base, precision=plan_precision(study.base)))
        store.add_study(study_id(recorded), recorded.to_dict())
        todo = unfinished(store, iter_plan(study), display, handed)
        try:
            busy: list[TrainConfig] = []
            first = [] if backend == "ray" else list(itertools.islice(todo, workers))  # worth a pool?
            todo = itertools.chain(first, todo)
            if backend == "ray":
                busy = run_on_ray(todo, path, address, display)
            elif len(first) > 1:
                busy = run_in_processes(todo, path, len(first), display)
            else:
                for cfg in todo:
                    status = execute(cfg.to_dict(), str(path), display.run_progress(cfg))
                    busy.append(cfg) if status == "busy" else display.done(cfg, status)
            for cfg in busy:  # trained by a concurrent sweep: wait for it, then retry here (it may have died)
                wait_for(path, run_id(cfg))
                display.done(cfg, execute(cfg.to_dict(), str(path), display.run_progress(cfg)))
        except BaseException:
            release_stopped(store, path, handed)
            raise
    display.close()
    runs = plan(study)
    if log_to:
        mirror_runs(runs, path, log_to)
    return summarize_study(study, path, runs)


def unfinished(
    store: Store, runs: Iterable[TrainConfig], display: SweepProgress, handed: list[str]
) -> Iterator[TrainConfig]:
    """The runs not done yet, each claimed in the store when it is asked for (claiming 99,000 runs before the first
    started took minutes); those done already are counted as skipped. Each id handed out is added to `handed`."""
    for cfg in runs:
        rid = run_id(cfg)
        if RunStatus(store.claim(rid, cfg.to_dict())).done:
            display.skip()
            continue
        handed.append(rid)
        display.say_skipped()
        yield cfg


RELEASE_WAIT_S = 2.0  # how long a stopped sweep waits for the workers it killed to let go of their runs


def release_stopped(store: Store, store_path: Path, handed: list[str]) -> None:
    """Mark pending again the runs of `handed` still marked running that no process trains (their lock is free):
    the sweep was stopped, and they resume from their checkpoints. Worker processes killed a moment ago let go of
    their locks as they exit, so this waits for them up to RELEASE_WAIT_S; a run another sweep trains keeps its
    lock and its status."""
    mine = set(handed)
    left = [record.id for record in store.runs(RunStatus.RUNNING) if record.id in mine]
    deadline = time.monotonic() + RELEASE_WAIT_S
    while left:
        for rid in list(left):
            with run_lock(store_path, rid, wait=False) as free:
                if free:
                    store.release(rid)
                    left.remove(rid)
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def preflight(runs: Iterable[TrainConfig]) -> None:
    """Check once, before any run starts, what would fail every run alike: each data source loads
    and splits into windows of its context, and each built-in model fits this machine's memory.
    ValueError naming the problem (the CLI's one line and exit 2) instead of a store of failed runs."""
    seen_data: set[tuple[object, ...]] = set()
    seen_model: set[tuple[str, int]] = set()
    for cfg in runs:
        if cfg.hf_config:
            single_ffn_spec(cfg.model.ffn)  # a Hugging Face model's FFNs are all swapped for one variant
        data = data_args(cfg)
        corpus, tok, splits = load_data(*data)
        if data + (cfg.model.context,) not in seen_data:
            seen_data.add(data + (cfg.model.context,))
            check_data(splits, cfg.model.task, cfg.model.context, cfg.data)
        mcfg = data_model_config(cfg, corpus, tok)
        key = (json.dumps(asdict(mcfg), sort_keys=True), cfg.batch_size)
        if not cfg.hf_config and key not in seen_model:
            seen_model.add(key)
            check_fits(cfg, mcfg, resolve_device(cfg.device))


def run_in_processes(
    todo: Iterable[TrainConfig], store_path: Path, jobs: int, display: SweepProgress
) -> list[TrainConfig]:
    """Local worker processes (each run on SWEEP_THREADS threads); they die with this process
    (a kill -9 of the sweep leaves no worker training on). Returns the runs a concurrent sweep was
    training ('busy'), which run_study waits for and retries as for the sequential path."""
    import multiprocessing as mp
    from concurrent.futures import as_completed

    busy = []
    with safe_child_pythons():
        context = mp.get_context("spawn")
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker, initargs=(os.getpid(),))
        try:
            futures = {pool.submit(execute, cfg.to_dict(), str(store_path)): cfg for cfg in todo}
            for fut in as_completed(futures):
                status = fut.result()
                busy.append(futures[fut]) if status == "busy" else display.done(futures[fut], status)
        except BaseException:  # Ctrl-C, SIGTERM (the CLI raises SystemExit), a bug: stop now, not after the queue
            stop_workers(pool)
            raise
        pool.shutdown()
    return busy


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel a pool's queued runs and kill the runs in flight. NOTE: the executor's own shutdown (also at
    interpreter exit) waits for every running task, hours for a long run; a killed run loses only the
    steps since its last checkpoint and resumes from it. `_processes` is private, so it is read defensively."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
    for process in workers:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def start_worker(parent: int) -> None:
    """A sweep's worker process, as it starts: it dies with the sweep (`die_with_parent`), and it writes ffnlab's
    warnings in one line, as the CLI does. A killed run loses nothing: it resumes from its checkpoint."""
    die_with_parent(parent)
    warnings.formatwarning = one_line_warning  # as the CLI writes ffnlab's warnings: one line each


def run_on_ray(
    todo: Iterable[TrainConfig], store_path: Path, address: str | None, display: SweepProgress
) -> list[TrainConfig]:
    """One Ray task per run with its CPU (or GPU) request. Only this process touches the store: it claims
    and locks each run, and records what the task returns (result, final weights, the worker's
    environment), so a cluster needs no shared file system (SQLite is not safe over NFS). Checkpoints
    stay on the worker that trains (`ray_checkpoint_root`). Returns the runs a concurrent sweep holds."""
    import ray

    started = not ray.is_initialized()
    # NOTE: Ray puts the driver's working directory first on its workers' sys.path (and starts a local
    # cluster's workers in it): started from an empty folder, they import nothing the user's folder holds
    # (a `torch.py` there), and each local task works in the user's folder again (relative data paths)
    empty = Path(tempfile.mkdtemp(prefix="ffnlab-ray-")) if started else None
    if empty is not None:
        with safe_child_pythons(), contextlib.chdir(empty):
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                num_cpus=None if address else os.cpu_count(),
            )
    home = str(Path.cwd()) if address is None else None
    busy: list[TrainConfig] = []
    refs: dict[ray.ObjectRef[WorkerOutcome], TrainConfig] = {}
    locks: dict[str, contextlib.ExitStack] = {}  # each run's lock, let go once its outcome is recorded
    with contextlib.ExitStack() as held, Store(store_path) as store:
        try:
            remote = ray.remote(train_on_worker)
            root = str(ray_checkpoint_root(store_path, address))
            for cfg in todo:
                rid = run_id(cfg)
                locks[rid] = held.enter_context(contextlib.ExitStack())  # closed at the latest with `held`
                if not locks[rid].enter_context(run_lock(store_path, rid, wait=False)):
                    busy.append(cfg)
                    continue
                status = claimed_status(store, rid)
                if status.done:  # another sweep finished it meanwhile
                    display.done(cfg, status)
                    locks[rid].close()
                    continue
                store.start(rid)
                # a run of nproc processes is one task holding nproc CPUs (or GPUs): torchrun's launcher
                # starts its ranks inside the task (`ffnlab.run.distributed.launch`)
                cpus, gpus = (1, cfg.nproc) if cfg.device == "cuda" else (cfg.nproc, 0)
                refs[remote.options(num_cpus=cpus, num_gpus=gpus).remote(cfg.to_dict(), root, home)] = cfg
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                cfg = refs[ready[0]]
                try:
                    returned = ray.get(ready[0])
                except Exception as e:  # the task itself died (a worker killed, out of memory): one failed run
                    returned = WorkerOutcome(env=None, error=first_line(e))
                display.done(cfg, record_returned(store, store_path, cfg, returned))
                locks[run_id(cfg)].close()  # a concurrent sweep waiting on it goes on now, not when this one ends
        finally:
            if started:
                ray.shutdown()
            if empty is not None:
                shutil.rmtree(empty, ignore_errors=True)
    return busy


def ray_checkpoint_root(store_path: Path, address: str | None) -> Path:
    """Where Ray tasks checkpoint: beside the store on a local cluster (a killed sweep resumes as with
    --jobs), in the worker's own cache on a remote one (a task retried on that machine resumes)."""
    if address is None:
        return store_path.resolve().parent / "checkpoints"
    return Path("~/.cache/ffnlab/ray-checkpoints")  # '~' expanded by the worker, in its own home


@dataclass(frozen=True)
class WorkerOutcome:
    """What a Ray task hands the driver to record: the run's result and final weights, or why it failed."""

    env: dict[str, Any] | None  # the worker's machine (ffnlab._util.machine.environment); None: the task died
    result: RunResult | None = None  # None: the run failed
    weights: bytes | None = None  # the safetensors file, where training saved one
    error: str | None = None  # why the run failed


def train_on_worker(cfg_dict: dict[str, Any], checkpoint_root: str, home: str | None = None) -> WorkerOutcome:
    """A Ray task: train one run on SWEEP_THREADS threads (or its own), checkpointing under
    `checkpoint_root` on this worker, and return what the driver records. `home`: the folder a local
    cluster's driver runs in, which relative paths in the config are relative to."""
    import torch

    from ffnlab._util.machine import environment

    if home is not None:
        os.chdir(home)
    cfg = TrainConfig.from_dict(cfg_dict)
    torch.set_num_threads(check_threads(cfg.threads or SWEEP_THREADS))
    ckpt = Path(checkpoint_root).expanduser() / run_id(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "weights.safetensors"
        try:
            result = train(replace(cfg, checkpoint_dir=str(ckpt)), weights_path=weights)
        except Exception as e:  # a bug or a bad input in one run must not stop the sweep
            return WorkerOutcome(environment(), error=f"{type(e).__name__}: {e}")
        out = WorkerOutcome(environment(), result, weights.read_bytes() if weights.exists() else None)
    remove_checkpoints(ckpt)
    return out


def record_returned(store: Store, store_path: Path, cfg: TrainConfig, returned: WorkerOutcome) -> str:
    """Record a Ray task's return in the store (weights first, as `execute_run` does); the run's status."""
    rid = run_id(cfg)
    if returned.result is None:
        store.fail(rid, returned.error or "the task returned no result", returned.env)
        return RunStatus.FAILED
    if returned.weights is not None:
        path = weights_path(store_path, rid)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, returned.weights)
    record(store, rid, returned.result, returned.env)
    return claimed_status(store, rid)


class SweepProgress:
    """Runs done/total with ETA, and the current run's steps, on one terminal line."""

    def __init__(self, total: int, quiet: bool, store_path: Path) -> None:
        self.total, self.done_n, self.quiet, self.store_path = total, 0, quiet, store_path
        self.t0, self.new_done, self.last = time.perf_counter(), 0, 0.0
        self.skipped, self.said = 0, 0  # runs found done in the store, and how many of them were said
        self.live = sys.stderr.isatty()  # the per-step line only on a terminal

    def skip(self) -> None:
        """A run found done in the store: counted, and said before the next run starts (`say_skipped`)."""
        self.done_n += 1
        self.skipped += 1

    def say_skipped(self, at_end: bool = False) -> None:
        """One line for the runs found done in the store: when a run first starts after some, and at the end for
        any found since."""
        if not self.quiet and self.skipped > self.said and (self.said == 0 or at_end):
            print(f"ffnlab: {self.skipped}/{self.total} runs already in the store, skipped", file=sys.stderr)
            self.said = self.skipped

    def eta(self) -> str:
        if not self.new_done:
            return "?"
        left = (time.perf_counter() - self.t0) / self.new_done * (self.total - self.done_n)
        return f"{left / 60:.1f} min"

    def run_progress(self, cfg: TrainConfig) -> Progress | None:
        if self.quiet or not self.live:
            return None
        head = f"[{self.done_n}/{self.total} runs, eta {self.eta()}] {cfg.model.ffn} seed {cfg.seed}: "

        def show(step: int, total: int, m: dict[str, float]) -> None:
            if time.perf_counter() - self.last > 0.2:
                self.last = time.perf_counter()
                sys.stderr.write(f"\r{head}{step}/{total} steps, loss {m['loss']:.3f}   ")
                sys.stderr.flush()

        return show

    def done(self, cfg: TrainConfig, status: str) -> None:
        """One run ended; a failed one's error is shown on its line (from the store)."""
        self.done_n += 1
        self.new_done += 1
        if not self.quiet:
            why = ""
            if status == "failed":
                with Store(self.store_path, create=False) as store:
                    error = getattr(store.get(run_id(cfg)), "error", None) or "?"
                why = f" ({error.splitlines()[0][:200]})"
            sys.stderr.write(
                f"{chr(13) if self.live else ''}[{self.done_n}/{self.total} runs, eta {self.eta()}] {cfg.model.ffn} seed "
                f"{cfg.seed}: {status}{why}".ljust(78)
                + "\n"
            )

    def close(self) -> None:
        self.say_skipped(at_end=True)
        if not self.quiet:
            sys.stderr.flush()
