"""Activation registry: one table from name to spec, and `get_activation` to build a module.

Every entry is a plain function `fn(x) -> y` (or a module factory for learnable ones), the formula
as reports print it, the paper it comes from, a FLOPs-per-element estimate and the family used to
pick an initialisation. Hugging Face names (`gelu_new`, `quick_gelu`, ...) are entries of their own
that evaluate Hugging Face's exact expression, so swapping one in is bit-for-bit what
`transformers.activations.ACT2FN` computes; `same_as` names the canonical function they equal
mathematically, and the canonical entry lists them as its aliases.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ffnlab._util.names import by_name, closest, normalize
from ffnlab._util.text import shorten

Family = Literal["relu", "gelu", "swish", "other"]
# what one output element depends on: its own input, its input and its channel's position (the last
# dimension), or the other tokens of the batch too
Scope = Literal["element", "channel", "batch"]
ActLike = str | nn.Module | Callable[[torch.Tensor], torch.Tensor]  # what get_activation accepts

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SQRT1_2 = 1.0 / math.sqrt(2.0)


@dataclass(frozen=True)
class ActSpec:
    """What the registry knows about one activation."""

    name: str
    fn: Callable[..., torch.Tensor] | None  # None only for learnable entries, which need a module
    formula: str
    paper: str
    flops: int  # per element, counting exp/erf/tanh as one each: a rough cost, not a benchmark
    family: Family
    module: Callable[..., nn.Module] | None = None  # factory for learnable entries
    same_as: str | None = None  # canonical entry this one equals mathematically (HF aliases)
    defaults: dict[str, float] = field(default_factory=dict)  # keyword arguments of fn with their defaults
    experimental: bool = False  # no paper defines this exact function: this project's reading (paper says whose)
    scope: Scope = "element"  # what an output reads besides its own input; see `Scope`

    @property
    def learnable(self) -> bool:
        """Whether the activation has learned parameters, so is built by its module factory."""
        return self.module is not None


# ---- plain functions -----------------------------------------------------------------------


def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU, relu(x)^2. So et al. 2021, Primer (arXiv:2109.08668)."""
    return torch.square(F.relu(x))


def leaky_relu(x: torch.Tensor, negative_slope: float = 0.01) -> torch.Tensor:
    """Leaky ReLU, max(x, a*x). Maas et al. 2013."""
    return F.leaky_relu(x, negative_slope)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, x*Phi(x) with the 1+erf form. Hendrycks & Gimpel 2016 (arXiv:1606.08415)."""
    return F.gelu(x)


def gelu_erfc(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU via erfc: 0.5*x*erfc(-x/sqrt2), free of the 1+erf cancellation in the negative tail.

    NOTE: 1 + erf(x/sqrt2) loses every significant digit for x < -5.5 in fp32, where erf is -1 to
    within one ulp; erfc(-x/sqrt2) computes the small tail directly.
    """
    return 0.5 * x * torch.erfc(-x * SQRT1_2)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))). Hendrycks & Gimpel 2016."""
    return F.gelu(x, approximate="tanh")


def gelu_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """GELU, sigmoid approximation x*sigmoid(1.702x). Hendrycks & Gimpel 2016."""
    return x * torch.sigmoid(1.702 * x)


def identity(x: torch.Tensor) -> torch.Tensor:
    """Identity; the 'bilinear' GLU variant uses it. Shazeer 2020 (arXiv:2002.05202)."""
    return x


# Hugging Face's own expressions, kept verbatim so results match ACT2FN bit for bit.
def hf_gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU ('gelu_new' in Hugging Face): tanh approximation written out with pow."""
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def hf_gelu_fast(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face 'gelu_fast': tanh approximation with the constant rounded to 0.7978845608."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def hf_gelu_accurate(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face 'gelu_accurate' (MEGA): tanh approximation, pow(x, 3) with an integer power."""
    return 0.5 * x * (1 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3))))


