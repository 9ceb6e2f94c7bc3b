"""Troubleshooting instead of a pick (`advise --symptom`): the symptoms of seed 002's troubleshooting list (a NaN
loss, slower training, outputs that differ between frameworks), each answered with checks in order
(advice_checks.csv), each check with the ffnlab command that measures it and the source of its place in the order:
the seed's, where issue #38 gives it (init and lr before the activation), else ffnlab's, said to be such."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from ffnlab._util.text import and_list
from ffnlab.study.advise.advice import Advice
from ffnlab.study.advise.evidence import ChecksEvidence
from ffnlab.study.advise.flow import CHECKS, SYMPTOM_NAMES, apply_rule, rule_line
from ffnlab.study.advise.situation import Situation


def advise_symptom(situation: Situation) -> Advice:
    """The checks for the situation's symptom, in order, and the rule that quotes the seed: no variant is picked."""
    symptom = situation.symptom
    assert symptom is not None  # (only a situation with a symptom is troubleshot)
    rule, checks = apply_rule(f"symptom-{symptom}"), list(CHECKS[symptom])
    theirs = [c.check for c in checks if c.source.startswith("seed")]
    ours = [c.check for c in checks if not c.source.startswith("seed")]
    reasons = [
        rule_line(rule),
        f"No variant is picked: the symptom ({SYMPTOM_NAMES[symptom]}) is answered by checks in order, each with "
        "the command that measures it (below). "
        + (f"Placed by the seed: {and_list(theirs)}. " if theirs else "")
        + (f"Placed by ffnlab, not the seed: {and_list(ours)}." if ours else ""),
    ]
    return Advice(
        recommendation="no variant: check " + ", then ".join(c.check for c in checks),
        basis="checks",
        reasons=reasons,
        evidence=ChecksEvidence(symptom, rule.source, rule.quotes),
        alternatives=[],
        rules=[rule],
        checks=checks,
    )


def unused_by_symptom(situation: Situation, store: str | Path | None) -> list[str]:
    """A reason naming the flags given besides the symptom (`situation` as stated, not resolved), which
    troubleshooting does not weigh; none where nothing else was given."""
    named = [
        f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        for f in fields(situation)
        if f.name not in ("stage", "symptom") and getattr(situation, f.name)
    ]
    named += ["--store"] if store is not None else []
    if not named:
        return []
    return [f"{and_list(named)} did not change this: the checks answer the symptom, whatever the situation."]
