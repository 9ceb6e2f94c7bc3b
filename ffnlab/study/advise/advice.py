"""The result of `ffnlab advise`: the `Advice` record, its JSON (`advise --json`) and its text for the terminal."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ffnlab._util.text import key_values
from ffnlab.study.advise.evidence import Alternative, Evidence
from ffnlab.study.advise.flow import SYMPTOM_NAMES, Check, Rule
from ffnlab.study.advise.situation import Situation

Basis = Literal["pretrained", "measured", "published", "checks"]
BASIS_TEXT = {
    "measured": "from your measurements",
    "published": "from published results",
    "pretrained": "from the pretrained model",
    "checks": "troubleshooting: the checks below, in order",
}
# fields `to_json` leaves out where they do not apply (None); every other field is always there
APPLIES_TO_SOME = ("cells", "cell", "implementation", "situation", "branch", "decided_by", "checks")


@dataclass(frozen=True)
class Advice:
    """A recommendation and what it rests on: what `advise` returns, `format_advice` prints and `to_json`
    is `advise --json` of."""

    recommendation: str  # an FFN variant ('depends on the cell' where measured cells disagree; for a symptom, none)
    basis: Basis  # the source of evidence: a pretrained model, measurements in a store, published results; or
    # checks, where a symptom is troubleshot instead of a variant picked
    reasons: list[str]  # sentences; an applied rule's marked with its evidence
    evidence: Evidence  # what it rests on, of the basis's kind (evidence.py)
    alternatives: list[Alternative]  # every other variant: its numbers, or why it is out
    cells: list[Advice] | None = None  # measured with several cells left: each cell's own advice
    command: str | None = None  # the `ffnlab compare` command that measures the question on your data
    cell: dict[str, Any] | None = None  # one cell's advice: the cell's axis values
    rules: list[Rule] = field(default_factory=list)  # the decision flow's rules applied (ffnlab.study.advise.flow)
    implementation: str | None = None  # for inference: the fastest exact way to run the checkpoint's FFN
    situation: Situation | None = None  # the inputs, checked and resolved (the whole advice's, not a cell's)
    branch: str | None = None  # the branch of the flow taken: 'pretrain/published', 'inference/pretrained', ...
    decided_by: list[str] | None = None  # the rules that decided the pick where the evidence did not (None: it did)
    checks: list[Check] | None = None  # what to check, in order, each with the command that measures it

    def to_json(self) -> dict[str, Any]:
        """`advise --json`: every field in order, those that do not apply here left out."""
        out = {
            "recommendation": self.recommendation,
            "basis": self.basis,
            "reasons": self.reasons,
            "evidence": self.evidence.to_json(),
            "alternatives": [a.to_json() for a in self.alternatives],
            "cells": None if self.cells is None else [c.to_json() for c in self.cells],
            "command": self.command,
            "cell": self.cell,
            "rules": [asdict(r) for r in self.rules],
            "implementation": self.implementation,
            "situation": None if self.situation is None else self.situation.to_json(),
            "branch": self.branch,
            "decided_by": self.decided_by,
            "checks": None if self.checks is None else [asdict(c) for c in self.checks],
        }
        return {name: value for name, value in out.items() if value is not None or name not in APPLIES_TO_SOME}


def format_advice(advice: Advice) -> str:
    """The advice as text for the terminal."""
    decided = f"; decided by a rule: {', '.join(advice.decided_by)}" if advice.decided_by else ""
    out = [f"recommendation: {advice.recommendation}  ({BASIS_TEXT[advice.basis]}{decided})"]
    if advice.implementation:
        out.append(f"implementation: {advice.implementation}")
    out += ["", "why:"]
    out += [f"  - {r}" for r in advice.reasons]
    if advice.alternatives:
        out += ["", "alternatives:"]
        out += [f"  - {a.line()}" for a in advice.alternatives]
    if advice.checks:
        out += ["", f"checks for {SYMPTOM_NAMES[advice.checks[0].symptom]}, in order:"]
        for n, check in enumerate(advice.checks, 1):
            out += [f"  {n}. {check.check} ({check.source}): {check.why}", f"     measure: {check.command}"]
    source = advice.evidence.source_line()
    if source:
        out += ["", source]
    for cell in advice.cells or []:
        body = format_advice(replace(cell, command=None)).splitlines()
        out += ["", f"cell {key_values(cell.cell or {})}:"] + [f"  {line}" if line else "" for line in body]
    if advice.command:
        out += ["", f"measure it on your data: {advice.command}"]
    return "\n".join(out)
