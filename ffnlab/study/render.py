"""The report's data (`ffnlab.study.report.report_data`) rendered: the figures as PNG, the HTML page and
the Markdown summary.

The page opens offline: images are inline base64 PNG, the CSS is inline, there is no script, and
every piece of text that comes from the user or the store is escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Container
from typing import TYPE_CHECKING

from ffnlab._util.text import human, key_values, num
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.model import describe_attn_act
from ffnlab.study import plots
from ffnlab.study.metrics import three_digits
from ffnlab.study.protocol import STAGE_TITLES, Protocol
from ffnlab.study.records import Cell
from ffnlab.study.summary import literature_text
from ffnlab.study.table import (
    Table,
    cost_table,
    literature_table,
    metric_table,
    ranking_table,
    scaling_table,
    stability_table,
    tuned_table,
)

if TYPE_CHECKING:  # report.py renders through this module
    from ffnlab.study.report import ReportData

# the report folder's layout, which the Markdown summary links into
REPORT_HTML = "report.html"
SUMMARY_MD = "summary.md"
FIGURES_DIR = "figures"


# ---- figures ------------------------------------------------------------------------------------


def axis_label(metric: str) -> str:
    """The axis label of the metric a cell ranks by."""
    return "validation loss (nats/token)" if metric == "final_val_loss" else "validation accuracy"


class PngDict(dict):
    """name -> PNG bytes; assigning a matplotlib figure stores its bytes and closes it, so a study with
    many cells never holds dozens of open figures."""

    def __setitem__(self, name, fig):
        super().__setitem__(name, plots.png_bytes(fig))


def render_figures(data: ReportData) -> dict[str, bytes]:
    """File name -> PNG bytes of every figure; cells of a study with axes get a numbered suffix."""
    styles = plots.variant_styles(data.variants)
    figs = PngDict()  # each figure becomes PNG bytes (and is closed) as soon as it is drawn
    for i, view in enumerate(data.cells):
        cell = view.cell
        suffix = figure_suffix(i, len(data.cells))
        where = cell_label(cell)
        title = f" ({where})" if where else ""
        figs[f"val_loss{suffix}.png"] = plots.band_figure(
            view.curves,
            styles,
            f"validation loss, mean and {round(cell.level * 100)}% CI over seeds{title}",
            "training step",
            "validation loss (nats/token)",
        )
        figs[f"final{suffix}.png"] = plots.final_figure(
            [
                {
                    "ffn": r.ffn,
                    "mean": r.mean,
                    "ci_low": r.ci_low,
                    "ci_high": r.ci_high,
                    "values": list(r.values.values()),
                }
                for r in cell.variants
            ],
            styles,
            data.baseline,
            axis_label(cell.metric),
            cell.level,
        )
        figs[f"loss_vs_time{suffix}.png"] = plots.band_figure(
            view.time_curves,
            styles,
            f"validation loss against wall-clock training time{title}",
            "training time (s)",
            "validation loss (nats/token)",
        )
        figs[f"grad_norm{suffix}.png"] = plots.traces_figure(
            view.traces,
            styles,
            f"gradient norm before clipping, one line per seed{title}",
            "training step",
            "global gradient norm",
        )
        if any(view.behaviour.values()):
            figs[f"behaviour{suffix}.png"] = plots.layers_figure(
                view.behaviour,
                styles,
                {"dead_frac": "dead units (fraction never > 0)", "zero_frac": "sparsity (fraction of exact zeros)"},
            )
        att = view.attention or {}
        if att.get("maps"):
            figs[f"attention{suffix}.png"] = plots.attention_figure(att["maps"], att["layer"])
    scaling = data.scaling
    if scaling and "variants" in scaling:
        figs["scaling.png"] = plots.scaling_figure(scaling, styles, axis_label(data.cells[0].cell.metric))
    acts = data.activations
    figs["activations.png"] = plots.activations_figure(list(acts), labels=acts)
    return dict(figs)


# ---- formatting ---------------------------------------------------------------------------------


def cell_label(cell: Cell) -> str:
    """'depth=2, width=64': the cell's axis values; '' for a study without axes."""
    return key_values(cell.axes)


