"""Numerics of every registered activation: error against an independent high-precision reference.

`run_numerics` measures, per (activation, dtype, pass), the max absolute, relative and ULP error of
the registry's implementation against a float64 reference written here from the formula (never by
calling the code under test), on a dense grid and by region, with inf/NaN counted. Beside that:
the distance of the GELU approximations from exact GELU, the 1+erf vs erfc forms of exact GELU in
the negative tail (mpmath reference), overflow and double rounding of gated products in fp16/bf16,
and a table of claims from articles (ffnlab/claims.json) with the value measured here.

Conventions (they decide what "error" means):
- Input x is the float64 grid rounded to the dtype, and the reference is evaluated at that rounded
  x, so input rounding is not counted as error.
- Backward is the gradient of sum(f(x)) in the dtype against the analytic float64 derivative;
  points exactly at a kink (relu at 0, hardswish at +-3) are skipped, since any subgradient is right.
- ULP error is |y - ref| / ulp(ref), ulp as in `ulp` below (zero and subnormals get the subnormal
  spacing, so a flushed tiny result counts as many ulps, not infinitely many).
- An output that is inf or NaN where the reference is finite has infinite error: it is counted,
  and it sets the max, never dropped. inf where the correctly rounded reference is the same inf
  (a true overflow) is exact.
- float64 suffices for every reference on the grid: scipy's ndtr (from erfc) and expit keep full
  relative accuracy in the tails, and tanh-formula terms are rewritten so nothing cancels (tests
  check each reference against mpmath). The GELU tail section uses mpmath itself.
- Near a zero of f or f' (GELU' at x = -0.75, silu' at -1.28, hardswish' at -1.5) the reference
  is tiny while the usual formula cancels, so relative and ULP errors there are large for any
  implementation of that formula; argmax_ulp_x and the per-region columns show where the max sits.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mpmath
import numpy as np
import scipy
import torch
import torch.nn.functional as F
from scipy import integrate, special

from ffnlab._util import machine
from ffnlab._util.names import closest
from ffnlab.core.activations import ACTIVATIONS, get_activation, resolve
from ffnlab.core.ffn import GATED, ffn_param_count

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_POINTS = 200_001  # step 1e-4 on [-10, 10]; fp16/bf16 hold far fewer distinct values
CLAIMS_PATH = Path(__file__).with_name("claims.json")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TAIL_RANGE = (-10.0, -4.0)  # where 1+erf(x/sqrt2) cancels in fp32

# Regions of the grid reported separately; a point can be in two (x = -5 is in 3-6 and the tail).
REGIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "|x|<1": lambda x: np.abs(x) < 1,
    "1<=|x|<3": lambda x: (np.abs(x) >= 1) & (np.abs(x) < 3),
    "3<=|x|<6": lambda x: (np.abs(x) >= 3) & (np.abs(x) < 6),
    "|x|>=6": lambda x: np.abs(x) >= 6,
    "x<-4": lambda x: x < TAIL_RANGE[1],
}


# ---- float64 references, one per registry name -------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A float64 reference: f(x), its derivative df(x), and the x where df jumps (skipped in backward)."""

    f: Callable[[np.ndarray], np.ndarray]
    df: Callable[[np.ndarray], np.ndarray]
    kinks: tuple[float, ...] = ()


def _pdf(x):
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


# NOTE: scipy's ndtr is computed from erfc, so Phi(x) keeps full relative accuracy in the negative
# tail (to x = -37); float64 is then enough for GELU everywhere (tests check it against mpmath).
GELU = Ref(lambda x: x * special.ndtr(x), lambda x: special.ndtr(x) + x * _pdf(x))


def _gelu_tanh_f(x):
    # NOTE: 0.5(1 + tanh u) = sigmoid(2u); the left side cancels to 0 for u < -19 even in float64.
    u = SQRT_2_OVER_PI * (x + 0.044715 * x**3)
    return x * special.expit(2 * u)


def _gelu_tanh_df(x):
    u = SQRT_2_OVER_PI * (x + 0.044715 * x**3)
    s, s_neg = special.expit(2 * u), special.expit(-2 * u)
    return s + x * 2 * s * s_neg * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


def _x_sigmoid(k: float) -> Ref:
    """x*sigmoid(k x): silu (k=1) and the sigmoid GELU approximation (k=1.702)."""
    return Ref(
        lambda x: x * special.expit(k * x),
        lambda x: special.expit(k * x) + k * x * special.expit(k * x) * special.expit(-k * x),
    )


