"""The report's gradients by depth (issue #27, item 7): the FFN gradient norm by layer per variant, and the claim
that GELU gives the bottom layers larger updates, tested on each run's bottom/top gradient-norm ratio."""

import json
import math

import numpy as np
import pytest
from markupsafe import escape
from scipy import stats as sps

from ffnlab.run.train import TrainConfig
from ffnlab.study import plots
from ffnlab.study.compare import Comparison
from ffnlab.study.load import load_study
from ffnlab.study.report import report_data, write_report
from ffnlab.study.store import Store
from ffnlab.study.summary import (
    FAILS,
    HOLDS,
    NOT_SEPARATED,
    depth_claim,
    ffn_layer,
    layer_grad_norms,
    layer_grads,
    run_depth,
    summarize_study,
)
from ffnlab.tools import claims as cl
from tests.test_report import PNG_MAGIC, fabricated_study

# ---- the numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, layer",
    [
        ("blocks.3.ffn", 3),
        ("blocks.3.ffn.branches.1", 3),  # a mixed FFN's branch is its layer's
        ("model.layers.12.mlp", 12),  # a Hugging Face model's
        ("ffn", None),
    ],
)
def test_an_ffns_layer_is_the_first_number_in_its_name(name, layer):
    assert ffn_layer(name) == layer


def test_layer_norms_keep_steps_after_warm_up_and_join_a_mixed_ffns_branches():
    series = {
        "grad_norm/blocks.0.ffn.branches.0": {0: 1.0, 10: 3.0, 20: math.nan},
        "grad_norm/blocks.0.ffn.branches.1": {0: 1.0, 10: 4.0, 20: 2.0},
        "grad_norm/blocks.1.ffn": {0: 9.0, 10: 1.0, 20: 1.5},
        "grad_mean/blocks.1.ffn": {10: 0.1},  # not a norm
        "grad_norm": {10: 7.0},  # the global norm, not a layer's
    }
    assert layer_grad_norms(series, warmup_steps=5) == {0: {10: 5.0, 20: 2.0}, 1: {10: 1.0, 20: 1.5}}


def test_a_runs_ratio_is_the_median_of_each_steps_ratio_not_a_ratio_of_medians():
    series = {
        "grad_norm/blocks.0.ffn": {0: 50.0, 10: 2.0, 20: 10.0, 30: 3.0},
        "grad_norm/blocks.1.ffn": {0: 1.0, 10: 1.0, 20: 2.0, 30: 6.0},
        "grad_norm/blocks.2.ffn": {0: 1.0, 10: 1.0, 20: 2.0, 30: 6.0},
    }
    depth = run_depth(seed=4, series=series, warmup_steps=10)
    assert depth is not None and depth.seed == 4 and depth.steps == 3
    assert depth.layers == {0: 3.0, 1: 2.0, 2: 2.0}  # medians over steps 10, 20, 30 (step 0 is warm-up)
    assert depth.ratio == 2.0  # median of 2, 5, 0.5 (the medians' ratio would be 1.5)
    assert run_depth(0, series, warmup_steps=31) is None  # nothing logged after warm-up


def test_one_layer_or_no_per_layer_norms_is_a_note_not_a_figure():
    assert "1 layer" in layer_grads({"gelu": []}, n_layers=1, alpha=0.05, level=0.95)
    runs = {"gelu": [(0, 5, {"grad_norm": {1: 1.0}})]}
    assert "no per-layer FFN gradient norms" in layer_grads(runs, n_layers=2, alpha=0.05, level=0.95)


# ---- the verdict, on made-up per-seed ratios -------------------------------------------------------------

HIGH = {0: 2.0, 1: 2.2, 2: 2.1, 3: 2.4}
LOW = {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.1}
NOISE = {0: 2.0, 1: 1.0, 2: 2.3, 3: 0.9}


