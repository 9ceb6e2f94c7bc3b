"""Figures of a comparison: each function takes plain numbers and returns a matplotlib Figure.

Matplotlib runs on the Agg backend (no display needed). Every figure labels its axes with units,
has a legend, and colours variants from the Okabe-Ito palette, which stays distinguishable with
the common colour-vision deficiencies; line styles repeat the distinction for grey-scale prints.
A variant keeps its colour across all figures of a report (`variant_styles`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import matplotlib

matplotlib.use("Agg")  # NOTE: before pyplot is imported anywhere, so no GUI backend is ever tried
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FormatStrFormatter, MaxNLocator

from ffnlab._util.files import atomic_path
from ffnlab._util.names import normalize
from ffnlab._util.ranges import check_range
from ffnlab.core.activations import ACTIVATIONS, get_activation, resolve
from ffnlab.core.ffn import FFNS, get_ffn_spec
from ffnlab.study.records import VariantRow
from ffnlab.study.scaling import ScalingFits

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.9; only its name is needed here

    from ffnlab.study.records import VariantDepth
    from ffnlab.study.render import ParetoPoint
    from ffnlab.study.report import Band, Behaviour, Trace  # the report's data (report.py imports this)

# Okabe & Ito 2008, "Color Universal Design"; yellow last: it is faint on white.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
LINESTYLES = ("-", "--", "-.", ":")
FORMATS = ("png", "svg")
DPI = 110
STYLE: dict[RcKeyType, Any] = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.constrained_layout.use": True,
}


class LineStyle(TypedDict):
    """A variant's line in every figure: keyword arguments of matplotlib's plot."""

    color: str
    linestyle: str


Styles = dict[str, LineStyle]  # variant -> its line


def variant_styles(names: list[str]) -> Styles:
    """A fixed colour per position, the line style changing every 8 names."""
    return {
        n: LineStyle(color=OKABE_ITO[i % len(OKABE_ITO)], linestyle=LINESTYLES[(i // len(OKABE_ITO)) % 4])
        for i, n in enumerate(names)
    }


def figure(ncols: int = 1, nrows: int = 1, width: float = 7.5, height: float = 4.0) -> tuple[Figure, np.ndarray]:
    """A new figure and its axes under the report style."""
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    return fig, axes


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    with plt.rc_context(STYLE):
        fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def figure_format(path: str | Path) -> str:
    """'png' or 'svg' from a file name; ValueError naming the valid extensions otherwise."""
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in FORMATS:
        raise ValueError(
            f"cannot write a figure as '.{ext}' ({path}); valid extensions: {', '.join(FORMATS)}"
            if ext
            else f"figure file {path} has no extension; valid: {', '.join(FORMATS)}"
        )
    return ext


def save(fig: Figure, where: str | Path) -> Path:
    """Write the figure to `where` (format by extension) through a temporary file; closes it."""
    path = Path(where)
    fmt = figure_format(path)
    try:
        with atomic_path(path) as tmp, plt.rc_context(STYLE):
            fig.savefig(tmp, format=fmt)
    finally:
        plt.close(fig)
    return path


# ---- activation functions ---------------------------------------------------------------------


def activation_labels(names: list[str]) -> dict[str, str]:
    """Registry activation -> legend text, for activation names and FFN variants alike: a gated
    variant contributes its gate ('silu (swiglu gate)'), a mix both branches, a switch_x its candidates. ValueError
    with the valid names for an unknown one; a per-layer schedule contributes its layers' variants."""
    keys = []
    for name in map(normalize, names):
        keys += [v for v, _ in get_ffn_spec(name).runs] if "*" in name else [name]
    uses: dict[str, list[str]] = {}
    for key in dict.fromkeys(keys):
        if key in ACTIVATIONS:
            uses.setdefault(key, []).append(key)
        elif key in FFNS or key.startswith(("mix:", "switch_x:")):
            spec = get_ffn_spec(key)
            role = {"dense": "", "gated": " gate", "mix": " branch", "switch": " candidate"}[spec.kind]
            for act in spec.acts:
                uses.setdefault(act, []).append(spec.name + role)
        else:
            resolve(key)  # raises with a did-you-mean and the valid activations
    return {act: act if u == [act] else f"{act} ({', '.join(u)})" for act, u in uses.items()}