def _mish_df(x):
    sp = np.logaddexp(0.0, x)  # softplus without overflow
    return np.tanh(sp) + x * special.expit(x) / np.cosh(sp) ** 2


def _sech2(x):
    return 1.0 / np.cosh(x) ** 2  # not 1 - tanh^2, which loses all digits of the tail


def _gelu_10_df(x):
    return np.where(np.abs(GELU.f(x)) <= 10, GELU.df(x), 0.0)  # clip passes the gradient at the bound


def _mean(refs: list[Ref]) -> Ref:
    """Equal-weight mixture: the learnable `switch` at its initial (zero) logits."""
    return Ref(
        lambda x: sum(r.f(x) for r in refs) / len(refs),
        lambda x: sum(r.df(x) for r in refs) / len(refs),
        tuple(sorted({k for r in refs for k in r.kinks})),
    )


RELU = Ref(lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(np.float64), kinks=(0.0,))
SILU = _x_sigmoid(1.0)
GELU_TANH = Ref(_gelu_tanh_f, _gelu_tanh_df)
GELU_SIGMOID = _x_sigmoid(1.702)

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
    "gelu_new": GELU_TANH,
    "gelu_fast": GELU_TANH,
    "gelu_pytorch_tanh": GELU_TANH,
    "gelu_accurate": GELU_TANH,
    "gelu_python": GELU,
    "gelu_10": Ref(lambda x: np.clip(GELU.f(x), -10, 10), _gelu_10_df),
    "quick_gelu": GELU_SIGMOID,
    "swish": SILU,
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


# ---- error metrics ------------------------------------------------------------------------------


def _format(dtype: torch.dtype) -> tuple[int, int, float]:
    """(precision p, smallest normal exponent, largest finite value) of a binary float dtype."""
    info = torch.finfo(dtype)
    return 1 - round(math.log2(info.eps)), round(math.log2(info.tiny)), info.max


