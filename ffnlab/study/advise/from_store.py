"""Advice from measurements in a run store: in each cell of the store's latest study, the variants' paired
differences over seeds, under the situation's parameter, memory and latency constraints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ffnlab._util.text import and_list, human, human_bytes, key_values, sci
from ffnlab.run.config import TrainConfig
from ffnlab.study.advise.advice import Advice
from ffnlab.study.advise.command import compare_command
from ffnlab.study.advise.evidence import (
    Alternative,
    ExcludedAlternative,
    MeasuredAlternative,
    MeasuredCellsEvidence,
    MeasuredEvidence,
    StudyFacts,
)
from ffnlab.study.advise.flow import LONG_CONTEXT_SHARE, Rule, apply_rule, ffn_flop_share, rule_line
from ffnlab.study.advise.from_deployment import deployment_advice
from ffnlab.study.advise.rules import decided_line, narrow, picks_text, preferences
from ffnlab.study.advise.situation import Situation
from ffnlab.study.metrics import PARAMS, STEP_TIME, STEP_TIME_RANGE, TRAIN_MEMORY, ranked_metric, ranking_metric
from ffnlab.study.plan import CellKey, config_value, group_key, set_field
from ffnlab.study.records import AcrossCells, Cell, VariantRow
from ffnlab.study.scaling import LOF_ALPHA, ScalingFits
from ffnlab.study.stats import MIN_PAIRS, holm, paired_diff

ALPHA = 0.05
# Step-time difference below which two variants count as equally fast: CPU timings of small
# models on a shared machine jitter by several percent.
SPEED_TOLERANCE = 0.05


@dataclass(frozen=True)
class CellSettings:
    """The settings each cell of a study ran with, which a suggested command repeats: the cell's config (its
    baseline's but the seed and the FFN) and each variant's own settings."""

    configs: dict[CellKey, TrainConfig]  # the cell's axes (`group_key`) -> its config
    per_variant: dict[str, dict[str, Any]] = field(default_factory=dict)

    def of(self, cell: Cell) -> TrainConfig | None:
        """The cell's config; None where the study has no run of its baseline there."""
        return self.configs.get(tuple(cell.axes.items()))


def measured_cells(store_path: str | Path, depth: int | None) -> tuple[list[Cell], StudyFacts, CellSettings]:
    """The cells of the store's latest study to advise on, from the one summary every output shares
    (`ffnlab.study.summary.summarize_study`): with an axis 'depth' and a stated depth, the cells at the nearest
    measured depth; otherwise every cell. Cells are never merged. Also returns facts about the study and the
    settings of its cells."""
    from ffnlab.study.load import load_study
    from ffnlab.study.store import Store
    from ffnlab.study.summary import summarize_study

    study, runs, _ = load_study(store_path)
    summary = summarize_study(study, store_path, runs)
    cells = summary.cells
    if study.scale:  # the multipliers are read at the largest compute: advise at that size too
        largest = {a: max(study.axes[a]) for a in study.scale}
        cells = [c for c in cells if all(c.axes[a] == v for a, v in largest.items())]
    elif "depth" in study.axes and depth is not None:
        nearest = min(study.axes["depth"], key=lambda d: (abs(d - depth), d))
        cells = [c for c in cells if c.axes["depth"] == nearest]
    with Store(store_path, read_only=True) as store:
        env: dict[str, Any] = next((r.env for r in reversed(store.runs(status="finished"))), {})
    cfg = study.base
    shape = summary.settings.model  # the shape the runs trained: a Hugging Face config's own, not cfg.model's
    facts = StudyFacts(
        store=str(store_path),
        task=cfg.model.task,
        metric=cells[0].metric,
        higher_is_better=cells[0].metric_direction == "higher",
        n_layers=shape["n_layers"],
        d_model=shape["d_model"],
        context=shape.get("context", cfg.model.context),  # (a ViT's settings name its patches instead)
        data=cfg.data,
        tokenizer=cfg.tokenizer,
        match=cfg.model.ffn_match,
        seeds=study.seeds,
        baseline=summary.baseline,
        device=env.get("device", "?"),
        init=cfg.model.init,
        scaling=summary.scaling if summary.scaling and summary.scaling.fits else None,
        across_cells=summary.across_cells,
    )
    configs: dict[CellKey, TrainConfig] = {}
    base = cfg.to_dict()
    for run in runs:  # the baseline's run of each cell, its own settings (if any) put back to the study's
        if run.model.ffn == study.baseline:
            for path in study.per_variant.get(study.baseline, {}):
                run = set_field(run, path, config_value(base, path))
            configs.setdefault(group_key(run, study), run)
    return cells, facts, CellSettings(configs, study.per_variant)


