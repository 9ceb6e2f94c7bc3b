"""The advisor: which FFN variant to use in a stated situation, and why, with numbers.

Three sources of evidence, in this order:
1. fine-tuning a pretrained model: keep the activation it was trained with (its weights assume it);
   the activation is read from a Hugging Face config.json or a table of model families (from_checkpoint.py);
2. measurements in a run store: the variants' paired differences over seeds, under the user's
   parameter, memory and latency constraints (from_store.py), and, where inference cost counts, the
   deployment measured beside it (deploy.json: from_deployment.py), also for a checkpoint's variant; for
   parameter-efficient fine-tuning, a LoRA study of the checkpoint (keep against swap, the FFN frozen), said
   before the rule of thumb (from_lora.py);
3. published results (ffnlab.study.published), said to be such, with the `ffnlab compare` command that
   would measure the question on the user's own data (from_papers.py).

Between them, the rules of advice_rules.csv that prefer variants (rules.py: hardware, VRAM tier, priority,
model size, long text, depth tier) narrow the candidates; the advice says when a rule, not the evidence,
decided (`Advice.decided_by`), and a measurement outranks a rule where the store measured that situation.

A symptom (`--symptom nan|slow|mismatch`, seed 002's troubleshooting list) is answered instead by checks in
order, each with the command that measures it (from_symptom.py); no variant is picked.

What the user says is a `Situation` (situation.py: one `ffnlab advise` flag per field); the result is an
`Advice` (advice.py) that `format_advice` prints and whose `to_json()` is `advise --json`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ffnlab.study.advise.advice import Advice, format_advice
from ffnlab.study.advise.evidence import PretrainedEvidence
from ffnlab.study.advise.flow import Deploy, Hardware, Priority, Stage, Symptom, TaskType, rule_line
from ffnlab.study.advise.from_checkpoint import advise_pretrained
from ffnlab.study.advise.from_deployment import deployment_advice
from ffnlab.study.advise.from_lora import advise_lora, measures
from ffnlab.study.advise.from_papers import advise_published
from ffnlab.study.advise.from_store import advise_measured
from ffnlab.study.advise.from_symptom import advise_symptom, unused_by_symptom
from ffnlab.study.advise.rules import situation_rules
from ffnlab.study.advise.situation import (
    Situation,
    parse_bytes,
    parse_model_size,
    parse_params,
    size_from,
    unused_inputs,
)

__all__ = ["Advice", "Situation", "advice_for", "advise", "format_advice"]


def advise(
    store: str | Path | None = None,
    params_budget: float | str | None = None,
    memory_budget: float | str | None = None,
    latency_sensitive: bool = False,
    pretrained: str | None = None,
    deploy: Deploy | None = None,
    depth: int | None = None,
    situation: Stage | None = None,
    hardware: Hardware | None = None,
    seq_len: int | None = None,
    model_size: float | str | None = None,
    priority: Priority | None = None,
    task_type: TaskType | None = None,
    symptom: Symptom | None = None,
) -> Advice:
    """Recommend an FFN variant for a situation, given as `ffnlab advise`'s flags are: `situation` is the
    stage (pretrain, finetune, peft, inference); budgets and the model size may be numbers or text ('125M',
    '16GiB'); a `symptom` is troubleshot instead. See `advice_for`."""
    inputs = Situation(
        stage=situation,
        pretrained=pretrained,
        hardware=hardware,
        deploy=deploy,
        seq_len=seq_len,
        model_size=size_from(model_size, parse_model_size),
        params_budget=size_from(params_budget, parse_params),
        memory_budget=size_from(memory_budget, parse_bytes),
        latency_sensitive=latency_sensitive,
        depth=depth,
        priority=priority,
        task_type=task_type,
        symptom=symptom,
    )
    return advice_for(inputs, store)


def advice_for(situation: Situation, store: str | Path | None = None) -> Advice:
    """Recommend an FFN variant for a situation (ffnlab.study.advise.flow lists the inputs and their branches):
    from a checkpoint, keep its activation (fine-tuning, PEFT) or run it fastest (inference); when
    training from scratch, from measurements in `store`, else from published results. A symptom is answered
    by checks in order instead, whatever else is given. The advice holds the situation resolved, the branch
    taken ('pretrain/published', ..., 'pretrain/checks') and the rules applied."""
    context = situation.resolved()
    if context.symptom:
        advice = advise_symptom(context)
        advice = replace(advice, reasons=advice.reasons + unused_by_symptom(situation, store))
        return replace(advice, situation=context, branch=f"{context.stage}/{advice.basis}")
    if context.pretrained:
        advice = advise_pretrained(context.pretrained, context)
        if store is not None and context.stage == "peft" and measures(store, context.pretrained):  # LoRA: first
            advice = advise_lora(advice, store, context)
        elif store is not None:
            advice = with_checkpoint_deployment(advice, store, context)
    elif store is not None:
        if not Path(store).is_file():
            raise ValueError(
                f"no run store at {store}; run `ffnlab compare` first, or leave out --store to "
                "get advice from published results"
            )
        advice = advise_measured(store, context)
    else:
        advice = advise_published(context)
    # the published advice quotes the situation's rules itself, before its closing "measure it"
    extra = situation_rules(context) if advice.basis == "measured" else []
    return replace(
        advice,
        reasons=advice.reasons + [rule_line(r) for r in extra] + unused_inputs(context),
        rules=advice.rules + extra,
        situation=context,
        branch=f"{context.stage}/{advice.basis}",
    )


def with_checkpoint_deployment(advice: Advice, store: str | Path, situation: Situation) -> Advice:
    """A checkpoint's advice with what a store adds: not its training measurements (they compare training
    from scratch), but, where inference cost counts, how its measured deployment runs the checkpoint's
    variant fastest."""
    deployment = deployment_advice(store, situation, [advice.recommendation])
    unused = (
        f"The measurements in {store} were not used: they compare training from scratch, which starting from a "
        "checkpoint is not."
    )
    if deployment is None:
        return replace(advice, reasons=[*advice.reasons, unused])
    if deployment.pick is not None:
        unused = (
            f"The training measurements in {store} were not used: they compare training from scratch, which "
            "starting from a checkpoint is not; its measured deployment was, for how to run the checkpoint's variant."
        )
    evidence = advice.evidence
    if deployment.evidence:
        assert isinstance(evidence, PretrainedEvidence)  # (a checkpoint's advice)
        evidence = replace(evidence, deployment=deployment.evidence)
    implementation = advice.implementation
    if implementation and deployment.pick:
        implementation += f"; measured fastest within the quality budget: {deployment.pick} (deploy.json)"
    return replace(
        advice,
        reasons=[*advice.reasons, unused, *deployment.lines],
        rules=advice.rules + deployment.rules,
        evidence=evidence,
        implementation=implementation,
    )
