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

from scipy import stats as sps

from ffnlab._util.names import closest

# NOTE: a paired t-test on 2 seeds has 1 degree of freedom: its p-value swings from 0.01 to 0.9 on the
# same true gap, and after Holm it can still print "significant". Below 3 pairs there is no test.
MIN_PAIRS = 3


def _t_quantile(level: float, df: int) -> float:
    """Two-sided Student t critical value t_{(1+level)/2, df}."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    return float(sps.t.ppf((1.0 + level) / 2.0, df))


def mean_ci(values: list[float], level: float = 0.95) -> dict:
    """Mean, sample std and Student-t confidence interval of `values`.

        mean = sum(x) / n
        std  = sqrt(sum((x - mean)^2) / (n - 1))          (ddof=1)
        CI   = mean -/+ t_{(1+level)/2, n-1} * std / sqrt(n)

    Returns {"n", "mean", "std", "ci_low", "ci_high"}. With n = 1 std and the CI are None (one seed
    says nothing about spread); with n = 0 everything but n is None. Values are used as given:
    `compare` drops diverged (non-finite) ones before calling this.
    """
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}
    mean = math.fsum(values) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "ci_low": None, "ci_high": None}
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))
    half = _t_quantile(level, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def paired_diff(a: dict[int, float], b: dict[int, float], level: float = 0.95) -> dict:
    """Paired difference a - b over the seeds present and finite in both, with CI and paired t-test.

        d_s   = a[s] - b[s]  for every seed s in both with finite values
        delta = mean(d),  sd = std(d, ddof=1),  se = sd / sqrt(n)
        CI    = delta -/+ t_{(1+level)/2, n-1} * se
        t     = delta / se,  p = 2 * P(T_{n-1} > |t|)     (two-sided; same as scipy.stats.ttest_rel)

    Returns {"n", "delta", "ci_low", "ci_high", "p"}; with n < 2 the CI is None (and with n = 0
    delta too); with n < MIN_PAIRS (3) p is None: no test.

    NOTE: when every d_s is equal (sd = 0, e.g. a variant that differs from the baseline by a constant
    offset) the t statistic is delta/0. We define p = 0 if delta != 0 (the difference is exact and the
    same on every seed) and p = 1 if delta == 0 (the runs are identical), and the CI collapses to
    [delta, delta]. scipy.stats.ttest_rel returns NaN there instead.
    """
    seeds = sorted(s for s in a.keys() & b.keys() if math.isfinite(a[s]) and math.isfinite(b[s]))
    diffs = [a[s] - b[s] for s in seeds]
    m = mean_ci(diffs, level)
    out = {"n": m["n"], "delta": m["mean"], "ci_low": m["ci_low"], "ci_high": m["ci_high"], "p": None}
    if m["n"] < MIN_PAIRS:
        return out
    if m["std"] == 0.0:
        out["p"] = 0.0 if m["mean"] != 0.0 else 1.0
        return out
    t = m["mean"] / (m["std"] / math.sqrt(m["n"]))
    out["p"] = float(2.0 * sps.t.sf(abs(t), m["n"] - 1))
    return out


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, in the order given; None entries stay None and are not counted.

    With the m non-None p-values sorted ascending p_(1) <= ... <= p_(m):

        p_adj_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))

    The running max makes the adjusted values monotone in the raw ones, so rejecting "p_adj < alpha"
    is exactly Holm's step-down procedure. Example: [0.01, 0.04, 0.03] -> [0.03, 0.06, 0.06].
    """
    order = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m = len(order)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, (m - rank) * pvalues[i])
        adjusted[i] = min(1.0, running)
    return adjusted


