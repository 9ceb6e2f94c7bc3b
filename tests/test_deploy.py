"""Inference cost per variant x precision x runtime (ffnlab.tools.deploy): the harness, the rows, the Pareto front.
Nothing here asserts a time: the harness must return medians and the thread count, not fast ones."""

import json
import math
import os

import pytest
import torch

from ffnlab.tools import deploy as dp

pytest.importorskip("torchao")

TINY = dict(d_model=32, n_layers=1, n_heads=2, context=16, vocab_size=64)


def stand_in_clock(monkeypatch, seconds=lambda fn: 1.0):
    """`dp.timed` replaced: each call runs the function and takes `seconds(fn)`; nothing here is timed for real."""

    def timed(fn, device="cpu"):
        fn()
        return seconds(fn)

    monkeypatch.setattr(dp, "timed", timed)


def test_functions_are_timed_in_turns_after_a_warm_up_until_their_times_settle(monkeypatch):
    stand_in_clock(monkeypatch)
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    turns = dp.time_in_turns(fns, repeats=2, warmup=1)
    # six rounds until the median of the last 3 times is that of the 3 before, then two timed; every other round
    # the other way round
    assert "".join(calls) == "abccba" * 4
    assert turns.warmup == 6 and turns.times == [[1.0, 1.0]] * 3 and turns.settled == [True] * 3
    lat = dp.spread([3.0, 1.0, 2.0, 4.0, 5.0], batch=4, seq=8, warmup=turns.warmup, threads=2)
    assert (lat.min_s, lat.q1_s, lat.median_s, lat.q3_s, lat.max_s) == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert lat.repeats == 5 and lat.warmup == 6 and lat.tokens_per_s == 4 * 8 / 3.0 == lat.to_json()["tokens_per_s"]


def test_settled_is_a_trend_that_stopped_not_noise_that_did():
    assert dp.settled([5.0, 4.0, 3.0, 1.0, 1.5, 1.2]) is False  # 3 -> 1.2: still falling
    assert dp.settled([9.0, 1.0, 1.6, 1.0, 1.0, 1.7, 1.05]) is True  # noisy, but the median stays at 1.0-1.05
    assert dp.settled([1.0] * 5) is False  # too few to tell


def test_a_warm_up_that_never_settles_stops_and_says_so(monkeypatch):
    ticks = iter(range(1, 1000))
    stand_in_clock(monkeypatch, lambda fn: float(next(ticks)) ** 2)  # every call slower than the last: no settling
    calls = []
    turns = dp.time_in_turns([lambda: calls.append(1)], repeats=1, warmup=2)
    assert turns.warmup == dp.WARMUP_ROUNDS and turns.settled == [False] and len(calls) == dp.WARMUP_ROUNDS + 1
    calls.clear()
    assert dp.time_in_turns([lambda: calls.append(1)], repeats=3, warmup=0).warmup == 0 and len(calls) == 3


def test_a_function_that_fails_is_left_out_of_the_later_rounds(monkeypatch):
    stand_in_clock(monkeypatch)
    calls = []

    def fails():
        calls.append("x")
        raise RuntimeError("recompiled past the cache")

    turns = dp.time_in_turns([lambda: calls.append("a"), fails], repeats=2, warmup=0)
    assert "".join(calls) == "ax" + "a" and turns.errors == [None, "RuntimeError: recompiled past the cache"]
    assert turns.times == [[1.0, 1.0], []]


def test_the_rows_of_a_deployment_are_timed_in_turns_not_one_after_another(monkeypatch):
    """Two variants x two targets: after each row's set-up calls, every round calls every row's batch-1 and
    throughput forward once, in turns, so drift on a shared machine falls on all rows alike."""
    order = []

    def timed(fn, device="cpu"):
        fn()
        order.append((id(fn.func), fn.args[0].shape[0]))  # which model, which batch
        return 1.0

    monkeypatch.setattr(dp, "timed", timed)
    result = dp.run_deploy("relu,gelu", "fp32,int8", "eager", **TINY, batch=2, repeats=3, warmup=1, roofline=False)
    assert [r.reason for r in result.rows] == [None] * 6
    timed_calls = order[2 * 6 :]  # each row's first two calls are its set-up
    keys = list(dict.fromkeys(timed_calls))
    assert len(keys) == 12 and len(timed_calls) == 12 * (6 + 3)  # warm-up: 6 rounds, to settle
    rounds = [timed_calls[i : i + 12] for i in range(0, len(timed_calls), 12)]
    assert all(r == (keys if i % 2 == 0 else keys[::-1]) for i, r in enumerate(rounds))
    assert all(r.latency.warmup == 6 and r.latency.repeats == 3 for r in result.rows)
    assert result.setup["timing"] == dp.TIMING