def step_time_spread(row: VariantRow) -> float | None:
    """The slowest seed's median step over the fastest's: above 1.5 the machine was busy."""
    span = row.value(STEP_TIME_RANGE)
    return span[1] / span[0] if span and span[0] else None


def exclusion(row: VariantRow, situation: Situation) -> str | None:
    """Why a measured variant is out of the running, or None."""
    if row.diverged:
        return f"diverged in {row.diverged} of {row.diverged + len(row.values)} runs"
    if not row.values:
        return "no finished run"
    if row.mean is None:
        return "no finite value of the ranking metric"
    params_budget, memory_budget = situation.params_budget, situation.memory_budget
    params, memory = row.value(PARAMS), row.value(TRAIN_MEMORY)
    if params_budget and params and params > params_budget:
        return f"{human(params)} parameters exceed the budget of {human(params_budget)}"
    if memory_budget and memory and memory > memory_budget:
        return (
            f"training memory {human_bytes(memory)} (parameters, gradients, optimizer state, "
            f"activations kept for backward) exceeds the budget of {human_bytes(memory_budget)}"
        )
    return None


def pct(value: float | None, reference: float | None) -> str:
    """'+11%': `value` relative to `reference`; '?' when either is missing."""
    return f"{(value / reference - 1) * 100:+.0f}%" if value and reference else "?"


def advise_measured(store_path: str | Path, situation: Situation) -> Advice:
    """Advice from a store's measurements: one cell's advice, or, when several cells remain (another
    axis than depth), each cell's advice and a recommendation only where they agree. Where inference cost
    counts, each cell weighs the measured deployment beside the store (from_deployment.py)."""
    cells, facts, settings = measured_cells(store_path, situation.depth)
    advices = [advise_cell(c, facts, situation, settings) for c in cells]
    if len(advices) == 1:
        return advices[0]
    picks = {a.recommendation for a in advices}
    agree = len(picks) == 1
    reasons = [
        f"The store's study has {len(advices)} cells here ({'; '.join(key_values(a.cell or {}) for a in advices)}); "
        "each is advised on by its own measurements, never pooled."
    ]
    reasons.append(
        f"Every cell recommends {next(iter(picks))}."
        if agree
        else "The cells disagree: "
        + "; ".join(f"{key_values(a.cell or {})} -> {a.recommendation}" for a in advices)
        + ". Choose by the setting you will use."
    )
    return Advice(
        recommendation=next(iter(picks)) if agree else "depends on the cell",
        basis="measured",
        reasons=reasons,
        evidence=MeasuredCellsEvidence(facts, [cell_evidence(a) for a in advices]),
        alternatives=[],
        cells=advices,
        command=advices[0].command,
    )


@dataclass(frozen=True)
class GapToBest:
    """An eligible variant against the cell's best: paired over seeds (ffnlab.study.stats.paired_diff),
    Holm-corrected over the cell's other eligible variants."""

    n: int  # paired seeds
    delta: float | None  # the variant minus the best
    ci_low: float | None
    ci_high: float | None
    p: float | None
    p_adj: float | None
    significant: bool  # p_adj < ALPHA