def ulp(ref: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Unit in the last place of the exact value `ref` in `dtype`: 2^(e - p + 1) for |ref| in [2^e, 2^(e+1)).

    p is the dtype's precision (24 fp32, 11 fp16, 8 bf16). e is clamped below at the smallest
    normal exponent, so zero and subnormals get the subnormal spacing (2^-149 in fp32), and above
    at the largest, so values past the dtype's max get the top binade's spacing.
    """
    p, e_min, largest = _format(dtype)
    e_max = math.floor(math.log2(largest))
    _, e = np.frexp(np.abs(ref))  # |ref| = m * 2^e with m in [0.5, 1)
    e = np.where(ref == 0, e_min, np.clip(e - 1, e_min, e_max))
    return np.ldexp(1.0, (e - (p - 1)).astype(np.int32))


def round_to(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float64 values correctly rounded (to nearest, ties to even) into `dtype`, kept as float64.

    NOTE: torch's float64 -> float16/bfloat16 cast goes through float32 and so rounds twice
    (1 + 2^-11 + 2^-40 becomes 1, not 1 + 2^-10); a reference must round once, so this rounds
    the significand to p bits directly. Below the normal range the spacing stays that of the
    subnormals; past the largest finite value the result is +-inf.
    """
    p, e_min, largest = _format(dtype)
    v = np.asarray(values, dtype=np.float64)
    _, e = np.frexp(v)  # v = m * 2^e, m in [0.5, 1): the spacing there is 2^(e - p)
    e = np.maximum(e, e_min + 1)
    with np.errstate(invalid="ignore"):
        r = np.ldexp(np.round(np.ldexp(v, p - e)), e - p)  # np.round ties to even
        return np.where(np.abs(r) > largest, np.copysign(np.inf, v), r)


def error_stats(y: np.ndarray, ref: np.ndarray, x: np.ndarray, dtype: torch.dtype) -> dict:
    """Max absolute, relative and ULP error of `y` (dtype results as float64) against float64 `ref`.

    inf/NaN in `y` are counted (n_inf, n_nan; n_overflow: inf where the rounded reference is
    finite) and count as infinite error, so the max reports them. Relative error is err/|ref|,
    0 where both are 0 and inf where only the reference is.
    """
    n = len(y)
    ref_rounded = round_to(ref, dtype)
    with np.errstate(all="ignore"):
        err = np.abs(y - ref)
        err = np.where(np.isinf(y) & (y == ref_rounded), 0.0, err)  # true overflow is exact
        err = np.where(np.isnan(err), np.inf, err)
        rel = np.where(err == 0, 0.0, err / np.abs(ref))
        ulps = err / ulp(ref, dtype)
    out = {
        "n_points": n,
        "max_abs_err": None,
        "argmax_x": None,
        "max_rel_err": None,
        "max_ulp": None,
        "argmax_ulp_x": None,
        "n_inf": int(np.isinf(y).sum()),
        "n_nan": int(np.isnan(y).sum()),
        "n_overflow": int((np.isinf(y) & np.isfinite(ref_rounded)).sum()),
    }
    if n:
        i, j = int(np.argmax(err)), int(np.argmax(ulps))
        out.update(max_abs_err=float(err[i]), max_rel_err=float(rel.max()), max_ulp=float(ulps[j]))
        if err[i] > 0:  # with no error anywhere there is no "where"
            out.update(argmax_x=float(x[i]), argmax_ulp_x=float(x[j]))
    return out


def _row(name, dtype_name, direction, x, y, ref) -> dict:
    """One result row: overall stats plus the same stats per region."""
    dtype = DTYPES[dtype_name]
    row = {"name": name, "dtype": dtype_name, "pass": direction, **error_stats(y, ref, x, dtype)}
    row["regions"] = {}
    for region, inside in REGIONS.items():
        m = inside(x)
        stats = error_stats(y[m], ref[m], x[m], dtype)
        row["regions"][region] = {k: stats[k] for k in ("n_points", "max_abs_err", "max_rel_err", "max_ulp")}
    return row


# ---- per-activation measurement -----------------------------------------------------------------


def grid(lo: float, hi: float, points: int, dtype: torch.dtype) -> tuple[np.ndarray, int]:
    """The float64 grid linspace(lo, hi, points) rounded to `dtype`, distinct values only, as float64.

    Returns (x, n_out_of_range): points beyond the dtype's max round to inf and are left out.
    """
    x = round_to(np.linspace(lo, hi, points), dtype)
    finite = np.isfinite(x)
    return np.unique(x[finite]), int((~finite).sum())


def measure_activation(name: str, dtype_name: str, x: np.ndarray) -> list[dict]:
    """Forward and backward rows for one activation in one dtype on the (already rounded) grid `x`."""
    dtype, ref = DTYPES[dtype_name], REFERENCES[name]
    act = get_activation(name).to(dtype).requires_grad_(False)  # learnable ones at their initial params
    xt = torch.from_numpy(x).to(dtype).requires_grad_()
    y = act(xt)
    y.backward(torch.ones_like(y))  # the gradient of sum(f(x))
    with np.errstate(all="ignore"):
        f, df = ref.f(x), ref.df(x)
    fwd = _row(name, dtype_name, "forward", x, y.detach().double().numpy(), f)
    smooth = ~np.isin(x, ref.kinks)
    bwd = _row(name, dtype_name, "backward", x[smooth], xt.grad.double().numpy()[smooth], df[smooth])
    bwd["n_kinks_skipped"] = int((~smooth).sum())
    return [fwd, bwd]


# ---- GELU approximations against exact GELU ------------------------------------------------------


def gelu_approximations() -> list[str]:
    """Registry names that approximate GELU with a tanh or sigmoid formula (HF aliases included)."""
    canon = ("gelu_tanh", "gelu_sigmoid")
    return [n for n, s in ACTIVATIONS.items() if n in canon or s.same_as in canon]


def gelu_distance(name: str, lo: float = -10.0, hi: float = 10.0, points: int = DEFAULT_POINTS) -> dict:
    """How far a GELU approximation is from exact GELU: its float64 formula, and its fp32 implementation.

    max_rel_err_pos is over x > 0 only: for x < 0 both tend to 0 at different rates, so the
    relative distance goes to 100% in the far tail and says nothing about the approximation.
    """
    x = np.linspace(lo, hi, points)
    ref, exact = REFERENCES[name], GELU
    with np.errstate(all="ignore"):
        d = np.abs(ref.f(x) - exact.f(x))
        d_grad = np.abs(ref.df(x) - exact.df(x))
        pos = x > 0
        rel = d[pos] / np.abs(exact.f(x[pos]))
    x32 = torch.from_numpy(x).float()
    impl = get_activation(name)(x32).double().numpy()
    d32 = np.abs(impl - exact.f(x32.double().numpy()))
    i = int(np.argmax(d))
    out = {
        "name": name,
        "same_as": ACTIVATIONS[name].same_as,
        "max_abs_err": float(d[i]),
        "argmax_x": float(x[i]),
        "max_rel_err_pos": None,
        "argmax_rel_x": None,
        "max_abs_err_grad": float(d_grad.max()),
        "max_abs_err_fp32_impl": float(d32.max()),
    }
    if pos.any():
        j = int(np.argmax(rel))
        out.update(max_rel_err_pos=float(rel[j]), argmax_rel_x=float(x[pos][j]))
    return out


# ---- exact GELU in the negative tail: 1+erf against erfc ---------------------------------------

TAIL_NAMES = ("gelu", "gelu_python", "gelu_erfc")  # F.gelu and HF's 1+erf form, then the erfc form
TAIL_SAMPLES = (-4.0, -5.0, -5.5, -6.0, -7.0, -8.0, -10.0)


def gelu_tail(points: int = 301, dtype_name: str = "fp32") -> dict:
    """Exact GELU's 1+erf forms against the erfc form on x in [-10, -4], mpmath reference.

    NOTE: in fp32 erf(x/sqrt2) is -1 to within an ulp below x = -5.5, so 1 + erf returns 0 (or
    one ulp of 1, 6e-8) where Phi(x) is 1e-8 .. 1e-23: all significant digits are gone.
    """
    dtype = DTYPES[dtype_name]
    x = np.unique(round_to(np.linspace(*TAIL_RANGE, points), dtype))
    f = np.array([mp_gelu(v) for v in x])
    df = np.array([mp_gelu_grad(v) for v in x])
    rows, values = [], {}
    for name in TAIL_NAMES:
        xt = torch.from_numpy(x).to(dtype).requires_grad_()
        y = get_activation(name)(xt)
        y.backward(torch.ones_like(y))
        values[name] = y.detach().double().numpy()
        for direction, got, want in (("forward", values[name], f), ("backward", xt.grad.double().numpy(), df)):
            s = error_stats(got, want, x, dtype)
            rows.append(
                {
                    "name": name,
                    "pass": direction,
                    **{k: s[k] for k in ("max_abs_err", "argmax_x", "max_rel_err", "max_ulp", "n_inf", "n_nan")},
                }
            )
    samples = []
    for v in TAIL_SAMPLES:
        k = int(np.argmin(np.abs(x - v)))
        samples.append({"x": float(x[k]), "reference": float(f[k]), **{n: float(values[n][k]) for n in TAIL_NAMES}})
    return {
        "dtype": dtype_name,
        "range": list(TAIL_RANGE),
        "reference": "mpmath, 40 digits",
        "rows": rows,
        "samples": samples,
    }


# ---- gated products in low precision ---------------------------------------------------------------

GATED_NAMES = ("swiglu", "geglu", "reglu")
GATED_SCALES = (1.0, 10.0, 100.0, 1000.0)


def gated_products(dtype_names=("fp16", "bf16"), scales=GATED_SCALES, n: int = 1 << 16, seed: int = 0) -> list[dict]:
    """Overflow rate and rounding error of act(a)*b for a, b ~ N(0, s^2), eager vs fused, float64 reference.

    eager: act(a) in the dtype, then * b in the dtype (two roundings, what `silu(a) * b` does).
    fused: act and product in fp32, rounded to the dtype once (what a fused kernel does).
    frac_inf_exact is the fraction whose exact product overflows the dtype: the floor for any kernel.
    mean_ulp leaves out those true overflows (no finite answer is right there).
    NOTE: at large s, very negative a gives products far below the typical size that fp32 silu
    (exp(-a) overflows for a < -88.7) and erf-form gelu (1+erf cancels for a < -5.5) return as 0;
    those count in the ulp columns even though they are negligible next to the other products.
    """
    rows = []
    for ffn in GATED_NAMES:
        act_name = GATED[ffn].acts[0]
        act, ref = get_activation(act_name), REFERENCES[act_name]
        for dtype_name in dtype_names:
            dtype = DTYPES[dtype_name]
            gen = torch.Generator().manual_seed(seed)
            for s in scales:
                a = (torch.randn(n, generator=gen, dtype=torch.float64) * s).to(dtype)
                b = (torch.randn(n, generator=gen, dtype=torch.float64) * s).to(dtype)
                eager = (act(a) * b).double().numpy()
                fused = (act(a.float()) * b.float()).to(dtype).double().numpy()
                with np.errstate(all="ignore"):
                    exact = ref.f(a.double().numpy()) * b.double().numpy()
                exact_rounded = round_to(exact, dtype)
                row = {
                    "ffn": ffn,
                    "act": act_name,
                    "dtype": dtype_name,
                    "scale": s,
                    "n": n,
                    "frac_inf_exact": float(np.isinf(exact_rounded).mean()),
                }
                for mode, y in (("eager", eager), ("fused", fused)):
                    with np.errstate(all="ignore"):
                        err = np.where(np.isinf(y) & (y == exact_rounded), 0.0, np.abs(y - exact))
                        ulps = np.where(np.isnan(err), np.inf, err) / ulp(exact, dtype)
                    ok = np.isfinite(exact_rounded)  # no finite answer is right where the exact value overflows
                    row[f"frac_inf_{mode}"] = float(np.isinf(y).mean())
                    row[f"max_ulp_{mode}"] = float(ulps.max())
                    row[f"mean_ulp_{mode}"] = float(ulps[ok].mean()) if ok.any() else None
                    row[f"frac_correctly_rounded_{mode}"] = float((y == exact_rounded).mean())
                rows.append(row)
    return rows


# ---- claims: measurement functions named by claims.json -------------------------------------------


def _time_once(fn, x) -> float:
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


def measure_gelu_approx_max_error(approx: str, lo: float = -10.0, hi: float = 10.0) -> dict:
    """Max |approx(x) - GELU(x)| of the float64 formulas and |x| where it occurs (the distance is even in x)."""
    d = gelu_distance(approx, lo, hi)
    return {"max_abs_err": d["max_abs_err"], "at_abs_x": abs(d["argmax_x"])}


def measure_gelu_approx_rel_error_above(approx: str, x_min: float, hi: float = 10.0) -> dict:
    """Max relative distance |approx - GELU| / |GELU| over x in (x_min, hi]."""
    x = np.linspace(x_min, hi, 100_001)[1:]
    g = GELU.f(x)
    return {"max_rel_err": float(np.max(np.abs(REFERENCES[approx].f(x) - g) / np.abs(g)))}


def measure_time_ratio(numerator: str, denominator: str, n: int = 1 << 22, repeats: int = 9) -> dict:
    """Median forward time of registry fn `numerator` over that of `denominator`, fp32, same process.

    Runs are interleaved after a warm-up so drift on a shared machine hits both alike.
    """
    fa, fb = ACTIVATIONS[resolve(numerator)].fn, ACTIVATIONS[resolve(denominator)].fn
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(2):
            fa(x), fb(x)
        ta, tb = [], []
        for _ in range(repeats):
            ta.append(_time_once(fa, x))
            tb.append(_time_once(fb, x))
    return {"ratio": statistics.median(ta) / statistics.median(tb)}


def measure_gated_param_ratio(d_model: int = 768) -> dict:
    """Gated/dense parameter ratio at the same d_ff = 4 d_model, and at gated d_ff = 8/3 d_model (no bias)."""
    dense = ffn_param_count("dense", d_model, 4 * d_model, bias=False)
    if (8 * d_model) % 3:
        raise ValueError(f"d_model must be a multiple of 3 for d_ff = 8/3 d_model, got {d_model}")
    return {
        "ratio_same_d_ff": ffn_param_count("gated", d_model, 4 * d_model, bias=False) / dense,
        "ratio_d_ff_8_3": ffn_param_count("gated", d_model, 8 * d_model // 3, bias=False) / dense,
    }


def measure_gelu_std_reduction() -> dict:
    """1 - std(GELU(X)) for X ~ N(0, 1), by quadrature of the float64 reference."""
    pdf = lambda t: GELU.f(t) * _pdf(t)
    m1 = integrate.quad(pdf, -np.inf, np.inf)[0]
    m2 = integrate.quad(lambda t: GELU.f(t) ** 2 * _pdf(t), -np.inf, np.inf)[0]
    return {"std_reduction": 1.0 - math.sqrt(m2 - m1 * m1)}


def measure_relu_inactive_fraction(n: int = 1 << 20, seed: int = 0) -> dict:
    """Fraction of relu outputs that are 0 for N(0,1) inputs, and for zero-mean skewed inputs (Exp(1) - 1)."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=gen)
    skewed = torch.empty(n).exponential_(1.0, generator=gen) - 1.0
    return {
        "inactive_fraction": float((F.relu(normal) == 0).float().mean()),
        "inactive_fraction_skewed": float((F.relu(skewed) == 0).float().mean()),
    }


def measure_torch_gelu_default() -> dict:
    """The installed torch's default GELU (signature of nn.GELU and the value of F.gelu(1)); history unknowable here."""
    import inspect

    default = inspect.signature(torch.nn.GELU.__init__).parameters["approximate"].default
    one = torch.tensor(1.0, dtype=torch.float64)
    exact = abs(F.gelu(one).item() - mp_gelu(1.0)) < 1e-12
    behaves = "none" if exact else "tanh"
    return {
        "installed_default": default if default == behaves else f"{default} (signature) / {behaves} (values)",
        "changed_in_2_0": None,
    }


MEASURES: dict[str, Callable[..., dict]] = {
    f.__name__.removeprefix("measure_"): f
    for f in (
        measure_gelu_approx_max_error,
        measure_gelu_approx_rel_error_above,
        measure_time_ratio,
        measure_gated_param_ratio,
        measure_gelu_std_reduction,
        measure_relu_inactive_fraction,
        measure_torch_gelu_default,
    )
}
VERDICTS = ("holds", "does not hold", "not measurable here")


def check(measured, claimed, rule: dict) -> bool | None:
    """Whether one measured value supports the claimed one under `rule`; None if not measured.

    Rules: {"rel": t} |m - c| <= t|c|; {"abs": t} |m - c| <= t; {"gt": true} m > c; {"lt": true} m < c;
    {"eq": true} m == c.
    """
    if measured is None:
        return None
    if "rel" in rule:
        return abs(measured - claimed) <= rule["rel"] * abs(claimed)
    if "abs" in rule:
        return abs(measured - claimed) <= rule["abs"]
    if "gt" in rule:
        return measured > claimed
    if "lt" in rule:
        return measured < claimed
    if "eq" in rule:
        return measured == claimed
    raise ValueError(f"unknown claim rule {rule}; valid: rel, abs, gt, lt, eq")


def verdict(parts: list[bool | None]) -> str:
    """A claim holds if every part holds; one failing part sinks it; otherwise it is not measurable here."""
    if any(p is False for p in parts):
        return "does not hold"
    return "not measurable here" if any(p is None for p in parts) else "holds"


def _fmt_values(values: dict) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())


def load_claims(path: str | Path = CLAIMS_PATH) -> list[dict]:
    """The claims file as a list of dicts; ValueError if a claim names an unknown measurement."""
    claims = json.loads(Path(path).read_text())["claims"]
    for c in claims:
        if c["measure"] not in MEASURES:
            raise ValueError(
                f"claim {c['id']}: unknown measure '{c['measure']}'{closest(c['measure'], MEASURES)}; "
                f"valid: {', '.join(MEASURES)}"
            )
    return claims


def run_claims(path: str | Path = CLAIMS_PATH) -> list[dict]:
    """Measure every claim in the claims file: claimed and measured values, per-part and overall verdict."""
    rows = []
    for c in load_claims(path):
        measured = MEASURES[c["measure"]](**c.get("args", {}))
        parts = {k: check(measured.get(k), v, c["rule"][k]) for k, v in c["claimed"].items()}
        labels = {True: "holds", False: "does not hold", None: "not measurable here"}
        rows.append(
            {
                "id": c["id"],
                "claim": c["claim"],
                "source": c["source"],
                "claimed": _fmt_values(c["claimed"]),
                "measured": _fmt_values(measured),
                "verdict": verdict(list(parts.values())),
                "note": c.get("note", ""),
                "claimed_values": c["claimed"],
                "measured_values": measured,
                "parts": {k: labels[p] for k, p in parts.items()},
            }
        )
    return rows


# ---- the whole run ------------------------------------------------------------------------------


def parse_names(names) -> list[str]:
    """Registry names from None (all), a comma-separated string, or a list; ValueError on unknown ones."""
    if names is None:
        return list(ACTIVATIONS)
    items = names.split(",") if isinstance(names, str) else list(names)
    items = [n.strip() for n in items if n.strip()]
    if not items:
        raise ValueError("no activation named; give comma-separated registry names, e.g. gelu,silu")
    return list(dict.fromkeys(resolve(n) for n in items))


def parse_dtypes(dtypes) -> list[str]:
    """dtype names from a comma-separated string or a list; ValueError on unknown ones."""
    items = dtypes.split(",") if isinstance(dtypes, str) else list(dtypes)
    items = [d.strip().lower() for d in items if d.strip()]
    if not items:
        raise ValueError(f"no dtype given; valid: {', '.join(DTYPES)}")
    for d in items:
        if d not in DTYPES:
            raise ValueError(f"unknown dtype '{d}'{closest(d, DTYPES)}; valid: {', '.join(DTYPES)}")
    return list(dict.fromkeys(items))


def parse_range(text: str) -> tuple[float, float]:
    """'LO,HI' as two floats with LO < HI, both finite; ValueError otherwise."""
    parts = str(text).split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"range must be 'LO,HI' with two numbers, e.g. -10,10; got '{text}'") from None
    check_range(lo, hi)
    return lo, hi


