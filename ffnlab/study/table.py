"""A study's summary as tables: one table model (`Table`) built from the records, printed here for the
terminal and rendered as Markdown and HTML by `ffnlab.study.render`; and the CSV `compare --csv` writes.

Every metric column comes from `ffnlab.study.metrics.METRICS` (the metrics a table shows), so the terminal,
the report and the CSV never disagree on what a number is or how it is printed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from ffnlab._util.files import write_atomic
from ffnlab._util.text import key_values, num, sci
from ffnlab.study.metrics import CUDA_PEAK, STEP_TIME, metric, ranked_metric, shown_in
from ffnlab.study.protocol import STAGE_TITLES
from ffnlab.study.records import (
    AcrossCells,
    Aggregate,
    Cell,
    StudyScaling,
    StudySettings,
    Summary,
    VariantRow,
    csv_fields,
)
from ffnlab.study.scaling import ScalingFits
from ffnlab.study.stats import VariantStats, shared_ranks
from ffnlab.study.summary import literature_text, p_label


@dataclass
class Table:
    """Rows of text under a header; `text_cols` are left-aligned (numbers right), `marks` maps
    (row, column) to a class the HTML page colours ('better', 'worse')."""

    head: list[str]
    rows: list[list[str]]
    text_cols: tuple[int, ...] = (0,)
    marks: dict[tuple[int, int], str] = field(default_factory=dict)


def text_table(table: Table, indent: str = "") -> list[str]:
    """A table as aligned lines of text, for the terminal."""
    widths = [max(len(str(c)) for c in col) for col in zip(table.head, *table.rows)]

    def line(cells: list[str]) -> str:
        parts = [
            str(c).ljust(w) if j in table.text_cols else str(c).rjust(w) for j, (c, w) in enumerate(zip(cells, widths))
        ]
        return (indent + "  ".join(parts)).rstrip()

    return [line(table.head)] + [line(r) for r in table.rows]


# ---- the tables of one cell ----------------------------------------------------------------------


def metric_label(cell: Cell) -> str:
    """The short name of the cell's ranking metric, on its split: 'val loss', 'test acc'."""
    return ranked_metric(cell.metric).label


def delta_text(row: VariantStats, baseline: str) -> str:
    """'+0.0123 [0.0050, 0.0196] *': a row's paired difference to the baseline, its CI and significance."""
    if row.ffn == baseline:
        return "baseline"
    if row.delta is None:
        return "-"
    ci = f" [{num(row.delta_ci_low)}, {num(row.delta_ci_high)}]" if row.delta_ci_low is not None else ""
    return f"{row.delta:+.4f}{ci}{' *' if row.significant else ''}"


def ci_text(row: VariantStats) -> str:
    """'mean [ci_low, ci_high]' of a row."""
    return f"{num(row.mean)} [{num(row.ci_low)}, {num(row.ci_high)}]"


def delta_marks(cell: Cell | Aggregate, column: int) -> dict[tuple[int, int], str]:
    """Colour each significant difference by whether the variant is better or worse than the baseline."""
    marks: dict[tuple[int, int], str] = {}
    for i, r in enumerate(cell.variants):
        if r.significant and r.delta is not None:
            better = (r.delta > 0) == (cell.metric_direction == "higher")
            marks[(i, column)] = "better" if better else "worse"
    return marks


def ranking_table(cell: Cell) -> Table:
    """The ranking: each variant's mean with its interval, its paired difference to the baseline, the
    Holm-adjusted p, then the metrics the ranking shows."""
    pct = round(cell.level * 100)
    shown = shown_in("ranking", cell.task)
    head = ["rank", "ffn", f"{metric_label(cell)} [{pct}% CI]", f"Δ vs {cell.baseline} [{pct}% CI]", "p (Holm)",
            "seeds", "diverged", *(m.heading(cell.task) for m in shown)]  # fmt: skip
    rows = [
        [
            str(r.rank) if r.mean is not None else "-",  # no mean, no rank: not a tie for first
            r.ffn,
            ci_text(r),
            delta_text(r, cell.baseline),
            p_label(r, cell.baseline),
            str(r.n_seeds),
            str(r.diverged),
            *(m.format(r.value(m)) for m in shown),
        ]  # fmt: skip
        for r in cell.variants
    ]
    return Table(head, rows, (1,), delta_marks(cell, 3))


