"""Fused gated activations: act(gate) * up [@ W_down^T], saving only gate and up for backward.

Eager PyTorch keeps up to four tensors of the hidden width for backward of W_down(act(g) * u): the
gate g (for act'; relu and sigmoid keep act(g) instead), act(g) and u (for the product) and the
product (for W_down's gradient). `GatedAct`
keeps g and u, and recomputes act(g), act'(g) and the product in backward: one elementwise pass
that reads g, u and the incoming gradient and writes both gradients (and the product).

The math is one table, `FUSED_ACTS`: activation name -> (forward, derivative). It runs on one of
three backends, picked per call by `pick_backend`:

    triton    CUDA tensors with Triton installed: `ffnlab.core.kernels.triton_gated`
    compiled  CPU tensors of at least COMPILE_MIN_NUMEL elements: the same table functions through
              torch.compile, which emits one vectorised loop per direction (built once, seconds)
    torch     everything else: the table functions as plain PyTorch ops (no build cost)

Internal math is fp32 for fp16/bf16 inputs (fp64 for fp64), rounded once to the input dtype.

Whether a `GatedFFN` takes the fused path is decided when it is built, from a process-wide policy
(as timm's `set_layer_config`): `set_fused_policy("auto" | "always" | "never")`, or the
`use_fused_policy(...)` context manager for the modules built inside it. FFNLAB_EAGER=1 makes
"never" the default (every FFN on its unfused eager ops; for debugging).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

import torch
import torch.nn.functional as F

from ffnlab._util.names import closest
from ffnlab.core.activations import identity

Backend = Literal["torch", "compiled", "triton"]
BACKENDS = ("torch", "compiled", "triton")

SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_C = 0.044715

# NOTE: below this many elements a torch.compile build (seconds, once per process) never pays
# for itself; tests and tiny models stay on plain PyTorch ops.
COMPILE_MIN_NUMEL = 1 << 16


# NOTE: the "auto" policy takes the fused path only where a whole FFN forward+backward measured at least as
# fast as eager: fp32 from about 4M hidden elements, never under bf16 autocast (benchmarks/README.md, "The default").
FUSED_MIN_NUMEL = 1 << 22

FusedPolicy = Literal["auto", "always", "never"]
FUSED_POLICIES = ("auto", "always", "never")
_policy: FusedPolicy | None = None  # set by set_fused_policy; None: the environment's default


@dataclass(frozen=True)
class FusedAct:
    """One activation's forward f(g) and derivative f'(g), both on fp32 (or fp64) tensors."""

    forward: Callable[[torch.Tensor], torch.Tensor]
    derivative: Callable[[torch.Tensor], torch.Tensor]
    default: bool  # fused by default in GatedFFN: measured at least as fast as eager (benchmarks/README.md)


def sigmoid_and_slope(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmoid(x), sigmoid(x) * (1 - sigmoid(x))) from one exp.

    NOTE: the slope is e/(1 + e)^2 with e = exp(-|x|), not s*(1 - s): once s rounds to 1 in fp32
    (x > 17; much earlier in relative terms) 1 - s cancels to nothing, e/(1 + e)^2 does not.
    """
    e = torch.exp(-x.abs())
    return torch.where(x >= 0, 1.0, e) / (1 + e), e / ((1 + e) * (1 + e))


def gelu_cdf(g: torch.Tensor) -> torch.Tensor:
    """Phi(g) = 0.5(1 + erf(g/sqrt2)), the same 1+erf form as F.gelu."""
    return 0.5 * (1 + torch.erf(g * SQRT1_2))


def gelu_tanh_arg(g: torch.Tensor) -> torch.Tensor:
    """2z = 2sqrt(2/pi)(g + 0.044715g^3): 0.5(1 + tanh z) = sigmoid(2z), so gelu_tanh(g) = g*sigmoid(2z)."""
    return 2 * SQRT_2_OVER_PI * (g + GELU_TANH_C * g * g * g)


# Forwards and derivatives are written with the same pieces (sigmoid_and_slope, gelu_cdf) so that the
# compiled backward, which needs both, computes each exp or erf once.
def silu(g: torch.Tensor) -> torch.Tensor:
    """g*sigmoid(g)."""
    return g * sigmoid_and_slope(g)[0]


def silu_derivative(g: torch.Tensor) -> torch.Tensor:
    """d/dg g*sigmoid(g) = s + g*s(1 - s), s = sigmoid(g)."""
    s, slope = sigmoid_and_slope(g)
    return s + g * slope