def test_progress_is_told_per_row_and_per_timed_round():
    lines = []
    dp.run_deploy("relu", "fp32,fp16", "eager", **TINY, batch=2, repeats=2, warmup=1, roofline=False, log=lines.append)
    assert lines[0].startswith("relu fp32/eager: set up in ") and lines[0].endswith("(1/2)")
    assert lines[1] == "relu fp16/eager: not measured (fp16 is measured on a GPU; a CPU computes it through fp32) (2/2)"
    assert lines[2].startswith("timing 1 rows in turns") and any(line.startswith("warm-up: ") for line in lines)
    assert lines[-1].startswith("timed round 2/2 (")


def test_targets_expand_int8_into_each_runtimes_schemes():
    assert [t.label() for t in dp.targets("fp32,int8", "eager,onnxruntime")] == [
        "fp32/eager",
        "int8/eager/int8-dynamic",
        "int8/eager/int8-weight",
        "fp32/onnxruntime",
        "int8/onnxruntime/ort-int8-dynamic",
        "int8/onnxruntime/ort-int8-static",
    ]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"precisions": "fp8"}, r"unknown precision 'fp8' \(did you mean 'fp32'\?\); valid: fp32, bf16, fp16, int8"),
        ({"runtimes": "tensorrt"}, "unknown runtime 'tensorrt'; valid: eager, compile, onnxruntime"),
        ({"runtimes": "eagr"}, "did you mean 'eager'"),
        ({"precisions": ""}, "no precision given"),
        ({"seq": 17}, "seq must be between 1 and the model's context 16"),
        ({"repeats": 0}, "repeats >= 1"),
        ({"ffns": "gelx"}, "unknown"),
        ({"d_model": 2**20, "n_layers": 64}, "need at least"),
        ({"d_modle": 64}, "unknown model setting d_modle .did you mean 'd_model'"),
        ({"ffns": ","}, "no FFN variant given"),
        ({"precisions": "fp32,int8,FP32"}, "precision fp32 is given twice; name each precision once"),
        ({"runtimes": "eager,eager"}, "runtime eager is given twice"),
        ({"ffns": "gelu,relu,gelu"}, "FFN variant gelu is given twice"),
        ({"threads": 3}, "threads must be between 1 and 2, the logical CPUs of this machine, got 3"),
        ({"threads": 0}, "threads must be between 1 and 2"),
    ],
)
def test_bad_input_is_one_line_value_error_before_any_work(kwargs, needle, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail(f"{n} threads set"))
    with pytest.raises(ValueError, match=needle) as e:
        dp.run_deploy(**{"ffns": "gelu", **TINY, **kwargs})
    assert "\n" not in str(e.value)


def test_pareto_front_on_a_synthetic_table():
    points = [(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (4.0, 1.0), (2.0, 3.0), (5.0, 5.0), (4.0, 2.0)]
    # (3, 4) is beaten by (2, 3); (5, 5) by all but itself; (4, 2) by (4, 1); equal points both stay
    assert dp.pareto_front(points) == [True, True, False, True, True, False, False]
    assert dp.pareto_front([]) == [] and dp.pareto_front([(1.0, 1.0)]) == [True]


def row(ffn, latency_s, val_loss):
    lat = dp.Latency(1, 8, latency_s, latency_s, latency_s, latency_s, latency_s, 3, 1, 1)
    delta = dp.Delta(1, 0.0, None, None, None)
    quality = dp.Quality([0], val_loss, None, None, None, delta, None, None, "fp32 eager", "eager")
    return dp.DeployRow(ffn, "fp32", "eager", None, lat, lat, 1, 1, 1, 0.0, None, None, quality=quality)


def test_mark_front_marks_rows_with_latency_and_quality():
    rows = [
        row("relu", 1.0, 2.0),
        row("gelu", 2.0, 1.9),
        row("swiglu", 3.0, 1.95),
        dp.unmeasured("geglu", dp.Target("bf16", "eager"), "no bf16"),
    ]
    rows.append(row("reglu", 0.5, float("nan")))  # no loss to weigh: not on the front, whatever its speed
    dp.mark_front(rows)
    assert [r.on_front for r in rows] == [True, True, False, None, None]


@pytest.mark.slow  # exports and quantises an ONNX model (seconds)
def test_fresh_model_every_target_a_row_measured_or_with_its_reason(tmp_path):
    result = dp.run_deploy(
        "gelu", "fp32,fp16,int8", "eager,onnxruntime", **TINY, batch=4, repeats=2, warmup=1, threads=1, workdir=tmp_path
    )
    rows = {r.target.label(): r for r in result.rows}
    assert list(rows) == [
        "fp32/eager", "fp16/eager", "int8/eager/int8-dynamic", "int8/eager/int8-weight",
        "fp32/onnxruntime", "fp16/onnxruntime", "int8/onnxruntime/ort-int8-dynamic", "int8/onnxruntime/ort-int8-static",
    ]  # fmt: skip
    assert "GPU" in rows["fp16/eager"].reason and "exported in fp32" in rows["fp16/onnxruntime"].reason
    measured = [r for r in result.rows if r.reason is None]
    assert len(measured) == 6
    for r in measured:
        assert r.latency.batch == 1 and r.throughput.batch == 4 and r.latency.seq == 16
        assert r.latency.threads == r.throughput.threads == 1 and r.latency.repeats == 2
        assert r.disk_bytes > 0 and r.weight_bytes > 0 and r.roofline_s > 0
    assert rows["int8/eager/int8-dynamic"].weight_bytes < rows["fp32/eager"].weight_bytes
    assert rows["fp32/eager"].peak_mem_bytes > rows["fp32/eager"].weight_bytes
    assert rows["fp32/onnxruntime"].peak_mem_bytes is None and rows["fp32/onnxruntime"].notes
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gelu.onnx",
        "gelu.ort-int8-dynamic.onnx",
        "gelu.ort-int8-static.onnx",
    ]
    assert result.setup["threads"] == 1 and result.environment["torchao"]
    report = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert report["rows"][0]["latency"]["tokens_per_s"] > 0
    text = dp.format_deploy(result)
    assert "not measured: fp16 is measured on a GPU" in text and "int8-weight" in text


