"""ONNX export of FFN variants and Transformers, checked against PyTorch in onnxruntime.

`export_onnx` writes the graph atomically (temp file in the target folder, then os.replace), runs
it in onnxruntime on the example input and compares with PyTorch within a stated tolerance;
`describe_activations` reads back how each activation was expressed: one ONNX op (Gelu with its
`approximate` attribute from opset 20 on, Mish, HardSwish, Relu, ...) or a decomposition
(Erf, Tanh or Sigmoid with Mul/Add/Pow around it).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import logging
import os
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from ffnlab._util.files import atomic_path, check_writable
from ffnlab._util.text import first_line, shorten
from ffnlab.core.ffn import FFN, GatedFFN, build_ffn, get_ffn_spec
from ffnlab.core.memory import build_on_meta
from ffnlab.core.model import ModelConfig, Transformer, param_count

if TYPE_CHECKING:
    from onnx import AttributeProto

    from ffnlab.tools.hf import HFModel  # imported where used: it needs transformers

OPSET = 20  # the first opset with a Gelu op (approximate="none"|"tanh"); onnxruntime >= 1.17 runs it
ONNX_MAX_BYTES = 2**31  # a protobuf message, so one .onnx file without external data, is under 2 GiB
ATOL, RTOL = 1e-5, 1e-5  # parity: max |onnx - torch| <= ATOL + RTOL * max |torch|, fp32
# ops that carry an activation's non-linearity; a decomposition adds Mul/Add/Div around them
NONLINEAR_OPS = (
    "Gelu",
    "Erf",
    "Tanh",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Swish",
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Elu",
    "Selu",
    "Celu",
    "Mish",
    "Softplus",
    "Softsign",
    "Clip",
    "Exp",
    "Pow",
)


class FirstOutput(nn.Module):
    """Exports only the first output of a module that returns a tuple, as (logits, loss)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first: torch.Tensor = self.module(x)[0]
        return first


def _attr(a: AttributeProto) -> object:
    import onnx

    value = onnx.helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else value


# one node: (op_type, name, attributes, the module classes the dynamo exporter recorded or None)
Node = tuple[str, str, dict[str, object], list[str] | None]


def graph_ops(onnx_path: str | os.PathLike[str]) -> list[Node]:
    """Every node of an ONNX file (graph, then local functions) as (op_type, name, attributes, classes).

    `classes` is the module class hierarchy the dynamo exporter records for each node (outermost
    first, ending with the aten op), or None where the graph has no such record.
    """
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    nodes = list(model.graph.node) + [n for f in model.functions for n in f.node]
    out: list[Node] = []
    for n in nodes:
        meta = {p.key: p.value for p in n.metadata_props}
        classes = meta.get("pkg.torch.onnx.class_hierarchy")
        out.append(
            (n.op_type, n.name, {a.name: _attr(a) for a in n.attribute}, ast.literal_eval(classes) if classes else None)
        )
    return out


LINEAR = ("torch.nn.modules.linear.Linear", "aten.linear", "aten.addmm", "aten.matmul", "aten.mm")


def _in_ffn_nonlinearity(classes: list[str]) -> bool:
    """A node inside an ffnlab FFN but outside its linear maps: activation or gating math.
    (The fused GatedFFN path calls F.linear itself, so the aten op is checked too.)"""
    return any(c.startswith("ffnlab.core.ffn.") for c in classes) and not any(c.startswith(LINEAR) for c in classes)


def describe_activations(onnx_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """How the FFN activations of an exported graph are expressed: {"op", "name", **attributes}
    per node, in graph order.

    Graphs from the dynamo exporter record each node's module classes; the nodes inside an ffnlab
    FFN but outside its Linear layers are its activation (and gating) math: at opset >= 20 a gelu
    FFN shows one Gelu(approximate=none), below that Div, Erf, Add, Mul, Mul; swiglu shows Sigmoid,
    Mul (silu) and Mul (the gate product). Nodes without that record (TorchScript exporter) count
    when their op is non-linear (NONLINEAR_OPS): Gelu, Erf, Tanh, Sigmoid, Pow, ...
    """
    return [
        {"op": op, "name": name, **attrs}
        for op, name, attrs, classes in graph_ops(onnx_path)
        if (_in_ffn_nonlinearity(classes) if classes else op in NONLINEAR_OPS)
    ]


def activation_summary(described: list[dict[str, Any]]) -> str:
    """One line for `describe_activations`' list, 'Gelu(approximate=tanh) x2, Pow x1': each op with its
    attributes and how often it occurs."""

    def label(d: dict[str, Any]) -> str:
        attrs = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items() if k not in ("op", "name")
        )
        return f"{d['op']}({attrs})" if attrs else d["op"]

    counts = Counter(label(d) for d in described)
    return ", ".join(f"{k} x{n}" for k, n in counts.items()) or "none"


