"""The x range of a curve or a grid, as the user typed it: one check shared by numerics and plots."""

from __future__ import annotations

import math


def check_range(lo: float, hi: float, example: str = "-10,10") -> None:
    """ValueError unless lo < hi, both finite and hi - lo finite (a grid's step is (hi - lo) / n)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"range must be finite, got [{lo}, {hi}]")
    if lo >= hi:
        raise ValueError(f"range is empty or reversed: [{lo}, {hi}]; need LO < HI, e.g. {example}")
    if not math.isfinite(hi - lo):
        raise ValueError(f"range [{lo}, {hi}] is wider than a float holds (HI - LO overflows); narrow it")