def figure_suffix(index: int, n_cells: int) -> str:
    """'_2' in the file names of the second cell's figures when a study has several cells, '' when one."""
    return f"_{index + 1}" if n_cells > 1 else ""


def settings_rows(
    settings: dict, env: dict, baseline: str, store: str, architecture: str | None = None
) -> list[tuple[str, str]]:
    """The run settings of a study (`ffnlab.study.summary.settings_of`) and the machine, as (what, value) rows."""
    model = dict(settings["model"])
    axes = settings.get("axes") or {}
    for axis, key in (("depth", "n_layers"), ("width", "d_model"), ("context", "context")):  # an axis overrides
        if axis in axes:
            model[key] = "/".join(map(str, axes[axis]))
    budget = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in settings["budget"].items())
    rows = [("data", f"{settings['data']} ({settings['task']}, {settings['tokenizer']} tokenizer)")]
    if architecture:
        rows.append(("architecture", architecture))
    rows += [
        (
            "model",
            f"{model['n_layers']} layer{'s' if model['n_layers'] != 1 else ''}, {model['n_heads']} heads, "
            f"d_model {model['d_model']}, context {model['context']}, {model['norm']} ({model['placement']}-norm), "
            f"{model['pos']} positions, dropout {model['dropout']}",
        ),
        (
            "FFN matching",
            f"{settings['match']} (hidden width chosen so every variant matches the dense 4x FFN's {settings['match']})"
            if settings["match"] != "none"
            else "none (each variant at its own width)",
        ),
        (
            "budget",
            f"{budget}, batch {settings['batch_size']}, {human(settings['tokens_per_run'])} tokens per run"
            if settings.get("tokens_per_run")
            else budget,
        ),
        ("FFN initialisation", "/".join(map(str, axes["init"])) + " (an axis)" if "init" in axes else settings["init"]),
        (
            "Q/K/V activations",
            "; ".join(map(str, axes["attn_act"])) + " (an axis)"
            if "attn_act" in axes
            else describe_attn_act(settings.get("attn_act")),
        ),
        (
            "optimiser",
            f"AdamW, peak lr {'/'.join(map(str, axes['lr'])) + ' (an axis)' if 'lr' in axes else settings['lr']}"
            f", cosine to {settings.get('min_lr', '-')}, warm-up {settings.get('warmup_steps', '-')} steps, "
            f"weight decay {settings.get('weight_decay', '-')}, beta2 {settings.get('beta2', '-')}, "
            f"clip {settings.get('grad_clip', '-')}",
        ),
        ("precision", settings["precision"]),
        ("seeds", f"{settings['seeds']} per variant (paired: seed s of every variant sees the same data order)"),
        ("variants", ", ".join(settings["variants"]) + f" (baseline {baseline})"),
    ]
    if settings.get("per_variant"):
        rows.append(("per-variant settings", "; ".join(
            f"{v}: " + ", ".join(f"{k} {x}" for k, x in o.items()) for v, o in settings["per_variant"].items())))  # fmt: skip
    if settings.get("pretrained"):
        rows.append(("pretrained", f"fine-tuned from {settings['pretrained']['from']} "
                                   f"(digest {settings['pretrained']['digest']})"))  # fmt: skip
    if settings.get("axes"):
        rows.append(("axes", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in settings["axes"].items())))
    if env:
        where = env.get("gpu") or env.get("cpu") or "-"
        rows.append(
            (
                "machine",
                f"{env.get('device', '-')} ({where}), torch {env.get('torch', '-')}, Python {env.get('python', '-')}",
            )
        )
    if env.get("ffnlab") or env.get("git_rev"):
        rev = (
            f", git {env['git_rev'][:12]}{' (uncommitted changes)' if env.get('git_dirty') else ''}"
            if env.get("git_rev")
            else ""
        )
        rows.append(
            ("code", f"ffnlab {env.get('ffnlab') or '?'}{rev} (its own checkout, never the working directory's)")
        )
    rows.append(("store", store))
    return rows


def report_settings(data: ReportData) -> Table:
    rows = settings_rows(data.settings, data.env, data.baseline, data.store, data.architecture)
    return Table(["setting", "value"], [list(row) for row in rows], (0, 1))


