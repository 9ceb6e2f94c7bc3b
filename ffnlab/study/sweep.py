"""The comparison engine: expand a study into runs, execute them crash-safely, summarise them.

A study is variants x seeds x optional axes (depth, width, norm placement, task, data source).
Each run is a `TrainConfig`; its identity is the hash of that config's JSON, so re-running a
study skips finished runs, and a run killed half-way resumes from its checkpoint (kept under the
store's folder until the run is finished). Runs execute in-process, in local worker processes
(`jobs`), or as Ray tasks; every finished run goes to the SQLite store in one transaction.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ffnlab.core.ffn import get_ffn_spec
from ffnlab.run.train import (
    RunResult,
    TrainConfig,
    check_data,
    check_fits,
    load_data,
    resolve_device,
    resolve_precision,
    train,
)
from ffnlab.study.store import Store
from ffnlab.study.summary import summarize_cell, tuned_cells

DEFAULT_STORE = "ffnlab-runs/ffnlab.db"
# The default study compares the three FFNs the field moved through (ReLU 2017, GELU in BERT and GPT-2,
# SwiGLU in LLaMA) with 4 seeds: with fewer variants Holm's correction spends less of alpha, and 4
# paired seeds separate SwiGLU from ReLU (measured seed variance in the README, "The default study")
# within the time budget of a 2-core CPU without AMX. `--variants` adds silu, reglu, geglu, ...
DEFAULT_VARIANTS = ("relu", "gelu", "swiglu")
DEFAULT_SEEDS = 4

# Model shapes and budgets per preset. `standard` is the default study's (README, Performance). `paper` keeps the shape of
# Shazeer 2020's setup (pre-norm, no dropout, gated widths matched to 4x dense in parameters,
# equal steps, 6 layers) at the largest size one CPU can train in hours, not weeks.
PRESETS: dict[str, dict] = {
    "smoke": dict(
        model=dict(n_layers=1, n_heads=2, d_model=32, context=32),
        batch_size=8,
        max_steps=30,
        eval_every=10,
        eval_batches=2,
        final_eval_batches=2,
        warmup_steps=5,
        checkpoint_every=10,
    ),
    "quick": dict(
        model=dict(n_layers=2, n_heads=2, d_model=64, context=64),
        batch_size=16,
        max_steps=150,
        eval_every=50,
        eval_batches=4,
        final_eval_batches=8,
        warmup_steps=10,
        checkpoint_every=50,
    ),
    "standard": dict(
        model=dict(n_layers=2, n_heads=4, d_model=128, context=64),
        batch_size=16,
        max_steps=480,
        eval_every=100,
        eval_batches=8,
        final_eval_batches=32,
        warmup_steps=20,
        checkpoint_every=100,
    ),
    "paper": dict(
        model=dict(n_layers=6, n_heads=8, d_model=256, context=256),
        batch_size=32,
        max_steps=5000,
        eval_every=250,
        eval_batches=16,
        final_eval_batches=64,
        warmup_steps=200,
        lr=1e-3,
        checkpoint_every=250,
    ),
}
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
}


@dataclass
class Study:
    """What to compare: variants x seeds x axes on a base TrainConfig."""

    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    seeds: int = DEFAULT_SEEDS
    base: TrainConfig = field(default_factory=TrainConfig)
    axes: dict[str, list] = field(default_factory=dict)  # e.g. {"depth": [2, 6]}
    baseline: str = "relu"
    noise_floor: int = 0  # extra baseline-only seeds to show the seed-to-seed spread
    per_variant: dict[str, dict] = field(default_factory=dict)  # variant -> {config path: value}, e.g. the
    # lr the protocol tuned for it; empty in a plain comparison, where every variant shares the base

    def __post_init__(self):
        if isinstance(self.base, dict):
            self.base = TrainConfig.from_dict(self.base)
        check_study(self)

    def to_dict(self) -> dict:
        return {
            "variants": self.variants,
            "seeds": self.seeds,
            "base": self.base.to_dict(),
            "axes": self.axes,
            "baseline": self.baseline,
            "noise_floor": self.noise_floor,
            "per_variant": self.per_variant,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Study:
        return cls(**d)


def study_id(study: Study) -> str:
    """Identity of a study: sha256 of its JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(study.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def check_study(study: Study):
    """ValueError naming the first problem of a study and the valid choices."""
    if not study.variants:
        raise ValueError("no variants given; e.g. --variants relu,gelu,swiglu")
    canon = [get_ffn_spec(v).name for v in study.variants]
    if len(set(canon)) != len(canon):
        raise ValueError(f"variants repeat: {', '.join(study.variants)}")
    study.variants = canon
    baseline = get_ffn_spec(study.baseline).name
    if baseline not in canon:
        raise ValueError(f"baseline '{study.baseline}' is not among the variants; valid: {', '.join(canon)}")
    study.baseline = baseline
    if study.seeds < 1 or study.noise_floor < 0:
        raise ValueError(f"seeds must be >= 1 and noise floor >= 0, got {study.seeds}, {study.noise_floor}")
    for axis, values in study.axes.items():
        if axis not in AXES:
            raise ValueError(f"unknown axis '{axis}'; valid: {', '.join(AXES)}")
        if not values:
            raise ValueError(f"axis '{axis}' has no values")
        for value in values:  # each value is validated by the config dataclasses now, not by a failed run
            set_field(study.base, AXES[axis], value)
    per_variant = {}
    for variant, overrides in study.per_variant.items():
        name = get_ffn_spec(variant).name
        if name not in canon:
            raise ValueError(
                f"per-variant settings for '{variant}', which is not among the variants: {', '.join(canon)}"
            )
        for path, value in overrides.items():
            set_field(study.base, path, value)
        per_variant[name] = dict(overrides)
    study.per_variant = per_variant


def preset_config(name: str, **overrides) -> TrainConfig:
    """TrainConfig of a preset, with `model=` and other fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{name}'; valid: {', '.join(PRESETS)}")
    p = copy.deepcopy(PRESETS[name])
    model = {**p.pop("model"), **overrides.pop("model", {})}
    from ffnlab.core.model import ModelConfig

    return TrainConfig(model=ModelConfig(**model), **{**p, **overrides})


def set_field(cfg: TrainConfig, path: str, value) -> TrainConfig:
    """Copy of cfg with 'model.x' or 'x' set to value (validated by the dataclasses)."""
    if path.startswith("model."):
        return replace(cfg, model=replace(cfg.model, **{path[6:]: value}))
    return replace(cfg, **{path: value})


def run_id(cfg: TrainConfig) -> str:
    """Identity of a run: sha256 of its config JSON (keys sorted), without where it checkpoints.

    Fields that are None are left out, so adding an optional field to the configs later keeps the
    identity of every run already in a store.
    """
    d = cfg.to_dict()
    d.pop("checkpoint_dir", None)
    d = {k: v for k, v in d.items() if v is not None}
    d["model"] = {k: v for k, v in d["model"].items() if v is not None}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def plan_precision(base: TrainConfig) -> str:
    """The precision runs are planned with: 'auto' resolved here, so a run's identity says whether
    it trains in bf16 or fp32."""
    return resolve_precision(base.precision, base.device)


def plan(study: Study) -> list[TrainConfig]:
    """Every run of the study: axes x variants x seeds, then the noise-floor baseline seeds."""
    axis_names = list(study.axes)
    runs = []
    base = replace(study.base, precision=plan_precision(study.base))
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


# ---- executing one run --------------------------------------------------------------------------


def checkpoint_dir(store_path: Path, rid: str) -> Path:
    return store_path.parent / "checkpoints" / rid


def lock_path(store_path: Path, rid: str) -> Path:
    return Path(store_path).parent / "checkpoints" / f"{rid}.lock"


@contextlib.contextmanager
def run_lock(store_path: Path, rid: str, wait: bool):
    """An exclusive lock on one run, so two sweeps on one store never train the same run at once.
    Yields False (without waiting) when another process holds it and wait is False. The OS drops
    the lock when its holder dies, even by kill -9."""
    path = lock_path(store_path, rid)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def record(store: Store, rid: str, run: RunResult):
    """Write a run's curves, events and result to the store; the status is written last."""
    result = run.to_dict()
    hist = result.pop("history")
    rows = [(i + 1, "train_loss", v) for i, v in enumerate(hist["train_loss"])]
    rows += [(i + 1, "grad_norm", v) for i, v in enumerate(hist["grad_norm"])]
    for row in hist["val"]:
        rows += [(row["step"], f"val_{k}", v) for k, v in row.items() if k != "step"]
    for row in hist["grad_ffn"]:
        rows += [(row["step"], k, v) for k, v in row.items() if k != "step"]
    store.add_metrics(rid, rows)
    store.add_events(rid, result.pop("events"))
    store.finish(rid, "finished" if result["status"] == "finished" else "diverged", result)


# NOTE: matmul reductions round differently with another thread count, so a run trains on one thread unless
# its config says otherwise: how a study is scheduled (--jobs, Ray) never changes its numbers, and one
# single-threaded worker per core (--jobs auto) keeps the cores busy.
SWEEP_THREADS = 1


def execute(cfg_dict: dict, store_path: str, progress=None) -> str:
    """Run one config unless finished, on SWEEP_THREADS threads (or its own `threads`); resume from
    its checkpoint; store the result. Returns the run's final status, or 'busy' when another process
    is training it right now. The process's thread count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    cfg = TrainConfig.from_dict(cfg_dict)
    torch.set_num_threads(cfg.threads or SWEEP_THREADS)
    try:
        return execute_run(cfg, Path(store_path), progress)
    finally:
        torch.set_num_threads(before)


def execute_run(cfg: TrainConfig, store_path: Path, progress) -> str:
    """`execute` without the thread setting: claim, lock, train (resuming), record."""
    rid = run_id(cfg)
    with Store(store_path) as store:
        status = store.claim(rid, cfg.to_dict())
        if status in ("finished", "diverged"):
            return status
        with run_lock(store_path, rid, wait=False) as locked:
            if not locked:
                return "busy"
            status = store.get(rid)["status"]  # another sweep may have finished it meanwhile
            if status in ("finished", "diverged"):
                lock_path(store_path, rid).unlink(missing_ok=True)  # this process may have made it anew
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
                store.finish(
                    rid, "failed", {"error": f"{type(e).__name__}: {e}", "ffn": cfg.model.ffn, "seed": cfg.seed}
                )
                return "failed"
            record(store, rid, result)
            shutil.rmtree(ckpt, ignore_errors=True)
            # NOTE: safe to remove while held: whoever opens the path later re-reads the status under the lock
            lock_path(store_path, rid).unlink(missing_ok=True)
            return store.get(rid)["status"]


def weights_path(store_path: Path, rid: str) -> Path:
    """Where a finished run's final weights live: `<store dir>/weights/<run id>.safetensors`."""
    return Path(store_path).parent / "weights" / f"{rid}.safetensors"


def wait_for(store_path: Path, rid: str):
    """Block until the process holding a run's lock lets go (it finished or died)."""
    with run_lock(store_path, rid, wait=True):
        pass


# ---- executing a study ----------------------------------------------------------------------------


def resolve_jobs(jobs: int | str, device: str = "cpu") -> int:
    """Local worker processes for `jobs`: 'auto' is one single-threaded worker per core on the CPU
    (on 2 cores, two 1-thread workers finish 1.4x the runs per minute of one 2-thread process:
    README, Performance) and one process on a GPU; a number is taken as it is."""
    if jobs == "auto":
        if device != "cpu" and resolve_device(device) == "cuda":
            return 1
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive number or 'auto', got {jobs!r}")
    return jobs


def run_study(
    study: Study,
    store_path: str = DEFAULT_STORE,
    jobs: int | str = 1,
    backend: str = "local",
    address: str | None = None,
    quiet: bool = False,
    log_to: str | None = None,
) -> dict:
    """Execute every planned run (skipping finished ones) and return the summary."""
    if backend not in ("local", "ray"):
        raise ValueError(f"unknown backend '{backend}'; valid: local, ray")
    jobs = resolve_jobs(jobs, study.base.device)
    runs = plan(study)
    if backend == "local":  # on a Ray cluster the data may live only where the workers are
        preflight(runs)
    store_path = Path(store_path)
    with Store(store_path) as store:
        recorded = replace(study, base=replace(study.base, precision=plan_precision(study.base)))
        store.add_study(study_id(recorded), recorded.to_dict())
        for cfg in runs:
            store.claim(run_id(cfg), cfg.to_dict())
        todo = [cfg for cfg in runs if store.get(run_id(cfg))["status"] not in ("finished", "diverged")]
    display = SweepProgress(len(runs), len(runs) - len(todo), quiet, store_path)
    busy = []
    if backend == "ray":
        run_on_ray(todo, store_path, address, display)
    elif jobs > 1 and len(todo) > 1:
        busy = run_in_processes(todo, store_path, min(jobs, len(todo)), display)
    else:
        for cfg in todo:
            status = execute(cfg.to_dict(), str(store_path), display.run_progress(cfg))
            busy.append(cfg) if status == "busy" else display.done(cfg, status)
    for cfg in busy:  # trained by a concurrent sweep: wait for it, then retry here (it may have died)
        wait_for(store_path, run_id(cfg))
        display.done(cfg, execute(cfg.to_dict(), str(store_path), display.run_progress(cfg)))
    display.close()
    if log_to:
        mirror_runs(runs, store_path, log_to)
    return summarize(study, store_path, runs)


def preflight(runs: list[TrainConfig]):
    """Check once, before any run starts, what would fail every run alike: each data source loads
    and splits into windows of its context, and each built-in model fits this machine's memory.
    ValueError naming the problem (the CLI's one line and exit 2) instead of a store of failed runs."""
    seen_data, seen_model = set(), set()
    for cfg in runs:
        data = (cfg.data, cfg.model.task, cfg.tokenizer, cfg.bpe_vocab, cfg.text_field, cfg.label_field)
        corpus, tok, splits = load_data(*data)
        if data + (cfg.model.context,) not in seen_data:
            seen_data.add(data + (cfg.model.context,))
            check_data(splits, cfg.model.task, cfg.model.context, cfg.data)
        mcfg = replace(
            cfg.model,
            vocab_size=tok.vocab_size,
            n_classes=len(corpus.classes) if cfg.model.task == "cls" else cfg.model.n_classes,
        )
        key = (json.dumps(asdict(mcfg), sort_keys=True), cfg.batch_size)
        if not cfg.hf_config and key not in seen_model:
            seen_model.add(key)
            check_fits(cfg, mcfg, resolve_device(cfg.device))


def run_in_processes(todo, store_path: Path, jobs: int, display) -> list[TrainConfig]:
    """Local worker processes (each run on SWEEP_THREADS threads); they die with this process
    (a kill -9 of the sweep leaves no worker training on). Returns the runs a concurrent sweep was
    training ('busy'), which run_study waits for and retries as for the sequential path."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    busy = []
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=die_with_parent) as pool:
        futures = {pool.submit(execute, cfg.to_dict(), str(store_path)): cfg for cfg in todo}
        for fut in as_completed(futures):
            status = fut.result()
            busy.append(futures[fut]) if status == "busy" else display.done(futures[fut], status)
    return busy


def die_with_parent():
    """Ask Linux to SIGKILL this worker when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere a
    no-op. A killed run loses nothing: it resumes from its checkpoint."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG


def run_on_ray(todo, store_path: Path, address, display):
    """One Ray task per run with its CPU (or GPU) request; each task writes to the store itself,
    so the store path must be reachable from the workers (a shared file system on a cluster)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            **({} if address else {"num_cpus": os.cpu_count()}),
        )
    try:
        remote = ray.remote(execute)
        refs = {}
        for cfg in todo:
            gpu = 1 if cfg.device == "cuda" else 0
            ref = remote.options(num_cpus=1, num_gpus=gpu).remote(cfg.to_dict(), str(store_path.resolve()))
            refs[ref] = cfg
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            display.done(refs[ready[0]], ray.get(ready[0]))
    finally:
        if started:
            ray.shutdown()


def mirror_runs(runs, store_path: Path, log_to: str):
    """Copy finished runs' configs and curves to MLflow or TensorBoard, if installed."""
    with Store(store_path) as store:
        if log_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            for cfg in runs:
                rid = run_id(cfg)
                with SummaryWriter(str(store_path.parent / "tensorboard" / rid)) as w:
                    w.add_text("config", json.dumps(cfg.to_dict()))
                    for step, name, value in store.metrics(rid):
                        w.add_scalar(name, value, step)
        elif log_to == "mlflow":
            import mlflow
            from mlflow.entities import Metric, Param

            # the user's tracking server if one is set, else a SQLite file beside the store
            here = store_path.parent.resolve()
            ours = not mlflow.is_tracking_uri_set()
            client = mlflow.MlflowClient(f"sqlite:///{here / 'mlflow.db'}" if ours else mlflow.get_tracking_uri())
            exp = client.get_experiment_by_name("ffnlab")
            exp_id = (
                exp.experiment_id
                if exp
                else client.create_experiment(
                    "ffnlab", artifact_location=(here / "mlartifacts").as_uri() if ours else None
                )
            )
            for cfg in runs:
                rid = run_id(cfg)
                run = client.create_run(exp_id, run_name=f"{cfg.model.ffn}-s{cfg.seed}-{rid}")
                params = [
                    Param(k, str(v))
                    for k, v in {
                        "ffn": cfg.model.ffn,
                        "seed": cfg.seed,
                        "run_id": rid,
                        "precision": cfg.precision,
                    }.items()
                ]
                now = int(time.time() * 1000)
                metrics = [
                    Metric(name.replace("/", "."), value, now, step)
                    for step, name, value in store.metrics(rid)
                    if math.isfinite(value)
                ]
                for i in range(0, max(len(metrics), 1), 1000):  # MLflow takes at most 1000 metrics per batch
                    client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000], params=params if i == 0 else [])
                client.log_dict(run.info.run_id, cfg.to_dict(), "config.json")
                client.set_terminated(run.info.run_id)


