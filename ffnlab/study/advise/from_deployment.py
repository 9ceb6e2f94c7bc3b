"""Advice from a study's measured deployment: deploy.json beside the store (`ffnlab deploy --store`), which
times each variant x precision x runtime at batch 1 and scores its quality on the study's own batches.

It is weighed when the situation is about inference cost (`wants_deployment`: --hardware cpu or mobile,
--latency-sensitive, --situation inference), by one stated rule (`pick_deployment`):

    reference    the best fp32 PyTorch-eager row (lowest mean validation loss) of the variants still in the
                 running: the best model at full precision
    acceptable   a row whose mean validation loss is within LOSS_BUDGET nats of the reference's, or not
                 significantly above it (the 95% CI of the difference, paired over seeds, reaches 0)
    pick         the fastest acceptable row by median batch-1 latency; among acceptable rows within
                 LATENCY_TIE of it, the one with the lowest loss. On mobile or edge hardware only the int8
                 rows compete, where any is acceptable.

Latency is hardware-specific: every measured reason names deploy.json and the machine it was measured on,
and says so where the user's hardware is another.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ffnlab._util.text import human_bytes
from ffnlab.study.advise.flow import Rule, apply_rule, rule_line
from ffnlab.study.advise.situation import Situation
from ffnlab.study.stats import paired_diff

if TYPE_CHECKING:
    from ffnlab.tools.deploy import DeployResult, DeployRow

# NOTE: issue #25's target for int8: at most 0.02 nats of validation-loss increase for the best PTQ variant
LOSS_BUDGET = 0.02
# batch-1 medians this close count as equally fast: CPU timings of small models on a shared machine jitter
# by several percent, so between them the better loss decides
LATENCY_TIE = 0.05


def wants_deployment(situation: Situation) -> bool:
    """Whether inference cost is part of the question: a CPU or edge deployment, latency, or inference only."""
    return situation.deploy in ("cpu", "edge") or situation.latency_sensitive or situation.stage == "inference"


def deploy_command(store: str | Path) -> str:
    return f"ffnlab deploy --store {store}"


@dataclass(frozen=True)
class DeploymentAdvice:
    """What a measured deployment adds to an advice: the variant it picks (None where it picks none, or none
    was measured), the rules applied, further reasons, and the evidence's 'deployment' object."""

    ffn: str | None
    rules: list[Rule]
    reasons: list[str]  # the trade-off, the hardware caveat, or why the deployment was not used
    evidence: DeploymentEvidence | None  # None where there is no deployment to quote
    pick: str | None = None  # the picked row's label: 'relu int8/eager/int8-dynamic'

    @property
    def lines(self) -> list[str]:
        """The reasons an advice adds: each rule marked with its evidence, then the rest."""
        return [rule_line(r) for r in self.rules] + self.reasons


@dataclass(frozen=True)
class WeighedRow:
    """A deployed row against the reference: its validation-loss gap and whether that is acceptable."""

    row: DeployRow
    label: str
    latency_s: float  # batch-1 median
    loss: float  # mean validation loss over seeds
    gap: float  # loss minus the reference's
    ci: tuple[float, float] | None  # 95% CI of the gap paired over seeds; None under 2 paired seeds
    acceptable: bool

    def to_json(self) -> dict[str, Any]:
        r = self.row
        return {
            "row": self.label,
            "ffn": r.ffn,
            "precision": r.precision,
            "runtime": r.runtime,
            "scheme": r.scheme,
            "qat_from": r.qat_from,
            "latency_s": self.latency_s,
            "tokens_per_s": r.throughput.tokens_per_s if r.throughput else None,
            "weight_bytes": r.weight_bytes,
            "val_loss": self.loss,
            "gap_vs_reference": self.gap,
            "gap_ci": list(self.ci) if self.ci else None,
            "acceptable": self.acceptable,
            "on_front": r.on_front,
        }


@dataclass(frozen=True)
class DeployChoice:
    """The deployed rows weighed by `pick_deployment`: the reference, every scored row, and the pick."""

    reference: WeighedRow
    rows: list[WeighedRow]  # every row with a latency and a finite validation loss, fastest first
    pick: WeighedRow
    int8_only: bool  # mobile: only int8 rows competed

    @property
    def fastest(self) -> WeighedRow:
        return self.rows[0]


