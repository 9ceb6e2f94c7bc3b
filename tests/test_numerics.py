import json
import math

import numpy as np
import pytest
import torch

from ffnlab.tools import claims as cl
from ffnlab.tools import numerics as nm
from ffnlab.tools.int8 import measure_int8

# ---- run_numerics and the CLI ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"names": "gelux"}, "did you mean 'gelu'"),
        ({"names": ""}, "no activation"),
        ({"dtypes": "fp8"}, "unknown dtype"),
        ({"dtypes": ""}, "no dtype"),
        ({"lo": 5, "hi": 5}, "empty or reversed"),
        ({"lo": 10, "hi": -10}, "empty or reversed"),
        ({"lo": -math.inf, "hi": 1}, "finite"),
        ({"lo": -1e308, "hi": 1e308}, "HI - LO overflows"),
        ({"points": 1}, "at least 2"),
    ],
)
def test_bad_input_is_one_line_value_error(kwargs, needle):
    with pytest.raises(ValueError, match=needle) as e:
        nm.run_numerics(**{"names": "relu", **kwargs})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["a,b", "1", "", "1,2,3", "-10;10"])
def test_malformed_range(text):
    with pytest.raises(ValueError, match="LO,HI"):
        nm.parse_range(text)


def test_to_json_has_no_nan_or_infinity_literals():
    text = nm.to_json({"a": math.inf, "b": [math.nan, -math.inf, np.float32(1.5)], "c": np.int64(3)})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"literal {c}")) == {
        "a": "inf",
        "b": ["nan", "-inf", 1.5],
        "c": 3,
    }


@pytest.mark.slow
def test_cli_json(run_cli):
    code, out, err = run_cli(
        "numerics", "gelu,gelu_tanh,relu", "--dtypes", "fp32,fp16", "--range", "-10,10", "--points", 2001, "--json"
    )
    assert code == 0 and err == ""
    report = json.loads(out, parse_constant=lambda c: pytest.fail(f"literal {c}"))
    assert {"results", "claims", "gelu_distance", "tail", "gated"} <= set(report)
    assert len(report["results"]) == 3 * 2 * 2
    for r in report["results"]:
        assert {
            "name",
            "dtype",
            "pass",
            "max_abs_err",
            "argmax_x",
            "max_rel_err",
            "max_ulp",
            "n_inf",
            "n_nan",
            "n_overflow",
            "regions",
        } <= set(r)
    assert [d["name"] for d in report["gelu_distance"]] == ["gelu_tanh"]
    assert {"id", "claim", "source", "claimed", "measured", "verdict"} <= set(report["claims"][0])
    assert {g["dtype"] for g in report["gated"]} == {"fp16"}


def test_cli_text(run_cli):
    code, out, _ = run_cli("numerics", "relu", "--dtypes", "bf16", "--range", "-3,3", "--no-claims")
    assert code == 0
    assert "relu" in out and "bf16" in out and "negative tail" in out and "Gated products" in out
    assert "Claims" not in out
    isa = torch.backends.cpu.get_cpu_capability()
    assert f"(torch kernels: {isa})" in out  # the ULPs above are this machine's: say which kernels made them


def test_text_gives_a_claim_read_two_ways_a_verdict_per_reading():
    report = nm.run_numerics("relu", "fp32", -1, 1, points=11, claims=False)
    report["claims"] = [cl.run_claim(c) for c in cl.load_claims() if c["id"] in (2, 9)]
    text = nm.format_numerics(report)
    verdicts = [line.split("  (")[0] for line in text.splitlines() if line.startswith("   -> ")]
    assert verdicts == ["   -> HOLDS for x < -2.5; DOES NOT HOLD for x > 2.5", "   -> DOES NOT HOLD"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["numerics", "relux"], "did you mean 'relu'"),
        (["numerics", "--dtypes", "fp64"], "unknown dtype"),
        (["numerics", "--range", "10,-10"], "empty or reversed"),
        (["numerics", "--range", "1,x"], "LO,HI"),
    ],
)
def test_cli_bad_input_exit_2(run_cli, argv, needle):
    code, out, err = run_cli(*argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and out == ""


# ---- int8 ---------------------------------------------------------------------------------------------


def test_int8_rows_are_the_int8_implementations_of_the_named_activations():
    report = nm.run_numerics("gelu,relu,silu", "int8", -4, 4, points=101, claims=False)
    assert report["results"] == [] and report["gated"] == []
    rows = {r["name"]: r for r in report["int8"]}
    assert list(rows) == ["gelu_lut", "i_gelu", "relu_int8"]  # silu has none
    for name, row in rows.items():
        assert row == measure_int8(name, -4.0, 4.0)
    assert rows["relu_int8"]["max_abs_err"] == 0 and rows["gelu_lut"]["max_ulp"] <= 0.5
    assert "int8 input and output" in nm.format_numerics(report)


def test_int8_is_a_valid_dtype_and_named_when_one_is_unknown():
    assert nm.parse_dtypes("fp32,int8") == ["fp32", "int8"]
    with pytest.raises(ValueError, match="valid: fp32, fp16, bf16, int8"):
        nm.parse_dtypes("int4")


def test_cli_int8(run_cli):
    code, out, err = run_cli("numerics", "gelu,hardswish", "--dtypes", "int8", "--no-claims", "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert [r["name"] for r in report["int8"]] == ["gelu_lut", "i_gelu", "hardswish_int8"]
    assert all(r["dtype"] == "int8" and r["scale_in"] == pytest.approx(10 / 127) for r in report["int8"])


def test_activations_that_read_their_channel_or_the_batch_are_measured_and_say_how():
    names = "quantile,energy_gated,split_gelu_tanh,exponential"
    report = nm.run_numerics(names, "fp32,bf16,int8", -10, 10, points=2001, claims=False)
    rows = report["results"]
    assert [(r["name"], r["dtype"]) for r in rows[::2]] == [(n, d) for d in ("fp32", "bf16") for n in names.split(",")]
    assert report["int8"] == []  # no int8 implementation of any of them
    for r in rows:
        assert r["n_nan"] == r["n_inf"] == 0 and math.isfinite(r["max_abs_err"])
        assert (r["note"] is None) == (r["name"] in ("energy_gated", "exponential"))
    quantile = next(r for r in rows if r["name"] == "quantile" and r["dtype"] == "bf16" and r["pass"] == "forward")
    assert quantile["note"].startswith("batch-dependent") and quantile["max_ulp"] <= 0.51  # fp32 inside, one rounding
    text = nm.format_numerics(report)
    assert "note: quantile is batch-dependent" in text and "note: split_gelu_tanh is channel-dependent" in text
