"""Per-cell summaries of a study: the one place where stored runs become the numbers people read.

A cell is one combination of a study's axis values (depth=6, placement=pre, ...); cells are never
merged. `compare` (its table, --json and --csv), `report` and `advise` all read the rows built
here, so the three can never disagree about a number.

Stored runs (`RunRecord`) become a `Summary` of `Cell`s, each with a `VariantRow` per variant: the paired
statistics of `ffnlab.study.stats.compare` on the task's ranking metric, the per-seed values they came
from, and every other metric of `ffnlab.study.metrics.METRICS` over the variant's finished seeds, and the cell's FFN
gradient norms by depth with the claim tested on them (`layer_grads`), which `compare --json` and the report share.
`summarize_study` reads the store; `summarize` reads no file.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ffnlab._util.text import and_list, key_values
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.core.model import describe_attn_act, parse_attn_act, qkv_act_spec
from ffnlab.data.glue import GlueTask, is_glue, parse_glue
from ffnlab.data.pairs import is_pair, text_fields
from ffnlab.run.config import TrainConfig
from ffnlab.run.result import RunResult
from ffnlab.run.scores import glue_score
from ffnlab.run.train import train_flops
from ffnlab.study.metrics import (
    glue_task_score,
    mean_of,
    official_metrics,
    ranked_metric,
    ranking_metric,
    row_metrics,
)
from ffnlab.study.plan import TUNED_AXES, CellKey, Study, gated_variants, group_key, plan, plan_precision, run_id
from ffnlab.study.published import RankAgreement, rank_agreement
from ffnlab.study.records import (
    AcrossCells,
    Aggregate,
    Cell,
    Controls,
    DepthClaim,
    GapAcrossCells,
    LayerGrads,
    RatioGap,
    RunRecord,
    RunStatus,
    StudyScaling,
    StudySettings,
    Summary,
    VariantDepth,
    VariantRow,
)
from ffnlab.study.scaling import ScalingRun, fit_scaling
from ffnlab.study.stats import (
    MIN_PAIRS,
    VariantStats,
    compare,
    gap_heterogeneity,
    holm,
    mean_ci,
    paired_diff,
    seed_noise,
)
from ffnlab.study.store import Store

if TYPE_CHECKING:  # the protocol runs studies, which this module summarises
    from ffnlab.study.protocol import Protocol

LEVEL = 0.95
# a cell's planned runs: each config with its store record (None where not yet run)
CellRuns = list[tuple[TrainConfig, RunRecord | None]]


def seeds_text(seeds: dict[str, list[int]]) -> str:
    """'relu seeds 0, 1; gelu seed 2': a verdict's runs left out, per variant."""
    return "; ".join(f"{v} seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))}" for v, ss in seeds.items())


def summarize_cell(items: CellRuns, variants: list[str], baseline: str, seeds: int, axes: dict[str, Any]) -> Cell:
    """One cell's summary from its (config, store record) pairs.

    Seeds below `seeds` are the paired comparison; the baseline's seeds from `seeds` on are its
    noise-floor runs. Each row holds the statistics of the task's ranking metric and every other metric
    of `ffnlab.study.metrics.METRICS` over the variant's finished paired seeds."""
    task = items[0][0].model.task
    ranking = ranking_metric(task)
    values: dict[str, dict[int, float]] = {v: {} for v in variants}
    diverged = {v: 0 for v in variants}
    results: dict[str, list[RunResult]] = {v: [] for v in variants}
    ended: dict[str, list[RunResult]] = {v: [] for v in variants}  # finished and diverged: what `ended` metrics count
    runs = {v: 0 for v in variants}
    missing: dict[str, list[int]] = {}
    undefined: dict[str, list[int]] = {}  # finished, but their ranking metric is undefined (Metric.undefined)
    noise = []
    for cfg, rec in items:
        v = cfg.model.ffn
        result = rec.result if rec is not None and rec.status is RunStatus.FINISHED else None
        value: float | None = ranking.value(result) if result is not None else None
        diverged_run = rec is not None and rec.status is RunStatus.DIVERGED
        if result is not None and value is None and ranking.undefined:  # its other metrics still stand
            if cfg.seed < seeds:
                undefined.setdefault(v, []).append(cfg.seed)
                runs[v] += 1
                ended[v].append(result)
                results[v].append(result)
            continue
        if not diverged_run and value is None:
            missing.setdefault(v, []).append(cfg.seed)  # failed, not yet run, or a result without its metric
            continue
        if cfg.seed >= seeds:
            if value is not None:  # a noise-floor seed that did not diverge
                noise.append(value)
            continue
        runs[v] += 1
        if rec is not None and rec.result is not None:
            ended[v].append(rec.result)
        if value is None or result is None:  # diverged
            diverged[v] += 1
            values[v][cfg.seed] = math.nan
            continue
        values[v][cfg.seed] = value
        results[v].append(result)
    stats = compare(values, baseline, higher_is_better=ranking.better == "higher", diverged=diverged, level=LEVEL)
    test = ranking.on("test")  # what a tuned comparison compares
    rows = []
    for row in stats.variants:
        done = sorted(results[row.ffn], key=lambda r: r.seed)
        rows.append(
            VariantRow.of(
                row,
                values={s: x for s, x in sorted(values[row.ffn].items()) if math.isfinite(x)},
                test_values={r.seed: x for r in done if (x := test.value(r)) is not None},
                runs=runs[row.ffn],
                metrics={m.name: m.of(ended[row.ffn] if m.ended else done, task) for m in row_metrics()},
            )
        )
    cell = Cell(
        axes=dict(axes),
        task=task,
        metric=ranking.name,
        baseline=baseline,
        metric_direction=stats.metric_direction,
        alpha=stats.alpha,
        level=stats.level,
        variants=rows,
        verdict=stats.verdict,
        missing=missing,
    )
    if missing:  # failed, or not run yet: the statistics rest on fewer seeds than planned, and say so
        cell.verdict += f" Not finished (failed or not yet run), so left out: {seeds_text(missing)}."
    if undefined:
        cell.verdict += f" {ranking.label} is undefined ({ranking.undefined}), so left out: {seeds_text(undefined)}."
    if task == "lm":  # the published table is a language-modelling loss
        cell.literature = rank_agreement({r.ffn: r.mean for r in rows})
    if noise:
        base = values[baseline]
        cell.noise_floor = seed_noise(noise + [base[s] for s in base if math.isfinite(base[s])])
    return cell


