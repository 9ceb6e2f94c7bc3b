"""Benchmarks: FFN variants (eager, fused, compiled) and their activations, against this machine.

Per FFN variant and size: forward, backward and full-step (zero_grad, forward, backward, AdamW)
milliseconds, each the median of `repeats` after a warm-up step, the impls timed in turns; bytes
kept for backward (counted with saved-tensor hooks, weights left out); peak memory above the
inputs during a step; GFLOP/s against the machine's matmul peak (the best of its repeats, measured
at the start and at the end of a run). Per activation: GB/s against the copy bandwidth measured
in the same turns, on a tensor of the same size. Compile time (torch.compile, or the fused kernels' first build)
is reported on its own, never mixed into the medians; a backend that cannot compile here is a
row marked unavailable, with the reason.

GB/s counts bytes read plus bytes written, for the copy as for the activations: copying n bytes
moves 2n, act(x) moves 2n, act(g) * u moves 3n.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ffnlab._util.machine import bf16_native, check_memory
from ffnlab._util.text import first_line
from ffnlab.core.activations import get_activation
from ffnlab.core.ffn import (
    FFN,
    GatedFFN,
    build_ffn,
    ffn_flops_per_token,
    ffn_width,
    get_ffn_spec,
    single_ffn_spec,
    spec_of,
)
from ffnlab.core.kernels import FUSED_ACTS, compile_failure, eager_forced, gated_act, pick_backend
from ffnlab.core.memory import build_on_meta, saved_bytes

IMPLS = ("eager", "fused", "compiled")
DEFAULT_FFNS = ("swiglu", "geglu", "geglu_tanh", "reglu", "glu", "gelu")

Elementwise = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (g, u) -> act(g) * u, or act(g) if not gated
# one impl's (ffn, model, step, seconds of its first step): the copy that owns the weights, what runs it, one step
FFNRun = tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor], Callable[[], None], float]


@dataclass(frozen=True)
class Preset:
    """What `run_bench` measures when not told: the FFNs, sizes and repeats."""

    ffns: tuple[str, ...]
    tokens: tuple[int, ...]
    d_models: tuple[int, ...]
    repeats: int


QUICK = Preset(ffns=("swiglu", "gelu"), tokens=(512,), d_models=(256,), repeats=3)
FULL = Preset(ffns=DEFAULT_FFNS, tokens=(4096,), d_models=(512,), repeats=7)


# ---- timing and counting --------------------------------------------------------------------------


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def c_stderr_silenced() -> Iterator[None]:
    """The process's stderr (file descriptor 2) pointed at /dev/null while the block runs.

    NOTE: torch's profiler writes 'USDT: ... profiler_start' lines and allocator warnings there from
    C++, with no setting that stops them (KINETO_LOG_LEVEL does not), so they reached the user's
    terminal. Only the profiler's block is silenced; Python's own stderr is flushed before it.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_bytes_during(fn: Callable[[], object], device: str = "cpu") -> int:
    """Peak bytes allocated above what was live before, while fn() runs.

    CUDA: the allocator's own peak. CPU: the running sum of the profiler's allocation and free
    events (PyTorch's CPU allocator keeps no peak of its own).
    """
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with c_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def step_flops(name: str, d_model: int, d_ff: int, bias: bool, tokens: int) -> int:
    """FLOPs of one training step: forward once, backward twice the forward (two matmuls per matmul)."""
    return 3 * ffn_flops_per_token(get_ffn_spec(name), d_model, d_ff, bias) * tokens


# ---- the machine ------------------------------------------------------------------------------------


