"""INT8 with real libraries: torchao for PyTorch modules, ONNX Runtime's quantiser for ONNX files.

One table, `SCHEMES`, names each way a model becomes int8:

    int8-dynamic      torchao: int8 weights per output channel, activations quantised per token at run time
    int8-weight       torchao: int8 weights per output channel, activations stay floating point
    ort-int8-dynamic  ONNX Runtime quantize_dynamic: int8 weights, activation scales computed at run time
    ort-int8-static   ONNX Runtime quantize_static, QDQ format: activation scales calibrated on batches

Quantisation-aware training (`prepare_qat`, `convert_qat`) fake-quantises the same int8 as
int8-dynamic, so a QAT run converts to exactly the model PTQ would build from its weights: the two
are compared on one quantiser. Every nn.Linear is quantised (the attention and FFN projections and
the output head; embeddings and norms stay floating point), and on ONNX every MatMul and Gemm.

NOTE: torchao's QAT fake-quantises activations per token asymmetrically only ("Symmetric per token is
not supported yet" in 0.18), so int8-dynamic uses asymmetric per-token activations too.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import nn

from ffnlab._util.files import atomic_path
from ffnlab._util.names import by_name, closest
from ffnlab._util.text import shorten
from ffnlab.core.ffn import GatedFFN

if TYPE_CHECKING:
    from torchao.core.config import AOBaseConfig

ONNX_OPS = ["MatMul", "Gemm"]  # what ONNX Runtime quantises: the same layers as torchao's nn.Linear


@dataclass(frozen=True)
class Scheme:
    """One way to make a model int8: the library that does it and what it quantises."""

    name: str
    backend: Literal["torch", "onnx"]  # quantises a PyTorch module (eager, compile) or an ONNX file (onnxruntime)
    library: str
    about: str


SCHEMES: dict[str, Scheme] = by_name(
    [
        Scheme(
            "int8-dynamic",
            "torch",
            "torchao Int8DynamicActivationInt8WeightConfig",
            "int8 weights per output channel; activations int8 per token (asymmetric), scales computed per call",
        ),
        Scheme(
            "int8-weight", "torch", "torchao Int8WeightOnlyConfig", "int8 weights per output channel; float activations"
        ),
        Scheme(
            "ort-int8-dynamic",
            "onnx",
            "onnxruntime.quantization.quantize_dynamic",
            "int8 weights per output channel; activations uint8, scales computed per call",
        ),
        Scheme(
            "ort-int8-static",
            "onnx",
            "onnxruntime.quantization.quantize_static (QDQ)",
            "int8 weights per output channel; int8 activations, scales calibrated (min-max) on batches",
        ),
    ]
)


def get_scheme(name: str) -> Scheme:
    """The SCHEMES entry for `name`; ValueError naming the valid ones."""
    key = name.strip().lower().replace("_", "-")
    if key not in SCHEMES:
        raise ValueError(f"unknown int8 scheme '{shorten(name)}'{closest(key, SCHEMES)}; valid: {', '.join(SCHEMES)}")
    return SCHEMES[key]


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """torchao's and ONNX Runtime's import and quantiser chatter off: torchao logs that its CUDA-only
    extensions do not load on a CPU build, torch that torchao registers an enum the old way, ONNX Runtime
    suggests pre-processing on the root logger, and compiling a model warns about caching and (importing
    torch.utils.mkldnn) about torch.jit."""
    names = ("torchao", "torch.utils._pytree", "")
    levels = {name: logging.getLogger(name).level for name in names}
    root = logging.getLogger()
    # NOTE: logging.warning() on a root logger without handlers installs one for good (basicConfig)
    stand_in = logging.NullHandler() if not root.handlers else None
    if stand_in is not None:
        root.addHandler(stand_in)
    try:
        for name in names:
            logging.getLogger(name).setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*_stable_hash_for_caching.*")
            warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*")  # inductor's first import
            warnings.filterwarnings("ignore", module="torchao")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if stand_in is not None:
            root.removeHandler(stand_in)


def torchao_version() -> str | None:
    """The installed torchao's version, None when it is not installed (`pip install ffnlab[deploy]`)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_torchao(what: str) -> None:
    """ValueError in one line when torchao, which `what` needs, is not installed."""
    if torchao_version() is None:
        raise ValueError(f"{what} needs torchao: pip install 'ffnlab[deploy]'")


def _torchao_config(scheme: str) -> AOBaseConfig:
    with quiet_libraries():
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, MappingType

    if scheme == "int8-dynamic":
        return Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC)
    return Int8WeightOnlyConfig()


def eager_gated(model: nn.Module) -> nn.Module:
    """Every GatedFFN in `model` on its eager path: the fused path passes W_down's weight to its own kernel,
    past the module a quantiser swaps (and at inference it saves nothing: it only keeps less for backward)."""
    for m in model.modules():
        if isinstance(m, GatedFFN):
            m.fused = False
    return model


def conv1d_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's Conv1D modules by path: GPT-2's matrices in transformers (y = x W + b, W stored (in, out))."""
    return [(name, m) for name, m in model.named_modules() if type(m).__name__ == "Conv1D"]


def conv1d_as_linear(model: nn.Module) -> nn.Module:
    """`model` with every Conv1D (`conv1d_modules`) replaced, in place, by the nn.Linear that computes the same
    (weight W^T), which torchao's quantisers take."""
    for name, m in conv1d_modules(model):  # a list: the loop replaces modules it walked
        weight, bias = m.get_parameter("weight"), getattr(m, "bias", None)  # (in, out), (out,)
        linear = nn.Linear(weight.shape[0], weight.shape[1], bias=bias is not None)
        with torch.no_grad():
            linear.weight.copy_(weight.t())
            if bias is not None:
                linear.bias.copy_(bias)
        parent, _, last = name.rpartition(".")
        setattr(model.get_submodule(parent), last, linear)
    return model


