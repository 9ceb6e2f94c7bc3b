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
from ffnlab._util.jsonio import json_number, json_safe
from ffnlab._util.names import chosen, closest
from ffnlab._util.text import first_line, num
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.core.memory import build_on_meta
from ffnlab.core.model import ModelConfig, Transformer, param_count
from ffnlab.tools.bench import measure_machine, peak_bytes_during, timed
from ffnlab.tools.quantize import SCHEMES, quantize_model, quantize_onnx, quiet_libraries, torchao_version

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


def targets(precisions: str | Iterable[str] = PRECISIONS, runtimes: str | Iterable[str] = RUNTIMES) -> list[Target]:
    """Every precision on every runtime asked for, int8 once per scheme of the runtime's backend; ValueError
    naming the valid precisions or runtimes for an unknown one."""
    precisions = chosen(precisions, PRECISIONS, "precision")
    runtimes = chosen(runtimes, RUNTIMES, "runtime")
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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Quality:
        deltas = {
            k: Delta.from_json(d.get(k)) for k in ("val_loss_delta", "test_loss_delta", "val_acc_delta", "vs_ptq")
        }
        losses = {int(seed): json_number(v) for seed, v in d.get("val_losses", {}).items()}  # JSON keys are strings
        scores = {k: json_number(d[k]) for k in ("val_loss", "test_loss", "val_acc", "test_acc")}
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
        timing = lambda t: None if t is None else Latency.from_json(t)
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
    }


# ---- timing and sizes -----------------------------------------------------------------------------


def measure_latency(
    fn: Callable[[], object], batch: int, seq: int, repeats: int, warmup: int, device: str = "cpu"
) -> Latency:
    """`fn()` called `warmup` times untimed, then `repeats` times timed (waiting for the GPU on CUDA)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn()
    times = sorted(timed(fn, device) for _ in range(repeats))
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return Latency(
        batch, seq, statistics.median(times), q1, q3, times[0], times[-1], repeats, warmup, torch.get_num_threads()
    )


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


def onnx_file(
    model: nn.Module,
    name: str,
    target: Target,
    example: torch.Tensor,
    workdir: Path,
    calibration: Sequence[torch.Tensor],
) -> str:
    """The ONNX file a target runs: `name`.onnx, the model's fp32 export (once per folder), quantised by its scheme."""
    from ffnlab.tools.export import export_onnx

    if target.precision not in ("fp32", "int8"):
        raise Unavailable(f"ONNX files are exported in fp32 (int8 by ONNX Runtime's quantiser), not {target.precision}")
    fp32 = workdir / f"{name}.onnx"
    if not fp32.exists():
        export_onnx(model, example.cpu(), fp32, atol=ONNX_ATOL, rtol=ONNX_RTOL)
    if target.precision == "fp32":
        return str(fp32)
    return quantize_onnx(fp32, workdir / f"{name}.{target.scheme}.onnx", target.int8_scheme(), calibration)


def deploy(
    model: nn.Module,
    name: str,
    target: Target,
    example: torch.Tensor,
    workdir: Path,
    calibration: Sequence[torch.Tensor] = (),
    device: str = "cpu",
) -> Deployed:
    """`model` (fp32, eval mode; `name` names its files in `workdir`) ready to run as `target`; raises Unavailable,
    or whatever the library raised. For compile, setup_s does not yet hold the compilation: that happens at the
    first calls (`measure_target`)."""
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
            # NOTE: dynamo caches compiled code per function (Transformer.forward), 8 entries deep: past that, later
            # models of a sweep would silently run eager; each compiled target starts from an empty cache
            torch._dynamo.reset()
            compiled = torch.compile(prepared, dynamic=False)
        assert isinstance(compiled, nn.Module)  # a compiled module is an OptimizedModule; torch annotates a callable
        module = compiled
    return Deployed(module, weight_bytes(prepared), saved_size(prepared), time.perf_counter() - start, [])


def unmeasured(ffn: str, target: Target, reason: str) -> DeployRow:
    return DeployRow(
        ffn, target.precision, target.runtime, target.scheme, None, None, None, None, None, None, None, reason
    )


def measure_target(
    ffn: str,
    deployed: Deployed,
    target: Target,
    inputs: tuple[torch.Tensor, torch.Tensor],
    repeats: int,
    warmup: int,
    device: str = "cpu",
) -> DeployRow:
    """One row: batch-1 latency and throughput of a deployed model on `inputs` ((1, seq) and (batch, seq) token
    ids), after a first call of each (compilation; counted in setup_s) and `warmup` more."""
    one, many = inputs
    module = deployed.module
    setup = deployed.setup_s
    with torch.inference_mode(), quiet_libraries():
        for x in (one, many):
            setup += timed(partial(module, x), device)
        latency = measure_latency(lambda: module(one), 1, one.shape[1], repeats, warmup, device)
        throughput = measure_latency(lambda: module(many), many.shape[0], many.shape[1], repeats, warmup, device)
        peak = None
        if target.runtime != "onnxruntime":
            peak = deployed.weight_bytes + peak_bytes_during(lambda: module(many), device)
    if isinstance(module, OrtModule):
        latency.threads = throughput.threads = module.session.get_session_options().intra_op_num_threads
    return DeployRow(ffn, target.precision, target.runtime, target.scheme, latency, throughput, deployed.weight_bytes,
                     peak, deployed.disk_bytes, setup, None, None, list(deployed.notes))  # fmt: skip


