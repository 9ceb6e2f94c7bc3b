import math

import numpy as np
import pytest
import torch
from scipy import optimize

from ffnlab.core.activations import ACTIVATIONS
from ffnlab.tools import accuracy as acc

# ---- ulp and error statistics ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ulp_is_the_gap_to_the_next_value(dtype):
    info = torch.finfo(dtype)
    v = torch.tensor(
        [0.0, info.smallest_normal / 8, info.smallest_normal, 1.0, 1.5, 3.0, 1000.0, info.max / 2], dtype=dtype
    )
    gap = (torch.nextafter(v, torch.full_like(v, math.inf)) - v).double().numpy()
    np.testing.assert_array_equal(acc.ulp(v.double().numpy(), dtype), gap)
    np.testing.assert_array_equal(acc.ulp(-v.double().numpy(), dtype), gap)


def test_error_stats_counts_inf_and_nan_and_keeps_them_in_the_max():
    x = np.arange(5.0)
    ref = np.array([1.0, 2.0, 3.0, -4.0, 1e6])  # 1e6 overflows fp16: inf is its right answer
    y = np.array([1.0, np.inf, np.nan, -np.inf, np.inf])
    s = acc.error_stats(y, ref, x, torch.float16)
    assert (s["n_inf"], s["n_nan"], s["n_overflow"]) == (3, 1, 2)
    assert s["max_abs_err"] == math.inf and s["max_ulp"] == math.inf and s["argmax_x"] == 1.0
    finite = acc.error_stats(y[[0, 4]], ref[[0, 4]], x[[0, 4]], torch.float16)
    assert finite["max_abs_err"] == 0 and finite["n_overflow"] == 0


def test_round_to_rounds_once():
    rng = np.random.default_rng(0)
    v = np.concatenate(
        [
            rng.standard_normal(1 << 16) * 10.0 ** rng.integers(-9, 6, 1 << 16),
            [1 + 2**-11 + 2**-40, 2**-25 * 1.5, 70000.0, -65520.0, 65519.0, 0.0],
        ]
    )
    with np.errstate(over="ignore"):  # numpy warns when 70000 becomes inf, which is the point
        np.testing.assert_array_equal(acc.round_to(v, torch.float16), v.astype(np.float16).astype(np.float64))
    np.testing.assert_array_equal(acc.round_to(v, torch.float32), v.astype(np.float32).astype(np.float64))
    v32 = v.astype(np.float32)  # float32 -> bfloat16 is a single rounding in torch
    np.testing.assert_array_equal(
        acc.round_to(v32.astype(np.float64), torch.bfloat16), torch.from_numpy(v32).bfloat16().double().numpy()
    )


def test_fp16_tanh_formula_backward_nans_are_counted():
    # NOTE: gelu_new's pow(x, 3) backward forms 3x^2, inf in fp16 for |x| > 148; times a zero tanh' it is NaN
    x, _ = acc.grid(-400, 400, 4001, torch.float16)
    fwd, bwd = acc.measure_activation("gelu_new", "fp16", x)
    xt = torch.from_numpy(x).half().requires_grad_()
    ACTIVATIONS["gelu_new"].fn(xt).sum().backward()
    n_nan = int(torch.isnan(xt.grad).sum())
    assert n_nan > 0 and bwd["n_nan"] == n_nan and bwd["max_abs_err"] == math.inf
    assert fwd["n_nan"] == 0


def test_grid_rounds_to_dtype_and_drops_out_of_range_points():
    x, n_out = acc.grid(-1e5, 1e5, 1001, torch.float16)
    assert n_out > 0 and np.all(np.isfinite(x)) and np.all(np.diff(x) > 0)
    np.testing.assert_array_equal(torch.from_numpy(x).half().double().numpy(), x)


# NOTE: PyTorch's vectorised erf/tanh/exp differ by ISA, so their ULP error does too (measured values:
# benchmarks/README.md). ffnlab promises the absolute error; the ULP bound is a margin that holds for every
# ISA, and `ffnlab numerics` prints each machine's own ULPs beside its CPU and kernel ISA.
TORCH_KERNEL_ULP = 16


