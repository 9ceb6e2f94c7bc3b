"""Coverage of the compute-multiplier CI of `ffnlab.study.scaling`, by simulation with a known answer.

    python benchmarks/scaling_coverage.py [--studies 400] [--n-boot 200] [--seeds 3 4 5]

Each simulated study: baseline L(C) = 1.5 + A * C^-0.3 with A * 1e11^-0.3 = 1.5, at 4 sizes 1e11..1e13;
the variant is the baseline at k_true = 1.25 times the compute, L_v(C) = L_b(1.25 C). Each run's loss
gets Gaussian noise (sd 0.015) of its own plus an offset (sd 0.02) drawn once per seed and shared by
both variants at every size, as a seed's data order and init are. Prints, per seed count and interval
method, the fraction of studies whose 95% CI contains k_true and the median width of log k's CI.
Methods, all on log k: "percentile" (plain bootstrap percentile interval), "t x std" (point -/+
t_{n-1} x bootstrap std), "t x quantile SE" (point -/+ t_{n-1} x (q84 - q16) / 2 of the draws) and
"chosen" (the module's: the last widened by sqrt(n/(n-1)), which makes it exact for a mean of n normals).
"""

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from ffnlab.study.scaling import _bootstrap, _small_sample_interval, compute_multiplier, fit_power_law

E, ALPHA, K_TRUE = 1.5, 0.3, 1.25
A = 1.5 * 1e11**ALPHA
SIZES = np.geomspace(1e11, 1e13, 4)


def simulate(rng: np.random.Generator, n_seeds: int, point_sd: float, seed_sd: float) -> dict:
    """Finite points by variant, as `_bootstrap` takes them."""
    points = {"relu": [], "swiglu": []}
    for s in range(n_seeds):
        offset = rng.normal(0.0, seed_sd)
        for c in SIZES:
            for name, scale in (("relu", 1.0), ("swiglu", K_TRUE)):
                loss = E + A * (scale * c) ** -ALPHA + offset + rng.normal(0.0, point_sd)
                points[name].append((float(c), float(loss), s))
    return points


def intervals(point: float, draws: np.ndarray, n: int, level: float) -> dict[str, tuple[float, float]]:
    tail = (1.0 - level) / 2.0
    t_std = float(sps.t.ppf(1.0 - tail, n - 1)) * draws[np.isfinite(draws)].std()
    lo, hi = _small_sample_interval(point, draws, n, level)
    narrow = math.sqrt((n - 1) / n)
    return {
        "percentile": tuple(np.quantile(draws, [tail, 1.0 - tail], method="inverted_cdf")),
        "t x std": (point - t_std, point + t_std),
        "t x quantile SE": (point - narrow * (point - lo), point + narrow * (hi - point)),
        "chosen": (lo, hi),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=400)
    parser.add_argument("--n-boot", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--point-sd", type=float, default=0.015)
    parser.add_argument("--seed-sd", type=float, default=0.02)
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}  (numpy {np.__version__})")
    for n in args.seeds:
        rng, hits, widths, started = np.random.default_rng(1000 + n), {}, {}, time.perf_counter()
        for study in range(args.studies):
            points = simulate(rng, n, args.point_sd, args.seed_sd)
            laws = {name: fit_power_law([c for c, _, _ in p], [y for _, y, _ in p]) for name, p in points.items()}
            k = compute_multiplier(laws["relu"], laws["swiglu"], float(SIZES[-1]))
            draws = _bootstrap(points, "relu", list(range(n)), args.n_boot, study, [float(SIZES[-1])], SIZES)
            log_k = np.asarray(draws["swiglu"].log_k[0])
            for method, (lo, hi) in intervals(math.log(k) if k > 0 else -math.inf, log_k, n, 0.95).items():
                hits[method] = hits.get(method, 0) + int(lo <= math.log(K_TRUE) <= hi)
                widths.setdefault(method, []).append(hi - lo)
        seconds = time.perf_counter() - started
        for method in hits:
            coverage, width = hits[method] / args.studies, float(np.median(widths[method]))
            print(
                f"seeds={n} {method:24s} coverage={coverage:.3f}  median log-k CI width={width:.3f}  ({seconds:.0f} s)"
            )


if __name__ == "__main__":
    main()
