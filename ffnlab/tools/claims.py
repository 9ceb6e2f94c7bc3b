"""Claims that articles on activation functions repeat, each re-measured here with a verdict.

The claims live in claims.json beside this module: a claim names a measurement `measure_<name>`
below, called with its `args`; every claimed value is compared with the same key of what it
returns under the claim's rule (`check`), and the claim holds when every part holds (`verdict`).
A claim about training reads numbers a benchmark recorded in its `args` (`measure_recorded_placement`,
benchmarks/placement_claim.py): the check stays seconds long, and the row names what recorded them.
"""

from __future__ import annotations

import inspect
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import integrate

from ffnlab._util.names import closest
from ffnlab.core.activations import ACTIVATIONS, resolve
from ffnlab.core.ffn import ffn_param_count
from ffnlab.tools.accuracy import gelu_distance
from ffnlab.tools.int8 import measure_int8
from ffnlab.tools.numerics_text import fmt_value
from ffnlab.tools.references import GELU, REFERENCES, mp_gelu, normal_pdf

CLAIMS_PATH = Path(__file__).with_name("claims.json")

# ---- measurement functions named by claims.json ----------------------------------------------------


def _time_once(fn: Callable[[torch.Tensor], object], x: torch.Tensor) -> float:
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


def measure_gelu_approx_max_error(approx: str, lo: float = -10.0, hi: float = 10.0) -> dict:
    """Max |approx(x) - GELU(x)| of the float64 formulas and |x| where it occurs (the distance is even in x)."""
    d = gelu_distance(approx, lo, hi)
    return {"max_abs_err": d["max_abs_err"], "at_abs_x": abs(d["argmax_x"])}


def measure_gelu_approx_rel_error_above(approx: str, x_min: float, hi: float = 10.0) -> dict:
    """Max relative distance |approx - GELU| / |GELU| over x in (x_min, hi]."""
    x = np.linspace(x_min, hi, 100_001)[1:]
    g = GELU.f(x)
    return {"max_rel_err": float(np.max(np.abs(REFERENCES[approx].f(x) - g) / np.abs(g)))}


def measure_time_ratio(numerator: str, denominator: str, n: int = 1 << 22, repeats: int = 9) -> dict:
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


def measure_gated_param_ratio(d_model: int = 768) -> dict:
    """Gated/dense parameter ratio at the same d_ff = 4 d_model, and at gated d_ff = 8/3 d_model (no bias)."""
    dense = ffn_param_count("dense", d_model, 4 * d_model, bias=False)
    if (8 * d_model) % 3:
        raise ValueError(f"d_model must be a multiple of 3 for d_ff = 8/3 d_model, got {d_model}")
    return {
        "ratio_same_d_ff": ffn_param_count("gated", d_model, 4 * d_model, bias=False) / dense,
        "ratio_d_ff_8_3": ffn_param_count("gated", d_model, 8 * d_model // 3, bias=False) / dense,
    }


def measure_gelu_std_reduction() -> dict:
    """1 - std(GELU(X)) for X ~ N(0, 1), by quadrature of the float64 reference."""
    pdf = lambda t: GELU.f(t) * normal_pdf(t)
    m1 = integrate.quad(pdf, -np.inf, np.inf)[0]
    m2 = integrate.quad(lambda t: GELU.f(t) ** 2 * normal_pdf(t), -np.inf, np.inf)[0]
    return {"std_reduction": 1.0 - math.sqrt(m2 - m1 * m1)}


def measure_relu_inactive_fraction(n: int = 1 << 20, seed: int = 0) -> dict:
    """Fraction of relu outputs that are 0 for N(0,1) inputs, and for zero-mean skewed inputs (Exp(1) - 1)."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=gen)
    skewed = torch.empty(n).exponential_(1.0, generator=gen) - 1.0
    return {
        "inactive_fraction": float((F.relu(normal) == 0).float().mean()),
        "inactive_fraction_skewed": float((F.relu(skewed) == 0).float().mean()),
    }


def measure_torch_gelu_default() -> dict:
    """The installed torch's default GELU (signature of nn.GELU and the value of F.gelu(1)); history unknowable here."""
    default = inspect.signature(torch.nn.GELU.__init__).parameters["approximate"].default
    one = torch.tensor(1.0, dtype=torch.float64)
    exact = abs(F.gelu(one).item() - mp_gelu(1.0)) < 1e-12
    behaves = "none" if exact else "tanh"
    return {
        "installed_default": default if default == behaves else f"{default} (signature) / {behaves} (values)",
        "changed_in_2_0": None,
    }


def measure_int8_activation(impl: str, lo: float = -10.0, hi: float = 10.0) -> dict:
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


def measure_recorded_placement(position: str, runs: dict[str, dict]) -> dict:
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


def measure_layer_grad_ratio() -> dict:
    """Not measured here: it needs a trained study. `ffnlab report` measures it from a store (the 'Gradients by
    depth' section, ffnlab.study.report.layer_grads): per run, layer 0's FFN gradient norm over the top layer's,
    the median over the steps logged after warm-up; GELU's against each other variant's, paired over seeds on
    the log scale. The tools layer trains nothing and reads no store, so every value is None here."""
    return {"gelu_vs_others": None}


MEASURES: dict[str, Callable[..., dict]] = {
    f.__name__.removeprefix("measure_"): f
    for f in (
        measure_gelu_approx_max_error,
        measure_gelu_approx_rel_error_above,
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


def check(measured: float | str | None, claimed: float | str, rule: dict) -> bool | None:
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
        return abs(measured - claimed) <= rule["rel"] * abs(claimed)
    if "abs" in rule:
        return abs(measured - claimed) <= rule["abs"]
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


def claim_of(measure: str, path: str | Path = CLAIMS_PATH) -> dict:
    """The claim that names `measure`; ValueError if none does. A study's report shows a claim that only a
    trained study can measure (`measure_layer_grad_ratio`) from its row here, so its words live in one place."""
    for c in load_claims(path):
        if c["measure"] == measure:
            return c
    raise ValueError(f"no claim in {path} names the measure '{measure}'")


def _fmt_values(values: dict) -> str:
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in values.items())


def load_claims(path: str | Path = CLAIMS_PATH) -> list[dict]:
    """The claims file as a list of dicts; ValueError if a claim names an unknown measurement."""
    claims = json.loads(Path(path).read_text())["claims"]
    for c in claims:
        if c["measure"] not in MEASURES:
            raise ValueError(
                f"claim {c['id']}: unknown measure '{c['measure']}'{closest(c['measure'], MEASURES)}; "
                f"valid: {', '.join(MEASURES)}"
            )
    return claims


def run_claims(path: str | Path = CLAIMS_PATH) -> list[dict]:
    """Measure every claim in the claims file (`run_claim`)."""
    return [run_claim(c) for c in load_claims(path)]


def run_claim(c: dict) -> dict:
    """Measure one claim of the claims file: claimed and measured values, per-part and overall verdict."""
    measured = MEASURES[c["measure"]](**c.get("args", {}))
    parts = {k: check(measured.get(k), v, c["rule"][k]) for k, v in c["claimed"].items()}
    labels = {True: "holds", False: "does not hold", None: "not measurable here"}
    return {
        "id": c["id"],
        "claim": c["claim"],
        "source": c["source"],
        "claimed": _fmt_values(c["claimed"]),
        "measured": _fmt_values(measured),
        "verdict": verdict(list(parts.values())),
        "note": c.get("note", ""),
        "claimed_values": c["claimed"],
        "measured_values": measured,
        "parts": {k: labels[p] for k, p in parts.items()},
    }
