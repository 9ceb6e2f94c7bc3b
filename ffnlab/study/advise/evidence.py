"""What an advice rests on and what it weighed against its pick, as records: one type per kind of evidence
(measured in a cell of a study or in several, published, a pretrained model, the checks of a symptom) and one per
kind of alternative (measured, out of the running, published, any other activation than a checkpoint's). Each
record's `to_json` is its part of `advise --json`; `format_advice` prints them (advice.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ffnlab.study.advise.flow import Quote
from ffnlab.study.metrics import shown_in
from ffnlab.study.published import ModelShape, PublishedTable
from ffnlab.study.records import AcrossCells, StudyScaling, VariantRow

if TYPE_CHECKING:
    from ffnlab.study.advise.from_checkpoint import Checkpoint
    from ffnlab.study.advise.from_deployment import DeploymentEvidence


# ---- evidence ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyFacts:
    """What an advice says of the study it was measured in (the start of its evidence)."""

    store: str
    task: str
    metric: str  # the ranking metric
    higher_is_better: bool
    n_layers: int  # of the study's runs, or of the cell advised on where depth is an axis
    d_model: int  # likewise, where width is an axis
    context: int  # likewise, where context is an axis
    data: str
    tokenizer: str
    match: str  # what the FFNs were matched in
    seeds: int
    baseline: str
    device: str  # where the runs were timed ('?' when unknown)
    init: str  # the FFN init of every variant
    scaling: StudyScaling | None  # the compute multipliers of a scaling study (Summary.scaling); None unfitted
    across_cells: AcrossCells | None  # whether each gap changes between cells (Summary.across_cells)

    def to_json(self) -> dict[str, Any]:
        out = {name: value for name, value in vars(self).items() if name not in ("scaling", "across_cells")}
        return out | {
            "scaling": None if self.scaling is None else self.scaling.to_json(),
            "across_cells": None if self.across_cells is None else self.across_cells.to_json(),
        }


# the statistics of the ranking metric an advice quotes for each measured variant; its metrics are the
# ones METRICS marks for the evidence
EVIDENCE_STATS = ("mean", "ci_low", "ci_high", "n_seeds", "delta", "delta_ci_low", "delta_ci_high", "p_adj",
                  "significant", "diverged", "values")  # fmt: skip


def variant_json(row: VariantRow) -> dict[str, Any]:
    """What an advice's evidence quotes of a measured variant: its statistics and its 'evidence' metrics."""
    metrics = {m.name: row.value(m) for m in shown_in("evidence")}
    return {**{k: getattr(row, k) for k in EVIDENCE_STATS}, **metrics}


@dataclass(frozen=True)
class MeasuredEvidence:
    """One cell of a study: the facts of the study there, the cell's axes and every variant's row; the
    measured deployment weighed beside it, and for a LoRA study the checkpoint's own evidence."""

    facts: StudyFacts
    axes: dict[str, Any]
    variants: dict[str, VariantRow]
    deployment: DeploymentEvidence | None = None
    checkpoint: PretrainedEvidence | None = None
    kind: ClassVar[Literal["measured"]] = "measured"

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, **self.facts.to_json(), "axes": self.axes}
        out["variants"] = {name: variant_json(row) for name, row in self.variants.items()}
        if self.deployment is not None:
            out["deployment"] = self.deployment.to_json()
        fits = self.facts.scaling.fits if self.facts.scaling else None
        if fits is not None:  # in the facts' place: each variant's multiplier and its law
            out["scaling"] = {
                name: {"multiplier": fit.multiplier, "multiplier_ci": fit.multiplier_ci, "E": fit.E, "alpha": fit.alpha}
                for name, fit in fits.variants.items()
            }
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint.to_json()
        return out

    def source_line(self) -> str | None:
        return None


@dataclass(frozen=True)
class MeasuredCellsEvidence:
    """Several cells of a study, each advised on apart: the facts of the study and each cell's evidence."""

    facts: StudyFacts
    cells: list[MeasuredEvidence]
    checkpoint: PretrainedEvidence | None = None  # a LoRA study's checkpoint
    kind: ClassVar[Literal["measured"]] = "measured"

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, **self.facts.to_json(), "cells": [c.to_json() for c in self.cells]}
        return out | ({"checkpoint": self.checkpoint.to_json()} if self.checkpoint is not None else {})

    def source_line(self) -> str | None:
        return None


