"""What the registries hold, as rows: every activation and FFN variant (`ffnlab list`), and how a per-layer
schedule is sized (`ffnlab list --schedule`). `--json` is `asdict` of these rows."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

from ffnlab.core.activations import ACTIVATIONS, aliases
from ffnlab.core.ffn import FFNS, build_ffn, ffn_flops_per_token, ffn_param_count, ffn_width, get_ffn_spec, layer_sizes
from ffnlab.core.memory import build_on_meta

# what `ffnlab list` prints below its tables: the FFN names that are not entries of the registry
NAME_FORMS = """\
mix:ACT1+ACT2 mixes two dense FFNs at half width each, e.g. mix:gelu+silu
switch_x:ACT1+ACT2+... mixes 2+ parameter-free activations per token by a learned softmax gate on the
  hidden pre-activation, e.g. switch_x:gelu+silu+relu; the gate's parameters count in the params match
a per-layer schedule names each layer's FFN as VARIANT*LAYERS joined by '+', first layer first, the counts \
adding up to n_layers: gelu*2+swiglu*2 (--ffn, --variants; sizes: ffnlab list --schedule gelu*2+swiglu*2)"""
# below the FFN table: what its params leave out (ffnlab.core.ffn.glu_norm_param_count)
GLU_NORM_NOTE = (
    "params leave out --glu-norm's norms around a gated FFN's gate, as the match does: 2 weights per channel "
    "for layernorm, 1 for rmsnorm, over d_model (pre), d_ff (post) or both"
)


@dataclass(frozen=True)
class ActivationRow:
    """One activation of the registry."""

    name: str
    kind: Literal["activation"] = field(default="activation", init=False)
    gated: bool = field(default=False, init=False)  # beside the FFN rows' column of the same name
    aliases: list[str] = field(default_factory=list)  # names that compute the same function (Hugging Face's)
    same_as: str | None = None  # the canonical entry this name is an alias of
    formula: str = ""
    paper: str = ""
    flops_per_element: int = 0
    learnable: bool = False
    family: str = ""
    experimental: bool = False  # no paper defines this exact function: this project's reading of one
    scope: str = "element"  # what an output reads besides its own input: "channel" (its position), "batch"


@dataclass(frozen=True)
class FFNRow:
    """One FFN variant of the registry, sized at `d_model` with its width matched to the dense 4x FFN."""

    name: str
    kind: Literal["ffn"] = field(default="ffn", init=False)
    gated: bool = False
    aliases: list[str] = field(default_factory=list)  # a dense FFN is named after its activation, aliases too
    formula: str = ""
    paper: str = ""
    d_model: int = 0
    d_ff: int = 0
    params: int = 0
    flops_per_token: int = 0


def list_rows(d_model: int = 512) -> list[ActivationRow | FFNRow]:
    """One row per activation and per FFN variant, with params of the FFN at `d_model` (counted on
    the meta device: any width is sized without allocating it)."""
    rows: list[ActivationRow | FFNRow] = [
        ActivationRow(
            name=name,
            aliases=aliases(name),
            same_as=spec.same_as,
            formula=spec.formula,
            paper=spec.paper,
            flops_per_element=spec.flops,
            learnable=spec.learnable,
            family=spec.family,
            experimental=spec.experimental,
            scope=spec.scope,
        )
        for name, spec in ACTIVATIONS.items()
    ]
    for name, spec in FFNS.items():
        d_ff, bias = ffn_width(spec, d_model)
        ffn = build_on_meta(functools.partial(build_ffn, name, d_model, init=None), "use a smaller --d-model")
        rows.append(
            FFNRow(
                name=name,
                gated=spec.gated,
                aliases=aliases(name) if spec.kind == "dense" else [],
                formula=spec.formula,
                paper=spec.paper,
                d_model=d_model,
                d_ff=d_ff,
                params=sum(p.numel() for p in ffn.parameters()),
                flops_per_token=ffn_flops_per_token(spec, d_model, d_ff, bias),
            )
        )
    return rows


