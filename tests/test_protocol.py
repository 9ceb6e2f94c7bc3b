import json

from ffnlab.study.report import report_data
from ffnlab.study.store import Store

ARGS = [
    "compare",
    "--protocol",
    "--preset",
    "smoke",
    "--variants",
    "relu,swiglu",
    "--seeds",
    3,
    "--steps",
    6,
    "--eval-every",
    6,
    "--lr-axis",
    "1e-3,3e-3",
    "--warmup-axis",
    2,
    "--context-axis",
    "16,32",
]


def test_protocol_runs_three_stages_shares_runs_and_resumes(run_cli, tmp_path):
    store = tmp_path / "s.db"
    code, out, err = run_cli(*ARGS, "--store", store, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [s["name"] for s in result["stages"]] == ["fixed", "tune", "context"]
    assert result["grid"] == {"lr": [1e-3, 3e-3], "warmup": [2], "context": [16, 32]}
    fixed, tune, context = (s for s in result["stages"])
    # stage 2: each variant's setting is its best validation cell, and it is compared on test
    (tuned,) = tune["tuned"]
    assert tuned["metric"] == "final_test_loss" and tuned["axes"] == {"lr": "tuned", "warmup": "tuned"}
    for row in tuned["variants"]:
        cells = [c for c in tune["cells"] if c["axes"]["warmup"] == row["warmup"]]
        val = {c["axes"]["lr"]: next(r["mean"] for r in c["variants"] if r["ffn"] == row["ffn"]) for c in cells}
        assert row["lr"] == min(val, key=val.get) and result["choice"][row["ffn"]]["lr"] == row["lr"]
    # stage 3: each variant at its own tuned lr, at each context, said so in what was not held equal
    assert [c["axes"] for c in context["cells"]] == [{"context": 16}, {"context": 32}]
    assert context["settings"]["per_variant"] == result["choice"]
    (chosen,) = [how for what, how in context["settings"]["not_equal"] if what == "per-variant settings"]
    assert "by the validation protocol" in chosen and "by the user" not in chosen  # the protocol chose, on validation
    assert all(what != "per-variant settings" for what, _ in fixed["settings"]["not_equal"])
    # runs are shared between stages (stage 3 at context 32 is stage 2's chosen cells): 6 + 12 + 6 distinct
    with Store(store, create=False) as s:
        runs = s.runs()
        assert len(runs) == 6 + 2 * 6 + 6 and all(r.status == "finished" for r in runs)
        attempts = {r.id: r.attempts for r in runs}
    assert json.loads((tmp_path / "protocol.json").read_text())["choice"] == result["choice"]
    # a rerun trains nothing again and gives the same answer
    code, out, err = run_cli(*ARGS, "--store", store, "--json", "--no-report")
    assert code == 0, err
    assert json.loads(out)["choice"] == result["choice"]
    with Store(store, create=False) as s:
        assert {r.id: r.attempts for r in s.runs()} == attempts
    data = report_data(store, attention=False)
    assert [name for name, _ in data.protocol.stages] == ["fixed", "tune", "context"]
    assert "by the validation protocol" in dict(data.settings.not_equal)["per-variant settings"]  # read back later
    assert "Validation protocol" in (tmp_path / "report" / "report.html").read_text()


def test_protocol_refuses_axes_of_its_own(run_cli, tmp_path):
    code, _, err = run_cli(*ARGS, "--depth", "1,2", "--store", tmp_path / "s.db")
    assert code == 2 and "--protocol runs its own" in err and "depth" in err and err.count("\n") == 1
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "report").exists()
