"""Activations on int8 inputs and outputs: one table of implementations, each measured against its float64 reference.

An int8 inference runtime keeps a layer's output in int8 and must apply the activation to int8 codes.
How it can do that decides what an activation costs there:

    gelu_lut        a 256-entry table, indexed by the input code: any function, correctly rounded
    i_gelu          I-BERT's integer-only GELU (Kim et al. 2021, arXiv:2101.01321): a second-order
                    polynomial for erf in integer arithmetic, no table
    hardswish_int8  x*relu6(x+3)/6 with integer adds, a clamp and one integer product
    relu_int8       max(q, 0) on the codes, the input's scale kept: nothing to compute

Conventions (what `ffnlab numerics --dtypes int8` measures):
- Symmetric per-tensor scales: a real x is stored as q = clamp(round(x / s), -127, 127), read as q*s.
- Calibration: s = max|x| / 127 over the calibration inputs; the output's scale is the same over the
  reference f at those inputs. ReLU's output keeps the input's scale (same_scale), which is what
  makes it exact.
- The input is every int8 code in range, x = q*s_in, and the reference is f at that x, so input
  rounding is not counted as error (as for the float dtypes).
- Error is in output units: |s_out*q_out - f(x)| / s_out; 0.5 is correctly rounded, the best any
  int8 output can do.
- Rescaling an integer result to the output scale is integer too: the real multiplier M is a dyadic
  number m / 2^shift (m < 2^31), and q_out = (acc*m + 2^(shift-1)) >> shift, as I-BERT and gemmlowp do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ffnlab._util.names import closest
from ffnlab._util.text import shorten
from ffnlab.tools.accuracy import REGIONS
from ffnlab.tools.references import REFERENCES

QMAX = 127  # symmetric int8: codes -127..127 (-128 unused, so that -q is always a code)
IBERT = "Kim et al. 2021, I-BERT: Integer-only BERT Quantization (arXiv:2101.01321)"

Codes = np.ndarray  # int64 array of int8 codes


def calibrate(values: np.ndarray) -> float:
    """The symmetric per-tensor scale of `values`: max|values| / 127; ValueError when they are all 0."""
    top = float(np.max(np.abs(values))) if len(values) else 0.0
    if not top > 0 or not math.isfinite(top):
        raise ValueError(f"cannot calibrate an int8 scale on values whose max |x| is {top}")
    return top / QMAX


def quantize(x: np.ndarray, scale: float) -> Codes:
    """Real values to int8 codes at `scale`: round to nearest (ties to even), clamped to -127..127."""
    return np.clip(np.round(np.asarray(x, dtype=np.float64) / scale), -QMAX, QMAX).astype(np.int64)


def dyadic(multiplier: float) -> tuple[int, int]:
    """(m, shift) with m / 2^shift = `multiplier` to 31 significant bits, 2^30 <= |m| < 2^31, shift > 0."""
    if not math.isfinite(multiplier) or multiplier == 0:
        raise ValueError(f"rescaling multiplier {multiplier} has no dyadic form")
    fraction, exponent = math.frexp(multiplier)  # multiplier = fraction * 2^exponent, 0.5 <= |fraction| < 1
    m, shift = round(fraction * 2**31), 31 - exponent
    if abs(m) == 2**31:  # rounding carried into the next power of two
        m, shift = m // 2, shift - 1
    if shift <= 0:
        raise ValueError(f"rescaling multiplier {multiplier} is too large for a dyadic number")
    return m, shift


def rescale(acc: np.ndarray, multiplier: float) -> Codes:
    """An integer result at real scale `multiplier` (relative to the output scale) as int8 codes, in integer
    arithmetic: (acc*m + 2^(shift-1)) >> shift, rounding half up, then clamped."""
    m, shift = dyadic(multiplier)
    acc = np.asarray(acc, dtype=np.int64)
    if int(np.max(np.abs(acc), initial=0)) * abs(m) >= 2**62:
        raise ValueError("integer product overflows int64 while rescaling")
    return np.asarray(np.clip((acc * m + (1 << (shift - 1))) >> shift, -QMAX, QMAX))


# ---- the implementations: (codes, input scale, output scale) -> codes -----------------------------


def relu_int8(q: Codes, s_in: float, s_out: float) -> Codes:
    """ReLU on int8 codes: max(q, 0), the output at the input's scale (no table, no rescaling)."""
    return np.asarray(np.maximum(q, 0))


