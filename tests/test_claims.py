import inspect
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import optimize

from ffnlab.tools import claims as cl
from tests.test_accuracy import _neg_tanh_gap

# ---- claims -----------------------------------------------------------------------------------------


def test_claims_file_names_real_measurements():
    claims = cl.load_claims()
    assert [c["id"] for c in claims] == list(range(1, len(claims) + 1))  # numbered in order, none missing
    for c in claims:
        assert c["claim"] and c["source"] and c["measure"] in cl.MEASURES
        assert set(c["claimed"]) == set(c["rule"])
    assert "PyTorch" in claims[8]["source"]


def test_unknown_measure_is_a_value_error(tmp_path):
    bad = tmp_path / "claims.json"
    bad.write_text(json.dumps({"claims": [{"id": 1, "measure": "gelu_aprox_max_error"}]}))
    with pytest.raises(ValueError, match="did you mean 'gelu_approx_max_error'"):
        cl.load_claims(bad)


@pytest.mark.parametrize(
    "measured,claimed,rule,expected",
    [
        (1.5, 4 / 3, {"rel": 0.05}, False),
        (1.0, 1.0, {"rel": 0.001}, True),
        (0.41, 0.4, {"abs": 0.05}, True),
        (0.0002, 0.01, {"gt": True}, False),
        ("none", "none", {"eq": True}, True),
        (None, True, {"eq": True}, None),
    ],
)
def test_check_rules(measured, claimed, rule, expected):
    assert cl.check(measured, claimed, rule) is expected


def test_a_string_under_a_numeric_rule_is_a_value_error():
    with pytest.raises(ValueError, match="compares numbers"):
        cl.check("tanh", 1.0, {"rel": 0.05})


def test_verdict_combines_parts():
    assert cl.verdict([True, True]) == "holds"
    assert cl.verdict([True, None]) == "not measurable here"
    assert cl.verdict([False, None]) == "does not hold"


@pytest.fixture(scope="module")
def rows():
    """Every claim measured once for the tests that read the table (two of them time kernels)."""
    return {r["id"]: r for r in cl.run_claims()}


