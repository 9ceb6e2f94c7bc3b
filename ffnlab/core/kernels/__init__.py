"""Fast paths: fused gated activations (torch.compile on CPU, Triton on CUDA).

    gated_act(gate, up, act)                       act(gate) * up, keeping only gate and up for backward
    fused_gated_down(gate, up, w_down, b, act)     the same, then the down projection, still keeping only
                                                   gate and up: the second half of a gated FFN

`FUSED_ACTS` is the table of activations with a fused kernel. A `GatedFFN` decides when it is built
whether it uses it (`resolve_fused`): from its `fused` argument and the policy of `set_fused_policy`
("auto": where `fused_is_faster` for the input; "always"; "never", the default with FFNLAB_EAGER=1).
"""

from ffnlab.core.kernels.fused import (
    BACKENDS,
    FUSED_ACTS,
    FUSED_POLICIES,
    FusedAct,
    FusedPolicy,
    GatedAct,
    check_act,
    compile_failure,
    eager_forced,
    fused_gated_down,
    fused_is_faster,
    gated_act,
    gated_backward,
    gated_forward,
    get_fused_policy,
    pick_backend,
    resolve_fused,
    set_fused_policy,
    triton_ready,
    use_fused_policy,
)

__all__ = [
    "BACKENDS",
    "FUSED_ACTS",
    "FUSED_POLICIES",
    "FusedAct",
    "FusedPolicy",
    "GatedAct",
    "check_act",
    "compile_failure",
    "eager_forced",
    "fused_gated_down",
    "fused_is_faster",
    "gated_act",
    "gated_backward",
    "gated_forward",
    "get_fused_policy",
    "pick_backend",
    "resolve_fused",
    "set_fused_policy",
    "triton_ready",
    "use_fused_policy",
]