def tuned_cells(cells: list[Cell], axes: Sequence[str] = ("lr",)) -> list[Cell]:
    """Each variant at its own best setting of `axes` (chosen on validation), compared on the test split.

    Cells that differ only in `axes` form a group; within it, a variant's setting is the cell with
    its best mean validation metric over seeds, and the comparison uses that cell's per-seed test
    metric, paired by seed. Choosing on validation and reporting on test keeps the selection from
    flattering the winner (Melis et al. 2018). Returns one cell per group, with axes[a] = "tuned"
    for each tuned axis and each row's chosen value of each axis and its validation mean in `row.tuned`.
    """
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    groups: dict[CellKey, list[Cell]] = {}
    for c in cells:
        key = tuple((k, v) for k, v in c.axes.items() if k not in axes)
        groups.setdefault(key, []).append(c)
    out = []
    for key, group in groups.items():
        sign = -1.0 if group[0].metric_direction == "higher" else 1.0
        chosen: dict[str, dict[str, Any]] = {}
        test_values: dict[str, dict[int, float]] = {}
        for v in [r.ffn for r in group[0].variants]:
            measured = [(c.axes, c.row(v), mean) for c in group if (mean := c.row(v).mean) is not None]
            test_values[v] = {}
            if measured:
                where, row, mean = min(measured, key=lambda measure: sign * measure[2])
                chosen[v] = {**{a: where[a] for a in axes}, "val_mean": mean}
                test_values[v] = dict(row.test_values)
        stats = compare(test_values, group[0].baseline, higher_is_better=sign < 0, level=LEVEL)
        rows = [
            VariantRow.of(r, tuned={a: chosen.get(r.ffn, {}).get(a) for a in (*axes, "val_mean")})
            for r in stats.variants
        ]
        out.append(
            Cell(
                axes={**dict(key), **{a: "tuned" for a in axes}},
                task=group[0].task,
                metric=ranked_metric(group[0].metric).on("test").name,
                baseline=stats.baseline,
                metric_direction=stats.metric_direction,
                alpha=stats.alpha,
                level=stats.level,
                variants=rows,
                verdict=stats.verdict,
                tuned_axes=list(axes),
                selected_on=group[0].metric,
            )
        )
    return out


def across_cells(cells: list[Cell], baseline: str, alpha: float = 0.05) -> AcrossCells | None:
    """Whether each variant's gap to the baseline changes between the cells of a study (None with one cell):
    per variant a repeated-measures F test on its per-seed gaps (`ffnlab.study.stats.gap_heterogeneity`),
    Holm-corrected over the variants, its mean gap in each cell, the best mean of each cell, and sentences.
    """
    if len(cells) < 2:
        return None
    labels = [key_values(c.axes) for c in cells]
    tests = {}
    for v in (r.ffn for r in cells[0].variants if r.ffn != baseline):
        gaps = []
        for c in cells:
            ours, base = c.row(v).values, c.row(baseline).values
            gaps.append({s: x - base[s] for s, x in ours.items() if s in base})
        tests[v] = gap_heterogeneity(gaps)
    variants = {
        v: GapAcrossCells(
            **asdict(test),
            gaps=[c.row(v).delta for c in cells],
            p_adj=p_adj,
            differs=p_adj is not None and p_adj < alpha,
        )
        for (v, test), p_adj in zip(tests.items(), holm([t.p for t in tests.values()]))
    }
    best = [best_mean(c.variants) for c in cells]
    return AcrossCells(
        cells=labels,
        variants=variants,
        best=best,
        alpha=alpha,
        sentences=across_sentences(labels, variants, best, baseline),
    )


def best_mean(rows: list[VariantRow]) -> list[str]:
    """The variants of a cell's rows (best first) with its best mean: one, or every one of them on an exact
    tie (0.5625 = 0.5625), which shares rank 1; none where no variant has a mean."""
    return [r.ffn for r in rows if r.rank == 1 and r.mean is not None]


def best_text(names: list[str]) -> str:
    """'gelu', or 'gelu and relu (tied)': who has a cell's best mean (`best_mean`)."""
    return and_list(names) + (" (tied)" if len(names) > 1 else "")


def across_sentences(
    labels: list[str], variants: dict[str, GapAcrossCells], best: list[list[str]], baseline: str
) -> list[str]:
    """Plain words for `across_cells`: a sentence per variant, then the best mean of each cell."""
    out = []
    for v, r in variants.items():
        if r.p is None or r.p_adj is None:
            out.append(f"{v}: no test of its gap across cells (needs ≥{MIN_PAIRS} seeds finished in every cell).")
            continue
        gaps = "; ".join(f"{g:+.4f} at {where}" for g, where in zip(r.gaps, labels) if g is not None)
        f_text = "" if r.f is None or r.df is None else f"F({r.df[0]}, {r.df[1]}) = {r.f:.2f}, "
        test = f"{f_text}p_adj = {r.p_adj:.3g}"
        verb = "changes between cells" if r.differs else "shows no detectable change between cells"
        out.append(f"{v}'s gap to {baseline} {verb} ({test}): {gaps}.")
    if all(best) and all(b == best[0] for b in best):
        who = best[0][0] if len(best[0]) == 1 else f"tied between {and_list(best[0])}"
        out.append(f"The best mean is {who} in every cell.")
    elif all(best):
        out.append(
            "The best mean differs between cells: "
            + "; ".join(f"{best_text(b)} at {w}" for b, w in zip(best, labels))
            + "."
        )
    return out


def aggregate(cells: list[Cell], baseline: str) -> list[Aggregate]:
    """GLUE-style averages over the datasets of a study's data axis: one per group of classification cells
    that differ only in `data` (two datasets or more), each `data_average`. None for a language model: a loss
    per token depends on each dataset's text and tokenizer, so an average of losses says little."""
    groups: dict[CellKey, list[Cell]] = {}
    for c in cells:
        if "data" in c.axes and c.task != "lm" and not is_glue(c.axes["data"]):  # GLUE's tasks: `glue_aggregate`
            groups.setdefault(tuple((k, v) for k, v in c.axes.items() if k != "data"), []).append(c)
    return [data_average(group, baseline, dict(key)) for key, group in groups.items() if len(group) > 1]


