"""Claims that articles on activation functions repeat, each re-measured here with a verdict.

The claims live in claims.json beside this module: a claim names a measurement `measure_<name>`
below, called with its `args`; every claimed value is compared with the same key of what it
returns under the claim's rule (`check`), and the claim holds when every part holds (`verdict`). Words
that read more than one way (a sign left out) name each reading's part, and get a verdict per reading
(`verdict_by_reading`). A claim about PyTorch's history reads the published facts from its `args`, and
its note cites them.
A claim about training reads numbers a benchmark recorded in its `args` (`measure_recorded_placement`,
benchmarks/placement_claim.py): the check stays seconds long, and the row names what recorded them.
"""

from __future__ import annotations

import inspect
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import integrate

from ffnlab._util.names import closest
from ffnlab.core.activations import ACTIVATIONS, resolve
from ffnlab.core.ffn import ffn_param_count
from ffnlab.tools.accuracy import DEFAULT_POINTS, DTYPES, gelu_distance, grid, round_to, ulp
from ffnlab.tools.int8 import measure_int8
from ffnlab.tools.numerics_text import fmt_value
from ffnlab.tools.references import GELU, REFERENCES, mp_gelu, mp_gelu_tanh, normal_pdf

CLAIMS_PATH = Path(__file__).with_name("claims.json")

# ---- measurement functions named by claims.json ----------------------------------------------------


def _time_once(fn: Callable[[torch.Tensor], object], x: torch.Tensor) -> float:
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


def measure_gelu_approx_max_error(approx: str, lo: float = -10.0, hi: float = 10.0) -> dict[str, Any]:
    """Max |approx(x) - GELU(x)| of the float64 formulas and |x| where it occurs (the distance is even in x)."""
    d = gelu_distance(approx, lo, hi)
    return {"max_abs_err": d["max_abs_err"], "at_abs_x": abs(d["argmax_x"])}


def _mp_rel_tanh(x: float) -> float:
    """|tanh approximation - GELU| / |GELU| at x, both in mpmath."""
    return abs(mp_gelu_tanh(x) - mp_gelu(x)) / abs(mp_gelu(x))


def measure_gelu_tanh_rel_error_beyond(
    x_abs: float, hi: float = 10.0, step: float = 0.01, at: Sequence[float] = ()
) -> dict[str, Any]:
    """The tanh approximation's relative distance from GELU beyond |x| = x_abs, each side on its own, in mpmath on
    a grid of `step`: the least on [-hi, -x_abs] (where even that exceeds a bound, every x there does), the largest
    on [x_abs, hi] (where even that stays under it, no x there exceeds it), and the distance at each x of `at`."""
    side = np.linspace(x_abs, hi, round((hi - x_abs) / step) + 1).tolist()
    below = {-x: _mp_rel_tanh(-x) for x in side}
    above = {x: _mp_rel_tanh(x) for x in side}
    x_below, x_above = min(below, key=below.__getitem__), max(above, key=above.__getitem__)
    return {
        "min_rel_err_below": below[x_below],
        "at_x_below": x_below,
        **{f"rel_err_at_{x:g}": _mp_rel_tanh(x) for x in at},
        "max_rel_err_above": above[x_above],
        "at_x_above": x_above,
    }


def measure_gelu_approx_ulp_in_dtypes(
    approx: str, dtypes: Sequence[str], lo: float = -10.0, hi: float = 10.0
) -> dict[str, Any]:
    """Per dtype, how far a GELU approximation is from exact GELU in units in the last place of the dtype
    (`ffnlab.tools.accuracy.ulp`), on the grid `ffnlab numerics` measures that dtype on: the largest distance
    and its x, the largest for x > 0, and the fraction of the grid where the two, each correctly rounded to the
    dtype, differ. Float64 formulas (`ffnlab.tools.references`), so the distance is the approximation's own, not
    that of a kernel: torch's exact GELU in a dtype has errors of its own in the tail (the numerics tables)."""
    out = {}
    for name in dtypes:
        dtype = DTYPES[name]
        x, _ = grid(lo, hi, DEFAULT_POINTS, dtype)
        exact, approximated = GELU.f(x), REFERENCES[approx].f(x)
        ulps = np.abs(approximated - exact) / ulp(exact, dtype)
        i = int(np.argmax(ulps))
        out[f"{name}_max_ulp"], out[f"{name}_at_x"] = float(ulps[i]), float(x[i])
        out[f"{name}_max_ulp_x>0"] = float(ulps[x > 0].max())
        out[f"{name}_rounds_apart"] = float(np.mean(round_to(approximated, dtype) != round_to(exact, dtype)))
    return out


