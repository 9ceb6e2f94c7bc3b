"""Statistics for comparing FFN variants over seeds: t-intervals, paired t-tests, Holm correction, and\nwhether a gap differs between the cells of a study.

Each variant is trained with the same seeds as the baseline, so the comparison is PAIRED: for seed s
the difference d_s = loss_variant(s) - loss_baseline(s) removes whatever that seed does to both
(data order, init draw), which is usually most of the seed-to-seed spread. With k variants against
one baseline we run k tests, so p-values are Holm-corrected before anything is called significant.

Diverged runs (NaN/inf final metric) are not numbers to average: they are left out of a variant's
statistics and counted in its `diverged` field, and pairs use only seeds finished in both variants.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from scipy import stats as sps

from ffnlab._util.names import closest

# NOTE: a paired t-test on 2 seeds has 1 degree of freedom: its p-value swings from 0.01 to 0.9 on the
# same true gap, and after Holm it can still print "significant". Below 3 pairs there is no test.
MIN_PAIRS = 3
Direction = Literal["lower", "higher"]  # which end of a metric is better


@dataclass(frozen=True)
class MeanCI:
    """The mean of some values, their sample std and the Student-t interval of the mean (`mean_ci`)."""

    n: int
    mean: float | None  # None without values
    std: float | None  # None below 2 values
    ci_low: float | None
    ci_high: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PairedDiff:
    """A paired difference a - b over seeds, its interval and its paired t-test (`paired_diff`)."""

    n: int  # seeds finished in both
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None  # None below MIN_PAIRS pairs: no test

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GapTest:
    """Whether a paired gap differs between cells: a repeated-measures F test (`gap_heterogeneity`)."""

    k: int  # cells
    n: int  # seeds finished in every cell
    f: float | None  # None without a test, or where the gaps differ exactly (p 0 or 1)
    df: tuple[int, int] | None  # (cells - 1, (cells - 1)(seeds - 1))
    p: float | None  # None below 2 cells or MIN_PAIRS complete seeds
    left_out: list[int]  # seeds missing or not finite in some cell


@dataclass(frozen=True)
class SeedNoise:
    """The seed-to-seed spread of one variant (`seed_noise`): a gap smaller than it is within the noise."""

    n: int  # finite values
    mean: float | None
    std: float | None  # ddof=1; None below 2 values
    range: float | None  # max - min
    min: float | None
    max: float | None
    diverged: int  # non-finite values, left out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VariantStats:
    """One variant's row of `compare`: its mean over seeds, its paired difference to the baseline and the
    test of it, in the CSV's column order."""

    ffn: str
    rank: int  # 1 = best mean; equal means share a rank (1, 1, 3)
    n_seeds: int  # finite values the mean rests on
    mean: float | None
    std: float | None
    ci_low: float | None
    ci_high: float | None
    delta: float | None  # mean paired difference to the baseline (variant - baseline)
    delta_ci_low: float | None
    delta_ci_high: float | None
    n_pairs: int
    p: float | None  # paired t-test against the baseline
    p_adj: float | None  # Holm over the non-baseline variants
    significant: bool
    diverged: int  # runs that diverged


@dataclass(frozen=True)
class Ranking:
    """What `compare` gives: every variant's row, best first, and the verdict in words."""

    baseline: str
    metric_direction: Direction
    alpha: float
    level: float
    variants: list[VariantStats]  # best first
    verdict: str


