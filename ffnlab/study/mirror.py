"""Mirroring finished runs to experiment trackers (TensorBoard, MLflow), for those who browse runs there."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ffnlab.run.config import TrainConfig
from ffnlab.study.plan import run_id
from ffnlab.study.store import Store


def mirror_runs(runs: Iterable[TrainConfig], store_path: Path, log_to: str) -> None:
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
            with quiet_mlflow():
                mirror_to_mlflow(runs, store, store_path)


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """MLflow's INFO lines off ("Creating initial MLflow database tables...", and alembic's migrations):
    the sweep's own output says where its runs went. Warnings and errors still show."""
    import mlflow  # noqa: F401  # sets its loggers' levels when imported: before they are set here

    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def mirror_to_mlflow(runs: Iterable[TrainConfig], store: Store, store_path: Path) -> None:
    """Copy finished runs to MLflow: the user's tracking server if one is set, else a SQLite file beside
    the store."""
    import mlflow
    from mlflow.entities import Metric, Param

    here = store_path.parent.resolve()
    ours = not mlflow.is_tracking_uri_set()  # type: ignore[no-untyped-call]  # mlflow leaves it unannotated
    client = mlflow.MlflowClient(f"sqlite:///{here / 'mlflow.db'}" if ours else mlflow.get_tracking_uri())
    exp = client.get_experiment_by_name("ffnlab")
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment("ffnlab", artifact_location=(here / "mlartifacts").as_uri() if ours else None)
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
