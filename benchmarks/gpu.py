"""Check and time the Triton kernels of the fused gated activations on a CUDA GPU; prints JSON.

    python benchmarks/gpu.py            # about 1-2 minutes on one GPU, well under 3
    python benchmarks/gpu.py --dry-run  # the same checks on CPU in Triton's interpreter, tiny sizes

Correctness, per activation and dtype, against PyTorch's eager ops on the same GPU:
  fp64   torch.autograd.gradcheck of gated_act and fused_gated_down through the Triton kernels
  fp32   h, d gate, d up within 1e-6 of eager, relative to |result| + |factors| (as tests/test_kernels.py)
  bf16,  within one rounding (unit roundoff u = 2^-8, 2^-11) of the fp64 values on the same inputs:
  fp16   the GPU rounds to nearest, so the interpreter's 2u allowance for bf16 does not apply here
Timing: forward and forward+backward of act(g)*u, eager vs fused (Triton) vs torch.compile, as GB/s
against a measured copy; then eager vs fused steps of two gated FFNs, swiglu also compiled (ffnlab.tools.bench.bench_ffn).
Exit status 0 when every check passes, 1 when one fails, 2 without CUDA or Triton.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch

from ffnlab.core.activations import get_activation
from ffnlab.core.kernels import FUSED_ACTS, fused_gated_down, gated_act, triton_ready
from ffnlab.tools.bench import bench_ffn, interleaved_medians, timed

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
DEADLINE_S = 150  # skip what is left of the timing past this, so the run stays under 3 minutes
DRY_RUN = "--dry-run" in sys.argv
DEVICE = "cpu" if DRY_RUN else "cuda"
SIZES = (
    {"check": (33, 65), "numel": 4096, "ffn": (64, 32)}
    if DRY_RUN
    else {"check": (257, 1031), "numel": 16 << 20, "ffn": (8192, 4096)}
)


def eager(act, g, u, dh):
    g, u = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    h = get_activation(act)(g) * u
    h.backward(dh)
    return [h.detach(), g.grad, u.grad]


def fused(act, g, u, dh):
    g, u = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    h = gated_act(g, u, act, backend="triton")
    h.backward(dh)
    return [h.detach(), g.grad, u.grad]


def worst(results, refs, g, u, dh, tol, rounding=0.0, exact=None):
    """Largest error over h, d gate, d up as a multiple of its allowance (pass: <= 1)."""
    g, u, dh = (t.double() for t in (g, u, dh))
    exact = exact or [None] * 3
    ratio = 0.0
    for got, want, scale, true in zip(results, refs, (u.abs(), (dh * u).abs(), dh.abs()), exact):
        want = want.double()
        bound = rounding * want.abs() + tol * (want.abs() + scale)
        if got.dtype == torch.float16:
            bound = bound + torch.finfo(torch.float16).smallest_normal * UNIT_ROUNDOFF[torch.float16]
        if true is not None:
            bound = bound + (want - true).abs()
        ratio = max(ratio, ((got.double() - want).abs() / bound.clamp_min(1e-300)).max().item())
    return ratio


def check(act: str) -> dict:
    """Every correctness check of one activation; each value is (passed, worst ratio or note)."""
    out = {}
    torch.manual_seed(0)
    g64, u64, dh64 = (2 * torch.randn(*SIZES["check"], device=DEVICE, dtype=torch.float64) for _ in range(3))
    g64 = torch.where(g64.abs() < 1e-3, g64 + 0.01, g64)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        g, u, dh = (t.to(dtype) for t in (g64, u64, dh64))
        exact = eager(act, g.double(), u.double(), dh.double())
        got = fused(act, g, u, dh)
        if dtype == torch.float32:
            r = worst(got, eager(act, g, u, dh), g, u, dh, tol=1e-6, exact=exact)
        else:
            # NOTE: Triton's CPU interpreter truncates fp32 -> bf16 (2u); GPUs round to nearest (u)
            u_eff = UNIT_ROUNDOFF[dtype] * (2 if DRY_RUN and dtype == torch.bfloat16 else 1)
            r = worst(got, exact, g, u, dh, tol=1e-6, rounding=u_eff * 1.001)
        out[str(dtype).removeprefix("torch.")] = {"passed": r <= 1, "worst_ratio": round(r, 4)}
    gs, us = (torch.randn(4, 6, device=DEVICE, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.randn(3, 6, device=DEVICE, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, device=DEVICE, dtype=torch.float64, requires_grad=True)
    try:
        ok = torch.autograd.gradcheck(
            lambda g, u: gated_act(g, u, act, backend="triton"), (gs, us)
        ) and torch.autograd.gradcheck(
            lambda g, u, w, b: fused_gated_down(g, u, w, b, act, backend="triton"), (gs, us, w, b)
        )
        out["float64_gradcheck"] = {"passed": bool(ok)}
    except Exception as e:  # gradcheck raises on a mismatch
        out["float64_gradcheck"] = {"passed": False, "error": str(e).splitlines()[0][:300]}
    empty = gated_act(torch.empty(0, 8, device=DEVICE), torch.empty(0, 8, device=DEVICE), act, backend="triton")
    out["empty"] = {"passed": empty.shape == (0, 8)}
    return out


def time_activation(act: str, dtype, numel: int, copy_gbs: float, compile: bool) -> list[dict]:
    """Forward and forward+backward of act(g)*u, eager vs fused (vs compiled), timed in turns."""
    g, u, dh = (torch.randn(numel, device=DEVICE, dtype=dtype) for _ in range(3))
    gg, ug = g.clone().requires_grad_(), u.clone().requires_grad_()
    fn = get_activation(act)
    impls = {"eager": lambda g, u: fn(g) * u, "fused": lambda g, u: gated_act(g, u, act, backend="triton")}
    if compile:
        impls["compiled"] = torch.compile(lambda g, u: fn(g) * u)
    rows = []
    for impl, f in impls.items():
        start = time.perf_counter()
        with torch.no_grad():
            f(g, u)
        f(gg, ug).backward(dh)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        rows.append(
            {
                "name": act,
                "impl": impl,
                "dtype": str(dtype).removeprefix("torch."),
                "numel": numel,
                "first_call_s": round(time.perf_counter() - start, 3),
            }
        )

    def fwd(f):
        with torch.no_grad():
            f(g, u)

    def fwd_bwd(f):
        gg.grad = ug.grad = None
        f(gg, ug).backward(dh)

    fwds = interleaved_medians({i: lambda f=f: timed(lambda: fwd(f), DEVICE) for i, f in impls.items()}, 20, DEVICE)
    both = interleaved_medians({i: lambda f=f: timed(lambda: fwd_bwd(f), DEVICE) for i, f in impls.items()}, 20, DEVICE)
    for row in rows:
        gbs = 3 * numel * g.element_size() / (fwds[row["impl"]] * 1e-3) / 1e9
        row.update(
            fwd_ms=round(fwds[row["impl"]], 4),
            fwd_bwd_ms=round(both[row["impl"]], 4),
            gbs=round(gbs, 1),
            copy_frac=round(gbs / copy_gbs, 3),
        )
    return rows


def main() -> int:
    start = time.perf_counter()
    if DRY_RUN:
        os.environ["TRITON_INTERPRET"] = "1"  # before ffnlab.core.kernels.triton_gated is first imported
    elif not triton_ready():
        print(json.dumps({"error": "needs a CUDA GPU and the triton package", "cuda": torch.cuda.is_available()}))
        return 2
    import triton

    result = {
        "command": " ".join(["python", "benchmarks/gpu.py"] + sys.argv[1:]),
        "device": "cpu, Triton interpreter (dry run)" if DRY_RUN else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "checks": {},
        "activations": [],
        "ffns": [],
    }
    for act in FUSED_ACTS:
        result["checks"][act] = check(act)
    src = torch.randn(64 << (0 if DRY_RUN else 20), device=DEVICE)  # 256 MB
    dst = torch.empty_like(src)
    copy_ms = interleaved_medians({"copy": lambda: timed(lambda: dst.copy_(src), DEVICE)}, 20, DEVICE)["copy"]
    result["copy_gbs"] = round(2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9, 1)
    src = dst = None  # free the 256 MB before the FFN rows
    for dtype in (torch.float32, torch.bfloat16):
        for act in FUSED_ACTS:
            if time.perf_counter() - start > DEADLINE_S:
                result.setdefault("skipped", []).append(f"activation {act} {dtype}: past {DEADLINE_S} s")
                continue
            # torch.compile's own build takes seconds per graph: fp32 only, to keep the run short
            result["activations"] += time_activation(
                act, dtype, SIZES["numel"], result["copy_gbs"], compile=dtype == torch.float32 and not DRY_RUN
            )
    for name in ("swiglu", "geglu"):
        if time.perf_counter() - start > DEADLINE_S:
            result.setdefault("skipped", []).append(f"ffn {name}: past {DEADLINE_S} s")
            continue
        # swiglu also against torch.compile of the eager module (saved bytes, step time); its build costs seconds
        compile = name == "swiglu" and not DRY_RUN
        result["ffns"] += bench_ffn(name, *SIZES["ffn"], repeats=10, compile=compile, device=DEVICE)
    result["passed"] = all(c["passed"] for act in result["checks"].values() for c in act.values())
    result["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
