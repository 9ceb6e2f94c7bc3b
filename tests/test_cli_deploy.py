"""`ffnlab deploy` (ffnlab.commands.cmd_deploy): fresh models for cost, a store's trained runs with deploy.json
beside the store, and the bad inputs that end in one line and leave nothing behind."""

import inspect
import json
import os
import random
import shutil
from dataclasses import replace

import pytest
import torch

from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.study.deployment import load_deployment
from ffnlab.study.execute import execute, weights_path
from ffnlab.study.store import Store
from ffnlab.tools.deploy import PRECISIONS, RUNTIMES, DeployResult, run_deploy
from tests.conftest import within

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
    # progress on stderr: a line per row set up, then the rounds that time them all in turns
    assert "deploy: gelu fp32/eager: set up in " in err and "(6/6)" in err and "deploy: timed round 1/1 (" in err
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


def store_without_weights(folder, qat_from=None):
    from ffnlab.study.plan import run_id
    from ffnlab.study.store import Store
    from tests.conftest import run_result

    cfg = replace(trained_config("relu"), qat_from=qat_from)
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
        (
            ["--ffn", "gelu", "--precisions", "fp32,int8,fp32"],
            "precision fp32 is given twice; name each precision once",
        ),
        (["--store", "NOWEIGHTS", "--precisions", "int8,int8"], "precision int8 is given twice"),
        (["--ffn", "gelu", "--threads", 100000], "threads must be between 1 and "),
        (["--store", "NOWEIGHTS", "--threads", 100000], "threads must be between 1 and "),
        (["--store", "QATONLY"], "holds QAT runs (qat_from) of relu but no plain runs of it, which deploy pairs them"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(run_cli, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail(f"{n} threads set"))  # libgomp would end us
    (tmp_path / "FILE").write_text("")
    before = {"FILE"}
    if "NOWEIGHTS" in argv or "QATONLY" in argv:
        store_without_weights(tmp_path, qat_from=0.5 if "QATONLY" in argv else None)
        before |= {"s.db"}
    argv = [str(tmp_path / "s.db") if a in ("NOWEIGHTS", "QATONLY") else a for a in argv]
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


def damage(raw: bytes, form: str) -> bytes:
    """A run's safetensors weights damaged in one of the ways a file on disk can be."""
    from safetensors.torch import load, save

    size = int.from_bytes(raw[:8], "little")
    header, body = json.loads(raw[8 : 8 + size]), raw[8 + size :]
    key = next(
        k for k, v in header.items() if k != "__metadata__" and len(v["shape"]) == 2 and len(set(v["shape"])) == 2
    )
    tensors = load(raw)
    lies = {"shape": {"shape": header[key]["shape"][::-1]}, "offsets": {"data_offsets": [0, 10**9]},
            "dtype": {"dtype": "F64"}}  # fmt: skip
    if form in lies:  # a header that lies about one tensor
        text = json.dumps({**header, key: header[key] | lies[form]}).encode()
        return len(text).to_bytes(8, "little") + text + body
    return {
        "header length 1e18": lambda: (10**18).to_bytes(8, "little") + raw[8:],
        "random bytes": lambda: random.Random(0).randbytes(4096),
        "empty": lambda: b"",
        "truncated": lambda: raw[: len(raw) // 2],
        "missing tensor": lambda: save({k: v for k, v in tensors.items() if k != key}),
        "extra tensor": lambda: save({**tensors, "extra.weight": torch.zeros(3)}),
    }[form]()


FORMS = ["shape", "offsets", "dtype", "header length 1e18", "random bytes", "empty", "truncated", "missing tensor",
         "extra tensor"]  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
def test_damaged_weights_are_one_line_naming_the_file(run_cli, trained_store, tmp_path, form):
    store = tmp_path / "store.db"
    shutil.copy(trained_store, store)
    shutil.copytree(trained_store.parent / "weights", tmp_path / "weights")
    with Store(store, create=False) as s:
        first = next(r for r in s.runs("finished") if r.config["model"]["ffn"] == "relu")
    path = weights_path(store, first.id)
    path.write_bytes(damage(path.read_bytes(), form))
    code, out, err = run_cli("deploy", "--store", store, *FAST, "--precisions", "fp32")
    assert one_line(code, err) and f"the weights of run {first.id} (relu, seed 0) {path} cannot be loaded" in err, err
    assert not (tmp_path / "deploy.json").exists()


@pytest.mark.parametrize("kind", ["FIFO", "device", "folder"])
def test_an_onnx_file_that_is_no_regular_file_is_refused_before_any_work(run_cli, tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "onnx").mkdir()
    graph = tmp_path / "onnx" / "gelu.ort-int8-dynamic.onnx"
    {"FIFO": lambda: os.mkfifo(graph), "device": lambda: graph.symlink_to("/dev/null"), "folder": graph.mkdir}[kind]()
    monkeypatch.setattr("ffnlab.tools.deploy.Transformer", lambda *a: pytest.fail("a model was built"))
    argv = ["deploy", "--ffn", "gelu", *TINY, *FAST, "--precisions", "fp32,int8", "--runtimes", "eager,onnxruntime"]
    code, _, err = within(60, lambda: run_cli(*argv, "--onnx-dir", "onnx"))  # a FIFO written through would block
    needle = {"FIFO": "it is a FIFO or a terminal", "device": "it is a character device", "folder": "is a folder"}[kind]
    assert one_line(code, err) and "onnx/gelu.ort-int8-dynamic.onnx" in err and needle in err, err
    assert sorted(os.listdir(tmp_path / "onnx")) == ["gelu.ort-int8-dynamic.onnx"]


@pytest.mark.slow  # exports a model to ONNX (seconds)
def test_an_onnx_file_left_from_before_is_written_again_not_run(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "relu.onnx").write_bytes(b"another model's graph")
    code, out, err = run_cli("deploy", "--ffn", "relu", *TINY, *FAST, "--precisions", "fp32", "--runtimes",
                             "onnxruntime", "--onnx-dir", "onnx", "--json")  # fmt: skip
    assert code == 0, err
    (row,) = strict_json(out)["rows"]
    assert row["reason"] is None and row["throughput"]["tokens_per_s"] > 0
    assert (tmp_path / "onnx" / "relu.onnx").read_bytes() != b"another model's graph"


def trained(tmp_path, model: ModelConfig, data: str = "shakespeare") -> str:
    """A store of gelu and relu trained a few steps on `model`'s task."""
    path = tmp_path / "store.db"
    for ffn in ("gelu", "relu"):
        cfg = replace(trained_config(ffn), model=replace(model, ffn=ffn), data=data)
        assert execute(cfg.to_dict(), str(path)) == "finished"
    return str(path)


@pytest.mark.slow  # trains two ViTs (seconds)
def test_an_image_store_is_measured_on_images(run_cli, tmp_path):
    vit = ModelConfig(task="image", n_layers=1, n_heads=2, d_model=32, patch_size=2)
    store = trained(tmp_path, vit, data="digits")
    code, out, err = run_cli("deploy", "--store", store, *FAST, "--precisions", "fp32,int8")
    assert code == 0, err
    saved = load_deployment(store)
    assert [r.reason for r in saved.rows] == [None] * 6
    assert all(r.latency.seq == 16 and r.throughput.batch == 2 for r in saved.rows)  # 2x2 patches of 8x8 digits
    assert "8x8 images of 2x2-pixel patches" in out and "patches/s" in out and "acc " in out
    code, _, err = run_cli("deploy", "--store", store, *FAST, "--seq", 4)
    assert one_line(code, err) and "an image model's sequence is its patches" in err, err


@pytest.mark.slow  # trains two taggers (seconds)
def test_a_token_task_store_has_span_f1_beside_loss(run_cli, tmp_path):
    store = trained(tmp_path, ModelConfig(task="tokens", n_layers=1, n_heads=2, d_model=32, context=16))
    code, out, err = run_cli("deploy", "--store", store, *FAST, "--precisions", "fp32,int8")
    assert code == 0, err
    saved = load_deployment(store)
    for r in saved.rows:
        assert 0 <= r.quality.val_f1 <= 1 and r.quality.val_f1_delta.n == 1
    assert saved.rows[0].quality.val_f1_delta.delta == 0.0  # fp32 eager against itself
    int8_rows = [line for line in out.splitlines() if line.split()[:2] in (["gelu", "int8"], ["relu", "int8"])]
    assert len(int8_rows) == 4 and all(" F1 " in line for line in int8_rows)


def test_deploy_exits_1_when_no_row_was_measured(run_cli):
    """As compare exits 1 when runs did not finish: a table of reasons alone exited 0."""
    code, out, err = run_cli("deploy", "--ffn", "gelu", "--precisions", "fp16", "--runtimes", "eager", "--d-model", 32,
                             "--n-layers", 1, "--n-heads", 2, "--context", 16, "--repeats", 2)  # fmt: skip
    assert code == 1 and "not measured: fp16 is measured on a GPU" in out
    assert err.splitlines()[-1] == "ffnlab: no row was measured; each row above says why"
