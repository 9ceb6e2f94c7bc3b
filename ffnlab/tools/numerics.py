"""`ffnlab numerics` as one library call: check the inputs, run every section, return one report.

`run_numerics` gathers, for the named activations and dtypes: the error of each against its exact
reference (`ffnlab.tools.accuracy`, references in `ffnlab.tools.references`; with int8 inputs and
outputs, `ffnlab.tools.int8`'s implementations of it), the GELU
approximations' distance from exact GELU, exact GELU in the negative tail, gated products in
fp16/bf16, and the claims table (`ffnlab.tools.claims`), with the environment that produced them.
`to_json` makes the report strict JSON; `format_numerics` (`ffnlab.tools.numerics_text`) prints it.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from typing import Any

import mpmath
import numpy as np
import scipy
import torch

from ffnlab._util import machine
from ffnlab._util.jsonio import strict_dumps
from ffnlab._util.names import chosen
from ffnlab._util.ranges import check_range
from ffnlab._util.text import shorten
from ffnlab.core.activations import ACTIVATIONS, resolve
from ffnlab.tools.accuracy import (
    DEFAULT_POINTS,
    DTYPES,
    gated_products,
    gelu_approximations,
    gelu_distance,
    gelu_tail,
    grid,
    measure_activation,
)
from ffnlab.tools.claims import run_claims
from ffnlab.tools.int8 import int8_acts_for, measure_int8
from ffnlab.tools.numerics_text import format_numerics

__all__ = [
    "check_range",
    "environment",
    "format_numerics",
    "parse_dtypes",
    "parse_names",
    "parse_range",
    "run_numerics",
    "to_json",
]


def parse_names(names: str | Iterable[str] | None) -> list[str]:
    """Registry names from None (all), a comma-separated string, or a list; ValueError on unknown ones."""
    if names is None:
        return list(ACTIVATIONS)
    items = names.split(",") if isinstance(names, str) else list(names)
    items = [n.strip() for n in items if n.strip()]
    if not items:
        raise ValueError("no activation named; give comma-separated registry names, e.g. gelu,silu")
    return list(dict.fromkeys(resolve(n) for n in items))


INT8 = "int8"  # not a float format: its rows come from ffnlab.tools.int8 (the "int8" section)
VALID_DTYPES = (*DTYPES, INT8)


def parse_dtypes(dtypes: str | Iterable[str]) -> list[str]:
    """dtype names from a comma-separated string or a list; ValueError on unknown ones."""
    return chosen(dtypes, VALID_DTYPES, "dtype")


def parse_range(text: str) -> tuple[float, float]:
    """'LO,HI' as two floats with LO < HI, both finite; ValueError otherwise."""
    parts = str(text).split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"range must be 'LO,HI' with two numbers, e.g. -10,10; got '{shorten(text)}'") from None
    check_range(lo, hi)
    return lo, hi


def environment() -> dict[str, Any]:
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
    names: str | Iterable[str] | None = None,
    dtypes: str | Iterable[str] = ("fp32", "fp16", "bf16"),
    lo: float = -10.0,
    hi: float = 10.0,
    points: int | None = DEFAULT_POINTS,
    claims: bool = True,
) -> dict[str, Any]:
    """Every section of `ffnlab numerics` as one dict; `to_json` makes it strict JSON.

    Keys: results (per activation, float dtype, pass), int8 (with int8 among `dtypes`: per int8
    implementation of a named activation, `ffnlab.tools.int8.measure_int8`, on every int8 code in the
    range), gelu_distance (of the named GELU approximations), tail (fp32, always), gated (fp16/bf16
    among `dtypes`), claims (unless claims=False), and the setup (range, points, dtypes, environment).
    points=None means DEFAULT_POINTS.
    """
    names, dtypes = parse_names(names), parse_dtypes(dtypes)
    lo, hi = float(lo), float(hi)
    check_range(lo, hi)
    points = DEFAULT_POINTS if points is None else points
    if int(points) < 2:
        raise ValueError(f"points must be at least 2, got {points}")
    results = []
    for dtype_name in (d for d in dtypes if d != INT8):
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
        "int8": [measure_int8(impl, lo, hi) for name in names for impl in int8_acts_for(name)]
        if INT8 in dtypes
        else [],
        "gelu_distance": [gelu_distance(n, lo, hi, int(points)) for n in approx],
        "tail": gelu_tail(),
        "gated": gated_products([d for d in dtypes if d not in ("fp32", INT8)]),
        "claims": run_claims() if claims else [],
    }


def to_json(report: dict[str, Any]) -> str:
    """The report as strict JSON (no NaN/Infinity literals: `ffnlab._util.jsonio.json_safe`)."""
    return strict_dumps(report)
