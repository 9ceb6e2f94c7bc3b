"""Advice from published results when nothing was measured: Shazeer (2020) Table 1 (ffnlab.study.published),
said to be such, with the `ffnlab compare` command that would measure the question on the user's own data."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ffnlab._util.text import human_bytes
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.study.advise.advice import Advice
from ffnlab.study.advise.command import compare_command
from ffnlab.study.advise.evidence import Alternative, NarrowerModel, PublishedAlternative, PublishedEvidence
from ffnlab.study.advise.flow import (
    CHECKS,
    DEFAULT_SEQ_LEN,
    Rule,
    apply_rule,
    budget_exclusions,
    model_shape,
    rule_line,
    size_text,
    training_memory_estimate,
    variant_params,
    widest_that_fits,
)
from ffnlab.study.advise.rules import (
    Narrowed,
    decided_line,
    narrow,
    overruled_line,
    preferences,
    situation_rules,
)
from ffnlab.study.advise.situation import Situation
from ffnlab.study.published import SHAZEER_2020_65K, SHAZEER_2020_524K, ModelShape, PublishedTable


@dataclass
class PublishedChoice:
    """The published variants weighed for a situation: which are out, the best, the tied, the rules that narrowed
    them, and the pick."""

    excluded: dict[str, str]  # variant -> why a budget rules it out
    best: str  # of the eligible variants: what the published table alone picks
    tied: list[str]  # eligible variants within the reported spread of the best
    narrowed: Narrowed  # the rules that prefer variants, applied to the eligible ones
    choice: str
    cheaper: Rule | None = None  # the cpu-cheap rule, where cost moved the choice among tied variants
    fit: Rule | None = None  # the memory-fit rule, where nothing fits at the stated size
    fit_shape: ModelShape | None = None  # the narrower model it fits

    @property
    def decided_by(self) -> list[Rule]:
        """The rules that decided the pick rather than the published numbers."""
        return [r for r in (self.fit, *self.narrowed.moved, self.cheaper) if r is not None]


def published_exclusions(situation: Situation) -> dict[str, str]:
    """Variant -> why a budget rules it out, estimated at the stated model size (none without one)."""
    if not situation.model_size or not (situation.params_budget or situation.memory_budget):
        return {}
    return budget_exclusions(
        list(SHAZEER_2020_65K.values),
        situation.model_size,
        situation.seq_len or DEFAULT_SEQ_LEN,
        situation.params_budget,
        situation.memory_budget,
    )


def planned_shape(situation: Situation) -> ModelShape:
    """The published shape nearest the model size, at the planned depth where one is given."""
    assert situation.model_size is not None
    shape = model_shape(situation.model_size)
    return replace(shape, n_layers=situation.depth) if situation.depth else shape


def fit_narrower(situation: Situation, excluded: dict[str, str]) -> tuple[Rule, ModelShape]:
    """Where every variant is over the memory budget at the stated size: the memory-fit rule, GELU at the widest
    width that fits. ValueError where a smaller width is no answer: the parameter budget is below the stated
    size itself, or not even d_model 64 fits."""
    size, memory = situation.model_size, situation.memory_budget
    assert size is not None  # budgets rule variants out only at a stated size
    shape, seq_len = planned_shape(situation), situation.seq_len or DEFAULT_SEQ_LEN
    smallest, why = next(iter(excluded.items()))  # the table starts with the dense relu
    over_params = situation.params_budget and variant_params("gelu", size, shape) > situation.params_budget
    narrower = None if over_params or not memory else widest_that_fits("gelu", shape, seq_len, memory)
    if narrower is None:
        raise ValueError(
            f"no published variant fits the budgets at {size_text(size)} parameters, "
            f"not even {smallest}: {why}; raise a budget, shorten --seq-len or give a smaller --model-size"
        )
    assert memory is not None  # what the narrower model was fitted to
    rule = apply_rule(
        "memory-fit",
        size=size_text(size),
        budget=human_bytes(memory),
        seq_len=seq_len,
        dense=human_bytes(training_memory_estimate("gelu", size, shape, seq_len)),
        d_model=narrower.d_model,
        layers=narrower.n_layers,
        params=size_text(narrower.params),
        memory=human_bytes(training_memory_estimate("gelu", narrower.params, narrower, seq_len)),
    )
    return rule, narrower


def choose_published(situation: Situation) -> PublishedChoice:
    """The best published variant within the budgets (GELU at a smaller width where none fits), among those the
    rules that prefer variants leave (rules.preferences: Swish or HardSwish on mobile hardware, the VRAM tier, the
    priority, SwiGLU for a large model, GEGLU for long text, the depth tier; GELU for a first attempt); then,
    when cost counts, the cheapest activation among those tied with it."""
    values, spread = SHAZEER_2020_65K.values, SHAZEER_2020_65K.spread
    excluded = published_exclusions(situation)
    eligible = [n for n in values if n not in excluded]
    fit, fit_shape = fit_narrower(situation, excluded) if not eligible else (None, None)
    eligible = eligible or ["gelu"]
    best = min(eligible, key=values.__getitem__)
    # tied: the gap is within the larger of the two reported inter-run standard deviations
    tied = [n for n in eligible if n != best and values[n] - values[best] <= max(spread[n], spread[best])]
    narrowed = narrow(eligible, preferences(situation), values.__getitem__)
    choice = min(narrowed.candidates, key=values.__getitem__)
    picked = PublishedChoice(excluded, best, tied, narrowed, choice, fit=fit, fit_shape=fit_shape)
    if situation.cost_sensitive and not situation.long_context:
        level = [n for n in narrowed.candidates if values[n] - values[choice] <= max(spread[n], spread[choice])]
        flops = {n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops for n in level}
        cheapest = min(level, key=lambda n: (flops[n], values[n]))
        if cheapest != choice:
            picked = replace(picked, choice=cheapest, cheaper=apply_rule("cpu-cheap"))
    return picked


def advise_published(situation: Situation) -> Advice:
    """Advice from Shazeer (2020) Table 1 when nothing was measured: the best variant within the
    budgets, or the one the situation's rules prefer, saying when a rule decided."""
    table, long_run = SHAZEER_2020_65K, SHAZEER_2020_524K
    picked = choose_published(situation)
    choice, best, tied = picked.choice, picked.best, picked.tied
    values, spread, name = table.values, table.spread, table.names
    cite = f"{table.source} (arXiv:{table.arxiv}), {table.table.split(',')[0]}"
    reasons = [
        f"No measurements given (no --store), so this rests on published results: {cite}; {table.metric}, "
        f"{table.setup}.",
    ]
    if picked.decided_by:
        alone = min(values, key=values.__getitem__) if picked.fit else best  # (with a fit, nothing else fits)
        reasons.append(decided_line(picked.decided_by, f"{alone} ({values[alone]:.3f})", "the published table"))
    dense = [n for n in ("relu", "gelu") if n != choice]
    reasons += [
        f"{name[choice]} {values[choice]:.3f} (std {spread[choice]:.3f}) vs "
        + " and ".join(f"{name[n]} {values[n]:.3f}" for n in dense)
        + f" at 65,536 steps; at 524,288 steps {long_run.values[choice]:.3f} vs "
        + " and ".join(f"{long_run.values[n]:.3f}" for n in dense)
        + ".",
        "Every gated variant beats every dense one in that table at both lengths, at equal parameters and compute.",
    ]
    if tied:
        gaps = ", ".join(f"{name[n]} {values[n]:.3f} (std {spread[n]:.3f})" for n in tied)
        reasons.append(
            f"Within the reported run-to-run spread of {name[best]} {values[best]:.3f}: {gaps}; "
            "the paper's numbers do not separate them."
        )
    reasons += published_situation_reasons(situation, picked)
    reasons += [overruled_line(r) for r in picked.narrowed.overruled]
    rules = [apply_rule("budget-exclusion", ffn=n, why=why) for n, why in picked.excluded.items()]
    rules += [r for r in (picked.fit,) if r] + preferences(situation) + [r for r in (picked.cheaper,) if r]
    rules += [r for r in situation_rules(situation) if r.rule not in {applied.rule for applied in rules}]
    reasons += [rule_line(r) for r in rules]
    reasons.append(
        "Measure it on your own data before committing (command below): published gaps of "
        "0.01-0.05 nats need several seeds to confirm."
    )
    # what the rules prefer is measured too, beside the published best ('gated' names no one variant)
    preferred = [p for r in preferences(situation) for p in r.picks if p != "gated"]
    variants = list(dict.fromkeys([choice, best, *tied, *preferred, "gelu", "relu"]))
    fits = NarrowerModel(choice, picked.fit_shape) if picked.fit_shape else None
    return Advice(
        recommendation=choice,
        basis="published",
        reasons=reasons,
        evidence=PublishedEvidence((table, long_run), fits),
        alternatives=published_alternatives(table, long_run, choice, picked.excluded),
        command=compare_command(
            variants,
            None,
            situation.depth,
            seeds=5 if situation.priority == "research" else 3,
            task="image" if situation.task_type == "cv" else None,
        ),
        rules=rules,
        decided_by=[r.rule for r in picked.decided_by] or None,
        checks=list(CHECKS["gradient"]) if situation.first_attempt else None,
    )


