"""The rules of the decision flow (ffnlab.study.advise.flow, advice_rules.csv) as they apply to a situation: those that
only inform (model size, the context's share of the cost, GPU memory, the task type) and those that prefer
variants (their `picks`), ranked as the flow ranks them, and how the latter narrow the candidates the evidence
then picks from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ffnlab._util.text import human_bytes
from ffnlab.study.advise.flow import (
    DEFAULT_SEQ_LEN,
    HARDWARE_MEMORY,
    Rule,
    apply_rule,
    ffn_flop_share,
    memory_rule,
    size_text,
    size_tier,
    tier_rule,
)
from ffnlab.study.advise.situation import Situation
from ffnlab.study.published import GATED_AT_SCALE

# how a rule's picks read in a sentence
PICK_NAMES = {"gated": "a GLU variant"}


def size_rule(size: float) -> Rule:
    """The small-, mid- or large-model rule for a model of `size` parameters."""
    large = "; ".join(f"{g.model}: {g.source}" for g in GATED_AT_SCALE)
    names = ", ".join(f"{g.model} ({g.params}, {g.ffn})" for g in GATED_AT_SCALE)
    return apply_rule(f"{size_tier(size)}-model", size=size_text(size), large_models=large, large_names=names)


def situation_rules(situation: Situation) -> list[Rule]:
    """The rules of the model-size, sequence-length, GPU-memory and task-type branches that apply."""
    rules, size = [], situation.model_size
    if size:
        rules.append(size_rule(size))
    if situation.seq_len:
        d, n = situation.d_model, situation.seq_len
        rule = "long-context" if situation.long_context else "short-context"
        rules.append(apply_rule(rule, seq_len=n, d_model=d, share=ffn_flop_share(d, n), short=ffn_flop_share(d, 512)))
    if size and situation.hardware and HARDWARE_MEMORY.get(situation.hardware):
        rules.append(memory_rule(situation.hardware, size, situation.seq_len or DEFAULT_SEQ_LEN))
    if situation.task_type:
        rules.append(apply_rule(f"task-{situation.task_type}"))
    return rules


def preferences(situation: Situation) -> list[Rule]:
    """The rules that apply and prefer variants, highest first: the hardware (mobile; the VRAM tier, which
    stands in for a memory estimate only while the model size is unknown), the priority, the large-model
    rule (published), long text, the depth tier; or, with nothing stated, the first-attempt rule."""
    if situation.first_attempt:
        return [apply_rule("first-attempt")]
    rules = []
    if situation.hardware == "mobile":
        rules.append(apply_rule("mobile-swish"))
    if situation.vram and not situation.model_size:
        assert situation.memory_budget is not None  # the VRAM is the memory budget on a GPU
        vram = human_bytes(situation.memory_budget)
        rules.append(apply_rule(tier_rule("vram", situation.vram), hardware=situation.hardware, vram=vram))
    if situation.priority:
        rules.append(apply_rule(f"priority-{situation.priority}"))
    if situation.model_size and size_tier(situation.model_size) == "large":
        rules.append(size_rule(situation.model_size))
    if situation.long_context:
        rules.append(apply_rule("long-text", seq_len=situation.seq_len, d_model=situation.d_model))
    if situation.depth:
        rules.append(apply_rule(tier_rule("depth", situation.depth), depth=situation.depth))
    return rules


@dataclass(frozen=True)
class Narrowed:
    """The candidates left after the rules that prefer variants, and what each rule did."""

    candidates: list[str]
    moved: list[Rule]  # the rules that changed the best candidate: they, not the evidence, decided
    overruled: list[Rule]  # the rules none of whose preferred variants was left by the rules above them


def narrow(candidates: list[str], rules: list[Rule], better_first: Callable[[str], float]) -> Narrowed:
    """Each rule in turn keeps the candidates it prefers, where it prefers any; `better_first` orders the
    candidates by the evidence, so a rule moved the choice where the best candidate changed."""
    moved, overruled = [], []
    for rule in rules:
        if not rule.picks:
            continue
        kept = [n for n in candidates if rule.prefers(n)]
        if not kept:
            overruled.append(rule)
            continue
        if min(kept, key=better_first) != min(candidates, key=better_first):
            moved.append(rule)
        candidates = kept
    return Narrowed(candidates, moved, overruled)


def picks_text(rule: Rule) -> str:
    """A rule's preferred variants in a sentence: 'gelu or silu', 'a GLU variant'."""
    return " or ".join(PICK_NAMES.get(p, p) for p in rule.picks)


def decided_line(moved: list[Rule], evidence_pick: str, evidence: str) -> str:
    """The reason saying that rules, not the evidence, decided the pick, and what the evidence alone picks."""
    named = ", ".join(f"{r.rule} ({r.evidence})" for r in moved)
    return (
        f"A rule, not a measurement, decided this pick: {named}. By {evidence} alone it would be "
        f"{evidence_pick}; measure the two on your data to decide by evidence (command below)."
    )


def overruled_line(rule: Rule) -> str:
    """The reason saying a rule did not decide, because the rules above it left none of its variants."""
    return (
        f"The {rule.rule} rule prefers {picks_text(rule)}, which the constraints and rules above it left out, so "
        "it did not decide."
    )
