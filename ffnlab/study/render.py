"""The report's data (`ffnlab.study.report.report_data`) rendered: the figures as PNG, the HTML page and
the Markdown summary.

The page and the summary are Jinja2 templates (ffnlab/study/templates: report.html.j2, summary.md.j2);
this module builds what they show: the figures, the tables (one `Table` model, also printed for the
terminal by `ffnlab.study.table`), the settings rows, the gradients-by-depth section's tables and its claims
row (claims.json), and the deployment section's text (deploy.json beside the store). The page opens offline:
images are inline base64 PNG, the CSS is inline, there is no script, and it is autoescaped, so every piece of
text that comes from the user or the store is escaped.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2

from ffnlab._util.text import human, key_values, num
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.model import describe_attn_act
from ffnlab.run.profile import StepProfile
from ffnlab.study import metrics, plots
from ffnlab.study.metrics import three_digits
from ffnlab.study.protocol import STAGE_TITLES
from ffnlab.study.records import Cell, StudySettings
from ffnlab.study.stats import MeanCI
from ffnlab.study.summary import literature_text
from ffnlab.study.table import (
    Table,
    aggregate_label,
    aggregate_table,
    cost_table,
    literature_table,
    metric_table,
    ranking_table,
    scaling_table,
    seed002_table,
    stability_table,
    tuned_table,
)
from ffnlab.tools.claims import claim_of
from ffnlab.tools.deploy import CPU_FLAGS

if TYPE_CHECKING:  # report.py renders through this module
    from matplotlib.figure import Figure

    from ffnlab.study.records import DepthClaim, LayerGrads
    from ffnlab.study.report import AttentionMaps, ReportData
    from ffnlab.tools.deploy import Delta, DeployResult, DeployRow, Latency

# the report folder's layout, which the Markdown summary links into
REPORT_HTML = "report.html"
SUMMARY_MD = "summary.md"
FIGURES_DIR = "figures"


# ---- figures ------------------------------------------------------------------------------------


AXIS_UNITS = {"nats": "nats/token"}


def axis_label(metric: str) -> str:
    """The axis label of the metric a cell ranks by, from the metric's own label (ffnlab.study.metrics):
    'validation loss (nats/token)', 'validation accuracy', 'validation F1'; a name no metric has, as given."""
    try:
        m = metrics.metric(metric)
    except ValueError:
        return metric
    return f"{m.spelled()} ({AXIS_UNITS.get(m.unit, m.unit)})" if m.unit else m.spelled()


class PngDict(dict[str, bytes]):
    """name -> PNG bytes; assigning a matplotlib figure stores its bytes and closes it, so a study with
    many cells never holds dozens of open figures."""

    def __setitem__(self, name: str, fig: Figure | bytes) -> None:
        super().__setitem__(name, fig if isinstance(fig, bytes) else plots.png_bytes(fig))


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
            cell.variants, styles, data.baseline, axis_label(cell.metric), cell.level
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
        if not isinstance(view.layer_grads, str):  # numbers, not a note on why there are none
            figs[f"{DEPTH_FIGURE}{suffix}.png"] = plots.layer_grads_figure(
                view.layer_grads.variants, styles, f"FFN gradient norm by layer, mean and range over seeds{title}"
            )
        drawn = view.attention
        if drawn is not None and not isinstance(drawn, str):  # maps, not a note on why there are none
            figs[f"attention{suffix}.png"] = plots.attention_figure(drawn.maps, drawn.layer)
    scaling = data.scaling
    if scaling and scaling.fits:
        figs["scaling.png"] = plots.scaling_figure(scaling.fits, styles, axis_label(data.cells[0].cell.metric))
    points = pareto_points(data.deployment.rows) if data.deployment else []
    if points:  # a variant deployed that the study does not hold still gets a colour of its own
        names = list(dict.fromkeys([*data.variants, *(p.ffn for p in points)]))
        figs[DEPLOY_FIGURE] = plots.pareto_figure(points, plots.variant_styles(names))
    acts = data.activations
    figs["activations.png"] = plots.activations_figure(list(acts), labels=acts)
    return dict(figs)


@dataclass(frozen=True)
class ParetoPoint:
    """One measured deployment in the trade-off figure (`pareto_points`): its batch-1 latency against its loss."""

    ffn: str
    target: str  # precision/runtime[/int8 scheme]
    qat: bool  # a QAT run's model, converted to int8
    latency_ms: float  # the median
    val_loss: float
    on_front: bool


def pareto_points(rows: Iterable[DeployRow]) -> list[ParetoPoint]:
    """The rows of a deployment with a batch-1 latency and a finite validation loss, as the figure draws them;
    on_front as `ffnlab.tools.deploy.mark_front` set it."""
    points = []
    for r in rows:
        if r.latency is None or r.quality is None or r.quality.val_loss is None:
            continue
        latency_ms, loss = float(r.latency.median_s) * 1e3, float(r.quality.val_loss)
        if math.isfinite(latency_ms) and math.isfinite(loss):
            points.append(
                ParetoPoint(r.ffn, r.target.label(), r.qat_from is not None, latency_ms, loss, r.on_front is True)
            )
    return points


# ---- formatting ---------------------------------------------------------------------------------


def cell_label(cell: Cell) -> str:
    """'depth=2, width=64': the cell's axis values; '' for a study without axes."""
    return key_values(cell.axes)


