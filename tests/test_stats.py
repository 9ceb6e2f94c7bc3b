import math

import pytest
from scipy import stats as sps

from ffnlab.study.stats import MeanCI, PairedDiff, compare, gap_heterogeneity, holm, mean_ci, paired_diff, seed_noise

NAN, INF = float("nan"), float("inf")

# final validation losses by seed; swiglu is clearly ~0.04 better, gelu within noise of relu
RELU = {0: 3.30, 1: 3.32, 2: 3.31, 3: 3.35, 4: 3.28}
SWIGLU = {0: 3.26, 1: 3.275, 2: 3.272, 3: 3.309, 4: 3.243}
GELU = {0: 3.295, 1: 3.31, 2: 3.318, 3: 3.342, 4: 3.285}


def test_mean_ci_matches_hand_computed_t_interval():
    m = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, std sqrt(10/4), t_{0.975,4} = 2.7764451 (table value), half = t * std / sqrt(5)
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert m.n == 5 and m.mean == 3.0 and m.std == pytest.approx(math.sqrt(2.5), rel=1e-12)
    assert m.ci_low == pytest.approx(3.0 - half, rel=1e-12) and m.ci_high == pytest.approx(3.0 + half, rel=1e-12)
    assert m.ci_low == pytest.approx(1.0368, abs=1e-4)


def test_mean_ci_level_and_scipy_interval():
    values = [3.30, 3.32, 3.31, 3.35, 3.28]
    for level in (0.9, 0.95, 0.99):
        m = mean_ci(values, level)
        lo, hi = sps.t.interval(level, len(values) - 1, loc=m.mean, scale=sps.sem(values))
        assert (m.ci_low, m.ci_high) == pytest.approx((lo, hi), rel=1e-12)
    with pytest.raises(ValueError, match="level"):
        mean_ci(values, level=95)


def test_mean_ci_one_and_zero_values():
    assert mean_ci([2.5]) == MeanCI(n=1, mean=2.5, std=None, ci_low=None, ci_high=None)
    assert mean_ci([]).mean is None


def test_paired_diff_matches_ttest_rel_and_ttest_1samp():
    seeds = sorted(RELU)
    a, b = [SWIGLU[s] for s in seeds], [RELU[s] for s in seeds]
    d = paired_diff(SWIGLU, RELU)
    ref = sps.ttest_rel(a, b)
    assert d.n == 5
    assert d.delta == pytest.approx(sum(x - y for x, y in zip(a, b)) / 5, rel=1e-12)
    assert d.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert d.p == pytest.approx(sps.ttest_1samp([x - y for x, y in zip(a, b)], 0.0).pvalue, rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (d.ci_low, d.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # a - b, not b - a: swapping flips the sign of delta and keeps p
    r = paired_diff(RELU, SWIGLU)
    assert r.delta == pytest.approx(-d.delta) and r.p == pytest.approx(d.p)


def test_paired_diff_pairs_only_common_finite_seeds():
    a = {0: 1.0, 1: 2.0, 2: 3.5, 7: 9.0, 8: NAN}
    b = {0: 0.5, 1: 1.0, 2: 2.0, 9: 4.0, 8: 1.0}
    d = paired_diff(a, b)
    ref = sps.ttest_rel([1.0, 2.0, 3.5], [0.5, 1.0, 2.0])
    assert d.n == 3 and d.delta == pytest.approx(1.0) and d.p == pytest.approx(ref.pvalue)


def test_paired_diff_zero_variance_is_documented_exact():
    shifted = paired_diff({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.5, 1: 2.5, 2: 3.5})  # every delta exactly 0.5
    assert shifted == PairedDiff(n=3, delta=0.5, ci_low=0.5, ci_high=0.5, p=0.0)
    same = paired_diff({0: 2.0, 1: 3.0, 2: 4.0}, {0: 2.0, 1: 3.0, 2: 4.0})
    assert same.delta == 0.0 and same.p == 1.0 and same.ci_low == same.ci_high == 0.0


def test_paired_diff_one_pair_has_no_p():
    d = paired_diff({0: 2.0, 1: 5.0}, {0: 1.0})
    assert d.n == 1 and d.delta == 1.0 and d.p is None and d.ci_low is None


def test_holm_hand_worked():
    # sorted 0.01, 0.03, 0.04 -> 3*0.01, 2*0.03, max(0.06, 1*0.04) -> back in the given order
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.04, 0.01]) == pytest.approx([0.04, 0.02])