@dataclass(frozen=True)
class NarrowerModel:
    """The model narrowed to fit a memory budget (the memory-fit rule): the variant and its shape."""

    ffn: str
    shape: ModelShape

    def to_json(self) -> dict[str, Any]:
        shape = self.shape
        return {"ffn": self.ffn, "d_model": shape.d_model, "n_layers": shape.n_layers, "params": shape.params}


@dataclass(frozen=True)
class PublishedEvidence:
    """Published tables, all from one paper, and the narrower model where nothing fitted at the stated size."""

    tables: tuple[PublishedTable, ...]
    fits: NarrowerModel | None = None
    kind: ClassVar[Literal["published"]] = "published"

    def to_json(self) -> dict[str, Any]:
        first = self.tables[0]
        out: dict[str, Any] = {"kind": self.kind, "source": first.source, "arxiv": first.arxiv}
        out["tables"] = [
            {"table": t.table, "metric": t.metric, "setup": t.setup, "values": t.values, "spread": t.spread,
             "paper_names": t.names}
            for t in self.tables
        ]  # fmt: skip
        return out | ({"fits": self.fits.to_json()} if self.fits else {})

    def source_line(self) -> str | None:
        first = self.tables[0]
        return f"source: {first.source}, arXiv:{first.arxiv}, {first.table}"


@dataclass(frozen=True)
class PretrainedEvidence:
    """A pretrained model's activation and where it was read; for inference, the deployment measured beside a
    store."""

    model: Checkpoint
    deployment: DeploymentEvidence | None = None
    kind: ClassVar[Literal["pretrained"]] = "pretrained"

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, **asdict(self.model)}
        return out | ({"deployment": self.deployment.to_json()} if self.deployment is not None else {})

    def source_line(self) -> str | None:
        return f"source: {self.model.source}"


@dataclass(frozen=True)
class ChecksEvidence:
    """A symptom's checks rest on the rule that quotes their source."""

    symptom: str
    source: str
    quotes: tuple[Quote, ...]
    kind: ClassVar[Literal["checks"]] = "checks"

    def to_json(self) -> dict[str, Any]:
        quotes = [asdict(q) for q in self.quotes]
        return {"kind": self.kind, "symptom": self.symptom, "source": self.source, "quotes": quotes}

    def source_line(self) -> str | None:
        return None


Evidence = MeasuredEvidence | MeasuredCellsEvidence | PublishedEvidence | PretrainedEvidence | ChecksEvidence


# ---- alternatives --------------------------------------------------------------------------------------


class AlternativeRecord:
    """What every alternative is: its part of `advise --json` (its fields, by default) and its line of text."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class MeasuredAlternative(AlternativeRecord):
    """A measured variant in the running but not picked: its numbers against the recommendation."""

    ffn: str
    mean: float
    delta_vs_recommendation: float | None  # paired over seeds
    ci: list[float | None]  # of that difference
    p: float | None
    p_adj_vs_best: float | None  # Holm-corrected, against the cell's best (None: it is the best)
    step_time_ratio: float | None  # its step time over the recommendation's
    params: float | None
    summary: str  # the difference and the costs in words

    def line(self) -> str:
        return f"{self.ffn}: {self.summary}"


@dataclass(frozen=True)
class ExcludedAlternative(AlternativeRecord):
    """A measured variant out of the running: diverged, without a value, or over a budget."""

    ffn: str
    excluded: str  # why

    def line(self) -> str:
        return f"{self.ffn}: excluded, {self.excluded}"


@dataclass(frozen=True)
class PublishedAlternative(AlternativeRecord):
    """Another variant of the published table: its numbers, its gap to the pick, and why a budget rules it out
    where one does."""

    ffn: str
    published: float  # at 65,536 steps
    std: float | None  # the reported inter-run spread; None where the paper gives none
    published_524k: float
    delta_vs_recommendation: float
    excluded: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        return out if self.excluded is not None else {k: v for k, v in out.items() if k != "excluded"}

    def line(self) -> str:
        if self.excluded is not None:
            return f"{self.ffn}: excluded, {self.excluded}"
        std = f" (std {self.std:.3f})" if self.std is not None else ""
        return (
            f"{self.ffn}: {self.published:.3f}{std} at 65,536 steps, "
            f"{self.delta_vs_recommendation:+.3f} vs the recommendation"
        )


@dataclass(frozen=True)
class RejectedAlternative(AlternativeRecord):
    """What the advice rules out whatever the numbers, and why: another activation than a checkpoint's."""

    ffn: str  # 'any other'
    why_not: str

    def line(self) -> str:
        return f"{self.ffn}: {self.why_not}"


Alternative = MeasuredAlternative | ExcludedAlternative | PublishedAlternative | RejectedAlternative
