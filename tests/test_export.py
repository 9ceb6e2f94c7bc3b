import json
import os

import pytest
import torch
from torch import nn

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from ffnlab.core.ffn import FFNS, build_ffn  # noqa: E402
from ffnlab.core.model import ModelConfig, Transformer  # noqa: E402
from ffnlab.tools.export import ATOL, RTOL, describe_activations, export_onnx  # noqa: E402
from tests.conftest import not_a_file, within  # noqa: E402

VARIANTS = list(FFNS) + ["mix:gelu+silu"]
D_MODEL = 16


class AllVariants(nn.Module):
    """Every FFN variant side by side, outputs stacked: one export instead of ~24 (each costs ~1 s)."""

    def __init__(self, names, d_model):
        super().__init__()
        self.ffns = nn.ModuleList(build_ffn(n, d_model) for n in names)

    def forward(self, x):
        return torch.stack([ffn(x) for ffn in self.ffns])


def run_onnx(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


@pytest.fixture(scope="module")
def all_variants(tmp_path_factory):
    torch.manual_seed(0)
    module = AllVariants(VARIANTS, D_MODEL).eval()
    path = tmp_path_factory.mktemp("onnx") / "all.onnx"
    x = torch.randn(2, 5, D_MODEL)
    report = export_onnx(module, x, path)
    other = torch.randn(3, 7, D_MODEL)  # batch and sequence axes are dynamic
    with torch.no_grad():
        return report, {"x": (run_onnx(path, x), module(x)), "other": (run_onnx(path, other), module(other))}


@pytest.mark.parametrize("i, name", list(enumerate(VARIANTS)))
def test_onnx_parity_for_every_variant(all_variants, i, name):
    report, outputs = all_variants
    assert report["exporter"] == "dynamo" and report["fallback"] is None
    for got, expected in outputs.values():
        tol = ATOL + RTOL * expected[i].abs().max().item()
        assert (got[i] - expected[i]).abs().max().item() <= tol, name


def test_report_states_tolerance_and_finds_gelu_ops(all_variants):
    report, _ = all_variants
    assert report["max_abs_diff"] <= report["tol"] and report["opset"] == 20
    ops = {(d["op"], d.get("approximate")) for d in report["activations"]}
    assert {("Gelu", "none"), ("Gelu", "tanh"), ("Sigmoid", None), ("Relu", None), ("Mish", None)} <= ops
    # only FFN math: no weights' MatMul, nor the stack that gathers the outputs
    assert not {"MatMul", "Concat", "Unsqueeze"} & {d["op"] for d in report["activations"]}
    assert "Gelu(approximate=tanh)" in report["summary"]


@pytest.mark.parametrize(
    "name, opset, dynamo, expected",
    [
        ("gelu", 18, True, ["Div", "Erf", "Add", "Mul", "Mul"]),  # decomposed below opset 20
        ("gelu_tanh", 18, True, "Tanh"),
        ("gelu", 20, False, ("Gelu", "none")),  # TorchScript exporter: no module record, non-linear ops only
        ("gelu_tanh", 20, False, ("Gelu", "tanh")),
    ],
)
def test_describe_activations_gelu_forms(tmp_path, name, opset, dynamo, expected):
    report = export_onnx(
        build_ffn(name, D_MODEL), torch.randn(2, 3, D_MODEL), tmp_path / "f.onnx", opset=opset, dynamo=dynamo
    )
    described = describe_activations(tmp_path / "f.onnx")
    assert described == report["activations"]
    ops = [d["op"] for d in described]
    if isinstance(expected, list):
        assert sorted(ops) == sorted(expected)
    elif isinstance(expected, tuple):
        assert [(d["op"], d.get("approximate")) for d in described] == [expected]
    else:
        assert expected in ops and "Erf" not in ops and "Gelu" not in ops


@pytest.mark.slow  # ~3-5 s: torch.export of a whole model with symbolic shapes
def test_small_transformer_exports_with_dynamic_sequence(tmp_path):
    model = Transformer(
        ModelConfig(n_layers=1, d_model=32, n_heads=2, context=16, ffn="swiglu", pos="rope", norm="rmsnorm")
    ).eval()
    idx = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    report = export_onnx(model, idx, tmp_path / "small.onnx")  # forward returns (logits, None)
    assert report["max_abs_diff"] <= report["tol"]
    ops = [d["op"] for d in report["activations"]]
    assert "Sigmoid" in ops and "Pow" not in ops  # RMSNorm's pow is not FFN math
    short = idx[:1, :9]
    with torch.no_grad():
        torch.testing.assert_close(run_onnx(tmp_path / "small.onnx", short), model(short)[0], rtol=RTOL, atol=ATOL)


class DataDependent(nn.Module):
    """Python control flow on a tensor value: torch.export refuses it, TorchScript traces one branch."""

    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1


def test_falls_back_to_torchscript_and_says_why(tmp_path):
    x = torch.ones(2, 3)
    module = DataDependent().train()
    report = export_onnx(module, x, tmp_path / "dd.onnx")
    assert module.training  # exported in eval mode, handed back as it came
    assert report["exporter"] == "torchscript" and report["fallback"].startswith("TorchExportError")
    assert torch.equal(run_onnx(tmp_path / "dd.onnx", x), x * 2)


class NaNOut(nn.Module):
    def forward(self, x):
        return x * float("nan")


def test_failed_check_leaves_nothing_written(tmp_path):
    out = tmp_path / "out.onnx"
    out.write_text("previous")
    with pytest.raises(ValueError, match="differs from PyTorch.*nothing written"):
        export_onnx(NaNOut(), torch.ones(2, 3), out, dynamo=False)
    assert out.read_text() == "previous" and os.listdir(tmp_path) == ["out.onnx"]


# ---- CLI ----------------------------------------------------------------------------------------


def test_cli_export_ffn(run_cli, tmp_path):
    out = tmp_path / "swiglu.onnx"
    code, stdout, stderr = run_cli("export", "--ffn", "swiglu", "--d-model", D_MODEL, "--out", out)
    assert code == 0, stderr
    assert out.exists() and oct(out.stat().st_mode)[-3:] != "600"
    assert "dynamo exporter" in stdout and "Sigmoid x1, Mul x2" in stdout
    assert "max |onnx - torch| =" in stdout and "tolerance" in stdout
    graph = next(line for line in stdout.splitlines() if line.startswith("graph: ")).split()[1:]
    assert sorted(graph) == ["MatMul", "MatMul", "MatMul", "Mul", "Mul", "Sigmoid"]


def test_cli_export_small_model_json(run_cli, tmp_path):
    out = tmp_path / "small.onnx"
    code, stdout, stderr = run_cli(
        "export", "--ffn", "gelu_tanh", "--model", "small", "--d-model", 32, "--n-layers", 1, "--out", out, "--json"
    )
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["model"] == "small" and report["d_model"] == 32 and report["input_shape"] == [2, 16]
    assert [(d["op"], d.get("approximate")) for d in report["activations"]] == [("Gelu", "tanh")]
    assert report["max_abs_diff"] <= report["tol"] and out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ffn", "swigl"], "unknown FFN variant 'swigl' (did you mean 'swiglu'?)"),
        (["--ffn", "gelu", "--model", "big"], "unknown model 'big'; valid: ffn, small, or a Hugging Face config.json"),
        (["--ffn", "gelu", "--model", "BAD"], "cannot parse Hugging Face config"),
        (["--ffn", "gelu", "--out", "/nonexistent-dir/x.onnx"], "the folder /nonexistent-dir does not exist"),
        (["--ffn", "gelu", "--opset", "999"], "unsupported ONNX opset 999; valid: 7-"),
        (["--ffn", "gelu", "--out", "FOLDER"], "is a folder"),
        (["--ffn", "gelu", "--d-model", "100000000"], "more than the 2 GiB one ONNX file holds"),  # was exit 1
        (["--ffn", "gelu", "--d-model", "10000000000000"], "the model's sizes overflow"),
        (["--ffn", "swiglu", "--model", "small", "--d-model", "1048576"], "more than the 2 GiB"),
    ],
)
def test_cli_export_bad_input_is_one_line_exit_2(run_cli, tmp_path, args, message):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama",')
    args = [str(bad) if a == "BAD" else str(tmp_path) if a == "FOLDER" else a for a in args]
    if "--out" not in args:
        args += ["--out", tmp_path / "x.onnx"]
    code, stdout, stderr = run_cli("export", *args)
    assert code == 2 and stdout == ""
    assert stderr.startswith("ffnlab: error: ") and message in stderr and stderr.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["bad.json"]


