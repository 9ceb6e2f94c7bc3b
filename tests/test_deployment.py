"""A study's trained models deployed (ffnlab.study.deployment): quality per precision and runtime paired over seeds,
QAT against PTQ, and the store's bad cases."""

from dataclasses import replace

import pytest

from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.study import deployment as dep
from ffnlab.study.execute import execute, weights_path
from ffnlab.study.plan import run_id
from ffnlab.study.store import Store
from ffnlab.tools.deploy import format_deploy
from tests.conftest import run_result

pytest.importorskip("torchao")

TINY = ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32)
# |val loss(int8) - val loss(fp32)| of these tiny trained runs: measured at most 3e-4 nats per scheme and seed
# (torchao 0.18, onnxruntime 1.32); the bound leaves a margin of 10
LOSS_BOUND = 3e-3
FAST = dict(batch=2, repeats=1, warmup=0, threads=1, roofline=False)


def config(ffn: str, seed: int, qat_from: float | None = None) -> TrainConfig:
    return TrainConfig(model=replace(TINY, ffn=ffn), seed=seed, batch_size=8, max_steps=12, eval_every=6,
                       eval_batches=2, final_eval_batches=2, warmup_steps=2, precision="fp32", qat_from=qat_from)  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """gelu and relu on seeds 0 and 1, and gelu trained with QAT over its second half on the same seeds."""
    path = tmp_path_factory.mktemp("deploy") / "store.db"
    for cfg in [config(f, s) for f in ("gelu", "relu") for s in (0, 1)] + [config("gelu", s, 0.5) for s in (0, 1)]:
        assert execute(cfg.to_dict(), str(path)) == "finished"
    return path


def test_each_row_has_its_cost_and_its_quality_paired_over_seeds(store):
    result = dep.deploy_store(store, precisions="fp32,int8", runtimes="eager", **FAST)
    rows = {(r.ffn, r.qat_from, r.target.label()): r for r in result.rows}
    assert list(rows) == [
        ("gelu", None, "fp32/eager"), ("gelu", None, "int8/eager/int8-dynamic"), ("gelu", None, "int8/eager/int8-weight"),
        ("gelu", 0.5, "int8/eager/int8-dynamic"),
        ("relu", None, "fp32/eager"), ("relu", None, "int8/eager/int8-dynamic"), ("relu", None, "int8/eager/int8-weight"),
    ]  # fmt: skip
    with Store(store, create=False) as s:
        stored = {(r.config["model"]["ffn"], r.config["qat_from"]): [] for r in s.runs()}
        for r in s.runs():
            stored[(r.config["model"]["ffn"], r.config["qat_from"])].append(r.result.val.loss)
    for (ffn, qat, label), r in rows.items():
        assert r.reason is None and r.latency.threads == 1 and r.quality.seeds == [0, 1]
        assert r.quality.val_loss_delta.n == 2 and r.quality.test_loss is not None
        assert abs(r.quality.val_loss_delta.delta) < LOSS_BOUND
        if label == "fp32/eager" or qat:  # what the runs measured at their end (fp32; the QAT runs fake-quantised)
            assert r.quality.val_loss == pytest.approx(sum(stored[(ffn, qat)]) / 2, abs=1e-4)
    assert rows[("gelu", None, "fp32/eager")].quality.val_loss_delta.delta == 0.0
    qat = rows[("gelu", 0.5, "int8/eager/int8-dynamic")]
    assert qat.quality.reference == "fp32 eager of the plain runs" and qat.quality.vs_ptq.n == 2
    (summary,) = result.qat
    assert summary.ffn == "gelu" and summary.qat_from == 0.5 and summary.summary
    assert summary.qat_increase.delta == pytest.approx(qat.quality.val_loss_delta.delta)
    assert result.to_json()["qat"][0]["qat_increase"]["delta"] == summary.qat_increase.delta
    assert any(r.on_front for r in result.rows) and result.setup["seeds"] == [0, 1]
    assert "gelu QAT" in format_deploy(result) and "QAT gelu: qat_from 0.5" in format_deploy(result)