def gelu(g: torch.Tensor) -> torch.Tensor:
    """g*Phi(g)."""
    return g * gelu_cdf(g)


def gelu_derivative(g: torch.Tensor) -> torch.Tensor:
    """d/dg g*Phi(g) = Phi(g) + g*phi(g)."""
    return gelu_cdf(g) + g * torch.exp(-0.5 * g * g) * INV_SQRT_2PI


def gelu_tanh(g: torch.Tensor) -> torch.Tensor:
    """0.5g(1 + tanh z) as g*sigmoid(2z), z = sqrt(2/pi)(g + 0.044715g^3); no 1 + tanh cancellation."""
    return g * sigmoid_and_slope(gelu_tanh_arg(g))[0]


def gelu_tanh_derivative(g: torch.Tensor) -> torch.Tensor:
    """d/dg g*s(2z) = s + g*s(1 - s)*2sqrt(2/pi)(1 + 3*0.044715g^2)."""
    s, slope = sigmoid_and_slope(gelu_tanh_arg(g))
    return s + g * slope * 2 * SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_C * g * g)


def relu_derivative(g: torch.Tensor) -> torch.Tensor:
    """1 where g > 0, else 0 (0 at g = 0, as PyTorch's relu backward)."""
    return (g > 0).to(g.dtype)


def sigmoid(g: torch.Tensor) -> torch.Tensor:
    """1/(1 + exp(-g))."""
    return sigmoid_and_slope(g)[0]


def sigmoid_derivative(g: torch.Tensor) -> torch.Tensor:
    """sigmoid(g)(1 - sigmoid(g))."""
    return sigmoid_and_slope(g)[1]


def identity_derivative(g: torch.Tensor) -> torch.Tensor:
    """1 everywhere (the bilinear variant)."""
    return torch.ones_like(g)


FUSED_ACTS: dict[str, FusedAct] = {
    "silu": FusedAct(silu, silu_derivative, default=True),  # swiglu
    "gelu": FusedAct(gelu, gelu_derivative, default=True),  # geglu
    "gelu_tanh": FusedAct(gelu_tanh, gelu_tanh_derivative, default=True),  # geglu_tanh
    "relu": FusedAct(F.relu, relu_derivative, default=True),  # reglu
    "sigmoid": FusedAct(sigmoid, sigmoid_derivative, default=True),  # glu
    "identity": FusedAct(identity, identity_derivative, default=True),  # bilinear
}


def check_act(act: str) -> str:
    """`act` if it has a fused kernel; ValueError naming the ones that do otherwise."""
    if act not in FUSED_ACTS:
        raise ValueError(
            f"no fused kernel for activation '{act}'{closest(str(act), FUSED_ACTS)}; fused: {', '.join(FUSED_ACTS)}"
        )
    return act


def fused_is_faster(x: torch.Tensor, d_ff: int) -> bool:
    """Whether the fused path is at least as fast as eager for an FFN input `x` (..., d_model) of
    hidden width d_ff: on CUDA with Triton; on the CPU for fp32 outside autocast with at least
    FUSED_MIN_NUMEL hidden elements."""
    if x.is_cuda:
        return triton_ready()
    if torch.is_autocast_enabled(x.device.type) or x.dtype != torch.float32:
        return False
    return x.numel() // max(x.shape[-1], 1) * d_ff >= FUSED_MIN_NUMEL


# ---- the policy: fused or eager, decided when a module is built -------------------------------------


def eager_forced() -> bool:
    """True when FFNLAB_EAGER=1 is set: the default policy is then "never"."""
    return os.environ.get("FFNLAB_EAGER", "").strip() not in ("", "0")


def get_fused_policy() -> FusedPolicy:
    """The policy gated FFNs read when they are built: `set_fused_policy`'s, else "never" with
    FFNLAB_EAGER=1, else "auto"."""
    if _policy is not None:
        return _policy
    return "never" if eager_forced() else "auto"


def set_fused_policy(policy: FusedPolicy | None) -> None:
    """Choose where gated FFNs built from now on take the fused path; modules built earlier keep theirs.

        auto     modules left at fused=None take it where `fused_is_faster` says so for each input
        always   modules left at fused=None take it wherever their activation has a kernel
        never    no module takes it, whatever its `fused` argument (debugging, export)

    None goes back to the environment's default (FFNLAB_EAGER=1: never; else auto).
    """
    global _policy
    if policy is not None and policy not in FUSED_POLICIES:
        raise ValueError(f"unknown fused policy '{policy}'; valid: {', '.join(FUSED_POLICIES)}")
    _policy = policy


