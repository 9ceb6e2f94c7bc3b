"""Compute-scaling fits: a power law per FFN variant and a compute multiplier against the baseline.

Each variant is trained at several model sizes with several seeds; each run gives (compute C in
FLOPs, final validation loss L). Per variant we fit the saturating power law of Kaplan et al. 2020
("Scaling Laws for Neural Language Models") in the form Hoffmann et al. 2022 ("Training
Compute-Optimal Large Language Models", Chinchilla) fit it:

    L(C) = E + A * C^(-alpha)          E: irreducible loss, A > 0, alpha: how fast loss falls
    minimise  sum_i Huber_delta( log L_pred(C_i) - log L_i ),   delta = 1e-2   (Hoffmann et al.: 1e-3)
    subject to  0 <= E < min(L),  A > 0,  ALPHA_MIN <= alpha <= ALPHA_MAX

and compare a variant with the baseline by a compute multiplier:

    L* = L_baseline(C_max)                      baseline's fitted loss at the largest measured compute
    C_v = L_variant^{-1}(L*) = (A_v / (L* - E_v))^(1/alpha_v)
    k  = C_max / C_v                            "the baseline needs k times the compute the variant
                                                 needs to reach the same loss"; k > 1: variant better

The confidence interval of k comes from a bootstrap over SEEDS, paired across variants: every replicate
draws seed ids with replacement once and refits baseline and all variants on the runs of those same
seeds, because a seed fixes data order and init for every variant and pairing cancels that shared
noise. With 3-5 seeds a plain percentile interval covers far less than it says (3 seeds have only 10
distinct resamples, and a bootstrap's spread is the plug-in one, short by sqrt((n-1)/n)). So the
interval is a small-sample t interval on log k, centred on the point estimate, then exponentiated:

    log k -/+ t_{(1+level)/2, n-1} * sqrt(n / (n-1)) * se,   se = (q_0.8413 - q_0.1587)(log k*) / 2

with n the number of seeds and log k* the bootstrap replicates (se from quantiles: replicates where the
variant never reaches L* have log k* = -inf). E and alpha get the same interval (alpha on log scale).
Coverage of the 95% CI of k, measured with `benchmarks/scaling_coverage.py --studies 300` (baseline
E=1.5, alpha=0.3, L=3.0 at 1e11; 4 sizes 1e11..1e13; variant = baseline at k_true=1.25x compute;
per-run noise sd 0.015 and a per-seed offset sd 0.02 shared by both variants; n_boot=200):

    seeds                                 3      4      5
    this interval                     0.967  0.977  0.933   (median log k width 0.93, 0.66, 0.49)
    the same without sqrt(n/(n-1))    0.953  0.963  0.920
    plain percentile                  0.713  0.867  0.887

(+/- 0.013 binomial sd each). A second draw of 300 studies per seed count gave 0.973, 0.970, 0.960 for
this interval; pooled over both draws 0.970, 0.973, 0.947: slightly wide at 3-4 seeds, the side to
err on for a claim, and near nominal at 5.

Diverged runs (non-finite loss) are left out of every fit and counted per variant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as sps

from ffnlab._util.text import sci

ALPHA_MIN, ALPHA_MAX = 0.02, 2.0
LOF_ALPHA = 0.05  # lack-of-fit p below which a sentence warns that the law misses the points
CURVE_POINTS = 24  # computes at which each fitted curve and its band are given, for the plot
# NOTE: a residual beyond delta counts linearly, so one spiked or mislogged run cannot drag the curve.
# Hoffmann et al. use delta = 1e-3 on ~400 runs; on our 12-20 runs per variant, with seed noise of
# ~0.5% in log loss, 1e-3 turns the fit into least absolute deviations: in simulation (4 seeds x 4
# sizes, benchmarks/scaling_coverage.py settings) the sd of log k was 0.106 with 1e-3, 0.095 with 1e-2
# and 0.082 with plain least squares, and 1e-3 fits took 2.5x longer. 1e-2 keeps noise quadratic and
# still caps a run that is more than 1% off.
HUBER_DELTA = 1e-2
LOSS_FIT = (
    f"Huber (delta {HUBER_DELTA:g}) on log residuals log L_pred - log L; "
    f"bounds 0 <= E < min(L), A > 0, {ALPHA_MIN:g} <= alpha <= {ALPHA_MAX:g}"
)
_ALPHA_GRID = np.geomspace(ALPHA_MIN, ALPHA_MAX, 48)
_ONE_SIGMA = sps.norm.cdf(1.0) - 0.5  # 0.3413: quantile offsets that bracket +/- one standard error


@dataclass(frozen=True)
class PowerLaw:
    """L(C) = E + A * C**(-alpha), fitted; `converged` False (with `note` saying why) when not to trust it."""

    E: float
    A: float
    alpha: float
    converged: bool  # optimiser reported success and no parameter is pressed against a bound (E = 0 allowed)
    note: str  # '' or a short reason

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        """Fitted loss at `compute` FLOPs."""
        value = self.E + self.A * np.power(np.asarray(compute, dtype=float), -self.alpha)
        return float(value) if np.ndim(value) == 0 else value

    def compute_for(self, loss: float) -> float:
        """Compute C with L(C) = loss, (A / (loss - E))^(1/alpha); math.inf when loss <= E (never reached)."""
        if loss <= self.E:
            return math.inf
        # in logs: A alone can be ~1e30 when C is in FLOPs
        return math.exp((math.log(self.A) - math.log(loss - self.E)) / self.alpha)


def _validated(compute: Sequence[float], loss: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Arrays of compute and loss, or ValueError naming what is wrong with them."""
    if len(compute) != len(loss):
        raise ValueError(f"compute and loss differ in length: {len(compute)} vs {len(loss)}")
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    for name, values in (("compute", c), ("loss", y)):
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise ValueError(f"{name} values must be finite and positive, got {values.tolist()}")
    if len(np.unique(c)) < 3:
        raise ValueError(
            f"a power law E + A*C^-alpha has 3 parameters: need 3 distinct compute values, got {len(np.unique(c))}"
        )
    return c, y