def data_average(group: list[Cell], baseline: str, axes: dict[str, Any]) -> Aggregate:
    """The average of each variant's ranking metric over the datasets of `group` (a cell per dataset), paired
    over datasets and seeds: per seed the mean over the datasets, then `compare` over the seeds as in a cell
    (the mean and its t-interval, the difference to the baseline paired by seed, Holm over the variants).

        average_v(s) = (1 / D) sum_d value_v(d, s)     for each seed s finished on all D datasets

    A seed missing or diverged on some dataset is left out of that variant's average (`left_out`), so the
    average can differ from the mean of the per-dataset means (`scores`) by what that seed adds there."""
    first = group[0]
    names = [r.ffn for r in first.variants]
    values: dict[str, dict[int, float]] = {}
    left_out: dict[str, list[int]] = {}
    for v in names:
        per_dataset = [c.row(v).values for c in group]
        complete = set.intersection(*(set(x) for x in per_dataset))
        values[v] = {s: math.fsum(x[s] for x in per_dataset) / len(group) for s in sorted(complete)}
        partial = set[int]().union(*per_dataset) - complete
        if partial:
            left_out[v] = sorted(partial)
    stats = compare(values, baseline, higher_is_better=first.metric_direction == "higher", alpha=first.alpha,
                    level=first.level)  # fmt: skip
    return Aggregate(
        axes=axes,
        datasets=[c.axes["data"] for c in group],
        metric=first.metric,
        baseline=baseline,
        metric_direction=stats.metric_direction,
        alpha=stats.alpha,
        level=stats.level,
        scores={v: [c.row(v).mean for c in group] for v in names},
        values=values,
        variants=stats.variants,
        left_out=left_out,
        verdict=stats.verdict,
    )


GLUE_NOTE = (
    "GLUE score (Wang et al. 2019): each task's score is the mean of its official metrics on GLUE's dev set, the "
    "test split here (CoLA Matthews; MRPC, QQP F1 and accuracy; STS-B Pearson and Spearman; MNLI matched and "
    "mismatched accuracy; the others accuracy), the score the mean over the tasks, MNLI once; as fractions, not "
    "GLUE's percent. Per seed over the tasks, then over the seeds with its t-interval; Δ paired by seed, Holm over "
    "the variants. Validation (10% of train by text hash) ranks each cell and is never reported here."
)


def glue_aggregate(study: Study, cells: dict[CellKey, CellRuns]) -> list[Aggregate]:
    """GLUE's score over the GLUE tasks of a study's data axis (ffnlab.data.glue): one per setting of its other
    axes, each `glue_average` of the cells there that hold a GLUE task."""
    groups: dict[CellKey, list[tuple[str, CellRuns]]] = {}
    for key, items in cells.items():
        data = dict(key).get("data")
        if isinstance(data, str) and is_glue(data) and parse_glue(data)[1] is not None:
            groups.setdefault(tuple((k, v) for k, v in key if k != "data"), []).append((data, items))
    return [glue_average(study, group, dict(key)) for key, group in groups.items()]


def glue_average(study: Study, group: list[tuple[str, CellRuns]], axes: dict[str, Any]) -> Aggregate:
    """The GLUE score of each variant over the tasks of `group` ((data, runs) per task), paired over tasks and
    seeds as `data_average` is:

        score_v(s) = (1 / T) sum_t task_score_t(v, s)     for each seed s finished on all T tasks

    task_score the mean of the task's official metrics on its test split, GLUE's dev set (`glue_task_score`).
    A seed missing, diverged or without a metric on some task is left out (`left_out`). The columns are each
    task's official metrics, the variant's mean over its finished seeds."""
    tasks: list[GlueTask] = [task for data, _ in group if (task := parse_glue(data)[1]) is not None]
    per_task: dict[str, list[dict[int, float]]] = {v: [{} for _ in group] for v in study.variants}
    metrics: dict[str, list[dict[str, list[float]]]] = {v: [{} for _ in group] for v in study.variants}
    for i, (_, items) in enumerate(group):
        for cfg, rec in items:
            if cfg.seed >= study.seeds or rec is None or rec.status is not RunStatus.FINISHED or rec.result is None:
                continue  # noise-floor seeds are unpaired; unfinished and diverged runs have no score
            for name, value in official_metrics(rec.result, tasks[i]).items():
                if value is not None:
                    metrics[cfg.model.ffn][i].setdefault(name, []).append(value)
            if (score := glue_task_score(rec.result)) is not None:
                per_task[cfg.model.ffn][i][cfg.seed] = score
    values: dict[str, dict[int, float]] = {}
    left_out: dict[str, list[int]] = {}
    for v, scores in per_task.items():
        complete = set.intersection(*(set(x) for x in scores))
        values[v] = {s: glue_score({t.name: x[s] for t, x in zip(tasks, scores)}) for s in sorted(complete)}
        if partial := set[int]().union(*scores) - complete:
            left_out[v] = sorted(partial)
    assert study.baseline is not None  # Study.__post_init__ names one
    stats = compare(values, study.baseline, higher_is_better=True, level=LEVEL)
    columns = [f"{t.title} {heading}" for t in tasks for heading in t.headings]
    means = {v: [mean_of(x.get(m, [])) for x, t in zip(metrics[v], tasks) for m in t.metrics] for v in values}
    return Aggregate(axes=axes, datasets=[data for data, _ in group], metric="glue_score", baseline=study.baseline,
                     metric_direction=stats.metric_direction, alpha=stats.alpha, level=stats.level, scores=means,
                     values=values, variants=stats.variants, left_out=left_out, verdict=stats.verdict,
                     columns=columns, note=GLUE_NOTE)  # fmt: skip


# ---- FFN gradients by depth (issue #27): the figure's numbers and the bottom/top claim --------------