def gap_heterogeneity(gaps: list[dict[int, float]]) -> dict:
    """Whether a variant's paired gap to the baseline differs between k cells: a repeated-measures F
    test on the per-seed gaps with seeds as blocks, over the seeds finished in every cell.

        d_cs    = variant - baseline for seed s in cell c (k cells x n complete seeds)
        SS_cell = n * sum_c (mean_c - mean)^2                      df_cell = k - 1
        SS_err  = sum_cs (d_cs - mean_c - mean_s + mean)^2          df_err  = (k - 1)(n - 1)
        F       = (SS_cell / df_cell) / (SS_err / df_err),  p = P(F_{df_cell, df_err} > F)

    Blocking on the seed removes what a seed does to the gap in every cell alike (its data order,
    among others). Returns {"k", "n", "f", "df", "p", "left_out"}: `left_out` the seeds missing or
    non-finite in some cell; with k < 2 or n < MIN_PAIRS, f and p are None (no test).

    NOTE: SS_err = 0 (every seed's gaps move by the same amounts between cells) makes F = x/0; as in
    `paired_diff`, p = 0 if SS_cell > 0 (the cells differ exactly) and p = 1 if not.
    """
    finite = [{s: d for s, d in g.items() if math.isfinite(d)} for g in gaps]
    seeds = sorted(set.intersection(*(set(g) for g in finite))) if finite else []
    left_out = sorted(set().union(*(set(g) for g in gaps)) - set(seeds)) if gaps else []
    k, n = len(gaps), len(seeds)
    out = {"k": k, "n": n, "f": None, "df": None, "p": None, "left_out": left_out}
    if k < 2 or n < MIN_PAIRS:
        return out
    d = [[g[s] for s in seeds] for g in finite]  # k x n
    mean = math.fsum(x for row in d for x in row) / (k * n)
    cell_means = [math.fsum(row) / n for row in d]
    seed_means = [math.fsum(d[c][j] for c in range(k)) / k for j in range(n)]
    ss_cell = n * math.fsum((m - mean) ** 2 for m in cell_means)
    ss_err = math.fsum((d[c][j] - cell_means[c] - seed_means[j] + mean) ** 2 for c in range(k) for j in range(n))
    df = (k - 1, (k - 1) * (n - 1))
    out["df"] = df
    if ss_err <= 1e-30 * max(ss_cell, 1e-300):
        out["p"] = 0.0 if ss_cell > 0 else 1.0
        return out
    out["f"] = (ss_cell / df[0]) / (ss_err / df[1])
    out["p"] = float(sps.f.sf(out["f"], *df))
    return out


def seed_noise(values: list[float]) -> dict:
    """Seed-to-seed spread of one variant (the baseline): {"n", "mean", "std", "range", "min", "max", "diverged"}.

    std uses ddof=1 (None for n < 2); range = max - min. Non-finite values are diverged runs, left out
    and counted. A gap between variants smaller than this spread is within the noise floor.
    """
    finite = [v for v in values if math.isfinite(v)]
    m = mean_ci(finite)
    lo, hi = (min(finite), max(finite)) if finite else (None, None)
    return {
        "n": m["n"],
        "mean": m["mean"],
        "std": m["std"],
        "range": None if lo is None else hi - lo,
        "min": lo,
        "max": hi,
        "diverged": len(values) - len(finite),
    }


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _gap_sentence(row: dict, baseline: str, higher_is_better: bool, level: float) -> str:
    """'swiglu beats relu by 0.041 (95% CI [0.02, 0.06], p_adj=0.01)' for a significant row."""
    better = (row["delta"] > 0) == higher_is_better
    # the CI of the gap's magnitude |delta|: flip the interval when delta is negative
    lo, hi = (
        (row["delta_ci_low"], row["delta_ci_high"])
        if row["delta"] > 0
        else (-row["delta_ci_high"], -row["delta_ci_low"])
    )
    verb = "beats" if better else "is worse than"
    return (
        f"{row['ffn']} {verb} {baseline} by {_fmt(abs(row['delta']))} "
        f"({round(level * 100):g}% CI [{_fmt(lo)}, {_fmt(hi)}], p_adj={row['p_adj']:.2g})"
    )


def _seeds_phrase(ns: list[int]) -> str:
    lo, hi = min(ns), max(ns)
    return f"{lo} seed{'s' if lo != 1 else ''}" if lo == hi else f"{lo}-{hi} paired seeds"