def row_label(row: DeployRow) -> str:
    """'relu int8/eager/int8-dynamic'; a QAT run's model says so: 'relu int8/eager/int8-dynamic (QAT from 0.8)'."""
    label = f"{row.ffn} {row.target.label()}"
    return label if row.qat_from is None else f"{label} (QAT from {row.qat_from:g})"


def val_loss(row: DeployRow) -> float | None:
    """A measured row's mean validation loss; None where it has no latency or no finite loss."""
    loss = row.quality.val_loss if row.quality else None
    if row.latency is None or loss is None or not math.isfinite(loss):
        return None
    return float(loss)


def weigh(row: DeployRow, reference: DeployRow) -> WeighedRow:
    """A row's loss gap to the reference (the means' difference; its CI paired over seeds) and whether it is
    acceptable: within LOSS_BUDGET, or not significantly above."""
    loss, ref_loss = val_loss(row), val_loss(reference)
    assert loss is not None and ref_loss is not None and row.latency is not None  # only scored rows are weighed
    assert row.quality is not None and reference.quality is not None
    paired = paired_diff(row.quality.val_losses, reference.quality.val_losses)
    ci = (paired.ci_low, paired.ci_high) if paired.ci_low is not None and paired.ci_high is not None else None
    gap = loss - ref_loss
    acceptable = gap <= LOSS_BUDGET or (ci is not None and ci[0] <= 0)
    return WeighedRow(row, row_label(row), row.latency.median_s, loss, gap, ci, acceptable)


def pick_deployment(result: DeployResult, situation: Situation, variants: Collection[str]) -> DeployChoice:
    """The deployed row to run among the rows of `variants` (module docstring); ValueError saying why when
    there is no fp32 eager row with a validation loss to judge the others against."""
    scored = [(r, loss) for r in result.rows if r.ffn in variants and (loss := val_loss(r)) is not None]
    references = [(r, loss) for r, loss in scored if r.target.label() == "fp32/eager" and r.qat_from is None]
    if not references:
        raise ValueError("it has no fp32 eager row with a validation loss to judge the others against")
    reference = min(references, key=lambda pair: pair[1])[0]
    rows = sorted((weigh(r, reference) for r, _ in scored), key=lambda w: w.latency_s)
    pool = [w for w in rows if w.acceptable]  # the reference is always in it
    int8_only = situation.hardware == "mobile" and any(w.row.precision == "int8" for w in pool)
    if int8_only:
        pool = [w for w in pool if w.row.precision == "int8"]
    fastest = pool[0].latency_s
    near = [w for w in pool if w.latency_s <= (1 + LATENCY_TIE) * fastest]
    pick = min(near, key=lambda w: (w.loss, w.latency_s))
    return DeployChoice(weigh(reference, reference), rows, pick, int8_only)


# ---- the advice ------------------------------------------------------------------------------------


def measured_on(result: DeployResult) -> str:
    """Where a deployment was measured, in words: 'Intel(R) Xeon(R) ... (avx512_vnni), 2 threads'."""
    env, setup = result.environment, result.setup
    if setup.get("device") == "cuda":
        return f"{env.get('gpu') or 'a GPU'} (CUDA)"
    flags = ", ".join(env.get("cpu_flags") or []) or "no VNNI or AMX"
    return f"{env.get('cpu') or 'an unnamed CPU'} ({flags}), {setup.get('threads', '?')} threads"


def latency_text(w: WeighedRow) -> str:
    """'4.1 ms median [3.9-4.3] at batch 1, 12,500 tokens/s at batch 16, weights 1.2 MiB'."""
    r, lat = w.row, w.row.latency
    assert lat is not None
    out = f"{lat.median_s * 1e3:.3g} ms median [{lat.q1_s * 1e3:.3g}-{lat.q3_s * 1e3:.3g}] at batch 1"
    if r.throughput is not None:
        out += f", {r.throughput.tokens_per_s:,.0f} tokens/s at batch {r.throughput.batch}"
    return out + (f", weights {human_bytes(r.weight_bytes)}" if r.weight_bytes else "")