def published_situation_reasons(situation: Situation, picked: PublishedChoice) -> list[str]:
    """What the situation changed about the published pick: cost, hardware, budgets, depth."""
    values, choice, best = SHAZEER_2020_65K.values, picked.choice, picked.best
    reasons = []
    if picked.cheaper:
        before = min(picked.narrowed.candidates, key=values.__getitem__)
        flops = {n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops for n in (choice, before)}
        why = "latency-sensitive" if situation.latency_sensitive else f"{situation.deploy} deployment"
        reasons.append(
            f"Cost counts here ({why}): {choice}'s activation costs about {flops[choice]} FLOPs per element "
            f"against {flops[before]} for {before}'s (ffnlab's estimate), so the cheaper of the tied variants wins."
        )
    if situation.hardware == "mobile" and choice != best:
        reasons.append(
            f"{choice} trails the best published variant ({best}) by {values[choice] - values[best]:.3f} nats."
        )
    if picked.excluded:
        assert situation.model_size is not None  # budgets rule variants out only at a stated size
        reasons.append(
            f"Budgets rule out {', '.join(picked.excluded)} at {size_text(situation.model_size)} parameters, so the "
            + (
                f"pick is among the rest ({best} {values[best]:.3f} is the best of them)."
                if not picked.fit
                else "model must be narrower to fit (rule below)."
            )
        )
    elif situation.params_budget or situation.memory_budget:
        reasons.append(
            "The paper matches parameters and compute (gated d_ff = 2/3 of dense), as ffnlab does (--match params); "
            + (
                "every variant fits the budgets at the stated model size."
                if situation.model_size
                else "give --model-size to check each variant's parameters and training memory against the budgets."
            )
        )
    if situation.depth is not None:
        reasons.append(f"The published model has 12+12 layers; at {situation.depth} layers the gaps may differ.")
    return reasons


def published_alternatives(
    table: PublishedTable, long_run: PublishedTable, choice: str, excluded: dict[str, str] | None = None
) -> list[Alternative]:
    """Every other variant of the table, best first: its published numbers and gap to the choice, and why a
    budget rules it out where one does."""
    values, excluded = table.values, excluded or {}
    return [
        PublishedAlternative(
            ffn=n,
            published=values[n],
            std=table.spread.get(n),
            published_524k=long_run.values[n],
            delta_vs_recommendation=round(values[n] - values[choice], 3),
            excluded=excluded.get(n),
        )
        for n in sorted(values, key=values.__getitem__)
        if n != choice
    ]
