"""One run across processes (ffnlab.run.distributed): two gloo processes on the CPU compute what one process
computes at the same global batch, a killed rank fails the run in one line and a rerun resumes it; a sharded run
(FSDP2) computes and saves what DDP does."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ffnlab.run.config import ModelConfig, TrainConfig
from ffnlab.run.result import RunResult
from ffnlab.run.train import train
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow  # each run with two processes starts two Pythons that import torch

MODEL = ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32)
BASE = TrainConfig(
    model=MODEL,
    batch_size=4,
    eval_batches=2,
    final_eval_batches=2,
    eval_every=2,
    warmup_steps=2,
    threads=1,
    precision="fp32",  # the bar: fp32, where the sums differ only in the order of their terms
)


def test_two_processes_equal_one_process_at_the_same_global_batch():
    one = train(replace(BASE, batch_size=8, max_steps=6))
    two = train(replace(BASE, nproc=2, max_steps=6))
    assert two.config["nproc"] == 2 and two.config["batch_size"] == 4
    assert abs(two.val.loss - one.val.loss) < 1e-5
    assert abs(two.test.loss - one.test.loss) < 1e-5


def test_two_processes_sum_gradients_as_one_process_accumulating_them():
    # the same sums in the same order (each rank's micro-batch, then the average over two), step after step
    accumulated = train(replace(BASE, grad_accum=2, max_steps=6))
    two = train(replace(BASE, nproc=2, max_steps=6))
    assert abs(two.val.loss - accumulated.val.loss) < 1e-6
    curve = [v.loss for v in accumulated.history.val]
    assert [v.loss for v in two.history.val] == pytest.approx(curve, abs=1e-6)
    # a rank that left out its share, or drew another one, would be far off
    alone = train(replace(BASE, max_steps=6))
    assert abs(alone.val.loss - accumulated.val.loss) > 1e-3


def ranks_of(root: int) -> list[int]:
    """The pids of the processes under `root` (children, and theirs) that multiprocessing's spawn started, but its
    resource tracker: the ranks torchrun's launcher started. NOTE: their RANK is set after they start, so
    /proc's environment (the one they started with) does not have it."""
    parent, spawned = {}, []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            spawned.append(int(entry.name))

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == root:
                return True
        return False

    return sorted(pid for pid in spawned if under(pid))


