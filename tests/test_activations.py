import math

import pytest
import torch
from torch import nn

from ffnlab.core.activations import ACTIVATIONS, Activation, aliases, attention_context, get_activation, resolve

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
}
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
    assert set(REF) == set(ACTIVATIONS)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_values_match_float64_reference(name):
    act = get_activation(name).double()
    expected = torch.tensor([REF[name](float(x)) for x in X], dtype=torch.float64)
    tol = REF_TOL.get(name, 1e-12)
    torch.testing.assert_close(act(X), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gradients_gradcheck(name):
    act = get_activation(name).double()
    x = torch.linspace(-6, 6, 37, dtype=torch.float64)
    x = x[(x - x.round()).abs() > 1e-3]  # away from kinks at integers (relu at 0, hardswish at +-3)
    x = x.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(act, (x,), eps=1e-6, atol=1e-7)
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
