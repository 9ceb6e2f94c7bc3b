import mpmath
import numpy as np
import pytest
import torch

from ffnlab.core.activations import ACTIVATIONS, get_activation
from ffnlab.tools import references as refs

# ---- the references themselves, against mpmath formulas written here ----------------------------


def _mp_phi(x):
    return mpmath.erfc(-x / mpmath.sqrt(2)) / 2


def _mp_sigmoid(x):
    return 1 / (1 + mpmath.exp(-x))


MP = {
    "relu": lambda x: max(x, 0),
    "leaky_relu": lambda x: x if x > 0 else 0.01 * x,
    "relu2": lambda x: max(x, 0) ** 2,
    "hardswish": lambda x: x * min(max(x + 3, 0), 6) / 6,
    "mish": lambda x: x * mpmath.tanh(mpmath.log1p(mpmath.exp(x))),
    "gelu": lambda x: x * _mp_phi(x),
    "gelu_tanh": lambda x: x / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + 0.044715 * x**3))),
    "gelu_sigmoid": lambda x: x * _mp_sigmoid(1.702 * x),
    "agelu": lambda x: x * _mp_sigmoid(float(np.float32(1.702)) * x),  # a = 1, its float32 beta at init
    "silu": lambda x: x * _mp_sigmoid(x),
    "sigmoid": _mp_sigmoid,
    "tanh": mpmath.tanh,
    "identity": lambda x: x,
    "gelu_10": lambda x: min(max(x * _mp_phi(x), -10), 10),
    "switch": lambda x: (max(x, 0) + x * _mp_phi(x) + x * _mp_sigmoid(x)) / 3,
}
SAME_FUNCTION = {"gelu_erfc": "gelu", "swish_beta": "silu", "tunable_gelu": "gelu"}  # learnable ones at init
POINTS = [-9.5, -6.3, -5.2, -2.7, -1.1, -0.35, 0.45, 1.9, 3.3, 7.7]  # no kinks, tails of both signs


def mp_formula(name):
    spec = ACTIVATIONS[name]
    return MP[spec.same_as or SAME_FUNCTION.get(name, name)]


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_reference_matches_mpmath(name):
    ref, f = refs.REFERENCES[name], mp_formula(name)
    x = np.array(POINTS)
    with mpmath.workdps(60):
        want = [float(f(mpmath.mpf(v))) for v in POINTS]
        want_grad = [float(mpmath.diff(f, mpmath.mpf(v))) for v in POINTS]
    np.testing.assert_allclose(ref.f(x), want, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(ref.df(x), want_grad, rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_reference_matches_implementation_in_float64(name):
    # the reference is written independently of the registry; where float64 has no cancellation
    # (|x| < 3) the two must agree, or one of them is the wrong function
    x = torch.linspace(-3, 3, 601, dtype=torch.float64)
    act = get_activation(name).double()
    np.testing.assert_allclose(act(x).detach().numpy(), refs.REFERENCES[name].f(x.numpy()), rtol=1e-9, atol=1e-12)


def test_mp_gelu_matches_float64_reference_in_tail():
    x = np.array([-10.0, -8.0, -6.0, -5.5, -4.0, 0.5, 3.0])
    np.testing.assert_allclose([refs.mp_gelu(v) for v in x], refs.GELU.f(x), rtol=1e-14)
    np.testing.assert_allclose([refs.mp_gelu_grad(v) for v in x], refs.GELU.df(x), rtol=1e-12)
