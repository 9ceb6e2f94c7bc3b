import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from ffnlab.core.model import ModelConfig
from ffnlab.run.presets import preset_config
from ffnlab.run.train import TrainConfig
from ffnlab.study.execute import lock_path, resolve_jobs, run_lock, run_study, wait_for
from ffnlab.study.plan import Study, plan, run_id
from ffnlab.study.store import Store
from tests.test_readme import readme_keys


def smoke_study(**kw):
    base = preset_config("smoke")
    return Study(**{"variants": ["relu", "swiglu"], "seeds": 2, "base": base, "baseline": "relu", **kw})


def test_plan_expansion_and_run_identity():
    study = smoke_study(axes={"depth": [1, 2], "placement": ["pre", "post"]}, noise_floor=1)
    runs = plan(study)
    assert len(runs) == 2 * 2 * (2 * 2 + 1)  # axes cells x (variants x seeds + noise-floor seed)
    ids = [run_id(c) for c in runs]
    assert len(set(ids)) == len(ids)
    assert ids == [run_id(c) for c in plan(study)]  # identity is stable
    assert run_id(runs[0]) != run_id(replace(runs[0], lr=runs[0].lr * 2))
    assert run_id(runs[0]) == run_id(replace(runs[0], checkpoint_dir="/elsewhere"))
    stored = runs[0].to_dict()
    del stored["hf_config"], stored["model"]["attn_act"]  # a config stored before these optional fields
    # existed keeps its identity
    assert run_id(TrainConfig.from_dict(stored)) == run_id(runs[0])
    assert {(c.model.n_layers, c.model.placement) for c in runs} == {(1, "pre"), (1, "post"), (2, "pre"), (2, "post")}


def test_every_config_field_is_listed_for_the_run_identity():
    from dataclasses import fields

    from ffnlab.core.model import ModelConfig
    from ffnlab.run.config import IDENTITY_FIELDS, NOT_IDENTITY

    listed = [name for names in IDENTITY_FIELDS.values() for name in names] + list(NOT_IDENTITY)
    declared = [f.name for f in fields(TrainConfig) if f.name != "model"] + [
        f"model.{f.name}" for f in fields(ModelConfig)
    ]
    assert sorted(listed) == sorted(declared)  # each field once: a new one must join a version


def test_a_field_of_a_later_identity_version_is_hashed_only_off_its_default(monkeypatch):
    from ffnlab.run import config

    cfg = smoke_study().base
    before = {0.99: run_id(replace(cfg, beta2=0.99)), 0.9: run_id(replace(cfg, beta2=0.9))}
    v1 = tuple(n for n in config.IDENTITY_FIELDS[1] if n != "beta2")
    monkeypatch.setattr(config, "IDENTITY_FIELDS", {1: v1, 2: ("beta2",)})  # as if beta2 were added in version 2
    assert "beta2" not in config.identity(replace(cfg, beta2=0.99))  # the default: a run stored before keeps its id
    assert run_id(replace(cfg, beta2=0.99)) != before[0.99]
    assert run_id(replace(cfg, beta2=0.9)) == before[0.9]  # off its default: hashed as version 1 does


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(variants=["relu", "swiglue"]), "did you mean 'swiglu'"),
        (dict(baseline="gelu"), "baseline 'gelu' is not among the variants"),
        (dict(axes={"colour": [1]}), "unknown axis 'colour'"),
        (dict(axes={"lr": [1e-3, 0.001]}), "axis 'lr' repeats a setting: 0.001 and 0.001"),
        (
            dict(seeds=10**11),
            r"has 200,000,000,000 runs \(2 variants x 100,000,000,000 seeds\); at most 100,000",
        ),  # was planned without end
        (dict(noise_floor=10**8), r"has 100,000,004 runs \(2 variants x 2 seeds \+ 100,000,000 noise-floor seeds\)"),
        (dict(axes={"lr": [i / 10**6 for i in range(1, 50_001)]}), r"50,000 cells x \(2 variants x 2 seeds\)"),
        (dict(axes={"attn_act": ["none", "identity"]}), "axis 'attn_act' repeats a setting: 'none' and 'identity'"),
        (dict(axes={"attn_act": ["q=gelu,k=gelu", "k=gelu,q=gelu"]}), "'q=gelu,k=gelu' and 'k=gelu,q=gelu' train"),
    ],
)
def test_bad_study(kw, needle):
    with pytest.raises(ValueError, match=needle):
        smoke_study(**kw)


