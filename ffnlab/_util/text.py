"""Text for people: numbers with SI or binary suffixes, settings as key=value, one-line error summaries
and user strings and lists of names shortened for them."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence


def human(value: float | None, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI suffixes k, M, G); '-' for None."""
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}{unit}"
    return f"{value:.3g}{unit}"


def sci(x: float) -> str:
    """Compact scientific notation, for FLOPs: 1e12, 1.2e12."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def human_bytes(n: float) -> str:
    """3 * 2**20 -> '3 MiB' (binary suffixes)."""
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def num(value: float | None, digits: int = 4) -> str:
    """A number for a table, '-' for missing or non-finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def key_values(mapping: Mapping[str, object]) -> str:
    """{'depth': 2, 'lr': 0.001} -> 'depth=2, lr=0.001' (a study cell's axis values, for one)."""
    return ", ".join(f"{key}={value}" for key, value in mapping.items())


def first_line(e: BaseException, limit: int = 300) -> str:
    """'TypeName: first line' of an exception, without terminal colour codes, at most `limit` characters."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:limit]


def shorten(text: object, limit: int = 60) -> str:
    """A string the user typed, for an error message: as it is up to `limit` characters, else its
    start, '…' and its length ('yyyy… (100,000 characters)'), so the message stays readable."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def and_list(names: list[str]) -> str:
    """['gelu'] -> 'gelu', ['gelu', 'relu'] -> 'gelu and relu', three or more -> 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def first_few(names: Sequence[object], shown: int = 8) -> str:
    """Names from the user's data (tags, classes, columns, files), for an error message: the first `shown`,
    each `shorten`ed, then 'and N more' ('a, b, c and 19,997 more'), so the message stays one readable line."""
    listed = ", ".join(shorten(name) for name in names[:shown])
    return listed + (f" and {len(names) - shown:,} more" if len(names) > shown else "")


PYTHON_FORMAT = warnings.formatwarning


def one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """ffnlab's own warnings as one line, as its errors are ("ffnlab: warning: ..."): the file and line of the
    code that warned mean nothing to a user. Other libraries' warnings keep Python's format. Installed as
    warnings.formatwarning by the CLI and in a sweep's worker processes."""
    if category.__module__.startswith("ffnlab."):
        return f"ffnlab: warning: {message}\n"
    return PYTHON_FORMAT(message, category, filename, lineno, line)