def figure_suffix(index: int, n_cells: int) -> str:
    """'_2' in the file names of the second cell's figures when a study has several cells, '' when one."""
    return f"_{index + 1}" if n_cells > 1 else ""


def sequence_text(model: dict[str, Any]) -> str:
    """What a model reads at once: 'context 64' for text; a ViT's patches ('2x2-pixel patches of 8x8 images, mean
    pooling'), of the data's own image size where the study did not set one."""
    if "patch_size" not in model:
        return f"context {model['context']}"
    patch, size = model["patch_size"], model.get("image_size")
    images = f"{size}x{size} images" if size else "the data's images"
    pool = "a class token" if model.get("pool") == "cls" else "mean pooling"
    return f"{patch}x{patch}-pixel patches of {images}, {pool}"


def data_text(settings: StudySettings) -> str:
    """The settings' data row: 'pairs.csv (cls, sentence pairs: premise [SEP] hypothesis, char tokenizer)'."""
    tokenizer, pair = settings.tokenizer, settings.pair  # no tokenizer for task image: pixels
    read = [settings.task] + ([f"sentence pairs: {pair[0]} [SEP] {pair[1]}"] if pair else [])
    read += [f"{tokenizer} tokenizer"] if tokenizer else []
    return f"{settings.data} ({', '.join(read)})"


def global_batch(settings: StudySettings) -> str:
    """A study's batch in words: the global batch, and how it is made where a run has more than one part."""
    batch, nproc, accum = settings.batch_size, settings.nproc, settings.grad_accum
    if nproc * accum == 1:
        return str(batch)
    parts = [f"{batch} per forward pass", f"{nproc} process{'es' if nproc > 1 else ''}"]
    return f"{batch * nproc * accum} ({' x '.join(parts)} x {accum} accumulated)"


def model_text(settings: StudySettings) -> str:
    """A study's model in words: its shape (an axis of depth, width or context overrides it), and for ffnlab's own
    model its norm, positions and dropout (a Hugging Face architecture's are its config's: the architecture row)."""
    model = dict(settings.model)
    axes = settings.axes
    for axis, key in (("depth", "n_layers"), ("width", "d_model"), ("context", "context")):
        if axis in axes:
            model[key] = "/".join(map(str, axes[axis]))
    text = (
        f"{model['n_layers']} layer{'s' if model['n_layers'] != 1 else ''}, {model['n_heads']} heads, "
        f"d_model {model['d_model']}, {sequence_text(model)}"
    )
    if "norm" in model:
        text += f", {model['norm']} ({model['placement']}-norm), {model['pos']} positions, dropout {model['dropout']}"
    return text


def budget_text(settings: StudySettings) -> str:
    """A study's training budget, its global batch and tokens per run, in words."""
    budget = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in settings.budget.items())
    if settings.tokens_per_run:
        return f"{budget}, batch {global_batch(settings)}, {human(settings.tokens_per_run)} tokens per run"
    if settings.task == "image":
        return f"{budget}, batch {global_batch(settings)} images"
    return budget


def machine_rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    """The machine and ffnlab's code a study ran on, as (what, value) rows (none for an empty environment)."""
    rows = []
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
    return rows


