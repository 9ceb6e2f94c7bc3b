"""Fast paths: fused gated activations (torch.compile on CPU, Triton on CUDA).

    gated_act(gate, up, act)                 act(gate) * up, keeping only gate and up for backward
    fused_gated_down(gate, up, w_down, b, act)     the same, then the down projection, still keeping only
                                             gate and up: the second half of a gated FFN

`FUSED_ACTS` is the table of activations with a fused kernel; `GatedFFN` uses it where `fused_is_faster`
(measured at least as fast as eager) or its `fused` argument says so, unless FFNLAB_EAGER=1.
"""

from ffnlab.core.kernels.fused import (
    BACKENDS,
    FUSED_ACTS,
    FusedAct,
    GatedAct,
    check_act,
    compile_failure,
    eager_forced,
    fused_gated_down,
    fused_is_faster,
    gated_act,
    gated_backward,
    gated_forward,
    pick_backend,
    triton_ready,
)

__all__ = [
    "BACKENDS",
    "FUSED_ACTS",
    "FusedAct",
    "GatedAct",
    "check_act",
    "compile_failure",
    "eager_forced",
    "fused_is_faster",
    "gated_act",
    "gated_backward",
    "fused_gated_down",
    "gated_forward",
    "pick_backend",
    "triton_ready",
]