def _grid_start(x: np.ndarray, y: np.ndarray, e_max: float) -> tuple[float, float, float]:
    """(E, a, alpha) on normalised compute x: best of an alpha grid, E and a by linear least squares.

    For fixed alpha the model is linear in (E, a) (variable projection), so the grid gives a start
    near the global optimum and the refinement never wanders into a poor local one.
    """
    z = x[None, :] ** -_ALPHA_GRID[:, None]  # (grid, points)
    zc, yc = z - z.mean(axis=1, keepdims=True), y - y.mean()
    a = np.maximum((zc * yc).sum(axis=1) / np.maximum((zc * zc).sum(axis=1), 1e-300), 1e-12 * y.min())
    e = np.clip(y.mean() - a * z.mean(axis=1), 0.0, e_max)
    # E was clipped: a is refit for that E, so every grid row is a feasible curve
    a = np.maximum((z * (y - e[:, None])).sum(axis=1) / (z * z).sum(axis=1), 1e-12 * y.min())
    sse = ((np.log(e[:, None] + a[:, None] * z) - np.log(y)) ** 2).sum(axis=1)
    best = int(np.argmin(sse))
    return float(e[best]), float(a[best]), float(_ALPHA_GRID[best])


def _bound_note(result: optimize.OptimizeResult, e_max: float) -> tuple[str, bool]:
    """('' or which parameter the optimiser left pressed against a bound, whether the fit is to be trusted).

    E at 0 is trusted: the pure power law of Kaplan et al. 2020 is the best curve, because the measured
    range does not reach the loss floor; any other bound (or a failed optimiser) is not."""
    if not result.success:
        return f"optimiser did not converge: {result.message}", False
    notes = {
        (0, -1): "E at its lower bound 0: a pure power law over this range",
        (0, 1): f"E at its upper bound min(loss) {e_max:.4g}",
        (1, -1): "A at its lower bound: loss does not fall with compute",
        (1, 1): "A at its upper bound",
        (2, -1): f"alpha at its lower bound {ALPHA_MIN:g}",
        (2, 1): f"alpha at its upper bound {ALPHA_MAX:g}",
    }
    pressed = [(i, int(m)) for i, m in enumerate(result.active_mask) if (i, int(m)) in notes]
    return "; ".join(notes[key] for key in pressed), all(key == (0, -1) for key in pressed)


