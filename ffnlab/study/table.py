"""A study's summary as text for the terminal, as CSV and as the JSON `compare --json` prints."""

from __future__ import annotations

import csv
import io

from ffnlab._util.files import write_atomic
from ffnlab._util.text import sci
from ffnlab.study.protocol import STAGE_TITLES
from ffnlab.study.summary import ROW_FIELDS, literature_text, p_label


def format_table(summary: dict) -> str:
    """The ranked table of each cell of a study (and of the tuned comparison), with the verdict under
    it, then what the comparison held equal."""
    lines = []
    for cell in summary["cells"]:
        lines += format_cell(cell, summary["baseline"]) + [""]
    if "across_cells" in summary:
        lines += across_lines(summary["across_cells"]) + [""]
    for cell in summary.get("tuned", []):
        lines += format_cell(cell, summary["baseline"]) + [""]
    if "scaling" in summary:
        lines += scaling_lines(summary["scaling"]) + [""]
    return "\n".join(lines + held_equal_lines(summary["settings"]))


def across_lines(across: dict) -> list[str]:
    """Whether each gap changes between the cells: the sentences under a heading."""
    head = f"across the {len(across['cells'])} cells (repeated-measures F test on the per-seed gaps, Holm):"
    return [head] + [f"  {s}" for s in across["sentences"]]


def two(x: float | None) -> str:
    """A multiplier with 2 decimals; "-" for a CI end the bootstrap left unbounded."""
    return "-" if x is None else f"{x:.2f}"


def scaling_lines(scaling: dict) -> list[str]:
    """The loss-vs-compute fits as a table (E, alpha, multiplier with CIs) and the plain sentences."""
    scale = ", ".join(f"{a} {'/'.join(map(str, v))}" for a, v in scaling["scale"].items())
    if "error" in scaling:
        return [f"scaling over {scale}: no fit yet ({scaling['error']})"]
    level = round(100 * scaling["level"])
    lines = [
        f"scaling over {scale}: L(C) = E + A C^-alpha per variant ({scaling['loss_fit']}), "
        f"C = training FLOPs {sci(scaling['compute_range'][0])}-{sci(scaling['compute_range'][1])}",
        f"  {'variant':<16}{'E':>8}{'alpha':>8}{'lof p':>8}  {'multiplier':>10}  {level}% CI",
    ]
    for name, row in scaling["variants"].items():
        lo, hi = (two(x) for x in row["multiplier_ci"])
        note = f"  ({'' if row['converged'] else 'not converged: '}{row['note']})" if row["note"] else ""
        lof = "-" if row["lack_of_fit_p"] is None else f"{row['lack_of_fit_p']:.2g}"
        lines.append(
            f"  {name:<16}{row['E']:>8.3f}{row['alpha']:>8.3f}{lof:>8}  {two(row['multiplier']):>10}  {lo} to {hi}{note}"
        )
        if "extrapolated" in row:
            x = row["extrapolated"]
            lo, hi = (two(v) for v in x["multiplier_ci"])
            lines.append(f"  {'':<32}at {sci(x['compute'])} FLOPs: {two(x['multiplier'])} ({lo} to {hi}), {x['note']}")
    lines.append(
        "  multiplier k: the baseline needs k x the compute to reach the variant's loss at the largest compute;"
    )
    lines.append("  lof p: lack-of-fit test against seed noise (small: the power law misses the points)")
    return lines + [f"  {s}" for s in scaling["sentences"]]


def held_equal_lines(settings: dict) -> list[str]:
    """What the comparison held equal and what not, one item a line."""
    return (
        ["held equal:"]
        + [f"  {what}: {how}" for what, how in settings["held_equal"]]
        + ["not equal:"]
        + [f"  {what}: {why}" for what, why in settings["not_equal"]]
    )