# exponential reaches e^10 = 22026 on [-10, 10], where one fp32 ulp is 2^-9: 1e-5 is below fp32's resolution there
ABS_BOUND = {"exponential": 2**-9}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_every_activation_accurate_in_fp32(name):
    x, _ = acc.grid(-10, 10, 2001, torch.float32)
    fwd, bwd = acc.measure_activation(name, "fp32", x)
    bound = ABS_BOUND.get(name, 1e-5)
    assert fwd["max_abs_err"] < bound and bwd["max_abs_err"] < bound
    if ACTIVATIONS[name].scope == "batch":
        # quantile is a mean of erf terms of both signs, crossing 0 where the data put it (near x = 0 here):
        # any fp32 sum cancels there, so its ULPs measure that; its absolute error is a few ulps of 1
        assert fwd["max_abs_err"] < 1e-6 and fwd["note"].startswith("batch-dependent")
    else:
        assert fwd["regions"]["|x|<1"]["max_ulp"] < TORCH_KERNEL_ULP
    assert fwd["n_inf"] == fwd["n_nan"] == bwd["n_inf"] == bwd["n_nan"] == 0


@pytest.mark.parametrize("dtype", list(acc.DTYPES))
def test_exact_functions_have_zero_error(dtype):
    x, _ = acc.grid(-10, 10, 2001, acc.DTYPES[dtype])
    for name in ("relu", "identity"):
        for row in acc.measure_activation(name, dtype, x):
            assert row["max_abs_err"] == 0 and row["argmax_x"] is None


# ---- GELU approximations and the tail ---------------------------------------------------------------


def _neg_tanh_gap(x):
    exact = 0.5 * x * math.erfc(-x / math.sqrt(2))
    approx = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return -abs(approx - exact)


def test_tanh_approximation_max_error_matches_minimisation():
    best = optimize.minimize_scalar(_neg_tanh_gap, bounds=(1.5, 4.0), method="bounded", options={"xatol": 1e-10})
    d = acc.gelu_distance("gelu_tanh")
    assert d["max_abs_err"] == pytest.approx(-best.fun, rel=1e-6)
    assert abs(d["argmax_x"]) == pytest.approx(best.x, abs=1e-3)
    assert 4e-4 < d["max_abs_err"] < 5e-4  # far from the 0.0037 that articles repeat


def test_gelu_distance_covers_hf_aliases():
    names = acc.gelu_approximations()
    assert {
        "gelu_tanh",
        "gelu_sigmoid",
        "gelu_new",
        "gelu_fast",
        "gelu_pytorch_tanh",
        "gelu_accurate",
        "quick_gelu",
    } == set(names)


def test_erfc_form_beats_one_plus_erf_in_fp32_tail():
    tail = acc.gelu_tail(points=121)
    rows = {(r["name"], r["pass"]): r for r in tail["rows"]}
    for direction in ("forward", "backward"):
        assert rows["gelu_erfc", direction]["max_rel_err"] < 1e-4
        assert rows["gelu", direction]["max_rel_err"] > 0.5
        assert rows["gelu_python", direction]["max_rel_err"] > 100 * rows["gelu_erfc", direction]["max_rel_err"]
    at6 = next(s for s in tail["samples"] if s["x"] == -6.0)
    assert at6["gelu"] == 0 and at6["gelu_erfc"] == pytest.approx(at6["reference"], rel=1e-5)
    assert at6["reference"] == pytest.approx(-6 * 0.5 * math.erfc(6 / math.sqrt(2)), rel=1e-12)


# ---- gated products ---------------------------------------------------------------------------------


def test_gated_products_overflow_and_rounding():
    rows = acc.gated_products(n=1 << 14, scales=(1.0, 1000.0))
    by = {(r["ffn"], r["dtype"], r["scale"]): r for r in rows}
    for dtype in ("fp16", "bf16"):
        relu = by["reglu", dtype, 1.0]  # relu is exact: eager rounds once too
        assert relu["max_ulp_eager"] == relu["max_ulp_fused"] <= 0.5
        swiglu = by["swiglu", dtype, 1.0]
        assert swiglu["max_ulp_fused"] <= 0.5 + 1e-3 < swiglu["max_ulp_eager"]
        assert swiglu["mean_ulp_eager"] > swiglu["mean_ulp_fused"]
        # fp32 inside is not exact, so a product within ~1e-4 ulp of a tie may still round the other way
        assert swiglu["frac_correctly_rounded_fused"] > 0.999 > 0.9 > swiglu["frac_correctly_rounded_eager"]
    big = by["reglu", "fp16", 1000.0]
    # |a b| > 65504 for a, b ~ N(0, 1000^2) and a > 0: P(|Z1 Z2| > 0.0655) / 2
    gen = np.random.default_rng(0)
    z = gen.standard_normal((2, 1 << 18))
    expected = np.mean((np.abs(z[0] * z[1]) > 0.065504) & (z[0] > 0))
    assert big["frac_inf_exact"] == pytest.approx(expected, abs=0.01)
    assert big["frac_inf_fused"] == big["frac_inf_exact"] > 0.3
    assert by["swiglu", "bf16", 1000.0]["frac_inf_eager"] == 0  # bf16 has fp32's exponent range
