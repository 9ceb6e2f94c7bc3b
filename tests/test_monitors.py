import pytest
import torch

from ffnlab.core.ffn import build_ffn
from ffnlab.run.monitors import ActivationProbe


@pytest.mark.parametrize("glu_norm", ["none", "pre", "both"])
def test_the_probe_sees_the_gate_as_the_ffn_computes_it(glu_norm):
    torch.manual_seed(0)
    ffn = build_ffn("swiglu", 32, glu_norm=glu_norm, fused=False)
    x = 3.0 + torch.randn(4, 8, 32)  # far from normed: a probe that skipped norm_in would see other gates
    probe = ActivationProbe([("layer0", ffn)])
    ffn(x)
    probe.remove()
    gate = ffn.w_gate(ffn.norm_in(x) if ffn.norm_in is not None else x).detach()
    stats = probe.summary()["layer0"]
    assert stats["inactive_frac"] == pytest.approx((gate <= 0).float().mean().item())
    assert stats["std_pre"] == pytest.approx(gate.std(unbiased=False).item(), rel=1e-4)
