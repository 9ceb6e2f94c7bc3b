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