def _t_quantile(level: float, df: int) -> float:
    """Two-sided Student t critical value t_{(1+level)/2, df}."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    return float(sps.t.ppf((1.0 + level) / 2.0, df))


def mean_ci(values: list[float], level: float = 0.95) -> MeanCI:
    """Mean, sample std and Student-t confidence interval of `values`.

        mean = sum(x) / n
        std  = sqrt(sum((x - mean)^2) / (n - 1))          (ddof=1)
        CI   = mean -/+ t_{(1+level)/2, n-1} * std / sqrt(n)

    With n = 1 std and the CI are None (one seed says nothing about spread); with n = 0 everything but n
    is None. Values are used as given:
    `compare` drops diverged (non-finite) ones before calling this.
    """
    n = len(values)
    if n == 0:
        return MeanCI(0, None, None, None, None)
    mean = math.fsum(values) / n
    if n == 1:
        return MeanCI(1, mean, None, None, None)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))
    half = _t_quantile(level, n - 1) * std / math.sqrt(n)
    return MeanCI(n, mean, std, mean - half, mean + half)


def paired_diff(a: dict[int, float], b: dict[int, float], level: float = 0.95) -> PairedDiff:
    """Paired difference a - b over the seeds present and finite in both, with CI and paired t-test.

        d_s   = a[s] - b[s]  for every seed s in both with finite values
        delta = mean(d),  sd = std(d, ddof=1),  se = sd / sqrt(n)
        CI    = delta -/+ t_{(1+level)/2, n-1} * se
        t     = delta / se,  p = 2 * P(T_{n-1} > |t|)     (two-sided; same as scipy.stats.ttest_rel)

    With n < 2 the CI is None (and with n = 0 delta too); with n < MIN_PAIRS (3) p is None: no test.

    NOTE: when every d_s is equal (sd = 0, e.g. a variant that differs from the baseline by a constant
    offset) the t statistic is delta/0. We define p = 0 if delta != 0 (the difference is exact and the
    same on every seed) and p = 1 if delta == 0 (the runs are identical), and the CI collapses to
    [delta, delta]. scipy.stats.ttest_rel returns NaN there instead.
    """
    seeds = sorted(s for s in a.keys() & b.keys() if math.isfinite(a[s]) and math.isfinite(b[s]))
    diffs = [a[s] - b[s] for s in seeds]
    m = mean_ci(diffs, level)
    if m.n < MIN_PAIRS or m.mean is None or m.std is None:
        p = None
    elif m.std == 0.0:
        p = 0.0 if m.mean != 0.0 else 1.0
    else:
        t = m.mean / (m.std / math.sqrt(m.n))
        p = float(2.0 * sps.t.sf(abs(t), m.n - 1))
    return PairedDiff(m.n, m.mean, m.ci_low, m.ci_high, p)


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, in the order given; None entries stay None and are not counted.

    With the m non-None p-values sorted ascending p_(1) <= ... <= p_(m):

        p_adj_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))

    The running max makes the adjusted values monotone in the raw ones, so rejecting "p_adj < alpha"
    is exactly Holm's step-down procedure. Example: [0.01, 0.04, 0.03] -> [0.03, 0.06, 0.06].
    """
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, (m - rank) * p)
        adjusted[i] = min(1.0, running)
    return adjusted


def gap_heterogeneity(gaps: list[dict[int, float]]) -> GapTest:
    """Whether a variant's paired gap to the baseline differs between k cells: a repeated-measures F
    test on the per-seed gaps with seeds as blocks, over the seeds finished in every cell.

        d_cs    = variant - baseline for seed s in cell c (k cells x n complete seeds)
        SS_cell = n * sum_c (mean_c - mean)^2                      df_cell = k - 1
        SS_err  = sum_cs (d_cs - mean_c - mean_s + mean)^2          df_err  = (k - 1)(n - 1)
        F       = (SS_cell / df_cell) / (SS_err / df_err),  p = P(F_{df_cell, df_err} > F)

    Blocking on the seed removes what a seed does to the gap in every cell alike (its data order,
    among others). `left_out` are the seeds missing or non-finite in some cell; with k < 2 or
    n < MIN_PAIRS, f and p are None (no test).

    NOTE: SS_err = 0 (every seed's gaps move by the same amounts between cells) makes F = x/0; as in
    `paired_diff`, p = 0 if SS_cell > 0 (the cells differ exactly) and p = 1 if not.
    """
    finite = [{s: d for s, d in g.items() if math.isfinite(d)} for g in gaps]
    seeds = sorted(set.intersection(*(set(g) for g in finite))) if finite else []
    left_out = sorted(set[int]().union(*(set(g) for g in gaps)) - set(seeds))
    k, n = len(gaps), len(seeds)
    if k < 2 or n < MIN_PAIRS:
        return GapTest(k, n, None, None, None, left_out)
    d = [[g[s] for s in seeds] for g in finite]  # k x n
    mean = math.fsum(x for row in d for x in row) / (k * n)
    cell_means = [math.fsum(row) / n for row in d]
    seed_means = [math.fsum(d[c][j] for c in range(k)) / k for j in range(n)]
    ss_cell = n * math.fsum((m - mean) ** 2 for m in cell_means)
    ss_err = math.fsum((d[c][j] - cell_means[c] - seed_means[j] + mean) ** 2 for c in range(k) for j in range(n))
    df = (k - 1, (k - 1) * (n - 1))
    if ss_err <= 1e-30 * max(ss_cell, 1e-300):
        return GapTest(k, n, None, df, 0.0 if ss_cell > 0 else 1.0, left_out)
    f = (ss_cell / df[0]) / (ss_err / df[1])
    return GapTest(k, n, f, df, float(sps.f.sf(f, *df)), left_out)


