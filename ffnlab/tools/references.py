"""Exact references for every registered activation: float64 formulas, and GELU in mpmath.

Each reference is written here from the activation's formula, never by calling the code it
checks. float64 suffices on the measurement grid: scipy's ndtr (from erfc) and expit keep full
relative accuracy in the tails, and tanh-formula terms are rewritten so nothing cancels (tests
check each reference against mpmath). Where float64 is not enough, GELU's negative tail, `mp_gelu`
and `mp_gelu_grad` evaluate it in mpmath, and `mp_gelu_tanh` its tanh approximation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import mpmath
import numpy as np
from scipy import special

from ffnlab.core.activations import EXP_LINEAR_FROM, MIN_BANDWIDTH, QUANTILES_PER_SIDE

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Ref:
    """A float64 reference: f(x), its derivative df(x), and the x where df jumps (skipped in backward)."""

    f: Callable[[np.ndarray], np.ndarray]
    df: Callable[[np.ndarray], np.ndarray]
    kinks: tuple[float, ...] = ()


Real = TypeVar("Real", float, np.ndarray)  # a number or an array of them, returned as it came


def normal_pdf(x: Real) -> Real:
    """The standard normal density phi(x)."""
    density: Real = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)  # numpy's stubs give Any for a float
    return density


# NOTE: scipy's ndtr is computed from erfc, so Phi(x) keeps full relative accuracy in the negative
# tail (to x = -37); float64 is then enough for GELU everywhere (tests check it against mpmath).
GELU = Ref(lambda x: x * special.ndtr(x), lambda x: special.ndtr(x) + x * normal_pdf(x))


def _gelu_tanh_f(x: np.ndarray) -> np.ndarray:
    # NOTE: 0.5(1 + tanh u) = sigmoid(2u); the left side cancels to 0 for u < -19 even in float64.
    u = SQRT_2_OVER_PI * (x + 0.044715 * x**3)
    return np.asarray(x * special.expit(2 * u))


def _gelu_tanh_df(x: np.ndarray) -> np.ndarray:
    u = SQRT_2_OVER_PI * (x + 0.044715 * x**3)
    s, s_neg = special.expit(2 * u), special.expit(-2 * u)
    return np.asarray(s + x * 2 * s * s_neg * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x))


def _x_sigmoid(k: float) -> Ref:
    """x*sigmoid(k x): silu (k=1) and the sigmoid GELU approximation (k=1.702)."""
    return Ref(
        lambda x: x * special.expit(k * x),
        lambda x: special.expit(k * x) + k * x * special.expit(k * x) * special.expit(-k * x),
    )


def _mish_df(x: np.ndarray) -> np.ndarray:
    sp = np.logaddexp(0.0, x)  # softplus without overflow
    return np.asarray(np.tanh(sp) + x * special.expit(x) / np.cosh(sp) ** 2)


def _sech2(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / np.cosh(x) ** 2)  # not 1 - tanh^2, which loses all digits of the tail


def _gelu_10_df(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(GELU.f(x)) <= 10, GELU.df(x), 0.0)  # clip passes the gradient at the bound


def _mean(refs: list[Ref]) -> Ref:
    """Equal-weight mixture: the learnable `switch` at its initial (zero) logits."""
    return Ref(
        lambda x: np.mean([r.f(x) for r in refs], axis=0),
        lambda x: np.mean([r.df(x) for r in refs], axis=0),
        tuple(sorted({k for r in refs for k in r.kinks})),
    )


RELU = Ref(lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(np.float64), kinks=(0.0,))
SILU = _x_sigmoid(1.0)
GELU_TANH = Ref(_gelu_tanh_f, _gelu_tanh_df)
GELU_SIGMOID = _x_sigmoid(1.702)


def _split(first: Ref, rest: Ref) -> Ref:
    """`first` on the first ceil(C/2) entries of the last axis, `rest` on the others (split_gelu_tanh)."""

    def at(part: str) -> Callable[[np.ndarray], np.ndarray]:
        def apply(x: np.ndarray) -> np.ndarray:
            half = (x.shape[-1] + 1) // 2
            return np.concatenate([getattr(first, part)(x[..., :half]), getattr(rest, part)(x[..., half:])], axis=-1)

        return apply

    return Ref(at("f"), at("df"), tuple(sorted({*first.kinks, *rest.kinks})))


def _exponential_f(x: np.ndarray) -> np.ndarray:
    top = math.exp(EXP_LINEAR_FROM)
    return np.where(x <= EXP_LINEAR_FROM, np.exp(np.minimum(x, EXP_LINEAR_FROM)), top * (x - EXP_LINEAR_FROM + 1))


def _exponential_df(x: np.ndarray) -> np.ndarray:
    return np.where(x <= EXP_LINEAR_FROM, np.exp(np.minimum(x, EXP_LINEAR_FROM)), math.exp(EXP_LINEAR_FROM))


def quantile_centres(x: np.ndarray) -> tuple[np.ndarray, float]:
    """The kernel centres and bandwidth of the quantile activation for one channel whose values are `x`:
    K quantiles of each sign at levels (2k+1)/(2K), order statistic floor((2k+1)n/(2K)) of that sign's n
    values (-inf or +inf for an empty side); Silverman's h = 1.06 std(x) (2K)^(-1/5), at least MIN_BANDWIDTH."""
    k = QUANTILES_PER_SIDE
    ranks = 2 * np.arange(k) + 1
    sides = []
    for values, empty in ((np.sort(x[x < 0]), -np.inf), (np.sort(x[x >= 0]), np.inf)):
        n = len(values)
        sides.append(values[ranks * n // (2 * k)] if n else np.full(k, empty))
    return np.concatenate(sides), max(1.06 * float(np.std(x)) * (2 * k) ** -0.2, MIN_BANDWIDTH)


def _quantile_u(x: np.ndarray) -> tuple[np.ndarray, float]:
    centres, h = quantile_centres(x)
    with np.errstate(invalid="ignore"):
        return (x[:, None] - centres[None, :]) / (math.sqrt(2.0) * h), h


def _quantile_f(x: np.ndarray) -> np.ndarray:
    return np.asarray(special.erf(_quantile_u(x)[0]).mean(axis=1))  # 2F(x) - 1, F the kernel CDF


def _quantile_df(x: np.ndarray) -> np.ndarray:
    u, h = _quantile_u(x)
    return np.asarray(
        (2 / math.sqrt(math.pi) * np.exp(-u * u)).mean(axis=1) / (math.sqrt(2.0) * h)
    )  # context held fixed


# Every registry name, aliases and learnable entries (at their initial parameters) included.
# NOTE: Hugging Face's gelu_fast uses 0.7978845608 for sqrt(2/pi), 3e-12 relative off: far below
# fp32 resolution, so it shares the exact tanh-formula reference.
REFERENCES: dict[str, Ref] = {
    "relu": RELU,
    "leaky_relu": Ref(lambda x: np.where(x > 0, x, 0.01 * x), lambda x: np.where(x > 0, 1.0, 0.01), kinks=(0.0,)),
    "relu2": Ref(lambda x: np.maximum(x, 0.0) ** 2, lambda x: 2 * np.maximum(x, 0.0)),
    "hardswish": Ref(
        lambda x: x * np.clip(x + 3, 0, 6) / 6,
        lambda x: np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6)),
        kinks=(-3.0, 3.0),
    ),
    "mish": Ref(lambda x: x * np.tanh(np.logaddexp(0.0, x)), _mish_df),
    "gelu": GELU,
    "gelu_erfc": GELU,
    "gelu_tanh": GELU_TANH,
    "gelu_sigmoid": GELU_SIGMOID,
    "silu": SILU,
    "sigmoid": Ref(special.expit, lambda x: special.expit(x) * special.expit(-x)),
    "tanh": Ref(np.tanh, _sech2),
    "identity": Ref(lambda x: x, np.ones_like),
    "swish_beta": SILU,  # beta = 1 at init
    "tunable_gelu": GELU,  # tau = 1 at init
    "switch": _mean([RELU, GELU, SILU]),  # ScalarMixture() default acts relu, gelu, silu
    "agelu": _x_sigmoid(float(np.float32(1.702))),  # a = 1 outside a block; beta 1.702 as float32 holds it
    "gelu_new": GELU_TANH,
    "gelu_fast": GELU_TANH,
    "gelu_pytorch_tanh": GELU_TANH,
    "gelu_accurate": GELU_TANH,
    "gelu_python": GELU,
    "gelu_10": Ref(lambda x: np.clip(GELU.f(x), -10, 10), _gelu_10_df),
    "quick_gelu": GELU_SIGMOID,
    "swish": SILU,
    # a 1-D grid is one channel's context (quantile) and one token's channels (split_gelu_tanh), as the registry reads it
    "quantile": Ref(_quantile_f, _quantile_df),
    "energy_gated": Ref(lambda x: x * np.exp(-0.5 * x * x), lambda x: (1 - x * x) * np.exp(-0.5 * x * x)),
    "split_gelu_tanh": _split(GELU, Ref(np.tanh, _sech2)),
    "exponential": Ref(_exponential_f, _exponential_df),
}


def mp_gelu(x: float, dps: int = 40) -> float:
    """Exact GELU x*Phi(x) at one point in mpmath with `dps` digits, via erfc (no cancellation)."""
    with mpmath.workdps(dps):
        x = mpmath.mpf(x)
        return float(x / 2 * mpmath.erfc(-x / mpmath.sqrt(2)))


def mp_gelu_grad(x: float, dps: int = 40) -> float:
    """GELU'(x) = Phi(x) + x*phi(x) at one point in mpmath."""
    with mpmath.workdps(dps):
        x = mpmath.mpf(x)
        return float(mpmath.erfc(-x / mpmath.sqrt(2)) / 2 + x * mpmath.npdf(x))


def mp_gelu_tanh(x: float, dps: int = 40) -> float:
    """The tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) at one point in mpmath, as
    x*sigmoid(2u), which does not cancel where tanh(u) is -1 to working precision."""
    with mpmath.workdps(dps):
        x = mpmath.mpf(x)
        u = mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf("0.044715") * x**3)
        return float(x / (1 + mpmath.exp(-2 * u)))
