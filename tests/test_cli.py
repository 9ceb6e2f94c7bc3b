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


TINY_TRAIN = ["train", "--layers", 1, "--heads", 2, "--d-model", 32, "--context", 32, "--batch-size", 4, "--steps", 2,
              "--eval-every", 2, "--quiet"]
TINY_COMPARE = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", 3, "--steps", 2, "--eval-every", 2,
                "--jobs", 1, "--quiet"]


def one_line(code, err, want=2):
    return code == want and err.count("\n") == 1 and "Traceback" not in err


def test_outputs_that_name_a_folder_fail_before_the_work(run_cli, tmp_path):
    code, _, err = run_cli(*TINY_TRAIN, "--out", tmp_path)
    assert one_line(code, err) and "is a folder" in err
    code, _, err = run_cli(*TINY_TRAIN, "--out", tmp_path / "no" / "r.json")
    assert one_line(code, err) and "does not exist" in err
    code, _, err = run_cli(*TINY_COMPARE, "--csv", tmp_path, "--store", tmp_path / "s.db")
    assert one_line(code, err) and "is a folder" in err and not (tmp_path / "s.db").exists()
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("store", ["folder", "/proc/ffnlab/s.db", "garbage"])
def test_unusable_stores_are_one_line_errors(run_cli, tmp_path, store):
    if store == "folder":
        path = tmp_path
    elif store == "garbage":
        path = tmp_path / "g.db"
        path.write_bytes(b"this is not sqlite" * 100)
    else:
        path = store
    code, _, err = run_cli(*TINY_COMPARE, "--no-report", "--store", path)
    assert one_line(code, err), err
    code, _, err = run_cli("report", "--store", path)
    assert one_line(code, err), err


def test_a_bug_is_one_line_exit_1_with_the_trace_in_a_file(run_cli, monkeypatch):
    import ffnlab.cli as cli

    def broken(args):
        return 1 / 0

    monkeypatch.setattr(cli, "cmd_list", broken)
    code, _, err = run_cli("list")
    assert one_line(code, err, want=1) and "internal error: ZeroDivisionError" in err
    trace = err.split("full trace in ")[1].rstrip(")\n")
    assert "ZeroDivisionError" in open(trace).read()


def test_report_survives_a_damaged_row_and_a_foreign_weights_file(run_cli, tmp_path):
    import sqlite3

    store = tmp_path / "s.db"
    code, _, err = run_cli(*TINY_COMPARE, "--no-report", "--store", store)
    assert code == 0, err
    with sqlite3.connect(store) as db:
        rid, result = db.execute("select id, result from runs where status='finished' limit 1").fetchone()
        damaged = {k: v for k, v in json.loads(result).items() if k != "final_val_loss"}
        db.execute("update runs set result=? where id=?", (json.dumps(damaged), rid))
    for weights in (tmp_path / "weights").glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    code, out, err = run_cli("report", "--store", store)
    assert code == 0, err
    page = (tmp_path / "report" / "report.html").read_text()
    assert "attention maps skipped: cannot read" in page and "Not finished" in page