def measure_time_ratio(numerator: str, denominator: str, n: int = 1 << 22, repeats: int = 9) -> dict[str, Any]:
    """Median forward time of registry fn `numerator` over that of `denominator`, fp32, same process.

    Runs are interleaved after a warm-up so drift on a shared machine hits both alike.
    """
    fa, fb = ACTIVATIONS[resolve(numerator)].fn, ACTIVATIONS[resolve(denominator)].fn
    if fa is None or fb is None:
        raise ValueError(f"{numerator} / {denominator}: an activation with learned parameters has no function to time")
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(2):
            fa(x), fb(x)
        ta, tb = [], []
        for _ in range(repeats):
            ta.append(_time_once(fa, x))
            tb.append(_time_once(fb, x))
    return {"ratio": statistics.median(ta) / statistics.median(tb)}


def measure_gated_param_ratio(d_model: int = 768) -> dict[str, Any]:
    """Gated/dense parameter ratio at the same d_ff = 4 d_model, and at gated d_ff = 8/3 d_model (no bias)."""
    dense = ffn_param_count("dense", d_model, 4 * d_model, bias=False)
    if (8 * d_model) % 3:
        raise ValueError(f"d_model must be a multiple of 3 for d_ff = 8/3 d_model, got {d_model}")
    return {
        "ratio_same_d_ff": ffn_param_count("gated", d_model, 4 * d_model, bias=False) / dense,
        "ratio_d_ff_8_3": ffn_param_count("gated", d_model, 8 * d_model // 3, bias=False) / dense,
    }


def measure_gelu_std_reduction() -> dict[str, Any]:
    """1 - std(GELU(X)) for X ~ N(0, 1), by quadrature of the float64 reference."""
    pdf = lambda t: GELU.f(t) * normal_pdf(t)
    m1 = integrate.quad(pdf, -np.inf, np.inf)[0]
    m2 = integrate.quad(lambda t: GELU.f(t) ** 2 * normal_pdf(t), -np.inf, np.inf)[0]
    return {"std_reduction": 1.0 - math.sqrt(m2 - m1 * m1)}


def measure_relu_inactive_fraction(n: int = 1 << 20, seed: int = 0) -> dict[str, Any]:
    """Fraction of relu outputs that are 0 for N(0,1) inputs, and for zero-mean skewed inputs (Exp(1) - 1)."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=gen)
    skewed = torch.empty(n).exponential_(1.0, generator=gen) - 1.0
    return {
        "inactive_fraction": float((F.relu(normal) == 0).float().mean()),
        "inactive_fraction_skewed": float((F.relu(skewed) == 0).float().mean()),
    }


GELU_CHECK_POINTS = (-3.0, -1.0, -0.5, 0.5, 1.0, 3.0)


def measure_torch_gelu_default(published: dict[str, str]) -> dict[str, Any]:
    """The installed torch's GELU beside PyTorch's published history. Measured: nn.GELU's default `approximate`,
    whether F.gelu with it computes x*Phi(x) (mpmath) and whether approximate='tanh' computes the tanh formula,
    in float64. Published (`published`, the claim's note cites where): the release that added
    approximate='tanh' and the default before 2.0. changed_in_2_0: the installed 2.x default is not that one."""
    default = inspect.signature(torch.nn.GELU.__init__).parameters["approximate"].default
    x = torch.tensor(GELU_CHECK_POINTS, dtype=torch.float64)
    exact = torch.tensor([mp_gelu(v) for v in GELU_CHECK_POINTS], dtype=torch.float64)
    behaves = "none" if torch.allclose(F.gelu(x), exact, rtol=1e-12, atol=0) else "tanh"
    tanh = torch.from_numpy(REFERENCES["gelu_tanh"].f(x.numpy()))
    installed = default if default == behaves else f"{default} (signature) / {behaves} (values)"
    return {
        "installed_default": installed,
        "tanh_option": torch.allclose(F.gelu(x, approximate="tanh"), tanh, rtol=1e-12, atol=0),
        "tanh_option_since": published["tanh_option_since"],
        "default_before_2_0": published["default_before_2_0"],
        "changed_in_2_0": installed != published["default_before_2_0"],
    }


def measure_int8_activation(impl: str, lo: float = -10.0, hi: float = 10.0) -> dict[str, Any]:
    """An int8 implementation (ffnlab.tools.int8): the bytes of its lookup table, and its largest error on every
    int8 code in [lo, hi] in output steps (below 0.5: as good as a correctly rounded table)."""
    row = measure_int8(impl, lo, hi)
    return {"table_bytes": row["table_bytes"], "max_step_err": row["max_ulp"]}


def failed_completely(untrained: float, final: float | None, diverged: bool) -> bool:
    """Whether one training run "failed completely": it diverged (`ffnlab.run.monitors`: a non-finite loss, or
    one that stayed far above its best), or its final validation loss is no better (not lower) than the
    same model's before training, on the same validation batches."""
    return diverged or final is None or not math.isfinite(final) or final >= untrained


def _mean_ci_text(mean_ci: list[float | None]) -> str:
    """[mean, lo, hi] of a loss as 'mean [lo, hi]' to 3 decimals (losses differ in the second); 'diverged' without
    a mean (no seed finished)."""
    mean, lo, hi = mean_ci
    if mean is None:
        return "diverged"
    return f"{mean:.3f}" + ("" if lo is None or hi is None else f" [{lo:.3f}, {hi:.3f}]")


def measure_recorded_placement(position: str, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether training fails completely with the activation at `position` (ModelConfig.act_position), from
    runs a benchmark recorded (benchmarks/placement_claim.py; the claim's note says where and how). `runs`
    holds, per position, each seed's validation loss before training ("untrained") and at the end ("final",
    None if it diverged), whether it diverged, and "mean_ci": [mean, lo, hi] of the final loss over the seeds
    that finished (95% Student t, ffnlab.study.stats.mean_ci).

    `fails`: every seed at `position` failed completely (`failed_completely`). The other keys show the
    numbers: how many seeds failed, the mean untrained loss, and each position's final loss, mean [95% CI].
    """
    if position not in runs:
        raise ValueError(f"no recorded runs at '{position}'{closest(position, runs)}; recorded: {', '.join(runs)}")
    at = runs[position]
    failed = [failed_completely(u, f, d) for u, f, d in zip(at["untrained"], at["final"], at["diverged"])]
    out: dict[str, float | str | bool] = {"fails": all(failed), "failed_seeds": f"{sum(failed)}/{len(failed)}"}
    out["untrained_loss"] = statistics.fmean(u for r in runs.values() for u in r["untrained"])
    for name, r in runs.items():
        out[f"{name}_loss"] = _mean_ci_text(r["mean_ci"])
    return out


def measure_layer_grad_ratio() -> dict[str, Any]:
    """Not measured here: it needs a trained study. `ffnlab report` measures it from a store (the 'Gradients by
    depth' section, ffnlab.study.summary.layer_grads): per run, layer 0's FFN gradient norm over the top layer's,
    the median over the steps logged after warm-up; GELU's against each other variant's, paired over seeds on
    the log scale. The tools layer trains nothing and reads no store, so every value is None here."""
    return {"gelu_vs_others": None}


MEASURES: dict[str, Callable[..., dict[str, Any]]] = {
    f.__name__.removeprefix("measure_"): f
    for f in (
        measure_gelu_approx_max_error,
        measure_gelu_tanh_rel_error_beyond,
        measure_gelu_approx_ulp_in_dtypes,
        measure_time_ratio,
        measure_gated_param_ratio,
        measure_gelu_std_reduction,
        measure_relu_inactive_fraction,
        measure_torch_gelu_default,
        measure_int8_activation,
        measure_layer_grad_ratio,
        measure_recorded_placement,
    )
}
VERDICTS = ("holds", "does not hold", "not measurable here")


def check(measured: float | str | None, claimed: float | str, rule: dict[str, Any]) -> bool | None:
    """Whether one measured value supports the claimed one under `rule`; None if not measured.

    Rules: {"rel": t} |m - c| <= t|c|; {"abs": t} |m - c| <= t; {"gt": true} m > c; {"lt": true} m < c;
    {"eq": true} m == c.
    """
    if measured is None:
        return None
    if "eq" in rule:
        return measured == claimed
    if isinstance(measured, str) or isinstance(claimed, str):
        raise ValueError(f"claim rule {rule} compares numbers, not {measured!r} with {claimed!r}")
    if "rel" in rule:
        return abs(measured - claimed) <= float(rule["rel"]) * abs(claimed)
    if "abs" in rule:
        return abs(measured - claimed) <= float(rule["abs"])
    if "gt" in rule:
        return measured > claimed
    if "lt" in rule:
        return measured < claimed
    raise ValueError(f"unknown claim rule {rule}; valid: rel, abs, gt, lt, eq")


def verdict(parts: list[bool | None]) -> str:
    """A claim holds if every part holds; one failing part sinks it; otherwise it is not measurable here."""
    if any(p is False for p in parts):
        return "does not hold"
    return "not measurable here" if any(p is None for p in parts) else "holds"


PART_VERDICTS = {True: "holds", False: "does not hold", None: "not measurable here"}


def verdict_by_reading(parts: dict[str, bool | None], readings: dict[str, str]) -> str:
    """The verdict of a claim whose words can be read more than one way (claims.json `readings`: each part is
    one reading, named by what it reads the words as): one verdict when every reading gets the same, else each
    reading's, e.g. 'holds for x < -2.5; does not hold for x > 2.5'."""
    said = {PART_VERDICTS[parts[k]] for k in readings}
    if len(said) == 1:
        return said.pop()
    return "; ".join(f"{PART_VERDICTS[parts[k]]} for {reading}" for k, reading in readings.items())


def claim_of(measure: str, path: str | Path = CLAIMS_PATH) -> dict[str, Any]:
    """The claim that names `measure`; ValueError if none does. A study's report shows a claim that only a
    trained study can measure (`measure_layer_grad_ratio`) from its row here, so its words live in one place."""
    for c in load_claims(path):
        if c["measure"] == measure:
            return c
    raise ValueError(f"no claim in {path} names the measure '{measure}'")


def _fmt_values(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in values.items())


def load_claims(path: str | Path = CLAIMS_PATH) -> list[dict[str, Any]]:
    """The claims file as a list of dicts; ValueError if a claim names an unknown measurement."""
    claims: list[dict[str, Any]] = json.loads(Path(path).read_text())["claims"]
    for c in claims:
        if c["measure"] not in MEASURES:
            raise ValueError(
                f"claim {c['id']}: unknown measure '{c['measure']}'{closest(c['measure'], MEASURES)}; "
                f"valid: {', '.join(MEASURES)}"
            )
        if "readings" in c and set(c["readings"]) != set(c["claimed"]):
            raise ValueError(f"claim {c['id']}: its readings must name each claimed part: {', '.join(c['claimed'])}")
    return claims


def run_claims(path: str | Path = CLAIMS_PATH) -> list[dict[str, Any]]:
    """Measure every claim in the claims file (`run_claim`)."""
    return [run_claim(c) for c in load_claims(path)]


def run_claim(c: dict[str, Any]) -> dict[str, Any]:
    """Measure one claim of the claims file: claimed and measured values, per-part and overall verdict."""
    measured = MEASURES[c["measure"]](**c.get("args", {}))
    parts = {k: check(measured.get(k), v, c["rule"][k]) for k, v in c["claimed"].items()}
    readings = c.get("readings", {})
    return {
        "id": c["id"],
        "claim": c["claim"],
        "source": c["source"],
        "claimed": _fmt_values(c["claimed"]),
        "measured": _fmt_values(measured),
        "verdict": verdict_by_reading(parts, readings) if readings else verdict(list(parts.values())),
        "note": c.get("note", ""),
        "claimed_values": c["claimed"],
        "measured_values": measured,
        "parts": {k: PART_VERDICTS[p] for k, p in parts.items()},
        "readings": {reading: PART_VERDICTS[parts[k]] for k, reading in readings.items()},
    }
