"""The report's data (`ffnlab.study.report.report_data`) rendered: the figures as PNG, the HTML page and
the Markdown summary.

The page opens offline: images are inline base64 PNG, the CSS is inline, there is no script, and
every piece of text that comes from the user or the store is escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Container, Iterable, Sequence

from ffnlab._util.text import human, key_values, num
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.model import describe_attn_act
from ffnlab.study import plots
from ffnlab.study.protocol import STAGE_TITLES
from ffnlab.study.summary import literature_text, p_label

# the report folder's layout, which the Markdown summary links into
REPORT_HTML = "report.html"
SUMMARY_MD = "summary.md"
FIGURES_DIR = "figures"


# ---- figures ------------------------------------------------------------------------------------


def metric_label(metric: str) -> str:
    """The axis label of the metric a cell ranks by."""
    return "validation loss (nats/token)" if metric == "final_val_loss" else "validation accuracy"


class PngDict(dict):
    """name -> PNG bytes; assigning a matplotlib figure stores its bytes and closes it, so a study with
    many cells never holds dozens of open figures."""

    def __setitem__(self, name, fig):
        super().__setitem__(name, plots.png_bytes(fig))


def render_figures(data: dict) -> dict[str, bytes]:
    """File name -> PNG bytes of every figure; cells of a study with axes get a numbered suffix."""
    styles = plots.variant_styles(data["variants"])
    figs = PngDict()  # each figure becomes PNG bytes (and is closed) as soon as it is drawn
    for i, cell in enumerate(data["cells"]):
        suffix = figure_suffix(i, len(data["cells"]))
        where = cell_label(cell)
        title = f" ({where})" if where else ""
        figs[f"val_loss{suffix}.png"] = plots.band_figure(
            cell["curves"],
            styles,
            f"validation loss, mean and {round(cell['level'] * 100)}% CI over seeds{title}",
            "training step",
            "validation loss (nats/token)",
        )
        figs[f"final{suffix}.png"] = plots.final_figure(
            [
                {
                    "ffn": r["ffn"],
                    "mean": r["mean"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "values": list(r["values"].values()),
                }
                for r in cell["rows"]
            ],
            styles,
            data["baseline"],
            metric_label(cell["metric"]),
            cell["level"],
        )
        figs[f"loss_vs_time{suffix}.png"] = plots.band_figure(
            cell["time_curves"],
            styles,
            f"validation loss against wall-clock training time{title}",
            "training time (s)",
            "validation loss (nats/token)",
        )
        figs[f"grad_norm{suffix}.png"] = plots.traces_figure(
            cell["traces"],
            styles,
            f"gradient norm before clipping, one line per seed{title}",
            "training step",
            "global gradient norm",
        )
        if any(cell["behaviour"].values()):
            figs[f"behaviour{suffix}.png"] = plots.layers_figure(
                cell["behaviour"],
                styles,
                {"dead_frac": "dead units (fraction never > 0)", "zero_frac": "sparsity (fraction of exact zeros)"},
            )
        att = cell.get("attention") or {}
        if att.get("maps"):
            figs[f"attention{suffix}.png"] = plots.attention_figure(att["maps"], att["layer"])
    scaling = data.get("scaling")
    if scaling and "variants" in scaling:
        figs["scaling.png"] = plots.scaling_figure(scaling, styles, metric_label(data["cells"][0]["metric"]))
    acts = data["activations"]
    figs["activations.png"] = plots.activations_figure(list(acts), labels=acts)
    return dict(figs)


# ---- formatting ---------------------------------------------------------------------------------


def cell_label(cell: dict) -> str:
    """'depth=2, width=64': the cell's axis values; '' for a study without axes."""
    return key_values(cell["axes"])


def figure_suffix(index: int, n_cells: int) -> str:
    """'_2' in the file names of the second cell's figures when a study has several cells, '' when one."""
    return f"_{index + 1}" if n_cells > 1 else ""


