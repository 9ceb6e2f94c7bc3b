import json

import pytest
import torch

from ffnlab.core.ffn import build_ffn, ffn_flops_per_token, get_ffn_spec
from ffnlab.tools import bench
from ffnlab.tools.bench import (
    IMPLS,
    NO_COMPILE,
    bench_activation,
    bench_ffn,
    peak_bytes_during,
    run_bench,
    step_flops,
)

ROW_KEYS = {
    "ffn",
    "impl",
    "tokens",
    "d_model",
    "fwd_ms",
    "bwd_ms",
    "step_ms",
    "saved_bytes",
    "peak_mem_bytes",
    "gflops",
}
MACHINE = {"matmul_gflops": 100.0, "copy_gbs": 10.0}


def test_peak_bytes_during_sees_a_temporary():
    size = 1 << 20  # 4 MB of fp32, freed before the function returns
    peak = peak_bytes_during(lambda: torch.ones(size).sum())
    assert 4 * size <= peak < 8 * size


def test_bench_prints_no_profiler_lines(capfd):
    """The profiler that counts CPU peak memory writes 'USDT: ... profiler_start' lines and allocator
    warnings to the process's stderr from C++; the user's terminal sees none of them."""
    from ffnlab.cli import main

    assert (
        main(["bench", "--quick", "--no-compile", "--ffn", "gelu", "--tokens", "8", "--d-model", "8", "--repeats", "1"])
        == 0
    )
    out, err = capfd.readouterr()
    assert "gelu" in out and "bench: ffn gelu" in err  # its own progress lines still reach stderr
    assert not [line for line in err.splitlines() if not line.startswith("bench: ")], err


def test_step_flops_is_three_forwards():
    assert step_flops("swiglu", 64, 128, False, 10) == 3 * 10 * ffn_flops_per_token(
        get_ffn_spec("swiglu"), 64, 128, False
    )


def test_ffn_rows_measure_what_each_impl_keeps():
    tokens, d_model = 8, 16
    rows = {r["impl"]: r for r in bench_ffn("swiglu", tokens, d_model, repeats=2, compile=False, machine=MACHINE)}
    assert set(rows) == set(IMPLS)
    d_ff = build_ffn("swiglu", d_model).d_ff
    eager, fused = rows["eager"], rows["fused"]
    assert eager["saved_bytes"] == 4 * tokens * (d_model + 4 * d_ff)  # x, gate, act(gate), up, product
    assert fused["saved_bytes"] == 4 * tokens * (d_model + 2 * d_ff)  # x, gate, up
    for r in (eager, fused):
        assert set(r) >= ROW_KEYS and r["d_ff"] == d_ff
        assert all(r[k] > 0 for k in ("fwd_ms", "bwd_ms", "step_ms", "peak_mem_bytes", "gflops"))
        assert r["gflops"] == pytest.approx(
            step_flops("swiglu", d_model, d_ff, False, tokens) / r["step_ms"] / 1e6, rel=1e-3
        )
        assert r["peak_frac"] == pytest.approx(r["gflops"] / MACHINE["matmul_gflops"], rel=1e-3)
    assert fused["backend"] == "torch"  # tiny: below the size where building kernels pays
    assert rows["compiled"]["unavailable"] == NO_COMPILE and rows["compiled"]["step_ms"] is None


def test_dense_ffn_has_no_fused_row():
    rows = {r["impl"]: r for r in bench_ffn("gelu", 4, 8, repeats=1, compile=False)}
    assert "no fused kernel" in rows["fused"]["unavailable"] and rows["eager"]["step_ms"] > 0


def test_eager_env_makes_fused_row_unavailable(monkeypatch):
    monkeypatch.setenv("FFNLAB_EAGER", "1")
    rows = {r["impl"]: r for r in bench_ffn("swiglu", 4, 8, repeats=1, compile=False)}
    assert rows["fused"]["unavailable"] == "FFNLAB_EAGER=1"


