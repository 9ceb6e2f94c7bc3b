"""JSON that survives NaN and inf: strict JSON has no literal for them, so they travel as strings."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def json_safe(obj: Any) -> Any:
    """A copy of `obj` that strict JSON can hold, and that compares equal after a round trip.

    Non-finite floats become 'nan', 'inf' or '-inf'; tuples become lists; numpy scalars become
    the Python value they hold. Dicts and lists are copied recursively; anything else is returned
    as it is.
    """
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # str gives exactly 'nan', 'inf', '-inf'
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