@pytest.mark.parametrize(
    "ratios, verdict, measured",
    [
        ({"gelu": HIGH, "relu": LOW}, HOLDS, "higher"),
        ({"gelu": LOW, "relu": HIGH}, FAILS, "lower"),
        ({"gelu": NOISE, "relu": {s: 1.5 for s in NOISE}}, NOT_SEPARATED, "not separated"),
        # higher than relu but not than swiglu: not every other variant, so not separated
        ({"gelu": HIGH, "relu": LOW, "swiglu": HIGH}, NOT_SEPARATED, "not separated"),
        # significantly lower than one variant sinks it, however it does against the rest
        ({"gelu": HIGH, "relu": LOW, "swiglu": {s: 2 * r for s, r in HIGH.items()}}, FAILS, "lower"),
        # two seeds: no test, whatever the gap
        ({"gelu": {0: 9.0, 1: 9.5}, "relu": {0: 1.0, 1: 1.0}}, NOT_SEPARATED, "not separated"),
    ],
)
def test_the_claims_verdict(ratios, verdict, measured):
    claim = depth_claim(ratios, alpha=0.05)
    assert claim.verdict == verdict and claim.measured == measured and claim.reason == ""
    assert [g.other for g in claim.gaps] == [v for v in ratios if v != "gelu"]


def test_the_pairs_are_log_ratios_paired_over_seeds_and_holm_corrected():
    other = {0: 1.0, 1: 1.3, 2: 1.0, 3: 1.2}
    claim = depth_claim({"gelu": HIGH, "relu": LOW, "swiglu": other}, alpha=0.05, level=0.9)
    logs = {name: np.log([r[s] for s in range(4)]) for name, r in (("gelu", HIGH), ("relu", LOW), ("swiglu", other))}
    raw = [sps.ttest_rel(logs["gelu"], logs[v]).pvalue for v in ("relu", "swiglu")]
    low, high = sorted(raw)
    holm = {low: min(1, 2 * low), high: min(1, max(2 * low, high))}
    for gap, p in zip(claim.gaps, raw):
        diff = logs["gelu"] - logs[gap.other]
        half = sps.t.ppf(0.95, 3) * diff.std(ddof=1) / 2
        assert gap.log_gap.n == 4 and gap.log_gap.p == pytest.approx(p)
        assert gap.p_adj == pytest.approx(holm[p])
        assert gap.factor() == pytest.approx(tuple(np.exp([diff.mean(), diff.mean() - half, diff.mean() + half])))


def test_without_gelu_or_another_variant_there_is_no_verdict_and_the_reason_says_why():
    assert "no gelu variant" in depth_claim({"relu": LOW, "swiglu": HIGH}).reason
    alone = depth_claim({"gelu": HIGH})
    assert alone.verdict is None and alone.measured == "-" and "no variant besides gelu" in alone.reason


def test_the_claim_is_a_row_of_claims_json_that_says_it_needs_a_study():
    row = cl.claim_of("layer_grad_ratio")
    assert row["measure"] in cl.MEASURES and row["note"].startswith("needs a study")
    measured = cl.MEASURES[row["measure"]](**row["args"])  # ffnlab numerics trains nothing: no value
    parts = [cl.check(measured.get(k), v, row["rule"][k]) for k, v in row["claimed"].items()]
    assert cl.verdict(parts) == "not measurable here"
    with pytest.raises(ValueError, match="names the measure 'nope'"):
        cl.claim_of("nope")


# ---- the figure ---------------------------------------------------------------------------------------------