def test_compile_failure_is_a_row_not_a_crash(monkeypatch):
    def broken_compile(fn, **kw):
        def run(*args, **kwargs):
            raise RuntimeError("no C++ compiler here\nlong traceback")

        return run

    monkeypatch.setattr(bench.torch, "compile", broken_compile)
    rows = {r["impl"]: r for r in bench_ffn("swiglu", 4, 8, repeats=1, compile=True)}
    assert rows["compiled"]["unavailable"] == "RuntimeError: no C++ compiler here"
    assert rows["eager"]["step_ms"] > 0
    acts = {r["impl"]: r for r in bench_activation("swiglu", 4, 8, repeats=1, compile=True)}
    assert acts["compiled"]["unavailable"].startswith("RuntimeError") and acts["fused"]["gbs"] > 0


def test_activation_rows_count_bytes_moved():
    rows = {r["impl"]: r for r in bench_activation("geglu", 8, 32, repeats=2, compile=False)}
    for impl in ("eager", "fused"):
        r = rows[impl]
        assert r["name"] == "gelu" and r["dtype"] == "float32" and r["numel"] == 8 * 32
        assert r["gbs"] == pytest.approx(3 * 8 * 32 * 4 / r["fwd_ms"] / 1e6, rel=1e-3)  # read g, u; write h
        assert r["copy_gbs"] > 0 and r["copy_frac"] == pytest.approx(r["gbs"] / r["copy_gbs"], rel=1e-3)
    dense = {r["impl"]: r for r in bench_activation("gelu", 8, 32, repeats=1, compile=False)}
    assert dense["eager"]["gbs"] == pytest.approx(2 * 8 * 32 * 4 / dense["eager"]["fwd_ms"] / 1e6, rel=1e-3)
    assert "unavailable" in dense["fused"]


def test_cli_bench_quick_json(run_cli):
    code, out, err = run_cli(
        "bench",
        "--quick",
        "--json",
        "--no-compile",
        "--tokens",
        "16",
        "--d-model",
        "16",
        "--ffn",
        "swiglu,gelu",
        "--repeats",
        "1",
    )
    assert code == 0, err
    result = json.loads(out)
    assert {"matmul_gflops", "copy_gbs"} <= set(result["machine"])
    assert result["machine"]["matmul_gflops"] > 0 and result["machine"]["copy_gbs"] > 0
    assert [(r["ffn"], r["impl"]) for r in result["rows"]] == [(f, i) for f in ("swiglu", "gelu") for i in IMPLS]
    assert all(set(r) >= ROW_KEYS and r["tokens"] == 16 and r["d_model"] == 16 for r in result["rows"])
    assert {(a["name"], a["impl"]) for a in result["activations"]} == {(n, i) for n in ("silu", "gelu") for i in IMPLS}
    assert all({"name", "impl", "gbs"} <= set(a) for a in result["activations"])
    assert "--no-compile" in result["command"] and "--tokens 16" in result["command"]


def test_cli_bench_table_and_errors(run_cli):
    code, out, _ = run_cli(
        "bench", "--quick", "--no-compile", "--tokens", "8", "--d-model", "8", "--ffn", "reglu", "--repeats", "1"
    )
    assert code == 0 and "reglu" in out and "GB/s" in out and "--no-compile" in out
    code, _, err = run_cli("bench", "--ffn", "swigluu", "--quick")
    assert code == 2 and "did you mean 'swiglu'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("bench", "--tokens", "0")
    assert code == 2 and "positive" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--tokens", "100000000000"], "more than the"),  # 1e11 tokens of width 256: 95 TiB of inputs
        (["--d-model", "1000000"], "more than the"),  # 8e12 parameters
        (["--d-model", "100000000000000"], "the model's sizes overflow"),
    ],
)
def test_cli_bench_refuses_sizes_beyond_the_machine_before_measuring(run_cli, monkeypatch, argv, needle):
    monkeypatch.setattr(bench, "measure_machine", lambda *a: pytest.fail("measured before checking the sizes"))
    code, out, err = run_cli("bench", "--quick", "--no-compile", "--ffn", "gelu", *argv)
    assert code == 2 and out == "" and needle in err and err.count("\n") == 1, err