def test_a_schedule_is_a_variant_of_a_study():
    base = replace(preset_config("smoke"), model=replace(preset_config("smoke").model, n_layers=2))
    study = Study(variants=["gelu", "GELU*1+swiglu*1"], seeds=2, base=base)
    assert study.variants == ["gelu", "gelu*1+swiglu*1"] and study.baseline == "gelu"  # no relu: the first
    assert [c.model.ffn for c in plan(study)] == ["gelu", "gelu", "gelu*1+swiglu*1", "gelu*1+swiglu*1"]
    with pytest.raises(ValueError, match="'gelu\\*1\\+swiglu\\*1' covers 2 layers but n_layers is 3"):
        Study(variants=["gelu", "gelu*1+swiglu*1"], seeds=2, base=base, axes={"depth": [2, 3]})


def test_rerun_skips_finished_runs_and_stats(tmp_path):
    store = tmp_path / "s.db"
    summary = run_study(smoke_study(), store, quiet=True)
    (cell,) = summary.cells
    assert [r.ffn for r in cell.variants] != [] and {r.n_seeds for r in cell.variants} == {2}
    with Store(store) as s:
        attempts = {r.id: r.attempts for r in s.runs()}
        assert len(attempts) == 4 and all(r.status == "finished" for r in s.runs())
        assert s.metrics(next(iter(attempts)), "val_loss")
    again = run_study(smoke_study(), store, quiet=True)
    with Store(store) as s:
        assert {r.id: r.attempts for r in s.runs()} == attempts
    assert again.cells[0].variants == cell.variants


def test_divergent_runs_are_counted_not_fatal(tmp_path):
    base = replace(preset_config("smoke"), lr=1e6, min_lr=1e5, warmup_steps=0, grad_clip=1e9)
    summary = run_study(smoke_study(base=base), tmp_path / "s.db", quiet=True)
    (cell,) = summary.cells
    assert all(r.diverged == 2 for r in cell.variants)
    assert "diverged" in cell.verdict or "No variant" in cell.verdict


def compare_cmd(store, *extra):
    return [
        sys.executable,
        "-m",
        "ffnlab.cli",
        "compare",
        "--preset",
        "smoke",
        "--variants",
        "relu,swiglu",
        "--seeds",
        "2",
        "--steps",
        "80",
        "--store",
        str(store),
        "--quiet",
        "--no-report",
        *map(str, extra),
    ]


def assert_locks_released(folder, seconds: float = 10.0):
    """Every run lock in `folder` can be taken within `seconds`: no worker process still holds one."""
    deadline = time.time() + seconds
    for lock in folder.glob("*.lock"):
        with open(lock) as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.time() < deadline, f"a worker process still holds {lock.name}"
                    time.sleep(0.1)


def deterministic(store_path):
    """What must agree between two sweeps: statuses, final metrics and every loss curve."""
    with Store(store_path, create=False) as s:
        out = {}
        for r in s.runs():
            out[r.id] = (
                r.status,
                r.result.val.loss,
                r.result.steps,
                [m for m in s.metrics(r.id) if m[1] in ("train_loss", "val_loss")],
            )
        return out