def settings_rows(
    settings: StudySettings, env: dict[str, Any], baseline: str, store: str, architecture: str | None = None
) -> list[tuple[str, str]]:
    """The run settings of a study (`ffnlab.study.summary.settings_of`) and the machine, as (what, value) rows."""
    axes, match = settings.axes, settings.match
    rows = [("data", data_text(settings))]
    if architecture:
        rows.append(("architecture", architecture))
    rows += [
        ("model", model_text(settings)),
        (
            "FFN matching",
            f"{match} (hidden width chosen so every variant matches the dense 4x FFN's {match})"
            if match != "none"
            else "none (each variant at its own width)",
        ),
        ("budget", budget_text(settings)),
        ("FFN initialisation", "/".join(map(str, axes["init"])) + " (an axis)" if "init" in axes else settings.init),
        (
            "Q/K/V activations",
            "; ".join(map(str, axes["attn_act"])) + " (an axis)"
            if "attn_act" in axes
            else describe_attn_act(settings.attn_act),
        ),
        (
            "optimiser",
            f"AdamW, peak lr {'/'.join(map(str, axes['lr'])) + ' (an axis)' if 'lr' in axes else settings.lr}"
            f", cosine to {settings.min_lr}, warm-up {settings.warmup_steps} steps, "
            f"weight decay {settings.weight_decay}, beta2 {settings.beta2}, clip {settings.grad_clip}",
        ),
        ("precision", settings.precision),
        ("seeds", f"{settings.seeds} per variant (paired: seed s of every variant sees the same data order)"),
        ("variants", ", ".join(settings.variants) + f" (baseline {baseline})"),
    ]
    if settings.per_variant:
        rows.append(("per-variant settings", "; ".join(
            f"{v}: " + ", ".join(f"{k} {x}" for k, x in o.items()) for v, o in settings.per_variant.items())))  # fmt: skip
    if settings.pretrained:
        source = settings.pretrained
        rows.append(("pretrained", f"fine-tuned from {source['from']} (digest {source['digest']})"))
    if settings.trained:  # a fine-tune: every parameter, or LoRA's adapters and a new head
        rows.append(("trained", settings.trained))
    if axes:
        rows.append(("axes", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in axes.items())))
    rows += machine_rows(env)
    rows.append(("store", store))
    return rows


def report_settings(data: ReportData) -> Table:
    rows = settings_rows(data.settings, data.env, data.baseline, data.store, data.architecture)
    return Table(["setting", "value"], [list(row) for row in rows], (0, 1))


# ---- the tables and classes the page shows beside the cells' own (ffnlab.study.table) -------------


def equality_tables(settings: StudySettings) -> tuple[Table, Table]:
    """What the comparison held equal and how, and what it did not and why."""
    return (
        Table(["held equal", "how"], settings.held_equal, (0, 1)),
        Table(["not equal", "why"], settings.not_equal, (0, 1)),
    )


def profile_table(profiles: dict[str, StepProfile]) -> Table:
    """Where a training step's time goes, a column per variant: each part's milliseconds and share of the step,
    then the step, then each variant's top operators."""
    variants = list(profiles)
    parts = [p.name for p in next(iter(profiles.values())).parts]
    rows = [
        [name, *(f"{p.ms:.2f} ({p.share:.0%})" for v in variants for p in profiles[v].parts if p.name == name)]
        for name in parts
    ]
    rows.append(["step (ms)", *(f"{profiles[v].step_ms:.2f}" for v in variants)])
    tops = ["; ".join(f"{o.name} {o.share:.0%}" for o in profiles[v].operators[:3]) for v in variants]
    rows.append(["top operators", *tops])
    return Table(["part of a step", *variants], rows)


def numerics_tables(numerics_json: dict[str, Any]) -> list[Table]:
    """A numerics.json as tables: error per activation, dtype and pass; the claims if any."""
    tables = []
    results = numerics_json.get("results") or []
    if results:
        head = ["activation", "dtype", "pass", "max abs error", "max ULP", "at x", "inf", "nan"]
        rows = [
            [str(r.get("name")), str(r.get("dtype")), str(r.get("pass")), three_digits(r.get("max_abs_err")),
             three_digits(r.get("max_ulp")), three_digits(r.get("argmax_ulp_x")), str(r.get("n_inf", "-")),
             str(r.get("n_nan", "-"))]
            for r in results
        ]  # fmt: skip
        tables.append(Table(head, rows, (0, 1, 2)))
    claims = numerics_json.get("claims") or []
    if claims:
        head = ["claim", "source", "claimed", "measured", "verdict"]
        rows = [[str(c.get(k)) for k in ("claim", "source", "claimed", "measured", "verdict")] for c in claims]
        tables.append(Table(head, rows, (0, 1, 2, 3, 4)))
    return tables