def chosen_setting(row: VariantRow, axes: list[str]) -> str:
    """'lr 0.001, warmup 2': the setting of each tuned axis a variant was chosen at."""
    return ", ".join(f"{a} {row.tuned.get(a)}" for a in axes)


def tuned_table(cell: Cell) -> Table:
    """The tuned comparison: each variant's setting chosen on validation, its test metric compared."""
    pct = round(cell.level * 100)
    head = ["rank", "ffn", "chosen setting", "val mean at it", f"{metric_label(cell)} [{pct}% CI]",
            f"Δ vs {cell.baseline} [{pct}% CI]", "p (Holm)", "seeds"]  # fmt: skip
    rows = [[str(r.rank), r.ffn, chosen_setting(r, cell.tuned_axes), num(r.tuned.get("val_mean")), ci_text(r),
             delta_text(r, cell.baseline), p_label(r, cell.baseline), str(r.n_seeds)]
            for r in cell.variants]  # fmt: skip
    return Table(head, rows, (1, 2), delta_marks(cell, 5))


def metric_table(cell: Cell, table: str, leave_out: tuple[str, ...] = ()) -> Table:
    """A report table of the cell's metrics ('cost', 'stability', 'signals'): a row per variant; the metrics
    named in `leave_out` are not shown."""
    shown = [m for m in shown_in(table, cell.task) if m.name not in leave_out]
    head = ["ffn", *(m.heading(cell.task) for m in shown)]
    rows = [[r.ffn, *(m.format(r.value(m)) for m in shown)] for r in cell.variants]
    text = tuple(j + 1 for j, m in enumerate(shown) if m.name == "learned")
    return Table(head, rows, (0, *text))


def cost_table(cell: Cell) -> Table:
    """The cost metrics, and each variant's step time against the baseline's."""
    table = metric_table(cell, "cost")
    base = cell.row(cell.baseline).value(STEP_TIME)
    for r, row in zip(cell.variants, table.rows):
        own = r.value(STEP_TIME)
        row.append(f"{(own / base - 1) * 100:+.0f}%" if own and base else "-")
    table.head.append("step time vs baseline")
    return table


def stability_table(cell: Cell) -> Table:
    """The stability metrics, after how many of each variant's runs diverged."""
    table = metric_table(cell, "stability")
    table.head.insert(1, "diverged runs")
    for r, row in zip(cell.variants, table.rows):
        row.insert(1, f"{r.diverged} of {r.runs}")
    return table


def seed002_table(cell: Cell) -> Table:
    """Seed 002's four columns as ffnlab measured them: perplexity, step time, peak memory and stability events
    (gradient and loss spikes). Peak memory is the CUDA allocator's where a run measured it, else the training
    memory counted from the tensors; the column's heading says which."""
    on_gpu = any(r.value(CUDA_PEAK) is not None for r in cell.variants)
    return metric_table(cell, "seed002", leave_out=("train_mem_bytes",) if on_gpu else ("cuda_peak_bytes",))


def literature_table(cell: Cell) -> Table | None:
    """The measured ranking beside Shazeer 2020 Table 1 for the variants both have."""
    lit = cell.literature
    if not lit or lit.n < 2:
        return None
    mean, published = lit.measured, lit.published
    sign = -1.0 if cell.metric_direction == "higher" else 1.0
    measured = {v: sign * mean[v] for v in lit.variants}  # lower is better, as in the published table
    ours = sorted(lit.variants, key=measured.__getitem__)

    ranks, published_ranks = shared_ranks(measured), shared_ranks({v: published[v] for v in lit.variants})
    head = ["ffn", "measured mean", "measured rank", "published", "published rank"]
    rows = [[v, num(mean[v]), str(ranks[v]), f"{published[v]:.3f}", str(published_ranks[v])] for v in ours]
    return Table(head, rows)