@pytest.mark.slow
def test_kill_9_mid_sweep_then_resume_equals_uninterrupted(tmp_path):
    ref = subprocess.run(compare_cmd(tmp_path / "ref.db"), capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    store = tmp_path / "killed.db"
    proc = subprocess.Popen(compare_cmd(store), stderr=subprocess.DEVNULL)
    ckpts = tmp_path / "checkpoints"
    deadline = time.time() + 120
    while True:  # kill once one run is finished and another is part-way, past a checkpoint
        assert proc.poll() is None and time.time() < deadline
        finished = 0
        if store.exists():
            try:
                with sqlite3.connect(store, timeout=1) as db:
                    finished = db.execute("select count(*) from runs where status='finished'").fetchone()[0]
            except sqlite3.OperationalError:
                pass
        if finished >= 1 and any(ckpts.glob("*/latest.json")):
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_locks_released(ckpts)  # the sweep's worker processes die with it: no run lock stays held
    with sqlite3.connect(store) as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    again = subprocess.run(compare_cmd(store), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert deterministic(store) == deterministic(tmp_path / "ref.db")
    assert not any(ckpts.glob("*/latest.json"))  # finished runs clean up their checkpoints


def test_sigterm_stops_a_sweep_and_its_workers_at_once(tmp_path):
    """`kill` (SIGTERM) ends `compare --jobs 2` within seconds, not after every queued run: the CLI unwinds,
    the pool's workers are killed and their locks let go (their runs resume from checkpoints later)."""
    store = tmp_path / "s.db"
    proc = subprocess.Popen(compare_cmd(store, "--jobs", 2, "--steps", 20000), stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not any((tmp_path / "checkpoints").glob("*/latest.json")):  # both workers are training
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert_locks_released(tmp_path / "checkpoints")


@pytest.mark.slow
def test_three_concurrent_sweeps_on_one_store_train_each_run_once_and_leave_no_lock(tmp_path):
    store = tmp_path / "shared.db"
    argv = compare_cmd(store, "--steps", 40, "--jobs", 1)
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    with Store(store, create=False) as s:
        runs = s.runs()
        assert len(runs) == 4 and all(r.status == "finished" for r in runs)
        assert sum(r.attempts for r in runs) == 4  # no run was trained twice
    with sqlite3.connect(store) as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    assert list((tmp_path / "checkpoints").iterdir()) == []  # three sweeps left 3 or 4 run.lock files


@pytest.mark.slow
def test_ray_backend_runs_the_smoke_preset(tmp_path, monkeypatch):
    """...and its workers import nothing from the working directory, which Ray puts first on their sys.path."""
    from tests.test_execute import plant_modules

    pytest.importorskip("ray")
    (tmp_path / "cwd").mkdir()
    plant_modules(tmp_path / "cwd", tmp_path / "imported.txt")
    monkeypatch.chdir(tmp_path / "cwd")
    summary = run_study(smoke_study(), tmp_path / "ray.db", backend="ray", quiet=True)
    assert not (tmp_path / "imported.txt").exists()
    assert {r.n_seeds for r in summary.cells[0].variants} == {2}
    local = run_study(smoke_study(), tmp_path / "local.db", quiet=True)  # every sweep run trains on one thread
    assert [r.mean for r in summary.cells[0].variants] == [r.mean for r in local.cells[0].variants]
    with Store(tmp_path / "ray.db", create=False) as s:  # recorded by the driver: weights, the worker's env
        runs = s.runs()
    assert all(r.attempts == 1 and r.env["torch"] == torch.__version__ for r in runs)
    assert all((tmp_path / "weights" / f"{r.id}.safetensors").is_file() for r in runs)


def test_a_ray_task_returns_what_the_driver_records_and_never_opens_the_store(tmp_path):
    """Ray tasks train on workers that may not see the store's folder: the task gets the config and a
    checkpoint folder, returns result, weights and environment; the driver records them."""
    from ffnlab.study.execute import WorkerOutcome, record_returned, train_on_worker

    cfg = plan(smoke_study())[0]
    returned = train_on_worker(cfg.to_dict(), str(tmp_path / "worker"))
    assert returned.error is None and returned.result is not None and returned.weights[:8] and returned.env["python"]
    assert not (tmp_path / "worker" / run_id(cfg)).exists()  # its checkpoints are gone once it finished
    assert not list(tmp_path.glob("*.db"))
    store = tmp_path / "driver" / "s.db"
    with Store(store) as s:
        s.claim(run_id(cfg), cfg.to_dict())
        s.start(run_id(cfg))
        assert record_returned(s, store, cfg, returned) == "finished"
        assert s.get(run_id(cfg)).result.val.loss == returned.result.val.loss
    assert (store.parent / "weights" / f"{run_id(cfg)}.safetensors").read_bytes() == returned.weights
    bad = train_on_worker({**cfg.to_dict(), "data": str(tmp_path / "missing.txt")}, str(tmp_path / "worker"))
    assert bad.result is None and bad.weights is None and "missing.txt" in bad.error and bad.env["python"]
    crashed = plan(smoke_study())[1]  # a task that died under Ray returns nothing: the driver marks it failed
    with Store(store) as s:
        s.claim(run_id(crashed), crashed.to_dict())
        s.start(run_id(crashed))
        assert (
            record_returned(s, store, crashed, WorkerOutcome(env=None, error="WorkerCrashedError: killed")) == "failed"
        )
        assert s.get(run_id(crashed)).error == "WorkerCrashedError: killed" and s.get(run_id(crashed)).env


def test_how_a_study_is_scheduled_never_changes_its_numbers(tmp_path):
    """fp32 and bf16 matmuls round differently with another thread count; sweep runs train on one
    thread whatever --jobs says (and the process keeps its own count)."""
    before = torch.get_num_threads()
    finals = {}
    for jobs in (1, 2):
        store = tmp_path / f"j{jobs}.db"
        run_study(smoke_study(base=replace(preset_config("smoke"), precision="fp32")), store, jobs=jobs, quiet=True)
        with Store(store, create=False) as s:
            finals[jobs] = {r.id: (r.result.val.loss, r.result.threads) for r in s.runs()}
    assert finals[1] == finals[2] and {t for _, t in finals[1].values()} == {1}
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--variants", "relu,nope"], "unknown FFN variant 'nope'"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--baseline", "gelu", "--variants", "relu,swiglu"], "not among the variants"),
        (["--seeds", "1"], "at least 2 seeds"),
        (["--depth", "2,x"], "integers"),
        (["--variants", "relu,gelu*1+swiglu*2"], "covers 3 layers but n_layers is 2"),
        (["--variants", "relu,gelu*0+swiglu*2"], "'gelu*0' needs a whole number of layers"),
    ],
)
def test_compare_bad_input_writes_nothing(run_cli, tmp_path, argv, needle):
    store = tmp_path / "never.db"
    code, _, err = run_cli("compare", "--store", store, *argv)
    assert code == 2 and needle in err and err.count("\n") == 1
    assert not store.exists() and not (tmp_path / "checkpoints").exists()