def activations_table(activations: dict[str, str]) -> Table:
    """Each compared activation with its formula and source."""
    rows = [[a, ACTIVATIONS[a].formula, ACTIVATIONS[a].paper] for a in activations]
    return Table(["activation", "formula", "source"], rows, (0, 1, 2))


def attention_table(attention: AttentionMaps) -> Table | None:
    """Entropy and sparsity of each variant's attention (ffnlab.study.report.attention_stats); None
    where there are none."""
    if not attention.stats:
        return None
    rows = [
        [variant, num(s.entropy, 3), num(s.uniform_entropy, 3), f"{s.sparsity:.1%}"]
        for variant, s in attention.stats.items()
    ]
    return Table(["variant", "entropy (nats)", "even attention", "weights < 0.01"], rows)


# ---- gradients by depth: the per-layer FFN gradient norms and the claim tested on them (summary.layer_grads) ----

DEPTH_FIGURE = "layer_grads"  # + the cell's suffix + .png
CLAIM_MEASURE = "layer_grad_ratio"  # the claim's row in ffnlab/tools/claims.json: its id, words and source


def ratio_text(m: MeanCI) -> str:
    """'1.23 [1.1, 1.36]': a mean bottom/top ratio over seeds with its interval ('1.23' for one seed)."""
    if m.mean is None:
        return "-"
    if m.ci_low is None or m.ci_high is None:
        return three_digits(m.mean)
    return f"{three_digits(m.mean)} [{three_digits(m.ci_low)}, {three_digits(m.ci_high)}]"


MAX_LAYER_COLUMNS = 8  # a deeper model's per-layer norms are in the figure only: the table would scroll


def layer_grads_table(grads: LayerGrads, pct: int) -> Table:
    """Per variant: the mean over seeds of each layer's median FFN gradient norm (up to MAX_LAYER_COLUMNS layers),
    the bottom/top ratio's mean over seeds with its interval, and each seed's ratio."""
    layers = sorted({layer for d in grads.variants.values() for layer in d.layers})
    shown = layers if len(layers) <= MAX_LAYER_COLUMNS else []
    head = ["variant", "seeds", *(f"layer {layer} norm" for layer in shown)]
    head += [f"layer 0 / layer {layers[-1]} [{pct}% CI]", "per seed (seed: ratio)"]
    rows = []
    for variant, d in grads.variants.items():
        norms = dict(zip(d.layers, d.mean))
        per_seed = ", ".join(f"{seed}: {three_digits(r)}" for seed, r in sorted(d.ratios.items()))
        rows.append([variant, str(len(d.seeds)), *(three_digits(norms.get(layer)) for layer in shown),
                     ratio_text(d.ratio), per_seed or "-"])  # fmt: skip
    return Table(head, rows, (0, len(head) - 1))


def depth_gap_table(claim: DepthClaim, pct: int) -> Table:
    """GELU's bottom/top ratio over each other variant's, paired over seeds: the factor with its interval (the log
    gap exponentiated), the paired t-test's p before and after Holm, and the pair's verdict."""
    rows = []
    for gap in claim.gaps:
        factor, low, high = gap.factor()
        interval = "" if low is None or high is None else f" [{three_digits(low)}, {three_digits(high)}]"
        p = "-" if gap.log_gap.p is None else f"{gap.log_gap.p:.2g}"
        p_adj = "-" if gap.p_adj is None else f"{gap.p_adj:.2g}"
        rows.append([gap.other, str(gap.log_gap.n), three_digits(factor) + interval, p, p_adj, gap.verdict])
    head = [
        f"{claim.variant} vs",
        "paired seeds",
        f"{claim.variant}'s ratio / the other's [{pct}% CI]",
        "p",
        "p (Holm)",
    ]
    return Table([*head, "verdict"], rows, (0, 5))


def depth_claim_row(claim: DepthClaim) -> list[str]:
    """The claim's row of claims.json (ffnlab.tools.claims: its id, words and source) with what this study
    measured and its verdict, in the claims check's columns."""
    row = claim_of(CLAIM_MEASURE)
    claimed = ", ".join(f"{key}={value}" for key, value in row["claimed"].items())
    verdict = claim.verdict or f"not measurable here: {claim.reason}"
    measured = ", ".join(f"{key}={claim.measured}" for key in row["claimed"])
    return [f"{row['id']}. {row['claim']}", row["source"], claimed, measured, verdict]


