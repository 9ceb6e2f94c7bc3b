"""The study behind a run store: the one `run_study` recorded, or, for an older store, one rebuilt from
its runs (those whose configs agree on everything but the FFN, the seed and the study axes)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ffnlab.core.ffn import get_ffn_spec
from ffnlab.run.config import TrainConfig
from ffnlab.study.plan import AXES, Study, config_value, default_baseline, plan, run_id
from ffnlab.study.records import RunRecord
from ffnlab.study.store import Store


def axis_value(config: dict[str, Any], axis: str) -> Any:
    """The value of a study axis ('depth' -> config['model']['n_layers']) in a config dict."""
    return config_value(config, AXES[axis])


LEGACY_AXES = ("depth", "width", "placement", "norm", "task", "data")  # the axes before studies were recorded


def study_key(config: dict[str, Any]) -> str:
    """What runs of one study share: the config minus FFN, seed, checkpoint folder and axis values."""
    d = json.loads(json.dumps(config))
    d.pop("seed", None)
    d.pop("checkpoint_dir", None)
    d["model"].pop("ffn", None)
    for axis in LEGACY_AXES:
        parent, _, last = AXES[axis].rpartition(".")
        (config_value(d, parent) if parent else d).pop(last, None)
    return json.dumps(d, sort_keys=True)


def load_study(store_path: str | Path, baseline: str | None = None) -> tuple[Study, list[TrainConfig], int]:
    """The most recently run study in a store with a finished run: (study, its runs' configs, number
    of other studies). `baseline` replaces the study's own.

    Studies are recorded by `run_study`; for stores written before that, `rebuild_study` infers one.
    """
    with Store(store_path, read_only=True) as store:
        recorded = store.studies()
        for rec in recorded:
            study = Study.from_dict(rec.study)
            runs = plan(study)
            if any(getattr(store.get(run_id(c)), "done", False) for c in runs):
                break
        else:
            return rebuild_study(store_path, baseline)
    if baseline is not None:
        if get_ffn_spec(baseline).name not in study.variants:
            raise ValueError(f"baseline '{baseline}' was not run in this study; valid: {', '.join(study.variants)}")
        study = replace(study, baseline=get_ffn_spec(baseline).name)
    return study, runs, len(recorded) - 1


def rebuild_study(store_path: str | Path, baseline: str | None = None) -> tuple[Study, list[TrainConfig], int]:
    """For a store without study records: the most recently finished group of runs that agree on
    everything but the FFN, the seed and the axes an older ffnlab had (LEGACY_AXES).

    variants = the distinct FFNs, seeds = seeds per variant, axes = the axis fields that vary,
    baseline = `baseline`, else relu if present, else the first variant. Seeds of the baseline
    beyond the others' count are its noise-floor runs.
    """
    with Store(store_path, read_only=True) as store:
        records = [r for r in store.runs() if r.done]
    if not records:
        raise ValueError(f"run store {store_path} holds no finished runs; run `ffnlab compare` first")
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(study_key(r.config), []).append(r)
    latest = max(groups.values(), key=lambda rs: max(r.finished_at or 0.0 for r in rs))
    configs = [TrainConfig.from_dict(r.config) for r in latest]
    stale = sum(run_id(c) != r.id for c, r in zip(configs, latest))
    if stale:  # a config field was added since: the ids that summaries look up no longer match
        raise ValueError(
            f"{stale} runs in {store_path} were stored by an ffnlab whose run configs differ from "
            "this version's; run the study again into a new store"
        )
    variants = list(dict.fromkeys(c.model.ffn for c in configs))
    axes = {}
    for axis in LEGACY_AXES:
        values = list(dict.fromkeys(axis_value(r.config, axis) for r in latest))
        if len(values) > 1:
            axes[axis] = values
    if baseline is None:
        baseline = default_baseline(variants)
    elif get_ffn_spec(baseline).name not in variants:
        raise ValueError(f"baseline '{baseline}' was not run in this study; valid: {', '.join(variants)}")
    baseline = get_ffn_spec(baseline).name
    n_seeds = {v: len({c.seed for c in configs if c.model.ffn == v}) for v in variants}
    others = [n for v, n in n_seeds.items() if v != baseline]
    seeds = max(others) if others else n_seeds[baseline]
    study = Study(
        variants=variants,
        seeds=seeds,
        base=configs[0],
        axes=axes,
        baseline=baseline,
        noise_floor=max(0, n_seeds[baseline] - seeds),
    )
    return study, configs, len(groups) - 1
