import functools
import math

import pytest
import torch
from torch import nn

from ffnlab.core.activations import (
    ACTIVATIONS,
    Activation,
    aliases,
    attention_context,
    get_activation,
    quantile,
    quantile_context,
    resolve,
)

# Independent float64 references, written from the papers' formulas with math/erf per element.
Phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))
sig = lambda x: 1 / (1 + math.exp(-x))
gtanh = lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
REF = {
    "relu": lambda x: max(0.0, x),
    "leaky_relu": lambda x: x if x > 0 else 0.01 * x,
    "relu2": lambda x: max(0.0, x) ** 2,
    "hardswish": lambda x: x * min(max(x + 3, 0), 6) / 6,
    "mish": lambda x: x * math.tanh(math.log1p(math.exp(x))),
    "gelu": lambda x: x * Phi(x),
    "gelu_erfc": lambda x: 0.5 * x * math.erfc(-x / math.sqrt(2)),
    "gelu_tanh": gtanh,
    "gelu_sigmoid": lambda x: x * sig(1.702 * x),
    "silu": lambda x: x * sig(x),
    "sigmoid": sig,
    "tanh": math.tanh,
    "identity": lambda x: x,
    "swish_beta": lambda x: x * sig(x),
    "tunable_gelu": lambda x: x * Phi(x),
    "switch": lambda x: (max(0.0, x) + x * Phi(x) + x * sig(x)) / 3,
    "agelu": lambda x: x * sig(torch.tensor(1.702).item() * x),  # a bare FFN: a = 1; beta a float32 parameter
    "gelu_new": gtanh,
    "gelu_fast": gtanh,
    "gelu_pytorch_tanh": gtanh,
    "gelu_accurate": gtanh,
    "gelu_python": lambda x: x * Phi(x),
    "gelu_10": lambda x: min(max(x * Phi(x), -10), 10),
    "quick_gelu": lambda x: x * sig(1.702 * x),
    "swish": lambda x: x * sig(x),
    "energy_gated": lambda x: x * math.exp(-(x**2) / 2),
    "exponential": lambda x: math.exp(x) if x <= 10 else math.exp(10) * (x - 9),
}


def split_ref(xs):
    """split_gelu_tanh of one token's channels: GELU on the first ceil(C/2), tanh on the rest."""
    half = (len(xs) + 1) // 2
    return [x * Phi(x) if i < half else math.tanh(x) for i, x in enumerate(xs)]


def quantile_ref(xs):
    """The quantile activation of one channel whose tokens are `xs`, term by term from its formula: 16
    quantiles of each sign (order statistic floor((2k+1)n/32) of that sign's n values, +-inf for none),
    Silverman's h = 1.06 std 32^(-1/5) (at least 1e-3), then mean_j erf((x - c_j) / (sqrt2 h))."""
    k, centres = 16, []
    for side, empty in ((sorted(x for x in xs if x < 0), -math.inf), (sorted(x for x in xs if x >= 0), math.inf)):
        centres += [side[(2 * j + 1) * len(side) // (2 * k)] if side else empty for j in range(k)]
    mean = sum(xs) / len(xs)
    h = max(1.06 * math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)) * (2 * k) ** -0.2, 1e-3)
    return [sum(math.erf((x - c) / (math.sqrt(2) * h)) for c in centres) / (2 * k) for x in xs]


# activations whose output reads more than its own element: a reference of the whole 1-D input (one
# token's channels for the split, one channel's tokens for the quantile activation, as the registry reads it)
REF_WHOLE = {"quantile": quantile_ref, "split_gelu_tanh": split_ref}
# the quantile activation's gradient holds its context (the batch's quantiles) fixed: check it at one
FIXED_CONTEXT = {"quantile": lambda x: functools.partial(quantile, context=quantile_context(x))}
# gelu_fast rounds sqrt(2/pi) to 10 digits; hardswish has kinks at -3, 3
REF_TOL = {"gelu_fast": 1e-9}
X = torch.cat([torch.linspace(-8, 8, 401, dtype=torch.float64), torch.tensor([-20.0, 20.0], dtype=torch.float64)])
HF_NAMES = [
    "gelu",
    "gelu_new",
    "gelu_fast",
    "gelu_pytorch_tanh",
    "gelu_accurate",
    "gelu_python",
    "quick_gelu",
    "swish",
    "gelu_10",
    "relu",
    "leaky_relu",
    "relu2",
    "mish",
    "silu",
    "hardswish",
    "sigmoid",
    "tanh",
]