def three_digits(value: object) -> str:
    """A number to 3 significant digits ('1.23e-05', '4.1e+04'), '-' for None, anything else as text.

    NOTE: not `human`: ULP counts and gradient means span many decades, and an SI suffix ('41k')
    would hide that; numerics.json also holds 'inf' as a string."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def delta_text(row: dict, baseline: str) -> str:
    """'+0.0123 [0.0050, 0.0196] *': a ranking row's paired difference to the baseline, its CI and significance."""
    if row["ffn"] == baseline:
        return "baseline"
    if row["delta"] is None:
        return "-"
    ci = f" [{num(row['delta_ci_low'])}, {num(row['delta_ci_high'])}]" if row["delta_ci_low"] is not None else ""
    return f"{row['delta']:+.4f}{ci}{' *' if row['significant'] else ''}"


def ci_text(r: dict) -> str:
    """'mean [ci_low, ci_high]' of a row."""
    return f"{num(r['mean'])} [{num(r['ci_low'])}, {num(r['ci_high'])}]"


def ranking_rows(cell: dict, baseline: str) -> tuple[list[str], list[list[str]]]:
    """Header and plain-text rows of the ranking table (shared by HTML and Markdown)."""
    pct = round(cell["level"] * 100)
    metric = "val loss" if cell["metric"] == "final_val_loss" else "val acc"
    head = ["rank", "ffn", f"{metric} mean [{pct}% CI]", f"Δ vs {baseline} [{pct}% CI]", "p (Holm)", "seeds",
            "diverged"]  # fmt: skip
    rows = [[str(r["rank"]), r["ffn"], ci_text(r), delta_text(r, baseline), p_label(r, baseline), str(r["n_seeds"]),
             str(r["diverged"])] for r in cell["rows"]]  # fmt: skip
    return head, rows


def tuned_rows(cell: dict, baseline: str) -> tuple[list[str], list[list[str]]]:
    """The tuned comparison: each variant's lr chosen on validation, its test metric compared."""
    metric = "test loss" if cell["metric"] == "final_test_loss" else "test acc"
    head = ["rank", "ffn", "chosen setting", "val mean at it", f"{metric} mean [95% CI]", f"Δ vs {baseline} [95% CI]",
            "p (Holm)", "seeds"]  # fmt: skip
    setting = lambda r: ", ".join(f"{a} {r.get(a)}" for a in cell.get("tuned_axes", ["lr"]))
    rows = [[str(r["rank"]), r["ffn"], setting(r), num(r.get("val_mean")), ci_text(r), delta_text(r, baseline),
             p_label(r, baseline), str(r["n_seeds"])] for r in cell["variants"]]  # fmt: skip
    return head, rows


def cost_rows(cell: dict) -> tuple[list[str], list[list[str]]]:
    head = ["ffn", "params", "FLOPs/token", "tokens/s", "step time (ms)", "seeds' range (ms)", "vs baseline",
            "training memory", "saved for backward", "train time (s)"]  # fmt: skip
    spread = lambda r: f"{r[0] * 1e3:.1f}-{r[1] * 1e3:.1f}" if r else "-"
    ratio = lambda r: f"{(r['step_time_ratio'] - 1) * 100:+.0f}%" if r["step_time_ratio"] else "-"
    step_ms = lambda r: num(r["step_time_s"] * 1e3 if r["step_time_s"] else None, 1)
    rows = [[r["ffn"], human(r["params"]), human(r["flops_per_token"]), human(r["tokens_per_s"]), step_ms(r),
             spread(r["step_time_range"]), ratio(r), human(r["train_mem_bytes"], "B"), human(r["saved_bytes"], "B"),
             num(r["train_seconds"], 1)] for r in cell["rows"]]  # fmt: skip
    return head, rows


def stability_rows(cell: dict) -> tuple[list[str], list[list[str]]]:
    head = ["ffn", "gradient spikes", "loss spikes", "diverged runs", "max gradient norm", "dead units", "sparsity",
            "FFN grad mean", "FFN grad std"]  # fmt: skip
    rows = [[r["ffn"], str(r["grad_spikes"]), str(r["loss_spikes"]), f"{r['diverged']} of {r['runs']}",
             num(r["max_grad_norm"], 3), num(r["dead_frac"], 3), num(r["sparsity"], 3),
             three_digits(r["ffn_grad_mean"]), three_digits(r["ffn_grad_std"])] for r in cell["rows"]]  # fmt: skip
    return head, rows