def test_a_quantiser_failing_for_one_variant_is_that_rows_reason(monkeypatch):
    real = dp.quantize_model

    def fails_for_gated(model, scheme):
        if any(type(m).__name__ == "GatedFFN" for m in model.modules()):
            raise RuntimeError("no kernel for this layer")
        return real(model, scheme)

    monkeypatch.setattr(dp, "quantize_model", fails_for_gated)
    result = dp.run_deploy("swiglu,relu", "int8", "eager", **TINY, batch=2, repeats=1, warmup=0, roofline=False)
    reasons = {(r.ffn, r.scheme): r.reason for r in result.rows}
    assert reasons[("swiglu", "int8-dynamic")] == "RuntimeError: no kernel for this layer"
    assert reasons[("relu", "int8-dynamic")] is None and reasons[("relu", "int8-weight")] is None


@pytest.mark.slow  # compiles the model (seconds)
def test_compiled_rows_are_measured():
    result = dp.run_deploy("relu", "fp32", "compile", **TINY, batch=2, repeats=2, warmup=1, roofline=False)
    (r,) = result.rows
    assert r.reason is None and r.latency.median_s > 0 and r.setup_s > 0


def test_int8_weights_count_their_int8_data_and_scales():
    from ffnlab.core.model import ModelConfig, Transformer
    from ffnlab.tools.quantize import quantize_model

    model = Transformer(ModelConfig(ffn="relu", **TINY))
    int8 = quantize_model(model, "int8-weight")
    qkv = int8.blocks[0].attn.qkv.weight
    assert dp.tensor_bytes(qkv) == 96 * 32 + 96 * (4 + 1)  # an int8 a weight; an fp32 scale, int8 zero point a row
    assert dp.weight_bytes(model) == 4 * sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_a_result_reads_back_from_its_json(tmp_path):
    from ffnlab.study.deployment import load_deployment, save_deployment

    rows = [
        row("relu", 1.0, 2.0),
        row("gelu", 2.0, float("nan")),
        dp.unmeasured("geglu", dp.Target("bf16", "eager"), "no bf16"),
    ]
    rows[0].quality.val_losses = {0: 2.0, 3: 2.5}
    dp.mark_front(rows)
    qat = dp.QatSummary("gelu", 0.8, dp.Delta(2, 0.03, 0.01, 0.05, 0.04), None, None, "PTQ loses too little")
    result = dp.DeployResult("store s.db", {"d_model": 8}, {"batch": 2}, {"cpu": "x"}, rows, [qat])
    store = tmp_path / "s.db"
    assert load_deployment(store) is None  # none measured yet
    save_deployment(store, result)
    back = load_deployment(store)
    assert back.rows[0] == rows[0] and back.rows[2] == rows[2] and back.qat == [qat]
    assert math.isnan(back.rows[1].quality.val_loss) and back.rows[1].latency == rows[1].latency
    assert back.to_json() == result.to_json()
    (tmp_path / "deploy.json").write_text('{"rows": 3}')
    with pytest.raises(ValueError, match="deploy.json: it has no .source.; the file is damaged"):
        load_deployment(store)  # damaged: said so, not read as none