def test_every_entry_has_a_reference():
    assert set(REF) | set(REF_WHOLE) == set(ACTIVATIONS) and not set(REF) & set(REF_WHOLE)
    assert set(REF_WHOLE) == {n for n, s in ACTIVATIONS.items() if s.scope != "element"}
    assert set(FIXED_CONTEXT) == {n for n, s in ACTIVATIONS.items() if s.scope == "batch"}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_values_match_float64_reference(name):
    act = get_activation(name).double()
    if name in REF_WHOLE:
        expected = torch.tensor(REF_WHOLE[name](X.tolist()), dtype=torch.float64)
    else:
        expected = torch.tensor([REF[name](float(x)) for x in X], dtype=torch.float64)
    tol = REF_TOL.get(name, 1e-12)
    torch.testing.assert_close(act(X), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gradients_gradcheck(name):
    act = get_activation(name).double()
    x = torch.linspace(-6, 6, 37, dtype=torch.float64)
    x = x[(x - x.round()).abs() > 1e-3]  # away from kinks at integers (relu at 0, hardswish at +-3)
    x = x.clone().requires_grad_(True)
    fixed = FIXED_CONTEXT[name](x) if name in FIXED_CONTEXT else act
    assert torch.autograd.gradcheck(fixed, (x,), eps=1e-6, atol=1e-7)
    for p in act.parameters():  # learnable parameters get gradients too
        p.requires_grad_(True)
    if list(act.parameters()):
        act(x).sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in act.parameters())


@pytest.mark.parametrize("name", HF_NAMES)
def test_hugging_face_names_match_act2fn_bitwise(name):
    from transformers.activations import ACT2FN

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    x[:4] = torch.tensor([-30.0, 30.0, 0.0, -5.7])
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(get_activation(name)(x.to(dtype)), ACT2FN[name](x.to(dtype))), (name, dtype)


def test_hf_aliases_point_at_canonical_entries():
    assert aliases("gelu_tanh") == ["gelu_accurate", "gelu_fast", "gelu_new", "gelu_pytorch_tanh"]
    assert aliases("silu") == ["swish"]
    assert ACTIVATIONS["quick_gelu"].same_as == "gelu_sigmoid"


def test_lookup_is_case_insensitive_and_passes_callables_through():
    assert resolve("GELU_Tanh") == "gelu_tanh"
    mod = nn.ReLU()
    assert get_activation(mod) is mod
    f = get_activation(torch.tanh)
    assert isinstance(f, nn.Module) and torch.equal(f(torch.ones(2)), torch.tanh(torch.ones(2)))


def test_unknown_name_lists_valid_names_and_closest_match():
    with pytest.raises(ValueError) as e:
        get_activation("swigelu")
    msg = str(e.value)
    assert "unknown activation 'swigelu'" in msg and "did you mean" in msg and "relu2" in msg
    assert "\n" not in msg


def test_leaky_relu_slope_and_bad_kwarg():
    x = torch.tensor([-2.0, 3.0])
    assert torch.equal(get_activation("leaky_relu", negative_slope=0.2)(x), torch.tensor([-0.4, 3.0]))
    with pytest.raises(ValueError, match="takes no argument"):
        get_activation("gelu", slope=2)


