"""Typed records of the study layer: what the store hands back and what a summary is made of.

    RunRecord      one stored run: its config, status and result (`Store.get`, `Store.runs`)
    VariantRow     one variant in one cell: the paired statistics of the ranking metric and every metric
    Cell           one combination of a study's axis values: its rows, best first, and its verdict
    LayerGrads     a cell's FFN gradient norms by depth and the claim tested on them (`DepthClaim`)
    AcrossCells    whether each variant's gap to the baseline changes between the cells
    Aggregate      a GLUE-style average over the datasets of a data axis, per variant, paired by seed
    StudyScaling   a scaling study's loss-vs-compute fits (`ffnlab.study.scaling.ScalingFits`), or why none
    StudySettings  the run settings a reader needs, and what the comparison held equal (`Controls`)
    Summary        a whole study: its cells, and the comparisons across them

Everything above the store (the summary, the terminal table, `compare --json` and `--csv`, the report
and `advise`) reads these types; `to_json` writes the documented JSON from them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ffnlab.run.result import RunResult
from ffnlab.study.metrics import Metric, ranked_task, row_metrics
from ffnlab.study.published import RankAgreement
from ffnlab.study.scaling import ScalingFits
from ffnlab.study.stats import Direction, GapTest, MeanCI, PairedDiff, SeedNoise, VariantStats


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


@dataclass(frozen=True)
class RunRecord:
    """One run as the store holds it (after optuna's FrozenTrial): immutable, read by everything above."""

    id: str  # the hash of `config` (ffnlab.study.plan.run_id)
    config: dict[str, Any]  # the TrainConfig's JSON as stored: the run's identity
    status: RunStatus
    result: RunResult | None  # a finished or diverged run's measurements; None otherwise
    error: str | None  # why a failed run failed
    env: dict[str, Any]  # the machine and libraries that trained it (ffnlab._util.machine.environment)
    sweep: str | None
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None

    @property
    def done(self) -> bool:
        return self.status.done


# the statistics of the ranking metric a row carries (ffnlab.study.stats.compare), in the CSV's order
STAT_FIELDS = tuple(f.name for f in fields(VariantStats))


@dataclass
class VariantRow(VariantStats):
    """One variant in one cell: the paired statistics of the cell's ranking metric against the baseline
    (`VariantStats`, a row of `ffnlab.study.stats.compare`), the per-seed values they rest on, and every
    other metric of `METRICS` over the variant's seeds."""

    values: dict[int, float] = field(default_factory=dict)  # seed -> ranking metric (the paired seeds)
    test_values: dict[int, float] = field(default_factory=dict)  # seed -> the same metric on the test split
    runs: int = 0  # paired runs that ended (finished or diverged)
    metrics: dict[str, Any] = field(default_factory=dict)  # name -> value, for each metric of METRICS
    tuned: dict[str, Any] = field(default_factory=dict)  # a tuned cell's chosen setting and its val_mean

    @classmethod
    def of(
        cls,
        stats: VariantStats,
        values: dict[int, float] | None = None,
        test_values: dict[int, float] | None = None,
        runs: int = 0,
        metrics: dict[str, Any] | None = None,
        tuned: dict[str, Any] | None = None,
    ) -> VariantRow:
        """A row from the statistics `compare` gave and the rest of its fields."""
        return cls(
            **asdict(stats),
            values=values or {},
            test_values=test_values or {},
            runs=runs,
            metrics=metrics or {},
            tuned=tuned or {},
        )

    def value(self, m: Metric) -> Any:
        """The row's value of the metric table's entry `m` (None where its task does not measure it)."""
        return self.metrics.get(m.name)

    def to_json(self) -> dict[str, Any]:
        """The row as compare --json writes it: statistics, per-seed values and metrics side by side."""
        out = {name: getattr(self, name) for name in STAT_FIELDS}
        if self.tuned:
            return {**out, **self.tuned}
        return {**out, "values": self.values, "test_values": self.test_values, "runs": self.runs, **self.metrics}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VariantRow:
        """A row read back from `to_json` (protocol.json); JSON turned the seeds into strings."""
        stats = VariantStats(**{k: d[k] for k in STAT_FIELDS})
        rest = {k: v for k, v in d.items() if k not in STAT_FIELDS}
        if "values" not in rest:  # a tuned row: its chosen setting
            return cls.of(stats, tuned=rest)
        names = {m.name for m in row_metrics()}
        return cls.of(
            stats,
            values=seed_keys(rest["values"]),
            test_values=seed_keys(rest["test_values"]),
            runs=rest["runs"],
            metrics={k: v for k, v in rest.items() if k in names},
        )


def seed_keys(values: dict[str, float]) -> dict[int, float]:
    """Per-seed values read back from JSON, which writes their seeds as strings."""
    return {int(s): x for s, x in values.items()}


@dataclass
class Cell:
    """One combination of a study's axis values (or the tuned comparison of a group of them)."""

    axes: dict[str, Any]
    task: str  # what the models learn: lm or cls (ffnlab.core.model.ModelConfig.task)
    metric: str  # the ranking metric's name (ffnlab.study.metrics.ranking_metric), or its test twin
    baseline: str
    metric_direction: Direction
    alpha: float
    level: float
    variants: list[VariantRow]  # best first
    verdict: str
    missing: dict[str, list[int]] = field(default_factory=dict)  # variant -> seeds that did not finish
    literature: RankAgreement | None = None  # rank agreement with the published table (ffnlab.study.published)
    noise_floor: SeedNoise | None = None  # the baseline's seed-to-seed spread over its extra seeds
    tuned_axes: list[str] = field(default_factory=list)  # a tuned cell: the axes chosen per variant
    selected_on: str | None = None  # a tuned cell: the metric the settings were chosen by
    # the FFN gradient norms by depth and the claim tested on them, or why there are none; None: not computed
    # (a tuned cell, or a summary read from a file that predates it)
    depth: LayerGrads | str | None = None

    def row(self, ffn: str) -> VariantRow:
        return next(r for r in self.variants if r.ffn == ffn)

    def to_json(self) -> dict[str, Any]:
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
            out["literature"] = self.literature.to_json()
        if self.noise_floor is not None:
            out["noise_floor"] = self.noise_floor.to_json()
        if self.depth is not None:
            out["depth"] = {"note": self.depth} if isinstance(self.depth, str) else self.depth.to_json()
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Cell:
        """A cell read back from `to_json` (protocol.json)."""
        return cls(
            axes=d["axes"],
            task=ranked_task(d["metric"]),
            metric=d["metric"],
            baseline=d["baseline"],
            metric_direction=d["metric_direction"],
            alpha=d["alpha"],
            level=d["level"],
            variants=[VariantRow.from_json(r) for r in d["variants"]],
            verdict=d["verdict"],
            missing=d.get("missing", {}),
            literature=RankAgreement.from_json(d["literature"]) if "literature" in d else None,
            noise_floor=SeedNoise(**d["noise_floor"]) if "noise_floor" in d else None,
            tuned_axes=d.get("tuned_axes", []),
            selected_on=d.get("selected_on"),
            depth=LayerGrads.from_json(d["depth"]) if "depth" in d else None,
        )


# ---- FFN gradients by depth: the figure's numbers and the claim that GELU gives the bottom layers larger updates ----


def exp_or_none(x: float | None) -> float | None:
    return None if x is None else math.exp(x)


@dataclass(frozen=True)
class VariantDepth:
    """One variant's FFN gradient norms by depth over seeds, as the figure draws them, and its bottom/top ratio."""

    seeds: list[int]  # the runs drawn
    layers: list[int]  # 0 = bottom
    mean: list[float]  # per layer, the mean over seeds of each run's median norm
    low: list[float]  # the lowest seed's
    high: list[float]  # the highest seed's
    ratios: dict[int, float]  # seed -> its bottom/top ratio
    ratio: MeanCI  # their mean over seeds and its t-interval

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratios": {str(s): r for s, r in self.ratios.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VariantDepth:
        return cls(**{**d, "ratios": seed_keys(d["ratios"]), "ratio": MeanCI(**d["ratio"])})


@dataclass(frozen=True)
class RatioGap:
    """GELU's bottom/top ratio against another variant's, paired over seeds on the log scale (`depth_claim`)."""

    other: str
    log_gap: PairedDiff  # log(GELU's ratio) - log(the other's), over the seeds both have
    p_adj: float | None  # Holm over the other variants
    verdict: str  # HOLDS, FAILS or NOT_SEPARATED for this pair

    def factor(self) -> tuple[float | None, float | None, float | None]:
        """(GELU's ratio / the other's, and its interval): the log gap and its interval exponentiated."""
        g = self.log_gap
        return exp_or_none(g.delta), exp_or_none(g.ci_low), exp_or_none(g.ci_high)

    def to_json(self) -> dict[str, Any]:
        """The pair's JSON, with GELU's ratio over the other's and its interval (`factor`) beside the log gap."""
        factor, low, high = self.factor()
        return {**asdict(self), "factor": factor, "factor_ci_low": low, "factor_ci_high": high}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RatioGap:
        return cls(d["other"], PairedDiff(**d["log_gap"]), d["p_adj"], d["verdict"])


@dataclass(frozen=True)
class DepthClaim:
    """The claim that GELU gives the bottom layers relatively larger updates, tested on per-seed bottom/top ratios."""

    variant: str  # whose claim: CLAIM_VARIANT
    gaps: list[RatioGap]  # it against each other variant
    verdict: str | None  # HOLDS, FAILS or NOT_SEPARATED; None: no test (`reason`)
    reason: str  # why there is no verdict, '' where there is one
    measured: str  # the claims row's measured value: 'higher', 'lower' or 'not separated'; '-' without a test

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gaps": [g.to_json() for g in self.gaps]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DepthClaim:
        return cls(d["variant"], [RatioGap.from_json(g) for g in d["gaps"]], d["verdict"], d["reason"], d["measured"])


@dataclass(frozen=True)
class LayerGrads:
    """A cell's FFN gradient norms by depth per variant (`layer_grads`) and the claim tested on them."""

    variants: dict[str, VariantDepth]
    claim: DepthClaim
    warmup_steps: list[int]  # the runs' warm-up steps: the steps before these are left out
    steps: tuple[int, int]  # the fewest and the most logged steps after warm-up a run's numbers rest on
    left_out: list[str]  # 'relu seed 2': finished runs that logged no per-layer norm after warm-up

    def to_json(self) -> dict[str, Any]:
        """compare --json's `depth` of a cell."""
        return {
            "variants": {v: d.to_json() for v, d in self.variants.items()},
            "claim": self.claim.to_json(),
            "warmup_steps": self.warmup_steps,
            "steps": list(self.steps),
            "left_out": self.left_out,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LayerGrads | str:
        """A cell's `depth` read back from `to_json`, or the note saying why there are no numbers."""
        if "note" in d:
            return str(d["note"])
        variants = {v: VariantDepth.from_json(x) for v, x in d["variants"].items()}
        low, high = d["steps"]
        return cls(variants, DepthClaim.from_json(d["claim"]), d["warmup_steps"], (low, high), d["left_out"])


@dataclass(frozen=True)
class GapAcrossCells(GapTest):
    """One variant's gap to the baseline across the cells: the F test of its per-seed gaps, its mean gap in
    each cell, and the test Holm-corrected over the variants."""

    gaps: list[float | None]  # the variant's delta in each cell, in the cells' order
    p_adj: float | None
    differs: bool  # p_adj < alpha

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GapAcrossCells:
        return cls(**{**d, "df": tuple(d["df"]) if d["df"] is not None else None})


@dataclass(frozen=True)
class AcrossCells:
    """Whether each variant's gap to the baseline changes between the cells of a study (ffnlab.study.summary.
    across_cells), and the best mean of each cell."""

    cells: list[str]  # each cell's label, 'depth=2, placement=pre'
    variants: dict[str, GapAcrossCells]  # every variant but the baseline
    best: list[list[str]]  # who has the best mean of each cell: one variant, several on an exact tie, none where
    # no variant has a mean
    alpha: float
    sentences: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AcrossCells:
        variants = {v: GapAcrossCells.from_json(g) for v, g in d["variants"].items()}
        # a protocol.json written before ties were named holds one name (or None) per cell
        best = [[b] if isinstance(b, str) else b or [] for b in d["best"]]
        return cls(cells=d["cells"], variants=variants, best=best, alpha=d["alpha"], sentences=d["sentences"])


@dataclass(frozen=True)
class Aggregate:
    """A GLUE-style score: each variant's ranking metric averaged over the datasets of a study's data axis
    (ffnlab.study.summary.aggregate), per seed, then its interval over the seeds and its difference to the
    baseline paired by seed; beside it each dataset's own mean, GLUE's per-task columns. For GLUE's own tasks
    (ffnlab.study.summary.glue_aggregate) the GLUE score instead, each task scored by its official metrics on
    GLUE's dev set, and `columns` naming those metrics."""

    axes: dict[str, Any]  # the study's other axes, at these values ({} where data is the only axis)
    datasets: list[str]  # the data axis's values, in the study's order
    metric: str  # the cells' ranking metric, averaged
    baseline: str
    metric_direction: Direction
    alpha: float
    level: float
    scores: dict[str, list[float | None]]  # variant -> its mean over seeds on each dataset, as its cell shows it
    values: dict[str, dict[int, float]]  # variant -> seed -> its mean over the datasets: what the statistics rest on
    variants: list[VariantStats]  # the average: `ffnlab.study.stats.compare` of `values`, best first
    left_out: dict[str, list[int]]  # variant -> seeds finished on some dataset but not on all, so not averaged
    verdict: str
    columns: list[str] = field(default_factory=list)  # the headings of `scores` where they are not the datasets:
    # GLUE's score, each task's official metrics ('CoLA Matthews', 'STS-B Pearson', ...)
    note: str = ""  # how the score was taken, where it is not the datasets' average (GLUE's protocol)

    def row(self, ffn: str) -> VariantStats:
        return next(r for r in self.variants if r.ffn == ffn)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Aggregate:
        """An aggregate read back from `to_json` (protocol.json); JSON turned the seeds into strings."""
        return cls(
            **{
                **d,
                "values": {v: seed_keys(x) for v, x in d["values"].items()},
                "variants": [VariantStats(**r) for r in d["variants"]],
                "left_out": d.get("left_out", {}),
            }
        )


@dataclass(frozen=True)
class StudyScaling:
    """The loss-vs-compute fits of a study with compute axes (`Study.scale`), or, while fewer than 3 computes
    have finished, why there are none yet."""

    scale: dict[str, list[Any]]  # the compute axes and their values
    metric: str  # the ranking metric fitted
    fits: ScalingFits | None  # None: not fitted yet (`error` says why)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.fits is None:
            return {"error": self.error, "scale": self.scale}
        return {"scale": self.scale, "metric": self.metric, **self.fits.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StudyScaling:
        if "error" in d:
            return cls(scale=d["scale"], metric="", fits=None, error=d["error"])
        return cls(scale=d["scale"], metric=d["metric"], fits=ScalingFits.from_json(d))


@dataclass(frozen=True)
class Controls:
    """What a comparison held equal and how, and what it did not and why, each as a [what, how] pair."""

    held_equal: list[list[str]] = field(default_factory=list)
    not_equal: list[list[str]] = field(default_factory=list)

    def __add__(self, other: Controls) -> Controls:
        return Controls(self.held_equal + other.held_equal, self.not_equal + other.not_equal)


@dataclass(frozen=True)
class StudySettings:
    """The run settings a reader needs to judge a comparison (ffnlab.study.summary.settings_of), with what it
    held equal and what not; `to_json` is compare --json's `settings`."""

    data: str
    task: str
    tokenizer: str | None  # None for task image: a ViT reads pixels, not text
    model: dict[str, Any]  # n_layers, n_heads, d_model, context, norm, placement, pos, dropout; task image:
    # image_size (None: the data's own), patch_size and pool instead of context, which the patches set; a Hugging
    # Face config: its n_layers, n_heads, d_model and the context trained at, the rest being the config's
    match: str  # what the FFN widths match: params, flops or none
    init: str
    attn_act: str | None  # activations on Q, K, V (ModelConfig.attn_act)
    batch_size: int
    budget: dict[str, float]  # one of max_seconds, max_tokens, max_steps
    tokens_per_run: int | None  # None under a wall-clock budget, and for task image (patches per image follow the data)
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float
    beta2: float
    grad_clip: float
    precision: str
    seeds: int
    variants: list[str]
    axes: dict[str, list[Any]]
    per_variant: dict[str, dict[str, Any]]
    pretrained: dict[str, str | None] | None  # {"from": folder, "digest": ...} when fine-tuning
    held_equal: list[list[str]]  # [what, how]
    not_equal: list[list[str]]  # [what, why]
    pair: list[str] | None = None  # a sentence-pair dataset's two text columns (ffnlab.data.pairs), else None
    nproc: int = 1  # processes each run trained in (DDP); its global batch is batch_size x nproc x grad_accum
    grad_accum: int = 1
    trained: str | None = None  # a fine-tune's parameters that trained, in words (ffnlab.tools.lora.trained_text):
    # every one, or LoRA's adapters and a new head with the rest frozen; None for a model trained from scratch

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StudySettings:
        return cls(**d)


@dataclass
class Summary:
    """A whole study summarised: every cell (never merged), the tuned comparison and the scaling fits."""

    store: str
    baseline: str
    seeds: int
    settings: StudySettings  # the run settings and what the comparison held equal
    cells: list[Cell]
    across_cells: AcrossCells | None = None  # whether each gap changes between cells (two cells or more)
    aggregate: list[Aggregate] = field(default_factory=list)  # with a data axis: the average over its datasets
    tuned: list[Cell] = field(default_factory=list)  # with an lr or warmup axis
    scaling: StudyScaling | None = None  # with --scale axes

    def to_json(self) -> dict[str, Any]:
        """What `compare --json` prints: the cells, and with a single cell its rows and verdict at the top."""
        out: dict[str, Any] = {
            "store": self.store,
            "baseline": self.baseline,
            "seeds": self.seeds,
            "settings": self.settings.to_json(),
            "cells": [c.to_json() for c in self.cells],
        }
        if self.across_cells is not None:
            out["across_cells"] = self.across_cells.to_json()
        if self.aggregate:
            out["aggregate"] = [a.to_json() for a in self.aggregate]
        if self.scaling is not None:
            out["scaling"] = self.scaling.to_json()
        if self.tuned:
            out["tuned"] = [c.to_json() for c in self.tuned]
        if len(self.cells) == 1:
            out["variants"] = out["cells"][0]["variants"]
            out["verdict"] = self.cells[0].verdict
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Summary:
        """A summary read back from `to_json` (protocol.json)."""
        return cls(
            store=d["store"],
            baseline=d["baseline"],
            seeds=d["seeds"],
            settings=StudySettings.from_json(d["settings"]),
            cells=[Cell.from_json(c) for c in d["cells"]],
            across_cells=AcrossCells.from_json(d["across_cells"]) if "across_cells" in d else None,
            aggregate=[Aggregate.from_json(a) for a in d.get("aggregate", [])],
            tuned=[Cell.from_json(c) for c in d.get("tuned", [])],
            scaling=StudyScaling.from_json(d["scaling"]) if "scaling" in d else None,
        )


def csv_fields() -> list[str]:
    """The CSV's columns after the axes and 'metric': the statistics, then each scalar metric."""
    return [*STAT_FIELDS, *(m.name for m in row_metrics() if m.csv)]
