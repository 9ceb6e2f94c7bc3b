from dataclasses import replace

import numpy as np
import pytest
import torch

from ffnlab.core.activations import ACTIVATIONS, quantile, quantile_context
from ffnlab.study import plots
from ffnlab.study.render import ParetoPoint
from ffnlab.study.report import Band, Trace
from tests.conftest import variant_row

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_derivative_matches_finite_differences(name):
    # the grid stays >= 0.003 away from the kinks at 0 and +-3 (relu, hardswish, gelu_10 clip)
    x = torch.linspace(-3.9, 3.9, 79, dtype=torch.float64) + 0.013
    y, dy = plots.curve(name, x)
    h = 1e-6
    if ACTIVATIONS[name].scope == "batch":  # the grid is the quantiles' context: its derivative holds that fixed
        context = quantile_context(x)
        up, down = (quantile(x + d, context).numpy() for d in (h, -h))
    else:
        up, _ = plots.curve(name, x + h)
        down, _ = plots.curve(name, x - h)
    np.testing.assert_allclose(dy, (up - down) / (2 * h), rtol=1e-5, atol=1e-6)
    assert y.shape == dy.shape == (79,)


def test_activation_labels_name_gates_and_branches():
    labels = plots.activation_labels(["relu", "reglu", "swiglu", "mix:gelu+tanh"])
    assert labels == {
        "relu": "relu (relu, reglu gate)",
        "silu": "silu (swiglu gate)",
        "gelu": "gelu (mix:gelu+tanh branch)",
        "tanh": "tanh (mix:gelu+tanh branch)",
    }
    assert plots.activation_labels(["GELU-tanh"]) == {"gelu_tanh": "gelu_tanh"}
    assert plots.activation_labels(["switch_x:relu+tanh"]) == {
        "relu": "relu (switch_x:relu+tanh candidate)",
        "tanh": "tanh (switch_x:relu+tanh candidate)",
    }

    schedule = plots.activation_labels(["gelu*2+reglu*1"])  # a schedule: its layers' variants
    assert schedule == plots.activation_labels(["gelu", "reglu"]) == {"gelu": "gelu", "relu": "relu (reglu gate)"}
    with pytest.raises(ValueError, match="did you mean 'silu'"):
        plots.activation_labels(["sliu"])


@pytest.mark.parametrize("path,fmt", [("a.png", "png"), ("b.SVG", "svg")])
def test_figure_format(path, fmt):
    assert plots.figure_format(path) == fmt


@pytest.mark.parametrize("path", ["a.jpg", "noext"])
def test_figure_format_rejects_others(path):
    with pytest.raises(ValueError, match="png, svg"):
        plots.figure_format(path)


def test_figures_have_labelled_axes_legend_and_one_line_per_variant():
    styles = plots.variant_styles(["relu", "swiglu", "gelu"])
    assert len({s["color"] for s in styles.values()}) == 3
    bands = {v: Band([10, 20, 30], [3.0, 2.5, 2.2], low=[2.9, 2.4, 2.1], high=[3.1, 2.6, 2.3], n=3) for v in styles}
    fig = plots.band_figure(bands, styles, "t", "training step", "validation loss (nats/token)")
    ax = fig.axes[0]
    assert len(ax.lines) == 3 and ax.get_legend() is not None
    assert ax.get_xlabel() == "training step" and "nats" in ax.get_ylabel()
    assert plots.png_bytes(fig).startswith(PNG_MAGIC)

    rows = [
        variant_row(v, mean=2.0 + i, ci_low=1.9 + i, ci_high=2.1 + i, values={0: 2.0 + i, 1: 2.05 + i})
        for i, v in enumerate(styles)
    ]
    fig = plots.final_figure(rows, styles, "relu", "validation loss (nats/token)")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["gelu", "swiglu", "relu"]  # best on top
    plots.png_bytes(fig)


def test_traces_switch_to_log_scale_for_wide_ranges():
    styles = plots.variant_styles(["relu"])
    narrow = {"relu": [Trace(x=[1, 2, 3], y=[1.0, 1.2, 0.9], spikes=[], diverged=None)]}
    wide = {"relu": [Trace(x=[1, 2, 3], y=[1.0, 500.0, 0.9], spikes=[(2, 500.0)], diverged=3)]}
    assert plots.traces_figure(narrow, styles, "t", "training step", "norm").axes[0].get_yscale() == "linear"
    assert plots.traces_figure(wide, styles, "t", "training step", "norm").axes[0].get_yscale() == "log"