def test_learnable_parameters_and_switch_choice():
    assert get_activation("swish_beta").beta.item() == 1.0
    assert get_activation("tunable_gelu").tau.item() == 1.0
    sw = get_activation("switch", acts=["relu", "mish"])
    assert sw.names == ("relu", "mish") and sw.logits.shape == (2,)
    with pytest.raises(ValueError):
        get_activation("switch", acts=["relu"])
    with pytest.raises(ValueError, match="unknown activation"):
        get_activation("switch", acts=["relu", "nope"])
    with pytest.raises(ValueError, match="'swish_beta' has learned parameters: build it with get_activation"):
        Activation("swish_beta")  # no plain function to wrap (it was a TypeError at the first call)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_works_inside_transformer_encoder_layer(name):
    act = get_activation(name)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, activation=act, batch_first=True, dropout=0.0)
    x = torch.randn(2, 5, 16)
    y = layer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.sum().backward()
    if ACTIVATIONS[name].learnable:  # the layer owns the activation's parameters
        assert any(p is q for p in layer.parameters() for q in act.parameters())


def test_accurate_gelu_beats_one_plus_erf_in_negative_tail():
    x = torch.linspace(-9, -5, 200)
    exact = torch.tensor([float(v) * 0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x.double()])
    err_erf = ((get_activation("gelu")(x).double() - exact).abs() / exact.abs()).max()
    err_erfc = ((get_activation("gelu_erfc")(x).double() - exact).abs() / exact.abs()).max()
    assert err_erfc < 1e-5 < err_erf


def test_agelu_bare_is_x_sigmoid_beta_x_and_context_sets_a():
    act = get_activation("agelu")
    x = torch.linspace(-4, 4, 9)
    torch.testing.assert_close(act(x), x * torch.sigmoid(act.beta * x))  # no attention output: a = 1
    attn = torch.full((9, 2), 3.0)  # nine tokens, d_model 2: rms 3, so a = 4
    x = x[:, None]  # (tokens, d_ff=1)
    with attention_context(act, attn):
        torch.testing.assert_close(act(x), x * torch.sigmoid(4 * act.beta * x))
    assert act.a is None  # back to a = 1 after the block's FFN


# ---- the attention article's remaining activations (issue #27) ---------------------------------------


def test_new_activations_are_marked_experimental_with_a_source():
    for name in ("quantile", "energy_gated", "split_gelu_tanh", "exponential"):
        spec = ACTIVATIONS[name]
        assert spec.experimental and spec.paper and spec.fn is not None and not spec.learnable, name
    assert not ACTIVATIONS["gelu"].experimental and ACTIVATIONS["gelu"].scope == "element"


@pytest.mark.parametrize("channels", [1, 2, 5, 8])
def test_split_gives_gelu_the_first_half_and_the_odd_channel(channels):
    x = torch.randn(2, 3, channels, dtype=torch.float64, generator=torch.Generator().manual_seed(channels))
    y = get_activation("split_gelu_tanh")(x)
    half = (channels + 1) // 2  # 5 channels: 3 GELU, 2 tanh
    assert y.shape == x.shape
    expected = torch.tensor([split_ref(row) for row in x.reshape(-1, channels).tolist()], dtype=torch.float64)
    torch.testing.assert_close(y.reshape(-1, channels), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y[..., :half], torch.nn.functional.gelu(x[..., :half]))
    torch.testing.assert_close(y[..., half:], torch.tanh(x[..., half:]))


def test_energy_gated_temperature_and_peak():
    x = torch.linspace(-6, 6, 121, dtype=torch.float64)
    hot = get_activation("energy_gated", temperature=2.0)(x)
    torch.testing.assert_close(hot, torch.tensor([v * math.exp(-(v**2) / 4) for v in x.tolist()], dtype=x.dtype))
    y = get_activation("energy_gated")(x)
    assert x[y.argmax()].item() == pytest.approx(1.0)  # the peak is at sqrt(T)
    assert (
        get_activation("energy_gated")(torch.tensor([6e4, -6e4, 300.0], dtype=torch.float16)).eq(0).all()
    )  # x*x overflows: gate 0