@dataclass
class CellChoice:
    """One cell's variants weighed for advice: which are eligible, the best, and the one recommended."""

    variants: dict[str, VariantRow]  # the cell's rows by variant
    excluded: dict[str, str]  # variant -> why it is out of the running
    mean: dict[str, float]  # of each eligible variant, in the cell's order
    best: str
    diffs: dict[str, GapToBest]  # each other eligible variant against the best
    choice: str  # the best, or a faster variant tied with it when cost counts
    runner_up: str | None  # the best eligible variant but the choice
    unit: str  # of a paired difference: ' nats', ' accuracy' or ' F1', of the task's ranking metric
    rules: list[Rule] = field(default_factory=list)  # the flow's rules that moved the choice away from the best
    outranked: dict[str, Rule] = field(default_factory=dict)  # what the store measured -> the rule it outranks
    deployed: bool = False  # the measured deployment picked the choice (from_deployment.py)
    against: list[Rule] = field(default_factory=list)  # the other rules that prefer variants but not the choice

    @property
    def eligible(self) -> list[str]:
        return list(self.mean)

    @property
    def tied(self) -> list[str]:
        """The eligible variants not significantly different from the best (untested ones included)."""
        return [n for n, gap in self.diffs.items() if not gap.significant]

    @property
    def untested(self) -> list[str]:
        """The eligible variants no test could compare with the best: too few paired seeds."""
        return [n for n, gap in self.diffs.items() if gap.p is None]

    def versus(self, name: str, ref: str) -> str:
        """'-0.060 nats vs gelu, 95% CI [-0.080, -0.040], p=0.003, 3 paired seeds'."""
        d = paired_diff(self.variants[name].values, self.variants[ref].values)
        if d.delta is None:
            return f"no seed in common with {ref}"
        ci = f", 95% CI [{d.ci_low:+.3f}, {d.ci_high:+.3f}]" if d.ci_low is not None else ""
        p = f", p={d.p:.2g}" if d.p is not None else ""
        return f"{d.delta:+.3f}{self.unit} vs {ref}{ci}{p}, {d.n} paired seed{'s' if d.n != 1 else ''}"

    def costs(self, name: str, ref: str) -> str:
        """'step time -12%, params +0%, training memory +8%': `name` relative to `ref`."""
        v, r = self.variants[name], self.variants[ref]
        step, params, memory = (pct(v.value(m), r.value(m)) for m in (STEP_TIME, PARAMS, TRAIN_MEMORY))
        return f"step time {step}, params {params}, training memory {memory}"

    def step_time(self, name: str) -> float | None:
        time: float | None = self.variants[name].value(STEP_TIME)
        return time


def eligible_variants(cell: Cell, situation: Situation) -> list[str]:
    """The cell's variants that `exclusion` leaves in the running, in the cell's order."""
    return [r.ffn for r in cell.variants if exclusion(r, situation) is None]


def measured_situation(rule: Rule, facts: StudyFacts) -> str | None:
    """What the store measured of the situation a rule is about, where it measured it, so that the measurement
    decides rather than the rule: the same depth tier, a long context, each variant's training memory; None
    where it did not."""
    if rule.branch == "depth" and rule.covers(facts.n_layers):
        return f"{facts.n_layers} layer{'s' if facts.n_layers != 1 else ''}, the same depth tier ({rule.tier})"
    if rule.branch == "seq_len" and ffn_flop_share(facts.d_model, facts.context) < LONG_CONTEXT_SHARE:
        return f"a long context too ({facts.context} tokens at d_model {facts.d_model})"
    if rule.branch == "vram":
        return "each variant's training memory"
    return None