def depth_claim_table(claim: DepthClaim) -> Table:
    return Table(["claim", "source", "claimed", "measured", "verdict"], [depth_claim_row(claim)], (0, 1, 2, 3, 4))


def depth_claim_text(claim: DepthClaim) -> str:
    """The claim and its verdict in one sentence, with each pair's factor: for the Markdown summary."""
    row = claim_of(CLAIM_MEASURE)
    said = f"Claim {row['id']} (claims.json), {row['claim']}"
    if claim.verdict is None:
        return f"{said}: not tested, {claim.reason}."
    pairs = "; ".join(
        f"{claim.variant} vs {g.other}: ratio x{three_digits(g.factor()[0])}, p (Holm) "
        + ("-" if g.p_adj is None else f"{g.p_adj:.2g}")
        for g in claim.gaps
    )
    return f"{said}: {claim.verdict} ({pairs})."


# ---- the deployment section: deploy.json beside the store (ffnlab.study.deployment) -----------------

DEPLOY_FIGURE = "deployment.png"
DEPLOY_LEVEL = 0.95  # NOTE: deploy.json stores no level: ffnlab.study.deployment pairs seeds at paired_diff's default
FRONT = {True: "yes", False: "no", None: "-"}  # a row's on_front; None: no quality measured


def latency_text(latency: Latency | None) -> str:
    """'1.23 [1.2-1.31]': the median milliseconds of a call and its quartiles."""
    if latency is None:
        return "-"
    return f"{latency.median_s * 1e3:.3g} [{latency.q1_s * 1e3:.3g}-{latency.q3_s * 1e3:.3g}]"


def megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**20:.3g}"


def paired_delta_text(delta: Delta | None, digits: int = 4) -> str:
    """'+0.0012 [-0.0010, +0.0030]': a paired difference over seeds with its interval ('-' where none)."""
    if delta is None or delta.delta is None:
        return "-"
    if delta.ci_low is None or delta.ci_high is None:  # one seed: no interval
        return f"{delta.delta:+.{digits}f}"
    return f"{delta.delta:+.{digits}f} [{delta.ci_low:+.{digits}f}, {delta.ci_high:+.{digits}f}]"


def deployed_name(row: DeployRow) -> str:
    """The variant of a row; a QAT run's model as 'gelu QAT 0.8' (the fraction of training it fake-quantised)."""
    return row.ffn if row.qat_from is None else f"{row.ffn} QAT {row.qat_from:g}"


def deployment_text(row: DeployRow) -> str:
    """A row's precision/runtime/scheme, and why it was not measured: in the table's second column, which wraps,
    so that the reason is read beside the variant without scrolling the table."""
    return row.target.label() + ("" if row.reason is None else f" not measured: {row.reason}")


def deploy_note(row: DeployRow) -> str:
    """Where a measured row's quality was measured and what its delta is against, when that is not its own
    runtime and runs; '' otherwise. What a runtime leaves unmeasured in every row is `deploy_notes`'."""
    q = row.quality
    if q is None:
        return ""
    notes = []
    if q.measured_in != row.runtime:
        notes.append(f"quality as in {q.measured_in} (the same computation)")
    if row.qat_from is not None:
        notes.append(f"Δ vs {q.reference}; vs their int8-dynamic PTQ {paired_delta_text(q.vs_ptq)}")
    return "; ".join(notes)


