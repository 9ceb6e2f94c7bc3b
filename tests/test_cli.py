import json
import subprocess
import sys

import pytest

from ffnlab.activations import ACTIVATIONS
from ffnlab.ffn import FFNS


def test_list_json_has_every_entry(run_cli):
    code, out, err = run_cli("list", "--json", "--d-model", 256)
    assert code == 0 and err == ""
    rows = json.loads(out)
    names = {(r["name"], r["kind"]) for r in rows}
    assert {(n, "activation") for n in ACTIVATIONS} <= names
    assert {(n, "ffn") for n in FFNS} <= names
    for r in rows:
        assert {"name", "kind", "gated", "aliases", "formula"} <= set(r)
    swiglu = next(r for r in rows if r["name"] == "swiglu")
    assert swiglu["gated"] and swiglu["params"] == 3 * 256 * swiglu["d_ff"]
    assert next(r for r in rows if r["name"] == "gelu_tanh")["aliases"] == [
        "gelu_accurate", "gelu_fast", "gelu_new", "gelu_pytorch_tanh"]


def test_list_table(run_cli):
    code, out, _ = run_cli("list")
    assert code == 0
    assert "swiglu" in out and "W_down(silu(W_gate x) * W_up x)" in out and "gelu_new" in out


@pytest.mark.parametrize("argv,needle", [
    (["list", "--d-model", "0"], "must be positive"),
    (["list", "--d-model", "abc"], "positive integer"),
    (["nosuchcommand"], "invalid choice"),
])
def test_bad_input_one_line_exit_2(run_cli, argv, needle):
    code, out, err = run_cli(*argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_console_script_exit_code():
    proc = subprocess.run([sys.executable, "-m", "ffnlab.cli", "list", "--d-model", "-3"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("ffnlab: error:")