def test_compare_json_and_csv(run_cli, tmp_path):
    code, out, err = run_cli(
        "compare",
        "--preset",
        "smoke",
        "--variants",
        "relu,gelu",
        "--seeds",
        2,
        "--store",
        tmp_path / "s.db",
        "--json",
        "--csv",
        tmp_path / "t.csv",
    )
    assert code == 0, err
    d = json.loads(out)
    assert d["baseline"] == "relu" and d["store"].endswith("s.db")
    # every key the README documents for compare --json is there
    assert readme_keys("**`compare --json`** prints", "`settings` (") <= set(d)
    assert readme_keys("`settings` (", "and `cells`") <= set(d["settings"])
    cell_keys = readme_keys("and `cells`: one per combination of axis values, each with", "a row per FFN")
    assert cell_keys - {"tau", "n", "disagree"} <= set(d["cells"][0])
    assert {"tau", "n", "disagree"} <= set(d["cells"][0]["literature"])
    row_keys = readme_keys("a row per FFN with", "Without axes")
    assert len(row_keys) > 30 and all(row_keys <= set(v) for v in d["variants"])
    gelu = next(v for v in d["variants"] if v["ffn"] == "gelu")
    assert gelu["p_adj"] is None and "needs >= 3 seeds" in d["verdict"]  # 2 seeds: interval, no test
    assert gelu["ppl"] > 1 and gelu["test_mean"] > 0 and gelu["ffn_grad_std"] > 0
    assert {"held_equal", "not_equal", "init", "lr"} <= set(d["settings"])
    assert all(len(pair) == 2 for pair in d["settings"]["held_equal"] + d["settings"]["not_equal"])  # [what, how]
    header = (tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["metric", "ffn"] and {"test_mean", "noise_delta", "train_mem_bytes"} <= set(header)


LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 86,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
}


def test_compare_on_a_hugging_face_config(run_cli, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    code, out, err = run_cli(
        "compare",
        "--preset",
        "smoke",
        "--variants",
        "relu,swiglu",
        "--seeds",
        2,
        "--steps",
        10,
        "--hf-config",
        cfg,
        "--store",
        tmp_path / "s.db",
        "--json",
        "--no-report",
    )
    assert code == 0, err
    rows = {r["ffn"]: r for r in json.loads(out)["variants"]}
    assert set(rows) == {"relu", "swiglu"}
    # parameters of a Llama with d_model 32 (not the smoke preset's own model), FFNs matched
    assert abs(rows["relu"]["params"] - rows["swiglu"]["params"]) / rows["relu"]["params"] < 0.01
    with Store(tmp_path / "s.db", create=False) as s:
        assert all(r.config["hf_config"]["model_type"] == "llama" for r in s.runs())
    cfg.write_text(json.dumps({**LLAMA, "model_type": "bloom"}))
    code, _, err = run_cli("compare", "--preset", "smoke", "--hf-config", cfg, "--store", tmp_path / "t.db")
    assert code == 2 and "unsupported architecture 'bloom'" in err and not (tmp_path / "t.db").exists()


def test_a_schedule_on_a_hugging_face_config_fails_before_any_run(run_cli, tmp_path):
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps(LLAMA))
    argv = ["--variants", "relu,relu*1+swiglu*1", "--layers", 2, "--hf-config", cfg, "--store", tmp_path / "s.db"]
    code, _, err = run_cli(*SMOKE[:3], "--seeds", 2, *argv)
    assert code == 2 and "'relu*1+swiglu*1' is a per-layer schedule, not one FFN" in err, err
    assert not (tmp_path / "s.db").exists()