def compare(
    results: dict[str, dict[int, float]],
    baseline: str,
    higher_is_better: bool = False,
    alpha: float = 0.05,
    diverged: dict[str, int] | None = None,
    level: float = 0.95,
) -> dict:
    """Compare every variant with `baseline` over seeds: summary per variant, paired tests, Holm, ranking.

    results: variant -> {seed: final metric}; a NaN/inf metric marks a diverged run. `diverged` is the
    caller's total of diverged runs per variant (e.g. counted from run statuses, including runs that
    left no metric); a variant's count is max(diverged[variant], its non-finite values), so a NaN that
    is also in `diverged` is not counted twice. Per variant row:
      n_seeds, mean, std, ci_low, ci_high   mean_ci over its finite values
      delta, delta_ci_low, delta_ci_high, p paired_diff(variant, baseline): variant - baseline
      p_adj                                  holm over the non-baseline variants' p
      significant                            p_adj < alpha
      rank                                   1 = best mean (lowest, or highest if higher_is_better)
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

    rows = []
    for name, runs in results.items():
        m = mean_ci(list(finite[name].values()), level)
        row = {
            "ffn": name,
            "n_seeds": m["n"],
            "mean": m["mean"],
            "std": m["std"],
            "ci_low": m["ci_low"],
            "ci_high": m["ci_high"],
            "delta": 0.0,
            "delta_ci_low": 0.0,
            "delta_ci_high": 0.0,
            "n_pairs": m["n"],
            "p": None,
            "p_adj": None,
            "significant": False,
            "rank": None,
            "diverged": max(len(runs) - len(finite[name]), diverged.get(name, 0)),
        }
        if name != baseline:
            d = paired_diff(finite[name], finite[baseline], level)
            row.update(delta=d["delta"], delta_ci_low=d["ci_low"], delta_ci_high=d["ci_high"], n_pairs=d["n"], p=d["p"])
        rows.append(row)

    others = [r for r in rows if r["ffn"] != baseline]
    for row, p_adj in zip(others, holm([r["p"] for r in others])):
        row["p_adj"] = p_adj
        row["significant"] = p_adj is not None and p_adj < alpha

    sign = -1.0 if higher_is_better else 1.0
    rows.sort(key=lambda r: (r["mean"] is None, sign * r["mean"] if r["mean"] is not None else 0.0, r["ffn"]))
    for i, row in enumerate(rows):
        row["rank"] = i + 1

    return {
        "baseline": baseline,
        "metric_direction": "higher" if higher_is_better else "lower",
        "alpha": alpha,
        "level": level,
        "variants": rows,
        "verdict": _verdict(rows, baseline, higher_is_better, alpha, level),
    }


def _verdict(rows: list[dict], baseline: str, higher_is_better: bool, alpha: float, level: float) -> str:
    """One or two plain sentences on what the comparison shows."""
    others = [r for r in rows if r["ffn"] != baseline]
    tested = [r for r in others if r["p"] is not None]
    diverged = [f"{r['ffn']} {r['diverged']}" for r in rows if r["diverged"]]
    tail = f" Left out as diverged (runs): {', '.join(diverged)}." if diverged else ""
    if not others:
        return f"Only {baseline} was run; there is nothing to compare.{tail}"
    if not tested:
        n = max(r["n_pairs"] or 0 for r in others)
        if n == 0:
            return f"No test possible: no variant shares a finished seed with {baseline}.{tail}"
        return (
            f"Means only, no significance test: p-values n/a (a paired test needs >= {MIN_PAIRS} seeds "
            f"finished by both a variant and {baseline}, got {n}).{tail}"
        )
    significant = [r for r in rows if r["significant"]]  # rows are best first, so this is too
    untested = [r["ffn"] for r in others if r["p"] is None]
    skipped = f" Not tested (fewer than {MIN_PAIRS} paired seeds): {', '.join(untested)}." if untested else ""
    if not significant:
        return (
            f"No variant differs significantly from {baseline} at alpha={alpha:g} with "
            f"{_seeds_phrase([r['n_pairs'] for r in tested])}.{skipped}{tail}"
        )
    gaps = "; ".join(_gap_sentence(r, baseline, higher_is_better, level) for r in significant)
    rest = "; no other difference is significant" if len(significant) < len(tested) else ""
    return f"{gaps}{rest} at alpha={alpha:g}.{skipped}{tail}"