def measure_model(
    ffn: str,
    model: nn.Module,
    wanted: Sequence[Target],
    inputs: tuple[torch.Tensor, torch.Tensor],
    workdir: Path,
    repeats: int,
    warmup: int,
    calibration: Sequence[torch.Tensor] = (),
    device: str = "cpu",
) -> list[DeployRow]:
    """One row per target for one model (named `ffn`, also in its files); a target that is unavailable or fails
    gives its row's reason."""
    model.eval()
    rows = []
    for target in wanted:
        try:
            deployed = deploy(model, ffn, target, inputs[1], workdir, calibration, device)
            rows.append(measure_target(ffn, deployed, target, inputs, repeats, warmup, device))
        except Unavailable as e:
            rows.append(unmeasured(ffn, target, str(e)))
        except Exception as e:  # a quantiser, compiler or exporter failing for this variant is a result
            rows.append(unmeasured(ffn, target, first_line(e)))
    return rows


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
    copy_gbs = measure_machine((8, 8, 8), max(sizes) // 4, repeats=3, device=device, dtypes=())["copy_gbs"]
    for r in rows:
        if r.weight_bytes:
            r.roofline_s = r.weight_bytes / (copy_gbs * 1e9)
    return copy_gbs


@contextlib.contextmanager
def threads_set(threads: int | None) -> Iterator[int]:
    """torch's thread count set to `threads` (unless None) for the block, then restored; yields the count used."""
    before = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be positive, got {threads}")
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def work_folder(workdir: str | os.PathLike | None) -> Iterator[Path]:
    """`workdir` (made if missing; the ONNX files stay there), or a temporary folder deleted afterwards."""
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        yield Path(workdir)
        return
    with tempfile.TemporaryDirectory(prefix="ffnlab-deploy-") as tmp:
        yield Path(tmp)


def token_inputs(
    vocab_size: int, batch: int, seq: int, device: str = "cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, seq) and (batch, seq) token ids from a fixed generator: the same inputs for every variant."""
    gen = torch.Generator().manual_seed(seed)
    many = torch.randint(0, vocab_size, (batch, seq), generator=gen)
    return many[:1].clone().to(device), many.to(device)


CALIBRATION_BATCHES = 8  # batches that calibrate ort-int8-static's activation scales


def check_deploy_fits(mcfg: ModelConfig, batch: int, seq: int, device: str) -> int:
    """Parameters of the model `mcfg` (counted on the meta device); ValueError naming the sizes when it cannot run
    here: fp32 weights twice (the model and one converted copy) plus the throughput batch's activations
    (ten fp32 (batch, seq, d_model) tensors and the attention scores of one layer)."""
    n_params = param_count(build_on_meta(lambda: Transformer(mcfg), "use a smaller --d-model, --layers or --context"))
    need = 8 * n_params + 40 * batch * seq * mcfg.d_model + 4 * batch * mcfg.n_heads * seq * seq
    machine.check_memory(need, device, f"{mcfg.n_layers} layers of d_model {mcfg.d_model} ({n_params:,} parameters) at "
                         f"batch {batch} x {seq} tokens", "use a smaller --d-model, --layers or --batch")  # fmt: skip
    return n_params


def check_settings(batch: int, seq: int, context: int, repeats: int, warmup: int) -> None:
    """ValueError in one line for a batch, sequence, repeat or warm-up count that cannot be measured."""
    if batch < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need batch >= 1, repeats >= 1 and warmup >= 0, got {batch}, {repeats} and {warmup}")
    if not 1 <= seq <= context:
        raise ValueError(f"seq must be between 1 and the model's context {context}, got {seq}")


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
    workdir: str | os.PathLike | None = None,
    roofline: bool = True,
    **model: Any,  # ModelConfig's fields, checked against them below
) -> DeployResult:
    """Inference cost of fresh (untrained) models, one per FFN variant, the other `model` settings (ModelConfig's
    fields: d_model, n_layers, context, vocab_size, ...) shared: one row per variant x target (`targets`).

    precisions default to `default_precisions(device)`, seq to the model's context, threads to torch's count. ONNX files are written to
    `workdir` (kept) or a temporary folder. ValueError in one line for an unknown variant, precision or
    runtime, bad settings, or a model too big for this machine, before anything is built."""
    names = [get_ffn_spec(f).name for f in (ffns.split(",") if isinstance(ffns, str) else ffns) if f.strip()]
    if not names:
        raise ValueError("no FFN variant given; name one or more, e.g. gelu,relu")
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"ffn"}
    unknown = sorted(set(model) - fields)
    if unknown:
        raise ValueError(
            f"unknown model setting {unknown[0]}{closest(unknown[0], fields)}; valid: {', '.join(sorted(fields))}"
        )
    wanted = targets(default_precisions(device) if precisions is None else precisions, runtimes)
    cfgs = {name: ModelConfig(**{**model, "ffn": name}) for name in names}
    first = cfgs[names[0]]
    seq = seq or first.context
    check_settings(batch, seq, first.context, repeats, warmup)
    params = {name: check_deploy_fits(c, batch, seq, device) for name, c in cfgs.items()}
    inputs = token_inputs(first.vocab_size, batch, seq, device)
    # NOTE: a fresh model has no training split: static int8 calibrates on random tokens, as its timing inputs are
    calibration = [token_inputs(first.vocab_size, batch, seq, seed=1 + i)[1] for i in range(CALIBRATION_BATCHES)]
    rows: list[DeployRow] = []
    with threads_set(threads) as used, work_folder(workdir) as folder:
        for name, mcfg in cfgs.items():
            transformer = Transformer(mcfg).to(device)
            rows += measure_model(name, transformer, wanted, inputs, folder, repeats, warmup, calibration, device)
        copy_gbs = add_roofline(rows, device) if roofline else None
    setup = {"batch": batch, "seq": seq, "repeats": repeats, "warmup": warmup, "threads": used, "device": device,
             "targets": [t.label() for t in wanted], "copy_gbs": copy_gbs}  # fmt: skip
    return DeployResult("fresh model", {**asdict(first), "ffn": names, "params": params}, setup, environment(), rows)