def deploy_table(result: DeployResult, short: bool = False) -> Table:
    """One row per variant x precision x runtime (x int8 scheme): batch-1 latency, throughput, memory, validation
    loss and its paired difference to fp32 PyTorch eager of the same runs, whether the row is on the Pareto front
    of latency against loss (marked 'better'), why a row was not measured, and a note where a row's quality is
    not its own runtime's or runs'; a tagger's span F1 and its paired difference beside them. `short` (the Markdown
    summary) leaves out memory, accuracy and the notes. The roofline is `deploy_fastest`'s."""
    rows = result.rows
    batch = next((r.throughput.batch for r in rows if r.throughput), result.setup.get("batch", "?"))
    accuracy = not short and any(r.quality and r.quality.val_acc_delta for r in rows)
    f1 = any(r.quality and r.quality.val_f1 is not None for r in rows)  # a tagger's: in the short table too
    notes = [] if short else [deploy_note(r) for r in rows]
    pct = round(DEPLOY_LEVEL * 100)
    head = ["ffn", "deployment", "batch-1 ms [quartiles]", f"tokens/s at batch {batch}"]
    head += [] if short else ["weights / peak / disk MB"]
    head += ["val loss", f"Δ vs fp32 eager [{pct}% CI]"]
    head += ["val acc", f"Δ acc [{pct}% CI]"] if accuracy else []
    head += ["val span F1", f"Δ F1 [{pct}% CI]"] if f1 else []
    head += ["Pareto front"]
    body = []
    for r in rows:
        q = r.quality
        cells = [deployed_name(r), deployment_text(r), latency_text(r.latency),
                 "-" if r.throughput is None else f"{r.throughput.tokens_per_s:,.0f}"]  # fmt: skip
        if not short:
            cells.append(" / ".join(megabytes(b) for b in (r.weight_bytes, r.peak_mem_bytes, r.disk_bytes)))
        cells += ["-", "-"] if q is None else [num(q.val_loss), paired_delta_text(q.val_loss_delta)]
        if accuracy:
            cells += ["-", "-"] if q is None else [num(q.val_acc, 3), paired_delta_text(q.val_acc_delta, 3)]
        if f1:
            cells += ["-", "-"] if q is None else [num(q.val_f1, 3), paired_delta_text(q.val_f1_delta, 3)]
        body.append([*cells, FRONT[r.on_front]])
    marks = {(i, len(head) - 1): "better" for i, r in enumerate(rows) if r.on_front}
    text_cols: tuple[int, ...] = (0, 1)
    if any(notes):  # a column only where some row has one
        head.append("note")
        for cells, note in zip(body, notes):
            cells.append(note)
        text_cols += (len(head) - 1,)
    return Table(head, body, text_cols, marks)


def deploy_notes(result: DeployResult) -> list[str]:
    """What measured rows left unmeasured ('peak memory: ONNX Runtime reports none'), each note once with the
    deployments it holds for: the same for every variant, so said once under the table rather than in each row."""
    targets: dict[str, list[str]] = {}  # note -> deployments
    for r in result.rows:
        for note in r.notes:
            targets.setdefault(note, [])
            if r.target.label() not in targets[note]:
                targets[note].append(r.target.label())
    return [f"{note} ({', '.join(labels)})" for note, labels in targets.items()]


def deploy_fastest(result: DeployResult) -> list[str]:
    """Per variant (a QAT model apart), the deployment fastest at batch 1 and how far it is from its roofline: the
    time its weights take to read once at the measured copy bandwidth."""
    fastest: dict[str, tuple[float, DeployRow]] = {}  # name -> (batch-1 median, its row)
    for r in result.rows:
        name = deployed_name(r)
        if r.latency is not None and (name not in fastest or r.latency.median_s < fastest[name][0]):
            fastest[name] = (r.latency.median_s, r)
    out = []
    for name, (median_s, r) in fastest.items():
        text = f"{name}: {r.target.label()} at {median_s * 1e3:.3g} ms"
        if r.roofline_s:
            text += f" ({median_s / r.roofline_s:.3g}x its roofline of {r.roofline_s * 1e3:.3g} ms)"
        out.append(text)
    return out


def threads_text(setup: dict[str, Any]) -> str:
    """'1 thread', '4 threads': what a deployment was timed on."""
    threads = setup.get("threads", "?")
    return f"{threads} thread{'' if threads == 1 else 's'}"


def deploy_held_equal(result: DeployResult) -> str:
    """What every row of a deployment shares: the model and its weights, the batches its quality is measured on,
    the timing inputs, the threads and the repeats."""
    setup, model = result.setup, result.model
    layers = model.get("n_layers", "?")
    parts = [f"the model (d_model {model.get('d_model', '?')}, {layers} layer{'' if layers == 1 else 's'}, "
             f"context {model.get('context', '?')})"]  # fmt: skip
    seeds = setup.get("seeds")
    if seeds is None:  # a fresh model's (`ffnlab deploy` without --store)
        parts.append(f"the same untrained weights ({result.source})")
    else:
        parts += [
            f"the same trained weights ({result.source}, seeds {', '.join(map(str, seeds))}; "
            "costs timed on each variant's first seed)",
            f"the same fixed validation batches ({setup.get('quality_batches', '?')} of "
            f"{setup.get('quality_batch_size', '?')} sequences, the runs' own final evaluation), each seed paired "
            "with its own fp32 eager model",
        ]
    parts += [
        threads_text(setup),
        f"the same fixed random token ids at batch 1 and batch {setup.get('batch', '?')}, {setup.get('seq', '?')} tokens each",
        f"median [quartiles] of {setup.get('repeats', '?')} timed calls after {setup.get('warmup', '?')} warm-up",
    ]
    return "; ".join(parts)