@pytest.mark.slow  # exports two models to ONNX (seconds)
def test_onnx_runtime_quality_is_measured_in_onnx_runtime(store, tmp_path):
    result = dep.deploy_store(store, ["relu"], "fp32,int8", "onnxruntime", workdir=tmp_path, **FAST)
    rows = {r.target.label(): r for r in result.rows}
    assert abs(rows["fp32/onnxruntime"].quality.val_loss_delta.delta) < 1e-5  # the same model, another runtime
    assert rows["fp32/onnxruntime"].quality.measured_in == "onnxruntime"
    assert abs(rows["int8/onnxruntime/ort-int8-static"].quality.val_loss_delta.delta) < LOSS_BOUND
    assert (tmp_path / "relu-seed1.ort-int8-static.onnx").is_file()


def fake_store(path, configs):
    with Store(path) as s:
        for cfg in configs:
            rid = run_id(cfg)
            s.claim(rid, cfg.to_dict())
            s.start(rid)
            s.finish(rid, run_result(ffn=cfg.model.ffn, seed=cfg.seed, config=cfg.to_dict()))
    return path


def test_a_store_without_weights_is_named(tmp_path):
    path = fake_store(tmp_path / "s.db", [config("relu", 0)])
    with pytest.raises(
        ValueError, match=rf"run store {tmp_path / 's.db'} has no saved weights for run \w+ \(relu, seed 0\)"
    ):
        dep.deploy_store(path, **FAST)
    assert not weights_path(path, run_id(config("relu", 0))).exists()


def test_a_store_of_several_settings_or_no_runs_is_refused(tmp_path):
    path = fake_store(tmp_path / "s.db", [config("relu", 0), replace(config("relu", 1), lr=1e-3)])
    with pytest.raises(ValueError, match="holds runs of 2 settings besides FFN and seed"):
        dep.deploy_store(path, **FAST)
    with pytest.raises(ValueError, match="holds no finished runs of those variants"):
        dep.deploy_store(path, ["gelu"], **FAST)
    with pytest.raises(ValueError, match="no run store at"):
        dep.deploy_store(tmp_path / "missing.db", **FAST)
    with pytest.raises(ValueError, match="unknown runtime 'tflite'; valid: eager, compile, onnxruntime"):
        dep.deploy_store(path, runtimes="tflite", **FAST)
    one = fake_store(tmp_path / "one.db", [config("relu", 0)])
    with pytest.raises(ValueError, match="seq must be between 1 and the model's context 32"):
        dep.deploy_store(one, seq=64, **FAST)  # before its (missing) weights are looked for


def test_runs_of_one_setting_differ_only_by_ffn_seed_and_qat():
    base = config("relu", 0).to_dict()
    assert dep.setting_key(base) == dep.setting_key(config("gelu", 3, 0.8).to_dict())
    assert dep.setting_key(base) != dep.setting_key(replace(config("relu", 0), max_steps=13).to_dict())


def test_qat_recovery_is_reported_only_where_ptq_loses_more_than_the_floor():
    fp32 = {s: dep.Scores(val_loss=2.0 + s / 10) for s in range(3)}
    ptq = {s: dep.Scores(fp32[s].val_loss + 0.05 + s / 1000) for s in range(3)}  # +0.051 on average
    qat = {s: dep.Scores(fp32[s].val_loss + 0.01) for s in range(3)}
    out = dep.qat_summary("gelu", 0.8, qat, {"fp32/eager": fp32, "int8/eager/int8-dynamic": ptq})
    assert out.recovered == pytest.approx(1 - 0.01 / 0.051)
    assert out.ptq_increase.n == 3 and "QAT recovers 80% of PTQ's increase" in out.summary
    small = {s: dep.Scores(fp32[s].val_loss + 0.01) for s in range(3)}
    out = dep.qat_summary("gelu", 0.8, qat, {"fp32/eager": fp32, "int8/eager/int8-dynamic": small})
    assert out.recovered is None and "little for QAT to recover" in out.summary


def test_a_classifier_reports_its_accuracy_delta(tmp_path):
    path = tmp_path / "store.db"
    for seed in (0, 1):
        cfg = replace(config("gelu", seed), model=replace(TINY, ffn="gelu", task="cls"), max_steps=4)
        assert execute(cfg.to_dict(), str(path)) == "finished"
    result = dep.deploy_store(path, precisions="fp32,int8", runtimes="eager", **FAST)
    for r in result.rows:
        assert 0 <= r.quality.val_acc <= 1 and r.quality.val_acc_delta.n == 2
        assert abs(r.quality.val_loss_delta.delta) < LOSS_BOUND
    assert "acc" in format_deploy(result)