def test_pareto_figure_marks_and_labels_the_front_with_a_legend_entry_per_variant_and_target():
    styles = plots.variant_styles(["relu", "gelu"])
    points = [
        ParetoPoint("relu", "fp32/eager", False, 2.0, 3.2, False),
        ParetoPoint("relu", "int8/eager/int8-dynamic", False, 1.2, 3.25, True),
        ParetoPoint("gelu", "fp32/eager", False, 4.0, 3.1, True),
        ParetoPoint("gelu", "int8/eager/int8-dynamic", True, 1.5, 3.15, True),
    ]
    fig = plots.pareto_figure(points, styles)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and "latency (ms" in ax.get_xlabel() and "loss" in ax.get_ylabel()
    assert sorted(t.get_text() for t in ax.texts) == [
        "gelu QAT int8/eager/int8-dynamic", "gelu fp32/eager", "relu int8/eager/int8-dynamic",
    ]  # fmt: skip
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["relu", "gelu", "fp32/eager", "int8/eager/int8-dynamic", "QAT model", "Pareto front"]
    assert plots.png_bytes(fig).startswith(PNG_MAGIC)
    wide = [replace(points[0], latency_ms=0.5), replace(points[2], latency_ms=50.0, on_front=False)]
    fig = plots.pareto_figure(wide, styles)  # latencies a factor of 100 apart, no point on the front
    assert fig.axes[0].get_xscale() == "log" and not fig.axes[0].texts
    plots.png_bytes(fig)


def test_attention_figure_has_one_panel_per_variant_and_head():
    maps = {"relu": np.full((6, 5, 5), 0.2), "swiglu": np.full((6, 5, 5), 0.2)}
    fig = plots.attention_figure(maps, layer=1, max_heads=4)
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 2 * 4
    plots.png_bytes(fig)


def test_plot_cli_writes_png_and_svg(run_cli, tmp_path):
    code, out, err = run_cli("plot", "activations", "gelu,silu,gelu_tanh,swiglu", "--out", tmp_path / "a.png")
    assert code == 0, err
    assert (tmp_path / "a.png").read_bytes().startswith(PNG_MAGIC)
    code, _, err = run_cli("plot", "activations", "relu", "--out", tmp_path / "a.svg", "--xmin", -6, "--xmax", 2)
    assert code == 0, err
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:400]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["gelu", "--out", "x.jpg"], "valid extensions: png, svg"),
        (["gelu,sliu", "--out", "x.png"], "did you mean 'silu'"),
        (["gelu", "--out", "x.png", "--xmin", 2, "--xmax", 1], "range is empty or reversed"),
        (["gelu", "--out", "x.png", "--xmin", "-inf"], "range must be finite"),
        (["gelu", "--out", "x.png", "--xmin", "-1e308", "--xmax", "1e308"], "HI - LO overflows"),
        (["gelu", "--out", "x.png", "--xmin", "1e-3", "--xmax", "-1e-3"], "range is empty or reversed"),
    ],
)
def test_plot_cli_bad_input(run_cli, tmp_path, argv, needle):
    argv = [str(tmp_path / a) if str(a).startswith("x.") else a for a in argv]
    code, _, err = run_cli("plot", "activations", *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_cells_axis_is_labelled_by_its_ranking_metric():
    from ffnlab.study.render import axis_label

    assert axis_label("final_val_loss") == "validation loss (nats/token)"
    assert axis_label("final_val_acc") == "validation accuracy"
    assert axis_label("final_val_f1") == "validation F1"  # a tagger's ranking metric is not called accuracy


def test_plot_cli_checks_where_it_writes_before_drawing(run_cli, tmp_path, monkeypatch):
    """--out in a folder that does not exist was found out only when the drawn figure was saved."""
    from ffnlab.study import plots

    monkeypatch.setattr(plots, "activations_figure", lambda *a, **kw: pytest.fail("drew before checking --out"))
    code, _, err = run_cli("plot", "activations", "gelu", "--out", tmp_path / "nowhere" / "a.png")
    assert code == 2 and err.count("\n") == 1 and "the folder" in err and "does not exist" in err
    assert not list(tmp_path.iterdir())
