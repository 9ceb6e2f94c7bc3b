"""Published results as data, each with its source: what `ffnlab advise` falls back on when the
user has measured nothing, and which activation well-known pretrained models use.

Numbers are copied from the papers' tables, not recomputed; the table and column are named so a
reader can check them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PublishedTable:
    """One column of a paper's table: a metric per FFN variant (ffnlab names)."""

    source: str
    arxiv: str
    table: str
    metric: str
    lower_is_better: bool
    setup: str
    values: dict[str, float]
    spread: dict[str, float] = field(default_factory=dict)  # inter-run std where the paper gives one
    names: dict[str, str] = field(default_factory=dict)  # ffnlab name -> the paper's name


SHAZEER = "Shazeer 2020, GLU Variants Improve Transformer"
SHAZEER_NAMES = {
    "relu": "FFN_ReLU",
    "gelu": "FFN_GELU",
    "silu": "FFN_Swish",
    "glu": "FFN_GLU",
    "bilinear": "FFN_Bilinear",
    "geglu": "FFN_GEGLU",
    "swiglu": "FFN_SwiGLU",
    "reglu": "FFN_ReGLU",
}
SHAZEER_SETUP = (
    "T5-base encoder-decoder (12+12 layers, d_model 768, d_ff 3072 dense / 2048 gated so that "
    "parameters and compute match), span-corruption pre-training on C4, no dropout, Adafactor"
)


# NOTE: 'log-perplexity' is the per-token training objective on held-out C4, in nats. The 65,536-step
# column carries the inter-run standard deviation in parentheses; the 524,288-step column has none.
def shazeer_column(steps: str, values: dict[str, float], spread: dict[str, float] | None = None) -> PublishedTable:
    """One column of Shazeer 2020's Table 1 (held-out log-perplexity after `steps` training steps)."""
    return PublishedTable(
        source=SHAZEER,
        arxiv="2002.05202",
        table=f"Table 1, column '{steps} steps'",
        metric="held-out log-perplexity (nats per token)",
        lower_is_better=True,
        setup=SHAZEER_SETUP + f", {steps} training steps",
        values=values,
        spread=spread or {},
        names=SHAZEER_NAMES,
    )


SHAZEER_2020_65K = shazeer_column(
    "65,536",
    {"relu": 1.997, "gelu": 1.983, "silu": 1.994, "glu": 1.982, "bilinear": 1.960, "geglu": 1.942, "swiglu": 1.944, "reglu": 1.953},
    spread={"relu": 0.005, "gelu": 0.005, "silu": 0.003, "glu": 0.006, "bilinear": 0.005, "geglu": 0.004, "swiglu": 0.010, "reglu": 0.003},
)  # fmt: skip
SHAZEER_2020_524K = shazeer_column(
    "524,288",
    {"relu": 1.677, "gelu": 1.679, "silu": 1.683, "glu": 1.663, "bilinear": 1.648, "geglu": 1.633, "swiglu": 1.636, "reglu": 1.645},
)  # fmt: skip

TABLES = (SHAZEER_2020_65K, SHAZEER_2020_524K)


@dataclass(frozen=True)
class Disagreement:
    """A pair of variants a measured ranking orders differently from a published one: both values per side."""

    pair: tuple[str, str]
    measured: tuple[float, float]
    published: tuple[float, float]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Disagreement:
        (a, b), (measured_a, measured_b), (published_a, published_b) = d["pair"], d["measured"], d["published"]
        return cls((a, b), (measured_a, measured_b), (published_a, published_b))


@dataclass(frozen=True)
class RankAgreement:
    """How a measured ranking agrees with a published table (`rank_agreement`), over the variants both have."""

    source: str  # the paper, its arXiv id and table
    table: str
    variants: list[str]  # the shared variants, in the measured order given
    n: int
    measured: dict[str, float]
    published: dict[str, float]
    tau: float | None  # Kendall's tau-a; None below 2 shared variants
    disagree: list[Disagreement]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankAgreement:
        return cls(**{**d, "disagree": [Disagreement.from_json(p) for p in d["disagree"]]})