GRAD_NORM = "grad_norm/"  # the store's per-FFN gradient norms, 'grad_norm/blocks.0.ffn' (ffnlab.run.monitors)
CLAIM_VARIANT = "gelu"  # the claim is GELU's: the dense GELU variant's ratio against every other variant's
HOLDS, FAILS, NOT_SEPARATED = "holds", "does not hold", "not separated by these seeds"


def ffn_layer(name: str) -> int | None:
    """The block an FFN module sits in: the first number in its name ('blocks.3.ffn' -> 3; a mixed FFN's branch
    'blocks.3.ffn.branches.1' -> 3; a Hugging Face model's 'model.layers.2.mlp' -> 2); None without one."""
    match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(match.group(1)) if match else None


def layer_grad_norms(series: dict[str, dict[int, float]], warmup_steps: int) -> dict[int, dict[int, float]]:
    """layer -> {step: the norm of that layer's FFN gradient} at the steps logged after warm-up
    (step >= warmup_steps: the learning rate has reached its peak), finite values only.

    series: a run's stored metrics, name -> {step: value}. A mixed FFN's branches are logged apart; a layer's
    norm is that of their joint gradient, sqrt(sum of the branches' squared norms)."""
    squares: dict[int, dict[int, float]] = {}
    for name, values in series.items():
        layer = ffn_layer(name.removeprefix(GRAD_NORM)) if name.startswith(GRAD_NORM) else None
        if layer is None:
            continue
        for step, norm in values.items():
            if step >= warmup_steps and math.isfinite(norm):
                squares.setdefault(layer, {})
                squares[layer][step] = squares[layer].get(step, 0.0) + norm * norm
    return {layer: {step: math.sqrt(sq) for step, sq in by_step.items()} for layer, by_step in sorted(squares.items())}


@dataclass(frozen=True)
class RunDepth:
    """One run's FFN gradient norms by depth (`run_depth`), over the steps it logged after warm-up."""

    seed: int
    layers: dict[int, float]  # layer (0 = bottom) -> the median over those steps of its FFN's gradient norm
    ratio: float | None  # the median over those steps of layer 0's norm / the top layer's; None: no such step
    steps: int  # logged steps after warm-up


def run_depth(seed: int, series: dict[str, dict[int, float]], warmup_steps: int) -> RunDepth | None:
    """A run's per-layer FFN gradient norms, median over the steps logged after warm-up, and its bottom/top ratio:
    at each such step, layer 0's norm over the top layer's (the step's overall gradient scale cancels), then the
    median over steps. None where the run logged no per-layer norm after warm-up."""
    norms = layer_grad_norms(series, warmup_steps)
    if not norms:
        return None
    bottom, top = norms.get(0, {}), norms[max(norms)]
    ratios = [bottom[s] / top[s] for s in bottom.keys() & top.keys() if top[s] > 0]
    return RunDepth(
        seed=seed,
        layers={layer: statistics.median(by_step.values()) for layer, by_step in norms.items()},
        ratio=statistics.median(ratios) if ratios and len(norms) > 1 else None,
        steps=len({step for by_step in norms.values() for step in by_step}),
    )


def variant_depth(runs: list[RunDepth], level: float) -> VariantDepth:
    """A variant's runs by depth: per layer the seeds' mean and range, and the mean of their ratios with its
    t-interval."""
    layers = sorted({layer for r in runs for layer in r.layers})
    per_layer = [[r.layers[layer] for r in runs if layer in r.layers] for layer in layers]
    ratios = {r.seed: r.ratio for r in runs if r.ratio is not None}
    return VariantDepth(
        seeds=[r.seed for r in runs],
        layers=layers,
        mean=[statistics.mean(values) for values in per_layer],
        low=[min(values) for values in per_layer],
        high=[max(values) for values in per_layer],
        ratios=ratios,
        ratio=mean_ci(list(ratios.values()), level),
    )


def pair_verdict(delta: float | None, p_adj: float | None, alpha: float) -> str:
    """HOLDS when GELU's log ratio is significantly higher (Holm-adjusted p below alpha), FAILS when significantly
    lower, NOT_SEPARATED otherwise (no test below MIN_PAIRS seeds counts as not separated)."""
    if delta is None or p_adj is None or p_adj >= alpha or delta == 0:
        return NOT_SEPARATED
    return HOLDS if delta > 0 else FAILS


def depth_claim(ratios: dict[str, dict[int, float]], alpha: float = 0.05, level: float = 0.95) -> DepthClaim:
    """Test the claim on bottom/top ratios, variant -> {seed: ratio}: GELU's log ratio against each other variant's,
    paired over seeds (`paired_diff`), Holm-corrected over the other variants. It holds when GELU's ratio is
    significantly higher than every other variant's, does not hold when it is significantly lower than some
    variant's, and is not separated by these seeds otherwise."""
    if CLAIM_VARIANT not in ratios:
        return DepthClaim(
            CLAIM_VARIANT,
            [],
            None,
            f"the study has no {CLAIM_VARIANT} variant, and the claim is {CLAIM_VARIANT}'s",
            "-",
        )
    others = [v for v in ratios if v != CLAIM_VARIANT]
    if not others:
        return DepthClaim(
            CLAIM_VARIANT, [], None, f"the study has no variant besides {CLAIM_VARIANT} to compare with", "-"
        )

    def logs(by_seed: dict[int, float]) -> dict[int, float]:
        return {s: math.log(r) if r > 0 else math.nan for s, r in by_seed.items()}

    pairs = [paired_diff(logs(ratios[CLAIM_VARIANT]), logs(ratios[v]), level) for v in others]
    adjusted = holm([d.p for d in pairs])
    gaps = [RatioGap(v, d, p, pair_verdict(d.delta, p, alpha)) for v, d, p in zip(others, pairs, adjusted)]
    verdicts = {g.verdict for g in gaps}
    verdict = FAILS if FAILS in verdicts else HOLDS if verdicts == {HOLDS} else NOT_SEPARATED
    measured = {HOLDS: "higher", FAILS: "lower", NOT_SEPARATED: "not separated"}[verdict]
    return DepthClaim(CLAIM_VARIANT, gaps, verdict, "", measured)