def test_claims_table_and_certain_verdicts(rows):
    for r in rows.values():
        assert {"id", "claim", "source", "claimed", "measured", "verdict"} <= set(r)
        assert set(r["parts"].values()) <= set(cl.VERDICTS)
        assert r["verdict"] in cl.VERDICTS or r["readings"]
    six = rows[6]
    assert six["measured_values"]["ratio_same_d_ff"] == (3 * 768 * 3072) / (2 * 768 * 3072) == 1.5
    assert six["measured_values"]["ratio_d_ff_8_3"] == 1.0
    assert six["verdict"] == "does not hold" and six["parts"]["ratio_d_ff_8_3"] == "holds"
    one = rows[1]
    assert one["measured_values"]["max_abs_err"] == pytest.approx(
        -optimize.minimize_scalar(_neg_tanh_gap, bounds=(1.5, 4.0), method="bounded", options={"xatol": 1e-10}).fun,
        rel=1e-6,
    )
    assert one["verdict"] == "does not hold"
    # 7: std of GELU(Z), sampled here, against the quadrature in the library
    z = torch.randn(1 << 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert rows[7]["measured_values"]["std_reduction"] == pytest.approx(
        1 - torch.nn.functional.gelu(z).std().item(), abs=3e-3
    )


def test_relu_quantises_without_a_lookup_table(rows):
    relu = rows[10]
    assert relu["measured_values"] == {"table_bytes": 0, "max_step_err": 0.0}
    assert relu["verdict"] == "holds"
    assert cl.measure_int8_activation("gelu_lut")["table_bytes"] == 256


# ---- claims whose words read two ways, PyTorch's history, the approximation in fp16/bf16 ---------------


def _torch_rel_tanh(x):
    """|tanh GELU - GELU| / |GELU| from torch's own float64 kernels: independent of ffnlab's mpmath."""
    x = torch.as_tensor(x, dtype=torch.float64)
    return ((F.gelu(x, approximate="tanh") - F.gelu(x)).abs() / F.gelu(x).abs()).numpy()


def test_tanh_relative_error_is_measured_on_both_sides_of_2_5(rows):
    two = rows[2]
    measured = two["measured_values"]
    assert measured["min_rel_err_below"] == pytest.approx(_torch_rel_tanh(-2.5), rel=1e-6)  # 2.8%
    assert measured["at_x_below"] == -2.5 and 0.028 < measured["min_rel_err_below"] < 0.029
    assert measured["rel_err_at_-6"] == pytest.approx(_torch_rel_tanh(-6.0), rel=1e-4)  # 98.6%
    # the least below -2.5 is at -2.5 (float64 1 + erf keeps digits to x = -6), the largest above is far under 1%
    below = np.linspace(-6.0, -2.5, 351)
    assert _torch_rel_tanh(below).min() == pytest.approx(measured["min_rel_err_below"], rel=1e-6)
    above = np.linspace(2.5, 10.0, 751)
    assert _torch_rel_tanh(above).max() == pytest.approx(measured["max_rel_err_above"], rel=1e-3)
    assert two["readings"] == {"x < -2.5": "holds", "x > 2.5": "does not hold"}
    assert two["verdict"] == "holds for x < -2.5; does not hold for x > 2.5"


def test_a_verdict_per_reading_only_where_the_readings_differ():
    readings = {"below": "x < -2.5", "above": "x > 2.5"}
    assert cl.verdict_by_reading({"below": True, "above": False}, readings) == (
        "holds for x < -2.5; does not hold for x > 2.5"
    )
    assert cl.verdict_by_reading({"below": False, "above": False}, readings) == "does not hold"
    assert cl.verdict_by_reading({"below": True, "above": None}, readings) == (
        "holds for x < -2.5; not measurable here for x > 2.5"
    )


def test_readings_must_name_the_claimed_parts(tmp_path):
    (two,) = [c for c in cl.load_claims() if c["id"] == 2]
    bad = tmp_path / "claims.json"
    bad.write_text(json.dumps({"claims": [{**two, "readings": {"min_rel_err_below": "x < -2.5"}}]}))
    with pytest.raises(ValueError, match="claim 2: its readings must name each claimed part"):
        cl.load_claims(bad)


def test_torch_gelu_default_was_never_changed_in_2_0(rows):
    # the installed torch, checked here without ffnlab: F.gelu's default is x * Phi(x) from erf; 'tanh' is an option
    assert inspect.signature(torch.nn.GELU).parameters["approximate"].default == "none"
    x = torch.linspace(-3, 3, 61, dtype=torch.float64)
    erf_form = torch.tensor([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(F.gelu(x), erf_form, rtol=1e-13, atol=1e-15)
    assert not torch.allclose(F.gelu(x, approximate="tanh"), erf_form, rtol=1e-6, atol=0)
    nine = rows[9]
    assert nine["measured_values"] == {
        "installed_default": "none",
        "tanh_option": True,
        "tanh_option_since": "1.12",  # published: the 1.12 release notes, cited in the note
        "default_before_2_0": "none",
        "changed_in_2_0": False,
    }
    assert nine["parts"] == {"installed_default": "holds", "changed_in_2_0": "does not hold"}
    assert nine["verdict"] == "does not hold"
    assert "releases/tag/v1.12.0" in nine["note"]


def _every_value(dtype_name):
    """Every finite value of fp16 or bf16 in [-10, 10], from its bit patterns, as float64."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    if dtype_name == "fp16":
        v = bits.astype(np.uint16).view(np.float16).astype(np.float64)
    else:  # bf16 is the top half of an fp32
        with np.errstate(invalid="ignore"):  # signalling NaN patterns
            v = (bits << 16).view(np.float32).astype(np.float64)
    return np.unique(v[np.isfinite(v) & (np.abs(v) <= 10)])


def _ulp(v, precision, min_exponent):
    """The spacing of a binary format with `precision` bits at the exact value v (subnormal spacing below)."""
    exponent = np.array([math.frexp(abs(a))[1] - 1 if a else min_exponent for a in v])
    return np.ldexp(1.0, np.maximum(exponent, min_exponent) - (precision - 1))


@pytest.mark.parametrize("dtype_name, precision, min_exponent", [("fp16", 11, -14), ("bf16", 8, -126)])
def test_tanh_approximation_in_fp16_and_bf16_against_every_value_of_the_format(
    rows, dtype_name, precision, min_exponent
):
    x = _every_value(dtype_name)
    exact = np.array([0.5 * a * math.erfc(-a / math.sqrt(2)) for a in x])
    approx = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    ulps = np.abs(approx - exact) / _ulp(exact, precision, min_exponent)
    measured = rows[13]["measured_values"]
    assert measured[f"{dtype_name}_max_ulp"] == pytest.approx(ulps.max(), rel=1e-6)
    assert measured[f"{dtype_name}_at_x"] == x[np.argmax(ulps)]
    assert measured[f"{dtype_name}_max_ulp_x>0"] == pytest.approx(ulps[x > 0].max(), rel=1e-6)
    assert ulps.max() > 100 and ulps[x > 0].max() < 0.5  # hundreds of ulps off for x < 0; hidden for x > 0
    assert rows[13]["parts"][f"{dtype_name}_max_ulp"] == "does not hold"
    assert rows[13]["verdict"] == "does not hold"


# ---- the placement claim: numbers a benchmark recorded --------------------------------------------------


@pytest.mark.parametrize(
    "untrained, final, diverged, expected",
    [
        (4.2, 2.5, False, False),  # learned something
        (4.2, 4.2, False, True),  # no better than untrained
        (4.2, 4.5, False, True),
        (4.2, None, True, True),  # diverged
        (4.2, 2.5, True, True),  # diverged by blow-up after a good start still counts as diverged
        (4.2, float("nan"), False, True),
    ],
)
def test_failed_completely(untrained, final, diverged, expected):
    assert cl.failed_completely(untrained, final, diverged) is expected


def placement_runs(before_norm_final, diverged=(False, False, False)):
    untrained = [4.2, 4.3, 4.25]
    return {
        "ffn": {
            "untrained": untrained,
            "final": [2.5, 2.6, 2.55],
            "diverged": [False] * 3,
            "mean_ci": [2.55, 2.4, 2.7],
        },
        "before_norm": {
            "untrained": untrained,
            "final": list(before_norm_final),
            "diverged": list(diverged),
            "mean_ci": [None, None, None],
        },  # fmt: skip
    }


def test_placement_fails_only_when_every_seed_fails():
    runs = placement_runs([4.3, None, 4.3], diverged=(False, True, False))
    measured = cl.measure_recorded_placement("before_norm", runs)
    assert measured["fails"] is True and measured["failed_seeds"] == "3/3"
    assert measured["before_norm_loss"] == "diverged" and measured["ffn_loss"] == "2.550 [2.400, 2.700]"
    assert measured["untrained_loss"] == pytest.approx(4.25)
    runs = placement_runs([4.3, 2.9, 4.3])  # one seed learned: training did not fail completely
    assert cl.measure_recorded_placement("before_norm", runs)["failed_seeds"] == "2/3"
    assert cl.measure_recorded_placement("before_norm", runs)["fails"] is False
    with pytest.raises(ValueError, match="no recorded runs at 'after_residual'; recorded: ffn, before_norm"):
        cl.measure_recorded_placement("after_residual", runs)


def test_placement_claim_row_reports_its_recorded_numbers():
    from ffnlab.study.stats import mean_ci

    (claim,) = [c for c in cl.load_claims() if c["measure"] == "recorded_placement"]
    assert claim["args"]["position"] == "before_norm"
    runs = claim["args"]["runs"]
    assert set(runs) == {"ffn", "before_norm", "after_residual"}
    for r in runs.values():  # the recorded CIs are the finished seeds' (the benchmark's mean_ci)
        assert len(r["untrained"]) == len(r["final"]) == len(r["diverged"]) >= 3
        m = mean_ci([f for f in r["final"] if f is not None])
        assert r["mean_ci"] == pytest.approx([m.mean, m.ci_low, m.ci_high], abs=1e-4)  # recorded to 4 decimals
    row = cl.run_claim(claim)
    assert row["verdict"] in ("holds", "does not hold")
    assert "before_norm_loss=" in row["measured"] and "after_residual_loss=" in row["measured"]
    assert (row["verdict"] == "holds") == row["measured_values"]["fails"]