def measure_machine(
    shape: tuple[int, int, int],
    copy_numel: int,
    repeats: int,
    device: str = "cpu",
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16),
) -> dict[str, Any]:
    """This machine's peak rates at the benchmark's own sizes: matmul GFLOP/s of an (m, k) @ (k, n)
    product for each of `dtypes` (only those the run reports) and copy GB/s of `copy_numel` fp32
    values, each the best of its repeats (a peak is what the machine can do; load from other
    processes only ever lowers it). A dtype not measured has rate None."""
    m, k, n = shape
    rates: dict[torch.dtype, float | None] = {torch.float32: None, torch.bfloat16: None}
    for dtype in dtypes:
        a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
        a @ b  # warm-up
        best = best_seconds(functools.partial(torch.matmul, a, b), 2 * repeats + 1, device)
        rates[dtype] = 2 * m * k * n / best / 1e9
    src = torch.randn(copy_numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = best_seconds(lambda: dst.copy_(src), 2 * repeats, device)
    return {
        **{
            key: None if rates[dtype] is None else float(f"{rates[dtype]:.4g}")
            for key, dtype in (("matmul_gflops", torch.float32), ("matmul_gflops_bf16", torch.bfloat16))
        },
        "copy_gbs": float(f"{2 * src.numel() * 4 / best / 1e9:.4g}"),
        "matmul_shape": [m, k, n],
        "copy_mb": round(src.numel() * 4 / 2**20, 1),
        "device": torch.cuda.get_device_name()
        if torch.device(device).type == "cuda"
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
    }


def best_seconds(fn: Callable[[], object], repeats: int, device: str = "cpu") -> float:
    """Fastest seconds per call of fn over `repeats` timings, each of enough calls to last >= 1 ms: a
    calibration sized to a small benchmark is a few microseconds, below what one timing resolves."""

    def batch(calls: int) -> float:
        return timed(lambda: [fn() for _ in range(calls)], device)

    calls = 1
    while batch(calls) < 1e-3 and calls < 1 << 16:
        calls *= 2
    return min(batch(calls) for _ in range(repeats)) / calls


def calibration_size(
    ffns: Sequence[str], tokens: Sequence[int], d_models: Sequence[int]
) -> tuple[tuple[int, int, int], int]:
    """The matmul (m, k, n) and copy size the machine is calibrated at: the benchmark's largest up
    projection, tokens x d_model @ d_model x d_ff, and its hidden tensor, tokens x d_ff. Sized to what is
    timed, so `bench --quick` calibrates in milliseconds and a row's fraction of peak compares like with like."""
    d_model = max(d_models)
    d_ff = max(ffn_width(single_ffn_spec(name), d_model)[0] for name in ffns)  # sizes only: no module built
    return (max(tokens), d_model, d_ff), max(tokens) * d_ff


def check_sizes(ffns: Sequence[str], tokens: Sequence[int], d_models: Sequence[int], device: str) -> None:
    """ValueError, before anything is allocated, when a row cannot run here: sizes that overflow, or
    more memory than the machine has for a floor of what its step holds: the FFN's fp32 weights,
    gradients and AdamW moments (16 bytes a parameter), its input, output gradient and input
    gradient ((tokens, d_model) each) and three (tokens, d_ff) hidden tensors."""
    for name in ffns:
        for d_model in d_models:
            ffn = build_on_meta(functools.partial(build_ffn, name, d_model, init=None), "use a smaller --d-model")
            n_params = sum(p.numel() for p in ffn.parameters())
            need = 16 * n_params + 4 * max(tokens) * (3 * d_model + 3 * ffn.d_ff)
            what = f"{name}'s rows at d_model {d_model} ({n_params:,} parameters) on {max(tokens):,} tokens"
            check_memory(need, device, what, "use a smaller --d-model or --tokens")


def best_of(*machines: dict[str, Any]) -> dict[str, Any]:
    """The highest of each measured rate over several `measure_machine` results (start and end of a run)."""
    out = dict(machines[0])
    for key in ("matmul_gflops", "matmul_gflops_bf16", "copy_gbs"):
        values = [m[key] for m in machines if m[key] is not None]
        out[key] = max(values) if values else None
    return out


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return None


# ---- timing in turns ----------------------------------------------------------------------------------


def timed(fn: Callable[[], object], device: str = "cpu") -> float:
    """Seconds fn() takes (waiting for the GPU to finish, on CUDA)."""
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def interleaved_medians(fns: dict[str, Callable[[], float]], repeats: int, device: str = "cpu") -> dict[str, float]:
    """Median milliseconds of each fn, timed in turns (a, b, c, a, b, c, ...) so that load from other
    processes on a shared machine falls on all of them alike. Each fn returns the seconds it took
    (so that it can leave set-up, such as the forward before a backward, out of the time)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            times[name].append(fn())
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in row.items()}


def _warm_up(fn: Callable[[], object], device: str) -> tuple[float, str | None]:
    """Seconds of the first call (it builds whatever gets compiled), or the reason it failed."""
    try:
        start = time.perf_counter()
        fn()
        _sync(device)
        return time.perf_counter() - start, None
    except Exception as e:  # a compiler missing or failing here is a result, not a crash
        return 0.0, first_line(e)


# ---- FFN rows -----------------------------------------------------------------------------------------


def _ffn_row(ffn: FFN, impl: str, tokens: int, d_model: int) -> dict[str, Any]:
    """An FFN row with every measurement still empty."""
    return {
        "ffn": spec_of(ffn).name,
        "impl": impl,
        "tokens": tokens,
        "d_model": d_model,
        "d_ff": ffn.d_ff,
        "fwd_ms": None,
        "bwd_ms": None,
        "step_ms": None,
        "compile_s": None,
        "saved_bytes": None,
        "peak_mem_bytes": None,
        "gflops": None,
        "peak_frac": None,
    }


NO_COMPILE = "--no-compile (or --quick): it compiles"


def _ffn_unavailable(ffn: nn.Module, impl: str, compile: bool, hidden: torch.Tensor) -> str | None:
    """Why `impl` cannot run for this FFN here, before trying it; None if it can. `hidden` is like the
    FFN's hidden tensor, whose size and device decide whether the fused kernel is a torch.compile build."""
    if impl == "fused" and not (isinstance(ffn, GatedFFN) and ffn.fused_act is not None):
        return "no fused kernel for this variant (only gated FFNs have one)"
    if impl == "fused" and eager_forced():
        return "FFNLAB_EAGER=1"
    if not compile and (impl == "compiled" or (impl == "fused" and pick_backend(hidden) == "compiled")):
        return NO_COMPILE
    return None


def _ffn_step(
    base: nn.Module, impl: str, x: torch.Tensor, dy: torch.Tensor
) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor], Callable[[], None]]:
    """(ffn, model, step) for one impl: a copy of `base` with its own AdamW, and one training step of it."""
    ffn = copy.deepcopy(base)
    if isinstance(ffn, GatedFFN):
        ffn.fused = impl == "fused"
    model = torch.compile(ffn) if impl == "compiled" else ffn
    opt = torch.optim.AdamW(ffn.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        x.grad = None
        torch.autograd.backward(model(x), dy)  # Tensor.backward, which torch leaves unannotated
        opt.step()

    return ffn, model, step


def _fused_backend(x: torch.Tensor, hidden_numel: int) -> str:
    """Which kernels the fused path ran: they depend on the device and the hidden tensor's size."""
    backend = pick_backend(x.new_empty(hidden_numel))
    return "torch (compile failed)" if backend == "compiled" and compile_failure() else backend


def _ffn_medians(
    runs: dict[str, FFNRun], x: torch.Tensor, dy: torch.Tensor, repeats: int, device: str
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Median step, forward and backward milliseconds of every impl in `runs`, the impls timed in turns."""

    def backward(model: Callable[[torch.Tensor], torch.Tensor]) -> float:
        y = model(x)
        _sync(device)
        return timed(lambda: torch.autograd.backward(y, dy), device)

    steps = interleaved_medians({i: functools.partial(timed, r[2], device) for i, r in runs.items()}, repeats, device)
    fwds = interleaved_medians(
        {i: functools.partial(timed, functools.partial(r[1], x), device) for i, r in runs.items()}, repeats, device
    )
    bwds = interleaved_medians({i: functools.partial(backward, r[1]) for i, r in runs.items()}, repeats, device)
    return steps, fwds, bwds


def bench_ffn(
    name: str,
    tokens: int,
    d_model: int,
    repeats: int = 5,
    compile: bool = True,
    device: str = "cpu",
    machine: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per impl (eager, fused, compiled): times, saved bytes, peak memory and GFLOP/s of FFN
    `name` on `tokens` tokens; the impls share weights and inputs and are timed in turns."""
    torch.manual_seed(0)
    base = build_ffn(name, d_model).to(device)
    bias = any(n.endswith("bias") for n, _ in base.named_parameters())
    x = torch.randn(tokens, d_model, device=device, requires_grad=True)
    dy = torch.randn(tokens, d_model, device=device)
    flops = step_flops(name, d_model, base.d_ff, bias, tokens)
    rows: dict[str, dict[str, Any]] = {}
    runs: dict[str, FFNRun] = {}
    for impl in IMPLS:
        row = rows[impl] = _ffn_row(base, impl, tokens, d_model)
        reason = _ffn_unavailable(base, impl, compile, x.new_empty(tokens * base.d_ff))
        if reason:
            row["unavailable"] = reason
            continue
        ffn, model, step = _ffn_step(base, impl, x, dy)
        first_s, failure = _warm_up(step, device)
        if failure:
            row["unavailable"] = failure
            continue
        runs[impl] = (ffn, model, step, first_s)
        if impl == "fused":
            row["backend"] = _fused_backend(x, tokens * base.d_ff)
    steps, fwds, bwds = _ffn_medians(runs, x, dy, repeats, device)
    for impl, (ffn, model, step, first_s) in runs.items():
        row = rows[impl]
        row.update(fwd_ms=fwds[impl], bwd_ms=bwds[impl], step_ms=steps[impl])
        if impl != "eager":
            row["compile_s"] = round(max(0.0, first_s - steps[impl] / 1e3), 3)
        row["saved_bytes"] = saved_bytes(functools.partial(model, x), exclude=list(ffn.parameters()))
        row["peak_mem_bytes"] = peak_bytes_during(step, device)
        row["gflops"] = flops / (steps[impl] * 1e-3) / 1e9
        if machine:
            row["peak_frac"] = row["gflops"] / machine["matmul_gflops"]
    return [_rounded(r) for r in rows.values()]


# ---- activation rows ----------------------------------------------------------------------------------


def _activation_row(act_name: str, ffn_name: str, impl: str, dtype: torch.dtype, numel: int) -> dict[str, Any]:
    """An activation row with every measurement still empty."""
    return {
        "name": act_name,
        "ffn": ffn_name,
        "impl": impl,
        "dtype": str(dtype).removeprefix("torch."),
        "numel": numel,
        "fwd_ms": None,
        "fwd_bwd_ms": None,
        "gbs": None,
        "copy_gbs": None,
        "copy_frac": None,
    }


def _elementwise(impl: str, act: Callable[[torch.Tensor], torch.Tensor], act_name: str, gated: bool) -> Elementwise:
    """fn(g, u) for one impl: the fused kernel, or act(g) * u (act(g) if not gated), compiled for "compiled"."""
    if impl == "fused":

        def fn(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            return gated_act(g, u, act_name)
    else:

        def fn(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            return act(g) * u if gated else act(g)

    return torch.compile(fn, dynamic=False) if impl == "compiled" else fn


def bench_activation(
    ffn_name: str,
    tokens: int,
    d_ff: int,
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    compile: bool = True,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """One row per impl: GB/s of the elementwise part of FFN `ffn_name` on (tokens, d_ff), act(g) * u
    for gated variants and act(x) for dense ones, with forward and forward + backward milliseconds.

    copy_frac compares with a copy of one such tensor timed in the same turns (copy_gbs): on a shared
    machine a median only compares fairly with a median taken at the same moments.
    """
    spec = single_ffn_spec(ffn_name)
    act_name, gated = spec.acts[0], spec.kind == "gated"
    act = get_activation(act_name)
    torch.manual_seed(0)
    g, u, dh = (torch.randn(tokens, d_ff, device=device, dtype=dtype) for _ in range(3))
    gg, ug = g.clone().requires_grad_(), u.clone().requires_grad_()
    moved = (3 if gated else 2) * g.numel() * g.element_size()
    rows, runs = {}, {}
    for impl in IMPLS:
        row = rows[impl] = _activation_row(act_name, spec.name, impl, dtype, g.numel())
        if impl == "fused" and not (gated and act_name in FUSED_ACTS):
            row["unavailable"] = "no fused kernel (only gated activations are fused)"
            continue
        if not compile and (impl == "compiled" or (impl == "fused" and pick_backend(g) == "compiled")):
            row["unavailable"] = NO_COMPILE
            continue
        fn = _elementwise(impl, act, act_name, gated)

        def fwd(fn: Elementwise = fn) -> None:
            with torch.no_grad():
                fn(g, u)

        def fwd_bwd(fn: Elementwise = fn) -> None:
            gg.grad = ug.grad = None
            torch.autograd.backward(fn(gg, ug), dh)

        first_s, failure = _warm_up(lambda: [f() for f in (fwd, fwd_bwd)], device)
        if failure:
            row["unavailable"] = failure
            continue
        runs[impl] = (fwd, fwd_bwd, first_s)
    copy_to = torch.empty_like(g)
    fwds = interleaved_medians(
        {
            "copy": lambda: timed(lambda: copy_to.copy_(g), device),
            **{i: functools.partial(timed, r[0], device) for i, r in runs.items()},
        },
        repeats,
        device,
    )
    copy_gbs = 2 * g.numel() * g.element_size() / (fwds["copy"] * 1e-3) / 1e9
    both = interleaved_medians({i: functools.partial(timed, r[1], device) for i, r in runs.items()}, repeats, device)
    for impl, (_, _, first_s) in runs.items():
        row = rows[impl]
        row.update(fwd_ms=fwds[impl], fwd_bwd_ms=both[impl], gbs=moved / (fwds[impl] * 1e-3) / 1e9)
        if impl != "eager":
            row["compile_s"] = round(max(0.0, first_s - (fwds[impl] + both[impl]) / 1e3), 3)
        row.update(copy_gbs=copy_gbs, copy_frac=row["gbs"] / copy_gbs)
    return [_rounded(r) for r in rows.values()]


# ---- the whole run ------------------------------------------------------------------------------------


def run_bench(
    ffns: Sequence[str] | None = None,
    tokens: Sequence[int] | None = None,
    d_models: Sequence[int] | None = None,
    quick: bool = False,
    compile: bool = True,
    repeats: int | None = None,
    device: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every FFN x size x impl row, and the activations' rows at the first size, with the machine.

    Defaults come from QUICK or FULL; `log(str)` hears about progress (the CLI prints to stderr).
    `quick` also leaves out what compiles (torch.compile and the CPU's fused kernels): on a cold cache
    their builds took most of a quick run (31 s of bench --quick on the Intel Xeon with AMX).
    """
    preset = QUICK if quick else FULL
    builds = compile and not quick
    ffns = [single_ffn_spec(n).name for n in (ffns or preset.ffns)]
    tokens = list(tokens or preset.tokens)
    d_models = list(d_models or preset.d_models)
    repeats = repeats or preset.repeats
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    log = log or (lambda _: None)
    # NOTE: where bf16 is emulated (an AVX2-only CPU) its rows would time the emulation (cost: benchmarks/README.md)
    dtypes = (torch.float32, torch.bfloat16) if bf16_native(torch.device(device).type) else (torch.float32,)
    skipped = (
        []
        if len(dtypes) == 2
        else ["bf16: emulated here (no AMX or AVX512_BF16, or ONEDNN_MAX_CPU_ISA below them), not timed"]
    )
    check_sizes(ffns, tokens, d_models, device)
    shape, copy_numel = calibration_size(ffns, tokens, d_models)
    machine = measure_machine(shape, copy_numel, repeats, device, dtypes)
    log(f"machine: {machine['matmul_gflops']} GFLOP/s fp32 matmul, {machine['copy_gbs']} GB/s copy")
    # NOTE: the rows' fractions of peak are filled in at the end, against the best of two
    # measurements of the machine (start and end), so one busy moment does not make the peak
    rows = []
    for name in ffns:
        for d_model in d_models:
            for n_tokens in tokens:
                log(f"ffn {name} tokens={n_tokens} d_model={d_model}")
                rows += bench_ffn(name, n_tokens, d_model, repeats, builds, device)
    activations = []
    for name in ffns:
        d_ff = ffn_width(single_ffn_spec(name), d_models[0])[0]
        for dtype in dtypes:
            log(f"activation {name} {dtype}")
            activations += bench_activation(name, tokens[0], d_ff, dtype, repeats, builds, device)
    machine = best_of(machine, measure_machine(shape, copy_numel, repeats, device, dtypes))
    for row in rows:
        row["peak_frac"] = None if row["gflops"] is None else round(row["gflops"] / machine["matmul_gflops"], 4)
    command = (
        f"ffnlab bench --ffn {','.join(ffns)} --tokens {','.join(map(str, tokens))} "
        f"--d-model {','.join(map(str, d_models))} --repeats {repeats}"
        f"{' --quick' if quick else ''}{'' if compile else ' --no-compile'}"
    )
    return {
        "command": command,
        "machine": machine,
        "rows": rows,
        "activations": activations,
        "skipped": skipped,
        "settings": {
            "ffns": ffns,
            "tokens": tokens,
            "d_models": d_models,
            "repeats": repeats,
            "compile": builds,
            "quick": quick,
            "device": device,
        },
    }


def format_bench(result: dict[str, Any]) -> str:
    """The run as two plain-text tables, unavailable cells as '-', reasons listed below."""
    m = result["machine"]
    lines = [
        result["command"],
        f"machine: {m['device']}, {m['threads']} threads, torch {m['torch']}: matmul {m['matmul_gflops']} "
        f"GFLOP/s fp32, {m['matmul_gflops_bf16'] or 'not measured (emulated)'} bf16; copy {m['copy_gbs']} GB/s "
        "(read + write)",
        *result.get("skipped", []),
        "",
    ]
    head = (
        f"{'ffn':<11} {'impl':<9} {'tokens':>6} {'d_model':>7} {'d_ff':>5} {'fwd ms':>8} {'bwd ms':>8} "
        f"{'step ms':>8} {'saved MB':>8} {'peak MB':>8} {'GFLOP/s':>8} {'%peak':>6} {'compile s':>9}"
    )
    lines.append(head)
    notes = []
    for r in result["rows"]:
        if r.get("unavailable"):
            notes.append(f"{r['ffn']} {r['impl']}: {r['unavailable']}")
        lines.append(
            f"{r['ffn']:<11} {r['impl']:<9} {r['tokens']:>6} {r['d_model']:>7} {r['d_ff']:>5} "
            f"{_cell(r['fwd_ms'], 8)} {_cell(r['bwd_ms'], 8)} {_cell(r['step_ms'], 8)} "
            f"{_cell(r['saved_bytes'], 8, 1 / 2**20)} {_cell(r['peak_mem_bytes'], 8, 1 / 2**20)} "
            f"{_cell(r['gflops'], 8)} {_cell(r['peak_frac'], 6, 100)} {_cell(r.get('compile_s'), 9)}"
        )
    lines += [
        "",
        f"{'activation':<10} {'ffn':<11} {'impl':<9} {'dtype':<9} {'fwd ms':>8} {'f+b ms':>8} "
        f"{'GB/s':>7} {'copy GB/s':>9} {'%copy':>6}",
    ]
    for a in result["activations"]:
        if a.get("unavailable") and not a["unavailable"].startswith("no fused kernel"):  # said for the FFN
            notes.append(f"{a['name']} {a['impl']} {a['dtype']}: {a['unavailable']}")
        lines.append(
            f"{a['name']:<10} {a['ffn']:<11} {a['impl']:<9} {a['dtype']:<9} {_cell(a['fwd_ms'], 8)} "
            f"{_cell(a['fwd_bwd_ms'], 8)} {_cell(a['gbs'], 7)} {_cell(a['copy_gbs'], 9)} "
            f"{_cell(a['copy_frac'], 6, 100)}"
        )
    if notes:
        lines += ["", "unavailable:"] + [f"  {n}" for n in dict.fromkeys(notes)]
    return "\n".join(lines)


def _cell(value: float | None, width: int, scale: float = 1.0) -> str:
    if value is None:
        return f"{'-':>{width}}"
    v = value * scale
    return f"{v:>{width}.{0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2}f}"