def layer_grads(
    runs: dict[str, list[tuple[int, int, dict[str, dict[int, float]]]]], n_layers: int, alpha: float, level: float
) -> LayerGrads | str:
    """Per variant, the FFN gradient norm by layer and the bottom/top ratio over seeds, and the claim tested on
    the ratios; a note saying why there are none where the models have one layer or the store holds no per-layer
    norms. runs: variant -> (seed, warm-up steps, the run's metrics: name -> {step: value}) of its finished runs."""
    if n_layers < 2:
        return f"the models have {n_layers} layer: gradients by depth need at least 2 (--layers 2 or a depth axis)"
    depths: dict[str, list[RunDepth]] = {}
    left_out = []
    for variant, items in runs.items():
        for seed, warmup, series in items:
            depth = run_depth(seed, series, warmup)
            if depth is None:
                left_out.append(f"{variant} seed {seed}")
            else:
                depths.setdefault(variant, []).append(depth)
    if not any(len(r.layers) > 1 for rs in depths.values() for r in rs):
        return (
            "the store holds no per-layer FFN gradient norms after warm-up for these runs (they are logged every "
            "log_every steps from step 0: a run shorter than its warm-up logs none after it)"
        )
    variants = {v: variant_depth(rs, level) for v, rs in depths.items()}
    return LayerGrads(
        variants=variants,
        claim=depth_claim({v: d.ratios for v, d in variants.items()}, alpha, level),
        warmup_steps=sorted({warmup for items in runs.values() for _, warmup, _ in items}),
        steps=(min(r.steps for rs in depths.values() for r in rs), max(r.steps for rs in depths.values() for r in rs)),
        left_out=left_out,
    )


# run id -> its logged per-FFN gradient norms, metric name ('grad_norm/blocks.0.ffn') -> {step: value}
GradNorms = dict[str, dict[str, dict[int, float]]]


def study_grad_norms(store_path: str | os.PathLike[str], cells: dict[CellKey, CellRuns], seeds: int) -> GradNorms:
    """The per-FFN gradient norms (GRAD_NORM) the store logged for each finished paired run of `cells` (an empty
    series for a run that logged none), which `summarize` tests the claim by depth on."""
    out: GradNorms = {}
    with Store(Path(store_path), read_only=True) as store:
        for cfg, rec in (item for items in cells.values() for item in items):
            if rec is None or rec.status is not RunStatus.FINISHED or rec.result is None or cfg.seed >= seeds:
                continue
            series = out.setdefault(rec.id, {})
            for step, name, value in store.metrics(rec.id):
                if name.startswith(GRAD_NORM):
                    series.setdefault(name, {})[step] = value
    return out


def cell_depth(
    items: CellRuns, grad_norms: GradNorms, variants: list[str], alpha: float, level: float
) -> LayerGrads | str:
    """`layer_grads` of one cell: its finished paired runs' norms (`study_grad_norms`), per variant in the
    study's order, at the cell's depth."""
    runs: dict[str, list[tuple[int, int, dict[str, dict[int, float]]]]] = {v: [] for v in variants}
    for cfg, rec in items:
        if rec is not None and rec.id in grad_norms:
            runs[cfg.model.ffn].append((cfg.seed, cfg.warmup_steps, grad_norms[rec.id]))
    n_layers = max((cfg.model.n_layers for cfg, _ in items), default=0)  # one depth per cell
    return layer_grads({v: r for v, r in runs.items() if r}, n_layers, alpha, level)


# ---- words for the numbers, shared by the terminal table and the report ----------------------------


def p_label(row: VariantStats, baseline: str) -> str:
    """A row's Holm-adjusted p as shown: '-' for the baseline, 'n/a (needs ≥3 seeds)' where untested."""
    if row.ffn == baseline:
        return "-"
    return f"n/a (needs ≥{MIN_PAIRS} seeds)" if row.p_adj is None else f"{row.p_adj:.3f}"


def literature_text(lit: RankAgreement) -> str:
    """The rank agreement of a cell with the published table, and each pair ordered differently."""
    pairs = "; ".join(
        f"{a} vs {b}: measured {m[0]:.4f} vs {m[1]:.4f}, published {p[0]:.3f} vs {p[1]:.3f}"
        for (a, b), m, p in ((d.pair, d.measured, d.published) for d in lit.disagree)
    )
    tau = "n/a" if lit.tau is None else f"{lit.tau:.2f}"
    return f"Rank agreement with {lit.source} over {lit.n} shared variants: Kendall τ = {tau}. " + (
        f"Pairs ordered differently: {pairs}." if pairs else "Every pair is ordered the same way."
    )


# ---- a whole study ----------------------------------------------------------------------------------


def study_records(
    study: Study, store_path: str | os.PathLike[str], runs: list[TrainConfig] | None = None
) -> dict[CellKey, CellRuns]:
    """The study's planned runs with their store records (None where not yet run), grouped by cell
    (`ffnlab.study.plan.group_key`: the cell's axis values as (axis, value) pairs)."""
    runs = plan(study) if runs is None else runs
    cells: dict[CellKey, CellRuns] = {}
    with Store(Path(store_path), read_only=True) as store:
        for cfg in runs:
            cells.setdefault(group_key(cfg, study), []).append((cfg, store.get(run_id(cfg))))
    return cells


def summarize_study(
    study: Study,
    store_path: str | os.PathLike[str],
    runs: list[TrainConfig] | None = None,
    extrapolate_to: float | None = None,
) -> Summary:
    """The study's summary: one `summarize_cell` per cell of its axes (never merged), plus, with an lr axis,
    the tuned comparison (`tuned_cells`), and with --scale axes the loss-vs-compute fits (`scaling_of`;
    `extrapolate_to` FLOPs adds a multiplier there, marked as an extrapolation). Reads the store and, where the
    study sets anything per variant, the protocol.json beside it; `summarize` then reads no file."""
    from ffnlab.study.protocol import load_protocol  # the protocol runs studies, which this module summarises

    protocol = load_protocol(store_path) if study.per_variant else None
    cells = study_records(study, store_path, runs)
    grad_norms = study_grad_norms(store_path, cells, study.seeds)
    return summarize(study, cells, store_path, protocol, extrapolate_to, grad_norms)