def test_exponential_guard_is_a_tangent_line_with_no_overflow():
    act = get_activation("exponential")
    x = torch.tensor([9.999, 10.0, 10.001, 100.0, 1e30], dtype=torch.float64, requires_grad=True)
    y = act(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    e10 = math.exp(10)
    torch.testing.assert_close(y[:2], torch.exp(x[:2]))
    torch.testing.assert_close(y[2:4], e10 * (x[2:4] - 9))
    torch.testing.assert_close(grad[1:4], torch.full((3,), e10, dtype=torch.float64))  # C^1 at 10, slope kept above
    assert torch.isfinite(act(torch.tensor([88.8, 1e4, 1e30]))).all()  # exp alone is inf in fp32 from 88.8


def test_quantile_on_batch_tokens_matches_the_formula_per_channel():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 5, dtype=torch.float64, generator=gen) * torch.tensor([1.0, 0.1, 3.0, 1.0, 1.0])
    x[..., 3] = x[..., 3].abs()  # a channel with no negative value
    x[..., 4] = 2.5  # a constant channel: std 0, bandwidth 1e-3
    y = get_activation("quantile")(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    for c in range(5):  # every B*T token of a channel is its context
        expected = torch.tensor(quantile_ref(x[..., c].flatten().tolist()), dtype=torch.float64)
        torch.testing.assert_close(y[..., c].flatten(), expected, rtol=1e-12, atol=1e-12)
    assert (y.abs() < 1).all()
    assert (y[..., 3] > 0).all()  # grounding: an all-positive channel maps every input above 0
    assert torch.allclose(y[..., 4], torch.full_like(y[..., 4], 0.5))


def test_quantile_range_monotone_within_a_batch_and_deterministic():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, 8, generator=gen) * 3 + 1
    act = get_activation("quantile").eval()
    y = act(x)
    assert ((y > -1) & (y < 1)).all()
    for c in range(8):  # within a channel, outputs follow the order of the inputs
        order = x[..., c].flatten().argsort()
        assert (y[..., c].flatten()[order].diff() > 0).all()
    assert torch.equal(act(x), y)  # same batch, same output: nothing random, no running state
    other = x.clone()
    other[1:] += 5  # the same first sequence in another batch: ranked in another context
    assert not torch.allclose(act(other)[0], y[0])
    assert torch.equal(quantile(other[:1], quantile_context(x)), y[:1])  # ranked in x's context again


def test_quantile_gradient_is_the_kernel_density_at_a_fixed_context():
    x = (torch.randn(6, 10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))).requires_grad_()
    (grad,) = torch.autograd.grad(get_activation("quantile")(x).sum(), x)
    context = quantile_context(x)
    (fixed,) = torch.autograd.grad(quantile(x, context).sum(), x)
    assert torch.equal(grad, fixed) and (grad > 0).all() and torch.isfinite(grad).all()
    eps = 1e-6  # one element moved, the context held: the finite difference of that element's output
    up, down = x.detach().clone(), x.detach().clone()
    up[2, 3, 1] += eps
    down[2, 3, 1] -= eps
    slope = (quantile(up, context) - quantile(down, context))[2, 3, 1] / (2 * eps)
    assert slope.item() == pytest.approx(grad[2, 3, 1].item(), rel=1e-6)


def test_quantile_in_half_precision_and_on_one_token():
    x = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(3))
    y32 = get_activation("quantile")(x)
    for dtype in (torch.float16, torch.bfloat16):
        y = get_activation("quantile")(x.to(dtype))
        assert y.dtype == dtype
        torch.testing.assert_close(y.float(), get_activation("quantile")(x.to(dtype).float()).to(dtype).float())
        assert (y.float() - y32).abs().max() < 0.05
    one = get_activation("quantile")(torch.tensor([[[2.0, -1.0, 0.0]]]))  # one token: its own context
    assert one.tolist() == [[[0.5, -0.5, 0.5]]]
    assert get_activation("quantile")(torch.zeros(0, 4)).shape == (0, 4)