class SweepProgress:
    """Runs done/total with ETA, and the current run's steps, on one terminal line."""

    def __init__(self, total: int, done: int, quiet: bool, store_path: Path):
        self.total, self.done_n, self.quiet, self.store_path = total, done, quiet, store_path
        self.t0, self.new_done, self.last = time.perf_counter(), 0, 0.0
        self.live = sys.stderr.isatty()  # the per-step line only on a terminal
        if not quiet and done:
            print(f"ffnlab: {done}/{total} runs already in the store, skipped", file=sys.stderr)

    def eta(self) -> str:
        if not self.new_done:
            return "?"
        left = (time.perf_counter() - self.t0) / self.new_done * (self.total - self.done_n)
        return f"{left / 60:.1f} min"

    def run_progress(self, cfg):
        if self.quiet or not self.live:
            return None
        head = f"[{self.done_n}/{self.total} runs, eta {self.eta()}] {cfg.model.ffn} seed {cfg.seed}: "

        def show(step, total, m):
            if time.perf_counter() - self.last > 0.2:
                self.last = time.perf_counter()
                sys.stderr.write(f"\r{head}{step}/{total} steps, loss {m['loss']:.3f}   ")
                sys.stderr.flush()

        return show

    def done(self, cfg, status):
        """One run ended; a failed one's error is shown on its line (from the store)."""
        self.done_n += 1
        self.new_done += 1
        if not self.quiet:
            why = ""
            if status == "failed":
                with Store(self.store_path, create=False) as store:
                    error = ((store.get(run_id(cfg)) or {}).get("result") or {}).get("error") or "?"
                why = f" ({error.splitlines()[0][:200]})"
            sys.stderr.write(
                f"{chr(13) if self.live else ''}[{self.done_n}/{self.total} runs, eta {self.eta()}] {cfg.model.ffn} seed "
                f"{cfg.seed}: {status}{why}".ljust(78)
                + "\n"
            )

    def close(self):
        if not self.quiet:
            sys.stderr.flush()


