"""Advice from published results when nothing was measured: Shazeer (2020) Table 1 (ffnlab.study.published),
said to be such, with the `ffnlab compare` command that would measure the question on the user's own data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.study.advise.advice import Advice, compare_command
from ffnlab.study.advise.situation import Situation, situation_rules
from ffnlab.study.flow import (
    DEFAULT_SEQ_LEN,
    Rule,
    apply_rule,
    budget_exclusions,
    mobile_friendly,
    rule_line,
    size_text,
    size_tier,
)
from ffnlab.study.published import SHAZEER_2020_65K, SHAZEER_2020_524K, PublishedTable


@dataclass
class PublishedChoice:
    """The published variants weighed for a situation: which are out, the best, the tied and the pick."""

    excluded: dict[str, str]  # variant -> why a budget rules it out
    best: str  # of the eligible variants
    tied: list[str]  # eligible variants within the reported spread of the best
    choice: str
    rule: Rule | None  # the flow's rule that moved the choice away from the best, if one did


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


def choose_published(situation: Situation) -> PublishedChoice:
    """The best published variant within the budgets, moved by the flow's rules: the ReLU family on
    mobile hardware, SwiGLU for a large model, the cheapest tied activation when cost counts."""
    values, spread = SHAZEER_2020_65K.values, SHAZEER_2020_65K.spread
    excluded = published_exclusions(situation)
    eligible = [n for n in values if n not in excluded]
    if not eligible:
        smallest, why = next(iter(excluded.items()))  # the table starts with the dense relu
        assert situation.model_size is not None  # budgets rule variants out only at a stated size
        raise ValueError(
            f"no published variant fits the budgets at {size_text(situation.model_size)} parameters, "
            f"not even {smallest}: {why}; raise a budget, shorten --seq-len or give a smaller --model-size"
        )
    best = min(eligible, key=values.__getitem__)
    # tied: the gap is within the larger of the two reported inter-run standard deviations
    tied = [n for n in eligible if n != best and values[n] - values[best] <= max(spread[n], spread[best])]
    relu_family = [n for n in eligible if mobile_friendly(n)]
    if situation.hardware == "mobile" and relu_family:
        choice = min(relu_family, key=values.__getitem__)
        return PublishedChoice(
            excluded, best, tied, choice, apply_rule("mobile-relu", ffn=choice, gap=values[choice] - values[best])
        )
    if situation.model_size and size_tier(situation.model_size) == "large" and "swiglu" in (best, *tied):
        return PublishedChoice(excluded, best, tied, "swiglu", None)  # the large-model rule says why
    if situation.cost_sensitive and tied and not situation.long_context:
        flops = {n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops for n in values}
        choice = min([best] + tied, key=lambda n: (flops[n], values[n]))
        return PublishedChoice(excluded, best, tied, choice, apply_rule("cpu-cheap") if choice != best else None)
    return PublishedChoice(excluded, best, tied, best, None)


def advise_published(situation: Situation) -> Advice:
    """Advice from Shazeer (2020) Table 1 when nothing was measured: the best variant within the
    budgets, or the one the situation's rules prefer."""
    table, long_run = SHAZEER_2020_65K, SHAZEER_2020_524K
    picked = choose_published(situation)
    choice, best, tied = picked.choice, picked.best, picked.tied
    values, spread, name = table.values, table.spread, table.names
    cite = f"{table.source} (arXiv:{table.arxiv}), {table.table.split(',')[0]}"
    reasons = [
        f"No measurements given (no --store), so this rests on published results: {cite}; {table.metric}, "
        f"{table.setup}.",
        f"{name[choice]} {values[choice]:.3f} (std {spread[choice]:.3f}) vs {name['relu']} {values['relu']:.3f} "
        f"and {name['gelu']} {values['gelu']:.3f} at 65,536 steps; at 524,288 steps {long_run.values[choice]:.3f} "
        f"vs {long_run.values['relu']:.3f} and {long_run.values['gelu']:.3f}.",
        "Every gated variant beats every dense one in that table at both lengths, at equal parameters and compute.",
    ]
    if tied:
        gaps = ", ".join(f"{name[n]} {values[n]:.3f} (std {spread[n]:.3f})" for n in tied)
        reasons.append(
            f"Within the reported run-to-run spread of {name[best]} {values[best]:.3f}: {gaps}; "
            "the paper's numbers do not separate them."
        )
    reasons += published_situation_reasons(situation, picked)
    rules = [apply_rule("budget-exclusion", ffn=n, why=why) for n, why in picked.excluded.items()]
    rules += ([picked.rule] if picked.rule else []) + situation_rules(situation)
    reasons += [rule_line(r) for r in rules]
    reasons.append(
        "Measure it on your own data before committing (command below): published gaps of "
        "0.01-0.05 nats need several seeds to confirm."
    )
    variants = list(dict.fromkeys([choice, best, *tied, "gelu", "relu"]))
    return Advice(
        recommendation=choice,
        basis="published",
        reasons=reasons,
        evidence=published_evidence_json(table, long_run),
        alternatives=published_alternatives_json(table, long_run, choice, picked.excluded),
        command=compare_command(variants, None, situation.depth),
        rules=rules,
    )


def published_situation_reasons(situation: Situation, picked: PublishedChoice) -> list[str]:
    """What the situation changed about the published pick: cost, budgets, depth."""
    values, choice, best = SHAZEER_2020_65K.values, picked.choice, picked.best
    reasons = []
    if choice != best and picked.rule and picked.rule.rule == "cpu-cheap":
        flops = {n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops for n in (choice, best)}
        why = "latency-sensitive" if situation.latency_sensitive else f"{situation.deploy} deployment"
        reasons.append(
            f"Cost counts here ({why}): {choice}'s activation costs about {flops[choice]} FLOPs per element "
            f"against {flops[best]} for {best}'s (ffnlab's estimate), so the cheaper of the tied variants wins."
        )
    if picked.excluded:
        assert situation.model_size is not None  # budgets rule variants out only at a stated size
        reasons.append(
            f"Budgets rule out {', '.join(picked.excluded)} at {size_text(situation.model_size)} parameters, so the "
            f"pick is among the rest ({best} {values[best]:.3f} is the best of them)."
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


def published_alternatives_json(
    table: PublishedTable, long_run: PublishedTable, choice: str, excluded: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """A JSON object for every other variant of the table, best first: its published numbers and gap to the
    choice, and why a budget rules it out where one does."""
    values, excluded = table.values, excluded or {}
    return [
        {
            "ffn": n,
            "published": values[n],
            "std": table.spread.get(n),
            "published_524k": long_run.values[n],
            "delta_vs_recommendation": round(values[n] - values[choice], 3),
            **({"excluded": excluded[n]} if n in excluded else {}),
        }
        for n in sorted(values, key=values.__getitem__)
        if n != choice
    ]


def published_evidence_json(*tables: PublishedTable) -> dict[str, Any]:
    """The JSON object of the source and the numbers of the published tables the advice rests on (all from
    one paper)."""
    return {
        "kind": "published",
        "source": tables[0].source,
        "arxiv": tables[0].arxiv,
        "tables": [
            {
                "table": t.table,
                "metric": t.metric,
                "setup": t.setup,
                "values": t.values,
                "spread": t.spread,
                "paper_names": t.names,
            }
            for t in tables
        ],
    }
