import json

import pytest
import torch
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


def test_claims_table_and_certain_verdicts():
    rows = {r["id"]: r for r in cl.run_claims()}
    for r in rows.values():
        assert {"id", "claim", "source", "claimed", "measured", "verdict"} <= set(r)
        assert r["verdict"] in cl.VERDICTS
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
    assert rows[9]["verdict"] == "not measurable here"
    assert rows[9]["measured_values"]["installed_default"] == "none"
    # 7: std of GELU(Z), sampled here, against the quadrature in the library
    z = torch.randn(1 << 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert rows[7]["measured_values"]["std_reduction"] == pytest.approx(
        1 - torch.nn.functional.gelu(z).std().item(), abs=3e-3
    )


def test_relu_quantises_without_a_lookup_table():
    rows = {r["id"]: r for r in cl.run_claims()}
    relu = rows[10]
    assert relu["measured_values"] == {"table_bytes": 0, "max_step_err": 0.0}
    assert relu["verdict"] == "holds"
    assert cl.measure_int8_activation("gelu_lut")["table_bytes"] == 256


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