def choose_in_cell(cell: Cell, facts: StudyFacts, situation: Situation, deployed: str | None = None) -> CellChoice:
    """The best eligible variant of a cell; or the eligible variant `deployed`, the measured deployment's pick;
    or, on mobile, a tied variant the mobile rule prefers (seed 002: Swish or HardSwish); or, where the situation
    lies in a depth tier or a long context the store did not measure, the best variant the rule of that situation
    prefers; or a tied variant the priority prefers; or, when cost counts, a tied one that is clearly faster.
    Where the store measured the situation, its rule is outranked; the other rules that prefer variants but not
    the choice are kept (`against`), so the advice says both. A store is a measurement, so the first-attempt rule
    does not apply. ValueError saying why when no variant is eligible."""
    variants = {r.ffn: r for r in cell.variants}
    sign = -1.0 if facts.higher_is_better else 1.0  # sign * value: lower is better
    excluded = {name: why for name, v in variants.items() if (why := exclusion(v, situation))}
    # every eligible variant's mean (exclusion leaves out those without one), in the cell's order
    mean = {n: v.mean for n, v in variants.items() if n not in excluded and v.mean is not None}
    eligible = list(mean)
    if not eligible:
        raise ValueError(
            "no measured variant can be recommended: " + "; ".join(f"{n}: {why}" for n, why in excluded.items())
        )

    def better_first(n: str) -> float:
        return sign * mean[n]

    def step_time(n: str) -> float:
        return variants[n].value(STEP_TIME) or math.inf

    best = min(eligible, key=better_first)
    diffs = gaps_to_best(variants, best, eligible)
    tied = [n for n, gap in diffs.items() if not gap.significant]
    # the rules that prefer variants (mobile has its own rule here; model size only informs a measurement)
    rules = [r for r in preferences(situation) if r.branch not in ("hardware", "model_size", "first")]
    mobile = [apply_rule("mobile-swish")] if situation.hardware == "mobile" else []
    outranked = {what: r for r in rules if (what := measured_situation(r, facts))}
    unmeasured = narrow(
        eligible, [r for r in rules if r.branch in ("depth", "seq_len") and r not in outranked.values()], better_first
    )
    by_priority = narrow([best] + tied, [r for r in rules if r.branch == "priority"], better_first)
    by_hardware = narrow([best] + tied, mobile, better_first)
    choice, moved = best, []
    if deployed in eligible:
        choice = deployed  # measured at inference, which the rules of thumb below only guess at
    elif by_hardware.moved:
        choice = min(by_hardware.candidates, key=better_first)
        moved = [apply_rule("mobile-measured", ffn=choice, store=facts.store)]
    elif unmeasured.moved:
        choice, moved = min(unmeasured.candidates, key=better_first), unmeasured.moved
    elif by_priority.moved:
        choice, moved = min(by_priority.candidates, key=better_first), by_priority.moved
    elif situation.cost_sensitive and tied:
        fastest = min([best] + tied, key=step_time)
        if step_time(fastest) < (1 - SPEED_TOLERANCE) * step_time(best):
            choice = fastest
    outranked = {what: r for what, r in outranked.items() if not r.prefers(choice)}
    decided = {r.rule for r in moved}
    against = [r for r in mobile + rules if r.picks and not r.prefers(choice) and r not in outranked.values()]
    against = [r for r in against if r.rule not in decided]
    runner_up = min((n for n in eligible if n != choice), key=better_first, default=None)
    ranked = ranking_metric(facts.task)
    unit = f" {ranked.unit or ranked.quantity()}"
    return CellChoice(
        variants, excluded, mean, best, diffs, choice, runner_up, unit, moved, outranked, deployed in eligible, against
    )


def gaps_to_best(variants: dict[str, VariantRow], best: str, eligible: list[str]) -> dict[str, GapToBest]:
    """Every other eligible variant against the best, paired over seeds, Holm-corrected."""
    paired = {n: paired_diff(variants[n].values, variants[best].values) for n in eligible if n != best}
    adjusted = holm([d.p for d in paired.values()])
    return {
        n: GapToBest(d.n, d.delta, d.ci_low, d.ci_high, d.p, p_adj, significant=p_adj is not None and p_adj < ALPHA)
        for (n, d), p_adj in zip(paired.items(), adjusted)
    }