def dynamic_axes(example: torch.Tensor) -> list[int]:
    """Axes left symbolic: all of integer token ids (batch, seq), all but the feature axis of floats."""
    return list(range(example.ndim if not example.is_floating_point() else example.ndim - 1))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' progress lines, log messages and deprecation warnings."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _export(module: nn.Module, example: torch.Tensor, path: str, opset: int, dynamo: bool, dynamic: bool) -> None:
    axes = dynamic_axes(example) if dynamic else []
    if dynamo:
        shapes = ({a: torch.export.Dim.AUTO for a in axes},) if axes else None
        torch.onnx.export(
            module,
            (example,),
            path,
            opset_version=opset,
            dynamo=True,
            external_data=False,
            dynamic_shapes=shapes,
            input_names=["x"],
            output_names=["y"],
        )
    else:
        torch.onnx.export(
            module,
            (example,),
            path,
            opset_version=opset,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {a: f"d{a}" for a in axes}} if axes else None,
        )


def export_onnx(
    module: nn.Module,
    example: torch.Tensor,
    path: str | os.PathLike[str],
    opset: int = OPSET,
    dynamo: bool = True,
    dynamic: bool = True,
    atol: float = ATOL,
    rtol: float = RTOL,
) -> dict[str, Any]:
    """Export `module` in eval mode (its mode is restored after) to ONNX at `path`, checked in onnxruntime.

    Gated FFNs export their eager ops (act(gate) * up): the fused kernel only saves memory in
    backward, and its algebra would hide a plain Sigmoid or Gelu op behind a decomposition.

    Tries the torch.export-based exporter (dynamo=True) and, if it fails, falls back to the
    TorchScript exporter, saying why in report["fallback"]. With `dynamic`, the example's axes
    from `dynamic_axes` stay symbolic. A module returning a tuple exports its first element.
    Nothing is written unless export and the parity check succeed: max |onnx - torch| must be
    within atol + rtol * max |torch|, else ValueError.

    Returns {"path", "opset", "exporter", "fallback", "max_abs_diff", "tol", "ops", "activations",
    "summary"}: ops are all op types in graph order, activations `describe_activations`' list,
    summary its `activation_summary` line.
    """
    import onnxruntime as ort

    training = module.training
    gated = [(m, m.fused) for m in module.modules() if isinstance(m, GatedFFN)]
    module.eval()
    for m, _ in gated:
        m.fused = False
    try:
        return _export_checked(module, example, path, opset, dynamo, dynamic, atol, rtol, ort)
    finally:
        module.train(training)
        for m, fused in gated:
            m.fused = fused


def file_opset(path: str | os.PathLike[str]) -> int | None:
    """The default-domain opset an ONNX file declares (what runtimes see), None if it names none."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def check_opset(opset: int) -> None:
    """ValueError naming the range torch's exporters can write, unless `opset` is in it."""
    from torch.onnx import _constants

    low, high = _constants.ONNX_MIN_OPSET, _constants.ONNX_MAX_OPSET
    if not isinstance(opset, int) or not low <= opset <= high:
        raise ValueError(f"unsupported ONNX opset {opset}; valid: {low}-{high} (default {OPSET})")


def _export_checked(
    module: nn.Module,
    example: torch.Tensor,
    path: str | os.PathLike[str],
    opset: int,
    dynamo: bool,
    dynamic: bool,
    atol: float,
    rtol: float,
    ort: ModuleType,  # onnxruntime, imported by the caller
) -> dict[str, Any]:
    check_opset(opset)
    with torch.no_grad():
        expected = module(example)
    if isinstance(expected, tuple):
        module, expected = FirstOutput(module), expected[0]
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no folder {folder} to write {path} into")
    with atomic_path(path) as tmp_path:  # renamed onto path only if every check below passes
        tmp = str(tmp_path)
        exporter, fallback = ("dynamo" if dynamo else "torchscript"), None
        with _quiet():
            try:
                _export(module, example, tmp, opset, dynamo, dynamic)
            except Exception as e:  # any exporter failure: the TorchScript exporter gets a try
                if not dynamo:
                    raise
                exporter, fallback = "torchscript", first_line(e)
                _export(module, example, tmp, opset, False, dynamic)
            if file_opset(tmp) != opset and exporter == "dynamo":  # it cannot always convert down: 12 came out 18
                exporter, fallback = "torchscript", f"the dynamo exporter wrote opset {file_opset(tmp)}, not {opset}"
                _export(module, example, tmp, opset, False, dynamic)
        written = file_opset(tmp)
        if written != opset:
            raise ValueError(
                f"asked for ONNX opset {opset}, but the exporter writes opset {written} for this model; "
                f"ask for --opset {written}; nothing written"
            )
        session = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {session.get_inputs()[0].name: example.detach().cpu().numpy()})
        expected = expected.float()
        diff = (torch.from_numpy(got).float() - expected.cpu()).abs().max().item()
        tol = atol + rtol * expected.abs().max().item()
        if not diff <= tol:  # also catches NaN
            raise ValueError(f"ONNX output differs from PyTorch by {diff:.2e} > tolerance {tol:.2e}; nothing written")
        ops = [op for op, _, _, _ in graph_ops(tmp)]
        described = describe_activations(tmp)
    return {
        "path": path,
        "opset": opset,
        "exporter": exporter,
        "fallback": fallback,
        "max_abs_diff": diff,
        "tol": tol,
        "atol": atol,
        "rtol": rtol,
        "ops": ops,
        "activations": described,
        "summary": activation_summary(described),
    }