def fit_power_law(compute: Sequence[float], loss: Sequence[float]) -> PowerLaw:
    """Fit L(C) = E + A * C^-alpha by Huber loss on log residuals (see the module docstring).

    Works on x = C / geometric-mean(C) so the parameters are O(1) for the optimiser, and returns A in
    the original units: A = a * Cref^alpha. Raises ValueError on mismatched lengths, non-finite or
    non-positive values, or fewer than 3 distinct compute values. Takes about a millisecond.
    """
    c, y = _validated(compute, loss)
    c_ref = math.exp(float(np.log(c).mean()))
    x, log_x, log_y = c / c_ref, np.log(c / c_ref), np.log(y)
    e_max = float(y.min()) * (1.0 - 1e-6)  # E = min(L) would put a residual at log 0
    # a is the reducible loss at the mean compute, so it lies below max(L); the wide box only keeps
    # exp() from overflowing on a trial step
    log_a_bounds = (math.log(1e-9 * float(y.min())), math.log(1e3 * float(y.max())))
    e0, a0, alpha0 = _grid_start(x, y, e_max)

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.asarray(np.log(p[0] + np.exp(p[1]) * x ** -p[2]) - log_y)

    def jacobian(p: np.ndarray) -> np.ndarray:
        reducible = np.exp(p[1]) * x ** -p[2]
        pred = p[0] + reducible
        return np.stack([1.0 / pred, reducible / pred, -log_x * reducible / pred], axis=1)

    lower = np.array([0.0, log_a_bounds[0], ALPHA_MIN])
    upper = np.array([e_max, log_a_bounds[1], ALPHA_MAX])
    # least_squares wants a strictly feasible start; the grid may sit exactly on a bound
    start = np.clip([e0, math.log(a0), alpha0], lower + 1e-9, upper - 1e-9)
    result = optimize.least_squares(
        residuals, start, jac=jacobian, bounds=(lower, upper), loss="huber", f_scale=HUBER_DELTA, x_scale="jac"
    )
    e, log_a, alpha = (float(v) for v in result.x)
    note, trusted = _bound_note(result, e_max)
    return PowerLaw(E=e, A=math.exp(log_a + alpha * math.log(c_ref)), alpha=alpha, converged=trusted, note=note)


def compute_multiplier(baseline: PowerLaw, variant: PowerLaw, at_compute: float) -> float:
    """How many times the variant's compute the baseline needs to reach the same loss.

        L*  = baseline.loss(at_compute)        the baseline's fitted loss at `at_compute` (the largest
                                               measured compute, in `fit_scaling`)
        C_v = variant.compute_for(L*)          compute at which the variant's curve reaches L*
        k   = at_compute / C_v

    "The baseline needs k times the compute the variant needs to reach the same loss": k > 1 means the
    variant is worth more compute; then C_v < at_compute and both curves are read inside the measured
    range. Returns 0.0 when the variant never reaches L* (L* <= variant.E).
    """
    c_v = variant.compute_for(float(baseline.loss(at_compute)))
    return 0.0 if math.isinf(c_v) else at_compute / c_v


