"""Triton kernels of the fused gated activations, for CUDA tensors (or the CPU interpreter).

One forward kernel (h = act(g) * u) and one backward kernel (dg = dh * u * act'(g),
du = dh * act(g), and h again when W_down's gradient needs it), each a single pass over flat
contiguous memory, with the activation chosen at compile time by name. Math is fp32 for
fp16/bf16 inputs (fp64 for fp64), rounded once on the store. The formulas mirror
`ffnlab.core.kernels.fused.FUSED_ACTS`; tests hold both to the eager reference.

NOTE: `triton.jit` reads TRITON_INTERPRET when this module is imported: set it to 1 before the
first import to run these kernels on CPU tensors (slowly; tests do this).

NOTE: the `@triton.jit` functions carry no Python type hints: Triton reads a parameter's annotation
as its kernel type (`tl.constexpr`, `i32`, pointer types), so `n: int` would make it a 32-bit
argument and change how arguments are specialised. The Python wrappers below are typed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK = 1024

SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_C = 0.044715

ACTS = ("silu", "gelu", "gelu_tanh", "relu", "sigmoid", "identity")


@triton.jit
def _sigmoid_and_slope(x):
    """(sigmoid(x), sigmoid(x)(1 - sigmoid(x))) from one exp; e/(1 + e)^2 avoids 1 - s cancelling."""
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0, e) / (1 + e), e / ((1 + e) * (1 + e))


@triton.jit
def _act_and_derivative(g, ACT: tl.constexpr):
    """(act(g), act'(g)) for the activation named ACT; the unused half is compiled away."""
    if ACT == "silu":
        s, slope = _sigmoid_and_slope(g)
        a = g * s
        da = s + g * slope
    elif ACT == "gelu":
        cdf = 0.5 * (1 + tl.math.erf(g * SQRT1_2))
        a = g * cdf
        da = cdf + g * tl.exp(-0.5 * g * g) * INV_SQRT_2PI
    elif ACT == "gelu_tanh":
        # 0.5(1 + tanh z) = sigmoid(2z): no tanh needed
        s, slope = _sigmoid_and_slope(2 * SQRT_2_OVER_PI * (g + GELU_TANH_C * g * g * g))
        a = g * s
        da = s + g * slope * 2 * SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_C * g * g)
    elif ACT == "relu":
        a = tl.where(g > 0, g, 0.0)
        da = tl.where(g > 0, 1.0, 0.0)
    elif ACT == "sigmoid":
        a, da = _sigmoid_and_slope(g)
    else:  # identity
        a = g
        da = tl.full(g.shape, 1.0, g.dtype)
    return a, da


@triton.jit
def _forward_kernel(g_ptr, u_ptr, h_ptr, n, ACT: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0).to(COMPUTE)
    u = tl.load(u_ptr + offs, mask=mask, other=0).to(COMPUTE)
    a, _ = _act_and_derivative(g, ACT)
    tl.store(h_ptr + offs, (a * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(
    g_ptr,
    u_ptr,
    dh_ptr,
    dg_ptr,
    du_ptr,
    h_ptr,
    n,
    ACT: tl.constexpr,
    COMPUTE: tl.constexpr,
    NEED_H: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0).to(COMPUTE)
    u = tl.load(u_ptr + offs, mask=mask, other=0).to(COMPUTE)
    dh = tl.load(dh_ptr + offs, mask=mask, other=0).to(COMPUTE)
    a, da = _act_and_derivative(g, ACT)
    tl.store(dg_ptr + offs, (dh * u * da).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dh * a).to(du_ptr.dtype.element_ty), mask=mask)
    if NEED_H:
        tl.store(h_ptr + offs, (a * u).to(h_ptr.dtype.element_ty), mask=mask)


def _compute(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def forward(act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up for contiguous tensors of one shape and dtype."""
    h = torch.empty_like(gate)
    n = gate.numel()
    _forward_kernel[(triton.cdiv(n, BLOCK),)](gate, up, h, n, ACT=act, COMPUTE=_compute(gate.dtype), BLOCK=BLOCK)
    return h


def backward(
    act: str, gate: torch.Tensor, up: torch.Tensor, grad: torch.Tensor, need_h: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(d gate, d up, act(gate) * up or None) for output gradient `grad`; all contiguous, one shape."""
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    h = torch.empty_like(gate) if need_h else dgate  # a dummy pointer when NEED_H is off
    n = gate.numel()
    _backward_kernel[(triton.cdiv(n, BLOCK),)](
        gate, up, grad, dgate, dup, h, n, ACT=act, COMPUTE=_compute(gate.dtype), NEED_H=need_h, BLOCK=BLOCK
    )
    return dgate, dup, (h if need_h else None)
