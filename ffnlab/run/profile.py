"""Where a training step's time goes: torch.profiler over a few steps after warm-up (`train --profile`).

A step is three phases, each a profiler range: forward, backward, and the optimizer (gradient clipping,
AdamW, zeroing), the step as `train` takes it (`apply_gradients` names the last two, fp16's scaler
included). The forward is split by part of the model, labelled by hooks on its modules: attention,
the FFN's input matrices (W_in, or W_gate and W_up), its activation (what is left of the FFN: the
activation and the gate's product, fused or not), its output matrix (W_out or W_down), the norms, and
the rest (embeddings, head, loss). The top operators over the whole step, backward included, show what
the kernels spend it on.

NOTE: autograd runs the backward's operators after the forward's ranges have closed, so the backward is
one phase, not split by part; with `compile` the forward is one compiled graph and its parts are not
labelled (hooks would break it into pieces and change what is measured).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol, TypedDict, cast

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.utils.hooks import RemovableHandle

from ffnlab._util.machine import check_threads
from ffnlab.core.ffn import DenseFFN, GatedFFN, MixFFN
from ffnlab.core.model import Attention
from ffnlab.run.config import TrainConfig
from ffnlab.run.train import Setup, apply_gradients, forward_backward, prepare
from ffnlab.tools.bench import c_stderr_silenced

PHASES = ("forward", "backward", "optimizer")
OTHER = "everything else (dispatch, Python, autograd)"
# the kinds of work a step's operators do, by the operator's name (first match wins; the rest is OTHER): what a
# speed ratio between two implementations is made of (benchmarks/train_speed.py prints them side by side)
KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("matmul (mm, addmm, bmm)", lambda n: n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::_addmm_activation")),
    ("attention kernels (SDPA)", lambda n: "scaled_dot_product" in n and not n.startswith("graph_")),
    ("compiled (inductor) kernels", lambda n: n.startswith(("graph_", "cpp_fused", "kernel_cpp"))),
    ("optimizer (fused AdamW, clipping norms)", lambda n: n in ("aten::_fused_adamw_", "aten::linalg_vector_norm",
                                                             "aten::_foreach_norm", "aten::_foreach_mul_")),
    ("norms", lambda n: "layer_norm" in n or "rms_norm" in n),
    ("activations", lambda n: n.startswith(("aten::gelu", "aten::silu", "aten::relu", "aten::threshold_backward",
                                            "aten::sigmoid", "aten::tanh", "aten::erf"))),
    ("casts and copies", lambda n: n in ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous")),
)  # fmt: skip
FFN_IN, FFN_OUT = ("w_in", "w_gate", "w_up"), ("w_out", "w_down")
NORMS = (nn.LayerNorm, nn.RMSNorm)


@dataclass(frozen=True)
class Share:
    """A part of a step, or an operator: milliseconds per step and the fraction of the step."""

    name: str
    ms: float
    share: float
    calls: int | None = None  # per step, for an operator


@dataclass(frozen=True)
class StepProfile:
    """Where one training step of a config spends its time, averaged over `steps` profiled steps."""

    ffn: str
    precision: str
    threads: int
    steps: int
    step_ms: float  # the three phases together
    parts: list[Share]  # the forward's parts, then backward and optimizer: they add up to the step
    operators: list[Share]  # the operators with the most time of their own, over the whole step
    kinds: list[Share] = field(default_factory=list)  # the step's own time by kind of work (KINDS, then OTHER)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepProfile:
        """A profile read back from `to_json` (profiles.json beside a store; one written before `kinds` has none)."""
        shares: Callable[[list[dict[str, Any]]], list[Share]] = lambda rows: [Share(**row) for row in rows]
        kinds = shares(d.get("kinds", []))
        return cls(**{**d, "parts": shares(d["parts"]), "operators": shares(d["operators"]), "kinds": kinds})


def part_of(name: str, module: nn.Module, in_ffn: bool) -> str | None:
    """The label of the part a module is, for the forward's breakdown; None for one not labelled."""
    last = name.rpartition(".")[2]
    if isinstance(module, Attention):
        return "attention"
    if isinstance(module, DenseFFN | GatedFFN | MixFFN) and not in_ffn:  # a mix's branches are in its range
        return "ffn"
    if in_ffn and isinstance(module, nn.Linear):
        return "ffn in" if last in FFN_IN else "ffn out" if last in FFN_OUT else None
    return "norms" if isinstance(module, NORMS) else None


