import importlib
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from ffnlab.core.activations import get_activation
from ffnlab.core.ffn import GATED, GatedFFN, build_ffn, ffn_stats
from ffnlab.core.kernels import (
    FUSED_ACTS,
    fused_gated_down,
    gated_act,
    get_fused_policy,
    set_fused_policy,
    use_fused_policy,
)
from ffnlab.core.kernels.fused import FUSED_MIN_NUMEL
from tests.conftest import assert_close

ACTS = list(FUSED_ACTS)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# unit roundoff: a single correctly rounded result is within u*|x| of the exact one
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def load_triton_kernels():
    """ffnlab.core.kernels.triton_gated, in Triton's CPU interpreter when there is no GPU; None without triton."""
    if importlib.util.find_spec("triton") is None:
        return None
    if DEVICE == "cpu":
        # NOTE: triton.jit reads TRITON_INTERPRET at import and its launcher at every call; the
        # `interpret` fixture keeps it set while this module's tests run
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            module = importlib.import_module("ffnlab.core.kernels.triton_gated")
        finally:
            os.environ.pop("TRITON_INTERPRET") if old is None else os.environ.__setitem__("TRITON_INTERPRET", old)
        if type(module._forward_kernel).__name__ != "InterpretedFunction":
            return None  # imported earlier without the interpreter and there is no GPU to run it
        return module
    return importlib.import_module("ffnlab.core.kernels.triton_gated")


TRITON = load_triton_kernels()
needs_triton = pytest.mark.skipif(TRITON is None, reason="triton not importable (pip install triton)")


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    if DEVICE == "cpu" and TRITON is not None:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]