# ---- HTML ---------------------------------------------------------------------------------------


def esc(text: object) -> str:
    """Text safe anywhere in the page, attribute values included."""
    return html.escape(str(text), quote=True)


def cell_heading(cell: Cell) -> str:
    """The cell's axis values as a sub-heading; '' for a study without axes."""
    return f"<h3>{esc(cell_label(cell))}</h3>" if cell.axes else ""


def html_table(table: Table) -> str:
    """A table whose every cell is escaped text: `text_cols` left-aligned (numbers right), `marks` as classes."""

    def cls(i, j):
        names = (["t"] if j in table.text_cols else []) + ([table.marks[(i, j)]] if (i, j) in table.marks else [])
        return f' class="{" ".join(names)}"' if names else ""

    out = [
        "<table><thead><tr>"
        + "".join(f"<th{cls(-1, j)}>{esc(h)}</th>" for j, h in enumerate(table.head))
        + "</tr></thead><tbody>"
    ]
    for i, row in enumerate(table.rows):
        out.append("<tr>" + "".join(f"<td{cls(i, j)}>{esc(c)}</td>" for j, c in enumerate(row)) + "</tr>")
    return '<div class="wide">' + "".join(out) + "</tbody></table></div>"


def html_image(figures: dict[str, bytes], name: str, alt: str) -> str:
    if name not in figures:
        return ""
    data = base64.b64encode(figures[name]).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}"><figcaption>{esc(alt)}</figcaption></figure>'
    )


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1080px;padding:1.2em 1.5em 3em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
.verdict{font-size:1.1em;background:#f2f7fb;border-left:4px solid #0072B2;padding:.6em .9em}
.wide{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #d6d6d6;padding:.3em .6em;text-align:right;white-space:nowrap}
th{background:#f4f4f4}.t{text-align:left;white-space:normal}td.t:first-child{font-weight:600}
.better{color:#0072B2;font-weight:700}.worse{color:#D55E00;font-weight:700}
figure{margin:1em 0}img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.88em;color:#555}.note{color:#555;font-size:.92em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}
nav a{margin-right:.9em}footer{margin-top:3em;color:#777;font-size:.85em}
"""


def html_protocol(protocol: Protocol) -> str:
    """The validation protocol's stages (protocol.json beside the store): each stage's ranking."""
    parts = [
        '<h2 id="protocol">Validation protocol</h2>',
        '<p class="note">1. every variant at the same settings; 2. each variant at its own learning rate and '
        "warm-up, chosen on validation and compared on test; 3. each at its tuned setting at other context "
        "lengths. Grid: " + esc(", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in protocol.grid.items())) + ".</p>",
    ]
    for name, summary in protocol.stages:
        parts.append(f"<h3>Stage {esc(STAGE_TITLES.get(name, name))}</h3>")
        for cell in summary.tuned if name == "tune" else summary.cells:
            where = cell_label(cell)
            table = tuned_table(cell) if cell.tuned_axes else ranking_table(cell)
            parts.append(
                (f"<p>{esc(where)}</p>" if where else "")
                + html_table(table)
                + f'<p class="note">{esc(cell.verdict)}</p>'
            )
    return "".join(parts)


def numerics_tables(numerics: dict) -> list[Table]:
    """A numerics.json as tables: error per activation, dtype and pass; the claims if any."""
    tables = []
    results = numerics.get("results") or []
    if results:
        head = ["activation", "dtype", "pass", "max abs error", "max ULP", "at x", "inf", "nan"]
        rows = [
            [str(r.get("name")), str(r.get("dtype")), str(r.get("pass")), three_digits(r.get("max_abs_err")),
             three_digits(r.get("max_ulp")), three_digits(r.get("argmax_ulp_x")), str(r.get("n_inf", "-")),
             str(r.get("n_nan", "-"))]
            for r in results
        ]  # fmt: skip
        tables.append(Table(head, rows, (0, 1, 2)))
    claims = numerics.get("claims") or []
    if claims:
        head = ["claim", "source", "claimed", "measured", "verdict"]
        rows = [[str(c.get(k)) for k in ("claim", "source", "claimed", "measured", "verdict")] for c in claims]
        tables.append(Table(head, rows, (0, 1, 2, 3, 4)))
    return tables


def html_numerics(numerics: dict) -> str:
    """A compact view of a numerics.json: error per activation, dtype and pass; claims if any."""
    if "error" in numerics:
        return f'<p class="note">{esc(numerics["error"])}</p>'
    parts = [html_table(t) for t in numerics_tables(numerics)]
    env = numerics.get("environment") or {}
    if env:
        parts.append(
            f'<p class="note">x in {esc(numerics.get("range"))}, {esc(numerics.get("points"))} points; '
            f"torch {esc(env.get('torch'))}, {esc(env.get('machine'))}</p>"
        )
    return "".join(parts) or '<p class="note">numerics.json holds no results.</p>'


def render_html(data: ReportData, figures: dict[str, bytes]) -> str:
    """The self-contained report page."""
    title = f"ffnlab report: {', '.join(data.variants)} on {data.settings['data']}"
    cells = [view.cell for view in data.cells]
    body = [
        *page_top(data, title),
        *ranking_section(data),
        *scaling_section(data.scaling, figures),
        *literature_section(cells),
        *settings_section(data),
        *curves_section(cells, figures),
        *cost_section(cells, figures, data.env),
        *stability_section(cells, figures),
        *signals_section(cells),
        *activations_section(data.activations, figures),
        *attention_section(data, figures),
    ]
    if data.numerics:
        body.append('<h2 id="numerics">Numerics of the activations</h2>' + html_numerics(data.numerics))
    body.append(
        f"<footer>ffnlab report from {esc(data.store)}. Reproduce: <code>ffnlab report --store "
        f"{esc(data.store)}</code></footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request, so no 404 in the console
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n"
    )


# Each part of the page below is a list of HTML pieces; render_html joins them with line breaks.


def page_top(data: ReportData, title: str) -> list[str]:
    """Title, what was compared, each cell's verdict, the links to the sections and a word on other studies."""
    settings, others = data.settings, data.other_studies
    parts = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="note">{len(data.variants)} FFN variants x {settings["seeds"]} seeds, baseline '
        f"{esc(data.baseline)}; generated {esc(data.generated)}</p>",
    ]
    for view in data.cells:
        where = cell_label(view.cell)
        parts.append(f'<p class="verdict">{esc(where + ": " if where else "")}{esc(view.cell.verdict)}</p>')
    sections = [
        "ranking",
        *(["scaling"] if data.scaling else []),
        "literature",
        *(["protocol"] if data.protocol else []),
        "settings",
        "curves",
        "cost",
        "stability",
        "signals",
        "activations",
        "attention",
        *(["numerics"] if data.numerics else []),
    ]
    link_text = {"signals": "other measurements"}
    parts.append("<nav>" + "".join(f'<a href="#{s}">{link_text.get(s, s)}</a>' for s in sections) + "</nav>")
    if others:
        parts.append(
            f'<p class="note">The store holds {others} other stud{"y" if others == 1 else "ies"} (other '
            "settings); this report shows the most recently finished one.</p>"
        )
    return parts


def ranking_section(data: ReportData) -> list[str]:
    """The ranking of each cell with the noise floor, the tuned comparison and the validation protocol."""
    baseline = data.baseline
    parts = ['<h2 id="ranking">Ranking</h2>']
    for view in data.cells:
        cell = view.cell
        parts.append(cell_heading(cell) + html_table(ranking_table(cell)))
        if cell.noise_floor:
            noise = cell.noise_floor
            parts.append(
                f'<p class="note">Noise floor: {esc(baseline)} over {esc(noise["n"])} seeds has std '
                f"{esc(num(noise['std']))} and range {esc(num(noise['range']))}.</p>"
            )
    parts.append(
        f'<p class="note">Mean over seeds with its {round(data.level * 100)}% t-interval. Δ is the paired '
        f"difference to {esc(baseline)} over seeds (negative loss Δ = better). * = significant at "
        f"α={data.alpha:g} after Holm correction of the paired t-tests; coloured blue when better, "
        "orange when worse.</p>"
    )
    parts += across_section(data.across_cells)
    if data.tuned:
        parts.append("<h3>Tuned: each variant at its own best setting</h3>")
        for cell in data.tuned:
            parts.append(html_table(tuned_table(cell)))
            parts.append(f'<p class="verdict">{esc(cell_label(cell))}: {esc(cell.verdict)}</p>')
        parts.append(
            '<p class="note">The setting of each variant is the one with the best mean validation '
            "metric over seeds; the comparison uses the test split, so the selection cannot flatter the "
            "winner (Melis et al. 2018).</p>"
        )
    if data.protocol:
        parts.append(html_protocol(data.protocol))
    return parts


ACROSS_NOTE = (
    "Per variant, a repeated-measures F test of whether its per-seed gap to the baseline differs between the "
    "cells (seeds as blocks, over the seeds finished in every cell), Holm-corrected over the variants; the "
    "best mean of each cell is by the means alone."
)


def across_section(across: dict | None) -> list[str]:
    """Whether each gap changes between the cells: the sentences and how they were tested."""
    if not across:
        return []
    return (
        [f"<h3>Across the {len(across['cells'])} cells</h3>"]
        + [f'<p class="verdict">{esc(s)}</p>' for s in across["sentences"]]
        + [f'<p class="note">{esc(ACROSS_NOTE)}</p>']
    )


def scaling_section(scaling: dict | None, figures: dict[str, bytes]) -> list[str]:
    """The loss-vs-compute plot, the table of fits and the plain sentences of a study with --scale."""
    if not scaling:
        return []
    scale = ", ".join(f"{a} {', '.join(map(str, v))}" for a, v in scaling["scale"].items())
    parts = ['<h2 id="scaling">Scaling: compute multipliers</h2>', f'<p class="note">Scaled: {esc(scale)}.</p>']
    if "error" in scaling:
        return parts + [f"<p>No fit yet: {esc(scaling['error'])}</p>"]
    parts += [html_image(figures, "scaling.png", "loss against training compute, fits and bands")]
    parts += [html_table(scaling_table(scaling))]
    parts += [f'<p class="verdict">{esc(s)}</p>' for s in scaling["sentences"]]
    parts.append(
        f'<p class="note">Fit: {esc(scaling["loss_fit"])}. Compute C = training FLOPs of the whole model (3 x '
        f"forward FLOPs per token x tokens). k: {esc(scaling['baseline'])} needs k x the compute to reach the "
        "variant's loss at the largest measured compute (k > 1: the variant is worth more compute). Intervals: "
        "paired bootstrap over seeds with a small-sample t widening (ffnlab.study.scaling). Lack of fit: an F test "
        "of the residuals against the seed-to-seed spread at each compute; a small p means the power law misses "
        "the points, and the multiplier is a summary of the curves, not a law.</p>"
    )
    return parts


def literature_section(cells: list[Cell]) -> list[str]:
    parts = ['<h2 id="literature">Against the literature</h2>']
    for cell in cells:
        table = literature_table(cell)
        if table is None or cell.literature is None:
            parts.append(
                cell_heading(cell) + '<p class="note">No published ranking to compare with: it needs a language '
                "model study with at least two of Shazeer (2020) Table 1's variants.</p>"
            )
            continue
        parts.append(cell_heading(cell) + html_table(table) + f"<p>{esc(literature_text(cell.literature))}</p>")
    return parts


def settings_section(data: ReportData) -> list[str]:
    settings = data.settings
    return [
        '<h2 id="settings">Run settings</h2>',
        html_table(report_settings(data)),
        "<h3>What the comparison held equal</h3>",
        html_table(Table(["held equal", "how"], settings["held_equal"], (0, 1))),
        "<h3>What it did not</h3>",
        html_table(Table(["not equal", "why"], settings["not_equal"], (0, 1))),
    ]


def curves_section(cells: list[Cell], figures: dict[str, bytes]) -> list[str]:
    pct = round(cells[0].level * 100)
    parts = ['<h2 id="curves">Learning curves and final loss</h2>']
    for i, cell in enumerate(cells):
        suffix = figure_suffix(i, len(cells))
        parts.append(cell_heading(cell))
        parts.append(
            html_image(
                figures,
                f"val_loss{suffix}.png",
                f"Validation loss during training: mean over seeds with a {pct}% confidence band.",
            )
        )
        parts.append(
            html_image(
                figures,
                f"final{suffix}.png",
                f"Final {axis_label(cell.metric)} per variant: mean with {pct}% CI error bars; dots are single seeds.",
            )
        )
    return parts


def cost_section(cells: list[Cell], figures: dict[str, bytes], env: dict) -> list[str]:
    parts = ['<h2 id="cost">Cost</h2>']
    for i, cell in enumerate(cells):
        parts.append(cell_heading(cell) + html_table(cost_table(cell)))
        parts.append(
            html_image(
                figures,
                f"loss_vs_time{figure_suffix(i, len(cells))}.png",
                "Validation loss against wall-clock training time (mean over seeds, with band).",
            )
        )
    parts.append(
        f'<p class="note">tokens/s: mean over seeds of the median step; step time: median over seeds, '
        "with the range of the seeds' own medians: a wide range means the machine was busy while they "
        "ran, and only a quiet machine's timings (or <code>ffnlab bench</code>) compare speed. "
        f"Measured on {esc(env.get('device', '?'))}. Training memory is counted from the tensors: "
        "parameters, gradients, optimizer state and what one training forward pass keeps for backward "
        "(counted with saved_tensors_hooks), so it does not depend on what else ran in the process.</p>"
    )
    return parts


def stability_section(cells: list[Cell], figures: dict[str, bytes]) -> list[str]:
    parts = ['<h2 id="stability">Stability</h2>']
    for i, cell in enumerate(cells):
        suffix = figure_suffix(i, len(cells))
        parts.append(cell_heading(cell) + html_table(stability_table(cell)))
        parts.append(
            html_image(
                figures,
                f"grad_norm{suffix}.png",
                "Global gradient norm per step before clipping; "
                "triangles mark gradient spikes, dotted lines divergence.",
            )
        )
        parts.append(
            html_image(
                figures,
                f"behaviour{suffix}.png",
                "Per layer, on the validation set after training: "
                "fraction of FFN units that never activate (dead) and fraction of exact zeros "
                "after the activation (sparsity), mean over seeds.",
            )
        )
    return parts


def signals_section(cells: list[Cell]) -> list[str]:
    parts = ['<h2 id="signals">Other measurements</h2>']
    for cell in cells:
        parts.append(cell_heading(cell) + html_table(metric_table(cell, "signals")))
    parts.append(
        '<p class="note">Test: the held-out test split (never used to choose anything here). Embedding '
        "noise: the validation metric with Gaussian noise on the token embeddings, a robustness probe; its "
        "effect is the mean change from the clean metric. Learned parameters: means over seeds at the end "
        "of training.</p>"
    )
    return parts


def activations_section(activations: dict[str, str], figures: dict[str, bytes]) -> list[str]:
    rows = [[a, ACTIVATIONS[a].formula, ACTIVATIONS[a].paper] for a in activations]
    return [
        '<h2 id="activations">The activation functions</h2>',
        html_table(Table(["activation", "formula", "source"], rows, (0, 1, 2))),
        html_image(
            figures, "activations.png", "Each compared activation (for gated variants, the gate's) and its derivative."
        ),
    ]


def attention_section(data: ReportData, figures: dict[str, bytes]) -> list[str]:
    parts = ['<h2 id="attention">Attention patterns</h2>']
    for i, view in enumerate(data.cells):
        attention = view.attention or {}
        parts.append(cell_heading(view.cell))
        if attention.get("maps"):
            seeds = ", ".join(f"{v} seed {s}" for v, s in attention["seeds"].items())
            parts.append(
                html_image(
                    figures,
                    f"attention{figure_suffix(i, len(data.cells))}.png",
                    f"Attention weights at layer {attention['layer']} "
                    f"of each variant's trained model ({seeds}) on the first {attention['tokens']} "
                    "validation tokens; rows are queries, columns keys.",
                )
            )
            parts.append(attention_stats_table(attention))
            parts.append(f'<p class="note">Input:</p><pre>{esc(attention["text"][:600])}</pre>')
        else:
            parts.append(f'<p class="note">{esc(attention.get("note", "not computed"))}</p>')
    return parts


def attention_stats_table(attention: dict) -> str:
    """Entropy and sparsity of each variant's attention (ffnlab.study.report.attention_stats), as a table."""
    stats = attention.get("stats") or {}  # absent in report data from before they were computed
    if not stats:
        return ""
    rows = [
        [variant, num(s["entropy"], 3), num(s["uniform_entropy"], 3), f"{s['sparsity']:.1%}"]
        for variant, s in stats.items()
    ]
    head = ["variant", "entropy (nats)", "even attention", "weights < 0.01"]
    note = (
        f'<p class="note">At layer {attention["layer"]}, over heads and queries: entropy -Σ p log p of each '
        "query's attention (0: one key; the even-attention column: spread over every key it can see) and "
        "the share of the weights it can place that are below 0.01.</p>"
    )
    return html_table(Table(head, rows)) + note


# ---- Markdown -----------------------------------------------------------------------------------


def md_escape(text: object) -> str:
    """Text safe inside a Markdown table cell: HTML escaped, pipes, backslashes and asterisks escaped
    (a schedule such as gelu*2+swiglu*2 is not emphasis), line breaks (a path may hold one) as
    spaces, so one cell never breaks its table row."""
    text = " ".join(str(text).splitlines())
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


def md_table(table: Table) -> str:
    """A Markdown table whose every cell is escaped text."""
    lines = ["| " + " | ".join(md_escape(h) for h in table.head) + " |", "|" + "---|" * len(table.head)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def render_markdown(data: ReportData, figure_names: Container[str]) -> str:
    """A short summary for a README or a pull request: verdict, ranking, costs, settings, figures."""
    settings = data.settings
    out = [f"## FFN comparison: {md_escape(', '.join(data.variants))} on {md_escape(settings['data'])}", ""]
    for i, view in enumerate(data.cells):
        cell = view.cell
        suffix = figure_suffix(i, len(data.cells))
        if cell.axes:
            out += [f"### {md_escape(cell_label(cell))}", ""]
        out += [
            f"**Verdict:** {md_escape(cell.verdict)}",
            "",
            md_table(ranking_table(cell)),
            "",
            md_table(cost_table(cell)),
            "",
        ]
        if cell.literature and cell.literature["tau"] is not None:
            out += [md_escape(literature_text(cell.literature)), ""]
        for name, alt in ((f"val_loss{suffix}.png", "validation loss"), (f"final{suffix}.png", "final loss")):
            if name in figure_names:
                out.append(f"![{alt}]({FIGURES_DIR}/{name})")
        out.append("")
    if data.across_cells:
        out += [f"### Across the {len(data.across_cells['cells'])} cells", ""]
        out += [md_escape(s) for s in data.across_cells["sentences"]] + ["", md_escape(ACROSS_NOTE), ""]
    for cell in data.tuned:
        out += [
            f"### Tuned ({md_escape(cell_label(cell))}): lr chosen on validation, compared on test",
            "",
            f"**Verdict:** {md_escape(cell.verdict)}",
            "",
            md_table(tuned_table(cell)),
            "",
        ]
    scaling = data.scaling
    if scaling and "variants" in scaling:
        out += ["### Scaling: compute multipliers", "", md_table(scaling_table(scaling)), ""]
        out += [md_escape(s) for s in scaling["sentences"]] + [""]
        if "scaling.png" in figure_names:
            out += [f"![loss against compute]({FIGURES_DIR}/scaling.png)", ""]
    out.append(f"* = significant at α={data.alpha:g} after Holm correction (paired t-test over seeds).")
    out += [
        "",
        "Held equal: " + md_escape("; ".join(f"{w} ({h})" for w, h in settings["held_equal"])) + ".",
        "Not equal: " + md_escape("; ".join(f"{w} ({h})" for w, h in settings["not_equal"])) + ".",
        "",
        "<details><summary>Run settings</summary>",
        "",
        md_table(report_settings(data)),
        "",
        "</details>",
        "",
        f"Full report with costs, stability, activations and attention maps: [{REPORT_HTML}]({REPORT_HTML}).",
        "",
    ]
    return "\n".join(out)