def format_cell(cell: dict, baseline: str) -> list[str]:
    f = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"
    lines = []
    if cell["axes"]:
        lines.append("  ".join(f"{k}={v}" for k, v in cell["axes"].items()))
    tuned = "selected_on" in cell
    if tuned:
        lines.append(
            f"tuned: each variant at its best {' x '.join(cell['tuned_axes'])} on validation, compared on "
            f"{cell['metric']}"
        )
    width = max([14] + [len(r["ffn"]) for r in cell["variants"]])  # a schedule's name can be long
    metric = {"final_val_loss": "val loss", "final_val_acc": "val acc"}.get(cell["metric"], cell["metric"][6:])
    lines.append(
        f"{'rank':<4} {'ffn':<{width}} {metric + ' (95% CI)':<26} {'delta vs ' + baseline + ' (95% CI)':<30}"
        f" {'p_adj':>7} "
        + (
            "setting"
            if tuned
            else f"{'params':>9} {'tok/s':>7} {'mem MiB':>7} {'test':>7} "
            f"{'noise +':>7} {'events':>6} {'dead':>5} {'div':>3}"
        )
    )
    for r in cell["variants"]:
        ci = f"{f(r['mean'])} [{f(r['ci_low'])}, {f(r['ci_high'])}]"
        sig = "*" if r["significant"] else " "
        delta = (
            "baseline"
            if r["ffn"] == baseline
            else f"{r['delta']:+.4f} [{f(r['delta_ci_low'])}, {f(r['delta_ci_high'])}]{sig}"
            if r["delta"] is not None
            else "-"
        )
        p = p_label(r, baseline)
        if tuned:
            setting = ", ".join(f"{a} {r.get(a)}" for a in cell["tuned_axes"])
            lines.append(f"{r['rank']:<4} {r['ffn']:<{width}} {ci:<26} {delta:<30} {p:>7} {setting}")
            continue
        lines.append(
            f"{r['rank']:<4} {r['ffn']:<{width}} {ci:<26} {delta:<30} {p:>7} "
            f"{r['params'] or 0:>9,} {r['tokens_per_s'] or 0:>7,.0f} {(r['train_mem_bytes'] or 0) / 2**20:>7.1f} "
            f"{f(r['test_mean']):>7} {f(r['noise_delta']):>7} {r['stability_events']:>6} "
            f"{f(r['dead_frac'], 2):>5} {r['diverged']:>3}"
        )
    lines.append(cell["verdict"])
    if cell.get("noise_floor"):
        nf = cell["noise_floor"]
        lines.append(f"noise floor ({baseline}, {nf['n']} seeds): std {nf['std']}, range {nf['range']}")
    lit = cell.get("literature")
    if lit and lit["tau"] is not None:
        lines.append(literature_text(lit))
    return lines


def write_csv(summary: dict, path: str):
    """One row per (cell, variant), tuned cells included, written atomically."""
    buf = io.StringIO()
    cells = summary["cells"] + summary.get("tuned", [])
    axes = sorted({k for c in cells for k in c["axes"]})
    writer = csv.DictWriter(buf, fieldnames=axes + ["metric", *ROW_FIELDS], extrasaction="ignore")
    writer.writeheader()
    for cell in cells:
        for r in cell["variants"]:
            writer.writerow({**cell["axes"], "metric": cell["metric"], **r})
    write_atomic(path, buf.getvalue())


def summary_json(summary: dict) -> dict:
    """What `compare --json` prints: the summary's cells as they are (the report and advise read the
    same cells), with the single cell's rows and verdict at the top level when there are no axes."""
    out = {
        k: summary[k]
        for k in ("store", "baseline", "seeds", "settings", "cells", "across_cells", "scaling")
        if k in summary
    }
    if "tuned" in summary:
        out["tuned"] = summary["tuned"]
    if "variants" in summary:
        out["variants"] = summary["cells"][0]["variants"]
        out["verdict"] = summary["verdict"]
    return out


def format_protocol(result: dict) -> str:
    """The protocol's three stages as text: each stage's tables under a heading."""
    lines = []
    for stage in result["stages"]:
        s = stage["summary"]
        lines.append(f"== stage {STAGE_TITLES[stage['name']]} ==")
        cells = s.get("tuned", []) if stage["name"] == "tune" else s["cells"]
        for cell in cells:
            lines += format_cell(cell, s["baseline"]) + [""]
    return "\n".join(lines + held_equal_lines(result["stages"][0]["summary"]["settings"]))
