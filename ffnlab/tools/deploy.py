"""What a model costs at inference, per variant x precision x runtime: `run_deploy` on a fresh model.

Each row is one deployment of one variant's whole model (`Target`: a precision, a runtime and, for
int8, the quantiser of `ffnlab.tools.quantize.SCHEMES`), measured the same way:

    latency      one forward of (1, seq) tokens: median and spread (quartiles, min, max) over
                 `repeats` timed calls after `warmup` untimed ones, on a stated number of threads
    throughput   the same at (batch, seq): tokens/s
    memory       bytes of the weights as it holds them, peak bytes during a throughput forward (the
                 weights plus what it allocates; PyTorch only: ONNX Runtime reports no peak), and the
                 size of its file (ONNX) or of its torch.save state dict
    roofline     the weights read once at the copy bandwidth `ffnlab bench` measures: a floor for the
                 batch-1 latency where reading weights is the bottleneck

Runtimes: PyTorch eager, torch.compile, ONNX Runtime (the model exported by `ffnlab.tools.export`,
written atomically). Precisions: fp32, bf16 (where the hardware has it), fp16 (on a GPU), int8. A
target that cannot run here, or fails for a variant, is a row with its reason; the others are still
measured. A study's trained weights and their quality are measured by `ffnlab.study.deployment`, which
fills each row's `quality`; `pareto_front` marks the rows no other row beats on latency and loss.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.metadata
import io
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ffnlab._util import machine
from ffnlab._util.files import check_writable, writes_through
from ffnlab._util.jsonio import json_number, json_safe
from ffnlab._util.names import chosen, closest
from ffnlab._util.text import first_line, num, shorten
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.core.model import ModelConfig, Transformer, model_param_count
from ffnlab.tools.bench import measure_machine, peak_bytes_during, timed
from ffnlab.tools.quantize import SCHEMES, quantize_model, quantize_onnx, torchao_version
from ffnlab.tools.quantize import quiet_libraries as quiet_libraries  # re-exported: study.deployment quiets with it

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
RUNTIMES = ("eager", "compile", "onnxruntime")
BACKEND = {"eager": "torch", "compile": "torch", "onnxruntime": "onnx"}  # which int8 schemes a runtime runs
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# ONNX parity for a whole model: the exporter's default (1e-5) is for one FFN; a deep model's logits
# differ by more between two fp32 kernels that sum in another order
ONNX_ATOL, ONNX_RTOL = 1e-4, 1e-4
CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16", "amx_bf16")  # what int8 and bf16 speed rests on


class Unavailable(Exception):
    """A target that cannot run on this machine or runtime; the message says why."""


@dataclass(frozen=True)
class Target:
    """One way to run a model: precision, runtime, and the int8 scheme (None for a float precision)."""

    precision: str
    runtime: str
    scheme: str | None = None

    def label(self) -> str:
        return f"{self.precision}/{self.runtime}" + (f"/{self.scheme}" if self.scheme else "")

    def int8_scheme(self) -> str:
        """The quantiser of an int8 target; ValueError for a float one."""
        if self.scheme is None:
            raise ValueError(f"{self.label()} is no int8 target: it names no quantiser")
        return self.scheme


def once(values: str | Iterable[str], what: str) -> list[str]:
    """The names of a comma-separated string or a list; ValueError naming one given twice (`fp32,fp32` would
    measure a row twice, or hide a typo for another name)."""
    items = [v.strip().lower() for v in (values.split(",") if isinstance(values, str) else values)]
    twice = next((v for i, v in enumerate(items) if v and v in items[:i]), None)
    if twice is not None:
        raise ValueError(f"{what} {shorten(twice)} is given twice; name each {what} once")
    return items


def targets(precisions: str | Iterable[str] = PRECISIONS, runtimes: str | Iterable[str] = RUNTIMES) -> list[Target]:
    """Every precision on every runtime asked for, int8 once per scheme of the runtime's backend; ValueError
    naming the valid precisions or runtimes for an unknown one."""
    precisions = chosen(once(precisions, "precision"), PRECISIONS, "precision")
    runtimes = chosen(once(runtimes, "runtime"), RUNTIMES, "runtime")
    out = []
    for runtime in runtimes:
        for precision in precisions:
            if precision == "int8":
                out += [Target("int8", runtime, s) for s, spec in SCHEMES.items() if spec.backend == BACKEND[runtime]]
            else:
                out.append(Target(precision, runtime))
    return out


# ---- the records ----------------------------------------------------------------------------------


@dataclass
class Latency:
    """Seconds per forward call of (batch, seq) tokens over `repeats` timed calls after `warmup`."""

    batch: int
    seq: int
    median_s: float
    q1_s: float
    q3_s: float
    min_s: float
    max_s: float
    repeats: int
    warmup: int
    threads: int  # torch's intra-op threads, or ONNX Runtime's

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.seq / self.median_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Latency:
        return cls(**{k: v for k, v in d.items() if k != "tokens_per_s"})


@dataclass
class Delta:
    """A paired difference over seeds (ffnlab.study.stats.paired_diff): quantised minus its reference."""

    n: int
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Delta | None:
        return None if d is None else cls(**{k: json_number(v) for k, v in d.items()})


@dataclass
class Quality:
    """A deployed model's quality on the study's fixed final batches (ffnlab.study.deployment), over its seeds.

    Deltas pair each seed with the same run in fp32 PyTorch eager (`reference`); a QAT row pairs the QAT run
    with the plain run of the same seed, and `vs_ptq` with that run's int8-dynamic PTQ."""

    seeds: list[int]
    val_loss: float | None  # None where no seed's loss is finite
    test_loss: float | None
    val_acc: float | None
    test_acc: float | None
    val_loss_delta: Delta | None
    test_loss_delta: Delta | None
    val_acc_delta: Delta | None
    reference: str  # what the deltas are against
    measured_in: str  # the runtime the batches ran in (compile rows share eager's numbers)
    vs_ptq: Delta | None = None
    val_losses: dict[int, float] = field(default_factory=dict)  # per seed: to pair this row with another
    val_f1: float | None = None  # a tagger's span F1 (task tokens)
    test_f1: float | None = None
    val_f1_delta: Delta | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Quality:
        deltas = {
            k: Delta.from_json(d.get(k))
            for k in ("val_loss_delta", "test_loss_delta", "val_acc_delta", "vs_ptq", "val_f1_delta")
        }
        losses = {int(seed): json_number(v) for seed, v in d.get("val_losses", {}).items()}  # JSON keys are strings
        scores = {k: json_number(d[k]) for k in ("val_loss", "test_loss", "val_acc", "test_acc")}
        scores |= {k: json_number(d.get(k)) for k in ("val_f1", "test_f1")}  # deploy.json before F1 has none
        return cls(**{**d, **deltas, **scores, "val_losses": losses})