# ---- named exports for the CLI -------------------------------------------------------------------

MODELS = ("ffn", "small")  # or a path to a Hugging Face config.json


def export_variant(
    ffn: str,
    path: str | os.PathLike[str],
    model: str = "ffn",
    d_model: int | None = None,
    n_layers: int | None = None,
    opset: int = OPSET,
) -> dict[str, Any]:
    """Export one FFN variant to ONNX, alone or inside a model, and return export_onnx's report.

    model "ffn": the FFN alone at d_model (default 64) on a (2, 8, d_model) input. "small": an
    ffnlab Transformer with ModelConfig's defaults, that FFN, and d_model / n_layers if given, on
    (2, 16) token ids. A path to a Hugging Face config.json: that architecture with its FFNs
    swapped (ffnlab.tools.hf.build_hf_model). Inputs come from a fixed generator; batch and sequence
    axes stay dynamic.
    """
    spec = get_ffn_spec(ffn)
    check_opset(opset)
    check_writable(path)  # before the model is built and exported
    gen = torch.Generator().manual_seed(0)
    module: FFN | Transformer | HFModel
    if model == "ffn":
        d_model = d_model or 64
        module = build_within_limit(functools.partial(build_ffn, spec.name, d_model))
        example = torch.randn(2, 8, d_model, generator=gen)
        d_ff = module.d_ff
    elif model == "small":
        sizes: dict[str, Any] = {k: v for k, v in (("d_model", d_model), ("n_layers", n_layers)) if v}
        module = build_within_limit(lambda: Transformer(ModelConfig(ffn=spec.name, **sizes)))
        example = torch.randint(0, module.cfg.vocab_size, (2, min(16, module.cfg.context)), generator=gen)
        d_model = module.cfg.d_model
        d_ff = next(m.d_ff for m in module.modules() if isinstance(m, FFN))  # the first block's FFN
    elif os.path.exists(model):
        if d_model or n_layers:
            raise ValueError("--d-model and --n-layers apply to ffn and small; a Hugging Face config sets its own")
        from ffnlab.tools.hf import build_hf_model

        module = build_within_limit(lambda: build_hf_model(model, spec.name))
        example = torch.randint(0, module.cfg.vocab_size, (2, min(16, module.cfg.context)), generator=gen)
        d_model, d_ff = module.cfg.d_model, module.cfg.d_ff
    else:
        raise ValueError(
            f"unknown model '{shorten(model)}'; valid: {', '.join(MODELS)}, or a Hugging Face config.json path"
        )
    report = export_onnx(module, example, path, opset=opset)
    return {
        "ffn": spec.name,
        "acts": list(spec.acts),
        "model": model,
        "d_model": d_model,
        "d_ff": d_ff,
        "input_shape": list(example.shape),
        **report,
    }


M = TypeVar("M", bound=nn.Module)


def build_within_limit(build: Callable[[], M]) -> M:
    """`build()`, once its shapes (`build_on_meta`: nothing allocated) show that its fp32 weights fit
    in one ONNX file; ValueError naming the size otherwise."""
    n_params = param_count(build_on_meta(build, "use a smaller --d-model or --n-layers"))
    if 4 * n_params > ONNX_MAX_BYTES:
        raise ValueError(
            f"{n_params:,} parameters are {4 * n_params / 2**30:,.1f} GiB in fp32, more than the 2 GiB one ONNX "
            "file holds; use a smaller --d-model or --n-layers"
        )
    return build()


def format_export(report: dict[str, Any]) -> str:
    """Human-readable lines for an export report: what, where, how activations look, parity."""
    r = report
    what = f"{r['ffn']} FFN" if r["model"] == "ffn" else f"{r['model']} model with {r['ffn']} FFNs"
    lines = [
        f"exported {what} (d_model={r['d_model']}, d_ff={r['d_ff']}) to {r['path']}: "
        f"opset {r['opset']}, {r['exporter']} exporter"
    ]
    if r["fallback"]:
        lines.append(f"  the dynamo exporter failed ({r['fallback']}); used the TorchScript exporter instead")
    lines.append(f"activation {' + '.join(r['acts'])} (FFN ops outside its Linear layers): {r['summary']}")
    if r["model"] == "ffn":
        lines.append(f"graph: {' '.join(r['ops'])}")
    lines.append(
        f"parity on input {tuple(r['input_shape'])}: max |onnx - torch| = {r['max_abs_diff']:.2e} "
        f"<= tolerance {r['tol']:.2e} (atol {r['atol']:g} + rtol {r['rtol']:g} * max |torch|)"
    )
    return "\n".join(lines)
