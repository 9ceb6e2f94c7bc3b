"""benchmarks/gpu_check.py: its dry run goes through every step on the CPU; its budget, MFU and limits."""

import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ffnlab.run.config import TrainConfig
from ffnlab.run.presets import PRESETS
from tests.conftest import run_result

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture
def check(monkeypatch):
    """The script as a module (it imports presets_cost from beside it, as it does when run)."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    return importlib.import_module("gpu_check")


@pytest.mark.slow
def test_dry_run_measures_each_variant_of_the_preset_and_ddp_in_two_processes(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.md"]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = record["presets"]
    assert [row["ffn"] for row in rows] == list(PRESETS["gpt2-small"].variants)
    for row in rows:
        assert row["error"] is None and row["nproc"] == 1 and row["steps"] == 3
        assert row["tokens_per_s"] > 0 and row["peak_memory_bytes"] > 0
        assert row["mfu"] == "unknown"  # a CPU has no entry in the peak table
    ddp = record["ddp"]
    assert ddp["run"]["nproc"] == 2  # as the run's own config says
    assert ddp["run"]["tokens_per_s"] > 0 and ddp["one_process_tokens_per_s"] == rows[1]["tokens_per_s"]  # gelu
    assert [step["rc"] for step in record["steps"]] == [0] * 5


def test_steps_past_the_budget_are_skipped_and_say_so(check, tmp_path, capsys):
    assert check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"]) == 1
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    variants = PRESETS["gpt2-small"].variants or ()
    assert [step["name"] for step in record["steps"]] == [*(f"gpt2-small_{ffn}" for ffn in variants), "ddp"]
    assert all(step["rc"] is None and step["skipped"].startswith("skipped: ") for step in record["steps"])
    assert all(row["tokens_per_s"] is None and row["error"].startswith("skipped") for row in record["presets"])
    assert record["ddp"]["run"]["error"].startswith("skipped")


@pytest.mark.parametrize(
    "gpu, peak",
    [("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
     ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("Tesla V100-SXM2-16GB", None), (None, None)],
)  # fmt: skip
def test_peak_by_the_gpus_name(check, gpu, peak):
    assert check.peak_flops(gpu) == peak


def test_mfu_is_training_flops_per_token_times_tokens_per_s_over_the_peak_of_every_gpu(check):
    two = TrainConfig(nproc=2).to_dict()
    result = run_result(config=two, tokens=1000, train_flops=3_000_000_000, tokens_per_s=100_000.0).to_dict()
    assert check.model_flops_utilisation(result, 1e12) == pytest.approx(3e6 * 1e5 / 2e12)
    assert check.model_flops_utilisation(result, None) == "unknown"


def test_peak_memory_is_the_cuda_allocators_where_there_is_one_else_the_counted_bytes(check):
    counted = run_result(config=TrainConfig().to_dict())
    for cuda_peak, expected in [(None, counted.memory.train_mem_bytes), (5 << 30, 5 << 30)]:
        result = {**counted.to_dict(), "cuda_peak_bytes": cuda_peak}  # as the step's `ffnlab train --out` wrote it
        step = check.Step("run", "train", 100, rc=0, result=result)
        assert check.speed_row("gelu", step, None).peak_memory_bytes == expected


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's state from /proc")
def test_a_step_past_its_limit_is_killed_with_the_processes_it_started(check):
    spawner = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "  # not holding the pipes: the wait ends at once
        "print(child.pid, flush=True); time.sleep(60)"
    )
    rc, stdout, _ = check.run_limited([sys.executable, "-c", spawner], 2, {})
    assert rc is None
    child = int(stdout.split()[0])
    for _ in range(50):  # SIGKILL lands within moments; a child left running would sleep for a minute
        state = process_state(child)
        if state in ("gone", "Z", "X"):
            break
        time.sleep(0.1)
    assert state in ("gone", "Z", "X"), f"the step's child {child} is still running ({state})"


def process_state(pid: int) -> str:
    """The process's state letter from /proc (R, S, Z: a zombie, ...), or 'gone'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