# ---- the text --------------------------------------------------------------------------------------


def _ms(latency: Latency | None) -> str:
    if latency is None:
        return "-"
    return f"{latency.median_s * 1e3:.3g} [{latency.q1_s * 1e3:.3g}-{latency.q3_s * 1e3:.3g}]"


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
    mb = lambda b: "-" if b is None else f"{b / 2**20:.3g}"
    roof = "-" if r.roofline_s is None else f"{r.latency.median_s / r.roofline_s:.3g}x"
    quality = "" if r.quality is None else f" {num(r.quality.val_loss, 4):>8} {_delta(r.quality.val_loss_delta):>26}"
    if r.quality is not None and r.quality.val_acc_delta is not None:  # a classifier: accuracy too
        quality += f"  acc {num(r.quality.val_acc, 3)} {_delta(r.quality.val_acc_delta)}"
    front = {True: " *", False: "", None: ""}[r.on_front]
    return (f"{head} {_ms(r.latency):>22} {roof:>7} {r.throughput.tokens_per_s:>10.4g} {mb(r.peak_mem_bytes):>8} "
            f"{mb(r.disk_bytes):>8}{quality}{front}")  # fmt: skip


def format_deploy(result: DeployResult) -> str:
    """The deployment table: one line per row, the model, settings and machine above it."""
    env, s, m = result.environment, result.setup, result.model
    lines = [
        f"ffnlab deploy: {result.source}; d_model {m['d_model']}, {m['n_layers']} layers, context {m['context']}, "
        f"vocab {m['vocab_size']}; batch 1 and {s['batch']} x {s['seq']} tokens, median [quartiles] of {s['repeats']} "
        f"calls after {s['warmup']} warm-up, {s['threads']} threads, {s['device']}",
        f"{env.get('cpu') or '?'} (flags: {', '.join(env['cpu_flags']) or 'none of ' + ', '.join(CPU_FLAGS)}); torch "
        f"{env['torch']}, torchao {env['torchao'] or '-'}, onnxruntime {env['onnxruntime'] or '-'}"
        + (f"; copy bandwidth {s['copy_gbs']:.3g} GB/s (roofline)" if s.get("copy_gbs") else ""),
        "",
    ]
    quality = any(r.quality for r in result.rows)
    head = (f"{'ffn':<10} {'prec':<5} {'runtime':<11} {'int8 scheme':<16} {'batch-1 ms':>22} {'/roof':>7} "
            f"{'tokens/s':>10} {'peak MB':>8} {'disk MB':>8}")  # fmt: skip
    if quality:
        head += f" {'val loss':>8} {'delta vs fp32 eager [CI]':>26}"
    lines += [head, "-" * len(head), *(_row_line(r) for r in result.rows)]
    if quality:
        lines.append("(* on the Pareto front of batch-1 latency against validation loss)")
    for q in result.qat:
        lines.append(f"QAT {q.ffn}: {q.summary}")
    return "\n".join(lines)