@contextlib.contextmanager
def labelled(model: nn.Module) -> Iterator[None]:
    """Each labelled module's forward inside a profiler range named after its part, while the block runs."""
    handles: list[RemovableHandle] = []
    open_ranges: list[record_function] = []  # entered and not yet left, the innermost last

    def enter(label: str) -> Callable[[nn.Module, object], None]:
        def hook(module: nn.Module, args: object) -> None:
            # torch leaves __enter__ unannotated; entered directly, as a wrapper would add its own time to the range
            open_ranges.append(record_function(label).__enter__())  # type: ignore[no-untyped-call]

        return hook

    def leave(module: nn.Module, args: object, output: object) -> None:
        open_ranges.pop().__exit__(None, None, None)

    ffns = {name for name, m in model.named_modules() if isinstance(m, DenseFFN | GatedFFN | MixFFN)}
    for name, module in model.named_modules():
        in_ffn = any(name.startswith(f"{ffn}.") for ffn in ffns)
        label = part_of(name, module, in_ffn)
        if label is not None:
            handles += [module.register_forward_pre_hook(enter(label)), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def profile_training(cfg: TrainConfig, steps: int = 5, warmup: int = 3, top: int = 10) -> StepProfile:
    """Train `warmup` steps of `cfg` (no checkpoints) on its `threads` (the process's where None), then profile
    `steps` more: the step's phases, the forward's parts and the `top` operators by their own time."""
    before = torch.get_num_threads()
    torch.set_num_threads(check_threads(cfg.threads or before))
    try:
        return profiled(prepare(replace(cfg, checkpoint_dir=None)), steps, warmup, top)
    finally:
        torch.set_num_threads(before)


def profiled(setup: Setup, steps: int, warmup: int, top: int) -> StepProfile:
    """`profile_training` of a prepared run."""
    model = setup.model
    model.train()

    def step() -> None:  # as `train` steps: `forward_backward` (it labels the forward and backward phases), then
        # `apply_gradients` (the optimizer phase; fp16's gradient scaler included)
        apply_gradients(setup, forward_backward(setup), next(steps_taken))

    steps_taken = itertools.count()
    for _ in range(warmup):
        step()
    hooks = contextlib.nullcontext() if setup.cfg.compile else labelled(model)
    with hooks, c_stderr_silenced(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    # NOTE: FunctionEventAvg declares its key str | None until an event is added; key_averages adds one to each
    events = cast(Sequence[Average], prof.key_averages())
    return StepProfile(
        ffn=setup.model_cfg.ffn,
        precision=setup.cfg.precision,
        threads=torch.get_num_threads(),
        steps=steps,
        **step_shares(events, steps, top),
    )


class Average(Protocol):
    """What `step_shares` reads of one of the profiler's averages over an operator or range (FunctionEventAvg)."""

    @property
    def key(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def cpu_time_total(self) -> float: ...
    @property
    def self_cpu_time_total(self) -> float: ...


class StepShares(TypedDict):
    """A StepProfile's times, as `step_shares` reads them from the profiler."""

    step_ms: float
    parts: list[Share]
    operators: list[Share]
    kinds: list[Share]


def step_shares(events: Sequence[Average], steps: int, top: int) -> StepShares:
    """step_ms, parts and operators from the profiler's averages (microseconds over all profiled steps)."""
    inclusive = {e.key: e.cpu_time_total / 1e3 / steps for e in events}
    own: Callable[[str], float] = lambda label: inclusive.get(label, 0.0)
    step_ms = sum(own(p) for p in PHASES)
    ffn = own("ffn")
    parts = {
        "attention": own("attention"),
        "FFN input matrices": own("ffn in"),
        "FFN activation (and gate product)": max(0.0, ffn - own("ffn in") - own("ffn out")) if ffn else 0.0,
        "FFN output matrix": own("ffn out"),
        "norms": own("norms"),
    }
    parts["rest of forward (embeddings, head, loss)"] = max(0.0, own("forward") - sum(parts.values()))
    parts |= {"backward": own("backward"), "optimizer (clip, AdamW, zero)": own("optimizer")}
    labels = {*PHASES, "attention", "ffn", "ffn in", "ffn out", "norms"}
    ops = sorted((e for e in events if e.key not in labels), key=lambda e: e.self_cpu_time_total, reverse=True)
    share: Callable[[float], float] = lambda ms: ms / step_ms if step_ms else 0.0
    kinds = dict.fromkeys([name for name, _ in KINDS] + [OTHER], 0.0)
    for e in events:  # every operator's own time, the labels' included (their own time is dispatch and hooks)
        kind = next((name for name, test in KINDS if test(e.key)), OTHER)
        kinds[kind] += e.self_cpu_time_total / 1e3 / steps
    return {
        "kinds": [Share(name, ms, share(ms)) for name, ms in kinds.items()],
        "step_ms": step_ms,
        "parts": [Share(name, ms, share(ms)) for name, ms in parts.items()],
        "operators": [
            Share(
                e.key, e.self_cpu_time_total / 1e3 / steps, share(e.self_cpu_time_total / 1e3 / steps), e.count // steps
            )
            for e in ops[:top]
        ],
    }


def format_profile(profile: StepProfile) -> str:
    """The breakdown as two small tables: the step's parts, then the top operators."""
    lines = [
        f"profile of {profile.ffn}: {profile.step_ms:.1f} ms a step ({profile.steps} steps after warm-up, "
        f"{profile.precision}, {profile.threads} threads)",
        f"  {'part':<42}{'ms':>8}{'share':>8}",
    ]
    lines += [f"  {p.name:<42}{p.ms:>8.2f}{p.share:>8.1%}" for p in profile.parts]
    lines += ["", f"  {'operator (own time)':<42}{'ms':>8}{'share':>8}{'calls':>7}"]
    lines += [f"  {o.name[:42]:<42}{o.ms:>8.2f}{o.share:>8.1%}{o.calls:>7}" for o in profile.operators]
    if profile.kinds:
        lines += ["", f"  {'kind of work (own time)':<42}{'ms':>8}{'share':>8}"]
        lines += [f"  {k.name[:42]:<42}{k.ms:>8.2f}{k.share:>8.1%}" for k in profile.kinds]
    return "\n".join(lines)