def deploy_machine(result: DeployResult) -> str:
    """Where a deployment was measured: the CPU and the flags int8 and bf16 speed rest on, the threads, the
    library versions, and the copy bandwidth the roofline reads weights at."""
    env, setup = result.environment, result.setup
    flags = env.get("cpu_flags") or []
    versions = ", ".join(f"{name} {env.get(name) or '-'}" for name in ("torch", "torchao", "onnxruntime", "onnx"))
    text = (
        f"{env.get('cpu') or '?'} ({setup.get('device', 'cpu')}), "
        + (f"flags {', '.join(flags)}" if flags else f"none of the flags {', '.join(CPU_FLAGS)}")
        + f"; {threads_text(setup)}; {versions}, Python {env.get('python') or '-'}"
    )
    if setup.get("copy_gbs"):
        text += f"; copy bandwidth {setup['copy_gbs']:.3g} GB/s (the roofline's)"
    return text


def cell_classes(table: Table, row: int, column: int) -> list[str]:
    """The HTML classes of a table cell (row -1 is the header): 't' in a text column (left-aligned), and
    the cell's mark ('better', 'worse')."""
    mark = table.marks.get((row, column))
    return (["t"] if column in table.text_cols else []) + ([mark] if mark else [])


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


# ---- the templates ------------------------------------------------------------------------------

# what the templates call: the cells' tables (ffnlab.study.table), the report's own, the labels, and the
# report folder's layout
TEMPLATE_FUNCTIONS = (
    *(ranking_table, tuned_table, cost_table, stability_table, metric_table, literature_table, scaling_table),
    *(report_settings, equality_tables, numerics_tables, activations_table, attention_table, cell_classes),
    *(profile_table, deploy_table, deploy_notes, deploy_fastest, deploy_held_equal, deploy_machine),
    *(layer_grads_table, depth_gap_table, depth_claim_table, depth_claim_text),
    *(cell_label, figure_suffix, axis_label, literature_text, num),
    *(aggregate_table, aggregate_label, seed002_table),
)
TEMPLATE_GLOBALS = {f.__name__: f for f in TEMPLATE_FUNCTIONS} | {
    "STAGE_TITLES": STAGE_TITLES,
    "FIGURES_DIR": FIGURES_DIR,
    "REPORT_HTML": REPORT_HTML,
    "DEPLOY_FIGURE": DEPLOY_FIGURE,
    "DEPTH_FIGURE": DEPTH_FIGURE,
}


def template_environment(autoescape: bool) -> jinja2.Environment:
    """The package's templates (ffnlab/study/templates); a name a template misspells is an error
    (StrictUndefined), not an empty string."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ffnlab.study", "templates"),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,  # a line holding only a {% tag %} leaves no blank line
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals.update(TEMPLATE_GLOBALS)
    return env


HTML_TEMPLATES = template_environment(autoescape=True)
# Markdown is not HTML: no autoescape there, and every value goes through the md filter (md_escape) instead
MARKDOWN_TEMPLATES = template_environment(autoescape=False)
MARKDOWN_TEMPLATES.filters.update(md=md_escape, md_table=md_table)


def render_html(data: ReportData, figures: dict[str, bytes]) -> str:
    """The self-contained report page (templates/report.html.j2), each figure inline as base64 PNG."""
    images = {name: base64.b64encode(png).decode("ascii") for name, png in figures.items()}
    return HTML_TEMPLATES.get_template("report.html.j2").render(data=data, images=images)


def render_markdown(data: ReportData, figure_names: Container[str]) -> str:
    """A short summary for a README or a pull request (templates/summary.md.j2): verdict, ranking, costs,
    settings, and links to the figures drawn."""
    return MARKDOWN_TEMPLATES.get_template("summary.md.j2").render(data=data, figure_names=figure_names)