def inputs(shape, dtype, seed=0, requires_grad=True):
    gen = torch.Generator().manual_seed(seed)
    g, u, dh = (2 * torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    g = torch.where(g.abs() < 1e-3, g + 0.01, g)  # keep relu's kink away from gradcheck's step
    return [t.to(DEVICE, dtype).requires_grad_(requires_grad and i < 2) for i, t in enumerate((g, u, dh))]


def eager(act, g, u, dh):
    """h = act(g) * u with PyTorch's own ops and autograd: the reference."""
    g, u = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    h = get_activation(act)(g) * u
    h.backward(dh)
    return h.detach(), g.grad, u.grad


def fused(act, g, u, dh, backend):
    g, u = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    h = gated_act(g, u, act, backend=backend)
    h.backward(dh)
    return h.detach(), g.grad, u.grad


def assert_near(results, references, g, u, dh, tol, rounding=0.0, exact=None):
    """(h, d gate, d up) within rounding*|reference| + tol*(|reference| + |factors|), where the factors'
    size is |u| for h, |dh*u| for d gate, |dh| for d up; plus, if `exact` (fp64 values) is given, the
    reference's own error |reference - exact|.

    NOTE: relative to |result| alone is not attainable where an activation cancels (gelu's 1 + erf
    for g < -3): fp32 carries an absolute error of ~1e-7 there, in eager too, scaled by |u|. And
    eager fp32 itself is off by up to 1e-6 of the factors' size in places (gelu_tanh's backward
    in its tail), so closeness to eager is asked up to eager's own error.
    """
    g, u, dh = (t.detach().double() for t in (g, u, dh))
    exact = exact or (None, None, None)
    for name, got, want, scale, true in zip(
        ("h", "d gate", "d up"), results, references, (u.abs(), (dh * u).abs(), dh.abs()), exact
    ):
        assert got.shape == want.shape, name
        want = want.double()
        err = (got.double() - want).abs()
        bound = rounding * want.abs() + tol * (want.abs() + scale)
        if got.dtype == torch.float16:
            bound = bound + torch.finfo(got.dtype).smallest_normal * UNIT_ROUNDOFF[got.dtype]  # subnormals
        if true is not None:
            bound = bound + (want - true).abs()
        assert (err <= bound).all(), (name, ((err - bound) / (want.abs() + scale)).max())


def test_table_covers_every_gated_variant_but_none_with_arguments():
    assert {"silu", "gelu", "gelu_tanh", "relu", "sigmoid"} <= set(FUSED_ACTS)
    assert all(spec.acts[0] in FUSED_ACTS for spec in GATED.values())
    with pytest.raises(ValueError, match="did you mean 'silu'"):
        gated_act(torch.ones(2), torch.ones(2), "sillu")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", ACTS)
def test_fp32_matches_eager(act, backend):
    g, u, dh = inputs((3, 5, 67), torch.float32)
    exact = eager(act, g.double(), u.double(), dh.double())
    assert_near(fused(act, g, u, dh, backend), eager(act, g, u, dh), g, u, dh, tol=1e-6, exact=exact)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", ACTS)
def test_fp64_gradcheck(act, backend):
    g, u, _ = inputs((4, 6), torch.float64)
    w = torch.randn(3, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g, u: gated_act(g, u, act, backend=backend), (g, u))
    assert torch.autograd.gradcheck(lambda g, u, w, b: fused_gated_down(g, u, w, b, act, backend=backend), (g, u, w, b))
    # and the values are eager's to fp64 precision
    ref_h = get_activation(act)(g) * u
    assert_close(gated_act(g, u, act, backend=backend), ref_h)
    assert_close(fused_gated_down(g, u, w, b, act, backend=backend), F.linear(ref_h, w, b))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
def test_half_precision_is_rounded_once(act, dtype, backend):
    """Forward and both gradients are the fp64 values on the same inputs rounded once (within the unit
    roundoff u: 2^-8 bf16, 2^-11 fp16, plus fp32's own error); eager rounds twice or more, so it is
    never closer; fused and eager agree within 4u of the factors' size."""
    g, u, dh = inputs((64, 128), dtype)
    got, from_eager = fused(act, g, u, dh, backend), eager(act, g, u, dh)
    bound = UNIT_ROUNDOFF[dtype]
    if backend == "triton" and DEVICE == "cpu" and dtype == torch.bfloat16:
        bound *= 2  # NOTE: the interpreter truncates fp32 -> bf16; GPUs round to nearest (benchmarks/gpu.py)
    exact64 = eager(act, g.double(), u.double(), dh.double())
    assert all(t.dtype == dtype for t in got)
    assert_near(got, exact64, g, u, dh, tol=1e-6, rounding=bound * 1.001)
    if bound == UNIT_ROUNDOFF[dtype]:
        for mine, theirs, want in zip(got, from_eager, exact64):
            assert (mine.double() - want).abs().max() <= (theirs.double() - want).abs().max()
    assert_near(got, from_eager, g, u, dh, tol=4 * UNIT_ROUNDOFF[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", ACTS)
def test_non_contiguous_inputs(act, backend):
    g, u, dh = inputs((40, 30), torch.float32)
    gt, ut = g.detach().T.requires_grad_(), u.detach().T.requires_grad_()  # transposed views
    assert not gt.is_contiguous()
    assert_near(
        fused(act, gt, ut, dh.T, backend),
        fused(act, gt.contiguous(), ut.contiguous(), dh.T, backend),
        gt,
        ut,
        dh.T,
        tol=0,
    )  # the same numbers as from contiguous copies
    gs, us, dhs = g[:, ::3], u[:, ::3], dh[:, ::3]  # strided slices
    for a, b, c in ((gt, ut, dh.T), (gs, us, dhs)):
        exact = eager(act, a.double(), b.double(), c.double())
        assert_near(fused(act, a, b, c, backend), eager(act, a, b, c), a, b, c, tol=1e-6, exact=exact)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0,), (0, 8), (1,), (1, 1)])
@pytest.mark.parametrize("act", ACTS)
def test_empty_and_single_element(act, shape, backend):
    g, u, dh = inputs(shape, torch.float32)
    got = fused(act, g, u, dh, backend)
    assert [t.shape for t in got] == [torch.Size(shape)] * 3
    assert_near(got, eager(act, g, u, dh), g, u, dh, tol=1e-6)
    w = torch.randn(3, shape[-1], device=DEVICE, requires_grad=True)
    y = fused_gated_down(g, u, w, None, act, backend=backend)
    y.sum().backward()
    assert y.shape == (*shape[:-1], 3) and w.grad.shape == w.shape