def gap_text(w: WeighedRow, reference: WeighedRow) -> str:
    """'+0.0150 nats vs gelu fp32/eager, 95% CI [+0.010, +0.020] paired over 3 seeds'."""
    if w.label == reference.label:
        return "the reference itself"
    ci = f", 95% CI [{w.ci[0]:+.3f}, {w.ci[1]:+.3f}] paired over seeds" if w.ci else ""
    return f"{w.gap:+.4f} nats vs {reference.label}{ci}"


def hardware_caveat(situation: Situation, result: DeployResult, machine: str) -> str | None:
    """What the user's hardware changes about latencies measured elsewhere."""
    if situation.hardware == "mobile":
        return (
            f"Latency is hardware-specific: deploy.json was measured on {machine}, not on a phone or edge device, "
            "whose kernels (ARM NEON, an NPU or DSP) rank precisions and runtimes their own way; confirm the pick "
            "on the device."
        )
    if result.setup.get("device", "cpu") == "cpu":
        return (
            f"Latency is hardware-specific: deploy.json was measured on {machine}; on a CPU with other int8 and "
            "bf16 instructions (VNNI, AMX) or another thread count, the order of precisions and runtimes can change."
        )
    return None


def missing_deployment(store: str | Path) -> DeploymentAdvice:
    """No deploy.json beside the store: the advice says what would measure it (for a store of several settings,
    which `ffnlab deploy` refuses, how to get a store it takes)."""
    from ffnlab.study.deployment import ONE_CELL, store_settings

    settings = store_settings(store)
    how = f"`{deploy_command(store)}` measures"
    if settings > 1:
        how = f"`ffnlab deploy --store` measures one setting and {store} holds {settings} ({ONE_CELL}); it measures"
    why = (
        f"No deployment was measured beside {store} (deploy.json), so inference cost here rests on training step "
        f"times and rules of thumb; {how} each variant's batch-1 latency and quality "
        "in fp32, bf16 and int8 on PyTorch, torch.compile and ONNX Runtime, and advise then weighs it."
    )
    return DeploymentAdvice(None, [], [why], None)


def not_used(path: Path, why: str) -> DeploymentAdvice:
    return DeploymentAdvice(None, [], [f"The deployment measured in {path} was not used: {why}."], None)


def deployment_advice(
    store: str | Path,
    situation: Situation,
    variants: Collection[str],
    model: tuple[int, int] | None = None,
) -> DeploymentAdvice | None:
    """What deploy.json beside `store` says about running one of `variants` (those still in the running) in
    `situation`: None where the situation is not about inference cost. `model` is the (d_model, n_layers)
    advised on, checked against the deployed model's; None where the advice is about another model (a
    checkpoint), which the reasons then say."""
    from ffnlab.study.deployment import deployment_path, load_deployment

    if not wants_deployment(situation):
        return None
    path = deployment_path(store)
    try:
        result = load_deployment(store)
    except ValueError as e:  # damaged: said so, and the advice rests on what it would without it
        return DeploymentAdvice(None, [], [f"The deployment beside {store} was not used: {e}."], None)
    if result is None:
        return missing_deployment(store)
    machine = measured_on(result)
    shape = (result.model.get("d_model"), result.model.get("n_layers"))
    if situation.deploy == "gpu" and result.setup.get("device", "cpu") == "cpu":
        return not_used(path, f"it was measured on the CPU ({machine}), and its latencies say nothing of a GPU")
    if model is not None and shape != model:
        return not_used(
            path,
            f"it measured a model of d_model {shape[0]} and {shape[1]} layers, not the one advised on (d_model "
            f"{model[0]}, {model[1]} layers); measure it again with `{deploy_command(store)}`",
        )
    deployed = {r.ffn for r in result.rows}
    if not deployed & set(variants):
        return not_used(path, f"it has no row of {', '.join(variants)} (it deployed {', '.join(sorted(deployed))})")
    try:
        choice = pick_deployment(result, situation, variants)
    except ValueError as e:
        return not_used(path, str(e))
    return DeploymentAdvice(
        choice.pick.row.ffn,
        deployment_rules(choice, situation, path, machine),
        deployment_reasons(choice, situation, result, machine, variants, deployed, model is None),
        DeploymentEvidence(choice, result, path, machine),
        choice.pick.label,
    )