def advise_cell(cell: Cell, facts: StudyFacts, situation: Situation, settings: CellSettings) -> Advice:
    """Advice from one cell of a study: the best eligible variant, or one a rule prefers (saying so), or a
    faster one tied with it."""
    for axis, name in (("depth", "n_layers"), ("width", "d_model"), ("context", "context")):
        if axis in cell.axes:
            facts = replace(facts, **{name: cell.axes[axis]})
    shape = (facts.d_model, facts.n_layers)
    deployment = deployment_advice(facts.store, situation, eligible_variants(cell, situation), shape)
    weighed = choose_in_cell(cell, facts, situation, deployment.ffn if deployment else None)
    reasons = choice_reasons(weighed, cell, facts, situation)
    if weighed.rules:
        best = weighed.best
        reasons.insert(1, decided_line(weighed.rules, f"{best} ({weighed.mean[best]:.4f})", "your measurements"))
    reasons += caveat_reasons(weighed, facts, situation)
    rules = weighed.rules + list(weighed.outranked.values()) + weighed.against
    reasons += [rule_line(r) for r in weighed.rules]
    reasons += [outranked_line(r, what, weighed, facts.store) for what, r in weighed.outranked.items()]
    reasons += [against_line(r, weighed, facts.store) for r in weighed.against]
    if deployment:
        rules += deployment.rules
        reasons += deployment.lines
    reasons += scaling_reasons(weighed.choice, facts.scaling.fits if facts.scaling else None)
    reasons += across_reasons(weighed.choice, facts.across_cells)
    evidence = MeasuredEvidence(facts, cell.axes, weighed.variants, deployment.evidence if deployment else None)
    # the variants the rules prefer that the store did not measure, named, so that the command measures them
    unmeasured = [p for r in weighed.against for p in r.picks if p != "gated" and p not in weighed.variants]
    variants = list(dict.fromkeys([*weighed.variants, *unmeasured]))
    return Advice(
        recommendation=weighed.choice,
        basis="measured",
        reasons=reasons,
        evidence=evidence,
        alternatives=measured_alternatives(weighed),
        command=compare_command(
            variants, facts.data, situation.depth, max(5, facts.seeds), settings.of(cell), settings.per_variant
        ),
        cell=cell.axes,
        rules=rules,
        decided_by=[r.rule for r in weighed.rules] or None,
    )


def outranked_line(rule: Rule, what: str, weighed: CellChoice, store: str) -> str:
    """A rule the store's measurement outranks, the measurement first: the store measured the rule's situation."""
    return (
        f"ffnlab measurement ({store}): {weighed.choice}, and the store measured {what}, so its measurement "
        f"decides here, not the rule, which says otherwise: {rule_line(rule)}"
    )


def against_line(rule: Rule, weighed: CellChoice, store: str) -> str:
    """A rule that prefers other variants than the choice: what the store measured of them first, then the rule;
    or, where it measured none of them, the rule and that it could not decide."""
    measured = [n for n in weighed.variants if rule.prefers(n)]
    if not measured:
        return (
            f"{rule_line(rule)} The store measured none of the variants this rule prefers ({picks_text(rule)}), so "
            "it did not decide: the command below measures them."
        )
    gaps = "; ".join(
        f"{n} {weighed.versus(n, weighed.choice)}" if n in weighed.eligible else f"{n} excluded: {weighed.excluded[n]}"
        for n in measured
    )
    return (
        f"ffnlab measurement ({store}): {gaps}; the pick is {weighed.choice}. The {rule.rule} rule says otherwise: "
        f"{rule_line(rule)}"
    )


def scaling_reasons(choice: str, fits: ScalingFits | None) -> list[str]:
    """What the store's compute multipliers say about the choice: its own sentence, and the variant with
    the largest multiplier whose interval is above 1 when that is another one."""
    if not fits:
        return []
    laws, baseline = fits.variants, fits.baseline
    lines = [s for s in fits.sentences if s.startswith(f"{choice} ")]
    if choice == baseline:
        lines.append(f"{choice} is the baseline of the scaling fits (multiplier 1 by definition).")
    worth = {n: law.multiplier for n, law in laws.items() if n != baseline and (law.multiplier_ci[0] or 0) > 1}
    top = max(worth, key=worth.__getitem__, default=None)
    if top is not None and top != choice:
        misfit = any((laws[n].lack_of_fit_p or 1) < LOF_ALPHA for n in (top, baseline))
        lines.append(
            f"By the scaling fits {top} is worth {worth[top]:.2f}x {baseline}'s compute (interval above 1), more "
            f"than {choice}: where the compute budget matters more than the constraints above, consider {top}"
            + (
                " (though the power law misses the measured points: a summary of this range, not a law)."
                if misfit
                else "."
            )
        )
    where = f"{sci(fits.compute_range[0])}-{sci(fits.compute_range[1])} FLOPs"
    return [f"Scaling study ({where}, advice at the largest size): " + " ".join(lines)] if lines else []