def curve(name: str, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """f(x) and f'(x) of a registered activation (derivative by autograd, float64).

    Learnable activations are drawn at their initial parameters."""
    x = x.detach().to(torch.float64).requires_grad_(True)
    act = get_activation(name).to(torch.float64)
    y = act(x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    return y.detach().numpy(), dy.numpy()


def activations_figure(
    names: list[str], lo: float = -4.0, hi: float = 4.0, points: int = 801, labels: dict[str, str] | None = None
) -> Figure:
    """Curves (left) and derivatives (right) of registered activations, side by side.

    `labels` maps an activation to its legend text (e.g. 'silu (swiglu gate)')."""
    check_range(lo, hi, example="-4,4")
    x = torch.linspace(lo, hi, points, dtype=torch.float64)
    # curves can coincide (gelu and gelu_tanh differ by < 1e-3): a line style each keeps both visible
    styles = {
        n: LineStyle(color=OKABE_ITO[i % len(OKABE_ITO)], linestyle=LINESTYLES[i % len(LINESTYLES)])
        for i, n in enumerate(names)
    }
    fig, axes = figure(2, width=9.0, height=4.0)
    left, right = axes[0]
    for name in names:
        y, dy = curve(name, x)
        label = (labels or {}).get(name, name) + (" (at init)" if ACTIVATIONS[name].learnable else "")
        left.plot(x.numpy(), y, label=label, linewidth=1.8, **styles[name])
        right.plot(x.numpy(), dy, label=label, linewidth=1.8, **styles[name])
    left.set(title="activation f(x)", xlabel="pre-activation x", ylabel="f(x)")
    right.set(title="derivative f'(x) (autograd)", xlabel="pre-activation x", ylabel="f'(x)")
    for ax in (left, right):
        ax.axhline(0, color="0.6", linewidth=0.8)
        ax.axvline(0, color="0.6", linewidth=0.8)
    left.legend(loc="upper left")
    return fig


# ---- training curves --------------------------------------------------------------------------


def band_figure(
    bands: dict[str, Band[Any]], styles: Styles, title: str, xlabel: str, ylabel: str, log_y: bool = False
) -> Figure:
    """Mean line with a shaded confidence band per variant."""
    fig, axes = figure()
    ax = axes[0][0]
    for name, b in bands.items():
        if not b.x:
            continue
        ax.plot(b.x, b.mean, label=f"{name} (n={b.n})", linewidth=1.8, **styles[name])
        ax.fill_between(b.x, b.low, b.high, color=styles[name]["color"], alpha=0.18, linewidth=0)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if log_y:
        ax.set_yscale("log")
    if "step" in xlabel:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.lines:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no finished run", transform=ax.transAxes, ha="center", va="center", color="0.4")
    return fig


def scaling_figure(fits: ScalingFits, styles: Styles, ylabel: str) -> Figure:
    """Loss against training compute on log axes: each run as a dot, each variant's fitted power law
    with its confidence band (`ffnlab.study.scaling.fit_scaling`'s curve)."""
    fig, axes = figure()
    ax = axes[0][0]
    for name, fit in fits.variants.items():
        style, curve = styles[name], fit.curve
        ax.scatter([c for c, _, _ in fit.points], [y for _, y, _ in fit.points], color=style["color"],
                   alpha=0.5, s=16, zorder=2)  # fmt: skip
        label = f"{name}: E={fit.E:.3g}, alpha={fit.alpha:.3g}, k={fit.multiplier:.2f}"
        ax.plot(curve.compute, curve.loss, label=label, linewidth=1.8, **style)
        if None not in curve.low + curve.high:
            ax.fill_between(curve.compute, curve.low, curve.high, color=style["color"], alpha=0.18, lw=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    level = round(fits.level * 100)
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))  # losses span a few tenths: no 4x10^0 labels
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    ax.set(title=f"loss against compute: fits E + A C^-alpha, {level}% bands over seeds",
           xlabel="training compute C (FLOPs)", ylabel=ylabel)  # fmt: skip
    ax.legend()
    return fig


def final_figure(rows: Sequence[VariantRow], styles: Styles, baseline: str, ylabel: str, level: float = 0.95) -> Figure:
    """Final metric per variant (rows in ranking order): mean with its confidence interval as error bars,
    each seed as a dot."""
    fig, axes = figure(height=max(2.5, 0.45 * len(rows) + 1.4))
    ax = axes[0][0]
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i  # best on top
        color = styles[r.ffn]["color"]
        seeds = list(r.values.values())
        if seeds:
            ax.scatter(seeds, [y] * len(seeds), color=color, alpha=0.45, s=18, zorder=2)
        if r.mean is not None:
            lo = r.mean - r.ci_low if r.ci_low is not None else 0
            hi = r.ci_high - r.mean if r.ci_high is not None else 0
            ax.errorbar([r.mean], [y], xerr=[[lo], [hi]], fmt="o", color=color, capsize=4, markersize=7, zorder=3)
    base = next((r.mean for r in rows if r.ffn == baseline and r.mean is not None), None)
    if base is not None:
        ax.axvline(base, color="0.5", linestyle="--", linewidth=1, label=f"{baseline} mean")
    ax.set_yticks(range(len(rows)), [r.ffn for r in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set(
        title=f"final {ylabel}: mean and {round(level * 100)}% CI over seeds (dots: seeds)",
        xlabel=ylabel,
        ylabel="FFN variant",
    )
    if base is not None:
        ax.legend(loc="best")
    return fig


def traces_figure(traces: dict[str, list[Trace]], styles: Styles, title: str, xlabel: str, ylabel: str) -> Figure:
    """One thin line per seed, the variant's colour, with spikes and divergence marked; a log
    scale when the values span more than a factor of 20."""
    fig, axes = figure()
    ax = axes[0][0]
    spiked = False
    for name, runs in traces.items():
        for i, t in enumerate(runs):
            ax.plot(t.x, t.y, linewidth=0.9, alpha=0.8, label=name if i == 0 else None, **styles[name])
            if t.spikes:
                sx, sy = zip(*t.spikes)
                ax.scatter(
                    sx, sy, marker="^", s=30, color=styles[name]["color"], zorder=3, edgecolors="black", linewidths=0.5
                )
                spiked = True
            if t.diverged is not None:
                ax.axvline(t.diverged, color=styles[name]["color"], linestyle=":", linewidth=1.5)
    if spiked:  # one neutral legend entry for the markers of every variant
        ax.scatter([], [], marker="^", s=30, color="white", edgecolors="black", linewidths=0.5, label="spike")
    values = [y for runs in traces.values() for t in runs for y in t.y if np.isfinite(y) and y > 0]
    log_y = bool(values) and max(values) > 20 * min(values)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel + (" (log scale)" if log_y else ""))
    if log_y:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.lines:
        ax.legend()
    return fig


def layers_figure(per_layer: Behaviour, styles: Styles, panels: dict[str, str]) -> Figure:
    """Grouped bars per layer, one panel per quantity.

    per_layer: variant -> layer -> {quantity: value}; panels: quantity -> axis label."""
    layers = sorted({layer for v in per_layer.values() for layer in v}, key=_layer_order)
    names = [n for n in per_layer if per_layer[n]]
    fig, axes = figure(len(panels), width=4.5 * len(panels), height=3.8)
    width = 0.8 / max(1, len(names))
    for ax, (key, label) in zip(axes[0], panels.items()):
        for j, name in enumerate(names):
            values = [per_layer[name].get(layer, {}).get(key, np.nan) for layer in layers]
            ax.bar(
                np.arange(len(layers)) + (j - (len(names) - 1) / 2) * width,
                values,
                width,
                color=styles[name]["color"],
                label=name,
                edgecolor="white",
                linewidth=0.5,
            )
        ax.set_xticks(range(len(layers)), [_layer_label(layer) for layer in layers])
        ax.set(xlabel="layer", ylabel=label, ylim=(0, 1.05))
        ax.set_title(label)
    axes[0][0].legend()
    return fig


def layer_grads_figure(variants: dict[str, VariantDepth], styles: Styles, title: str) -> Figure:
    """Each variant's FFN gradient norm by layer (0 = bottom): the mean over seeds of each run's median norm, one
    line per variant, the lowest to the highest seed as error bars; the variants set slightly apart along x so
    that their bars stay visible. A log scale when the values span more than a factor of 20."""
    fig, axes = figure(height=4.2)
    ax = axes[0][0]
    names = [n for n in variants if variants[n].layers]
    shift = 0.06 if len(names) > 1 else 0.0
    for j, name in enumerate(names):
        d, style = variants[name], styles[name]
        x = np.asarray(d.layers, dtype=float) + (j - (len(names) - 1) / 2) * shift
        mean = np.asarray(d.mean)
        spread = [mean - np.asarray(d.low), np.asarray(d.high) - mean]
        ax.errorbar(x, mean, yerr=spread, marker="o", markersize=5, capsize=4, linewidth=1.8,
                    label=f"{name} (n={len(d.seeds)})", **style)  # fmt: skip
    values = [y for n in names for y in variants[n].low + variants[n].high if np.isfinite(y) and y > 0]
    log_y = bool(values) and max(values) > 20 * min(values)
    if log_y:
        ax.set_yscale("log")
    ylabel = "FFN gradient norm (median over steps)" + (" (log scale)" if log_y else "")
    ax.set(title=title, xlabel="layer (0 = bottom, next to the embeddings)", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if names:
        ax.legend()
    return fig


def _layer_order(name: str) -> tuple[list[int], str]:
    digits = "".join(c if c.isdigit() else " " for c in name).split()
    return ([int(d) for d in digits], name)


def _layer_label(name: str) -> str:
    """'blocks.3.ffn' -> '3'; other module names shortened the same way."""
    return name.replace("blocks.", "").replace(".ffn", "").replace(".branches.", "/") or name


def attention_figure(maps: dict[str, np.ndarray], layer: int, max_heads: int = 4) -> Figure:
    """Attention weights as heat maps: one row per variant, one column per head (at most `max_heads`).

    maps: variant -> array (n_heads, T, T) of probabilities, rows = queries."""
    names = list(maps)
    heads = min(max_heads, max(m.shape[0] for m in maps.values()))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(names), heads, figsize=(2.3 * heads + 1.2, 2.3 * len(names) + 0.6), squeeze=False)
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)  # sqrt scale: small weights stay visible
    image = None
    for i, name in enumerate(names):
        for h in range(heads):
            ax = axes[i][h]
            ax.grid(False)
            if h < maps[name].shape[0]:
                image = ax.imshow(maps[name][h], cmap="viridis", norm=norm, interpolation="nearest")
            ax.set_title(f"{name}, head {h}", fontsize=9)
            ax.set_xlabel("key position" if i == len(names) - 1 else "")
            ax.set_ylabel("query position" if h == 0 else "")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"attention at layer {layer} on a fixed validation input")
    return fig