def deployment_rules(choice: DeployChoice, situation: Situation, path: Path, machine: str) -> list[Rule]:
    """The measured pick, and on mobile the rule of thumb that puts int8 first."""
    pick, reference = choice.pick, choice.reference
    acceptable = [w for w in choice.rows if w.acceptable and (w.row.precision == "int8" or not choice.int8_only)]
    rules = []
    if situation.hardware == "mobile":
        rules.append(apply_rule("deploy-mobile-int8"))
    rules.append(
        apply_rule(
            "deploy-measured",
            path=path,
            machine=machine,
            pick=pick.label,
            latency=latency_text(pick),
            n=len(acceptable),
            scope=" int8" if choice.int8_only else "",
            budget=LOSS_BUDGET,
            reference=reference.label,
            reference_loss=reference.loss,
            loss=pick.loss,
            gap=gap_text(pick, reference),
            tie=f"{LATENCY_TIE:.0%}",
        )
    )
    return rules


def deployment_reasons(
    choice: DeployChoice,
    situation: Situation,
    result: DeployResult,
    machine: str,
    variants: Collection[str],
    deployed: set[str],
    other_model: bool,
) -> list[str]:
    """The trade-off around the pick (the fastest row when it was out, the best variant's own fastest row),
    what the mobile rule could not do, the variants not deployed, and the hardware caveat."""
    pick, reference, fastest = choice.pick, choice.reference, choice.fastest
    reasons = []
    if situation.hardware == "mobile" and not choice.int8_only:
        int8 = [w for w in choice.rows if w.row.precision == "int8"]
        nearest = min(int8, key=lambda w: w.gap, default=None)
        reasons.append(
            "No int8 row keeps the quality"
            + (f" (the nearest, {nearest.label}, is {gap_text(nearest, reference)})" if nearest else " (none measured)")
            + ", so the pick is a float row."
        )
    if not fastest.acceptable:
        reasons.append(
            f"The fastest row, {fastest.label} ({fastest.latency_s * 1e3:.3g} ms), is out: its validation loss is "
            f"{gap_text(fastest, reference)}, beyond the budget and the noise."
        )
    own = [w for w in choice.rows if w.acceptable and w.row.ffn == reference.row.ffn]
    if reference.row.ffn != pick.row.ffn and own:
        best_own = own[0]  # rows are fastest first
        reasons.append(
            f"{reference.row.ffn}, the best at full precision, runs fastest within the budget as {best_own.label}: "
            f"{best_own.latency_s * 1e3:.3g} ms, {best_own.latency_s / pick.latency_s - 1:+.0%} against the pick."
        )
    missing = [v for v in variants if v not in deployed]
    if missing:
        reasons.append(f"Not in the deployment (deploy.json has no row of them): {', '.join(missing)}.")
    if other_model:
        d_model, n_layers = result.model.get("d_model"), result.model.get("n_layers")
        reasons.append(
            f"These rows are of the store's models (d_model {d_model}, {n_layers} layer{'' if n_layers == 1 else 's'}), "
            "not of the checkpoint: at its size the order of precisions and runtimes can change."
        )
    caveat = hardware_caveat(situation, result, machine)
    return reasons + ([caveat] if caveat else [])


@dataclass(frozen=True)
class DeploymentEvidence:
    """The evidence's 'deployment' object: the file, the machine, the rule, the pick and every weighed row."""

    choice: DeployChoice
    result: DeployResult
    path: Path
    machine: str  # where it was measured, in words (`measured_on`)

    @property
    def pick(self) -> str:
        """The picked row's label: 'relu int8/eager/int8-dynamic'."""
        return self.choice.pick.label

    def to_json(self) -> dict[str, Any]:
        choice, env, setup = self.choice, self.result.environment, self.result.setup
        return {
            "file": str(self.path),
            "measured_on": self.machine,
            "machine": {
                "cpu": env.get("cpu"),
                "cpu_flags": env.get("cpu_flags"),
                "gpu": env.get("gpu"),
                "device": setup.get("device"),
                "threads": setup.get("threads"),
                "torch": env.get("torch"),
            },
            "model": {k: self.result.model.get(k) for k in ("d_model", "n_layers", "context", "params")},
            "rule": {
                "reference": choice.reference.label,
                "loss_budget_nats": LOSS_BUDGET,
                "latency_tie": LATENCY_TIE,
                "int8_only": choice.int8_only,
            },
            "pick": self.pick,
            "rows": [w.to_json() for w in choice.rows],
        }