# ---- summary --------------------------------------------------------------------------------------


def group_key(cfg: TrainConfig, study: Study) -> tuple:
    """The axis values of a run (its cell in the study), for grouping statistics."""
    d = cfg.to_dict()
    out = []
    for axis in study.axes:
        obj = d
        for part in AXES[axis].split("."):
            obj = obj[part]
        out.append((axis, obj))
    return tuple(out)


def summarize(study: Study, store_path, runs=None) -> dict:
    """The study's summary: one `ffnlab.study.summary.summarize_cell` per cell of its axes (never merged),
    plus, with an lr axis, the tuned comparison (`tuned_cells`)."""
    runs = plan(study) if runs is None else runs
    cells: dict[tuple, list] = {}
    with Store(Path(store_path), create=False) as store:
        for cfg in runs:
            cells.setdefault(group_key(cfg, study), []).append((cfg, store.get(run_id(cfg))))
    out_cells = [
        summarize_cell(items, study.variants, study.baseline, study.seeds, dict(key)) for key, items in cells.items()
    ]
    summary = {
        "store": str(store_path),
        "baseline": study.baseline,
        "seeds": study.seeds,
        "settings": settings_of(study),
        "cells": out_cells,
    }
    tuned = [a for a in TUNED_AXES if a in study.axes]
    if tuned:
        summary["tuned"] = tuned_cells(out_cells, tuned)
    if len(out_cells) == 1:  # the common case: no extra axes
        summary.update({k: out_cells[0][k] for k in ("variants", "verdict", "metric")})
        if "noise_floor" in out_cells[0]:
            summary["noise_floor"] = out_cells[0]["noise_floor"]
    return summary


