"""Error of every registered activation against its exact reference, in fp32, fp16 and bf16.

`measure_activation` gives, per (activation, dtype, pass), the max absolute, relative and ULP error
of the registry's implementation against the float64 reference (`ffnlab.tools.references`) on a
grid, overall and by region, with inf/NaN counted. Beside that: the distance of the GELU
approximations from exact GELU, the 1+erf vs erfc forms of exact GELU in the negative tail (mpmath
reference), and overflow and double rounding of gated products in fp16/bf16.

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
- Near a zero of f or f' (GELU' at x = -0.75, silu' at -1.28, hardswish' at -1.5) the reference
  is tiny while the usual formula cancels, so relative and ULP errors there are large for any
  implementation of that formula; argmax_ulp_x and the per-region columns show where the max sits.
- An activation whose output reads more than its own element (`ActSpec.scope`) is measured on the
  grid as the registry reads a 1-D input, and its rows say so in `note` (`SCOPE_NOTES`): for the
  quantile activation the grid is one channel's context, so its error is that of ranking the grid's
  points among themselves, and the ULP error near its data-dependent zero crossing is large for any
  sum of erf terms of both signs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ffnlab.core.activations import ACTIVATIONS, get_activation
from ffnlab.core.ffn import GATED
from ffnlab.tools.references import GELU, REFERENCES, mp_gelu, mp_gelu_grad

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_POINTS = 200_001  # step 1e-4 on [-10, 10]; fp16/bf16 hold far fewer distinct values
TAIL_RANGE = (-10.0, -4.0)  # where 1+erf(x/sqrt2) cancels in fp32

# what a row measures for an activation that reads more than its own element, by its scope
SCOPE_NOTES = {
    "channel": "channel-dependent: the grid is one token's channels, and the reference treats each as that channel",
    "batch": "batch-dependent: the grid's points are the tokens of one channel, each ranked among all of them; "
    "the reference is the float64 formula on the same points, its derivative with that context held fixed; "
    "near its zero crossing, a sum of erf terms of both signs cancels, so the ULPs there measure that",
}

# Regions of the grid reported separately; a point can be in two (x = -5 is in 3-6 and the tail).
REGIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "|x|<1": lambda x: np.abs(x) < 1,
    "1<=|x|<3": lambda x: (np.abs(x) >= 1) & (np.abs(x) < 3),
    "3<=|x|<6": lambda x: (np.abs(x) >= 3) & (np.abs(x) < 6),
    "|x|>=6": lambda x: np.abs(x) >= 6,
    "x<-4": lambda x: x < TAIL_RANGE[1],
}


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


def error_stats(y: np.ndarray, ref: np.ndarray, x: np.ndarray, dtype: torch.dtype) -> dict[str, float | None]:
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
    out: dict[str, float | None] = {
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


def _row(name: str, dtype_name: str, direction: str, x: np.ndarray, y: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """One result row: overall stats plus the same stats per region."""
    dtype = DTYPES[dtype_name]
    row: dict[str, Any] = {"name": name, "dtype": dtype_name, "pass": direction, **error_stats(y, ref, x, dtype)}
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


def measure_activation(name: str, dtype_name: str, x: np.ndarray) -> list[dict[str, Any]]:
    """Forward and backward rows for one activation in one dtype on the (already rounded) grid `x`."""
    dtype, ref = DTYPES[dtype_name], REFERENCES[name]
    act = get_activation(name).to(dtype).requires_grad_(False)  # learnable ones at their initial params
    xt = torch.from_numpy(x).to(dtype).requires_grad_()
    y = act(xt)
    (grad,) = torch.autograd.grad(y, xt, torch.ones_like(y))  # the gradient of sum(f(x))
    with np.errstate(all="ignore"):
        f, df = ref.f(x), ref.df(x)
    fwd = _row(name, dtype_name, "forward", x, y.detach().double().numpy(), f)
    smooth = ~np.isin(x, ref.kinks)
    bwd = _row(name, dtype_name, "backward", x[smooth], grad.double().numpy()[smooth], df[smooth])
    bwd["n_kinks_skipped"] = int((~smooth).sum())
    for row in (fwd, bwd):
        row["note"] = SCOPE_NOTES.get(ACTIVATIONS[name].scope)  # None for an elementwise activation
    return [fwd, bwd]


# ---- GELU approximations against exact GELU ------------------------------------------------------


def gelu_approximations() -> list[str]:
    """Registry names that approximate GELU with a tanh or sigmoid formula (HF aliases included)."""
    canon = ("gelu_tanh", "gelu_sigmoid")
    return [n for n, s in ACTIVATIONS.items() if n in canon or s.same_as in canon]


def gelu_distance(name: str, lo: float = -10.0, hi: float = 10.0, points: int = DEFAULT_POINTS) -> dict[str, Any]:
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


def gelu_tail(points: int = 301, dtype_name: str = "fp32") -> dict[str, Any]:
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
        (grad,) = torch.autograd.grad(y, xt, torch.ones_like(y))
        values[name] = y.detach().double().numpy()
        for direction, got, want in (("forward", values[name], f), ("backward", grad.double().numpy(), df)):
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


def gated_products(
    dtype_names: Sequence[str] = ("fp16", "bf16"),
    scales: Sequence[float] = GATED_SCALES,
    n: int = 1 << 16,
    seed: int = 0,
) -> list[dict[str, Any]]:
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