def hf_gelu_python(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face 'gelu_python': the erf form written out, x*0.5*(1+erf(x/sqrt2))."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def hf_gelu_10(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face 'gelu_10': exact GELU clipped to [-10, 10] for quantisation (arXiv:2004.09602)."""
    return torch.clip(F.gelu(x), -10, 10)


# ---- the attention article's remaining activations (issue #27) --------------------------------

EXP_LINEAR_FROM = 10.0  # exponential's guard: exp(x) up to here, its tangent line beyond


def energy_gated(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Energy-gated x*exp(-E(x)/T) with the Gaussian energy E(x) = x^2/2 and a fixed temperature T = 1.

    This project's reading of the attention article's `x*exp(-E(x)/T)`, which names no energy: the
    Boltzmann factor of a unit-stiffness spring, so the gate is 1 at x = 0 and closes for |x| >> sqrt(T);
    f rises like x near 0, peaks at x = sqrt(T) and decays to 0 in both tails. T is not learned; another
    is an argument (`get_activation("energy_gated", temperature=2.0)`).
    """
    return x * torch.exp(-0.5 * x * x / temperature)


def split_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """Spatio-temporal split: GELU on the first ceil(C/2) channels of the last dimension, tanh on the rest.

    This project's reading of the attention article's split activation (no paper defines it): with an
    odd channel count C the GELU half gets the extra channel. A 1-D input is one token's C channels.
    """
    first = torch.arange(x.shape[-1], device=x.device) < (x.shape[-1] + 1) // 2  # (C,): the GELU channels
    # NOTE: both on every channel, then chosen: one elementwise Where in an exported graph, no Slice/Concat
    return torch.where(first, F.gelu(x), torch.tanh(x))


def exponential(x: torch.Tensor) -> torch.Tensor:
    """Exponential activation exp(x), continued by its tangent line e^10*(x - 9) above x = 10.

    exp(x) as an activation: Koo & Ploenzke 2021, Improving representations of genomic sequence motifs
    in convolutional networks with exponential activations (Nat. Mach. Intell. 3, 258). The guard is this
    project's: e^x overflows fp32 above x = 88.7; the tangent line keeps the value and the slope at 10
    (C^1) and a gradient beyond, where clamping the input would leave none. It grows linearly, so fp32
    holds it to x = 1.5e34, but fp16 (largest 65504) still overflows above x = 12.
    """
    top = math.exp(EXP_LINEAR_FROM)
    return torch.where(x <= EXP_LINEAR_FROM, torch.exp(x.clamp(max=EXP_LINEAR_FROM)), top * (x - EXP_LINEAR_FROM + 1))


QUANTILES_PER_SIDE = 16  # kernel centres per sign of a channel's context: 32 erf terms per element
MIN_BANDWIDTH = 1e-3  # NOTE: a channel whose context is one value (one token, a constant) has std 0
QuantileContext = tuple[torch.Tensor, torch.Tensor]  # centres (2K, C), bandwidth (C,)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """x as (tokens, channels): the last dimension is the channels, the others the tokens; 1-D is one channel."""
    return x.reshape(-1, 1) if x.ndim <= 1 else x.reshape(-1, x.shape[-1])


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # fp16/bf16 are summed in fp32, as a fused kernel would


def quantile_context(x: torch.Tensor) -> QuantileContext:
    """The distribution each channel of `x` is ranked in (`quantile`), detached: (centres, bandwidth).

    Per channel, over its tokens z: K = QUANTILES_PER_SIDE quantiles of the negative values (centres
    0..K-1) and K of the non-negative ones (K..2K-1), at levels (2k+1)/(2K), k = 0..K-1: the order
    statistic floor((2k+1)n/(2K)) of each side's n values; a side with no values has its centres at
    -inf (negatives) or +inf. The bandwidth is Silverman's rule for the 2K centres,
    h = 1.06 std(z) (2K)^(-1/5), at least MIN_BANDWIDTH.
    """
    z = _tokens(x.detach()).to(_work_dtype(x))  # (N, C)
    n, k = z.shape[0], QUANTILES_PER_SIDE
    ordered = z.sort(dim=0).values
    n_neg = (z < 0).sum(0)  # (C,)
    row = torch.arange(2 * k, device=z.device)[:, None]  # (2K, 1): negative side first
    negative = row < k
    count = torch.where(negative, n_neg, n - n_neg)  # (2K, C): the values on that centre's side
    rank = torch.where(negative, 0, n_neg) + (2 * (row % k) + 1) * count // (2 * k)  # in its side's ranks
    inf = torch.tensor(math.inf, dtype=z.dtype, device=z.device)
    empty = torch.where(negative, -inf, inf)
    centres = torch.where(count > 0, ordered.gather(0, rank.clamp(max=n - 1)), empty)
    bandwidth = (1.06 * z.std(dim=0, correction=0) * (2 * k) ** -0.2).clamp(min=MIN_BANDWIDTH)
    return centres, bandwidth


def _kernel_cdf(x: torch.Tensor, centres: torch.Tensor, bandwidth: torch.Tensor) -> torch.Tensor:
    """mean_j erf((x - c_j) / (sqrt2 h)) per channel: 2F - 1 of the Gaussian-kernel CDF F. x: (..., C)."""
    inv = 1.0 / (math.sqrt(2.0) * bandwidth)
    total = torch.zeros_like(x)
    for c in centres:  # one pass over x per centre: no (..., C, 2K) tensor
        total = total + torch.erf((x - c) * inv)
    return total / len(centres)


def _kernel_density(x: torch.Tensor, centres: torch.Tensor, bandwidth: torch.Tensor) -> torch.Tensor:
    """d/dx of `_kernel_cdf` at fixed centres: mean_j 2/sqrt(pi) exp(-u_j^2) / (sqrt2 h), u_j = (x - c_j)/(sqrt2 h)."""
    inv = 1.0 / (math.sqrt(2.0) * bandwidth)
    total = torch.zeros_like(x)
    for c in centres:
        total = total + torch.exp(-torch.square((x - c) * inv))
    return total * (inv * 2.0 / math.sqrt(math.pi) / len(centres))


def quantile(x: torch.Tensor, context: QuantileContext | None = None) -> torch.Tensor:
    """Quantile activation: 2F(x) - 1, F each channel's kernel-smoothed CDF over the batch's tokens.

    After Challa et al. 2024, Quantile Activation (arXiv:2405.11573): a unit outputs where its input
    lies in the distribution of that unit over the context (the batch), not the input itself. This
    project's reading, per channel (the last dimension; the tokens are every other dimension, all B*T
    of a Transformer's FFN input; a 1-D input is one channel's values):

        f(x) = 2F(x) - 1 = mean_j erf((x - c_j) / (sqrt2 h)),  in (-1, 1), increasing in x,

    F the Gaussian-kernel CDF on 2K centres c_j, the context's quantiles (`quantile_context`): the
    paper's grounding gives the negative and the non-negative values half the mass each, so a unit
    keeps its sign's information (an all-positive context maps every input above 0). The context is
    detached: the gradient is 2F'(x), twice the kernel density, with the context held fixed, as the
    paper's backward is the density. `context` (from `quantile_context`) ranks x in another batch's.

    Where it differs from the paper: the forward is the kernel-smoothed CDF (the paper interpolates
    the empirical quantiles and uses a kernel density only for the gradient), so forward and gradient
    agree; K = 16 quantiles per side (the paper: 100); an empty side sits at -inf or +inf (the paper
    appends +-100 to every context); the output is centred, 2F - 1 (the paper's is F, in [0, 1]).

    NOTE: the output at one token depends on every token of the batch, later positions of its own
    sequence too, so a causal LM with it is not strictly causal; the context carries no gradient, so
    training cannot learn to read the future through it. It is deterministic given the batch, in
    train and eval alike; one token alone (batch 1, one position) maps to +-0.5.
    """
    if x.numel() == 0:
        return x.clone()
    centres, bandwidth = quantile_context(x) if context is None else context
    z = x.to(_work_dtype(x))  # (..., C) against (2K, C) and (C,): broadcast, no reshape (1-D: C = 1)
    frozen = z.detach()
    y = _kernel_cdf(frozen, centres, bandwidth)
    # the value is unchanged, the gradient is the density; an exported graph computes values only
    if torch.is_grad_enabled() and x.requires_grad and not torch.onnx.is_in_onnx_export():
        y = y + _kernel_density(frozen, centres, bandwidth) * (z - frozen)
    return y.to(x.dtype)


# ---- learnable activations -----------------------------------------------------------------


class SwishBeta(nn.Module):
    """Swish x*sigmoid(beta*x) with learnable beta. Ramachandran et al. 2017 (arXiv:1710.05941)."""

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(float(beta)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.beta * x)


class TunableGELU(nn.Module):
    """GELU with learnable temperature, x*Phi(x/tau). Hendrycks & Gimpel 2016, section on tau."""

    def __init__(self, tau: float = 1.0) -> None:
        super().__init__()
        self.tau = nn.Parameter(torch.tensor(float(tau)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.erf(x / (self.tau * math.sqrt(2.0))))


class ScalarMixture(nn.Module):
    """Softmax mixture sum_i softmax(w)_i f_i(x) of fixed activations over learned scalars w.

    After the activation search of Ramachandran et al. 2017 (arXiv:1710.05941). Registered as
    "switch", the name stored results carry; it is not Switch-Transformer routing: every activation
    runs on every element, with one learned weight each for the whole layer, starting equal (zero logits).
    """

    def __init__(self, acts: tuple[str, ...] | list[str] = ("relu", "gelu", "silu")) -> None:
        super().__init__()
        if len(acts) < 2:
            raise ValueError(f"switch needs at least two activations, got {list(acts)}")
        self.names = tuple(resolve(a) for a in acts)
        self.acts = nn.ModuleList(get_activation(a) for a in self.names)
        self.logits = nn.Parameter(torch.zeros(len(self.acts)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(self.logits, dim=0)
        mixed: torch.Tensor = sum(w[i] * act(x) for i, act in enumerate(self.acts))
        return mixed

    def extra_repr(self) -> str:
        return f"acts={list(self.names)}"


class AttentionGELU(nn.Module):
    """Attention-aware GELU x*sigmoid(beta*a*x), a = 1 + the token's attention-output RMS; this project's
    construction on the Swish family x*sigmoid(beta*x) (Ramachandran et al. 2017, arXiv:1710.05941).

    `a` is per token, broadcast over the hidden units: a = 1 + sqrt(mean_d attn_d^2), where attn is the
    same block's attention sub-layer output (before dropout and the residual sum), detached. The block
    sets it through `attention_context`; outside one (a bare FFN, a Hugging Face model) there is no
    attention output, r = 0 and a = 1, so the unit is x*sigmoid(beta*x). beta starts at 1.702, GELU's
    sigmoid constant (Hendrycks & Gimpel 2016), so at a = 1 it starts as gelu_sigmoid.

    NOTE: beta is one scalar per layer, as swish_beta's, so the two differ only by `a`; one beta per
    hidden unit would confound attention-awareness with per-unit slopes. `a` is detached so the
    gate cannot train attention to rescale its own output norm (a cheap, destabilising route), and
    attention's gradients stay those of every other variant. a >= 1: attention output near zero
    (early training, projections start small) leaves a plain GELU, not a linear x/2.
    """

    def __init__(self, beta: float = 1.702) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(float(beta)))
        self.a: torch.Tensor | None = None  # (..., 1) while the block runs its FFN, else None (a = 1)

    def set_attention(self, attn_out: torch.Tensor | None) -> None:
        """Set a from the attention output (..., d_model), or back to 1 with None."""
        if attn_out is None:
            self.a = None
            return
        rms = attn_out.detach().float().square().mean(-1, keepdim=True).sqrt()
        self.a = (1.0 + rms).to(attn_out.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slope = self.beta if self.a is None else self.beta * self.a
        return x * torch.sigmoid(slope * x)


@contextlib.contextmanager
def attention_context(ffn: nn.Module, attn_out: torch.Tensor) -> Iterator[None]:
    """Within the `with`, every attention-aware activation inside `ffn` reads `attn_out`; after it, a = 1."""
    users = [m for m in ffn.modules() if isinstance(m, AttentionGELU)]
    for m in users:
        m.set_attention(attn_out)
    try:
        yield
    finally:
        for m in users:
            m.set_attention(None)


class InputMixture(nn.Module):
    """Per-token softmax mixture sum_i g_i(h) f_i(h), g(h) = softmax(W h + b), of fixed activations.

    This project's construction: the input-dependent form of `switch` (ScalarMixture), with a mixture-
    of-experts style per-token softmax gate (Shazeer et al. 2017, arXiv:1701.06538) over activation
    functions instead of experts; learned activation mixtures: Manessi & Rozza 2018 (arXiv:1801.09403).
    The gate reads h, the token's hidden pre-activation (d_ff wide), so the module is an activation
    like any other, f(h), and FFNs and probes call it alike. W and b start at zero: every token starts
    with equal weights, as `switch` does; W is a matrix, so training decays it like every matrix
    (towards equal weights). `d_ff` is h's width.
    """

    def __init__(self, acts: tuple[str, ...] | list[str], d_ff: int) -> None:
        super().__init__()
        self.names = tuple(acts)
        self.acts = nn.ModuleList(get_activation(a) for a in self.names)
        # plain parameters, not an nn.Linear, so that the FFN's init (which draws every Linear) leaves them at zero
        self.gate_weight = nn.Parameter(torch.zeros(len(self.names), d_ff))
        self.gate_bias = nn.Parameter(torch.zeros(len(self.names)))

    def weights(self, h: torch.Tensor) -> torch.Tensor:
        """The mixture weights g(h), (..., n_acts), summing to 1 per token."""
        return torch.softmax(F.linear(h, self.gate_weight, self.gate_bias), dim=-1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (..., d_ff) -> (..., d_ff)
        g = self.weights(h)
        mixed: torch.Tensor = sum(g[..., i : i + 1] * act(h) for i, act in enumerate(self.acts))
        return mixed

    def extra_repr(self) -> str:
        return f"acts={list(self.names)}"


# ---- the table -----------------------------------------------------------------------------

_HG = "Hendrycks & Gimpel 2016, Gaussian Error Linear Units (arXiv:1606.08415)"
_SWISH = "Ramachandran et al. 2017, Searching for Activation Functions (arXiv:1710.05941)"
_HF = "Hugging Face transformers.activations"


def _spec(
    name: str, fn: Callable[..., torch.Tensor] | None, formula: str, paper: str, flops: int, family: Family, **kw: Any
) -> ActSpec:
    return ActSpec(name=name, fn=fn, formula=formula, paper=paper, flops=flops, family=family, **kw)


ACTIVATIONS: dict[str, ActSpec] = by_name(
    [
        _spec("relu", F.relu, "max(0, x)", "Nair & Hinton 2010; Vaswani et al. 2017", 1, "relu"),
        _spec(
            "leaky_relu",
            leaky_relu,
            "max(x, a*x), a=0.01",
            "Maas et al. 2013, Rectifier Nonlinearities",
            2,
            "relu",
            defaults={"negative_slope": 0.01},
        ),
        _spec("relu2", relu2, "max(0, x)^2", "So et al. 2021, Primer (arXiv:2109.08668)", 2, "relu"),
        _spec(
            "hardswish", F.hardswish, "x*relu6(x+3)/6", "Howard et al. 2019, MobileNetV3 (arXiv:1905.02244)", 5, "swish"
        ),
        _spec("mish", F.mish, "x*tanh(softplus(x))", "Misra 2019, Mish (arXiv:1908.08681)", 6, "swish"),
        _spec("gelu", gelu, "x*Phi(x) = 0.5x(1+erf(x/sqrt2))", _HG, 6, "gelu"),
        _spec("gelu_erfc", gelu_erfc, "0.5x*erfc(-x/sqrt2)", _HG + "; erfc form avoids tail cancellation", 6, "gelu"),
        _spec("gelu_tanh", gelu_tanh, "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))", _HG, 9, "gelu"),
        _spec("gelu_sigmoid", gelu_sigmoid, "x*sigmoid(1.702x)", _HG, 5, "gelu"),
        _spec("silu", F.silu, "x*sigmoid(x)", "Elfwing et al. 2017 (arXiv:1702.03118); " + _SWISH, 4, "swish"),
        _spec(
            "sigmoid",
            torch.sigmoid,
            "sigmoid(x) = 1/(1+exp(-x))",
            "Dauphin et al. 2017, GLU (arXiv:1612.08083)",
            3,
            "other",
        ),
        _spec("tanh", torch.tanh, "tanh(x)", "LeCun et al. 1998, Efficient BackProp", 1, "other"),
        _spec("identity", identity, "x", "Shazeer 2020, GLU Variants (arXiv:2002.05202), bilinear", 0, "other"),
        _spec(
            "swish_beta",
            None,
            "x*sigmoid(beta*x), beta learnable (init 1)",
            _SWISH,
            5,
            "swish",
            module=SwishBeta,
        ),
        _spec(
            "tunable_gelu",
            None,
            "x*Phi(x/tau), tau learnable (init 1)",
            _HG,
            7,
            "gelu",
            module=TunableGELU,
        ),
        _spec(
            "switch",
            None,
            "sum_i softmax(w)_i f_i(x), w learnable",
            _SWISH,
            20,
            "other",
            module=ScalarMixture,
        ),
        _spec(
            "agelu",
            None,
            "x*sigmoid(beta*a*x), a = 1 + rms(attention output), beta learnable (init 1.702)",
            "this project's construction on the Swish family, " + _SWISH,
            7,
            "gelu",
            module=AttentionGELU,
            experimental=True,
        ),
        # the attention article's remaining activations (issue #27): readings of its descriptions
        _spec(
            "quantile",
            quantile,
            "2F(x)-1 = mean_j erf((x-c_j)/(sqrt2 h)), c_j: quantiles of the channel over the batch",
            "this project's reading of Challa et al. 2024, Quantile Activation (arXiv:2405.11573)",
            130,  # 32 kernel terms of 4 ops each, plus the per-channel sort
            "other",
            experimental=True,
            scope="batch",
        ),
        _spec(
            "energy_gated",
            energy_gated,
            "x*exp(-E(x)/T), E(x) = x^2/2, T = 1",
            "this project's reading of the attention article's energy gate (Gaussian energy, fixed T)",
            5,
            "other",
            defaults={"temperature": 1.0},
            experimental=True,
        ),
        _spec(
            "split_gelu_tanh",
            split_gelu_tanh,
            "gelu(x) on the first ceil(C/2) channels, tanh(x) on the rest",
            "this project's reading of the attention article's spatio-temporal split",
            4,
            "other",
            experimental=True,
            scope="channel",
        ),
        _spec(
            "exponential",
            exponential,
            "exp(x) for x <= 10, e^10*(x-9) above (overflow guard)",
            "Koo & Ploenzke 2021, exponential activations (Nat. Mach. Intell. 3:258); the guard is this project's",
            2,
            "other",
            experimental=True,
        ),
        # Hugging Face names, evaluated with Hugging Face's own expressions.
        _spec(
            "gelu_new",
            hf_gelu_new,
            "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))",
            _HF + " (GPT-2)",
            9,
            "gelu",
            same_as="gelu_tanh",
        ),
        _spec(
            "gelu_fast", hf_gelu_fast, "0.5x(1+tanh(0.7978845608x(1+0.044715x^2)))", _HF, 9, "gelu", same_as="gelu_tanh"
        ),
        _spec(
            "gelu_pytorch_tanh",
            gelu_tanh,
            "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))",
            _HF + " (Gemma)",
            9,
            "gelu",
            same_as="gelu_tanh",
        ),
        _spec(
            "gelu_accurate",
            hf_gelu_accurate,
            "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))",
            _HF + " (MEGA)",
            9,
            "gelu",
            same_as="gelu_tanh",
        ),
        _spec("gelu_python", hf_gelu_python, "x*0.5(1+erf(x/sqrt2))", _HF, 6, "gelu", same_as="gelu"),
        _spec("gelu_10", hf_gelu_10, "clip(gelu(x), -10, 10)", _HF + "; Wu et al. 2020 (arXiv:2004.09602)", 8, "gelu"),
        _spec("quick_gelu", gelu_sigmoid, "x*sigmoid(1.702x)", _HF + " (CLIP)", 5, "gelu", same_as="gelu_sigmoid"),
        _spec("swish", F.silu, "x*sigmoid(x)", _HF, 4, "swish", same_as="silu"),
    ]
)


def aliases(name: str) -> list[str]:
    """Names that compute the same function as `name` (the Hugging Face aliases of a canonical entry)."""
    return sorted(n for n, s in ACTIVATIONS.items() if s.same_as == name)


def resolve(name: str) -> str:
    """Canonical registry key for `name` (case-insensitive, '-' accepted for '_'); ValueError if unknown."""
    key = normalize(name)
    if key not in ACTIVATIONS:
        raise ValueError(
            f"unknown activation '{shorten(name)}'{closest(key, ACTIVATIONS)}; valid: {', '.join(ACTIVATIONS)}"
        )
    return key


class Activation(nn.Module):
    """A registered parameter-free activation as a module; `name` and kwargs show in repr."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__()
        spec = ACTIVATIONS[name]
        unknown = set(kwargs) - set(spec.defaults)
        if unknown:
            valid = ", ".join(spec.defaults) or "none"
            raise ValueError(f"activation '{name}' takes no argument {sorted(unknown)}; valid: {valid}")
        if spec.fn is None:
            raise ValueError(f"activation '{name}' has learned parameters: build it with get_activation")
        self.name = name
        self.kwargs = {**spec.defaults, **kwargs}
        self.fn = functools.partial(spec.fn, **self.kwargs) if self.kwargs else spec.fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return ", ".join([self.name] + [f"{k}={v}" for k, v in self.kwargs.items()])


def get_activation(name: ActLike, **kwargs: Any) -> nn.Module:
    """Ready-to-use module for a registered activation name; modules and callables pass through.

    >>> get_activation("GELU_tanh")(torch.zeros(2))
    tensor([0., 0.])
    """
    if isinstance(name, nn.Module):
        return name
    if callable(name):
        return _Lambda(name)
    key = resolve(name)
    spec = ACTIVATIONS[key]
    if spec.module is not None:
        return spec.module(**kwargs)
    return Activation(key, **kwargs)


def activation_name(act: nn.Module) -> str | None:
    """Registry key of an activation module that `get_activation` built; None for any other module."""
    if isinstance(act, Activation):
        return act.name
    return next(
        (key for key, spec in ACTIVATIONS.items() if spec.module is not None and type(act) is spec.module), None
    )


class _Lambda(nn.Module):
    """Wraps a plain callable so it can sit in an nn.Sequential or a TransformerEncoderLayer."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))