def settings_of(study: Study) -> dict:
    """The run settings a reader needs to judge a comparison, with what it held equal and what not."""
    b = study.base
    return {
        "data": b.data,
        "task": b.model.task,
        "tokenizer": b.tokenizer,
        "model": {
            k: getattr(b.model, k)
            for k in ("n_layers", "n_heads", "d_model", "context", "norm", "placement", "pos", "dropout")
        },
        "match": b.model.ffn_match,
        "init": b.model.init,
        "batch_size": b.batch_size,
        "budget": (
            {"max_seconds": b.max_seconds}
            if b.max_seconds
            else {"max_tokens": b.max_tokens}
            if b.max_tokens
            else {"max_steps": b.max_steps}
        ),
        "tokens_per_run": (b.max_tokens or b.max_steps * b.batch_size * b.model.context) if not b.max_seconds else None,
        "lr": b.lr,
        "min_lr": b.lr / 10 if b.min_lr is None else b.min_lr,
        "warmup_steps": b.warmup_steps,
        "weight_decay": b.weight_decay,
        "beta2": b.beta2,
        "grad_clip": b.grad_clip,
        "precision": plan_precision(b),
        "seeds": study.seeds,
        "variants": study.variants,
        "axes": study.axes,
        "per_variant": study.per_variant,
        **held_equal(study),
    }