def dataset_labels(datasets: list[str]) -> list[str]:
    """Column headings for the datasets of a data axis: each path's last part ('glue/mnli.csv' -> 'mnli.csv'),
    or the values in full where two would read alike."""
    names = [Path(d).name or d for d in datasets]
    return names if len(set(names)) == len(names) else list(datasets)


def aggregate_label(agg: Aggregate) -> str:
    """'GLUE-style average over 2 datasets' ('GLUE score over 2 tasks' for GLUE's own, whose `columns` are its
    metrics), then where the study's other axes hold it ('at depth=2')."""
    where = f" at {key_values(agg.axes)}" if agg.axes else ""
    if agg.columns:
        return f"GLUE score over {len(agg.datasets)} task{'s' if len(agg.datasets) > 1 else ''}{where}"
    return f"GLUE-style average over {len(agg.datasets)} datasets{where}"


def aggregate_table(agg: Aggregate) -> Table:
    """GLUE's table: each variant's mean on each dataset, then its average over the datasets with the interval
    over seeds, its paired difference to the baseline and the Holm-adjusted p."""
    pct = round(agg.level * 100)
    average = metric(agg.metric).label if agg.columns else f"average {metric(agg.metric).label}"
    head = ["rank", "ffn", *(agg.columns or dataset_labels(agg.datasets)), f"{average} [{pct}% CI]",
            f"Δ vs {agg.baseline} [{pct}% CI]", "p (Holm)", "seeds"]  # fmt: skip
    rows = [
        [str(r.rank), r.ffn, *(num(score) for score in agg.scores[r.ffn]), ci_text(r), delta_text(r, agg.baseline),
         p_label(r, agg.baseline), str(r.n_seeds)]
        for r in agg.variants
    ]  # fmt: skip
    return Table(head, rows, (1,), delta_marks(agg, len(agg.columns or agg.datasets) + 3))


def scaling_table(scaling: ScalingFits) -> Table:
    """The loss-vs-compute fits: per variant E, alpha and the compute multiplier, each with its interval."""
    level = round(scaling.level * 100)

    def ci(pair: list[float | None]) -> str:
        lo, hi = pair
        return "-" if lo is None or hi is None else f"{lo:.3g} to {hi:.3g}"

    head = ["FFN", "E", f"E {level}% CI", "alpha", f"alpha {level}% CI", "multiplier k", f"k {level}% CI",
            "lack of fit p", "fit"]  # fmt: skip
    rows = [
        [name, f"{r.E:.3g}", ci(r.E_ci), f"{r.alpha:.3g}", ci(r.alpha_ci), f"{r.multiplier:.2f}",
         ci(r.multiplier_ci), "-" if r.lack_of_fit_p is None else f"{r.lack_of_fit_p:.2g}",
         ("converged" if r.converged else "not converged") + (f": {r.note}" if r.note else "")]
        for name, r in scaling.variants.items()
    ]  # fmt: skip
    return Table(head, rows, (0, 8))


# ---- the terminal ----------------------------------------------------------------------------------


def format_table(summary: Summary) -> str:
    """The ranked table of each cell of a study (and of the tuned comparison), with the verdict under
    it, then what the comparison held equal."""
    lines: list[str] = []
    for cell in summary.cells + summary.tuned:
        lines += format_cell(cell) + [""]
    if summary.across_cells:
        lines += across_lines(summary.across_cells) + [""]
    for agg in summary.aggregate:
        lines += aggregate_lines(agg) + [""]
    if summary.scaling:
        lines += scaling_lines(summary.scaling) + [""]
    return "\n".join(lines + held_equal_lines(summary.settings))


def format_cell(cell: Cell) -> list[str]:
    """One cell: where it is, its ranking, its verdict, the noise floor and the published ranking."""
    lines = [key_values(cell.axes)] if cell.axes else []
    if cell.tuned_axes:
        lines.append(
            f"tuned: each variant at its best {' x '.join(cell.tuned_axes)} on validation, compared on {cell.metric}"
        )
    lines += text_table(tuned_table(cell) if cell.tuned_axes else ranking_table(cell))
    lines.append(cell.verdict)
    if cell.noise_floor:
        nf = cell.noise_floor
        lines.append(f"noise floor ({cell.baseline}, {nf.n} seeds): std {nf.std}, range {nf.range}")
    if cell.literature and cell.literature.tau is not None:
        lines.append(literature_text(cell.literature))
    return lines