def test_holm_caps_at_one_keeps_none_and_is_monotone():
    assert holm([0.5, 0.9, 0.01]) == pytest.approx([1.0, 1.0, 0.03])
    out = holm([None, 0.02, None, 0.01])
    assert out[0] is None and out[2] is None and out[1:4:2] == pytest.approx([0.02, 0.02])  # m = 2
    assert holm([]) == [] and holm([None]) == [None]
    raw = [0.2, 0.001, 0.049, 0.03, 0.5, 0.0125]
    adj = holm(raw)
    by_raw = [a for _, a in sorted(zip(raw, adj))]
    assert by_raw == sorted(by_raw) and all(a >= p for a, p in zip(adj, raw))


def test_compare_significant_ranking_and_verdict():
    c = compare({"relu": RELU, "swiglu": SWIGLU, "gelu": GELU}, "relu")
    rows = {r.ffn: r for r in c.variants}
    assert [r.ffn for r in c.variants] == ["swiglu", "gelu", "relu"]  # lowest mean first
    assert [r.rank for r in c.variants] == [1, 2, 3]
    base = rows["relu"]
    assert base.delta == 0 and base.p is None and base.significant is False
    sw = rows["swiglu"]
    p_raw = sps.ttest_rel([SWIGLU[s] for s in RELU], list(RELU.values())).pvalue
    p_gelu = sps.ttest_rel([GELU[s] for s in RELU], list(RELU.values())).pvalue
    assert sw.p == pytest.approx(p_raw) and sw.p_adj == pytest.approx(holm([p_raw, p_gelu])[0])
    assert sw.significant and not rows["gelu"].significant
    assert sw.delta < 0 and sw.mean == pytest.approx(sum(SWIGLU.values()) / 5)
    assert c.baseline == "relu" and c.metric_direction == "lower"
    v = c.verdict
    assert v.startswith(f"swiglu beats relu by {abs(sw.delta):.3g} (95% CI [")
    assert f"p_adj={sw.p_adj:.2g}" in v and "no other difference is significant at alpha=0.05." in v
    assert "gelu" not in v


def test_compare_higher_is_better_flips_ranking_and_wording():
    acc_relu = {s: 1 - v / 10 for s, v in RELU.items()}
    acc_swiglu = {s: 1 - v / 10 for s, v in SWIGLU.items()}
    c = compare({"relu": acc_relu, "swiglu": acc_swiglu}, "swiglu", higher_is_better=True)
    assert [r.ffn for r in c.variants] == ["swiglu", "relu"] and c.metric_direction == "higher"
    assert c.verdict.startswith("relu is worse than swiglu by ")
    assert "no other" not in c.verdict  # the only tested variant is significant


def test_compare_none_significant_verdict():
    c = compare({"relu": RELU, "gelu": GELU}, "relu")
    assert not any(r.significant for r in c.variants)
    assert c.verdict == "No variant differs significantly from relu at alpha=0.05 with 5 seeds."
    c = compare({"relu": RELU, "swiglu": SWIGLU}, "relu", alpha=1e-6)
    assert c.verdict.startswith("No variant differs significantly from relu at alpha=1e-06")


def test_compare_one_seed_gives_means_only():
    c = compare({"relu": {0: 3.3}, "swiglu": {0: 3.1}}, "relu")
    sw = c.variants[0]
    assert sw.ffn == "swiglu" and sw.std is None and sw.ci_low is None and sw.p is None
    assert sw.p_adj is None and not sw.significant and sw.delta == pytest.approx(-0.2)
    assert "p-values n/a (a paired test needs >= 3 seeds" in c.verdict


def test_two_seeds_give_an_interval_but_no_test():
    # one degree of freedom: a p-value would swing wildly, and Holm could still call it significant
    c = compare({"relu": {0: 3.3, 1: 3.31}, "swiglu": {0: 3.1, 1: 3.1001}}, "relu")
    sw = c.variants[0]
    assert sw.n_pairs == 2 and sw.delta_ci_low is not None and sw.p is None and sw.p_adj is None
    assert not sw.significant and "needs >= 3 seeds" in c.verdict and "got 2" in c.verdict
    d = paired_diff({0: 2.0, 1: 3.0, 2: 4.5}, {0: 1.0, 1: 1.5, 2: 2.0})
    assert d.p is not None  # three pairs: tested


def test_compare_excludes_and_counts_diverged_seeds():
    swiglu = {**SWIGLU, 1: NAN, 3: INF}
    c = compare({"relu": RELU, "swiglu": swiglu, "relu2": {0: NAN, 1: NAN}}, "relu", diverged={"relu": 2})
    rows = {r.ffn: r for r in c.variants}
    sw = rows["swiglu"]
    kept = [0, 2, 4]
    assert sw.n_seeds == 3 and sw.diverged == 2 and sw.n_pairs == 3
    assert sw.mean == pytest.approx(sum(SWIGLU[s] for s in kept) / 3)
    assert sw.p == pytest.approx(sps.ttest_rel([SWIGLU[s] for s in kept], [RELU[s] for s in kept]).pvalue)
    assert rows["relu"].diverged == 2 and rows["relu"].n_seeds == 5
    dead = rows["relu2"]
    assert dead.n_seeds == 0 and dead.mean is None and dead.diverged == 2 and dead.rank == 3
    assert "relu2 2" in c.verdict and "swiglu 2" in c.verdict
    # a caller counting from run statuses passes the total, NaNs included: not counted twice
    c = compare({"relu": RELU, "swiglu": swiglu}, "relu", diverged={"relu": 0, "swiglu": 2})
    assert [r.diverged for r in c.variants] == [2, 0]