def test_log_to_tensorboard_mirrors_curves(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    study = smoke_study(variants=["relu", "gelu"], base=replace(preset_config("smoke"), max_steps=10))
    run_study(study, tmp_path / "s.db", quiet=True, log_to="tensorboard")
    runs = sorted((tmp_path / "tensorboard").iterdir())
    assert len(runs) == 4
    acc = EventAccumulator(str(runs[0]))
    acc.Reload()
    with Store(tmp_path / "s.db", create=False) as s:
        stored = [v for _, _, v in s.metrics(runs[0].name, "val_loss")]
    assert [e.value for e in acc.Scalars("val_loss")] == pytest.approx(stored)


def test_log_to_mlflow_mirrors_curves(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # MLflow puts a user-set URI's artifacts in ./mlruns
    study = smoke_study(variants=["relu", "gelu"], base=replace(preset_config("smoke"), max_steps=10))
    run_study(study, tmp_path / "s.db", quiet=True, log_to="mlflow")
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 4 and {r.data.params["ffn"] for r in runs} == {"relu", "gelu"}
    run = runs[0]
    with Store(tmp_path / "s.db", create=False) as s:
        stored = [(step, v) for step, _, v in s.metrics(run.data.params["run_id"], "val_loss")]
    logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_loss"))
    assert [step for step, _ in logged] == [step for step, _ in stored] and len(stored) > 1
    assert [v for _, v in logged] == pytest.approx([v for _, v in stored])
    assert run.data.params["precision"] in ("fp32", "bf16")


def test_log_to_mlflow_defaults_to_a_file_beside_the_store(tmp_path, monkeypatch, capfd):
    """...and says nothing: MLflow's INFO lines about making its database reached the user's terminal."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory either
    (tmp_path / "runs").mkdir()
    study = smoke_study(variants=["relu", "gelu"], seeds=2, base=replace(preset_config("smoke"), max_steps=10))
    run_study(study, tmp_path / "runs" / "s.db", quiet=True, log_to="mlflow")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert "INFO" not in capfd.readouterr().err
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ffnlab")
    assert len(client.search_runs([exp.experiment_id])) == 4


SMOKE = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", 3, "--steps", 4, "--eval-every", 4]


def test_init_lr_and_context_axes_from_the_cli(run_cli, tmp_path):
    code, out, err = run_cli(
        *SMOKE,
        "--init-axis",
        "lecun,family",
        "--lr-axis",
        "1e-3,4e-3",
        "--context-axis",
        "16,32",
        "--store",
        tmp_path / "s.db",
        "--json",
    )
    assert code == 0, err
    d = json.loads(out)
    assert len(d["cells"]) == 8 and {c["axes"]["init"] for c in d["cells"]} == {"lecun", "family"}
    assert {c["axes"]["lr"] for c in d["cells"]} == {1e-3, 4e-3} and {c["axes"]["context"] for c in d["cells"]} == {
        16,
        32,
    }
    with Store(tmp_path / "s.db", create=False) as s:
        configs = [r.config for r in s.runs()]
    assert {(c["model"]["init"], c["lr"], c["model"]["context"]) for c in configs} == {
        (i, lr, ctx) for i in ("lecun", "family") for lr in (1e-3, 4e-3) for ctx in (16, 32)
    }
    # an lr axis adds the tuned comparison: per (init, context) cell, lr chosen on validation, test compared
    assert len(d["tuned"]) == 4 and all(c["metric"] == "final_test_loss" for c in d["tuned"])
    assert all(r["lr"] in (1e-3, 4e-3) for c in d["tuned"] for r in c["variants"])
    page = (tmp_path / "report" / "report.html").read_text()
    assert "FFN initialisation" in page and "lecun/family (an axis)" in page and "0.001/0.004 (an axis)" in page
    assert "What the comparison held equal" in page and "Tuned: each variant at its own best setting" in page


@pytest.mark.slow  # two short runs and a report: about 30 s on a loaded 2-core machine
def test_attn_act_axis_from_the_cli(run_cli, tmp_path):
    axis = "none;q=gelu,v=gelu"  # gelu on v: at 4 steps attention is near uniform, so q and k barely matter
    args = [
        "--variants",
        "relu",
        "--seeds",
        1,
        "--no-stats",
        "--attn-act-axis",
        axis,
        "--store",
        tmp_path / "s.db",
        "--json",
    ]
    code, out, err = run_cli(*SMOKE, *args)
    assert code == 0, err
    d = json.loads(out)
    assert [c["axes"]["attn_act"] for c in d["cells"]] == axis.split(";")
    means = [c["variants"][0]["mean"] for c in d["cells"]]
    assert means[0] != means[1]  # the activation reached the model: same seed, same data, other loss
    assert d["settings"]["axes"]["attn_act"] == axis.split(";") and d["settings"]["attn_act"] is None
    assert dict(d["settings"]["held_equal"])["Q/K/V activations"].startswith(
        f"the attn_act axis ({axis.replace(';', '; ')})"
    )
    with Store(tmp_path / "s.db", create=False) as s:
        assert sorted(r.config["model"]["attn_act"] for r in s.runs()) == sorted(axis.split(";"))
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Q/K/V activations" in page and "none; q=gelu,v=gelu (an axis)" in page


def test_attn_act_flag_reaches_the_config_and_the_settings(run_cli):
    from ffnlab.study.summary import settings_of

    code, out, err = run_cli(*SMOKE, "--attn-act", "q=gelu", "--print-config")
    assert code == 0 and 'attn_act = "q=gelu"' in out, err
    settings = settings_of(smoke_study(base=replace(preset_config("smoke"), model=ModelConfig(attn_act="q=gelu"))))
    assert settings.attn_act == "q=gelu"
    assert ["Q/K/V activations", "Q gelu, K none, V none for every variant"] in settings.held_equal
    assert ["Q/K/V activations", "none for every variant"] in settings_of(smoke_study()).held_equal


def test_init_flag_reaches_the_runs_and_the_report(run_cli, tmp_path):
    code, out, err = run_cli(*SMOKE, "--init", "he", "--lr", "3e-3", "--store", tmp_path / "s.db", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (
        d["settings"]["init"] == "he" and d["settings"]["lr"] == 3e-3 and d["settings"]["min_lr"] == pytest.approx(3e-4)
    )
    assert ["FFN initialisation", "he for every variant's FFN weights"] in d["settings"]["held_equal"]
    page = (tmp_path / "report" / "report.html").read_text()
    assert '<td class="t">FFN initialisation</td><td class="t">he</td>' in page and "peak lr 0.003" in page
    code, out, err = run_cli(*SMOKE, "--init", "family", "--store", tmp_path / "f.db", "--json", "--no-report")
    assert code == 0, err
    not_equal = dict(json.loads(out)["settings"]["not_equal"])
    assert "confounded with the activation" in not_equal["FFN initialisation"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--init-axis", "lecun,xavier"], "unknown init 'xavier'"),
        (["--init", "xavier"], "invalid choice"),
        (["--lr-axis", "1e-3,-1"], "values must be positive"),
        (["--context-axis", "16,0"], "values must be positive"),
        (["--attn-act-axis", "none;q=gelux"], "unknown activation 'gelux'"),
        (["--attn-act-axis", "none;x=gelu"], "unknown projection 'x'; valid: q, k, v"),
        (["--checkpointing-axis", "none,layer"], "unknown activation_checkpointing 'layer'; valid: none, block, ffn"),
        (["--checkpointing-axis", "none,none"], "axis 'checkpointing' repeats a setting"),
        (["--precision-axis", "fp32,fp8"], "unknown precision 'fp8'; valid: auto, fp32, bf16, fp16"),
        (["--activation-checkpointing", "layer"], "invalid choice"),
        (["--precision", "fp8"], "invalid choice"),
    ],
)
def test_bad_axis_values_fail_before_any_run(run_cli, tmp_path, args, needle):
    code, _, err = run_cli(*SMOKE, *args, "--store", tmp_path / "s.db")
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "s.db").exists()


def test_jobs_auto_is_one_worker_per_core(run_cli, tmp_path):
    cores = len(os.sched_getaffinity(0))
    assert resolve_jobs("auto") == cores and resolve_jobs(3) == 3
    with pytest.raises(ValueError, match="positive number or 'auto'"):
        resolve_jobs(0)
    code, _, err = run_cli(*SMOKE, "--jobs", "0", "--store", tmp_path / "s.db")
    assert code == 2 and "must be positive" in err


def test_two_seeds_show_no_p_value(run_cli, tmp_path):
    code, out, err = run_cli(
        "compare",
        "--preset",
        "smoke",
        "--variants",
        "relu,gelu",
        "--seeds",
        2,
        "--steps",
        4,
        "--eval-every",
        4,
        "--jobs",
        1,
        "--store",
        tmp_path / "s.db",
    )
    assert code == 0, err
    gelu = next(line for line in out.splitlines() if " gelu " in line)
    assert "n/a (needs ≥3 seeds)" in gelu and "*" not in gelu
    assert "n/a (needs ≥3 seeds)" in (tmp_path / "report" / "report.html").read_text()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--data", "{tmp}/missing.txt"], "missing.txt"),
        (["--d-model", "1000000000", "--heads", "4"], "use a smaller --d-model"),
        (["--batch-size", "1000000000"], "--batch-size"),
    ],
)
def test_data_and_sizes_are_checked_once_before_any_run(run_cli, tmp_path, argv, needle):
    code, _, err = run_cli(*SMOKE, *[a.format(tmp=tmp_path) for a in argv], "--store", tmp_path / "s.db")
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "report").exists()


def test_a_failed_run_says_why_and_the_exit_status_says_seeds_are_missing(run_cli, tmp_path, monkeypatch):
    from ffnlab.study import execute as sweep

    real = sweep.train

    def flaky(cfg, **kw):
        if cfg.model.ffn == "gelu" and cfg.seed == 1:
            raise RuntimeError("boom in gelu seed 1")
        return real(cfg, **kw)

    monkeypatch.setattr(sweep, "train", flaky)
    code, out, err = run_cli(*SMOKE, "--jobs", 1, "--store", tmp_path / "s.db", "--no-report")
    assert code == 1
    assert "gelu seed 1: failed (RuntimeError: boom in gelu seed 1)" in err
    assert "1 of 6 planned runs did not finish" in err.splitlines()[-1]
    assert "left out: gelu seed 1" in out  # the verdict says the table rests on fewer seeds
    assert not list((tmp_path / "checkpoints").glob("*.lock"))  # the failed run's lock went with it
    monkeypatch.setattr(sweep, "train", real)
    code, out, err = run_cli(*SMOKE, "--jobs", 1, "--store", tmp_path / "s.db", "--no-report")
    assert code == 0 and "left out" not in out  # retried and finished


def test_a_run_lock_lasts_while_it_is_held(tmp_path):
    store = tmp_path / "s.db"
    lock_path(store, "r").parent.mkdir()
    lock_path(store, "r").touch()  # left by a holder killed with -9
    with run_lock(store, "r", wait=False) as held:
        assert held and lock_path(store, "r").exists()
        with run_lock(store, "r", wait=False) as other:
            assert other is False
    assert not lock_path(store, "r").exists()  # it stayed: every opener made it anew
    wait_for(store, "r")
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_finished_runs_leave_no_lock_or_checkpoint(tmp_path):
    run_study(smoke_study(), tmp_path / "s.db", jobs=1, quiet=True)
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.mark.slow
def test_compare_a_per_layer_schedule_from_the_cli(run_cli, tmp_path):
    variants = "gelu,GELU*1+swiglu*1"
    code, out, err = run_cli(*SMOKE[:3], "--layers", 2, "--variants", variants, "--seeds", 2, "--steps", 2,
                             "--eval-every", 2, "--store", tmp_path / "s.db", "--json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    assert d["baseline"] == "gelu" and {v["ffn"] for v in d["variants"]} == {"gelu", "gelu*1+swiglu*1"}
    params = {v["ffn"]: v["params"] for v in d["variants"]}
    assert params["gelu"] != params["gelu*1+swiglu*1"]
    assert abs(params["gelu"] - params["gelu*1+swiglu*1"]) <= 0.01 * params["gelu"]


def test_checkpointing_and_precision_axes_plan_a_cell_each(monkeypatch):
    from ffnlab.run import device

    monkeypatch.setattr(device, "bf16_native", lambda where="cpu": False)  # 'auto' is fp32 here
    study = smoke_study(axes={"checkpointing": ["none", "block", "ffn"], "precision": ["auto", "fp16"]})
    assert study.axes == {"checkpointing": ["none", "block", "ffn"], "precision": ["fp32", "fp16"]}  # as run
    runs = plan(study)
    assert len(runs) == 6 * 2 * 2 and len({run_id(c) for c in runs}) == len(runs)
    cells = {(c.model.activation_checkpointing, c.precision) for c in runs}
    assert cells == {(k, p) for k in ("none", "block", "ffn") for p in ("fp32", "fp16")}
    with pytest.raises(ValueError, match="axis 'precision' repeats a setting: 'auto' and 'fp32'"):
        smoke_study(axes={"precision": ["auto", "fp32"]})


@pytest.mark.slow  # four short runs and a report: about 15 s on a loaded 2-core machine
def test_checkpointing_and_precision_axes_show_in_the_cost_table(run_cli, tmp_path):
    axes = ["--checkpointing-axis", "none,block", "--precision-axis", "fp32,fp16"]
    args = ["--variants", "relu", "--seeds", 1, "--no-stats", *axes, "--store", tmp_path / "s.db", "--json"]
    code, out, err = run_cli(*SMOKE, *args)
    assert code == 0, err
    cells = {(c["axes"]["checkpointing"], c["axes"]["precision"]): c["variants"][0] for c in json.loads(out)["cells"]}
    assert set(cells) == {(k, p) for k in ("none", "block") for p in ("fp32", "fp16")}
    for precision in ("fp32", "fp16"):  # recomputed, not kept: less saved for backward, less training memory
        plain, ck = cells["none", precision], cells["block", precision]
        assert ck["saved_bytes"] < plain["saved_bytes"] and ck["train_mem_bytes"] < plain["train_mem_bytes"]
        assert ck["step_time_s"] > 0 and plain["step_time_s"] > 0
    assert cells["none", "fp16"]["saved_bytes"] < cells["none", "fp32"]["saved_bytes"]  # half-width activations
    page = (tmp_path / "report" / "report.html").read_text()
    costs = page[page.index("saved for backward") :]  # the cost tables, one per cell, each under its axis values
    assert all(f"checkpointing={k}, precision={p}" in costs for k, p in cells)


def test_the_ray_driver_lets_go_of_each_run_once_it_is_recorded(tmp_path, monkeypatch):
    """run_on_ray held every run's lock until the whole sweep ended: a second sweep on the store waited on runs the
    first had long finished. Ray stands in here as a module that runs each task when the driver asks for it."""
    import functools
    import types

    from ffnlab.study.execute import SweepProgress, run_on_ray

    store = tmp_path / "s.db"
    todo = plan(smoke_study())[:3]
    held_at_get = []

    class Task:
        def __init__(self, fn):
            self.fn = fn

        def options(self, **kw):
            return self

        def remote(self, *args):  # an object reference: the call, made when the driver gets it
            return functools.partial(self.fn, *args)

    def get(ref):
        held_at_get.append([not locked_now(cfg) for cfg in todo])  # which runs another sweep could take now
        return ref()

    def locked_now(cfg):
        with run_lock(store, run_id(cfg), wait=False) as free:
            return not free

    ray = types.SimpleNamespace(is_initialized=lambda: True, remote=Task, get=get,
                                wait=lambda pending, num_returns: (pending[:1], pending[1:]), ObjectRef=dict)  # fmt: skip
    monkeypatch.setitem(sys.modules, "ray", ray)
    with Store(store) as s:
        for cfg in todo:
            s.claim(run_id(cfg), cfg.to_dict())
    threads = torch.get_num_threads()  # each task sets a worker's threads, here this process's
    busy = run_on_ray(todo, store, None, SweepProgress(len(todo), True, store))
    torch.set_num_threads(threads)
    assert busy == [] and held_at_get == [[False, False, False], [True, False, False], [True, True, False]]
    with Store(store, create=False) as s:
        assert [s.get(run_id(cfg)).status for cfg in todo] == ["finished"] * 3


# ---- a large sweep: planned as it goes, and stopped without a run left marked running ------------------


def statuses(store):
    with Store(store, create=False) as s:
        runs = s.runs()
    return {status: sum(r.status == status for r in runs) for status in {r.status for r in runs}}


def test_a_sweep_of_99000_runs_starts_its_first_at_once_and_a_stop_leaves_none_running(tmp_path, monkeypatch):
    """It planned and claimed every run first (220 s for 99,000), and a Ctrl-C in a run left it marked running."""
    from ffnlab.study import execute

    claimed_before_the_first = []

    def interrupted(cfg, **kw):
        claimed_before_the_first.append(sum(statuses(tmp_path / "s.db").values()))
        raise KeyboardInterrupt  # Ctrl-C while the rest of the study is still unplanned

    monkeypatch.setattr(execute, "train", interrupted)
    study = smoke_study(variants=["relu", "gelu", "swiglu"], seeds=33_000)
    with pytest.raises(KeyboardInterrupt):
        run_study(study, tmp_path / "s.db", quiet=True)
    assert claimed_before_the_first == [1]  # the first run starts before the other 98,999 are planned and claimed
    assert statuses(tmp_path / "s.db") == {"pending": 1}  # claimed and started, then put back; was 'running'


def test_a_stop_inside_planning_leaves_the_finished_runs_and_none_running(tmp_path, monkeypatch):
    from ffnlab.study import execute

    real = execute.iter_plan

    def stopped_after_two(study, seeds=None):
        runs = real(study, seeds)
        if seeds is not None:  # preflight's one run per cell and variant
            yield from runs
            return
        yield next(runs)
        yield next(runs)
        raise KeyboardInterrupt

    monkeypatch.setattr(execute, "iter_plan", stopped_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_study(smoke_study(base=replace(preset_config("smoke"), max_steps=2)), tmp_path / "s.db", quiet=True)
    assert statuses(tmp_path / "s.db") == {"finished": 2}


@pytest.mark.slow
def test_sigint_stops_a_large_sweep_of_workers_and_leaves_no_run_marked_running(tmp_path):
    store = tmp_path / "s.db"
    argv = compare_cmd(store, "--jobs", 2, "--seeds", 33_000, "--steps", 20000)
    proc = subprocess.Popen(
        argv, stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    )
    deadline = time.time() + 120  # was minutes of planning before the first run
    while len(list((tmp_path / "checkpoints").glob("*/latest.json"))) < 2:  # both workers are training
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    found = statuses(store)
    assert "running" not in found and found.get("pending", 0) >= 2, found  # the two stopped runs resume later
    assert_locks_released(tmp_path / "checkpoints")