def held_equal(study: Study) -> dict[str, list[list[str]]]:
    """{"held_equal": [[what, how]], "not_equal": [[what, why]]}: the comparison's controls, in words.

    Everything but the FFN is held equal by construction (same seed -> same data order and the same
    non-FFN weights); what cannot be, or was chosen not to be, is named rather than left implicit.
    An axis of the study is varied on purpose and compared only within its cells."""
    b, m = study.base, study.base.model
    axes = set(study.axes)
    lr = "an lr axis: " + ", ".join(map(str, study.axes["lr"])) if "lr" in axes else f"peak {b.lr:g}"
    min_lr = "lr/10" if b.min_lr is None else f"{b.min_lr:g}"
    budget = (
        f"{b.max_tokens:,} tokens" if b.max_tokens else f"{b.max_steps:,} steps of {b.batch_size} x {m.context} tokens"
    )
    tuned = sorted({path for overrides in study.per_variant.values() for path in overrides})
    equal = [
        ["data order", "seed s of every variant trains on the same batches in the same order"],
        ["evaluation", "the same fixed validation (and test) batches for every variant and seed"],
        [
            "non-FFN weights",
            "identical at the start for one seed: each parameter drawn from its own generator, "
            "seeded by seed, name and shape",
        ],
        [
            "learning rate and schedule",
            f"AdamW, {lr}, {b.warmup_steps} warm-up steps, cosine to {min_lr}, "
            f"beta2 {b.beta2}, gradient clip {b.grad_clip}",
        ],
        [
            "weight-decay groups",
            f"{b.weight_decay} on every matrix; none on biases, norms or learnable activation parameters",
        ],
        ["precision", plan_precision(b)],
    ]
    unequal = []
    if tuned:
        equal = [row for row in equal if row[0] != "learning rate and schedule"]
        unequal.append(
            [
                "per-variant settings",
                f"{', '.join(tuned)} set per variant ("
                + "; ".join(
                    f"{v}: " + ", ".join(f"{k} {x:g}" for k, x in o.items()) for v, o in study.per_variant.items()
                )
                + "), each tuned on validation; the rest of the schedule as in the base",
            ]
        )
    if m.d_ff is not None:
        unequal.append(
            [
                "parameters",
                f"one hidden width (d_ff {m.d_ff}) for every variant: a gated FFN has 1.5x the weights of a dense one",
            ]
        )
    elif m.ffn_match == "none":
        unequal.append(["parameters", "not matched (--match none): each variant at its conventional width"])
    else:
        equal.append(
            [
                "parameters" if m.ffn_match == "params" else "FLOPs per token",
                f"every FFN within 1% of the dense 4x FFN's {m.ffn_match} (gated widths 2/3 as wide)",
            ]
        )
        unequal.append(
            [
                "FLOPs per token" if m.ffn_match == "params" else "parameters",
                f"follow from the width that matches {m.ffn_match}; shown per variant",
            ]
        )
    if "init" in axes:
        pass  # varied on purpose: an axis
    elif m.init == "family":
        unequal.append(
            [
                "FFN initialisation",
                "init 'family': each activation family its own scheme (relu he, "
                "gelu normal 0.02, swish lecun_uniform), so init is confounded "
                "with the activation",
            ]
        )
    else:
        equal.append(["FFN initialisation", f"{m.init} for every variant's FFN weights"])
    if b.max_seconds:
        unequal.append(
            ["tokens seen", f"an equal wall-clock budget ({b.max_seconds:g} s): faster variants train on more tokens"]
        )
    else:
        equal.append(["budget", budget])
    if m.ffn_bias is None:
        unequal.append(
            [
                "biases",
                "each variant's convention: dense FFNs have biases, gated ones none "
                "(Shazeer 2020); ModelConfig.ffn_bias sets one for all",
            ]
        )
    else:
        equal.append(["biases", "on in every FFN" if m.ffn_bias else "off in every FFN"])
    if axes:
        equal.append(["study axes", f"{', '.join(sorted(axes))}: varied on purpose, compared within each cell"])
    return {"held_equal": equal, "not_equal": unequal}
