"""`ffnlab deploy` (ffnlab.commands.cmd_deploy): fresh models for cost, a store's trained runs with deploy.json
beside the store, and the bad inputs that end in one line and leave nothing behind."""

import inspect
import json
import os

import pytest

from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.study.deployment import load_deployment
from ffnlab.study.execute import execute
from ffnlab.tools.deploy import PRECISIONS, RUNTIMES, DeployResult, run_deploy

pytest.importorskip("torchao")

# the timing settings of every command here: one timed call on one thread, eager only, no roofline
FAST = ["--batch", 2, "--repeats", 1, "--warmup", 0, "--threads", 1, "--no-roofline", "--runtimes", "eager"]
TINY = ["--d-model", 32, "--n-layers", 1, "--n-heads", 2, "--context", 16, "--vocab-size", 64]


def strict_json(text: str):
    """`text` as JSON, refusing NaN and Infinity (what --json promises)."""
    return json.loads(text, parse_constant=lambda word: pytest.fail(f"non-strict JSON: {word}"))


def one_line(code, err):
    return code == 2 and err.count("\n") == 1 and err.startswith("ffnlab: error: ") and "Traceback" not in err


def test_fresh_models_print_a_table_and_their_rows_as_json(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written beside the cwd shows up here
    code, out, err = run_cli("deploy", "--ffn", "gelu,relu", *TINY, *FAST, "--precisions", "fp32,int8")
    assert code == 0, err
    assert "ffnlab deploy: fresh model; d_model 32, 1 layers" in out and "1 threads" in out
    lines = [line.split() for line in out.splitlines()]
    assert [line[:3] for line in lines if line[:1] in (["gelu"], ["relu"])] == [
        [ffn, precision, "eager"] for ffn in ("gelu", "relu") for precision in ("fp32", "int8", "int8")
    ]
    assert os.listdir(tmp_path) == []

    code, out, err = run_cli(
        "deploy", "--ffn", "relu", *TINY, *FAST, "--precisions", "fp32", "--json", "--out", "d.json"
    )
    assert code == 0 and err == "", err
    printed = strict_json(out)
    assert [(r["ffn"], r["precision"], r["runtime"]) for r in printed["rows"]] == [("relu", "fp32", "eager")]
    assert printed["rows"][0]["latency"]["threads"] == 1 and printed["setup"]["repeats"] == 1
    assert printed["source"] == "fresh model" and printed["model"]["d_model"] == 32
    assert strict_json((tmp_path / "d.json").read_text()) == printed
    assert DeployResult.from_json(printed).rows[0].latency.batch == 1
    assert os.listdir(tmp_path) == ["d.json"]


def trained_config(ffn: str) -> TrainConfig:
    model = ModelConfig(ffn=ffn, n_layers=1, n_heads=2, d_model=32, context=16)
    return TrainConfig(model=model, seed=0, batch_size=4, max_steps=4, eval_every=4, eval_batches=1,
                       final_eval_batches=1, warmup_steps=1, precision="fp32")  # fmt: skip


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory):
    """gelu and relu trained a few steps, their weights saved beside the store (as `compare` saves them)."""
    path = tmp_path_factory.mktemp("trained") / "store.db"
    for ffn in ("gelu", "relu"):
        assert execute(trained_config(ffn).to_dict(), str(path)) == "finished"
    return path