def _small_sample_interval(point: float, draws: np.ndarray, n_seeds: int, level: float) -> list[float]:
    """[lo, hi] = point -/+ t_{(1+level)/2, n-1} * sqrt(n/(n-1)) * (q_0.8413 - q_0.1587)(draws) / 2, n = n_seeds.

    The standard error is read from the bootstrap draws' quantiles rather than their std, so a few
    wild replicates (a fit pressed against a bound, a curve that never reaches: log k = -inf) cannot
    blow it up. A bootstrap over n seeds shows the plug-in spread, short of the unbiased one by
    sqrt((n-1)/n), and that spread is itself estimated from n seeds, hence Student's t with n-1 df:
    for a mean of n normal values this is exactly the t interval. Measured coverage: module docstring.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    if n_seeds < 2 or len(draws) == 0 or not math.isfinite(point):
        return [math.nan, math.nan]
    # NOTE: inverted_cdf returns draws themselves; interpolating between -inf and a number gives nan
    q_lo, q_hi = np.quantile(draws, [0.5 - _ONE_SIGMA, 0.5 + _ONE_SIGMA], method="inverted_cdf")
    widen = float(sps.t.ppf((1.0 + level) / 2.0, n_seeds - 1)) * math.sqrt(n_seeds / (n_seeds - 1))
    half = widen * (q_hi - q_lo) / 2.0
    return [point - half, point + half]


# ---- the fits of a study: records ---------------------------------------------------------------------

Point = tuple[float, float, int]  # (compute, loss, seed) of one finished run


@dataclass(frozen=True)
class ScalingRun:
    """One run as a scaling fit reads it: its variant, seed, training compute (FLOPs) and final loss
    (non-finite: diverged)."""

    variant: str
    seed: int
    compute: float
    loss: float


@dataclass(frozen=True)
class FitCurve:
    """A fitted curve on `CURVE_POINTS` computes with its interval at each, for the plot (None: unbounded)."""

    compute: list[float]
    loss: list[float]
    low: list[float | None]
    high: list[float | None]


@dataclass(frozen=True)
class LackOfFit:
    """How well a power law fits its points (`lack_of_fit`)."""

    rms_log_residual: float
    lack_of_fit_p: float | None  # None without replicates or with 3 computes


@dataclass(frozen=True)
class Extrapolation:
    """A compute multiplier read beyond the largest measured compute (`fit_scaling`'s extrapolate_to)."""

    compute: float
    multiplier: float
    multiplier_ci: list[float | None]
    note: str = "extrapolation beyond the largest measured compute"


@dataclass(frozen=True)
class VariantFit:
    """One variant's power law, its intervals, its points and its compute multiplier against the baseline."""

    E: float
    A: float
    alpha: float
    converged: bool
    note: str
    E_ci: list[float | None]
    alpha_ci: list[float | None]
    n_seeds: int
    n_points: int
    diverged: int  # runs left out of the fit
    boot_failed: int  # bootstrap replicates whose fit raised
    points: list[Point]
    curve: FitCurve
    rms_log_residual: float
    lack_of_fit_p: float | None
    multiplier: float  # 1 for the baseline; 0 when the variant never reaches the baseline's loss
    multiplier_ci: list[float | None]
    extrapolated: Extrapolation | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.extrapolated is None:
            del out["extrapolated"]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VariantFit:
        extrapolated = Extrapolation(**d["extrapolated"]) if "extrapolated" in d else None
        points = [(c, y, s) for c, y, s in d["points"]]
        return cls(**{**d, "points": points, "curve": FitCurve(**d["curve"]), "extrapolated": extrapolated})


@dataclass(frozen=True)
class ScalingFits:
    """`fit_scaling`'s result: a power law per variant and its compute multiplier against the baseline."""

    baseline: str
    level: float
    n_boot: int
    loss_fit: str  # how the curves were fitted (LOSS_FIT)
    compute_range: list[float]  # [smallest, largest] measured training compute
    at_compute: float  # where the multipliers are read: the largest measured compute
    variants: dict[str, VariantFit]
    sentences: list[str]  # one per variant but the baseline

    def to_json(self) -> dict[str, Any]:
        """JSON without nan or inf: a missing or unbounded interval end is None."""
        return {**asdict(self), "variants": {name: fit.to_json() for name, fit in self.variants.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScalingFits:
        """The fits from `to_json`, or from a study's scaling JSON, which holds them beside its own keys."""
        own = {f.name: d[f.name] for f in fields(cls)}
        return cls(**{**own, "variants": {name: VariantFit.from_json(v) for name, v in d["variants"].items()}})


@dataclass
class Draws:
    """One variant's bootstrap replicates (`_bootstrap`): E, log alpha, log k at each compute read, the
    fitted log loss on the plot's grid, and how many replicates failed to fit."""

    E: list[float] = field(default_factory=list)
    log_alpha: list[float] = field(default_factory=list)
    log_k: list[list[float]] = field(default_factory=list)  # a column per compute read
    log_loss: list[np.ndarray] = field(default_factory=list)
    failed: int = 0


# ---- the fits of a study ----------------------------------------------------------------------------


def _group_runs(runs: Sequence[ScalingRun]) -> tuple[dict[str, list[Point]], dict[str, int]]:
    """Finite (compute, loss, seed) points by variant, and the number of diverged runs by variant."""
    points: dict[str, list[Point]] = {}
    diverged: dict[str, int] = {}
    for run in runs:
        points.setdefault(run.variant, [])
        diverged.setdefault(run.variant, 0)
        if math.isfinite(run.loss):
            points[run.variant].append((float(run.compute), float(run.loss), int(run.seed)))  # JSON-able
        else:
            diverged[run.variant] += 1
    return points, diverged


def _fit_seeds(points: list[Point], seeds: tuple[int, ...]) -> PowerLaw:
    """Fit on the points of `seeds`, a seed appearing as many times as it was drawn."""
    by_seed: dict[int, list[tuple[float, float]]] = {}
    for c, y, s in points:
        by_seed.setdefault(s, []).append((c, y))
    chosen = [p for s in seeds for p in by_seed.get(s, [])]
    return fit_power_law([c for c, _ in chosen], [y for _, y in chosen])


def _bootstrap(
    points: dict[str, list[Point]],
    baseline: str,
    seed_ids: list[int],
    n_boot: int,
    seed: int,
    at: list[float],
    grid: np.ndarray,
) -> dict[str, Draws]:
    """Paired bootstrap over seeds: per variant, draws of E, log alpha, log k at each compute in `at` and
    the fitted log loss at each compute of `grid` (the band of the plotted curve).

    One draw of seed ids per replicate serves every variant. A fit depends only on the multiset of
    seeds drawn (3 seeds: 10 of them, 5 seeds: 126), so fits are cached by it.
    """
    rng = np.random.default_rng(seed)
    cache: dict[tuple[str, tuple[int, ...]], PowerLaw | None] = {}

    def fit(name: str, seeds: tuple[int, ...]) -> PowerLaw | None:
        if (name, seeds) not in cache:
            try:
                cache[name, seeds] = _fit_seeds(points[name], seeds)
            except ValueError:  # e.g. the seeds drawn cover fewer than 3 sizes of this variant
                cache[name, seeds] = None
        return cache[name, seeds]

    draws = {name: Draws(log_k=[[] for _ in at]) for name in points}
    for idx in rng.integers(0, len(seed_ids), size=(n_boot, len(seed_ids))):
        seeds = tuple(seed_ids[i] for i in sorted(idx))
        base = fit(baseline, seeds)
        for name in points:
            law = fit(name, seeds)
            if base is None or law is None:
                draws[name].failed += 1
                continue
            draws[name].E.append(law.E)
            draws[name].log_alpha.append(math.log(law.alpha))
            draws[name].log_loss.append(np.log(law.loss(grid)))
            for column, c in zip(draws[name].log_k, at, strict=True):
                k = compute_multiplier(base, law, c)
                column.append(math.log(k) if k > 0 else -math.inf)
    return draws


def _finite_or_none(values: list[float]) -> list[float | None]:
    """Strict JSON has no inf or nan: an unbounded or missing interval end becomes None."""
    return [float(v) if math.isfinite(v) else None for v in values]


def _multiplier_ci(point: float, log_k_draws: list[float], n_seeds: int, level: float) -> list[float | None]:
    """CI of a multiplier k, built on log k (k is a ratio) and exponentiated; 0 when it never reaches."""
    if point <= 0:
        return [None, None]
    lo, hi = _small_sample_interval(math.log(point), np.asarray(log_k_draws), n_seeds, level)
    return _finite_or_none([math.exp(lo) if lo > -math.inf else 0.0, math.exp(hi)])


def _inverse(k: float | None) -> str:
    """1/k with 2 decimals, for a CI end of k: None (k unbounded) reads 0.00, k = 0 (never reaches) inf."""
    if k is None:
        return "0.00"
    return "inf" if k == 0.0 else f"{1.0 / k:.2f}"


def _sentence(
    name: str, baseline: str, row: VariantFit, level: float, compute_range: list[float], base_row: VariantFit
) -> str:
    """One plain sentence for a variant's multiplier, reading k as 1/k x the baseline's compute, with a
    warning when the power law misses the points of either curve (`lack_of_fit`)."""
    span = f"{sci(compute_range[0])}-{sci(compute_range[1])} FLOPs"
    k, (lo, hi) = row.multiplier, row.multiplier_ci
    if k == 0.0:
        floor = f"its fitted floor E={row.E:.3g} lies above it"
        text = f"{name} never reaches {baseline}'s loss at {sci(compute_range[1])} FLOPs: {floor}"
    else:
        # 1/k swaps the ends: the upper bound of k gives the lower bound of 1/k
        ci = f"{level * 100:g}% CI {_inverse(hi)}-{_inverse(lo)}" if lo is not None else "no CI: fewer than 2 seeds"
        text = f"{name} reaches {baseline}'s loss with {1.0 / k:.2f}x the compute ({ci}) over {span}"
    if not row.converged:
        text += f" (fit not converged: {row.note})"
    if row.boot_failed:
        text += f" ({row.boot_failed} bootstrap replicates failed to fit)"
    misfit = [
        (n, r.lack_of_fit_p)
        for n, r in ((name, row), (baseline, base_row))
        if r.lack_of_fit_p is not None and r.lack_of_fit_p < LOF_ALPHA
    ]
    if misfit:
        which = ", ".join(f"{n} p={p:.2g}" for n, p in misfit)
        text += f"; but the power law misses the measured points (lack of fit: {which}): a summary, not a law"
    return text


def _band(law: PowerLaw, grid: np.ndarray, log_loss_draws: list[np.ndarray], n_seeds: int, level: float) -> FitCurve:
    """The fitted curve on `grid` with its interval at each compute (on log loss, as the fit), for the plot."""
    draws = np.asarray(log_loss_draws).reshape(-1, len(grid))
    fitted = np.asarray(law.loss(grid), dtype=float)
    ends = [_small_sample_interval(math.log(y), draws[:, i], n_seeds, level) for i, y in enumerate(fitted)]
    return FitCurve(
        compute=grid.tolist(),
        loss=fitted.tolist(),
        low=_finite_or_none([math.exp(lo) for lo, _ in ends]),
        high=_finite_or_none([math.exp(hi) for _, hi in ends]),
    )


def lack_of_fit(law: PowerLaw, compute: Sequence[float], loss: Sequence[float]) -> LackOfFit:
    """Does the power law fit the points, or only summarise them? The classic lack-of-fit F test on log
    loss, with the seeds at one compute as replicates:

        SS_pure = sum over computes of the squared deviations of the seeds from their mean there
        SS_lack = sum of squared residuals of the fit - SS_pure      (df: computes - 3)
        F = (SS_lack / (m - 3)) / (SS_pure / (n - m)),   n points at m distinct computes

    A small p says the curve misses the points by more than seed noise explains (e.g. losses that still
    fall faster and faster, before a model has left its early plateau), so a multiplier read off it
    summarises a shape the law does not have. Also the RMS of the log residuals. p is None without
    replicates or with 3 computes (no degrees of freedom left)."""
    c, log_y = np.asarray(compute, dtype=float), np.log(np.asarray(loss, dtype=float))
    resid = log_y - np.log(np.asarray(law.loss(c), dtype=float))
    levels = np.unique(c)
    pure = sum(float(((log_y[c == v] - log_y[c == v].mean()) ** 2).sum()) for v in levels)
    n, m = len(c), len(levels)
    rms = float(np.sqrt((resid**2).mean()))
    if not (m > 3 and n > m and pure > 0):
        return LackOfFit(rms, None)
    f = (max(float((resid**2).sum()) - pure, 0.0) / (m - 3)) / (pure / (n - m))
    return LackOfFit(rms, float(sps.f.sf(f, m - 3, n - m)))


def _variant_fit(
    law: PowerLaw, points: list[Point], diverged: int, draws: Draws, n_seeds: int, level: float, grid: np.ndarray
) -> VariantFit:
    """One variant's fit with its intervals, its multiplier not yet read (1, no interval): that needs the
    baseline's (`fit_scaling`)."""
    e_lo, e_hi = _small_sample_interval(law.E, np.asarray(draws.E), n_seeds, level)
    a_lo, a_hi = _small_sample_interval(math.log(law.alpha), np.asarray(draws.log_alpha), n_seeds, level)
    fit = lack_of_fit(law, [c for c, _, _ in points], [y for _, y, _ in points])
    return VariantFit(
        E=law.E,
        A=law.A,
        alpha=law.alpha,
        converged=law.converged,
        note=law.note,
        E_ci=_finite_or_none([max(e_lo, 0.0), e_hi]),
        alpha_ci=_finite_or_none([math.exp(a_lo), math.exp(a_hi)]),
        n_seeds=len({s for _, _, s in points}),
        n_points=len(points),
        diverged=diverged,
        boot_failed=draws.failed,
        points=list(points),
        curve=_band(law, grid, draws.log_loss, n_seeds, level),
        rms_log_residual=fit.rms_log_residual,
        lack_of_fit_p=fit.lack_of_fit_p,
        multiplier=1.0,
        multiplier_ci=[1.0, 1.0],
    )


def fit_scaling(
    runs: Sequence[ScalingRun],
    baseline: str,
    level: float = 0.95,
    n_boot: int = 500,
    seed: int = 0,
    extrapolate_to: float | None = None,
) -> ScalingFits:
    """Power-law fit per variant, compute multiplier against `baseline` and its paired seed-bootstrap CI.

    A run with a non-finite loss (diverged) is left out and counted. The point estimates fit all seeds of
    a variant pooled; multipliers are read at the largest measured compute (see `compute_multiplier`), and
    also at `extrapolate_to` when given. The CIs are the small-sample intervals of the module docstring;
    each variant's `boot_failed` counts the replicates whose fit raised (e.g. the seeds drawn cover fewer
    than 3 sizes), left out of its CI and named in its sentence. Its JSON has no nan or inf: a missing or
    unbounded CI end is None.
    """
    points, diverged = _group_runs(runs)
    if baseline not in points:
        raise ValueError(f"baseline {baseline!r} is not among the variants {sorted(points)}")
    finite = [p for pts in points.values() for p in pts]
    if not finite:
        raise ValueError("every run diverged: nothing to fit")
    compute_range = [min(c for c, _, _ in finite), max(c for c, _, _ in finite)]
    at = [compute_range[1]] + ([float(extrapolate_to)] if extrapolate_to is not None else [])
    seed_ids = sorted({s for _, _, s in finite}, key=str)
    laws = {name: fit_power_law([c for c, _, _ in pts], [y for _, y, _ in pts]) for name, pts in points.items()}
    grid = np.geomspace(compute_range[0], compute_range[1], CURVE_POINTS)
    draws = _bootstrap(points, baseline, seed_ids, n_boot, seed, at, grid)
    variants = {}
    cis: list[list[float | None]]
    for name, law in laws.items():
        fit = _variant_fit(law, points[name], diverged[name], draws[name], len(seed_ids), level, grid)
        if name != baseline:  # the baseline's is exactly 1, not up to bootstrap noise
            ks = [compute_multiplier(laws[baseline], law, c) for c in at]
            cis = [_multiplier_ci(k, col, len(seed_ids), level) for k, col in zip(ks, draws[name].log_k, strict=True)]
        else:
            ks, cis = [1.0] * len(at), [[1.0, 1.0] for _ in at]
        extrapolated = Extrapolation(at[1], ks[1], cis[1]) if extrapolate_to is not None else None
        variants[name] = replace(fit, multiplier=ks[0], multiplier_ci=cis[0], extrapolated=extrapolated)
    sentences = [
        _sentence(n, baseline, r, level, compute_range, variants[baseline])
        for n, r in variants.items()
        if n != baseline
    ]
    return ScalingFits(
        baseline=baseline,
        level=level,
        n_boot=n_boot,
        loss_fit=LOSS_FIT,
        compute_range=compute_range,
        at_compute=compute_range[1],
        variants=variants,
        sentences=sentences,
    )