def signal_rows(cell: dict) -> tuple[list[str], list[list[str]]]:
    """What else was measured per variant: test metric, robustness to embedding noise, perplexity,
    learned activation parameters."""
    lm = cell["metric"] == "final_val_loss"
    head = ["ffn", "test loss" if lm else "test acc", "with embedding noise", "noise effect", "perplexity",
            "learned activation parameters"]  # fmt: skip
    effect = lambda r: f"{r['noise_delta']:+.4f}" if r["noise_delta"] is not None else "-"
    rows = [[r["ffn"], num(r["test_mean"]), num(r["noisy_mean"]), effect(r), num(r["ppl"], 2),
             learned_text(r["learned"])] for r in cell["rows"]]  # fmt: skip
    return head, rows


def learned_text(learned: dict) -> str:
    """'blocks.0.ffn: beta 1.21; blocks.1.ffn: beta 1.05' (mixture weights as relu 0.31, ...)."""
    parts = []
    for layer, params in learned.items():
        values = []
        for name, v in params.items():
            if isinstance(v, dict):
                values.append(", ".join(f"{k} {x:.2f}" for k, x in v.items()))
            elif isinstance(v, (int, float)):
                values.append(f"{name} {v:.3g}")
            else:
                values.append(f"{name} {[round(x, 3) for x in v]}")
        parts.append(f"{layer}: {'; '.join(values)}")
    return "; ".join(parts) or "-"


def literature_rows(cell: dict) -> tuple[list[str], list[list[str]]] | None:
    """The measured ranking beside Shazeer 2020 Table 1 for the variants both have."""
    lit = cell.get("literature")
    if not lit or lit["n"] < 2:
        return None
    mean, published = lit["measured"], lit["published"]
    sign = -1.0 if cell.get("metric_direction") == "higher" else 1.0
    ours = sorted(lit["variants"], key=lambda v: sign * mean[v])
    theirs = sorted(lit["variants"], key=lambda v: published[v])
    head = ["ffn", "measured mean", "measured rank", "published", "published rank"]
    rows = [[v, num(mean[v]), str(ours.index(v) + 1), f"{published[v]:.3f}", str(theirs.index(v) + 1)] for v in ours]
    return head, rows


def settings_rows(data: dict) -> list[tuple[str, str]]:
    settings, env = data["settings"], data["env"]
    model = dict(settings["model"])
    axes = settings.get("axes") or {}
    for axis, key in (("depth", "n_layers"), ("width", "d_model"), ("context", "context")):  # an axis overrides
        if axis in axes:
            model[key] = "/".join(map(str, axes[axis]))
    budget = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in settings["budget"].items())
    rows = [("data", f"{settings['data']} ({settings['task']}, {settings['tokenizer']} tokenizer)")]
    if data.get("architecture"):
        rows.append(("architecture", data["architecture"]))
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
        ("variants", ", ".join(settings["variants"]) + f" (baseline {data['baseline']})"),
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
    rows.append(("store", data["store"]))
    return rows


# ---- HTML ---------------------------------------------------------------------------------------


def esc(text: object) -> str:
    """Text safe anywhere in the page, attribute values included."""
    return html.escape(str(text), quote=True)


def cell_heading(cell: dict) -> str:
    """The cell's axis values as a sub-heading; '' for a study without axes."""
    return f"<h3>{esc(cell_label(cell))}</h3>" if cell["axes"] else ""