def test_a_stores_runs_are_measured_and_written_beside_it(run_cli, trained_store, tmp_path):
    code, out, err = run_cli("deploy", "--store", trained_store, *FAST, "--precisions", "fp32,int8")
    assert code == 0, err
    written = trained_store.parent / "deploy.json"
    assert f"deployment: {written}" in out and "val loss" in out
    saved = load_deployment(trained_store)
    assert saved.source == f"store {trained_store}"
    rows = [(r.ffn, r.target.label()) for r in saved.rows]
    assert rows == [(ffn, label) for ffn in ("gelu", "relu")
                    for label in ("fp32/eager", "int8/eager/int8-dynamic", "int8/eager/int8-weight")]  # fmt: skip
    assert all(r.quality.seeds == [0] for r in saved.rows)

    # --ffn picks the store's variants; --json prints only JSON, and where deploy.json is on stderr
    out_file = tmp_path / "d.json"
    code, out, err = run_cli("deploy", "--store", trained_store, "--ffn", "relu", *FAST, "--precisions", "fp32",
                             "--json", "--out", out_file)  # fmt: skip
    assert code == 0 and err == f"deployment: {written} (the report and advise --store read it)\n", err
    printed = strict_json(out)
    assert [r["ffn"] for r in printed["rows"]] == ["relu"] and printed["rows"][0]["quality"]["val_loss"] > 0
    assert strict_json(out_file.read_text()) == printed == strict_json(written.read_text())


def store_without_weights(folder):
    from ffnlab.study.plan import run_id
    from ffnlab.study.store import Store
    from tests.conftest import run_result

    cfg = trained_config("relu")
    with Store(folder / "s.db") as s:
        s.claim(run_id(cfg), cfg.to_dict())
        s.start(run_id(cfg))
        s.finish(run_id(cfg), run_result(ffn="relu", config=cfg.to_dict()))
    return folder / "s.db"


@pytest.mark.parametrize(
    "argv,needle",
    [
        ([], "(--store STORE) or fresh models (--ffn gelu,relu)"),
        (["--ffn", "gelu", "--precisions", "fp8"], "unknown precision 'fp8' (did you mean 'fp32'?); valid: fp32,"),
        (["--ffn", "gelu", "--runtimes", "tensorrt"], "unknown runtime 'tensorrt'; valid: eager, compile, onnxruntime"),
        (["--ffn", "gelx"], "unknown FFN variant 'gelx'"),
        (["--ffn", "gelu", "--d-model", 2**20, "--n-layers", 64], "need at least"),
        (["--ffn", "gelu", "--seq", 17], "seq must be between 1 and the model's context 16"),
        (["--ffn", "gelu", "--warmup", -1], "warmup >= 0"),
        (["--ffn", "gelu", "--onnx-dir", "FILE"], "--onnx-dir FILE is a file; give a folder"),
        (["--ffn", "gelu", "--out", "."], "is a folder; give a file name"),
        (["--store", "missing.db"], "no run store at missing.db"),
        (["--store", "NOWEIGHTS", "--d-model", 64], "--d-model sizes a fresh model; the runs of --store"),
        (["--store", "NOWEIGHTS"], "has no saved weights for run"),
        (["--store", "NOWEIGHTS", "--ffn", "gelu"], "holds no finished runs of those variants"),
        (["--store", "NOWEIGHTS", "--runtimes", "tflite"], "unknown runtime 'tflite'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(run_cli, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("")
    before = {"FILE"}
    if "NOWEIGHTS" in argv:
        store_without_weights(tmp_path)
        before |= {"s.db"}
    argv = [str(tmp_path / "s.db") if a == "NOWEIGHTS" else a for a in argv]
    sizes = [] if "--store" in argv else TINY  # the flags under test come last and win
    code, _, err = run_cli("deploy", *sizes, *FAST, "--onnx-dir", "onnx", *argv)
    assert one_line(code, err) and needle in err, err
    assert set(os.listdir(tmp_path)) == before


def test_the_help_states_the_librarys_choices_and_defaults():
    from ffnlab.cli import build_parser
    from ffnlab.tools.numerics import VALID_DTYPES

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    helps = {a.dest: a.help for a in commands["deploy"]._actions}
    assert f"comma-separated: {', '.join(PRECISIONS)}" in helps["precisions"]
    assert f"comma-separated: {', '.join(RUNTIMES)} (default: all)" in helps["runtimes"]
    defaults = inspect.signature(run_deploy).parameters
    for name in ("batch", "repeats", "warmup"):
        assert f"(default {defaults[name].default})" in helps[name]
    numerics = {a.dest: a.help for a in commands["numerics"]._actions}
    assert numerics["dtypes"] == f"comma-separated: {', '.join(VALID_DTYPES)}"