def check_range(lo: float, hi: float) -> None:
    """ValueError unless lo < hi and both are finite."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"range must be finite, got [{lo}, {hi}]")
    if lo >= hi:
        raise ValueError(f"range is empty or reversed: [{lo}, {hi}]; need LO < HI, e.g. -10,10")


def environment() -> dict:
    """The run environment (`ffnlab._util.machine.environment`) plus the libraries the references use."""
    return {
        **machine.environment(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "mpmath": mpmath.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cpus",
    }


def run_numerics(
    names=None,
    dtypes=("fp32", "fp16", "bf16"),
    lo: float = -10.0,
    hi: float = 10.0,
    points: int | None = DEFAULT_POINTS,
    claims: bool = True,
) -> dict:
    """Every section of `ffnlab numerics` as one dict; `to_json` makes it strict JSON.

    Keys: results (per activation, dtype, pass), gelu_distance (of the named GELU approximations),
    tail (fp32, always), gated (fp16/bf16 among `dtypes`), claims (unless claims=False), and the
    setup (range, points, dtypes, environment). points=None means DEFAULT_POINTS.
    """
    names, dtypes = parse_names(names), parse_dtypes(dtypes)
    lo, hi = float(lo), float(hi)
    check_range(lo, hi)
    points = DEFAULT_POINTS if points is None else points
    if int(points) < 2:
        raise ValueError(f"points must be at least 2, got {points}")
    results = []
    for dtype_name in dtypes:
        x, n_out = grid(lo, hi, int(points), DTYPES[dtype_name])
        if len(x) == 0:
            raise ValueError(f"range [{lo}, {hi}] lies entirely beyond {dtype_name}'s largest value")
        for name in names:
            for row in measure_activation(name, dtype_name, x):
                row["n_out_of_range"] = n_out
                results.append(row)
    approx = [n for n in gelu_approximations() if n in names]
    return {
        "range": [lo, hi],
        "points": int(points),
        "dtypes": dtypes,
        "environment": environment(),
        "results": results,
        "gelu_distance": [gelu_distance(n, lo, hi, int(points)) for n in approx],
        "tail": gelu_tail(),
        "gated": gated_products([d for d in dtypes if d != "fp32"]),
        "claims": run_claims() if claims else [],
    }


def json_safe(obj):
    """`obj` with inf/NaN floats replaced by the strings 'inf', '-inf', 'nan' (JSON has no such literals)."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def to_json(report: dict) -> str:
    """The report as strict JSON (no NaN/Infinity literals)."""
    return json.dumps(json_safe(report), indent=1, allow_nan=False)