@dataclass
class DeployRow:
    """One variant deployed one way: its costs, or why it could not run."""

    ffn: str
    precision: str
    runtime: str
    scheme: str | None
    latency: Latency | None  # batch 1
    throughput: Latency | None  # the throughput batch
    weight_bytes: int | None
    peak_mem_bytes: int | None
    disk_bytes: int | None
    setup_s: float | None  # quantising, compiling (the first calls) or exporting and loading, before the timings
    roofline_s: float | None  # weight_bytes read once at the measured copy bandwidth
    reason: str | None  # why it was not measured
    notes: list[str] = field(default_factory=list)  # what was left unmeasured in a measured row, and why
    quality: Quality | None = None
    on_front: bool | None = None  # on the latency/loss Pareto front (None: no quality measured)
    qat_from: float | None = None  # a QAT run's model (ffnlab.study.deployment), converted to int8

    @property
    def target(self) -> Target:
        return Target(self.precision, self.runtime, self.scheme)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["latency"] = self.latency and self.latency.to_json()
        d["throughput"] = self.throughput and self.throughput.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeployRow:
        """A row read back from `to_json` (deploy.json beside a store)."""

        def timing(t: dict[str, Any] | None) -> Latency | None:
            return None if t is None else Latency.from_json(t)

        quality = None if d.get("quality") is None else Quality.from_json(d["quality"])
        return cls(**{**d, "latency": timing(d["latency"]), "throughput": timing(d["throughput"]), "quality": quality})


@dataclass(frozen=True)
class QatSummary:
    """How much of int8-dynamic PTQ's validation-loss increase a variant's QAT runs recover
    (ffnlab.study.deployment.qat_summary), paired by seed with the variant's plain runs."""

    ffn: str
    qat_from: float
    ptq_increase: Delta | None  # PTQ's loss minus fp32's
    qat_increase: Delta | None  # the QAT model's loss minus the plain runs' fp32 loss
    recovered: float | None  # 1 - qat_increase / ptq_increase; None where PTQ loses too little to recover
    summary: str  # the sentence the table prints


@dataclass
class DeployResult:
    """Every row of a deployment measurement, with the model, the settings and the machine."""

    source: str  # "fresh model" or the store measured
    model: dict[str, Any]  # the ModelConfig measured (the first variant's), and parameters per variant
    setup: dict[str, Any]  # batch, seq, repeats, warmup, threads, device, targets asked for
    environment: dict[str, Any]
    rows: list[DeployRow]
    qat: list[QatSummary] = field(default_factory=list)  # per variant and qat_from (ffnlab.study.deployment)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json_safe(
            {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [r.to_json() for r in self.rows]}
        )
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DeployResult:
        """A result read back from `to_json` (deploy.json beside a store); KeyError or TypeError for another shape."""
        qat = [QatSummary(**{**q, "ptq_increase": Delta.from_json(q["ptq_increase"]),
                             "qat_increase": Delta.from_json(q["qat_increase"]), "recovered": json_number(q["recovered"])})
               for q in d.get("qat", [])]  # fmt: skip
        return cls(
            d["source"], d["model"], d["setup"], d["environment"], [DeployRow.from_json(r) for r in d["rows"]], qat
        )