def html_table(
    head: list[str], rows: list[list[str]], text_cols: tuple[int, ...] = (0,), marks: dict | None = None
) -> str:
    """A table whose every cell is escaped text. Columns in `text_cols` are left-aligned (numbers
    right); `marks` maps (row, col) to a CSS class."""
    marks = marks or {}

    def cls(i, j):
        names = (["t"] if j in text_cols else []) + ([marks[(i, j)]] if (i, j) in marks else [])
        return f' class="{" ".join(names)}"' if names else ""

    out = [
        "<table><thead><tr>"
        + "".join(f"<th{cls(-1, j)}>{esc(h)}</th>" for j, h in enumerate(head))
        + "</tr></thead><tbody>"
    ]
    for i, row in enumerate(rows):
        out.append("<tr>" + "".join(f"<td{cls(i, j)}>{esc(c)}</td>" for j, c in enumerate(row)) + "</tr>")
    return "".join(out) + "</tbody></table>"


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
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #d6d6d6;padding:.3em .6em;text-align:right;white-space:nowrap}
th{background:#f4f4f4}.t{text-align:left;white-space:normal}td.t:first-child{font-weight:600}
.better{color:#0072B2;font-weight:700}.worse{color:#D55E00;font-weight:700}
figure{margin:1em 0}img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.88em;color:#555}.note{color:#555;font-size:.92em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}
nav a{margin-right:.9em}footer{margin-top:3em;color:#777;font-size:.85em}
"""


def html_ranking(cell: dict, baseline: str) -> str:
    head, rows = ranking_rows(cell, baseline)
    lower = cell["metric"] == "final_val_loss"
    marks = {}
    for i, r in enumerate(cell["rows"]):
        if r["significant"]:
            better = (r["delta"] < 0) == lower
            marks[(i, 3)] = "better" if better else "worse"
    return html_table(head, rows, (1,), marks)


def html_protocol(protocol: dict, baseline: str) -> str:
    """The validation protocol's stages (protocol.json beside the store): each stage's ranking."""
    parts = [
        '<h2 id="protocol">Validation protocol</h2>',
        '<p class="note">1. every variant at the same settings; 2. each variant at its own learning rate and '
        "warm-up, chosen on validation and compared on test; 3. each at its tuned setting at other context "
        "lengths. Grid: "
        + esc(", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in protocol["grid"].items()))
        + ".</p>",
    ]
    for stage in protocol["stages"]:
        s = stage["summary"]
        parts.append(f"<h3>Stage {esc(STAGE_TITLES.get(stage['name'], stage['name']))}</h3>")
        for cell in s.get("tuned", []) if stage["name"] == "tune" else s["cells"]:
            where = cell_label(cell)
            rows = (
                tuned_rows(cell, baseline)
                if "tuned_axes" in cell
                else ranking_rows({**cell, "rows": cell["variants"]}, baseline)
            )
            parts.append(
                (f"<p>{esc(where)}</p>" if where else "")
                + html_table(*rows, (1,))
                + f'<p class="note">{esc(cell["verdict"])}</p>'
            )
    return "".join(parts)


def html_numerics(numerics: dict) -> str:
    """A compact view of a numerics.json: error per activation, dtype and pass; claims if any."""
    if "error" in numerics:
        return f'<p class="note">{esc(numerics["error"])}</p>'
    parts = []
    results = numerics.get("results") or []
    if results:
        head = ["activation", "dtype", "pass", "max abs error", "max ULP", "at x", "inf", "nan"]
        rows = [
            [
                r.get("name"),
                r.get("dtype"),
                r.get("pass"),
                three_digits(r.get("max_abs_err")),
                three_digits(r.get("max_ulp")),
                three_digits(r.get("argmax_ulp_x")),
                r.get("n_inf", "-"),
                r.get("n_nan", "-"),
            ]
            for r in results
        ]
        parts.append(html_table(head, rows, (0, 1, 2)))
    claims = numerics.get("claims") or []
    if claims:
        head = ["claim", "source", "claimed", "measured", "verdict"]
        parts.append(
            html_table(
                head,
                [
                    [c.get("claim"), c.get("source"), c.get("claimed"), c.get("measured"), c.get("verdict")]
                    for c in claims
                ],
                (0, 1, 2, 3, 4),
            )
        )
    env = numerics.get("environment") or {}
    if env:
        parts.append(
            f'<p class="note">x in {esc(numerics.get("range"))}, {esc(numerics.get("points"))} points; '
            f"torch {esc(env.get('torch'))}, {esc(env.get('machine'))}</p>"
        )
    return "".join(parts) or '<p class="note">numerics.json holds no results.</p>'


def render_html(data: dict, figures: dict[str, bytes]) -> str:
    """The self-contained report page."""
    title = f"ffnlab report: {', '.join(data['variants'])} on {data['settings']['data']}"
    cells = data["cells"]
    body = [
        *page_top(data, title),
        *ranking_section(data),
        *scaling_section(data.get("scaling"), figures),
        *literature_section(cells),
        *settings_section(data),
        *curves_section(cells, figures),
        *cost_section(cells, figures, data["env"]),
        *stability_section(cells, figures),
        *signals_section(cells),
        *activations_section(data["activations"], figures),
        *attention_section(cells, figures),
    ]
    if data["numerics"]:
        body.append('<h2 id="numerics">Numerics of the activations</h2>' + html_numerics(data["numerics"]))
    body.append(
        f"<footer>ffnlab report from {esc(data['store'])}. Reproduce: <code>ffnlab report --store "
        f"{esc(data['store'])}</code></footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request, so no 404 in the console
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n"
    )


# Each part of the page below is a list of HTML pieces; render_html joins them with line breaks.


def page_top(data: dict, title: str) -> list[str]:
    """Title, what was compared, each cell's verdict, the links to the sections and a word on other studies."""
    settings, others = data["settings"], data["other_studies"]
    parts = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="note">{len(data["variants"])} FFN variants x {settings["seeds"]} seeds, baseline '
        f"{esc(data['baseline'])}; generated {esc(data['generated'])}</p>",
    ]
    for cell in data["cells"]:
        where = cell_label(cell)
        parts.append(f'<p class="verdict">{esc(where + ": " if where else "")}{esc(cell["verdict"])}</p>')
    sections = [
        "ranking",
        *(["scaling"] if data.get("scaling") else []),
        "literature",
        *(["protocol"] if data.get("protocol") else []),
        "settings",
        "curves",
        "cost",
        "stability",
        "signals",
        "activations",
        "attention",
        *(["numerics"] if data["numerics"] else []),
    ]
    link_text = {"signals": "other measurements"}
    parts.append("<nav>" + "".join(f'<a href="#{s}">{link_text.get(s, s)}</a>' for s in sections) + "</nav>")
    if others:
        parts.append(
            f'<p class="note">The store holds {others} other stud{"y" if others == 1 else "ies"} (other '
            "settings); this report shows the most recently finished one.</p>"
        )
    return parts


def ranking_section(data: dict) -> list[str]:
    """The ranking of each cell with the noise floor, the tuned comparison and the validation protocol."""
    cells, baseline = data["cells"], data["baseline"]
    parts = ['<h2 id="ranking">Ranking</h2>']
    for cell in cells:
        parts.append(cell_heading(cell) + html_ranking(cell, baseline))
        if cell.get("noise_floor"):
            noise = cell["noise_floor"]
            parts.append(
                f'<p class="note">Noise floor: {esc(baseline)} over {esc(noise["n"])} seeds has std '
                f"{esc(num(noise['std']))} and range {esc(num(noise['range']))}.</p>"
            )
    parts.append(
        f'<p class="note">Mean over seeds with its {round(cells[0]["level"] * 100)}% t-interval. Δ is the paired '
        f"difference to {esc(baseline)} over seeds (negative loss Δ = better). * = significant at "
        f"α={cells[0]['alpha']:g} after Holm correction of the paired t-tests; coloured blue when better, "
        "orange when worse.</p>"
    )
    parts += across_section(data.get("across_cells"))
    if data["tuned"]:
        parts.append("<h3>Tuned: each variant at its own best setting</h3>")
        for cell in data["tuned"]:
            parts.append(html_table(*tuned_rows(cell, baseline), (1,)))
            parts.append(f'<p class="verdict">{esc(cell_label(cell))}: {esc(cell["verdict"])}</p>')
        parts.append(
            '<p class="note">The setting of each variant is the one with the best mean validation '
            "metric over seeds; the comparison uses the test split, so the selection cannot flatter the "
            "winner (Melis et al. 2018).</p>"
        )
    if data.get("protocol"):
        parts.append(html_protocol(data["protocol"], baseline))
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


def scaling_rows(scaling: dict) -> tuple[list[str], list[list[str]]]:
    """The fits as a table: per variant E, alpha and the compute multiplier, each with its interval."""
    level = round(scaling["level"] * 100)

    def ci(pair: list) -> str:
        return "-" if None in pair else f"{pair[0]:.3g} to {pair[1]:.3g}"

    head = ["FFN", "E", f"E {level}% CI", "alpha", f"alpha {level}% CI", "multiplier k", f"k {level}% CI",
            "lack of fit p", "fit"]  # fmt: skip
    rows = [
        [
            name,
            f"{r['E']:.3g}",
            ci(r["E_ci"]),
            f"{r['alpha']:.3g}",
            ci(r["alpha_ci"]),
            f"{r['multiplier']:.2f}",
            ci(r["multiplier_ci"]),
            "-" if r["lack_of_fit_p"] is None else f"{r['lack_of_fit_p']:.2g}",
            ("converged" if r["converged"] else "not converged") + (f": {r['note']}" if r["note"] else ""),
        ]  # fmt: skip
        for name, r in scaling["variants"].items()
    ]
    return head, rows


def scaling_section(scaling: dict | None, figures: dict[str, bytes]) -> list[str]:
    """The loss-vs-compute plot, the table of fits and the plain sentences of a study with --scale."""
    if not scaling:
        return []
    scale = ", ".join(f"{a} {', '.join(map(str, v))}" for a, v in scaling["scale"].items())
    parts = ['<h2 id="scaling">Scaling: compute multipliers</h2>', f'<p class="note">Scaled: {esc(scale)}.</p>']
    if "error" in scaling:
        return parts + [f"<p>No fit yet: {esc(scaling['error'])}</p>"]
    parts += [html_image(figures, "scaling.png", "loss against training compute, fits and bands")]
    parts += [html_table(*scaling_rows(scaling))]
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


def literature_section(cells: list[dict]) -> list[str]:
    parts = ['<h2 id="literature">Against the literature</h2>']
    for cell in cells:
        table = literature_rows(cell)
        if table is None:
            parts.append(
                cell_heading(cell) + '<p class="note">No published ranking to compare with: it needs a language '
                "model study with at least two of Shazeer (2020) Table 1's variants.</p>"
            )
            continue
        parts.append(cell_heading(cell) + html_table(*table) + f"<p>{esc(literature_text(cell['literature']))}</p>")
    return parts


def settings_section(data: dict) -> list[str]:
    settings = data["settings"]
    return [
        '<h2 id="settings">Run settings</h2>',
        html_table(["setting", "value"], [list(row) for row in settings_rows(data)], (0, 1)),
        "<h3>What the comparison held equal</h3>",
        html_table(["held equal", "how"], settings["held_equal"], (0, 1)),
        "<h3>What it did not</h3>",
        html_table(["not equal", "why"], settings["not_equal"], (0, 1)),
    ]


def curves_section(cells: list[dict], figures: dict[str, bytes]) -> list[str]:
    pct = round(cells[0]["level"] * 100)
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
                f"Final {metric_label(cell['metric'])} per variant: "
                f"mean with {pct}% CI error bars; dots are single seeds.",
            )
        )
    return parts