@pytest.mark.parametrize("shard", [(), ("--shard",)], ids=["ddp", "sharded"])
def test_a_killed_rank_fails_the_run_in_one_line_and_a_rerun_resumes_it(tmp_path, shard):
    # sharded: each checkpoint is gathered whole from the shards, and the rerun shards what it loads again
    ckpt = tmp_path / "ckpt"
    argv = [*map(str, TINY_MODEL), "--max-steps", "400", "--eval-every", "100", "--warmup-steps", "2"]
    argv += ["--final-eval-batches", "2", "--eval-batches", "2", "--threads", "1", "--quiet", "--nproc", "2"]
    argv += ["--precision", "fp32", *shard]
    cmd = [sys.executable, "-m", "ffnlab", "train", *argv, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        for _ in range(1200):  # until the first checkpoint is written (at most 2 minutes)
            if proc.poll() is not None or any(ckpt.glob("state-*.pt")):
                break
            time.sleep(0.1)
        ranks = ranks_of(proc.pid)
        assert proc.poll() is None and len(ranks) == 2, "the run ended before its first checkpoint"
        os.kill(ranks[-1], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1
    [line] = err.strip().splitlines()
    assert re.fullmatch(
        f"ffnlab: error: rank [01] of 2 was killed by SIGKILL, and the run stopped; the checkpoint in {ckpt} is "
        "kept: run again to resume",
        line,
    )
    assert not any(ranks_of(proc.pid))  # no rank trains on
    resumed = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    whole = subprocess.run(
        [sys.executable, "-m", "ffnlab", "train", *argv, "--json"], capture_output=True, text=True, timeout=300
    )
    assert json.loads(resumed.stdout)["final_val_loss"] == json.loads(whole.stdout)["final_val_loss"]


def test_nproc_other_than_torchruns_processes_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="nproc 2 asks for 2 processes, but torchrun started 3; give --nproc 3"):
        train(replace(BASE, nproc=2, max_steps=1))


def test_the_global_batch_is_said(run_cli):
    code, out, _ = run_cli("train", *TINY_MODEL, "--max-steps", 2, "--grad-accum", 3, "--quiet")
    assert code == 0
    assert "global batch 12: 4 per forward pass x 1 process x 3 passes accumulated" in out


def test_profile_with_nproc_is_refused(run_cli):
    code, _, err = run_cli("train", *TINY_MODEL, "--max-steps", 2, "--nproc", 2, "--profile")
    assert code == 2
    assert err.strip().splitlines() == [
        "ffnlab: error: --profile times one process; drop it or --nproc (or start it without torchrun)"
    ]


def test_compare_nproc_per_run_gives_the_table_of_one_process_at_the_same_global_batch(run_cli, tmp_path):
    common = [*map(str, TINY_MODEL[:-2]), "--variants", "relu,gelu", "--seeds", "2", "--max-steps", "4"]
    common += ["--warmup-steps", "2", "--eval-batches", "2", "--final-eval-batches", "2", "--precision", "fp32"]
    code, out, err = run_cli("compare", *common, "--batch-size", 8, "--store", tmp_path / "one.db", "--json", "--quiet")
    assert code == 0, err
    one = json.loads(out)
    code, out, err = run_cli(
        "compare", *common, "--batch-size", 4, "--nproc-per-run", 2, "--store", tmp_path / "two.db", "--json", "--quiet"
    )
    assert code == 0, err
    two = json.loads(out)
    rows = {r["ffn"]: r for r in one["variants"]}
    assert {r["ffn"] for r in two["variants"]} == set(rows) == {"relu", "gelu"}
    for row in two["variants"]:
        assert row["n_seeds"] == 2
        assert row["mean"] == pytest.approx(rows[row["ffn"]]["mean"], abs=1e-5)
    assert two["settings"]["nproc"] == 2 and two["settings"]["batch_size"] == 4


def test_auto_jobs_count_each_runs_processes(monkeypatch):
    from ffnlab.study.execute import resolve_jobs

    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(8)))
    assert [resolve_jobs("auto", "cpu", n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert resolve_jobs(3, "cpu", 2) == 3  # a number is taken as it is


def test_a_study_says_its_global_batch():
    from ffnlab.study.plan import Study
    from ffnlab.study.render import global_batch
    from ffnlab.study.summary import settings_of

    def said(**batch: int) -> str:
        return global_batch(settings_of(Study(variants=["relu"], seeds=2, base=replace(BASE, **batch))))

    assert said(batch_size=16) == "16"
    assert said(batch_size=4, nproc=2, grad_accum=3) == "24 (4 per forward pass x 2 processes x 3 accumulated)"


SHARDED = replace(BASE, model=replace(MODEL, n_layers=2), nproc=2, max_steps=6, log_every=2, checkpoint_every=2)


@pytest.fixture(scope="module")
def ddp_and_sharded(tmp_path_factory) -> dict[str, tuple[RunResult, Path]]:
    """The same run with DDP and sharded (FSDP2 on gloo: each rank holds half of every parameter and of AdamW's
    state), each with its checkpoints (the last at step 4) and final weights in a folder of its own."""
    runs = {}
    for name in ("ddp", "sharded"):
        folder = tmp_path_factory.mktemp(name)
        cfg = replace(SHARDED, shard=name == "sharded", checkpoint_dir=str(folder / "ckpt"))
        runs[name] = train(cfg, weights_path=folder / "final.safetensors"), folder
    return runs


def test_a_sharded_run_computes_what_ddp_computes(ddp_and_sharded):
    (ddp, _), (sharded, _) = ddp_and_sharded["ddp"], ddp_and_sharded["sharded"]
    assert sharded.config["shard"] and abs(sharded.val.loss - ddp.val.loss) < 1e-6
    for whole, pieces in zip(ddp.history.grad_ffn, sharded.history.grad_ffn, strict=True):  # over all shards
        assert pieces.step == whole.step and pieces.stats == pytest.approx(whole.stats, rel=1e-4, abs=1e-9)


def test_a_sharded_run_saves_what_ddp_saves_in_the_files_of_an_unsharded_run(ddp_and_sharded):
    from safetensors.torch import load_file, load_model

    from ffnlab.core.model import Transformer
    from ffnlab.run.checkpoint import load_checkpoint
    from ffnlab.run.train import make_optimizer

    (_, ddp_dir), (sharded, sharded_dir) = ddp_and_sharded["ddp"], ddp_and_sharded["sharded"]
    for name in ("final.safetensors", "ckpt/model-4.safetensors"):  # each tied head under the name save_model keeps
        whole, pieces = load_file(ddp_dir / name), load_file(sharded_dir / name)
        assert sorted(pieces) == sorted(whole)
        for key, tensor in whole.items():
            torch.testing.assert_close(pieces[key], tensor, rtol=0, atol=1e-6)
    plain = Transformer(replace(SHARDED.model, vocab_size=sharded.vocab_size))
    load_model(plain, str(sharded_dir / "final.safetensors"))  # strict: every weight, the tied head among them
    # the optimizer state as the unsharded optimizer's state_dict numbers it, which a plain run loads
    ddp_opt, sharded_opt = (
        torch.load(d / "ckpt/state-4.pt", weights_only=True)["optimizer"] for d in (ddp_dir, sharded_dir)
    )
    assert sharded_opt["param_groups"] == ddp_opt["param_groups"]
    torch.testing.assert_close(sharded_opt["state"], ddp_opt["state"], rtol=0, atol=1e-6)  # keyed 0, 1, ... alike
    opt = make_optimizer(plain, SHARDED, "cpu")
    state = load_checkpoint(
        sharded_dir / "ckpt", plain, opt, torch.Generator(), torch.amp.GradScaler("cpu", enabled=False)
    )
    assert state is not None and state["step"] == 4 and len(opt.state) == len(list(plain.parameters()))


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "--shard divides the model over a run's processes; give --nproc 2 or more"),
        (("--nproc", 2, "--qat-from", 0.5), "--shard cannot give quantisation-aware training yet; drop --qat-from"),
        (
            ("--nproc", 2, "--hf-config", "gpt2.json", "--save-pretrained", "out"),
            "--shard cannot give a save_pretrained",
        ),
    ],
)
def test_what_a_sharded_run_cannot_do_is_refused_in_one_line(run_cli, tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32}
    (tmp_path / "gpt2.json").write_text(json.dumps(config))
    code, _, err = run_cli("train", *TINY_MODEL, "--max-steps", 2, "--shard", *extra)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"ffnlab: error: {message}")