def environment() -> dict[str, Any]:
    """Where the numbers come from: machine.environment(), the CPU flags int8 and bf16 speed rest on, library versions."""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    flags = machine.cpu_flags()
    return {
        **machine.environment(),
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "bf16_native": machine.bf16_native(),
        "torchao": torchao_version(),
        "onnxruntime": version("onnxruntime"),
        "onnx": version("onnx"),
        # NOTE: OpenMP threads spin while they wait for each other unless this is PASSIVE: with other work on a core,
        # a multi-thread row's speed then swings with that work (benchmarks/README.md, "Deploy: rows in turns")
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


# ---- timing: every row's calls in turns ------------------------------------------------------------

SETTLED_CALLS, SETTLED_DRIFT = 3, 0.10  # warmed up: the median of the last 3 calls within 10% of the 3 before's
WARMUP_ROUNDS = 10  # the longest warm-up (unless --warmup asks more), where the machine's load never lets them settle
PROGRESS_EVERY_S = 5.0  # a progress line per timed round, at most this often
TIMING = "rows in turns, reversed every other round; warm-up until each call's time settles"  # what setup records


@dataclass
class Turns:
    """What `time_in_turns` measured, per function: its timed seconds, or the error it raised instead."""

    times: list[list[float]]
    errors: list[str | None]
    warmup: int  # untimed rounds before the timed ones
    settled: list[bool]  # whether the warm-up saw the function's time per call settle (True without a warm-up)


def settled(times: Sequence[float]) -> bool:
    """Whether the time per call has stopped moving: the median of the last SETTLED_CALLS times is within
    SETTLED_DRIFT of the median of the SETTLED_CALLS before them. Medians of a few, not every time, so that the
    noise of a busy machine, which timing in turns evens out, does not hold the warm-up back as a trend would."""
    if len(times) < 2 * SETTLED_CALLS:
        return False
    last = statistics.median(times[-SETTLED_CALLS:])
    before = statistics.median(times[-2 * SETTLED_CALLS : -SETTLED_CALLS])
    return abs(last - before) <= SETTLED_DRIFT * before


def time_in_turns(
    fns: Sequence[Callable[[], object]],
    repeats: int,
    warmup: int,
    device: str = "cpu",
    log: Callable[[str], None] | None = None,
) -> Turns:
    """Each of `fns` timed `repeats` times (waiting for the GPU on CUDA), in rounds that call every function once, the
    order reversed every other round (a, b, c, c, b, a, ...): a machine's drift, other work on a shared core or a
    clock that changes, then falls on every function alike instead of on whichever was timed first, and none always
    follows the same one. Before them, untimed rounds of the same kind: at least `warmup`, and on until every
    function's time per call settles (`settled`), at most max(warmup, WARMUP_ROUNDS); none for `warmup` 0. A function
    that raises is left out of the later rounds, with its error. `log` hears about the rounds."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    say = log or (lambda _: None)
    warm: list[list[float]] = [[] for _ in fns]
    times: list[list[float]] = [[] for _ in fns]
    errors: list[str | None] = [None] * len(fns)
    start = last_said = time.perf_counter()

    def call_all(round_: int, into: list[list[float]], line: str, last: bool = False) -> None:
        nonlocal last_said
        for i in range(len(fns)) if round_ % 2 == 0 else reversed(range(len(fns))):
            if errors[i] is None:
                try:
                    into[i].append(timed(fns[i], device))
                except Exception as e:  # a model failing at a later call (a compiler's cache) is its row's result
                    errors[i] = first_line(e)
        now = time.perf_counter()
        if now - last_said >= PROGRESS_EVERY_S or last:
            say(f"{line} ({now - start:.0f} s)")
            last_said = now

    def unsettled() -> bool:
        return not all(settled(t) for t, e in zip(warm, errors) if e is None)

    rounds = 0
    while warmup and rounds < max(warmup, WARMUP_ROUNDS) and (rounds < warmup or unsettled()):
        call_all(rounds, warm, f"warm-up round {rounds + 1}")
        rounds += 1
    if warmup:
        say(f"warm-up: {rounds} rounds" + (", the times still moving" if unsettled() else ", settled"))
    for r in range(repeats):
        call_all(rounds + r, times, f"timed round {r + 1}/{repeats}", last=r == repeats - 1)
    return Turns(times, errors, rounds, [settled(t) or not warmup for t in warm])


def spread(times: Sequence[float], batch: int, seq: int, warmup: int, threads: int) -> Latency:
    """The median, quartiles and extremes of one function's timed calls."""
    times = sorted(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return Latency(batch, seq, statistics.median(times), q1, q3, times[0], times[-1], len(times), warmup, threads)


# ---- sizes ----------------------------------------------------------------------------------------


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds; a tensor subclass (torchao's Int8Tensor) counts the tensors it is made of."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each shared tensor once (a tied head and embedding)."""
    seen = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(tensor_bytes(t) for t in seen.values())


def saved_size(model: nn.Module) -> int:
    """Bytes of `torch.save(model.state_dict())`: what the model takes on disk in PyTorch's format."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


# ---- deploying a model one way ---------------------------------------------------------------------


class OrtModule(nn.Module):
    """An ONNX Runtime session behind the Transformer's interface: (idx, targets=None) -> (logits, loss)."""

    def __init__(self, path: str, threads: int) -> None:
        super().__init__()
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3  # errors only
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        (logits,) = self.session.run(None, {self.input: idx.cpu().numpy()})
        logits = torch.from_numpy(logits)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


@dataclass(frozen=True)
class Inputs:
    """What every row is timed on: one example and a throughput batch of them (token ids, or images for a ViT)."""

    one: torch.Tensor  # (1, seq) token ids, or (1, channels, size, size) images
    many: torch.Tensor  # (batch, ...)
    seq: int  # positions an example makes: its tokens, or a ViT's patches (and class token)


@dataclass
class Workdir:
    """The folder a measurement writes its ONNX files to, and the files it wrote there: a file of the same name
    that was there before is another measurement's model, never reused."""

    path: Path
    written: set[Path] = field(default_factory=set)


@dataclass
class Deployed:
    """A model as one target runs it: `module(idx, targets=None) -> (logits, loss)`."""

    module: nn.Module
    weight_bytes: int
    disk_bytes: int
    setup_s: float
    notes: list[str]


def torch_module(model: nn.Module, target: Target, device: str) -> nn.Module:
    """`model` in the target's precision (a copy unless fp32); Unavailable where this machine lacks it."""
    if target.precision == "int8":
        if device != "cpu":
            raise Unavailable("int8 here is measured on the CPU")
        return quantize_model(model, target.int8_scheme())
    if target.precision == "bf16" and not machine.bf16_native(device):
        raise Unavailable("no bf16 in hardware here (AVX512_BF16 or AMX on the CPU, or a GPU with bf16)")
    if target.precision == "fp16" and device != "cuda":
        raise Unavailable("fp16 is measured on a GPU; a CPU computes it through fp32")
    return model if target.precision == "fp32" else copy.deepcopy(model).to(DTYPES[target.precision])


def onnx_paths(folder: Path, name: str, target: Target) -> list[Path]:
    """The ONNX files an onnxruntime target of the model `name` writes in `folder`: the fp32 export, and its
    quantised copy for an int8 target."""
    fp32 = folder / f"{name}.onnx"
    return [fp32] if target.scheme is None else [fp32, folder / f"{name}.{target.scheme}.onnx"]


def check_onnx_files(folder: str | os.PathLike[str], names: Iterable[str], wanted: Iterable[Target]) -> None:
    """ValueError in one line, before any work, for an ONNX file of `names` x `wanted` that cannot be written in
    `folder` as a regular file (`check_writable`): a device or a folder there, and also a FIFO or a terminal, which
    an output is written through but an ONNX file, read back to be run, cannot be."""
    onnx = [t for t in wanted if t.runtime == "onnxruntime" and t.precision in ("fp32", "int8")]
    for name in names:
        for path in (p for t in onnx for p in onnx_paths(Path(folder), name, t)):
            if writes_through(check_writable(path)):
                raise ValueError(
                    f"cannot write {path}: it is a FIFO or a terminal; an ONNX file is read back to run it"
                )


def onnx_file(
    model: nn.Module,
    name: str,
    target: Target,
    example: torch.Tensor,
    workdir: Workdir,
    calibration: Sequence[torch.Tensor],
) -> str:
    """The ONNX file a target runs: `name`.onnx, the model's fp32 export (once per measurement), quantised by its
    scheme."""
    from ffnlab.tools.export import export_onnx

    if target.precision not in ("fp32", "int8"):
        raise Unavailable(f"ONNX files are exported in fp32 (int8 by ONNX Runtime's quantiser), not {target.precision}")
    paths = onnx_paths(workdir.path, name, target)
    if paths[0] not in workdir.written:
        export_onnx(model, example.cpu(), paths[0], atol=ONNX_ATOL, rtol=ONNX_RTOL)
        workdir.written.add(paths[0])
    if target.precision == "fp32":
        return str(paths[0])
    return quantize_onnx(paths[0], paths[1], target.int8_scheme(), calibration)


def deploy(
    model: nn.Module,
    name: str,
    target: Target,
    example: torch.Tensor,
    workdir: Workdir,
    calibration: Sequence[torch.Tensor] = (),
    device: str = "cpu",
) -> Deployed:
    """`model` (fp32, eval mode; `name` names its files in `workdir`) ready to run as `target`; raises Unavailable,
    or whatever the library raised. For compile, setup_s does not yet hold the compilation: that happens at the
    first calls (`prepare`), within `compiled_together`."""
    start = time.perf_counter()
    if target.runtime == "onnxruntime":
        if device != "cpu":
            raise Unavailable("ONNX Runtime is measured on its CPU provider")
        path = onnx_file(model, name, target, example, workdir, calibration)
        session = OrtModule(path, torch.get_num_threads())
        size = os.path.getsize(path)
        return Deployed(session, size, size, time.perf_counter() - start, ["peak memory: ONNX Runtime reports none"])
    prepared = torch_module(model, target, device).eval()
    module = prepared
    if target.runtime == "compile":
        with quiet_libraries():
            compiled = torch.compile(prepared, dynamic=False)
        assert isinstance(compiled, nn.Module)  # a compiled module is an OptimizedModule; torch annotates a callable
        module = compiled
    return Deployed(module, weight_bytes(prepared), saved_size(prepared), time.perf_counter() - start, [])


@contextlib.contextmanager
def compiled_together() -> Iterator[None]:
    """torch.compile's caches emptied, and made deep enough for every compiled target of one measurement to stay
    compiled while their calls take turns (`time_rows`).

    NOTE: dynamo caches compiled code per function (Transformer.forward, shared by every model), 8 entries deep:
    past that, the later models would silently run eager. Each model takes an entry per input shape."""
    from torch._dynamo import config

    torch._dynamo.reset()
    deep = {"cache_size_limit": 1024, "accumulated_cache_size_limit": 8192}
    with config.patch({k: v for k, v in deep.items() if hasattr(config, k)}):
        yield


def unmeasured(ffn: str, target: Target, reason: str) -> DeployRow:
    return DeployRow(
        ffn, target.precision, target.runtime, target.scheme, None, None, None, None, None, None, None, reason
    )


def prepare(ffn: str, deployed: Deployed, target: Target, inputs: Inputs, device: str = "cpu") -> DeployRow:
    """A deployed model's row before its timings (`time_rows`): the first call of each input (compilation; counted
    in setup_s) and the peak memory of a throughput call."""
    module = deployed.module
    setup = deployed.setup_s
    with torch.inference_mode(), quiet_libraries():
        for x in (inputs.one, inputs.many):
            setup += timed(partial(module, x), device)
        peak = None
        if target.runtime != "onnxruntime":
            peak = deployed.weight_bytes + peak_bytes_during(partial(module, inputs.many), device)
    return DeployRow(ffn, target.precision, target.runtime, target.scheme, None, None, deployed.weight_bytes,
                     peak, deployed.disk_bytes, setup, None, None, list(deployed.notes))  # fmt: skip


Pending = tuple[DeployRow, nn.Module | None]  # a row set up, and the module its timings call (None: unmeasured)


def set_up(
    ffn: str,
    model: nn.Module,
    target: Target,
    inputs: Inputs,
    workdir: Workdir,
    calibration: Sequence[torch.Tensor] = (),
    device: str = "cpu",
) -> Pending:
    """One target of one model (named `ffn`, also in its files) deployed and `prepare`d; a target that is
    unavailable or fails gives its row's reason and no module."""
    try:
        deployed = deploy(model, ffn, target, inputs.many, workdir, calibration, device)
        return prepare(ffn, deployed, target, inputs, device), deployed.module
    except Unavailable as e:
        return unmeasured(ffn, target, str(e)), None
    except Exception as e:  # a quantiser, compiler or exporter failing for this variant is a result
        return unmeasured(ffn, target, first_line(e)), None


def progress_line(row: DeployRow) -> str:
    """What the progress lines say of a row once it is set up."""
    name = f"{row.ffn}{' QAT' if row.qat_from is not None else ''} {row.target.label()}"
    return f"{name}: not measured ({row.reason})" if row.reason else f"{name}: set up in {row.setup_s:.1f} s"


def time_rows(
    pending: Sequence[Pending],
    inputs: Inputs,
    repeats: int,
    warmup: int,
    device: str = "cpu",
    log: Callable[[str], None] | None = None,
) -> None:
    """Every row set up (`set_up`) timed, its batch-1 latency and its throughput: all rows' calls in turns
    (`time_in_turns`), so that a row's times do not depend on what ran before it or beside it. A row whose calls
    fail gets the error as its reason."""
    live = [(row, module) for row, module in pending if module is not None]
    say = log or (lambda _: None)
    say(f"timing {len(live)} rows in turns: {repeats} rounds of a batch-1 and a batch-{inputs.many.shape[0]} call each")
    fns = [partial(module, x) for _, module in live for x in (inputs.one, inputs.many)]
    with torch.inference_mode(), quiet_libraries():
        turns = time_in_turns(fns, repeats, warmup, device, log)
    for k, (row, module) in enumerate(live):
        one, many = 2 * k, 2 * k + 1
        error = turns.errors[one] or turns.errors[many]
        if error is not None:
            row.reason = error
            continue
        threads = torch.get_num_threads()
        if isinstance(module, OrtModule):
            threads = module.session.get_session_options().intra_op_num_threads
        row.latency = spread(turns.times[one], 1, inputs.seq, turns.warmup, threads)
        row.throughput = spread(turns.times[many], inputs.many.shape[0], inputs.seq, turns.warmup, threads)
        if not (turns.settled[one] and turns.settled[many]):
            row.notes.append(f"warm-up: the time per call had not settled after {turns.warmup} calls")


# ---- the trade-off ------------------------------------------------------------------------------------


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (cost, loss) points, lower being better in both: whether each is on the Pareto front, i.e. no other
    point is at least as good in both and strictly better in one. Equal points are both on it."""
    return [
        not any(c <= cost and q <= loss and (c < cost or q < loss) for c, q in points)
        for cost, loss in points
    ]  # fmt: skip


def mark_front(rows: Sequence[DeployRow]) -> None:
    """Set `on_front` of every row with a batch-1 latency and a finite validation loss (latency against loss); None
    for the others (a NaN loss would be dominated by nothing)."""
    scored: list[tuple[DeployRow, tuple[float, float]]] = []
    for r in rows:
        loss = r.quality.val_loss if r.quality is not None else None
        if r.latency is not None and loss is not None and math.isfinite(loss):
            scored.append((r, (r.latency.median_s, loss)))
    for r in rows:
        r.on_front = None
    for (r, _), on in zip(scored, pareto_front([point for _, point in scored])):
        r.on_front = on


def add_roofline(rows: Sequence[DeployRow], device: str = "cpu") -> float | None:
    """Set each measured row's roofline_s, its weights read once at the copy bandwidth `ffnlab bench` measures
    (copying as many bytes as the largest row's weights); returns that bandwidth in GB/s."""
    sizes = [r.weight_bytes for r in rows if r.weight_bytes]
    if not sizes:
        return None
    copy_gbs: float = measure_machine((8, 8, 8), max(sizes) // 4, repeats=3, device=device, dtypes=())["copy_gbs"]
    for r in rows:
        if r.weight_bytes:
            r.roofline_s = r.weight_bytes / (copy_gbs * 1e9)
    return copy_gbs


@contextlib.contextmanager
def threads_set(threads: int | None) -> Iterator[int]:
    """torch's thread count set to `threads` (unless None; `machine.check_threads`) for the block, then restored;
    yields the count used."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(machine.check_threads(threads))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def work_folder(workdir: str | os.PathLike[str] | None) -> Iterator[Workdir]:
    """`workdir` (made if missing; the ONNX files stay there), or a temporary folder deleted afterwards."""
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        yield Workdir(Path(workdir))
        return
    with tempfile.TemporaryDirectory(prefix="ffnlab-deploy-") as tmp:
        yield Workdir(Path(tmp))


def check_workdir(workdir: str | os.PathLike[str] | None, names: Iterable[str], wanted: Iterable[Target]) -> None:
    """ValueError in one line, before any work, where the ONNX folder is a file, or one of the ONNX files the models
    `names` will write in it cannot be written (`check_onnx_files`). A folder still to be made holds none."""
    if workdir is None or not os.path.lexists(workdir):
        return
    if not os.path.isdir(workdir):
        raise ValueError(f"the ONNX folder {workdir} is a file; give a folder")
    check_onnx_files(workdir, names, wanted)


def model_inputs(mcfg: ModelConfig, batch: int, seq: int, device: str = "cpu", seed: int = 0) -> Inputs:
    """One example and a batch of `batch` from a fixed generator, the same for every variant: (batch, seq) token ids,
    or for a ViT (task image) standard-normal images of its size (as normalised pixels are), `seq` its patches."""
    gen = torch.Generator().manual_seed(seed)
    if mcfg.task == "image":
        assert mcfg.image_size is not None and mcfg.channels is not None  # a ViT's config (data_model_config) sets both
        many = torch.randn(batch, mcfg.channels, mcfg.image_size, mcfg.image_size, generator=gen)
    else:
        many = torch.randint(0, mcfg.vocab_size, (batch, seq), generator=gen)
    return Inputs(many[:1].clone().to(device), many.to(device), seq)


CALIBRATION_BATCHES = 8  # batches that calibrate ort-int8-static's activation scales


def check_deploy_fits(cfgs: Sequence[ModelConfig], batch: int, seq: int, device: str, copies: int) -> list[int]:
    """Parameters of each model of `cfgs` (counted by arithmetic, `model_param_count`); ValueError naming the sizes
    when they cannot run here side by side, as their rows are timed (`time_rows`): fp32 weights of each model and
    of `copies` deployed copies (none larger), plus the throughput batch's activations (ten fp32 (batch, seq,
    d_model) tensors and the attention scores of one layer)."""
    counts = [model_param_count(c) for c in cfgs]
    widest = max(cfgs, key=lambda c: c.d_model * c.n_heads)
    need = 4 * (1 + copies) * sum(counts) + 40 * batch * seq * widest.d_model + 4 * batch * widest.n_heads * seq * seq
    names = ", ".join(c.ffn for c in cfgs)
    machine.check_memory(need, device, f"{names} at {widest.n_layers} layers of d_model {widest.d_model} "
                         f"({max(counts):,} parameters each), each deployed {copies} ways at once, at batch {batch} x "
                         f"{seq} tokens", "use a smaller --d-model, --layers or --batch, or fewer variants or "
                         "--precisions")  # fmt: skip
    return counts


def check_settings(batch: int, seq: int, context: int, repeats: int, warmup: int) -> None:
    """ValueError in one line for a batch, sequence, repeat or warm-up count that cannot be measured."""
    if batch < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need batch >= 1, repeats >= 1 and warmup >= 0, got {batch}, {repeats} and {warmup}")
    if not 1 <= seq <= context:
        raise ValueError(f"seq must be between 1 and the model's context {context}, got {seq}")


def model_seq(mcfg: ModelConfig, seq: int | None) -> int:
    """The positions an example makes: `seq` (default the context); ValueError where a ViT is given one, whose
    sequence is its patches (and class token), set by its images."""
    if mcfg.task == "image" and seq is not None:
        raise ValueError(
            "an image model's sequence is its patches, set by its images; seq does not apply: leave it out"
        )
    return seq or mcfg.context


def default_precisions(device: str = "cpu") -> tuple[str, ...]:
    """fp32, bf16 and int8, and fp16 on a GPU (a CPU has no fp16 matmul of its own)."""
    return ("fp32", "bf16", "fp16", "int8") if device == "cuda" else ("fp32", "bf16", "int8")


def run_deploy(
    ffns: str | Iterable[str] = "gelu,relu",
    precisions: str | Iterable[str] | None = None,
    runtimes: str | Iterable[str] = RUNTIMES,
    *,
    batch: int = 16,
    seq: int | None = None,
    repeats: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    device: str = "cpu",
    workdir: str | os.PathLike[str] | None = None,
    roofline: bool = True,
    log: Callable[[str], None] | None = None,
    **model: Any,  # ModelConfig's fields, checked against them below
) -> DeployResult:
    """Inference cost of fresh (untrained) models, one per FFN variant, the other `model` settings (ModelConfig's
    fields: d_model, n_layers, context, vocab_size, ...) shared: one row per variant x target (`targets`), every
    row set up first, then all timed in turns (`time_rows`).

    precisions default to `default_precisions(device)`, seq to the model's context, threads to torch's count. ONNX
    files are written to `workdir` (kept) or a temporary folder. `log` hears about the progress. ValueError in one
    line for an unknown or repeated variant, precision or runtime, bad settings, a thread count beyond the machine's
    CPUs, an ONNX file that cannot be written, or models too big for this machine, before anything is built."""
    names = [get_ffn_spec(f).name for f in (ffns.split(",") if isinstance(ffns, str) else ffns) if f.strip()]
    if not names:
        raise ValueError("no FFN variant given; name one or more, e.g. gelu,relu")
    once(names, "FFN variant")
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"ffn"}
    unknown = sorted(set(model) - fields)
    if unknown:
        raise ValueError(
            f"unknown model setting {unknown[0]}{closest(unknown[0], fields)}; valid: {', '.join(sorted(fields))}"
        )
    wanted = targets(default_precisions(device) if precisions is None else precisions, runtimes)
    if threads is not None:
        machine.check_threads(threads)
    cfgs = {name: ModelConfig(**{**model, "ffn": name}) for name in names}
    first = cfgs[names[0]]
    seq = model_seq(first, seq)
    check_settings(batch, seq, first.context, repeats, warmup)
    check_workdir(workdir, names, wanted)
    params = dict(zip(names, check_deploy_fits(list(cfgs.values()), batch, seq, device, len(wanted))))
    inputs = model_inputs(first, batch, seq, device)
    # NOTE: a fresh model has no training split: static int8 calibrates on random inputs, as its timing inputs are
    calibration = [model_inputs(first, batch, seq, seed=1 + i).many for i in range(CALIBRATION_BATCHES)]
    say = log or (lambda _: None)
    pending: list[Pending] = []
    with threads_set(threads) as used, work_folder(workdir) as folder, compiled_together():
        for name, mcfg in cfgs.items():
            transformer = Transformer(mcfg).to(device).eval()
            for target in wanted:
                pending.append(set_up(name, transformer, target, inputs, folder, calibration, device))
                say(f"{progress_line(pending[-1][0])} ({len(pending)}/{len(cfgs) * len(wanted)})")
        time_rows(pending, inputs, repeats, warmup, device, log)
        rows = [row for row, _ in pending]
        del pending  # the deployed models: before the roofline's copy takes its memory
        copy_gbs = add_roofline(rows, device) if roofline else None
    setup = {"batch": batch, "seq": seq, "repeats": repeats, "warmup": warmup, "threads": used, "device": device,
             "targets": [t.label() for t in wanted], "copy_gbs": copy_gbs, "timing": TIMING}  # fmt: skip
    return DeployResult("fresh model", {**asdict(first), "ffn": names, "params": params}, setup, environment(), rows)


# ---- the text --------------------------------------------------------------------------------------


def _ms(latency: Latency | None) -> str:
    if latency is None:
        return "-"
    return f"{latency.median_s * 1e3:.3g} [{latency.q1_s * 1e3:.3g}-{latency.q3_s * 1e3:.3g}]"


def _rate(latency: Latency) -> str:
    """Tokens (or patches) a second: the median call's, and the quartiles' [slow-fast]."""
    tokens = latency.batch * latency.seq

    def count(x: float) -> str:
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    return f"{count(tokens / latency.median_s)} [{count(tokens / latency.q3_s)}-{count(tokens / latency.q1_s)}]"


def _delta(d: Delta | None) -> str:
    if d is None or d.delta is None:
        return "-"
    ci = f" [{d.ci_low:+.3f}, {d.ci_high:+.3f}]" if d.ci_low is not None else ""
    return f"{d.delta:+.4f}{ci}"


def _row_line(r: DeployRow) -> str:
    scheme = r.scheme or "-"
    ffn = r.ffn if r.qat_from is None else f"{r.ffn} QAT"
    head = f"{ffn:<10} {r.precision:<5} {r.runtime:<11} {scheme:<16}"
    if r.latency is None or r.throughput is None:
        return f"{head} not measured: {r.reason}"

    def mb(b: int | None) -> str:
        return "-" if b is None else f"{b / 2**20:.3g}"

    roof = "-" if r.roofline_s is None else f"{r.latency.median_s / r.roofline_s:.3g}x"
    quality = "" if r.quality is None else f" {num(r.quality.val_loss, 4):>8} {_delta(r.quality.val_loss_delta):>26}"
    if r.quality is not None and r.quality.val_acc_delta is not None:  # a classifier: accuracy too
        quality += f"  acc {num(r.quality.val_acc, 3)} {_delta(r.quality.val_acc_delta)}"
    if r.quality is not None and r.quality.val_f1_delta is not None:  # a tagger: span F1 too
        quality += f"  F1 {num(r.quality.val_f1, 4)} {_delta(r.quality.val_f1_delta)}"
    front = {True: " *", False: "", None: ""}[r.on_front]
    return (f"{head} {_ms(r.latency):>22} {roof:>7} {_rate(r.throughput):>26} {mb(r.peak_mem_bytes):>8} "
            f"{mb(r.disk_bytes):>8}{quality}{front}")  # fmt: skip


def format_deploy(result: DeployResult) -> str:
    """The deployment table: one line per row, the model, settings and machine above it."""
    env, s, m = result.environment, result.setup, result.model
    image = m.get("task") == "image"
    shape = (f"{m['image_size']}x{m['image_size']} images of {m['patch_size']}x{m['patch_size']}-pixel patches"
             if image else f"context {m['context']}, vocab {m['vocab_size']}")  # fmt: skip
    lines = [
        f"ffnlab deploy: {result.source}; d_model {m['d_model']}, {m['n_layers']} layers, {shape}; batch 1 and "
        f"{s['batch']} x {s['seq']} {'patches' if image else 'tokens'}, median [quartiles] of {s['repeats']} calls a "
        f"row, the rows in turns after at least {s['warmup']} warm-up rounds, {s['threads']} threads, {s['device']}",
        f"{env.get('cpu') or '?'} (flags: {', '.join(env['cpu_flags']) or 'none of ' + ', '.join(CPU_FLAGS)}); torch "
        f"{env['torch']}, torchao {env['torchao'] or '-'}, onnxruntime {env['onnxruntime'] or '-'}"
        + (f"; copy bandwidth {s['copy_gbs']:.3g} GB/s (roofline)" if s.get("copy_gbs") else ""),
        "",
    ]
    quality = any(r.quality for r in result.rows)
    rate = "patches/s" if m.get("task") == "image" else "tokens/s"  # a ViT's tokens are its patches
    head = (f"{'ffn':<10} {'prec':<5} {'runtime':<11} {'int8 scheme':<16} {'batch-1 ms':>22} {'/roof':>7} "
            f"{rate + ' [quartiles]':>26} {'peak MB':>8} {'disk MB':>8}")  # fmt: skip
    if quality:
        head += f" {'val loss':>8} {'delta vs fp32 eager [CI]':>26}"
    lines += [head, "-" * len(head), *(_row_line(r) for r in result.rows)]
    if quality:
        lines.append("(* on the Pareto front of batch-1 latency against validation loss)")
    moving = [r for r in result.rows if any(n.startswith("warm-up") for n in r.notes)]
    if moving:
        lines.append(f"{len(moving)} rows' time per call had not settled when their timing began (the machine's load "
                     "changed): read their quartiles")  # fmt: skip
    for q in result.qat:
        lines.append(f"QAT {q.ffn}: {q.summary}")
    return "\n".join(lines)