def seed_noise(values: list[float]) -> SeedNoise:
    """Seed-to-seed spread of one variant (the baseline) over its finite values.

    std uses ddof=1 (None for n < 2); range = max - min. Non-finite values are diverged runs, left out
    and counted. A gap between variants smaller than this spread is within the noise floor.
    """
    finite = [v for v in values if math.isfinite(v)]
    m = mean_ci(finite)
    diverged = len(values) - len(finite)
    if not finite:
        return SeedNoise(m.n, m.mean, m.std, None, None, None, diverged)
    lo, hi = min(finite), max(finite)
    return SeedNoise(m.n, m.mean, m.std, hi - lo, lo, hi, diverged)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _gap_sentence(row: VariantStats, baseline: str, higher_is_better: bool, level: float) -> str:
    """'swiglu beats relu by 0.041 (95% CI [0.02, 0.06], p_adj=0.01)' for a significant row."""
    # a significant row was tested: at least MIN_PAIRS pairs, so its difference and interval exist
    assert row.delta is not None and row.delta_ci_low is not None and row.delta_ci_high is not None
    assert row.p_adj is not None
    better = (row.delta > 0) == higher_is_better
    # the CI of the gap's magnitude |delta|: flip the interval when delta is negative
    lo, hi = (row.delta_ci_low, row.delta_ci_high) if row.delta > 0 else (-row.delta_ci_high, -row.delta_ci_low)
    verb = "beats" if better else "is worse than"
    return (
        f"{row.ffn} {verb} {baseline} by {_fmt(abs(row.delta))} "
        f"({round(level * 100):g}% CI [{_fmt(lo)}, {_fmt(hi)}], p_adj={row.p_adj:.2g})"
    )


def _seeds_phrase(ns: list[int]) -> str:
    lo, hi = min(ns), max(ns)
    return f"{lo} seed{'s' if lo != 1 else ''}" if lo == hi else f"{lo}-{hi} paired seeds"


def shared_ranks(scores: dict[str, Any]) -> dict[str, int]:
    """Each name's rank by its score, lowest first: 1 + how many names score strictly lower, so an exact tie
    shares its rank (1, 1, 3), the ranking of every table of ffnlab's."""
    return {name: 1 + sum(other < score for other in scores.values()) for name, score in scores.items()}


