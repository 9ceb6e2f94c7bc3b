"""Name handling: one normal form for user-typed names and one 'did you mean' helper."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def normalize(name: object) -> str:
    """'  Swi-GLU ' -> 'swi_glu': case-insensitive, surrounding space dropped, '-' read as '_'."""
    return str(name).strip().lower().replace("-", "_")


def closest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest valid name, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""