def test_a_study_of_sharded_runs_keeps_each_runs_weights(run_cli, tmp_path):
    code, out, err = run_cli("compare", *TINY_MODEL, "--max-steps", 2, "--shard", "--nproc-per-run", 2,
                             "--variants", "relu,gelu", "--seeds", 1, "--no-stats", "--eval-batches", 2, "--final-eval-batches", 2,
                             "--store", tmp_path / "s.db", "--json", "--quiet")  # fmt: skip
    assert code == 0, err
    assert {row["ffn"] for row in json.loads(out)["variants"]} == {"relu", "gelu"}
    assert len(list((tmp_path / "weights").glob("*.safetensors"))) == 2


def test_on_ray_a_run_of_two_processes_is_one_task_of_two_cpus(tmp_path, monkeypatch):
    """The task holds nproc CPUs and starts the ranks inside itself (torchrun's launcher): the same numbers as the
    local sweep."""
    pytest.importorskip("ray")
    from ffnlab.study.execute import run_study
    from ffnlab.study.plan import Study

    monkeypatch.chdir(tmp_path)
    base = replace(BASE, nproc=2, max_steps=4)
    study = Study(variants=["relu", "gelu"], seeds=1, base=base, baseline="relu")
    on_ray = run_study(study, tmp_path / "ray.db", backend="ray", quiet=True)
    local = run_study(study, tmp_path / "local.db", quiet=True)
    assert [v.mean for v in on_ray.cells[0].variants] == [v.mean for v in local.cells[0].variants]
    assert all(v.n_seeds == 1 for v in on_ray.cells[0].variants)