def test_compare_unknown_baseline_lists_variants():
    with pytest.raises(ValueError, match=r"baseline 'rellu'.*did you mean 'relu'.*variants: relu, gelu"):
        compare({"relu": RELU, "gelu": GELU}, "rellu")


def test_seed_noise():
    s = seed_noise([3.30, 3.32, 3.28, NAN])
    assert s.n == 3 and s.diverged == 1 and s.min == 3.28 and s.max == 3.32
    assert s.range == pytest.approx(0.04) and s.std == pytest.approx(0.02)
    assert seed_noise([1.0]).std is None and seed_noise([]).min is None


def planted_gaps(k, n, cell_shift, seed_spread, noise, rng):
    """k cells x n seeds of gaps: a shift per cell, a per-seed offset shared by every cell, and noise."""
    seed_offset = rng.normal(0, seed_spread, n)
    return [{s: c * cell_shift + seed_offset[s] + rng.normal(0, noise) for s in range(n)} for c in range(k)]


def test_gap_heterogeneity_matches_a_two_way_linear_model():
    import numpy as np

    rng = np.random.default_rng(0)
    gaps = planted_gaps(3, 5, 0.3, 1.0, 0.5, rng)
    got = gap_heterogeneity(gaps)
    # the same F as full (cell + seed) against reduced (seed only) least-squares models
    y = np.array([gaps[c][s] for c in range(3) for s in range(5)])
    cell = np.kron(np.eye(3), np.ones((5, 1)))
    seed = np.kron(np.ones((3, 1)), np.eye(5))
    rss = [np.sum((y - x @ np.linalg.lstsq(x, y, rcond=None)[0]) ** 2) for x in (np.hstack([cell, seed]), seed)]
    f = ((rss[1] - rss[0]) / 2) / (rss[0] / 8)
    assert got.df == (2, 8) and got.n == 5 and got.k == 3
    assert got.f == pytest.approx(f, rel=1e-9) and got.p == pytest.approx(sps.f.sf(f, 2, 8), rel=1e-9)


def test_gap_heterogeneity_blocks_on_the_seed():
    import numpy as np

    # a steady shift between two cells hidden under a large per-seed offset: pairing by seed finds it,
    # a one-way test over the cells' gaps cannot
    gaps = planted_gaps(2, 6, 0.2, 2.0, 0.02, np.random.default_rng(1))
    assert gap_heterogeneity(gaps).p < 1e-4
    assert sps.f_oneway(*[list(g.values()) for g in gaps]).pvalue > 0.5


def test_gap_heterogeneity_holds_its_level_when_no_cell_differs():
    import numpy as np

    rng = np.random.default_rng(2)
    ps = [gap_heterogeneity(planted_gaps(3, 4, 0.0, 1.0, 0.3, rng)).p for _ in range(2000)]
    assert 0.035 < sum(p < 0.05 for p in ps) / len(ps) < 0.065


def test_gap_heterogeneity_needs_two_cells_and_three_complete_seeds():
    assert gap_heterogeneity([{0: 0.1, 1: 0.2, 2: 0.3}]).p is None
    two = gap_heterogeneity([{0: 0.1, 1: 0.2, 2: 0.3}, {0: 0.4, 1: math.nan, 2: 0.1, 3: 0.2}])
    assert two.n == 2 and two.p is None and two.left_out == [1, 3]
    # every seed moves by the same amount between cells: exact, as paired_diff
    assert gap_heterogeneity([{0: 0.1, 1: 0.2, 2: 0.4}, {0: 0.2, 1: 0.3, 2: 0.5}]).p == 0.0
    assert gap_heterogeneity([{0: 0.1, 1: 0.2, 2: 0.4}, {0: 0.1, 1: 0.2, 2: 0.4}]).p == 1.0


def test_an_exact_tie_shares_its_rank():
    values = {"relu": {0: 0.60, 1: 0.70, 2: 0.65}, "gelu": {0: 0.5625, 1: 0.5625}, "silu": {0: 0.5625, 1: 0.5625}}
    c = compare({**values, "dead": {0: math.nan}}, "relu")
    assert [(r.ffn, r.rank) for r in c.variants] == [("gelu", 1), ("silu", 1), ("relu", 3), ("dead", 4)]