# ---- deployment ----------------------------------------------------------------------------------

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*")  # one per precision/runtime/scheme


def pareto_figure(points: Sequence[ParetoPoint], styles: Styles) -> Figure:
    """Batch-1 latency (x) against validation loss (y), one marker per deployed model: the colour its variant's,
    the shape its precision/runtime/scheme, hollow for a QAT run's model; the points on the Pareto front ringed,
    labelled and joined by the staircase that bounds what they dominate. The latency axis is logarithmic when it
    spans more than a factor of 10."""
    targets = list(dict.fromkeys(p.target for p in points))
    shapes = {t: MARKERS[i % len(MARKERS)] for i, t in enumerate(targets)}
    fig, axes = figure(width=8.5, height=4.8)
    ax = axes[0][0]
    for p in points:
        color = styles[p.ffn]["color"]
        ax.scatter([p.latency_ms], [p.val_loss], marker=shapes[p.target], s=46, linewidths=1.4, zorder=3,
                   facecolors="none" if p.qat else color, edgecolors=color)  # fmt: skip
    latencies = [p.latency_ms for p in points]
    log_x = bool(latencies) and max(latencies) > 10 * min(latencies)
    if log_x:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))  # 0.1 and 1, not 10^-1 and 10^0
    front = sorted((p for p in points if p.on_front), key=lambda p: p.latency_ms)
    if front:
        x, y = [p.latency_ms for p in front], [p.val_loss for p in front]
        ax.step(x, y, where="post", color="0.45", linestyle="--", linewidth=1, zorder=2)
        ax.scatter(x, y, s=170, facecolors="none", edgecolors="black", linewidths=0.9, zorder=2)
        scale = np.log if log_x else np.asarray
        low, high = scale(min(latencies)), scale(max(latencies))
        for p in front:  # a label left of a point in the right half, so that it stays over the axes
            right = high > low and (scale(p.latency_ms) - low) / (high - low) > 0.5
            label = f"{p.ffn}{' QAT' if p.qat else ''} {p.target}"
            ax.annotate(label, (p.latency_ms, p.val_loss), xytext=(-9 if right else 9, 6), textcoords="offset points",
                        ha="right" if right else "left", fontsize=8)  # fmt: skip
    xlabel = "batch-1 latency (ms, median" + ("; log scale)" if log_x else ")")
    ax.set(
        title="inference cost against quality: the trained models deployed",
        xlabel=xlabel,
        ylabel="validation loss (nats)",
    )
    variants = list(dict.fromkeys(p.ffn for p in points))
    handles: list[Artist] = [Patch(color=styles[v]["color"], label=v) for v in variants]
    handles += [Line2D([], [], marker=shapes[t], linestyle="", color="0.35", label=t) for t in targets]
    if any(p.qat for p in points):
        handles.append(
            Line2D([], [], marker="o", linestyle="", color="0.35", markerfacecolor="none", label="QAT model")
        )
    if front:
        handles.append(Line2D([], [], marker="o", markersize=11, linestyle="--", color="0.45", markerfacecolor="none",
                              markeredgecolor="black", label="Pareto front"))  # fmt: skip
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)
    return fig
