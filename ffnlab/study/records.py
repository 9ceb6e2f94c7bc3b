"""Typed records of the study layer: what the store hands back and what a summary is made of.

    RunRecord   one stored run: its config, status and result (`Store.get`, `Store.runs`)
    VariantRow  one variant in one cell: the paired statistics of the ranking metric and every metric
    Cell        one combination of a study's axis values: its rows, best first, and its verdict
    Summary     a whole study: its cells, and the comparisons across them

Everything above the store (the summary, the terminal table, `compare --json` and `--csv`, the report
and `advise`) reads these types; `to_json` writes the documented JSON from them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any

from ffnlab.run.config import RunResult
from ffnlab.study.metrics import row_metrics


class RunStatus(enum.StrEnum):
    """Where a run is: pending -> running -> finished | diverged | failed."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    DIVERGED = "diverged"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        """Ended with a result a comparison counts (a diverged run counts as diverged)."""
        return self in (RunStatus.FINISHED, RunStatus.DIVERGED)

    @property
    def final(self) -> bool:
        """Ended: finished, diverged or failed (a failed run may be started again)."""
        return self.done or self is RunStatus.FAILED


def result_from_dict(d: dict) -> RunResult:
    """A stored result (its fields' kinds checked by the store) as a `RunResult`. The store keeps curves
    and events in tables of their own, and a field added since an older store was written reads as
    empty; ValueError naming the keys `RunResult` does not have (the store was edited or damaged)."""
    names = [f.name for f in fields(RunResult)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"its result has keys a run result does not: {', '.join(unknown)}")
    empty: dict[str, Any] = {"history": {}, "events": [], "behaviour": {}, "learned": {}, "config": {}}
    return RunResult(**{name: d.get(name, empty.get(name)) for name in names})


@dataclass(frozen=True)
class RunRecord:
    """One run as the store holds it (after optuna's FrozenTrial): immutable, read by everything above."""

    id: str  # the hash of `config` (ffnlab.study.plan.run_id)
    config: dict  # the TrainConfig's JSON as stored: the run's identity
    status: RunStatus
    result: RunResult | None  # a finished or diverged run's measurements; None otherwise
    error: str | None  # why a failed run failed
    env: dict  # the machine and libraries that trained it (ffnlab._util.machine.environment)
    sweep: str | None
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None

    @property
    def done(self) -> bool:
        return self.status.done


# the statistics of the ranking metric a row carries (ffnlab.study.stats.compare), in the CSV's order
STAT_FIELDS = (
    "ffn",
    "rank",
    "n_seeds",
    "mean",
    "std",
    "ci_low",
    "ci_high",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "n_pairs",
    "p",
    "p_adj",
    "significant",
    "diverged",
)


@dataclass
class VariantRow:
    """One variant in one cell: the paired statistics of the cell's ranking metric against the baseline,
    the per-seed values they rest on, and every other metric of `METRICS` over the variant's seeds."""

    ffn: str
    rank: int
    n_seeds: int  # finite values the mean rests on
    mean: float | None
    std: float | None
    ci_low: float | None
    ci_high: float | None
    delta: float | None  # mean paired difference to the baseline (variant - baseline)
    delta_ci_low: float | None
    delta_ci_high: float | None
    n_pairs: int
    p: float | None  # paired t-test against the baseline
    p_adj: float | None  # Holm over the cell's non-baseline variants
    significant: bool
    diverged: int  # runs that diverged
    values: dict[int, float] = field(default_factory=dict)  # seed -> ranking metric (the paired seeds)
    test_values: dict[int, float] = field(default_factory=dict)  # seed -> the same metric on the test split
    runs: int = 0  # paired runs that ended (finished or diverged)
    metrics: dict[str, Any] = field(default_factory=dict)  # name -> value, for each metric of METRICS
    tuned: dict[str, Any] = field(default_factory=dict)  # a tuned cell's chosen setting and its val_mean

    def to_json(self) -> dict:
        """The row as compare --json writes it: statistics, per-seed values and metrics side by side."""
        out = {name: getattr(self, name) for name in STAT_FIELDS}
        if self.tuned:
            return {**out, **self.tuned}
        return {**out, "values": self.values, "test_values": self.test_values, "runs": self.runs, **self.metrics}

    @classmethod
    def from_json(cls, d: dict) -> VariantRow:
        """A row read back from `to_json` (protocol.json); JSON turned the seeds into strings."""
        seeds = lambda values: {int(s): x for s, x in values.items()}
        names = {m.name for m in row_metrics()}
        rest = {k: v for k, v in d.items() if k not in STAT_FIELDS}
        if "values" not in rest:  # a tuned row: its chosen setting
            return cls(**{k: d[k] for k in STAT_FIELDS}, tuned=rest)
        return cls(
            **{k: d[k] for k in STAT_FIELDS},
            values=seeds(rest["values"]),
            test_values=seeds(rest["test_values"]),
            runs=rest["runs"],
            metrics={k: v for k, v in rest.items() if k in names},
        )


@dataclass
class Cell:
    """One combination of a study's axis values (or the tuned comparison of a group of them)."""

    axes: dict[str, Any]
    task: str  # what the models learn: lm or cls (ffnlab.core.model.ModelConfig.task)
    metric: str  # the ranking metric's name (ffnlab.study.metrics.ranking_metric), or its test twin
    baseline: str
    metric_direction: str  # 'lower' or 'higher' is better
    alpha: float
    level: float
    variants: list[VariantRow]  # best first
    verdict: str
    missing: dict[str, list[int]] = field(default_factory=dict)  # variant -> seeds that did not finish
    literature: dict | None = None  # rank agreement with the published table (ffnlab.study.published)
    noise_floor: dict | None = None  # the baseline's seed-to-seed spread over its extra seeds
    tuned_axes: list[str] = field(default_factory=list)  # a tuned cell: the axes chosen per variant
    selected_on: str | None = None  # a tuned cell: the metric the settings were chosen by

    def row(self, ffn: str) -> VariantRow:
        return next(r for r in self.variants if r.ffn == ffn)

    def to_json(self) -> dict:
        out: dict[str, Any] = {"axes": self.axes, "metric": self.metric}
        if self.tuned_axes:
            out.update(selected_on=self.selected_on, tuned_axes=self.tuned_axes)
        out.update(
            baseline=self.baseline,
            metric_direction=self.metric_direction,
            alpha=self.alpha,
            level=self.level,
            variants=[r.to_json() for r in self.variants],
            verdict=self.verdict,
        )
        if self.missing:
            out["missing"] = self.missing
        if self.literature is not None:
            out["literature"] = self.literature
        if self.noise_floor is not None:
            out["noise_floor"] = self.noise_floor
        return out

    @classmethod
    def from_json(cls, d: dict) -> Cell:
        """A cell read back from `to_json` (protocol.json)."""
        rows = [VariantRow.from_json(r) for r in d["variants"]]
        plain = {k: d[k] for k in ("axes", "metric", "baseline", "metric_direction", "alpha", "level", "verdict")}
        optional = {k: d[k] for k in ("missing", "literature", "noise_floor", "tuned_axes", "selected_on") if k in d}
        return cls(**plain, **optional, task="cls" if d["metric"].endswith("_acc") else "lm", variants=rows)


@dataclass
class Summary:
    """A whole study summarised: every cell (never merged), the tuned comparison and the scaling fits."""

    store: str
    baseline: str
    seeds: int
    settings: dict  # the run settings and what the comparison held equal (ffnlab.study.summary.settings_of)
    cells: list[Cell]
    across_cells: dict | None = None  # whether each gap changes between cells (two cells or more)
    tuned: list[Cell] = field(default_factory=list)  # with an lr or warmup axis
    scaling: dict | None = None  # with --scale axes

    def to_json(self) -> dict:
        """What `compare --json` prints: the cells, and with a single cell its rows and verdict at the top."""
        out: dict[str, Any] = {
            "store": self.store,
            "baseline": self.baseline,
            "seeds": self.seeds,
            "settings": self.settings,
            "cells": [c.to_json() for c in self.cells],
        }
        if self.across_cells is not None:
            out["across_cells"] = self.across_cells
        if self.scaling is not None:
            out["scaling"] = self.scaling
        if self.tuned:
            out["tuned"] = [c.to_json() for c in self.tuned]
        if len(self.cells) == 1:
            out["variants"] = out["cells"][0]["variants"]
            out["verdict"] = self.cells[0].verdict
        return out

    @classmethod
    def from_json(cls, d: dict) -> Summary:
        """A summary read back from `to_json` (protocol.json)."""
        return cls(
            **{k: d[k] for k in ("store", "baseline", "seeds", "settings")},
            cells=[Cell.from_json(c) for c in d["cells"]],
            across_cells=d.get("across_cells"),
            tuned=[Cell.from_json(c) for c in d.get("tuned", [])],
            scaling=d.get("scaling"),
        )


def csv_fields() -> list[str]:
    """The CSV's columns after the axes and 'metric': the statistics, then each scalar metric."""
    return [*STAT_FIELDS, *(m.name for m in row_metrics() if m.csv)]
