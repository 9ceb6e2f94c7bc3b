"""Feed-forward variants: one dense class, one gated class, one table of named variants.

    dense    y = W_out act(W_in x + b_in) + b_out               (Vaswani et al. 2017)
    gated    y = W_down (act(W_gate x) * W_up x)                (Shazeer 2020, GLU Variants)
    mix:a+b  y = (dense_a(x) + dense_b(x)) / 2, each at half width
    switch_x:a+b+...  y = W_out sum_i g_i(h) a_i(h) + b_out, h = W_in x + b_in, g(h) = softmax(W_g h + b_g)
    a*2+b*2  a per-layer schedule: the first 2 layers' FFNs are a, the next 2 b (`layer_variants`)

Every registered activation is also a dense FFN of the same name (`gelu`, `silu`, ...). Gated
variants name their activation in `GATED`. Sizes come from `ffn_hidden_dim` (the conventional
LLaMA-style rule) or, with `match="params"|"flops"`, from `matched_hidden_dim`, which equalises
parameters or FLOPs with the dense 4x FFN so comparisons are fair. A gated FFN may put a norm
around its gate (`glu_norm`, see `GatedFFN`); sizing leaves those few weights out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ffnlab._util.names import by_name, closest, normalize
from ffnlab._util.text import shorten
from ffnlab.core.activations import ACTIVATIONS, ActLike, InputMixture, activation_name, get_activation
from ffnlab.core.kernels import FUSED_ACTS, fused_gated_down, fused_is_faster, resolve_fused
from ffnlab.core.memory import check_layer_count, saved_bytes

Match = Literal["params", "flops", "none"]
Init = Literal["lecun", "he", "he_gelu", "normal", "lecun_uniform", "family"]
GluNorm = Literal["none", "pre", "post", "both"]  # where a gated FFN has a norm (GatedFFN)
NormKind = Literal["layernorm", "rmsnorm"]
MATCHES = ("params", "flops", "none")
INITS = ("lecun", "he", "he_gelu", "normal", "lecun_uniform", "family")
GLU_NORMS = ("none", "pre", "post", "both")
NORMS = ("layernorm", "rmsnorm")
# NOTE: one scheme for every variant, so a comparison measures activations, not initialisations; LeCun
# normal gave the lowest loss for every default variant among the candidates measured (docs/explanation/comparisons.md, "Initialisation")
DEFAULT_INIT: Init = "lecun"
LEGACY_INITS = {"auto": "family"}  # the name of the per-family table in stores written before it had one
GeneratorFor = Callable[[str, torch.Size], torch.Generator]  # (parameter name, shape) -> its random stream

SHAZEER = "Shazeer 2020, GLU Variants Improve Transformer (arXiv:2002.05202)"


@dataclass(frozen=True)
class FFNSpec:
    """A named FFN variant: its structure, activation and where it comes from."""

    name: str
    kind: Literal["dense", "gated", "mix", "switch", "schedule"]
    acts: tuple[str, ...]  # one activation, two for mix, the candidates of switch_x, every layer's for a schedule
    formula: str
    paper: str
    runs: tuple[tuple[str, int], ...] = ()  # a schedule's (variant, layers) runs, in layer order

    @property
    def gated(self) -> bool:
        return self.kind == "gated"


GATED: dict[str, FFNSpec] = by_name(
    [
        FFNSpec(
            "glu",
            "gated",
            ("sigmoid",),
            "W_down(sigmoid(W_gate x) * W_up x)",
            "Dauphin et al. 2017 (arXiv:1612.08083); " + SHAZEER,
        ),
        FFNSpec("bilinear", "gated", ("identity",), "W_down(W_gate x * W_up x)", SHAZEER),
        FFNSpec("reglu", "gated", ("relu",), "W_down(relu(W_gate x) * W_up x)", SHAZEER),
        FFNSpec("geglu", "gated", ("gelu",), "W_down(gelu(W_gate x) * W_up x)", SHAZEER),
        FFNSpec("geglu_tanh", "gated", ("gelu_tanh",), "W_down(gelu_tanh(W_gate x) * W_up x)", SHAZEER),
        FFNSpec("swiglu", "gated", ("silu",), "W_down(silu(W_gate x) * W_up x)", SHAZEER + "; LLaMA, PaLM"),
    ]
)

FFNS: dict[str, FFNSpec] = {
    **{
        name: FFNSpec(name, "dense", (name,), f"W_out {name}(W_in x + b_in) + b_out", a.paper)
        for name, a in ACTIVATIONS.items()
        if a.same_as is None
    },
    **GATED,
}


def get_ffn_spec(name: str) -> FFNSpec:
    """Spec for a variant name (case-insensitive), including `mix:a+b` and per-layer schedules
    `a*2+b*2` (see `schedule_spec`); ValueError if unknown."""
    key = normalize(name)
    if "*" in key:
        return schedule_spec(name)
    if key.startswith("mix:"):
        parts = key[4:].split("+")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"mixed FFN must be 'mix:ACT1+ACT2', got '{shorten(name)}'")
        specs = [get_ffn_spec(p) for p in parts]
        if any(s.kind != "dense" for s in specs):
            raise ValueError(f"mixed FFN takes two dense activations, got '{shorten(name)}'")
        acts = tuple(s.acts[0] for s in specs)
        return FFNSpec(
            f"mix:{acts[0]}+{acts[1]}",
            "mix",
            acts,
            f"(dense_{acts[0]}(x) + dense_{acts[1]}(x)) / 2, half width each",
            "ffnlab",
        )
    if key.startswith("switch_x:"):
        return switch_x_spec(name)
    if key in FFNS:
        return FFNS[key]
    if key in ACTIVATIONS:  # a Hugging Face alias such as gelu_new: dense FFN with that expression
        return FFNSpec(key, "dense", (key,), f"W_out {key}(W_in x + b_in) + b_out", ACTIVATIONS[key].paper)
    raise ValueError(
        f"unknown FFN variant '{shorten(name)}'{closest(key, FFNS)}; valid: {', '.join(FFNS)}, mix:ACT1+ACT2, "
        "switch_x:ACT1+ACT2+..., or a schedule such as gelu*2+swiglu*2"
    )


def switch_x_spec(name: str) -> FFNSpec:
    """Spec of `switch_x:ACT1+ACT2+...`: a dense FFN whose activation is a per-token softmax mixture of
    two or more distinct parameter-free registered activations (`InputMixture`); ValueError otherwise."""
    parts = normalize(name).removeprefix("switch_x:").split("+")
    name = shorten(name)  # as the errors echo it
    plain = [n for n, a in ACTIVATIONS.items() if not a.learnable]
    choices = f"valid: {', '.join(plain)}"
    if len(parts) < 2:
        raise ValueError(f"switch_x needs two or more activations, e.g. switch_x:gelu+silu+relu, got '{name}'")
    for part in parts:
        if part in GATED:
            raise ValueError(f"switch_x mixes activations, not gated FFNs: '{part}' in '{name}'; {choices}")
        if part not in plain:
            learnable = part in ACTIVATIONS
            why = "has learned parameters" if learnable else f"is not an activation{closest(part, ACTIVATIONS)}"
            raise ValueError(f"switch_x: '{shorten(part)}' in '{name}' {why}; {choices}")
    if len(set(parts)) < len(parts):
        raise ValueError(f"switch_x: an activation is repeated in '{name}'; each candidate once")
    return FFNSpec(
        "switch_x:" + "+".join(parts),
        "switch",
        tuple(parts),
        "W_out sum_i g_i(h) act_i(h) + b_out, g = softmax(W_g h + b_g), h = W_in x + b_in; gate counted in params",
        "ffnlab; per-token version of switch (" + ACTIVATIONS["switch"].paper + ")",
    )


def single_ffn_spec(name: str) -> FFNSpec:
    """`get_ffn_spec` for where one FFN is built (a module, a swap, an export): a schedule is refused."""
    spec = get_ffn_spec(name)
    if spec.kind == "schedule":
        raise ValueError(
            f"'{spec.name}' is a per-layer schedule, not one FFN: give one variant here, "
            "or train a Transformer with it (--ffn), which builds each layer's own"
        )
    return spec


# ---- per-layer schedules --------------------------------------------------------------------------

SCHEDULE_SYNTAX = "VARIANT*LAYERS joined by '+', e.g. gelu*2+swiglu*2, the counts adding up to n_layers"
RUN = r"(mix:[^+*]*\+[^+*]*|[^+*]*)\*([^+*]*)"  # one run of layers: a variant (mix:a+b too) and its count


def schedule_spec(name: str) -> FFNSpec:
    """Spec of a per-layer schedule such as `gelu*2+swiglu*2` (two gelu layers, then two swiglu).

    Its name is the canonical form: each variant's canonical name, neighbouring runs of one variant
    merged (`GELU*2+gelu*2` -> `gelu*4`), so one schedule has one run id. Every run needs a count
    of at least 1; a list of one variant per layer is `gelu*1+swiglu*1+gelu*1`. ValueError names
    the part that is wrong.
    """
    # read as written, spaces dropped (each variant is normalised by its own lookup), so that an
    # error echoes the user's spelling: normalising first showed 'gelu*-1' as 'gelu*_1'
    text, shown = "".join(str(name).split()), shorten(name)
    if not re.fullmatch(rf"{RUN}(\+{RUN})*", text, re.IGNORECASE):
        raise ValueError(f"bad schedule '{shown}': write {SCHEDULE_SYNTAX}")
    runs: list[tuple[str, int]] = []
    for variant, count in re.findall(RUN, text, re.IGNORECASE):
        if not count.isdigit() or int(count) < 1:
            part = shorten(f"{variant}*{count}")
            raise ValueError(f"bad schedule '{shown}': '{part}' needs a whole number of layers, at least 1")
        try:
            variant = single_ffn_spec(variant).name
        except ValueError as error:
            raise ValueError(f"bad schedule '{shown}': {error}") from None
        if runs and runs[-1][0] == variant:
            runs[-1] = (variant, runs[-1][1] + int(count))
        else:
            runs.append((variant, int(count)))
    first = [1 + sum(n for _, n in runs[:i]) for i in range(len(runs))]
    spans = [f"{a}-{a + n - 1}" if n > 1 else f"{a}" for a, (_, n) in zip(first, runs)]
    return FFNSpec(
        "+".join(f"{v}*{n}" for v, n in runs),
        "schedule",
        tuple(dict.fromkeys(a for v, _ in runs for a in get_ffn_spec(v).acts)),
        "layers " + "; ".join(f"{span}: {v}" for span, (v, _) in zip(spans, runs)),
        "ffnlab (per-layer schedule)",
        tuple(runs),
    )


def layer_variants(ffn: str, n_layers: int) -> list[str]:
    """The canonical variant of each of `n_layers` layers, first layer first: a schedule's runs in
    order (`gelu*2+swiglu*1`, 3 -> gelu, gelu, swiglu), or one variant everywhere. ValueError if a
    schedule's counts do not add up to n_layers, or n_layers is not 1 to MAX_LAYERS."""
    check_layer_count(n_layers)
    spec = get_ffn_spec(ffn)
    if spec.kind != "schedule":
        return [spec.name] * n_layers
    covered = sum(n for _, n in spec.runs)
    if covered != n_layers:
        raise ValueError(
            f"schedule '{spec.name}' covers {covered} layers but n_layers is {n_layers}; "
            f"its counts must add up to n_layers"
        )
    return [v for v, n in spec.runs for _ in range(n)]