@pytest.mark.parametrize("kind", ["fifo", "link", "device"])
def test_export_model_that_is_no_regular_file_is_refused_by_its_kind(run_cli, tmp_path, kind):
    path, message = not_a_file(tmp_path, kind)  # a FIFO blocked, /dev/zero was read without end
    argv = ["export", "--ffn", "gelu", "--model", path, "--out", tmp_path / "x.onnx"]
    code, _, err = within(30, lambda: run_cli(*argv))
    assert code == 2 and err == f"ffnlab: error: the Hugging Face config {path} {message}\n"


def test_cli_export_on_a_full_disk_is_one_line_exit_2_and_leaves_the_old_file(run_cli, tmp_path, monkeypatch):
    import errno

    from ffnlab.tools import export

    def full_disk(module, example, path, *args):
        with open(path, "wb") as f:
            f.write(b"half a model")
            raise OSError(errno.ENOSPC, "No space left on device")  # as the exporter's write raises it: no file name

    monkeypatch.setattr(export, "_export", full_disk)
    out = tmp_path / "g.onnx"
    out.write_text("previous")
    code, stdout, stderr = run_cli("export", "--ffn", "gelu", "--d-model", D_MODEL, "--out", out)
    assert code == 2 and stderr == f"ffnlab: error: no space left on device writing {out}\n"  # was exit 1
    assert out.read_text() == "previous" and os.listdir(tmp_path) == ["g.onnx"]


def test_cli_export_writes_the_opset_it_reports(run_cli, tmp_path):
    import onnx

    out = tmp_path / "g.onnx"
    code, stdout, stderr = run_cli(
        "export", "--ffn", "geglu", "--d-model", D_MODEL, "--opset", 12, "--out", out, "--json"
    )
    assert code == 0, stderr
    report = json.loads(stdout)
    declared = {o.domain: o.version for o in onnx.load(out).opset_import}
    assert report["opset"] == 12 and declared.get("", declared.get("ai.onnx")) == 12


def test_sigterm_mid_export_leaves_no_temporary_file(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "m.onnx"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ffnlab.cli", "export", "--ffn", "swiglu", "--model", "small", "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not list(tmp_path.glob(".m.onnx.*.tmp")):
        assert proc.poll() is None and time.time() < deadline, "the export never started writing"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