@contextmanager
def use_fused_policy(policy: FusedPolicy) -> Iterator[None]:
    """`set_fused_policy(policy)` for the modules built inside the `with` block, then the previous one."""
    previous = _policy
    set_fused_policy(policy)
    try:
        yield
    finally:
        set_fused_policy(previous)


def resolve_fused(fused: bool | None, act: str | None) -> bool | None:
    """The path a gated FFN takes, decided at build time from its `fused` argument, its activation's
    kernel (`act`, None if it has none) and the current policy: True fused, False eager, None fused
    where `fused_is_faster` says so for the input."""
    policy = get_fused_policy()
    if act is None or fused is False or policy == "never":
        return False
    if fused or policy == "always":
        return True
    return None if FUSED_ACTS[act].default else False


# ---- the elementwise math, one backend-independent definition ---------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def gated_forward(act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up, computed in fp32 (fp64 for fp64 inputs) and rounded once to gate's dtype."""
    spec, ct = FUSED_ACTS[act], _compute_dtype(gate.dtype)
    return (spec.forward(gate.to(ct)) * up.to(ct)).to(gate.dtype)


def gated_backward(
    act: str, gate: torch.Tensor, up: torch.Tensor, grad: torch.Tensor, need_h: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(d gate, d up) of act(gate) * up for output gradient `grad`, plus the product if `need_h`.

    d gate = grad * up * act'(gate), d up = grad * act(gate); each rounded once to gate's dtype.
    """
    spec, ct = FUSED_ACTS[act], _compute_dtype(gate.dtype)
    g, u, d = gate.to(ct), up.to(ct), grad.to(ct)
    a = spec.forward(g)
    dgate = (d * u * spec.derivative(g)).to(gate.dtype)
    dup = (d * a).to(gate.dtype)
    return dgate, dup, ((a * u).to(gate.dtype) if need_h else None)


_compiled: dict[
    Callable[..., Any], Callable[..., Any]
] = {}  # gated_forward / gated_backward -> its torch.compile wrapper, made on first use
_compile_failed: str | None = None  # why torch.compile could not build the kernels here, once known


P = ParamSpec("P")
R = TypeVar("R")


def _call_compiled(plain: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run `plain` compiled (one graph per act, dtype, need_h; the length is symbolic), falling back
    to the plain ops, with one warning, if the build fails."""
    global _compile_failed
    if _compile_failed is None:
        try:
            if plain not in _compiled:  # NOTE: lazily, since importing torch._dynamo takes a second
                _compiled[plain] = torch.compile(plain, dynamic=True)
            # NOTE: every (activation, dtype, need_h) is a cache entry of the same function; dynamo
            # gives up (and silently runs uncompiled) past 8 of them unless told otherwise.
            compiled: Callable[P, R] = _compiled[plain]
            with torch._dynamo.config.patch(recompile_limit=64):
                return compiled(*args, **kwargs)
        except Exception as e:  # a missing C++ compiler, an inductor bug: the math still runs
            _compile_failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(
                f"ffnlab: torch.compile kernels unavailable ({_compile_failed}); using plain ops", stacklevel=2
            )
    return plain(*args, **kwargs)


def compile_failure() -> str | None:
    """Why the torch.compile kernels fell back to plain ops in this process, or None if they did not."""
    return _compile_failed


@functools.cache
def triton_ready() -> bool:
    """True when the Triton kernels can run on CUDA tensors here (asked once per process)."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pick_backend(t: torch.Tensor) -> Backend:
    """Backend for tensors like `t`: triton on CUDA, compiled for large CPU tensors, else torch.

    Inside a torch.compile'd model it is always torch: the outer compiler fuses those ops itself.
    """
    if torch.compiler.is_compiling():
        return "torch"
    if t.is_cuda and triton_ready():
        return "triton"
    if t.device.type == "cpu" and t.numel() >= COMPILE_MIN_NUMEL:
        return "compiled"
    return "torch"


def _run_forward(backend: Backend, act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if backend == "triton":
        # NOTE: imported on first use: it needs triton (optional), and triton.jit reads TRITON_INTERPRET at import
        from ffnlab.core.kernels import triton_gated

        return triton_gated.forward(act, gate, up)
    if backend == "compiled":
        return _call_compiled(gated_forward, act, gate.reshape(-1), up.reshape(-1)).view(gate.shape)
    return gated_forward(act, gate, up)


def _run_backward(
    backend: Backend, act: str, gate: torch.Tensor, up: torch.Tensor, grad: torch.Tensor, need_h: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if backend == "triton":
        from ffnlab.core.kernels import triton_gated

        return triton_gated.backward(act, gate, up, grad, need_h)
    if backend == "compiled":
        dgate, dup, h = _call_compiled(gated_backward, act, gate.reshape(-1), up.reshape(-1), grad.reshape(-1), need_h)
        return dgate.view(gate.shape), dup.view(gate.shape), None if h is None else h.view(gate.shape)
    return gated_backward(act, gate, up, grad, need_h)


# ---- the autograd function --------------------------------------------------------------------------


class GatedAct(torch.autograd.Function):
    """h = act(gate) * up, and y = h @ w_down^T + b_down when w_down is given.

    Saves gate and up (and the weight), never act(gate) or h: backward recomputes them in the same
    pass that forms the gradients, so W_down's input is not kept either.
    """

    @staticmethod
    def forward(
        ctx: Any,
        gate: torch.Tensor,
        up: torch.Tensor,
        act: str,
        backend: Backend,
        w_down: torch.Tensor | None,
        b_down: torch.Tensor | None,
    ) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()  # the kernels walk flat memory
        h = _run_forward(backend, act, gate, up) if gate.numel() else torch.empty_like(gate)
        ctx.act, ctx.backend, ctx.has_bias = act, backend, b_down is not None
        ctx.save_for_backward(gate, up, w_down)
        return h if w_down is None else F.linear(h, w_down, b_down)

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None, None, torch.Tensor | None, torch.Tensor | None]:
        gate, up, w_down = ctx.saved_tensors
        need_w = w_down is not None and ctx.needs_input_grad[4]
        if w_down is None:
            grad_h = grad_out.contiguous()
        else:
            grad_h = (grad_out @ w_down).contiguous()  # (..., d_ff)
        if gate.numel():
            dgate, dup, h = _run_backward(ctx.backend, ctx.act, gate, up, grad_h, need_w)
        else:
            dgate, dup, h = torch.zeros_like(gate), torch.zeros_like(up), torch.zeros_like(gate)
        dw = db = None
        if w_down is not None:
            tokens = math.prod(gate.shape[:-1])
            dy = grad_out.reshape(tokens, w_down.shape[0])  # (tokens, d_model)
            if need_w:
                assert h is not None, "backward returns h when asked to (need_h)"
                dw = dy.T @ h.reshape(tokens, gate.shape[-1])  # (d_model, d_ff)
            if ctx.has_bias and ctx.needs_input_grad[5]:
                db = dy.sum(0)
        return dgate, dup, None, None, dw, db


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str = "silu", backend: Backend | None = None) -> torch.Tensor:
    """Fused act(gate) * up that keeps only gate and up for backward; `backend` None picks one."""
    backend = _checked_backend(gate, up, act, backend)
    h: torch.Tensor = GatedAct.apply(gate, up, act, backend, None, None)  # type: ignore[no-untyped-call]  # NOTE: torch's Function.apply has no annotations
    return h


def fused_gated_down(
    gate: torch.Tensor,
    up: torch.Tensor,
    w_down: torch.Tensor,
    b_down: torch.Tensor | None = None,
    act: str = "silu",
    backend: Backend | None = None,
) -> torch.Tensor:
    """Fused (act(gate) * up) @ w_down^T + b_down: the second half of a gated FFN.

    Keeps gate and up for backward (plus the weight, which is kept anyway), not the product.
    Under autocast the weight and bias are cast to the autocast dtype first, as nn.Linear's would
    be: backward runs outside autocast and must see one dtype.
    """
    device = gate.device.type
    if torch.is_autocast_enabled(device) and w_down.dtype != gate.dtype:
        w_down = w_down.to(gate.dtype)
        b_down = None if b_down is None else b_down.to(gate.dtype)
    backend = _checked_backend(gate, up, act, backend)
    y: torch.Tensor = GatedAct.apply(gate, up, act, backend, w_down, b_down)  # type: ignore[no-untyped-call]  # as in gated_act
    return y


def _checked_backend(gate: torch.Tensor, up: torch.Tensor, act: str, backend: Backend | None) -> Backend:
    """The backend to use, after checking the arguments (ValueError naming what is wrong)."""
    check_act(act)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"gate and up must match, got {tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}"
        )
    if backend is None:
        return pick_backend(gate)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}'; valid: {', '.join(BACKENDS)}")
    return backend