# ---- sizing: pure arithmetic -----------------------------------------------------------------


def ffn_hidden_dim(
    d_model: int, gated: bool, mult: float = 4, multiple_of: int = 64, ffn_dim_multiplier: float | None = None
) -> int:
    """Conventional hidden width d_ff of an FFN.

    dense: mult * d_model (4x, Vaswani et al. 2017), times ffn_dim_multiplier if given.
    gated: 2/3 * mult * d_model (so three matrices hold as many weights as the dense two), times
    ffn_dim_multiplier, then rounded *up* to a multiple of `multiple_of`, as in LLaMA:
    d_model=4096, multiple_of=256 gives 11008 (LLaMA-7B).
    """
    if d_model <= 0 or mult <= 0 or multiple_of <= 0:
        raise ValueError(f"d_model, mult and multiple_of must be positive, got {d_model}, {mult}, {multiple_of}")
    hidden = int(mult * d_model)
    if not gated:
        return int(ffn_dim_multiplier * hidden) if ffn_dim_multiplier else hidden
    hidden = int(2 * hidden / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def ffn_param_count(kind: str, d_model: int, d_ff: int, bias: bool, n_acts: int = 1) -> int:
    """Weights (and biases) of an FFN: dense 2*d*h (+h+d), gated 3*d*h (+2h+d), mix as dense,
    switch as dense plus its gate over `n_acts` candidates, n_acts*(h+1) (the gate always has a bias)."""
    if kind == "switch":
        return ffn_param_count("dense", d_model, d_ff, bias) + n_acts * (d_ff + 1)
    if kind == "gated":
        return 3 * d_model * d_ff + (2 * d_ff + d_model if bias else 0)
    n_halves = 2 if kind == "mix" else 1
    h = d_ff // n_halves
    return n_halves * (2 * d_model * h + (h + d_model if bias else 0))


def spec_param_count(spec: FFNSpec, d_model: int, d_ff: int, bias: bool) -> int:
    """`ffn_param_count` of the variant `spec` (switch_x's gate sized by its candidates)."""
    return ffn_param_count(spec.kind, d_model, d_ff, bias, n_acts=len(spec.acts))


def glu_norm_param_count(glu_norm: str, norm: str, d_model: int, d_ff: int) -> int:
    """Weights of a gated FFN's `glu_norm` norms, which parameter matching leaves out: "pre" one norm
    over d_model, "post" one over d_ff, "both" the two; a LayerNorm has a weight and a bias per
    channel, an RMSNorm a weight."""
    if glu_norm not in GLU_NORMS or norm not in NORMS:
        raise ValueError(
            f"unknown glu_norm '{glu_norm}' or norm '{norm}'; valid: {', '.join(GLU_NORMS)}; {', '.join(NORMS)}"
        )
    per_channel = 2 if norm == "layernorm" else 1
    widths = {"none": 0, "pre": d_model, "post": d_ff, "both": d_model + d_ff}[glu_norm]
    return per_channel * widths


def ffn_flops_per_token(spec: FFNSpec, d_model: int, d_ff: int, bias: bool) -> int:
    """Forward FLOPs per token: 2 per multiply-add of each matmul, plus the activation's estimate,
    plus the elementwise product of gated variants and the averaging of mixed ones."""
    matmul = 2 * (spec_param_count(spec, d_model, d_ff, bias=False))
    biases = spec_param_count(spec, d_model, d_ff, bias) - spec_param_count(spec, d_model, d_ff, False)
    if spec.kind == "switch":  # every candidate, the softmax (about 3 per logit) and the weighted sum
        act = (sum(ACTIVATIONS[a].flops for a in spec.acts) + 2 * len(spec.acts)) * d_ff + 3 * len(spec.acts)
    elif spec.kind == "gated":
        act = (ACTIVATIONS[spec.acts[0]].flops + 1) * d_ff
    elif spec.kind == "mix":
        act = sum(ACTIVATIONS[a].flops for a in spec.acts) * (d_ff // 2) + 2 * d_model
    else:
        act = ACTIVATIONS[spec.acts[0]].flops * d_ff
    return matmul + biases + act


def matched_hidden_dim(
    spec: FFNSpec, d_model: int, match: Match = "params", bias: bool = False, mult: float = 4, tol: float = 0.01
) -> int:
    """d_ff that makes `spec` match the dense `mult`x FFN in parameters or FLOPs per token
    (`hidden_dim_for_target` with that FFN's count as the target). `match="none"` returns the
    conventional `ffn_hidden_dim` width instead.

    NOTE: a gated FFN's `glu_norm` norms are not counted (`glu_norm_param_count`): at most 2(d_model
    + d_ff) weights, about 0.92/d_model of the FFN (0.7% at d_model 128, 0.2% at 512), so a variant
    has one width with and without them and its weights start equal (paired seeds).
    """
    if match == "none":
        return ffn_hidden_dim(d_model, spec.gated, mult)
    if match not in MATCHES:
        raise ValueError(f"unknown match '{match}'; valid: {', '.join(MATCHES)}")
    d_dense = int(mult * d_model)
    if match == "params":
        target = ffn_param_count("dense", d_model, d_dense, bias)
    else:  # the reference is the dense FFN with the same (first) activation: swiglu vs silu 4x
        target = ffn_flops_per_token(FFNSpec("dense", "dense", spec.acts[:1], "", ""), d_model, d_dense, bias)
    return hidden_dim_for_target(spec, d_model, target, match, bias, tol)


def hidden_dim_for_target(
    spec: FFNSpec, d_model: int, target: float, match: Match = "params", bias: bool = False, tol: float = 0.01
) -> int:
    """d_ff at which `spec` has `target` parameters (match="params") or FLOPs per token ("flops").

    Both counts m(h) are affine in the width h, so the exact width is (target - m(0)) / (m(1) - m(0))
    (computed over h = 1000 for exactness); it is rounded to the coarsest multiple among 64, 32, 16, 8,
    2, 1 that keeps m(h) within `tol` (1%) of `target`, so large models get hardware-friendly widths and
    tiny test models still match. Mixed variants take even widths only. `matched_hidden_dim` (target:
    the dense 4x FFN) and ffnlab.tools.hf.swap_width (target: a model's own FFN) size with it.
    """
    measure: Callable[[int], int]
    if match == "params":
        measure = lambda h: spec_param_count(spec, d_model, h, bias)
    elif match == "flops":
        measure = lambda h: ffn_flops_per_token(spec, d_model, h, bias)
    else:
        raise ValueError(f"cannot match '{match}' to a target; valid: params, flops")
    exact = (target - measure(0)) * 1000 / (measure(1000) - measure(0))
    for step in (64, 32, 16, 8, 2, 1):
        if spec.kind == "mix" and step == 1:
            continue
        h = max(step, step * round(exact / step))
        if abs(measure(h) - target) <= tol * target:
            return h
    return max(2, 2 * round(exact / 2))


def ffn_width(
    spec: FFNSpec, d_model: int, d_ff: int | None = None, bias: bool | None = None, match: Match = "params"
) -> tuple[int, bool]:
    """(d_ff, bias) that `build_ffn` gives `spec`: d_ff=None is sized by `match` (`matched_hidden_dim`),
    bias=None is the variant's convention, on for dense and mixed FFNs, off for gated ones."""
    if d_model <= 0:
        raise ValueError(f"d_model must be positive, got {d_model}")
    if d_ff is not None and d_ff <= 0:
        raise ValueError(f"d_ff must be positive, got {d_ff}")
    if bias is None:
        bias = not spec.gated
    return (matched_hidden_dim(spec, d_model, match, bias) if d_ff is None else d_ff), bias


def layer_sizes(
    ffn: str,
    n_layers: int,
    d_model: int,
    d_ff: int | None = None,
    bias: bool | None = None,
    match: Match = "params",
) -> list[dict[str, Any]]:
    """Each layer's FFN as the Transformer builds it: variant, d_ff, params and forward FLOPs per
    token. Every layer is sized on its own (`ffn_width`), so a schedule's FFN parameters, the sum
    over its layers, match n_layers dense 4x FFNs as closely as each layer matches one."""
    rows = []
    for variant in layer_variants(ffn, n_layers):
        spec = get_ffn_spec(variant)
        width, has_bias = ffn_width(spec, d_model, d_ff, bias, match)
        params = spec_param_count(spec, d_model, width, has_bias)  # switch_x's gate over its candidates included
        flops = ffn_flops_per_token(spec, d_model, width, has_bias)
        rows.append({"variant": spec.name, "d_ff": width, "params": params, "flops_per_token": flops})
    return rows


# ---- modules ----------------------------------------------------------------------------------


def spec_for(kind: Literal["dense", "gated", "mix"], acts: tuple[str | None, ...]) -> FFNSpec | None:
    """Spec of an FFN built directly from activations with registry names `acts`: the table's entry
    (or `mix:a+b`), or for a gated FFN over an activation no entry names, a spec of its own;
    None if an activation is outside the registry (None in `acts`)."""
    names = tuple(a for a in acts if a is not None)
    if len(names) < len(acts):
        return None
    if kind == "gated":
        act = names[0]
        named = next((s for s in GATED.values() if s.acts == (act,)), None)
        return named or FFNSpec(f"gated {act}", "gated", (act,), f"W_down({act}(W_gate x) * W_up x)", SHAZEER)
    if kind == "mix":
        return get_ffn_spec(f"mix:{names[0]}+{names[1]}") if len(names) == 2 else None
    return get_ffn_spec(names[0])


class DenseFFN(nn.Module):
    """W_out act(W_in x): the Transformer's original position-wise feed-forward network.

    `spec` (what `init_ffn` and `ffn_stats` read) defaults to the registry's entry for the
    activation; pass it for an activation outside the registry.
    """

    def __init__(self, d_model: int, d_ff: int, act: ActLike = "relu", bias: bool = True, *,
                 spec: FFNSpec | None = None, **act_kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        self.w_in = nn.Linear(d_model, d_ff, bias=bias)
        self.act = get_activation(act, **act_kwargs)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.spec = spec or spec_for("dense", (activation_name(self.act),))
        self.d_ff = d_ff

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_model) -> (..., d_model)
        out: torch.Tensor = self.w_out(self.act(self.w_in(x)))
        return out


def norm_layer(kind: NormKind, width: int) -> nn.Module:
    """The Transformer's norm over `width` channels: LayerNorm, or RMSNorm (eps 1e-6)."""
    if kind not in NORMS:
        raise ValueError(f"unknown norm '{shorten(kind)}'; valid: {', '.join(NORMS)}")
    return nn.LayerNorm(width) if kind == "layernorm" else nn.RMSNorm(width, eps=1e-6)


class GatedFFN(nn.Module):
    """W_down(act(W_gate x) * W_up x): the GLU family. The gate goes through the activation,
    the up projection does not (as in LLaMA's gate_proj/up_proj/down_proj).

    Activations in `FUSED_ACTS` have a fused path that keeps only W_gate x and W_up x for backward
    (`fused_gated_down`). Which path forward takes is decided here, at construction, from `fused`
    and the policy of `ffnlab.core.kernels.set_fused_policy` (see `resolve_fused`): `fused=True`
    takes it (ValueError if the activation has no kernel; half the activation memory) unless the
    policy is "never" (FFNLAB_EAGER=1), False keeps the eager ops, None follows the policy. The
    result is the attribute `fused`: True, False, or None for "where `fused_is_faster` says so for
    the input". `spec` defaults to the registry's gated entry for the activation.

    `glu_norm` puts a norm of kind `norm` (the Transformer's, `norm_layer`) around the gate:

        none  W_down(act(W_gate x) * W_up x)                  (the default, and every variant's formula)
        pre   W_down(act(W_gate n) * W_up n), n = norm_in(x)  one norm over d_model before both projections
        post  W_down(norm_hidden(act(W_gate x) * W_up x))     one norm over d_ff on the product
        both  pre and post

    "post" is the sub-LayerNorm before the output projection of NormFormer (Shleifer et al. 2021,
    arXiv:2110.09456) and of Magneto (Wang et al. 2022, arXiv:2210.06423), here on a gated FFN. A norm
    on the product sits between it and W_down, which the fused kernel computes together, so "post"
    and "both" run eager (fused=True is a ValueError). The norms' weights (`glu_norm_param_count`) are
    not part of the parameter match, nor their FLOPs of `ffn_flops_per_token`. In a pre-norm block x
    has just been normed by the block, so "pre" re-normalises after the block norm's learned scale and
    shift; it matters most in post-norm blocks and in FFNs swapped into other models.
    """

    def __init__(self, d_model: int, d_ff: int, act: ActLike = "silu", bias: bool = False,
                 fused: bool | None = None, *, spec: FFNSpec | None = None, glu_norm: GluNorm = "none",
                 norm: NormKind = "layernorm", **act_kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        if glu_norm not in GLU_NORMS:
            raise ValueError(f"unknown glu_norm '{shorten(glu_norm)}'; valid: {', '.join(GLU_NORMS)}")
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias)
        self.w_up = nn.Linear(d_model, d_ff, bias=bias)
        self.act = get_activation(act, **act_kwargs)
        self.w_down = nn.Linear(d_ff, d_model, bias=bias)
        # after the Linears: ffn_stats reads d_model from the first weight; None (no module) keeps the
        # default's parameters, state dict and repr as they were before glu_norm existed
        self.norm_in = norm_layer(norm, d_model) if glu_norm in ("pre", "both") else None
        self.norm_hidden = norm_layer(norm, d_ff) if glu_norm in ("post", "both") else None
        self.glu_norm = glu_norm
        self.spec = spec or spec_for("gated", (activation_name(self.act),))
        self.d_ff = d_ff
        # kernels exist for plain registered activations, not learnable ones or ones with arguments
        name = getattr(self.act, "name", None)
        self.fused_act = name if name in FUSED_ACTS and not getattr(self.act, "kwargs", None) else None
        if fused and self.norm_hidden is not None:
            raise ValueError(
                f"fused=True computes act(gate) * up and W_down together; glu_norm '{glu_norm}' puts a norm "
                "between them: use fused=None or False, or glu_norm none or pre"
            )
        if fused and self.fused_act is None:
            raise ValueError(
                f"fused=True needs an activation with a fused kernel, got {self.act}; fused: {', '.join(FUSED_ACTS)}"
            )
        if self.norm_hidden is not None:
            self.fused_act = None
        self.fused = resolve_fused(fused, self.fused_act)

    def use_fused(self, x: torch.Tensor | None = None) -> bool:
        """Whether forward takes the fused path (for input x): the choice made at construction, and
        where that was "auto" (`fused` None), whether `fused_is_faster(x)`."""
        # NOTE: "auto" cannot be settled at construction: whether the fused path pays depends on the
        # input's device, dtype, autocast state and number of tokens, and one module sees many inputs.
        if self.fused is None:
            return x is None or fused_is_faster(x, self.d_ff)
        return self.fused

    def gate_input(self, x: torch.Tensor) -> torch.Tensor:
        """What W_gate and W_up read: x, normed where glu_norm is "pre" or "both"."""
        return x if self.norm_in is None else self.norm_in(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_model) -> (..., d_model)
        x = self.gate_input(x)
        if self.fused_act is not None and self.use_fused(x):
            return fused_gated_down(self.w_gate(x), self.w_up(x), self.w_down.weight, self.w_down.bias, self.fused_act)
        hidden = self.act(self.w_gate(x)) * self.w_up(x)  # (..., d_ff)
        if self.norm_hidden is not None:
            hidden = self.norm_hidden(hidden)
        out: torch.Tensor = self.w_down(hidden)
        return out

    def extra_repr(self) -> str:
        return f"fused={'auto' if self.fused is None else self.fused}" + (
            f", glu_norm={self.glu_norm}" if self.glu_norm != "none" else ""
        )


class MixFFN(nn.Module):
    """Mean of two dense FFNs with different activations, each at half the hidden width."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        acts: Sequence[ActLike] = ("gelu", "silu"),
        bias: bool = True,
        *,
        spec: FFNSpec | None = None,
    ) -> None:
        super().__init__()
        branches = [DenseFFN(d_model, d_ff // 2, a, bias) for a in acts]
        self.branches = nn.ModuleList(branches)
        self.spec = spec or spec_for("mix", tuple(activation_name(b.act) for b in branches))
        self.d_ff = d_ff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total: torch.Tensor = sum(b(x) for b in self.branches)
        return total / len(self.branches)


FFN = DenseFFN | GatedFFN | MixFFN  # what build_ffn builds


def build_ffn(
    name: str,
    d_model: int,
    d_ff: int | None = None,
    bias: bool | None = None,
    match: Match = "params",
    init: Init | None = DEFAULT_INIT,
    glu_norm: GluNorm = "none",
    norm: NormKind = "layernorm",
    **kwargs: Any,
) -> FFN:
    """Build a registered FFN variant.

    d_ff=None picks the width by `match` (see `matched_hidden_dim`). bias=None means the variant's
    convention: on for dense and mixed FFNs, off for gated ones (Shazeer 2020). `init` chooses the
    weight initialisation (see `init_ffn`); None leaves it to the caller (the Transformer's
    `init_weights` initialises every parameter once). `glu_norm` and `norm`: a gated FFN's norms
    around its gate (`GatedFFN`); ValueError for any other variant. Extra keyword arguments go to the
    class (`fused` for gated FFNs) and from there to the activation (e.g. negative_slope=0.1 for leaky_relu).
    """
    spec = single_ffn_spec(name)
    if glu_norm != "none" and not spec.gated:
        raise ValueError(
            f"glu_norm '{shorten(glu_norm)}' is a norm around a gate; '{spec.name}' has none "
            f"(gated: {', '.join(GATED)}), so leave glu_norm at none"
        )
    d_ff, bias = ffn_width(spec, d_model, d_ff, bias, match)
    ffn: FFN
    if spec.kind == "gated":
        ffn = GatedFFN(d_model, d_ff, spec.acts[0], bias, spec=spec, glu_norm=glu_norm, norm=norm, **kwargs)
    elif spec.kind == "mix":
        ffn = MixFFN(d_model, d_ff, spec.acts, bias, spec=spec)
    elif spec.kind == "switch":
        ffn = DenseFFN(d_model, d_ff, InputMixture(spec.acts, d_ff), bias, spec=spec)
    else:
        ffn = DenseFFN(d_model, d_ff, spec.acts[0], bias, spec=spec, **kwargs)
    if init is not None:
        init_ffn(ffn, init)
    return ffn


# ---- initialisation ---------------------------------------------------------------------------

# The literature's per-family table, a named choice (`init="family"`) and never the default: it gives
# each variant a different init, which a comparison would then measure along with the activation.
INIT_BY_FAMILY = {"relu": "he", "gelu": "normal", "swish": "lecun_uniform", "other": "lecun"}


def init_std(scheme: str, fan_in: int) -> float:
    """Std of a scheme's weights: he sqrt(2/fan_in) (He et al. 2015), normal 0.02 (BERT, GPT-2),
    lecun and lecun_uniform sqrt(1/fan_in) (LeCun et al. 1998; the uniform one draws from
    U(-sqrt(3/fan_in), sqrt(3/fan_in)), which has that std), he_gelu sqrt(2/fan_in) * sqrt(2/pi)
    = 2/sqrt(pi fan_in), about 0.80x he.

    NOTE: he_gelu is the rule articles on GELU give for large models, "He initialisation scaled by
    sqrt(2/pi)" (issue #28), taken literally; it is not derived here. sqrt(2/pi) is GELU's tanh-
    approximation constant (Hendrycks & Gimpel 2016). The gain that keeps a GELU layer's second moment
    (He et al.'s argument) would be 1/sqrt(E[gelu(z)^2]) = 1.53 for z ~ N(0, 1): sqrt(2.35/fan_in),
    above he, not below it."""
    if scheme == "he":
        return math.sqrt(2.0 / fan_in)
    if scheme == "he_gelu":
        return math.sqrt(2.0 / fan_in) * math.sqrt(2.0 / math.pi)
    if scheme in ("lecun", "lecun_uniform"):
        return math.sqrt(1.0 / fan_in)
    if scheme == "normal":
        return 0.02
    raise ValueError(f"unknown init '{scheme}'; valid: {', '.join(INITS)}")


def check_init(init: str) -> str:
    """`init` itself if valid (old stores' 'auto' too); ValueError naming the valid choices."""
    if init not in INITS and init not in LEGACY_INITS:
        raise ValueError(f"unknown init '{init}'{closest(str(init), INITS)}; valid: {', '.join(INITS)}")
    return init


def init_scheme(spec: FFNSpec, init: Init = DEFAULT_INIT) -> str:
    """The concrete scheme `init` stands for: `family` picks by the activation's family."""
    scheme = LEGACY_INITS.get(check_init(init), init)
    return INIT_BY_FAMILY[ACTIVATIONS[spec.acts[0]].family] if scheme == "family" else scheme


def spec_of(ffn: nn.Module) -> FFNSpec:
    """The FFN's spec; ValueError if it has none (an activation outside the registry, no spec= given)."""
    spec = getattr(ffn, "spec", None)
    if not isinstance(spec, FFNSpec):
        raise ValueError(f"{type(ffn).__name__} has no spec (its activation is not in the registry): pass spec=")
    return spec


@torch.no_grad()
def init_ffn(ffn: nn.Module, init: Init = DEFAULT_INIT, generator_for: GeneratorFor | None = None) -> None:
    """Initialise every Linear of an FFN: zero-mean weights by scheme, zero biases.

    `generator_for(name, shape) -> torch.Generator`, if given, gives each weight its own random
    stream; the model uses it so that same-shaped weights start equal across variants.
    """
    scheme = init_scheme(spec_of(ffn), init)
    for name, lin in ffn.named_modules():
        if isinstance(lin, nn.Linear):
            gen = generator_for(f"{name}.weight", lin.weight.shape) if generator_for else None
            std = init_std(scheme, lin.in_features)
            if scheme == "lecun_uniform":
                lin.weight.uniform_(-math.sqrt(3.0) * std, math.sqrt(3.0) * std, generator=gen)
            else:
                lin.weight.normal_(0.0, std, generator=gen)
            if lin.bias is not None:
                lin.bias.zero_()


# ---- measured statistics ------------------------------------------------------------------------


@dataclass(frozen=True)
class FFNStats:
    """What `ffn_stats` counts and measures of one FFN."""

    ffn: str
    gated: bool
    d_model: int
    d_ff: int
    params: int
    params_per_weight: dict[str, int]
    flops_per_token: int
    saved_bytes_per_token: float


def ffn_stats(ffn: FFN, tokens: int = 1) -> FFNStats:
    """Parameters per weight, FLOPs per token, and bytes kept for backward per token.

    The saved bytes are measured, not estimated: one forward pass over `tokens` random tokens
    under `torch.autograd.graph.saved_tensors_hooks`, counting each distinct tensor once and
    leaving out the weights themselves (they are kept anyway).
    """
    spec = spec_of(ffn)
    d_model = next(p for n, p in ffn.named_parameters() if n.endswith("weight")).shape[1]
    params = {n: p.numel() for n, p in ffn.named_parameters()}
    bias = any(isinstance(m, nn.Linear) and m.bias is not None for m in ffn.modules())  # not switch_x's gate
    x = torch.randn(tokens, d_model, requires_grad=True)
    saved = saved_bytes(lambda: ffn(x), exclude=ffn.parameters())
    return FFNStats(
        ffn=spec.name,
        gated=spec.gated,
        d_model=d_model,
        d_ff=ffn.d_ff,
        params=sum(params.values()),
        params_per_weight=params,
        flops_per_token=ffn_flops_per_token(spec, d_model, ffn.d_ff, bias),
        saved_bytes_per_token=saved / tokens,
    )
