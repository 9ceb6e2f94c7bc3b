"""Name handling: one normal form for user-typed names, one 'did you mean' helper, registries keyed by name,
a list of names checked against the valid ones, and ids checked against the names they index."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from ffnlab._util.text import first_few, shorten


def normalize(name: object) -> str:
    """'  Swi-GLU ' -> 'swi_glu': case-insensitive, surrounding space dropped, '-' read as '_'."""
    return str(name).strip().lower().replace("-", "_")


def closest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest valid name, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


class Named(Protocol):
    @property
    def name(self) -> str: ...


Spec = TypeVar("Spec", bound=Named)


def by_name(specs: Iterable[Spec]) -> dict[str, Spec]:
    """A registry table, name -> spec in the order given; ValueError on a name registered twice."""
    table: dict[str, Spec] = {}
    for spec in specs:
        if spec.name in table:
            raise ValueError(f"'{spec.name}' is registered twice")
        table[spec.name] = spec
    return table


def chosen(values: str | Iterable[str], valid: Sequence[str], what: str) -> list[str]:
    """Names from a comma-separated string or a list, lowercased, each one of `valid`, repeats dropped;
    ValueError naming the valid ones for an unknown name or none."""
    items = values.split(",") if isinstance(values, str) else list(values)
    items = [v.strip().lower() for v in items if v.strip()]
    if not items:
        raise ValueError(f"no {what} given; valid: {', '.join(valid)}")
    for v in items:
        if v not in valid:
            raise ValueError(f"unknown {what} '{shorten(v)}'{closest(v, valid)}; valid: {', '.join(valid)}")
    return list(dict.fromkeys(items))


def check_ids(ids: Iterable[object], names: Sequence[str], where: str, what: str, kinds: tuple[str, str]) -> None:
    """ValueError naming `where` and the first of `ids` that is no index into `names` (a ClassLabel column's ids):
    "ds row 1: tag 7 is not a tag id of the 3 tags (B-PER, I-PER, O); valid: 0 to 2" (`what` 'tag', `kinds` the
    names' kind, singular and plural: ('tag', 'tags'))."""
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < len(names)]
    if bad:
        raise ValueError(
            f"{where}: {what} {shorten(repr(bad[0]))} is not a {kinds[0]} id of the {len(names):,} {kinds[1]} "
            f"({first_few(names)}); valid: 0 to {len(names) - 1}"
        )
