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
MP["energy_gated"] = lambda x: x * mpmath.exp(-(x**2) / 2)
MP["exponential"] = lambda x: mpmath.exp(x) if x <= 10 else mpmath.exp(10) * (x - 9)


def _mp_quantile(points):
    """The quantile activation in the context of one channel whose tokens are `points`, in mpmath."""
    k, centres = 16, []
    for side in (sorted(p for p in points if p < 0), sorted(p for p in points if p >= 0)):
        centres += [mpmath.mpf(side[(2 * j + 1) * len(side) // (2 * k)]) for j in range(k)]  # both sides non-empty
    mean = mpmath.fsum(points) / len(points)
    h = 1.06 * mpmath.sqrt(mpmath.fsum((p - mean) ** 2 for p in points) / len(points)) * mpmath.mpf(2 * k) ** -0.2
    return lambda x: mpmath.fsum(mpmath.erf((x - c) / (mpmath.sqrt(2) * h)) for c in centres) / (2 * k)


# the formula at the i-th of POINTS where it reads more than that point: the split's channel i (GELU on the
# first ceil(C/2)), the quantile activation's context (all POINTS, held fixed for the derivative)
MP_AT = {
    "split_gelu_tanh": lambda i: MP["gelu"] if i < (len(POINTS) + 1) // 2 else MP["tanh"],
    "quantile": lambda i: _mp_quantile(POINTS),
}
SAME_FUNCTION = {"gelu_erfc": "gelu", "swish_beta": "silu", "tunable_gelu": "gelu"}  # learnable ones at init
POINTS = [-9.5, -6.3, -5.2, -2.7, -1.1, -0.35, 0.45, 1.9, 3.3, 7.7]  # no kinks, tails of both signs


def mp_formula(name):
    spec = ACTIVATIONS[name]
    return MP[spec.same_as or SAME_FUNCTION.get(name, name)]


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_reference_matches_mpmath(name):
    ref, x = refs.REFERENCES[name], np.array(POINTS)
    with mpmath.workdps(60):
        fs = [MP_AT[name](i) if name in MP_AT else mp_formula(name) for i in range(len(POINTS))]
        want = [float(f(mpmath.mpf(v))) for f, v in zip(fs, POINTS)]
        want_grad = [float(mpmath.diff(f, mpmath.mpf(v))) for f, v in zip(fs, POINTS)]
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


def test_mp_gelu_tanh_matches_the_tanh_formula():
    with mpmath.workdps(60):
        want = [float(MP["gelu_tanh"](mpmath.mpf(v))) for v in POINTS]
    np.testing.assert_allclose([refs.mp_gelu_tanh(v) for v in POINTS], want, rtol=1e-14)
    np.testing.assert_allclose([refs.mp_gelu_tanh(v) for v in POINTS], refs.GELU_TANH.f(np.array(POINTS)), rtol=1e-13)