def summarize(
    study: Study,
    cells: dict[CellKey, CellRuns],
    store_path: str | os.PathLike[str],
    protocol: Protocol | None = None,
    extrapolate_to: float | None = None,
    grad_norms: GradNorms | None = None,
) -> Summary:
    """`summarize_study` of the runs `study_records` read, without reading a file: `store_path` only names the
    store in the summary, `protocol` is the store's protocol.json (`load_protocol`), None where it has none, and
    `grad_norms` the runs' per-FFN gradient norms (`study_grad_norms`) each cell's claim by depth is tested on
    (None: not read, and the cells have no `depth`)."""
    baseline = study.baseline
    assert baseline is not None  # Study.__post_init__ names one
    out_cells = [
        summarize_cell(items, study.variants, baseline, study.seeds, dict(key)) for key, items in cells.items()
    ]
    if grad_norms is not None:
        for cell, items in zip(out_cells, cells.values()):
            cell.depth = cell_depth(items, grad_norms, study.variants, cell.alpha, cell.level)
    tuned = [a for a in TUNED_AXES if a in study.axes]
    return Summary(
        store=str(store_path),
        baseline=baseline,
        seeds=study.seeds,
        settings=settings_of(study, chosen_by_protocol(study, protocol), trainable_of(cells)),
        cells=out_cells,
        across_cells=across_cells(out_cells, baseline, out_cells[0].alpha),
        aggregate=aggregate(out_cells, baseline) + glue_aggregate(study, cells),
        tuned=tuned_cells(out_cells, tuned) if tuned else [],
        scaling=(
            scaling_of(study, [item for items in cells.values() for item in items], extrapolate_to)
            if study.scale
            else None
        ),
    )


def chosen_by_protocol(study: Study, protocol: Protocol | None) -> bool:
    """Whether the study's per-variant settings are those the validation protocol chose for the store
    (`protocol`, its protocol.json: `ffnlab.study.protocol.load_protocol`), not ones the user set."""
    return bool(study.per_variant) and protocol is not None and protocol.choice == study.per_variant


def scaling_of(study: Study, items: CellRuns, extrapolate_to: float | None = None) -> StudyScaling:
    """`ffnlab.study.scaling.fit_scaling` over the study's paired seeds: each run's training compute
    (`train_flops`) against its final metric; no fits, and why, while fewer than 3 computes have finished."""
    ranking = ranking_metric(items[0][0].model.task)
    scale = {a: study.axes[a] for a in study.scale}
    runs = []
    for cfg, rec in items:
        if cfg.seed >= study.seeds or rec is None or rec.result is None:
            continue  # noise-floor seeds are unpaired; unfinished runs have no point yet
        res = rec.result
        costs = res.costs
        compute = costs.train_flops or train_flops(costs.flops_per_token, costs.tokens)  # older stores
        loss = ranking.value(res) if rec.status is RunStatus.FINISHED else None
        runs.append(ScalingRun(cfg.model.ffn, cfg.seed, compute, loss or math.nan))
    try:
        assert study.baseline is not None  # Study.__post_init__ names one
        fits = fit_scaling(runs, study.baseline, level=LEVEL, extrapolate_to=extrapolate_to)
    except ValueError as e:  # too few finished sizes yet (a study still running, or many diverged)
        return StudyScaling(scale=scale, metric=ranking.name, fits=None, error=str(e))
    return StudyScaling(scale=scale, metric=ranking.name, fits=fits)


def trainable_of(cells: dict[CellKey, CellRuns]) -> tuple[int, int] | None:
    """(parameters trained, parameters) of the study's first run with a result that counted them: the same for
    every variant of a fine-tune, whose swap changes an activation only; None before any run finished."""
    results = (rec.result for items in cells.values() for _, rec in items if rec is not None and rec.result)
    costs = (r.costs for r in results)
    return next(((c.trainable_params, c.params) for c in costs if c.trainable_params is not None), None)


def settings_of(
    study: Study, chosen_by_protocol: bool = False, trainable: tuple[int, int] | None = None
) -> StudySettings:
    """The run settings a reader needs to judge a comparison, with what it held equal and what not;
    `chosen_by_protocol`: the per-variant settings are the validation protocol's choice, not the user's;
    `trainable`: (parameters trained, parameters) as the runs counted them (`trainable_of`), for a fine-tune's
    statement of what trained."""
    from ffnlab.tools.lora import trained_text

    b = study.base
    trained = trained_text(b.to_dict(), *(trainable or (None, None)))
    controls = held_equal(study, chosen_by_protocol, trained)
    image = b.model.task == "image"  # a ViT: its tokens are patches, as many as the data's image size makes
    shape = ("image_size", "patch_size", "pool") if image else ("context",)
    if b.hf_config or b.init_from:  # a Hugging Face architecture's shape (a pretrained folder's config.json); its
        # norm, positions and dropout are its config's
        from ffnlab.tools.hf import hf_shape
        from ffnlab.tools.pretrained import check_folder

        config = b.hf_config or check_folder(b.init_from or "")  # the two exclude each other (TrainConfig)
        model = hf_shape(config, b.model.task, b.model.context)
    else:
        model = {
            k: getattr(b.model, k)
            for k in ("n_layers", "n_heads", "d_model", *shape, "norm", "placement", "pos", "dropout")
        }
    return StudySettings(
        data=b.data,
        task=b.model.task,
        tokenizer=None if image else b.tokenizer,
        model=model,
        match=b.model.ffn_match,
        init=b.model.init,
        attn_act=qkv_act_spec(b.model),  # activations on Q, K, V (ModelConfig.attn_act)
        batch_size=b.batch_size,
        budget=(
            {"max_seconds": b.max_seconds}
            if b.max_seconds
            else {"max_tokens": b.max_tokens}
            if b.max_tokens
            else {"max_steps": b.max_steps}
        ),
        tokens_per_run=(
            (b.max_tokens or b.max_steps * b.global_batch * b.model.context) if not (b.max_seconds or image) else None
        ),
        lr=b.lr,
        min_lr=b.lr / 10 if b.min_lr is None else b.min_lr,
        warmup_steps=b.warmup_steps,
        weight_decay=b.weight_decay,
        beta2=b.beta2,
        grad_clip=b.grad_clip,
        precision=plan_precision(b),
        seeds=study.seeds,
        variants=study.variants,
        axes=study.axes,
        per_variant=study.per_variant,
        pretrained={"from": b.init_from, "digest": b.init_digest} if b.init_from else None,
        held_equal=controls.held_equal,
        not_equal=controls.not_equal,
        pair=text_fields(b.text_field) if is_pair(b.text_field) else None,
        nproc=b.nproc,
        grad_accum=b.grad_accum,
        trained=trained,
    )