def across_reasons(choice: str, across: AcrossCells | None) -> list[str]:
    """Whether the choice's gap to the baseline, and the best mean, hold in the study's other cells."""
    if not across:
        return []
    lines = [s for s in across.sentences if s.startswith(f"{choice}'s gap") or s.startswith("The best mean")]
    return [f"Across the study's {len(across.cells)} cells: " + " ".join(lines)] if lines else []


def choice_reasons(weighed: CellChoice, cell: Cell, facts: StudyFacts, situation: Situation) -> list[str]:
    """Where it was measured, why the choice, and how it compares with the runner-up and the baseline."""
    best, choice, mean, eligible, tied = weighed.best, weighed.choice, weighed.mean, weighed.eligible, weighed.tied
    layers = f"{facts.n_layers} layer{'s' if facts.n_layers != 1 else ''}"
    where = (
        f"{facts.store}: task {facts.task}, {layers}, d_model {facts.d_model}, data {facts.data} "
        f"({'images' if facts.task == 'image' else facts.tokenizer + ' tokens'}), "
        f"{facts.seeds} seed{'s' if facts.seeds != 1 else ''}, "
        f"FFNs matched in {facts.match}, FFN init {facts.init} for all, timed on {facts.device}"
    )
    cell_where = key_values(cell.axes)
    reasons = [f"Measured in {where}" + (f", cell {cell_where}" if cell_where else "") + "."]
    leaders = [n for n in eligible if mean[n] == mean[best]]  # an exact tie shares the best mean
    has = f"{best} has" if len(leaders) == 1 else f"{and_list(leaders)} tie for"
    split = ranked_metric(facts.metric).split  # where the cell ranks: 'val' or 'test'
    if choice == best:
        reasons.append(
            f"{has} the best mean final {split} {ranking_metric(facts.task).quantity()} "
            f"({mean[best]:.4f}) among the {len(eligible)} variants that meet the constraints."
        )
    elif weighed.deployed:
        reasons.append(
            f"{has} the best mean ({mean[best]:.4f}), but {choice} ({weighed.versus(choice, best)}) is the "
            "variant the measured deployment picks: fastest at inference within the quality budget (below)."
        )
    elif weighed.rules and weighed.rules[0].branch in ("depth", "seq_len"):
        planned = {"depth": f"{situation.depth} layers", "seq_len": f"sequences of {situation.seq_len} tokens"}
        unmeasured = " and ".join(planned[r.branch] for r in weighed.rules)
        reasons.append(
            f"{has} the best mean ({mean[best]:.4f}) where the store measured, but you plan {unmeasured}, "
            f"which it did not measure (rule below): there the rule decides, and {choice} is the best measured "
            f"variant it prefers ({weighed.versus(choice, best)})."
        )
    elif weighed.rules:
        why = "suits the hardware" if weighed.rules[0].branch == "hardware" else "your priority prefers it"
        reasons.append(
            f"{has} the best mean ({mean[best]:.4f}), but {choice} is not significantly worse "
            f"({weighed.versus(choice, best)}) and {why} (rule below)."
        )
    else:
        reasons.append(
            f"{has} the best mean ({mean[best]:.4f}), but {choice} is not significantly worse "
            f"({weighed.versus(choice, best)}) and is faster ({weighed.costs(choice, best)}); with "
            f"{'latency in mind' if situation.latency_sensitive else f'a {situation.deploy} deployment'} the "
            "faster one wins."
        )
    for ref in dict.fromkeys([weighed.runner_up, facts.baseline]):
        if ref is None or ref == choice or ref not in eligible or (choice != best and ref == best):
            continue  # (the best was already quoted when the choice is a faster tied one)
        reasons.append(f"{choice}: {weighed.versus(choice, ref)}; {weighed.costs(choice, ref)}.")
    significant_losers = [n for n, gap in weighed.diffs.items() if gap.significant]
    if significant_losers:
        reasons.append(
            f"{best} is significantly better than {', '.join(significant_losers)} (paired t-tests, Holm-corrected)."
        )
    tested = [n for n in tied if n not in weighed.untested]
    if tested and choice == best:
        reasons.append(
            f"Not significantly different from {best} (paired t-tests, Holm-corrected): "
            f"{', '.join(tested)}; with these seeds they are tied, and more seeds would separate them "
            "(command below)."
        )
    if weighed.untested:
        pairs = min(weighed.diffs[n].n for n in weighed.untested)
        reasons.append(
            f"No test could run between {best} and {', '.join(weighed.untested)}: "
            f"{pairs} paired seed{'s' if pairs != 1 else ''}, and a paired t-test needs at least {MIN_PAIRS}; "
            "so nothing says whether they differ, and more seeds would (command below)."
        )
    return reasons