def cost_section(cells: list[dict], figures: dict[str, bytes], env: dict) -> list[str]:
    parts = ['<h2 id="cost">Cost</h2>']
    for i, cell in enumerate(cells):
        parts.append(cell_heading(cell) + html_table(*cost_rows(cell)))
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


def stability_section(cells: list[dict], figures: dict[str, bytes]) -> list[str]:
    parts = ['<h2 id="stability">Stability</h2>']
    for i, cell in enumerate(cells):
        suffix = figure_suffix(i, len(cells))
        parts.append(cell_heading(cell) + html_table(*stability_rows(cell)))
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


def signals_section(cells: list[dict]) -> list[str]:
    parts = ['<h2 id="signals">Other measurements</h2>']
    for cell in cells:
        parts.append(cell_heading(cell) + html_table(*signal_rows(cell), (0, 5)))
    parts.append(
        '<p class="note">Test: the held-out test split (never used to choose anything here). Embedding '
        "noise: the validation metric with Gaussian noise on the token embeddings, a robustness probe; its "
        "effect is the mean change from the clean metric. Learned parameters: means over seeds at the end "
        "of training.</p>"
    )
    return parts


def activations_section(activations: dict[str, str], figures: dict[str, bytes]) -> list[str]:
    return [
        '<h2 id="activations">The activation functions</h2>',
        html_table(
            ["activation", "formula", "source"],
            [[a, ACTIVATIONS[a].formula, ACTIVATIONS[a].paper] for a in activations],
            (0, 1, 2),
        ),
        html_image(
            figures, "activations.png", "Each compared activation (for gated variants, the gate's) and its derivative."
        ),
    ]