def saved_bytes(fn, *args):
    """Bytes autograd keeps for backward of fn(*args), each tensor once, weights (args[2:]) excluded."""
    weights = {t.untyped_storage().data_ptr() for t in args[2:]}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            seen[(t.untyped_storage().data_ptr(), t.storage_offset(), t.shape)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(seen.values())


@pytest.mark.parametrize("act", ACTS)
def test_fused_saves_gate_and_up_only(act):
    tokens, d_model, d_ff = 16, 8, 32
    g, u, _ = inputs((tokens, d_ff), torch.float32)
    w = torch.randn(d_model, d_ff, requires_grad=True)
    unit = tokens * d_ff * 4  # one fp32 tensor of the hidden width
    eager_bytes = saved_bytes(lambda g, u, w: F.linear(get_activation(act)(g) * u, w), g, u, w)
    fused_bytes = saved_bytes(lambda g, u, w: fused_gated_down(g, u, w, None, act), g, u, w)
    assert fused_bytes == 2 * unit  # gate and up; not act(gate), not the product, not the weight
    # eager keeps act(g) and u for the product and the product for W_down, plus g itself when the
    # activation's backward reads its input; relu and sigmoid read their output, identity nothing
    assert eager_bytes == (4 if act in ("silu", "gelu", "gelu_tanh") else 3) * unit
    if act in ("silu", "gelu", "gelu_tanh"):
        assert fused_bytes <= 0.5 * eager_bytes


@pytest.mark.parametrize("name", list(GATED))
def test_eager_switch(name, monkeypatch):
    d, h, tokens = 16, 32, 4
    x = torch.randn(tokens, d, dtype=torch.float64)
    auto = build_ffn(name, d, d_ff=h).double()
    eager_ffn = build_ffn(name, d, d_ff=h, fused=False).double()
    eager_ffn.load_state_dict(auto.state_dict())
    assert auto.use_fused() == FUSED_ACTS[auto.fused_act].default and not eager_ffn.use_fused()
    forced = build_ffn(name, d, d_ff=h, fused=True).double()
    forced.load_state_dict(auto.state_dict())
    assert forced.use_fused()
    assert_close(forced(x), eager_ffn(x))
    fused_ffn = build_ffn(name, d, d_ff=h, fused=True)
    assert ffn_stats(fused_ffn, tokens).saved_bytes_per_token == 4 * (d + 2 * h)
    monkeypatch.setenv("FFNLAB_EAGER", "1")
    fused_ffn = build_ffn(name, d, d_ff=h, fused=True)  # the policy is read at construction
    assert not fused_ffn.use_fused()
    kept = 4 if fused_ffn.fused_act in ("silu", "gelu", "gelu_tanh") else 3  # see test_fused_saves_gate_and_up_only
    assert ffn_stats(fused_ffn, tokens).saved_bytes_per_token == 4 * (d + kept * h)
    fused_ffn.fused = False
    monkeypatch.setenv("FFNLAB_EAGER", "0")
    assert not fused_ffn.use_fused()


def test_fused_needs_a_kernel():
    with pytest.raises(ValueError, match="fused=True needs"):
        GatedFFN(16, 32, "swish_beta", fused=True)
    assert GatedFFN(16, 32, "swish_beta").use_fused() is False  # learnable: eager
    assert GatedFFN(16, 32, "silu").use_fused() == FUSED_ACTS["silu"].default
    with pytest.raises(ValueError, match="unknown backend"):
        gated_act(torch.ones(2), torch.ones(2), "silu", backend="cuda")
    with pytest.raises(ValueError, match="gate and up must match"):
        gated_act(torch.ones(2), torch.ones(3), "silu")


@pytest.mark.slow
@pytest.mark.parametrize("act,dtype", [("silu", torch.float32), ("gelu", torch.bfloat16), ("gelu_tanh", torch.float32)])
def test_compiled_backend_matches_plain(act, dtype):
    """The CPU fast path: the same table through torch.compile. Three cases cover its pieces (the
    exp of sigmoid_and_slope, erf with bf16 widening and rounding, the composite gelu_tanh); each
    (act, dtype) is a build of seconds, so not all twelve."""
    if DEVICE != "cpu":
        pytest.skip("the compiled backend is the CPU path")
    g, u, dh = inputs((7, 129), dtype)  # odd length: the vectorised loop's tail
    tol = 1e-6 if dtype == torch.float32 else UNIT_ROUNDOFF[dtype]  # bf16: one rounding may differ
    assert_near(fused(act, g, u, dh, "compiled"), fused(act, g, u, dh, "torch"), g, u, dh, tol=tol)


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_fused_ffn_trains_under_bf16_autocast(name):
    torch.manual_seed(0)
    fused = build_ffn(name, 32, fused=True)
    eager = build_ffn(name, 32, fused=False)
    eager.load_state_dict(fused.state_dict())
    x = torch.randn(4, 8, 32)
    grads = []
    for ffn in (fused, eager):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ffn(x)
        assert y.dtype == torch.bfloat16
        y.float().square().mean().backward()
        grads.append(ffn.w_down.weight.grad)
    assert grads[0].dtype == torch.float32  # the weight's gradient lands in its own dtype
    torch.testing.assert_close(grads[0], grads[1], rtol=0.05, atol=1e-3)


@pytest.mark.parametrize("name", ["swiglu", "geglu", "reglu"])
def test_fused_default_only_where_it_measured_as_fast(name):
    d, h = 16, 1024
    ffn = build_ffn(name, d, d_ff=h)
    big = torch.zeros(FUSED_MIN_NUMEL // h, d)  # exactly FUSED_MIN_NUMEL hidden elements
    small = torch.zeros(FUSED_MIN_NUMEL // h - 1, d)
    assert ffn.use_fused(big) and not ffn.use_fused(small)
    assert not ffn.use_fused(big.bfloat16())
    with torch.autocast("cpu", torch.bfloat16):
        assert not ffn.use_fused(big)  # bf16 autocast: eager measured faster
    forced = build_ffn(name, d, d_ff=h, fused=True)
    assert forced.use_fused(small) and forced.use_fused(big.bfloat16())
    # the choice is what forward runs: the fused path keeps 2 hidden tensors, eager 3 or 4
    assert ffn_stats(forced, 8).saved_bytes_per_token < ffn_stats(ffn, 8).saved_bytes_per_token


def test_fused_policy_is_read_at_construction(monkeypatch):
    d, h, tokens = 16, 32, 4
    monkeypatch.delenv("FFNLAB_EAGER", raising=False)
    assert get_fused_policy() == "auto"
    with use_fused_policy("never"):
        eager_ffn = build_ffn("swiglu", d, d_ff=h, fused=True)  # "never" wins over fused=True
        assert get_fused_policy() == "never"
    with use_fused_policy("always"):
        always = build_ffn("swiglu", d, d_ff=h)
        kept = build_ffn("swiglu", d, d_ff=h, fused=False)  # an explicit False stays eager
        no_kernel = GatedFFN(d, h, "swish_beta")  # nothing to fuse
    assert get_fused_policy() == "auto"  # the context manager restores the previous policy
    auto = build_ffn("swiglu", d, d_ff=h)
    small = torch.zeros(tokens, d)  # far below FUSED_MIN_NUMEL: auto stays eager on it
    assert not eager_ffn.use_fused(small) and always.use_fused(small) and not auto.use_fused(small)
    assert not kept.use_fused(small) and not no_kernel.use_fused(small)
    assert auto.fused is None and "fused=auto" in repr(auto) and "fused=False" in repr(eager_ffn)

    # "never": forward runs the eager ops (3-4 hidden tensors kept, not the fused 2)
    monkeypatch.setattr("ffnlab.core.ffn.fused_gated_down", lambda *a: pytest.fail("fused path taken"))
    eager_ffn(small)
    assert ffn_stats(eager_ffn, tokens).saved_bytes_per_token == 4 * (d + 4 * h)

    # FFNLAB_EAGER=1 sets the default to "never" for modules built afterwards; built ones keep their choice
    monkeypatch.undo()
    monkeypatch.setenv("FFNLAB_EAGER", "1")
    assert get_fused_policy() == "never" and always.use_fused(small) and auto.fused is None
    assert build_ffn("swiglu", d, d_ff=h, fused=True).fused is False
    set_fused_policy("always")  # an explicit policy overrides the environment's default
    try:
        assert build_ffn("swiglu", d, d_ff=h).fused is True
    finally:
        set_fused_policy(None)
    monkeypatch.setenv("FFNLAB_EAGER", "0")
    assert not eager_ffn.use_fused() and get_fused_policy() == "auto"
    with pytest.raises(ValueError, match="valid: auto, always, never"):
        set_fused_policy("sometimes")