def quantize_model(model: nn.Module, scheme: str) -> nn.Module:
    """An int8 copy of `model` by a torch scheme of SCHEMES (torchao, every nn.Linear, GPT-2's Conv1D made one);
    `model` is left as it is. ValueError for an ONNX scheme, or naming the extra to install when torchao is not
    installed."""
    spec = get_scheme(scheme)
    if spec.backend != "torch":
        raise ValueError(f"{spec.name} quantises ONNX files (quantize_onnx); torch schemes: int8-dynamic, int8-weight")
    require_torchao(f"int8 scheme {spec.name}")
    with quiet_libraries():
        from torchao.quantization import quantize_

        quantized = conv1d_as_linear(eager_gated(copy.deepcopy(model))).eval()
        quantize_(quantized, _torchao_config(spec.name))
    return quantized


# ---- quantisation-aware training ------------------------------------------------------------------


def prepare_qat(model: nn.Module) -> nn.Module:
    """Fake-quantise `model` in place for quantisation-aware training (torchao QATConfig, prepare step): every
    nn.Linear becomes a FakeQuantizedLinear that rounds its input per token and its weight per channel to int8
    in the forward pass (the gradient passes straight through). The parameters stay the same objects, so an
    optimizer built before goes on, and the state dict keeps its keys (checkpoints and saved weights load
    into a plain model), and so does the global random state. Gated FFNs leave the fused path (`eager_gated`)."""
    require_torchao("quantisation-aware training")
    with quiet_libraries():
        from torchao.quantization import quantize_
        from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

        act = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
        weight = IntxFakeQuantizeConfig(torch.int8, "per_channel", is_symmetric=True)
        # NOTE: each new layer draws an init its weights then replace; forked, so dropout masks after stay the same
        with torch.random.fork_rng(devices=[]):
            quantize_(eager_gated(model), QATConfig(activation_config=act, weight_config=weight, step="prepare"))
    return model


def check_qat_model(model: nn.Module) -> None:
    """ValueError when `prepare_qat` would leave some of the model's matrices in float: it fake-quantises
    nn.Linear layers in place, and GPT-2's Conv1D (its attention and, unswapped, its FFN) is none (a trained
    model's copy converts: `quantize_model`)."""
    other = [name for name, _ in conv1d_modules(model)]
    if other:
        more = f" and {len(other) - 1} more" if len(other) > 1 else ""
        raise ValueError(
            f"qat_from fake-quantises nn.Linear layers; this model's Conv1D {other[0]}{more} would train "
            "unquantised: train without qat_from, or a model whose matrices are nn.Linear (ffnlab's own, LLaMA, BERT)"
        )


def convert_qat(model: nn.Module) -> nn.Module:
    """A model prepared by `prepare_qat` as the int8 model it was trained for (QATConfig, convert step, onto
    int8-dynamic), in place. Weights saved from a prepared model and loaded into a plain one convert by
    `quantize_model(model, "int8-dynamic")`: the same int8 model."""
    with quiet_libraries():
        from torchao.quantization import quantize_
        from torchao.quantization.qat import QATConfig

        quantize_(model, QATConfig(_torchao_config("int8-dynamic"), step="convert"))
    return model.eval()


def is_fake_quantized(model: nn.Module) -> bool:
    """Whether `prepare_qat` has fake-quantised `model`."""
    return any(type(m).__name__ == "FakeQuantizedLinear" for m in model.modules())


# ---- ONNX Runtime ------------------------------------------------------------------------------------


class _Batches:
    """onnxruntime's CalibrationDataReader protocol over a list of inputs."""

    def __init__(self, name: str, batches: Sequence[np.ndarray]) -> None:
        self.items = iter([{name: b} for b in batches])

    def get_next(self) -> dict[str, Any] | None:
        return next(self.items, None)


def quantize_onnx(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    scheme: str,
    calibration: Sequence[torch.Tensor | np.ndarray] = (),
) -> str:
    """`source` (an fp32 ONNX file) quantised by an ONNX scheme of SCHEMES into `target`, written atomically
    (nothing half-written). ort-int8-static calibrates its activation scales on `calibration`, a list of
    model inputs (ValueError when it is empty). Returns the target path."""
    spec = get_scheme(scheme)
    if spec.backend != "onnx":
        raise ValueError(
            f"{spec.name} quantises PyTorch modules (quantize_model); ONNX schemes: ort-int8-dynamic, ort-int8-static"
        )
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    common = {"weight_type": QuantType.QInt8, "per_channel": True, "op_types_to_quantize": ONNX_OPS}
    with atomic_path(target) as tmp, quiet_libraries():
        if spec.name == "ort-int8-dynamic":
            quantize_dynamic(str(source), str(tmp), **common)
        else:
            if not len(calibration):
                raise ValueError("ort-int8-static needs calibration batches")
            import onnx

            name = onnx.load(str(source), load_external_data=False).graph.input[0].name
            batches = [b.cpu().numpy() if isinstance(b, torch.Tensor) else b for b in calibration]
            quantize_static(str(source), str(tmp), _Batches(name, batches), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax, **common)  # fmt: skip
    return os.fspath(target)