# ---- text output --------------------------------------------------------------------------------


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (bool, str)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def format_numerics(report: dict) -> str:
    """Readable tables of a `run_numerics` report."""
    env = report["environment"]
    lo, hi = report["range"]
    out = [
        f"ffnlab numerics: x in [{lo:g}, {hi:g}], {report['points']} grid points rounded to each dtype; "
        "float64 reference (scipy), mpmath in the GELU tail",
        f"torch {env['torch']}, numpy {env['numpy']}, scipy {env['scipy']}, mpmath {env['mpmath']}, "
        f"Python {env['python']}, {env['machine']}, {env.get('cpu') or '?'} (torch kernels: "
        f"{env.get('isa') or '?'}), {env['torch_threads']} torch threads",
        "",
    ]

    regions = list(REGIONS)
    out.append(
        "Error against the reference (ulp: unit in the last place of the reference in the dtype; inf/nan/ovf: counts)"
    )
    head = (
        f"{'name':<18} {'dtype':<5} {'pass':<8} {'max_abs':>9} {'at_x':>7} {'max_rel':>9} {'max_ulp':>9} "
        f"{'at_x':>7} | " + " ".join(f"{r:>9}" for r in regions) + f" | {'inf':>4} {'nan':>4} {'ovf':>4}"
    )
    out += [head, "-" * len(head)]
    for r in report["results"]:
        out.append(
            f"{r['name']:<18} {r['dtype']:<5} {r['pass']:<8} {_fmt(r['max_abs_err']):>9} "
            f"{_fmt(r['argmax_x']):>7} {_fmt(r['max_rel_err']):>9} {_fmt(r['max_ulp']):>9} "
            f"{_fmt(r['argmax_ulp_x']):>7} | "
            + " ".join(f"{_fmt(r['regions'][g]['max_ulp']):>9}" for g in regions)
            + f" | {r['n_inf']:>4} {r['n_nan']:>4} {r['n_overflow']:>4}"
        )
    out.append("(columns after the first | are max_ulp per region of x)")

    if report["gelu_distance"]:
        out += [
            "",
            "GELU approximations against exact GELU (float64 formulas; last column: fp32 implementation)",
            f"{'name':<18} {'same_as':<13} {'max_abs':>9} {'at_x':>7} {'max_rel x>0':>11} {'at_x':>7} "
            f"{'grad max_abs':>12} {'fp32 max_abs':>12}",
        ]
        for d in report["gelu_distance"]:
            out.append(
                f"{d['name']:<18} {d['same_as'] or '':<13} {_fmt(d['max_abs_err']):>9} "
                f"{_fmt(d['argmax_x']):>7} {_fmt(d['max_rel_err_pos']):>11} {_fmt(d['argmax_rel_x']):>7} "
                f"{_fmt(d['max_abs_err_grad']):>12} {_fmt(d['max_abs_err_fp32_impl']):>12}"
            )

    tail = report["tail"]
    out += [
        "",
        f"Exact GELU in the negative tail, {tail['dtype']}, x in {tail['range']}, reference {tail['reference']}",
        f"{'name':<12} {'pass':<8} {'max_rel':>9} {'max_ulp':>9} {'max_abs':>9} {'at_x':>7}",
    ]
    for r in tail["rows"]:
        out.append(
            f"{r['name']:<12} {r['pass']:<8} {_fmt(r['max_rel_err']):>9} {_fmt(r['max_ulp']):>9} "
            f"{_fmt(r['max_abs_err']):>9} {_fmt(r['argmax_x']):>7}"
        )
    out.append(f"{'x':>6} {'mpmath':>11} " + " ".join(f"{n:>11}" for n in TAIL_NAMES))
    for s in tail["samples"]:
        out.append(f"{s['x']:>6g} {s['reference']:>11.4g} " + " ".join(f"{s[n]:>11.4g}" for n in TAIL_NAMES))

    if report["gated"]:
        n = report["gated"][0]["n"]
        out += [
            "",
            f"Gated products act(a)*b, a, b ~ N(0, s^2), {n} samples: eager (act and * in the dtype, two "
            "roundings) vs fused (fp32 inside, one rounding)",
            f"{'ffn':<7} {'dtype':<5} {'s':>6} | {'inf exact':>9} {'inf eager':>9} {'inf fused':>9} | "
            f"{'max_ulp eager':>13} {'fused':>7} | {'mean_ulp eager':>14} {'fused':>7} | "
            f"{'rounded ok eager':>16} {'fused':>7}",
        ]
        for g in report["gated"]:
            out.append(
                f"{g['ffn']:<7} {g['dtype']:<5} {g['scale']:>6g} | {_fmt(g['frac_inf_exact']):>9} "
                f"{_fmt(g['frac_inf_eager']):>9} {_fmt(g['frac_inf_fused']):>9} | "
                f"{_fmt(g['max_ulp_eager']):>13} {_fmt(g['max_ulp_fused']):>7} | "
                f"{_fmt(g['mean_ulp_eager']):>14} {_fmt(g['mean_ulp_fused']):>7} | "
                f"{_fmt(g['frac_correctly_rounded_eager']):>16} {_fmt(g['frac_correctly_rounded_fused']):>7}"
            )
        out.append(
            "(inf: fraction of products that are inf; ulp errors at large s come from tiny products of very "
            "negative a, which fp32 silu/gelu flush to 0)"
        )

    if report["claims"]:
        out += ["", "Claims from articles, measured here"]
        for c in report["claims"]:
            out.append(f"{c['id']}. {c['claim']}  [{c['source']}]")
            out.append(f"   claimed: {c['claimed']}")
            out.append(f"   measured: {c['measured']}")
            out.append(f"   -> {c['verdict'].upper()}" + (f"  ({c['note']})" if c["note"] else ""))
    return "\n".join(out)