def caveat_reasons(weighed: CellChoice, facts: StudyFacts, situation: Situation) -> list[str]:
    """What limits the advice: busy-machine timings, another device, depth or task type, and the excluded
    variants."""
    deploy, depth = situation.deploy, situation.depth
    reasons = []
    spread = max((s for n in weighed.eligible if (s := step_time_spread(weighed.variants[n]))), default=None)
    if spread and spread > 1.5:
        reasons.append(
            f"Step times of one variant vary up to {spread:.1f}x between its seeds: the machine was busy "
            "while they ran, so the speed differences quoted here are unreliable."
        )
    if deploy and facts.device not in ("?", "cuda" if deploy == "gpu" else "cpu"):
        reasons.append(f"Timings come from {facts.device}; on a {deploy} deployment the speed ordering may differ.")
    if depth is not None and depth != facts.n_layers:
        reasons.append(
            f"You plan {depth} layers but the measurement has {facts.n_layers}: gaps between FFNs "
            f"can change with depth; measure at your depth (command below)."
        )
    measured_type = "cv" if facts.task == "image" else "nlp"
    if situation.task_type and situation.task_type != measured_type:
        task = "--task image" if situation.task_type == "cv" else "--task lm, cls or tokens"
        reasons.append(
            f"You said task type {situation.task_type.upper()}, but the store measured task {facts.task} "
            f"({measured_type.upper()}): its gaps may not hold there; measure on your own task ({task})."
        )
    for n, why in weighed.excluded.items():
        reasons.append(f"{n} excluded: {why}.")
    return reasons


def measured_alternatives(weighed: CellChoice) -> list[Alternative]:
    """Every variant but the recommended one: why excluded, or its numbers against the recommendation."""
    variants, choice = weighed.variants, weighed.choice
    alternatives: list[Alternative] = []
    for n in variants:
        if n == choice:
            continue
        if n in weighed.excluded:
            alternatives.append(ExcludedAlternative(n, weighed.excluded[n]))
            continue
        d = paired_diff(variants[n].values, variants[choice].values)
        gap, step_time, choice_step_time = weighed.diffs.get(n), weighed.step_time(n), weighed.step_time(choice)
        alternatives.append(
            MeasuredAlternative(
                ffn=n,
                mean=weighed.mean[n],
                delta_vs_recommendation=d.delta,
                ci=[d.ci_low, d.ci_high],
                p=d.p,
                p_adj_vs_best=gap.p_adj if gap else None,
                step_time_ratio=step_time / choice_step_time if step_time and choice_step_time else None,
                params=variants[n].value(PARAMS),
                summary=f"{weighed.versus(n, choice)}; {weighed.costs(n, choice)}",
            )
        )
    return alternatives


def cell_evidence(advice: Advice) -> MeasuredEvidence:
    """The evidence of a cell's advice (`advise_cell`)."""
    assert isinstance(advice.evidence, MeasuredEvidence)
    return advice.evidence