def format_list(rows: list[ActivationRow | FFNRow], d_model: int) -> str:
    """The activations and FFN variants as two tables, then the FFN names that are not entries."""
    lines = [f"{'activation':<18} {'learnable':<9} {'experimental':<12} formula"]
    for r in rows:
        if isinstance(r, ActivationRow):
            alias = f"  (= {r.same_as}, Hugging Face name)" if r.same_as else ""
            reads = f"  (reads the {r.scope})" if r.scope != "element" else ""
            lines.append(
                f"{r.name:<18} {'yes' if r.learnable else 'no':<9} {'yes' if r.experimental else 'no':<12} "
                f"{r.formula}{alias}{reads}"
            )
    lines.append("(experimental: no paper defines that exact function; --json's paper says whose reading it is)")
    header = f"{'ffn':<14} {'gated':<6} {'d_ff':>6} {'params':>10}  formula"
    lines += ["", f"{header}   (d_model={d_model}, matched to dense 4x params)"]
    for r in rows:
        if isinstance(r, FFNRow):
            lines.append(f"{r.name:<14} {'yes' if r.gated else 'no':<6} {r.d_ff:>6} {r.params:>10,}  {r.formula}")
    return "\n".join([*lines, GLU_NORM_NOTE, "", NAME_FORMS])


@dataclass(frozen=True)
class LayerSize:
    """One layer's FFN in a schedule, as the Transformer builds it."""

    layer: int  # from 1, the first layer after the embeddings
    variant: str
    d_ff: int
    params: int
    flops_per_token: int


@dataclass(frozen=True)
class ScheduleSizes:
    """A per-layer schedule sized layer by layer, and its FFN parameters against as many dense 4x FFNs."""

    schedule: str
    formula: str
    d_model: int
    n_layers: int
    layers: list[LayerSize]
    params: int
    flops_per_token: int
    dense_params: int  # n_layers dense 4x FFNs with bias
    vs_dense: float  # params / dense_params - 1


def schedule_sizes(schedule: str, d_model: int = 512, n_layers: int | None = None) -> ScheduleSizes:
    """How a per-layer schedule is sized: each layer's variant, d_ff, params and FLOPs per token,
    and its FFN parameters against n_layers dense 4x FFNs. n_layers=None: as many as the schedule
    names (1 for a plain variant)."""
    spec = get_ffn_spec(schedule)
    n_layers = n_layers or sum(n for _, n in spec.runs) or 1
    layers = [LayerSize(i + 1, **row) for i, row in enumerate(layer_sizes(spec.name, n_layers, d_model))]
    params = sum(layer.params for layer in layers)
    dense = n_layers * ffn_param_count("dense", d_model, 4 * d_model, bias=True)
    flops = sum(layer.flops_per_token for layer in layers)
    return ScheduleSizes(spec.name, spec.formula, d_model, n_layers, layers, params, flops, dense, params / dense - 1)


def format_schedule(sizes: ScheduleSizes) -> str:
    """A schedule's sizes as a table, a row per layer, then its total against the dense 4x FFNs."""
    s = sizes
    lines = [
        f"schedule {s.schedule}: {s.formula} (d_model={s.d_model}, each layer matched to the dense 4x FFN)",
        f"{'layer':<6} {'ffn':<14} {'d_ff':>6} {'params':>12} {'FLOPs/token':>12}",
        *(f"{r.layer:<6} {r.variant:<14} {r.d_ff:>6} {r.params:>12,} {r.flops_per_token:>12,}" for r in s.layers),
        f"{'total':<6} {'':<14} {'':>6} {s.params:>12,} {s.flops_per_token:>12,}",
        f"{'dense 4x, ' + str(s.n_layers) + ' layers':<28} {s.dense_params:>12,}  ({s.vs_dense:+.2%})",
    ]
    return "\n".join(lines)