def hardswish_int8(q: Codes, s_in: float, s_out: float) -> Codes:
    """Hard-swish x*relu6(x+3)/6 in integers (Howard et al. 2019, MobileNetV3, arXiv:1905.02244): 3 and 6
    as codes of the input scale, a clamp, one product at scale s_in^2, then rescaled by s_in^2 / (6 s_out).

    NOTE: 3 and 6 are rounded to the input's grid, so the kinks move by up to half a step."""
    three, six = round(3.0 / s_in), round(6.0 / s_in)
    if six >= 2**31:
        raise ValueError(f"hard-swish's 6 is {six:.3g} input steps, beyond 32 bits")
    gate = np.clip(q + three, 0, six)  # relu6(x + 3), in steps of s_in
    return rescale(q * gate, s_in * s_in / (6.0 * s_out))


# I-BERT's erf polynomial: erf(x) ~ sgn(x) [a (min(|x|, -b) + b)^2 + 1]  (section 3.4, eq. 8)
IBERT_A, IBERT_B = -0.2888, -1.769


def i_erf(q: Codes, scale: float) -> tuple[np.ndarray, float]:
    """I-BERT's i-ERF (Algorithm 2) on integers q at `scale`: integers and their scale approximating erf(q*scale).

    I-POLY (Algorithm 1) of a(x + b)^2 + c with c = 1: q_b = floor(b/S), q_c = floor(c/(a S^2)), and
    (q + q_b)^2 + q_c at scale a S^2; |q| is clipped at -q_b first, where the polynomial has reached 1."""
    q_b = math.floor(IBERT_B / scale)
    q_c = math.floor(1.0 / (IBERT_A * scale * scale))
    if max(q_b * q_b, abs(q_c)) >= 2**40:  # squares and the product in i_gelu would overflow int64
        raise ValueError(f"i-ERF's integers at scale {scale:.3g} need more than 64 bits")
    clipped = np.minimum(np.abs(q), -q_b)
    return np.sign(q) * ((clipped + q_b) ** 2 + q_c), IBERT_A * scale * scale


def i_gelu(q: Codes, s_in: float, s_out: float) -> Codes:
    """I-BERT's integer-only GELU (Algorithm 2): x * (erf(x/sqrt2) + 1) / 2 with i-ERF at scale S/sqrt2,
    1 as the integer floor(1/S_erf), one product, then rescaled to the output scale.

    NOTE: I-BERT's released code also shifts the erf integers right by 14 bits against int32 overflow
    of its 32-bit inputs; with int8 inputs the products stay below 2^26, so this keeps every bit."""
    q_erf, s_erf = i_erf(q, s_in / math.sqrt(2.0))
    q_one = math.floor(1.0 / s_erf)
    acc = q * (q_erf + q_one)  # at scale s_in * s_erf / 2 (negative: a < 0 flips both signs)
    return rescale(acc, s_in * s_erf / 2.0 / s_out)


def lut(reference: str) -> Callable[[Codes, float, float], Codes]:
    """A 256-entry lookup table of the float64 reference, built for the two scales and indexed by the code."""

    def apply(q: Codes, s_in: float, s_out: float) -> Codes:
        codes = np.arange(-QMAX, QMAX + 1)
        table = quantize(REFERENCES[reference].f(codes * s_in), s_out)  # what a runtime precomputes
        return np.asarray(table[q + QMAX])

    apply.__doc__ = f"{reference} by a 256-entry lookup table of its float64 values, rounded to the output scale."
    return apply


@dataclass(frozen=True)
class Int8Act:
    """An activation implemented on int8 codes."""

    name: str
    reference: str  # the registry activation it computes (ffnlab.core.activations)
    fn: Callable[[Codes, float, float], Codes]  # (input codes, input scale, output scale) -> output codes
    method: str
    table_bytes: int  # memory of its lookup table; 0 for integer arithmetic alone
    paper: str
    same_scale: bool = False  # the output keeps the input's scale (no output calibration)


