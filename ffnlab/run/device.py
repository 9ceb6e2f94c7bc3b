"""Where and in what precision a run trains: the device and precision `auto` resolves to, and
whether the built-in model fits this machine's memory at all."""

from __future__ import annotations

import torch

from ffnlab._util.machine import bf16_native, check_memory
from ffnlab.core.memory import build_on_meta
from ffnlab.core.model import ModelConfig, Transformer, param_count
from ffnlab.run.config import Precision, TrainConfig


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' where CUDA is available, else 'cpu'; ValueError for 'cuda' without CUDA."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; valid here: cpu, auto")
    return device


def resolve_precision(precision: Precision, device: str) -> Precision:
    """'auto' -> 'bf16' where bf16 matmuls are native (`bf16_native`: a CUDA GPU with bf16, a CPU with
    AMX or AVX512_BF16), else 'fp32'. A 'cuda' or 'auto' device on a machine without CUDA stays
    'auto': the machine that runs it decides.

    Measured speed and loss per machine class: benchmarks/README.md, "Precision auto".
    """
    if precision != "auto":
        return precision
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "bf16" if bf16_native("cpu") else "fp32"
    if not torch.cuda.is_available():
        return "auto"
    return "bf16" if bf16_native("cuda") else "fp32"


def check_fits(cfg: TrainConfig, mcfg: ModelConfig, device: str) -> None:
    """ValueError, before anything is allocated, when the built-in model cannot train on this machine:
    sizes that overflow, or more memory than it has for fp32 weights, gradients and AdamW's two
    moments (16 bytes a parameter) plus a floor on the activations backward keeps (ten fp32
    (batch, context, d_model) tensors a layer)."""
    n_params = param_count(
        build_on_meta(lambda: Transformer(mcfg, cfg.seed), "use a smaller --d-model, --layers or --context")
    )
    need = 16 * n_params + 40 * cfg.batch_size * mcfg.context * mcfg.d_model * mcfg.n_layers
    check_memory(
        need,
        device,
        f"{mcfg.n_layers} layers of d_model {mcfg.d_model} ({n_params:,} parameters) at batch "
        f"{cfg.batch_size} x context {mcfg.context}",
        "use a smaller --d-model, --layers or --batch-size",
    )