def held_equal(study: Study, chosen_by_protocol: bool = False, trained: str | None = None) -> Controls:
    """The comparison's controls, in words: what it held equal and how, what not and why.

    Everything but the FFN is held equal by construction (same seed -> same data order and the same
    non-FFN weights); what cannot be, or was chosen not to be, is named rather than left implicit.
    An axis of the study is varied on purpose and compared only within its cells, so what it sets is named
    by the axis, never by the base's one value. Settings per variant are the user's, or the validation
    protocol's (`chosen_by_protocol`). A fine-tune names what trained (`trained`, `settings_of`'s)."""
    b = study.base
    lr = varied(study, "lr", "peak lr") or f"peak {b.lr:g}"
    warmup = varied(study, "warmup", "warm-up steps") or f"{b.warmup_steps} warm-up steps"
    min_lr = "lr/10" if b.min_lr is None else f"{b.min_lr:g}"
    equal = [
        ["data order", "seed s of every variant trains on the same batches in the same order"],
        ["evaluation", "the same fixed validation (and test) batches for every variant and seed"],
        ["non-FFN weights", "identical at the start for one seed: each parameter drawn from its own generator, "
                            "seeded by seed, name and shape"],
        ["learning rate and schedule", f"AdamW, {lr}, {warmup}, cosine to {min_lr}, "
                                       f"beta2 {b.beta2}, gradient clip {b.grad_clip}"],
        ["weight-decay groups",
         f"{b.weight_decay} on every matrix; none on biases, norms or learnable activation parameters"],
        ["precision", varied(study, "precision", "precision") or plan_precision(b)],
        attn_act_row(study),
    ]  # fmt: skip
    unequal = []
    if any(study.per_variant.values()):
        equal = [row for row in equal if row[0] != "learning rate and schedule"]
        unequal.append(per_variant_row(study, chosen_by_protocol))
    if b.init_from:  # fine-tuning: the folder's weights, widths and biases for every variant
        equal = [row for row in equal if row[0] != "non-FFN weights"]
        sources = [pretrained_rows(study, trained), budget_rows(study)]
    else:
        sources = [parameter_rows(study), init_rows(study), budget_rows(study), bias_rows(study)]
    sources.append(causality_rows(study))
    more = []
    if study.base.model.dropout:
        more.append(["dropout masks", "the same random stream for every variant with one seed"])
    more += glue_rows(study)
    if study.axes:
        axes = ", ".join(sorted(study.axes))
        more.append(
            ["study axes", f"{axes}: varied on purpose, compared within each cell; each gap tested across cells"]
        )
    dense = [v for v in study.variants if v not in gated_variants(study)]
    if "glu_norm" in study.axes and dense:
        more.append(
            ["glu_norm", f"norms around gated FFNs only: every cell trains the same model for {', '.join(dense)}"]
        )
    return sum(sources, Controls(equal, unequal)) + Controls(held_equal=more)


def glue_rows(study: Study) -> list[list[str]]:
    """What a study of GLUE's tasks (ffnlab.data.glue) holds equal within each task, and its protocol, in words."""
    tasks = [task for data in study.axes.get("data", []) if is_glue(data) and (task := parse_glue(data)[1])]
    if not tasks:
        return []
    examples = study.base.final_eval_batches * study.base.global_batch  # what `eval_set` takes of a split
    kinds = ", ".join(f"{t.title} {'reg (one output, MSE)' if t.task == 'reg' else 'cls'}"
                      f"{' of a sentence pair' if len(t.saved_text) > 1 else ''}" for t in tasks)  # fmt: skip
    return [
        ["GLUE tasks", f"{kinds}: a model per task, variant and seed; within a task every variant with seed s "
                       "starts from the same non-FFN weights and trains on the same batches in the same order, and "
                       "every task trains for the same budget"],
        ["GLUE protocol", f"test = each task's official dev set (GLUE hides its test labels), up to {examples:,} "
                          "examples of it evenly spaced (--final-eval-batches x the batch; all of a smaller one), "
                          "scored with the task's official metrics; validation = the 10% of train rows whose text "
                          "hashes last, which ranks each cell and is never reported as the GLUE score"],
    ]  # fmt: skip


def causality_rows(study: Study) -> Controls:
    """An LM whose activation reads the whole batch (scope 'batch': quantile ranks each token among all of
    the batch's) reads later positions of each sequence too: its loss is not strictly causal. Named, in the
    FFN of some variants or on Q/K/V of all, so that a reader does not take such a loss for a causal LM's."""
    if study.base.model.task != "lm" and "lm" not in study.axes.get("task", []):
        return Controls()
    why = "ranks each token among all of the batch's tokens, later positions of its own sequence included"
    rows = []
    reading = {v: acts for v in study.variants if (acts := reads_batch(get_ffn_spec(v).acts))}
    if reading:
        named = and_list(sorted({a for acts in reading.values() for a in acts}))
        rows.append(["causality", f"{and_list(list(reading))}: {named} {why}: not a strictly causal LM loss, "
                                  "unlike the other variants'"])  # fmt: skip
    qkv = [parse_attn_act(spec) for spec in study.axes.get("attn_act", [qkv_act_spec(study.base.model)])]
    if acts := sorted({a for q in qkv for a in reads_batch(q.values())}):
        rows.append(["causality of attention", f"{and_list(acts)} on Q/K/V {why}: no variant's LM loss is strictly "
                                               "causal"])  # fmt: skip
    return Controls(not_equal=rows)


def reads_batch(names: Iterable[str | None]) -> list[str]:
    """The activations among `names` whose output reads the whole batch (scope 'batch'); None is none."""
    return [a for a in names if a and ACTIVATIONS[a].scope == "batch"]


def varied(study: Study, axis: str, what: str) -> str | None:
    """'peak lr per the lr axis (0.001, 0.003)' where `axis` is an axis of the study (so `what` is equal
    within a cell only), else None: the caller then names the base's one setting."""
    if axis not in study.axes:
        return None
    return f"{what} per the {axis} axis ({', '.join(map(str, study.axes[axis]))})"


