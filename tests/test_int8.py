"""Activations on int8 codes (ffnlab.tools.int8): every entry against its reference, and two against a direct
computation written here from the papers' formulas."""

import math

import numpy as np
import pytest
from scipy import special

from ffnlab.tools import int8

# the largest error of each entry on [-10, 10], in output steps, as measured (0.5: correctly rounded);
# the bound leaves a margin for another platform's float64 rounding of the scales
BOUNDS = {"gelu_lut": 0.5, "i_gelu": 0.65, "hardswish_int8": 0.6, "relu_int8": 0.0}


@pytest.mark.parametrize("name", int8.INT8_ACTS)
def test_every_entry_is_measured_within_its_bound(name):
    row = int8.measure_int8(name)
    assert row["n_points"] == 255 and row["scale_in"] == pytest.approx(10 / 127)
    assert row["max_ulp"] <= BOUNDS[name]
    assert row["max_abs_err"] == pytest.approx(row["max_ulp"] * row["scale_out"])
    assert set(row["regions"]) == {"|x|<1", "1<=|x|<3", "3<=|x|<6", "|x|>=6", "x<-4"}


def test_every_entry_has_a_bound_here():
    assert set(BOUNDS) == set(int8.INT8_ACTS)


def gelu(x):
    return x * special.ndtr(x)


def test_lookup_table_is_the_correctly_rounded_gelu():
    s = 4 / 127
    x = s * np.arange(-127, 128)
    s_out = np.max(np.abs(gelu(x))) / 127
    direct = np.max(np.abs(np.round(gelu(x) / s_out) * s_out - gelu(x)))
    row = int8.measure_int8("gelu_lut", -4, 4)
    assert row["scale_out"] == pytest.approx(s_out, rel=1e-15)
    assert row["max_abs_err"] == pytest.approx(direct, rel=1e-12)


def i_gelu_direct(q: int, s: float) -> float:
    """I-BERT's Algorithm 2 on one code, in Python integers and floats (no rescaling to int8)."""
    a, b = -0.2888, -1.769
    s_erf_in = s / math.sqrt(2)
    q_b, q_c = math.floor(b / s_erf_in), math.floor(1 / (a * s_erf_in**2))
    sign = (q > 0) - (q < 0)
    q_erf = sign * ((min(abs(q), -q_b) + q_b) ** 2 + q_c)
    s_erf = a * s_erf_in**2
    return q * (q_erf + math.floor(1 / s_erf)) * s * s_erf / 2


def test_i_gelu_matches_the_paper_to_within_its_int8_rounding():
    row = int8.measure_int8("i_gelu", -6, 6)
    s, s_out = row["scale_in"], row["scale_out"]
    values = np.array([i_gelu_direct(q, s) for q in range(-127, 128)])
    x = s * np.arange(-127, 128)
    direct = np.abs(np.round(values / s_out) * s_out - gelu(x))
    assert row["max_abs_err"] == pytest.approx(direct.max(), rel=1e-9)
    assert np.abs(values - gelu(x)).max() < 0.02  # the polynomial itself, before int8 output rounding


def test_relu_keeps_the_input_scale_and_is_exact():
    q = np.arange(-127, 128)
    assert np.array_equal(int8.relu_int8(q, 0.1, 0.1), np.maximum(q, 0))
    assert int8.measure_int8("relu_int8")["max_abs_err"] == 0.0


@pytest.mark.parametrize("multiplier", [1e-6, 0.0123, 0.5, 0.999999, 3.7, -0.02])
def test_dyadic_rescaling_rounds_like_the_real_multiplier(multiplier):
    m, shift = int8.dyadic(multiplier)
    assert 2**30 <= abs(m) < 2**31 and m / 2**shift == pytest.approx(multiplier, rel=2**-30)
    acc = np.arange(-5000, 5001) * 7
    expected = np.clip(np.floor(acc * multiplier + 0.5), -127, 127)
    near_tie = np.abs(acc * multiplier - np.floor(acc * multiplier) - 0.5) < 1e-6
    assert np.array_equal(int8.rescale(acc, multiplier)[~near_tie], expected[~near_tie])


def test_calibration_is_max_abs_over_127():
    assert int8.calibrate(np.array([-3.0, 1.0, 2.54])) == 3.0 / 127
    with pytest.raises(ValueError, match="max"):
        int8.calibrate(np.zeros(4))


def test_unknown_entry_and_impossible_scales_are_one_line_value_errors():
    with pytest.raises(ValueError, match="did you mean 'i_gelu'.*valid: gelu_lut, i_gelu"):
        int8.get_int8_act("i_gelo")
    with pytest.raises(ValueError, match="cannot run on .*input scale") as e:
        int8.measure_int8("i_gelu", -1e-12, 1e-12)
    assert "\n" not in str(e.value)