def test_bf16_is_neither_calibrated_nor_timed_where_it_is_emulated(monkeypatch):
    monkeypatch.setattr(bench, "bf16_native", lambda device: False)
    result = bench.run_bench(["swiglu"], [16], [16], repeats=1, compile=False)
    assert {a["dtype"] for a in result["activations"]} == {"float32"}
    assert result["machine"]["matmul_gflops_bf16"] is None and result["machine"]["matmul_gflops"] > 0
    assert result["skipped"] and "emulated" in result["skipped"][0]
    assert "not measured (emulated)" in bench.format_bench(result)
    monkeypatch.setattr(bench, "bf16_native", lambda device: True)
    result = bench.run_bench(["swiglu"], [16], [16], repeats=1, compile=False)
    assert {a["dtype"] for a in result["activations"]} == {"float32", "bfloat16"} and not result["skipped"]


@pytest.mark.parametrize(
    "flags, isa, native",
    [
        ({"amx_bf16", "avx512f", "avx2"}, "", True),
        ({"avx512_bf16", "avx512f", "avx2"}, "avx512_core_bf16", True),
        ({"avx2", "fma"}, "", False),
        ({"amx_bf16", "avx512f", "avx2"}, "AVX2", False),  # oneDNN capped below bf16: emulated whatever the CPU
    ],
)
def test_precision_and_calibration_follow_the_cpu_flags(monkeypatch, flags, isa, native):
    """An AMX CPU trains in bf16 and calibrates bf16 matmuls; an AVX2-only one does neither (issue #16)."""
    from ffnlab._util import machine
    from ffnlab.run.device import resolve_precision

    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    calibrated = []
    real = bench.measure_machine

    def measure(shape, copy_numel, repeats, device, dtypes):  # what it is asked to calibrate; fp32 only, fast
        calibrated.append(tuple(dtypes))
        return {
            **real(shape, copy_numel, repeats, device, (torch.float32,)),
            "matmul_gflops_bf16": 1.0 if torch.bfloat16 in dtypes else None,
        }

    monkeypatch.setattr(bench, "measure_machine", measure)
    result = bench.run_bench(["gelu"], [16], [16], repeats=1, compile=False)
    assert resolve_precision("auto", "cpu") == ("bf16" if native else "fp32")
    assert calibrated[0] == ((torch.float32, torch.bfloat16) if native else (torch.float32,))
    assert bool(result["skipped"]) != native


def test_calibration_is_sized_to_the_benchmark(monkeypatch):
    """The matmul peak is measured at the run's largest up projection and the copy at its hidden tensor,
    not at a fixed 2048^2 (issue #16: `bench --quick` calibrated longer than it benchmarked)."""
    shape, copy_numel = bench.calibration_size(["gelu", "swiglu"], [16, 32], [16, 8])
    d_ff = max(build_ffn(n, 16).d_ff for n in ("gelu", "swiglu"))
    assert shape == (32, 16, d_ff) and copy_numel == 32 * d_ff
    result = bench.run_bench(["gelu"], [16], [16], repeats=1, compile=False)
    assert result["machine"]["matmul_shape"] == [16, 16, build_ffn("gelu", 16).d_ff]
    assert result["machine"]["copy_mb"] == round(16 * 64 * 4 / 2**20, 1)


def test_quick_leaves_out_what_compiles(monkeypatch):
    """bench --quick builds nothing: torch.compile's rows and, where the fused kernel would be a
    torch.compile build (large CPU tensors), the fused rows say why they are left out (issue #26:
    on a cold cache the builds took most of a quick run)."""
    from ffnlab.tools import bench

    monkeypatch.setattr(bench, "pick_backend", lambda t: "compiled")  # as for a large CPU tensor
    result = run_bench(["swiglu"], [8], [8], quick=True, repeats=1)
    for rows in (result["rows"], result["activations"]):
        by_impl = {r["impl"]: r for r in rows}
        assert by_impl["compiled"]["unavailable"] == by_impl["fused"]["unavailable"] == NO_COMPILE
        assert "unavailable" not in by_impl["eager"] and all(r.get("compile_s") is None for r in rows)
    assert result["settings"]["compile"] is False and "--no-compile" not in result["command"]