def test_the_figure_draws_a_line_with_error_bars_per_variant_and_a_log_axis_over_a_wide_span():
    from ffnlab.study.records import VariantDepth
    from ffnlab.study.stats import mean_ci

    def depth(mean, low, high):
        return VariantDepth([0, 1], [0, 1, 2], mean, low, high, {0: 1.0, 1: 1.0}, mean_ci([1.0, 1.0]))

    styles = plots.variant_styles(["gelu", "relu"])
    narrow = {
        "gelu": depth([2.0, 1.5, 1.0], [1.8, 1.4, 0.9], [2.2, 1.6, 1.1]),
        "relu": depth([1, 1, 1], [1] * 3, [1] * 3),
    }
    fig = plots.layer_grads_figure(narrow, styles, "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["gelu (n=2)", "relu (n=2)"]
    assert ax.get_yscale() == "linear" and ax.lines[0].get_color() == styles["gelu"]["color"]
    wide = {"gelu": depth([100.0, 10.0, 1.0], [90.0, 9.0, 0.9], [110.0, 11.0, 1.1])}
    assert plots.layer_grads_figure(wide, styles, "t").axes[0].get_yscale() == "log"


# ---- the report of a study ------------------------------------------------------------------------------------

RATIOS = {"gelu": [2.0, 2.2, 2.1], "relu": [1.0, 1.1, 1.2]}  # per seed: layer 0's norm over layer 1's


@pytest.fixture(scope="module")
def made_up(tmp_path_factory):
    """A depth axis of 1 and 2 layers, relu and gelu x 3 seeds, with made-up per-layer gradient norms (Store API):
    a constant bottom/top ratio per run after warm-up, and a wild one at step 0, during warm-up."""
    path = fabricated_study(tmp_path_factory.mktemp("depth") / "s.db", seeds=3)
    with Store(path, create=False) as store:
        for r in store.runs():
            cfg = TrainConfig.from_dict(r.config)
            top = cfg.model.n_layers - 1
            ratio = RATIOS[cfg.model.ffn][cfg.seed]
            rows = [(0, "grad_norm/blocks.0.ffn", 100.0), (0, f"grad_norm/blocks.{top}.ffn", 1.0)]
            for step in (10, 20, 30):
                norm = 1.0 + 0.01 * step
                rows += [(step, f"grad_norm/blocks.{layer}.ffn", norm) for layer in range(1, top + 1)]
                rows.append((step, "grad_norm/blocks.0.ffn", ratio * norm))
            store.add_metrics(r.id, rows)
    return path


def test_the_report_shows_the_figure_the_ratios_and_the_verdict_of_each_cell(made_up, tmp_path):
    files = write_report(made_up, tmp_path / "out")
    names = {p.name for p in files.figures}
    assert "layer_grads_2.png" in names and "layer_grads_1.png" not in names  # depth=1 has one layer
    assert (tmp_path / "out" / "figures" / "layer_grads_2.png").read_bytes().startswith(PNG_MAGIC)
    page = files.html.read_text()
    section = page.split('<h2 id="depth">', 1)[1].split("<h2 ", 1)[0]
    assert "No figure: the models have 1 layer" in section
    for ratios in RATIOS.values():
        m = np.mean(ratios)
        half = sps.t.ppf(0.975, 2) * np.std(ratios, ddof=1) / math.sqrt(3)
        assert f"{m:.3g} [{m - half:.3g}, {m + half:.3g}]" in section
        assert ", ".join(f"{s}: {r:.3g}" for s, r in enumerate(ratios)) in section
    gaps = np.log(RATIOS["gelu"]) - np.log(RATIOS["relu"])
    p = sps.ttest_rel(np.log(RATIOS["gelu"]), np.log(RATIOS["relu"])).pvalue
    assert p < 0.05 and f"{math.exp(gaps.mean()):.3g} [" in section and f"{p:.2g}" in section
    claim = cl.claim_of("layer_grad_ratio")
    assert escape(f"{claim['id']}. {claim['claim']}") in section  # as the page escapes it
    assert "<td>gelu_vs_others=higher</td><td>holds</td>" in section.replace(' class="t"', "")
    assert "step &ge; 5" in section  # the smoke preset's warm-up, in the caption
    md = files.markdown.read_text()
    assert "**Gradients by depth:**" in md and ": holds (gelu vs relu" in md and "figures/layer_grads_2.png" in md


def test_compare_json_holds_the_claim_by_depth_as_the_report_shows_it(made_up):
    study, runs, _ = load_study(made_up)
    printed = json.loads(json.dumps(Comparison(summarize_study(study, made_up, runs)).to_json()))  # compare --json
    cells = {c["axes"]["depth"]: c["depth"] for c in printed["cells"]}
    assert "1 layer" in cells[1]["note"]
    deep = cells[2]
    assert deep["claim"]["verdict"] == HOLDS and deep["claim"]["measured"] == "higher"
    assert set(deep["variants"]) == set(RATIOS)
    for variant, ratios in RATIOS.items():
        assert list(deep["variants"][variant]["ratios"].values()) == pytest.approx(ratios, rel=1e-12)
    (gap,) = deep["claim"]["gaps"]
    gelu_over_relu = math.exp(float(np.mean(np.log(RATIOS["gelu"]) - np.log(RATIOS["relu"]))))
    assert gap["other"] == "relu" and gap["factor"] == pytest.approx(gelu_over_relu, rel=1e-12)
    shown = {view.cell.axes["depth"]: view.layer_grads for view in report_data(made_up, attention=False).cells}
    assert shown[1] == cells[1]["note"] and json.loads(json.dumps(shown[2].to_json())) == deep


def test_a_study_without_gelu_shows_the_figure_and_says_why_the_claim_is_not_tested(tmp_path):
    path = fabricated_study(tmp_path / "s.db", depths=(2,), variants=("relu", "swiglu"), seeds=3)
    with Store(path, create=False) as store:
        for r in store.runs():
            store.add_metrics(r.id, [(10, "grad_norm/blocks.0.ffn", 2.0), (10, "grad_norm/blocks.1.ffn", 1.0)])
    data = report_data(path, attention=False)
    grads = data.cells[0].layer_grads
    assert not isinstance(grads, str) and grads.claim.verdict is None
    assert grads.variants["relu"].ratios == {0: 2.0, 1: 2.0, 2: 2.0}
    page = write_report(path, tmp_path / "out").html.read_text()
    assert "not measurable here: the study has no gelu variant" in page


# ---- end to end: a trained 2-layer study through the CLI -------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """gelu and relu x 3 seeds, 2 layers, 20 steps of the smoke preset, FFN gradients logged every 2 steps:
    `ffnlab compare` writes the store and the report beside it."""
    from ffnlab.cli import main

    store = tmp_path_factory.mktemp("trained") / "runs" / "s.db"
    argv = ["compare", "--preset", "smoke", "--variants", "gelu,relu", "--layers", "2", "--seeds", "3", "--steps",
            "20", "--log-every", "2", "--eval-every", "10", "--store", str(store), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    return store


@pytest.mark.slow
def test_a_trained_studys_ratios_recomputed_from_the_store_match_the_report(trained):
    expected: dict[str, dict[int, float]] = {}
    with Store(trained, create=False) as store:
        for r in store.runs(status="finished"):
            cfg = TrainConfig.from_dict(r.config)
            norms: dict[str, dict[int, float]] = {"0": {}, "1": {}}
            for step, name, value in store.metrics(r.id):
                if name.startswith("grad_norm/blocks.") and step >= cfg.warmup_steps:
                    norms[name.split(".")[1]][step] = value
            steps = sorted(norms["0"])
            assert steps == list(range(cfg.warmup_steps + 1, 20, 2))  # logged every 2 steps from 0; warm-up is 5
            ratio = float(np.median([norms["0"][s] / norms["1"][s] for s in steps]))
            expected.setdefault(cfg.model.ffn, {})[cfg.seed] = ratio
    assert {v: len(seeds) for v, seeds in expected.items()} == {"gelu": 3, "relu": 3}
    grads = report_data(trained, attention=False).cells[0].layer_grads
    assert not isinstance(grads, str)
    for variant, ratios in expected.items():
        assert grads.variants[variant].ratios == pytest.approx(ratios, rel=1e-12)
    report = trained.parent / "report"
    assert (report / "figures" / "layer_grads.png").read_bytes().startswith(PNG_MAGIC)
    page = (report / "report.html").read_text()
    for ratios in expected.values():
        assert ", ".join(f"{s}: {r:.3g}" for s, r in sorted(ratios.items())) in page
    gelu, relu = (np.log([expected[v][s] for s in range(3)]) for v in ("gelu", "relu"))
    test = sps.ttest_rel(gelu, relu)
    factor = math.exp(float(np.mean(gelu - relu)))
    verdict = NOT_SEPARATED if test.pvalue >= 0.05 else HOLDS if factor > 1 else FAILS
    assert f"<td>{factor:.3g} [" in page and f"<td>{test.pvalue:.2g}</td>" in page
    assert f"<td>{verdict}</td>" in page.replace(' class="t"', "")