def compare(
    results: dict[str, dict[int, float]],
    baseline: str,
    higher_is_better: bool = False,
    alpha: float = 0.05,
    diverged: dict[str, int] | None = None,
    level: float = 0.95,
) -> Ranking:
    """Compare every variant with `baseline` over seeds: summary per variant, paired tests, Holm, ranking.

    results: variant -> {seed: final metric}; a NaN/inf metric marks a diverged run. `diverged` is the
    caller's total of diverged runs per variant (e.g. counted from run statuses, including runs that
    left no metric); a variant's count is max(diverged[variant], its non-finite values), so a NaN that
    is also in `diverged` is not counted twice. Per variant row (`VariantStats`):
      n_seeds, mean, std, ci_low, ci_high   mean_ci over its finite values
      delta, delta_ci_low, delta_ci_high, p paired_diff(variant, baseline): variant - baseline
      p_adj                                  holm over the non-baseline variants' p
      significant                            p_adj < alpha
      rank                                   1 = best mean (lowest, or highest if higher_is_better); variants
                                             with equal means share a rank (1, 1, 3)
      diverged                               max(diverged[variant], non-finite values in results)
    The baseline row has delta 0, p None and significant False. Rows are sorted best first; variants
    with no finite value at all come last. `verdict` says in one or two sentences what is significant,
    or plainly that nothing is, or that a test needs >= MIN_PAIRS (3) seeds.
    """
    if baseline not in results:
        raise ValueError(
            f"baseline '{baseline}' is not among the compared variants{closest(baseline, results)}; "
            f"variants: {', '.join(results)}"
        )
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    diverged = diverged or {}
    finite = {name: {s: v for s, v in runs.items() if math.isfinite(v)} for name, runs in results.items()}
    means = {name: mean_ci(list(finite[name].values()), level) for name in results}
    pairs = {name: paired_diff(finite[name], finite[baseline], level) for name in results if name != baseline}
    adjusted = dict(zip(pairs, holm([d.p for d in pairs.values()])))
    sign = -1.0 if higher_is_better else 1.0

    def standing(name: str) -> tuple[bool, float]:
        mean = means[name].mean
        return (mean is None, 0.0 if mean is None else sign * mean)

    ranks = shared_ranks({name: standing(name) for name in results})
    rows = []
    for name in sorted(results, key=lambda name: (standing(name), name)):
        m, p_adj = means[name], adjusted.get(name)
        pair = pairs.get(name, PairedDiff(m.n, 0.0, 0.0, 0.0, None))  # the baseline against itself
        # one line per source of the fields (fmt: skip keeps them so): the row, mean_ci, paired_diff, the test
        rows.append(
            VariantStats(
                ffn=name, rank=ranks[name], diverged=max(len(results[name]) - len(finite[name]), diverged.get(name, 0)),
                n_seeds=m.n, mean=m.mean, std=m.std, ci_low=m.ci_low, ci_high=m.ci_high,
                delta=pair.delta, delta_ci_low=pair.ci_low, delta_ci_high=pair.ci_high, n_pairs=pair.n, p=pair.p,
                p_adj=p_adj, significant=p_adj is not None and p_adj < alpha,
            )
        )  # fmt: skip
    return Ranking(
        baseline=baseline,
        metric_direction="higher" if higher_is_better else "lower",
        alpha=alpha,
        level=level,
        variants=rows,
        verdict=_verdict(rows, baseline, higher_is_better, alpha, level),
    )


def _verdict(rows: list[VariantStats], baseline: str, higher_is_better: bool, alpha: float, level: float) -> str:
    """One or two plain sentences on what the comparison shows."""
    others = [r for r in rows if r.ffn != baseline]
    tested = [r for r in others if r.p is not None]
    diverged = [f"{r.ffn} {r.diverged}" for r in rows if r.diverged]
    tail = f" Left out as diverged (runs): {', '.join(diverged)}." if diverged else ""
    if not others:
        return f"Only {baseline} was run; there is nothing to compare.{tail}"
    if not tested:
        n = max(r.n_pairs for r in others)
        if n == 0:
            return f"No test possible: no variant shares a finished seed with {baseline}.{tail}"
        return (
            f"Means only, no significance test: p-values n/a (a paired test needs >= {MIN_PAIRS} seeds "
            f"finished by both a variant and {baseline}, got {n}).{tail}"
        )
    significant = [r for r in rows if r.significant]  # rows are best first, so this is too
    untested = [r.ffn for r in others if r.p is None]
    skipped = f" Not tested (fewer than {MIN_PAIRS} paired seeds): {', '.join(untested)}." if untested else ""
    if not significant:
        return (
            f"No variant differs significantly from {baseline} at alpha={alpha:g} with "
            f"{_seeds_phrase([r.n_pairs for r in tested])}.{skipped}{tail}"
        )
    gaps = "; ".join(_gap_sentence(r, baseline, higher_is_better, level) for r in significant)
    rest = "; no other difference is significant" if len(significant) < len(tested) else ""
    return f"{gaps}{rest} at alpha={alpha:g}.{skipped}{tail}"