def across_lines(across: AcrossCells) -> list[str]:
    """Whether each gap changes between the cells: the sentences under a heading."""
    head = f"across the {len(across.cells)} cells (repeated-measures F test on the per-seed gaps, Holm):"
    return [head] + [f"  {s}" for s in across.sentences]


def aggregate_lines(agg: Aggregate) -> list[str]:
    """The GLUE-style average: the per-dataset table with the average, its verdict and the seeds left out."""
    over = "each task's score" if agg.columns else "the datasets"
    lines = [f"{aggregate_label(agg)} (per seed the mean over {over}, then over the seeds):"]
    lines += text_table(aggregate_table(agg), "  ") + [f"  {agg.verdict}"]
    lines += [f"  {agg.note}"] if agg.note else []
    if agg.left_out:
        seeds = "; ".join(
            f"{v} seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))}" for v, ss in agg.left_out.items()
        )
        lines.append(f"  left out of the average (not finished on every dataset): {seeds}")
    return lines


def scaling_lines(scaling: StudyScaling) -> list[str]:
    """The loss-vs-compute fits as a table and the plain sentences."""
    scale = ", ".join(f"{a} {'/'.join(map(str, v))}" for a, v in scaling.scale.items())
    fits = scaling.fits
    if fits is None:
        return [f"scaling over {scale}: no fit yet ({scaling.error})"]
    lines = [
        f"scaling over {scale}: L(C) = E + A C^-alpha per variant ({fits.loss_fit}), "
        f"C = training FLOPs {sci(fits.compute_range[0])}-{sci(fits.compute_range[1])}",
        *text_table(scaling_table(fits), "  "),
    ]
    for name, row in fits.variants.items():
        if row.extrapolated is not None:
            x = row.extrapolated
            lo, hi = ("-" if v is None else f"{v:.2f}" for v in x.multiplier_ci)
            lines.append(f"  {name} at {sci(x.compute)} FLOPs: {x.multiplier:.2f} ({lo} to {hi}), {x.note}")
    lines.append(
        "  multiplier k: the baseline needs k x the compute to reach the variant's loss at the largest compute;"
    )
    lines.append("  lack of fit p: lack-of-fit test against seed noise (small: the power law misses the points)")
    return lines + [f"  {s}" for s in fits.sentences]


def held_equal_lines(settings: StudySettings) -> list[str]:
    """What the comparison held equal and what not, one item a line."""
    return (
        ["held equal:"]
        + [f"  {what}: {how}" for what, how in settings.held_equal]
        + ["not equal:"]
        + [f"  {what}: {why}" for what, why in settings.not_equal]
    )


def format_protocol(stages: list[tuple[str, Summary]]) -> str:
    """The protocol's three stages as text: each stage's tables under a heading."""
    lines: list[str] = []
    for name, summary in stages:
        lines.append(f"== stage {STAGE_TITLES[name]} ==")
        for cell in summary.tuned if name == "tune" else summary.cells:
            lines += format_cell(cell) + [""]
    return "\n".join(lines + held_equal_lines(stages[0][1].settings))


# ---- CSV ----------------------------------------------------------------------------------------


def write_csv(summary: Summary, path: str) -> None:
    """One row per (cell, variant), tuned cells included, written atomically."""
    buf = io.StringIO()
    cells = summary.cells + summary.tuned
    axes = sorted({k for c in cells for k in c.axes})
    writer = csv.DictWriter(buf, fieldnames=axes + ["metric", *csv_fields()], extrasaction="ignore")
    writer.writeheader()
    for cell in cells:
        for r in cell.variants:
            writer.writerow({**cell.axes, "metric": cell.metric, **r.to_json()})
    write_atomic(path, buf.getvalue())