def attn_act_row(study: Study) -> list[str]:
    """The held-equal row of the Q/K/V activations: one setting for every variant, or the attn_act axis."""
    if "attn_act" in study.axes:
        values = "; ".join(map(str, study.axes["attn_act"]))
        return ["Q/K/V activations", f"the attn_act axis ({values}): the same for every variant within a cell"]
    return ["Q/K/V activations", f"{describe_attn_act(qkv_act_spec(study.base.model))} for every variant"]


def pretrained_rows(study: Study, trained: str | None = None) -> Controls:
    """Fine-tuning from a pretrained folder: every weight is the folder's, only the activation changes; under
    LoRA the weights stay frozen, the FFN's included, and the adapters (`trained`) train."""
    b, own = study.base, study.baseline  # the CLI makes the folder's own activation the baseline
    frozen = " and frozen" if b.peft else ""
    fresh = "a fresh warm-up from the pretrained weights for every variant"
    if any("warmup_steps" in overrides for overrides in study.per_variant.values()):
        warmup = f"{fresh}, its steps set per variant"
    elif "warmup" in study.axes:
        warmup = f"{fresh}, its {varied(study, 'warmup', 'steps')}"
    else:
        warmup = f"a fresh warm-up of {b.warmup_steps} steps from the pretrained weights for every variant"
    equal = [
        ["pretrained weights", f"every variant and seed starts from {b.init_from} (digest {b.init_digest or '-'}): "
                               f"attention, embeddings, norms and the FFN matrices carried over{frozen}"],
        ["parameters", "the pretrained FFN widths and matrices: a swap changes the activation only"],
        ["warm-up", warmup],
    ]  # fmt: skip
    if trained:
        equal.append(["trained parameters", f"{trained}; the same for every variant"])
    swaps = [v for v in study.variants if v != own]
    unequal = [["FFN activation", f"{own} kept (the pretrained one) vs swapped to {', '.join(swaps) or '-'}, "
                                  f"the FFN weights {'frozen' if b.peft else 'unchanged'}"]]  # fmt: skip
    if b.model.task == "cls":
        unequal.append(["classification head", "newly initialised (the folder has none); the same for every "
                                               "variant with one seed"])  # fmt: skip
    return Controls(equal, unequal)


def per_variant_row(study: Study, chosen_by_protocol: bool = False) -> list[str]:
    """The not-equal row of settings per variant: the user's (--opt, [study.per_variant]), or the lr and
    warm-up the validation protocol chose on validation (`chosen_by_protocol`)."""
    paths = sorted({path for overrides in study.per_variant.values() for path in overrides})
    values = "; ".join(f"{v}: " + ", ".join(f"{k} {x:g}" for k, x in o.items()) for v, o in study.per_variant.items())
    by = "the user"
    if chosen_by_protocol:
        by = "the validation protocol, each chosen on validation in its stage 2"
    return ["per-variant settings",
            f"{', '.join(paths)} set per variant ({values}) by {by}; the rest of the schedule as in the base"]  # fmt: skip


def parameter_rows(study: Study) -> Controls:
    """Parameters and FLOPs: which of the two the widths match, and so which follows."""
    m = study.base.model
    if m.d_ff is not None:
        why = f"one hidden width (d_ff {m.d_ff}) for every variant: a gated FFN has 1.5x the weights of a dense one"
        return Controls(not_equal=[["parameters", why]])
    if m.ffn_match == "none":
        return Controls(
            not_equal=[["parameters", "not matched (--match none): each variant at its conventional width"]]
        )
    matched, other = ("parameters", "FLOPs per token") if m.ffn_match == "params" else ("FLOPs per token", "parameters")
    return Controls(
        held_equal=[[matched, f"every FFN within 1% of the dense 4x FFN's {m.ffn_match} (gated widths 2/3 as wide)"]],
        not_equal=[[other, f"follow from the width that matches {m.ffn_match}; shown per variant"]],
    )


def init_rows(study: Study) -> Controls:
    """FFN initialisation: one scheme for all, per family (a confound), or an axis."""
    init = study.base.model.init
    if "init" in study.axes:  # varied on purpose: an axis
        return Controls()
    if init == "family":
        why = ("init 'family': each activation family its own scheme (relu he, gelu normal 0.02, swish "
               "lecun_uniform), so init is confounded with the activation")  # fmt: skip
        return Controls(not_equal=[["FFN initialisation", why]])
    return Controls(held_equal=[["FFN initialisation", f"{init} for every variant's FFN weights"]])


def budget_rows(study: Study) -> Controls:
    """The training budget: equal tokens, or equal wall-clock time (then tokens differ)."""
    b = study.base
    if b.max_seconds:
        why = f"an equal wall-clock budget ({b.max_seconds:g} s): faster variants train on more tokens"
        return Controls(not_equal=[["tokens seen", why]])
    steps = f"{b.max_steps:,} steps of {b.global_batch} x {b.model.context} tokens"
    if b.model.task == "image":  # NOTE: not the context: a ViT's tokens are its patches, set by the data's image size
        steps = f"{b.max_steps:,} steps of {b.global_batch} images"
    elif "context" in study.axes:
        steps = f"{b.max_steps:,} steps of {b.global_batch} x context tokens, {varied(study, 'context', 'context')}"
    unit = "patches" if b.model.task == "image" else "tokens"  # a ViT's tokens: --max-tokens counts its patches
    budget = varied(study, "tokens", unit) or (f"{b.max_tokens:,} {unit}" if b.max_tokens else steps)
    return Controls(held_equal=[["budget", budget]])


def bias_rows(study: Study) -> Controls:
    """FFN biases: each variant's convention, or one setting for all."""
    bias = study.base.model.ffn_bias
    if bias is None:
        why = ("each variant's convention: dense FFNs have biases, gated ones none (Shazeer 2020); "
               "ModelConfig.ffn_bias sets one for all")  # fmt: skip
        return Controls(not_equal=[["biases", why]])
    return Controls(held_equal=[["biases", "on in every FFN" if bias else "off in every FFN"]])