def rank_agreement(
    measured: Mapping[str, float | None], lower_is_better: bool = True, table: PublishedTable = SHAZEER_2020_65K
) -> RankAgreement:
    """How a measured ranking agrees with a published one, over the variants both have (a None measurement
    is left out).

        tau = (concordant - discordant) / (n (n - 1) / 2)      Kendall's tau-a over all pairs

    A pair is concordant when both order it the same way; a tie on either side counts as neither; each
    discordant pair is a `Disagreement` with its two values per side.
    """
    sign = 1.0 if lower_is_better else -1.0
    ours = {v: x for v, x in measured.items() if v in table.values and x is not None}
    shared = list(ours)
    concordant, disagree = 0, []
    pairs = [(a, b) for i, a in enumerate(shared) for b in shared[i + 1 :]]
    for a, b in pairs:
        order = sign * (ours[a] - ours[b]) * (table.values[a] - table.values[b])
        if order > 0:
            concordant += 1
        elif order < 0:
            disagree.append(Disagreement((a, b), (ours[a], ours[b]), (table.values[a], table.values[b])))
    return RankAgreement(
        source=f"{table.source} (arXiv:{table.arxiv}), {table.table}",
        table=table.table,
        variants=shared,
        n=len(shared),
        measured=ours,
        published={v: table.values[v] for v in shared},
        tau=(concordant - len(disagree)) / len(pairs) if pairs else None,
        disagree=disagree,
    )


# ---- pretrained models --------------------------------------------------------------------------


FAMILIES_CSV = Path(__file__).with_name("model_families.csv")


@dataclass(frozen=True)
class ModelFamily:
    """The FFN a pretrained model family was trained with, as its Hugging Face config states it."""

    family: str  # name prefix, lowercase, matched against the model id's last part
    model_type: str
    field: str  # the config.json field that names the activation
    hf_act: str  # its value
    ffn: str  # the ffnlab variant that computes the same FFN
    example: str  # a model id of the family


# One row per family in model_families.csv (family prefix, model_type, config field, its value, ffnlab
# variant, example id). Longest prefix wins, so 'flan-t5' and 't5-v1_1' are matched before 't5'.
MODEL_FAMILIES: tuple[ModelFamily, ...] = tuple(
    ModelFamily(**row) for row in csv.DictReader(io.StringIO(FAMILIES_CSV.read_text(encoding="utf-8")))
)


# ---- published model shapes and FFNs at scale -----------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """A published model's size and shape: what `ffnlab advise --model-size` estimates memory and FLOPs with."""

    name: str
    params: float
    n_layers: int
    d_model: int
    n_heads: int
    source: str


GPT3 = "Brown et al. 2020, Language Models are Few-Shot Learners (arXiv:2005.14165), Table 2.1"
MODEL_SHAPES: tuple[ModelShape, ...] = tuple(
    ModelShape(name, params, n_layers, d_model, n_heads, GPT3)
    for name, params, n_layers, d_model, n_heads in (
        ("GPT-3 Small", 125e6, 12, 768, 12),
        ("GPT-3 Medium", 350e6, 24, 1024, 16),
        ("GPT-3 Large", 760e6, 24, 1536, 16),
        ("GPT-3 XL", 1.3e9, 24, 2048, 24),
        ("GPT-3 2.7B", 2.7e9, 32, 2560, 32),
        ("GPT-3 6.7B", 6.7e9, 32, 4096, 32),
        ("GPT-3 13B", 13e9, 40, 5140, 40),  # NOTE: 5140 as printed in the paper's table
        ("GPT-3 175B", 175e9, 96, 12288, 96),
    )
)


@dataclass(frozen=True)
class GatedAtScale:
    """A published large model family and the gated FFN it was trained with."""

    model: str
    params: str
    ffn: str  # ffnlab name
    source: str


GATED_AT_SCALE: tuple[GatedAtScale, ...] = (
    GatedAtScale("PaLM", "8B-540B", "swiglu", "Chowdhery et al. 2022, PaLM (arXiv:2204.02311), Section 2"),
    GatedAtScale("LLaMA", "7B-65B", "swiglu", "Touvron et al. 2023, LLaMA (arXiv:2302.13971), Section 2.2"),
    GatedAtScale("Gemma", "2B-7B", "geglu_tanh", "Gemma Team 2024, Gemma (arXiv:2403.08295), Section 2"),
)