def attention_section(cells: list[dict], figures: dict[str, bytes]) -> list[str]:
    parts = ['<h2 id="attention">Attention patterns</h2>']
    for i, cell in enumerate(cells):
        attention = cell.get("attention") or {}
        parts.append(cell_heading(cell))
        if attention.get("maps"):
            seeds = ", ".join(f"{v} seed {s}" for v, s in attention["seeds"].items())
            parts.append(
                html_image(
                    figures,
                    f"attention{figure_suffix(i, len(cells))}.png",
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
    return html_table(head, rows) + note


# ---- Markdown -----------------------------------------------------------------------------------


def md_escape(text: object) -> str:
    """Text safe inside a Markdown table cell: HTML escaped, pipes, backslashes and asterisks escaped
    (a schedule such as gelu*2+swiglu*2 is not emphasis), line breaks (a path may hold one) as
    spaces, so one cell never breaks its table row."""
    text = " ".join(str(text).splitlines())
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


def md_table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table whose every cell is escaped text."""
    lines = ["| " + " | ".join(md_escape(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(data: dict, figure_names: Container[str]) -> str:
    """A short summary for a README or a pull request: verdict, ranking, costs, settings, figures."""
    settings = data["settings"]
    out = [f"## FFN comparison: {md_escape(', '.join(data['variants']))} on {md_escape(settings['data'])}", ""]
    for i, cell in enumerate(data["cells"]):
        suffix = figure_suffix(i, len(data["cells"]))
        if cell["axes"]:
            out += [f"### {md_escape(cell_label(cell))}", ""]
        out += [
            f"**Verdict:** {md_escape(cell['verdict'])}",
            "",
            md_table(*ranking_rows(cell, data["baseline"])),
            "",
            md_table(*cost_rows(cell)),
            "",
        ]
        if cell.get("literature") and cell["literature"]["tau"] is not None:
            out += [md_escape(literature_text(cell["literature"])), ""]
        for name, alt in ((f"val_loss{suffix}.png", "validation loss"), (f"final{suffix}.png", "final loss")):
            if name in figure_names:
                out.append(f"![{alt}]({FIGURES_DIR}/{name})")
        out.append("")
    if data.get("across_cells"):
        out += [f"### Across the {len(data['across_cells']['cells'])} cells", ""]
        out += [md_escape(s) for s in data["across_cells"]["sentences"]] + ["", md_escape(ACROSS_NOTE), ""]
    for cell in data["tuned"]:
        out += [
            f"### Tuned ({md_escape(cell_label(cell))}): lr chosen on validation, compared on test",
            "",
            f"**Verdict:** {md_escape(cell['verdict'])}",
            "",
            md_table(*tuned_rows(cell, data["baseline"])),
            "",
        ]
    scaling = data.get("scaling")
    if scaling and "variants" in scaling:
        out += ["### Scaling: compute multipliers", "", md_table(*scaling_rows(scaling)), ""]
        out += [md_escape(s) for s in scaling["sentences"]] + [""]
        if "scaling.png" in figure_names:
            out += [f"![loss against compute]({FIGURES_DIR}/scaling.png)", ""]
    out.append(f"* = significant at α={data['cells'][0]['alpha']:g} after Holm correction (paired t-test over seeds).")
    out += [
        "",
        "Held equal: " + md_escape("; ".join(f"{w} ({h})" for w, h in settings["held_equal"])) + ".",
        "Not equal: " + md_escape("; ".join(f"{w} ({h})" for w, h in settings["not_equal"])) + ".",
        "",
        "<details><summary>Run settings</summary>",
        "",
        md_table(["setting", "value"], settings_rows(data)),
        "",
        "</details>",
        "",
        f"Full report with costs, stability, activations and attention maps: [{REPORT_HTML}]({REPORT_HTML}).",
        "",
    ]
    return "\n".join(out)