INT8_ACTS: dict[str, Int8Act] = {
    a.name: a
    for a in [
        Int8Act("gelu_lut", "gelu", lut("gelu"), "256-entry lookup table", 256, "any function of one int8 input"),
        Int8Act("i_gelu", "gelu", i_gelu, "integer polynomial for erf (I-BERT), no table", 0, IBERT),
        Int8Act(
            "hardswish_int8",
            "hardswish",
            hardswish_int8,
            "integer add, clamp, product, rescale; no table",
            0,
            "Howard et al. 2019, MobileNetV3 (arXiv:1905.02244)",
        ),
        Int8Act("relu_int8", "relu", relu_int8, "max(q, 0), input scale kept; no table", 0, "Nair & Hinton 2010", True),
    ]
}


def get_int8_act(name: str) -> Int8Act:
    """The INT8_ACTS entry for `name`; ValueError naming the valid ones."""
    key = name.strip().lower().replace("-", "_")
    if key not in INT8_ACTS:
        raise ValueError(
            f"unknown int8 activation '{shorten(name)}'{closest(key, INT8_ACTS)}; valid: {', '.join(INT8_ACTS)}"
        )
    return INT8_ACTS[key]


def int8_acts_for(reference: str) -> list[str]:
    """The INT8_ACTS entries that compute the registry activation `reference`."""
    return [name for name, a in INT8_ACTS.items() if a.reference == reference]


def _stats(x: np.ndarray, y: np.ndarray, ref: np.ndarray, s_out: float) -> dict[str, Any]:
    """The error columns of a numerics row (n_points, max_abs_err, max_rel_err, max_ulp) over the points `x`."""
    if not len(x):
        return {"n_points": 0, "max_abs_err": None, "max_rel_err": None, "max_ulp": None}
    err = np.abs(y - ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0, 0.0, err / np.abs(ref))
    return {
        "n_points": len(x),
        "max_abs_err": float(err.max()),
        "max_rel_err": float(rel.max()),
        "max_ulp": float(err.max() / s_out),
    }


def measure_int8(name: str, lo: float = -10.0, hi: float = 10.0) -> dict[str, Any]:
    """One numerics row for an int8 implementation on [lo, hi]: input scale calibrated on the range
    (max(|lo|, |hi|) / 127, so nothing clips), the output's on the reference there, then every code in
    [lo, hi] through the implementation. Errors as the module says (max_ulp in units of the output scale)."""
    act = get_int8_act(name)
    s_in = calibrate(np.array([lo, hi]))
    q = np.arange(math.ceil(lo / s_in - 1e-9), math.floor(hi / s_in + 1e-9) + 1, dtype=np.int64)
    x = q * s_in
    with np.errstate(all="ignore"):
        ref = REFERENCES[act.reference].f(x)
    s_out = s_in if act.same_scale else calibrate(ref)
    try:
        y = act.fn(q, s_in, s_out) * s_out
    except (OverflowError, ValueError, ZeroDivisionError) as e:  # scales so far from 1 that integers do not fit
        raise ValueError(f"int8 {act.name} cannot run on [{lo:g}, {hi:g}] (input scale {s_in:.3g}): {e}") from None
    stats = _stats(x, y, ref, s_out)
    err = np.abs(y - ref)
    i = int(np.argmax(err))
    return {
        "name": act.name,
        "reference": act.reference,
        "dtype": "int8",
        "pass": "forward",
        "method": act.method,
        "table_bytes": act.table_bytes,
        "scale_in": s_in,
        "scale_out": s_out,
        **stats,
        "argmax_x": float(x[i]) if err[i] > 0 else None,
        "argmax_ulp_x": float(x[i]) if err[i] > 0 else None,
        "n_inf": 0,
        "n_nan": 0,
        "n_overflow": int(np.sum(np.abs(ref / s_out) > QMAX + 0.5)),  # beyond the output's codes: clipped
        "regions": {region: _stats(x[m], y[m], ref[m], s_out) for region, m in ((g, f(x)) for g, f in REGIONS.items())},
    }
