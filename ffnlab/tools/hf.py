"""Hugging Face integration: swap the FFN of a transformers model for an ffnlab variant, and build
Hugging Face architectures behind ffnlab's `forward(idx, targets) -> (logits, loss)` interface.

    swap_ffn(model, "swiglu")            replaces every FFN of that one model instance in place
    swap_attn_act(model, "q=gelu,k=gelu") activations on the q/k/v projections of every attention
    load_swapped(folder)                 a swapped model saved with save_pretrained, loaded back
    local_config(folder)                 a local folder's config: never the Hub, never the folder's own code
    build_hf_model(config, "geglu")      random-init model from a config, FFN swapped, seeded
    hf_to_ffnlab / ffnlab_to_hf          activation names both ways (hidden_act, feed_forward_proj)
    config_activation(config)            which activation a config's FFN runs (field, gated, ffnlab variant)
    model_activation(config)             the ffnlab activation a config's FFN runs

Supported families live in one table, `FAMILIES`: where the FFNs are, how to read their weights
under ffnlab's names (w_gate/w_up/w_down, w_in/w_out) and how to put a replacement in place.
Nothing is patched at class level: only the given instance's submodules change. Its config keeps
describing the original FFN and gains `ffnlab_ffn` ({"ffn", "match"}), which `save_pretrained`
writes to config.json and `load_swapped` reads to rebuild the same modules before loading weights.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from ffnlab._util.files import atomic_folder
from ffnlab._util.names import closest
from ffnlab._util.reading import JSON_LIMIT, TOKENIZER_LIMIT, check_readable, read_text
from ffnlab.core.activations import ACTIVATIONS, InputMixture, get_activation
from ffnlab.core.ffn import (
    DEFAULT_INIT,
    FFN,
    FFNS,
    GATED,
    MATCHES,
    DenseFFN,
    FFNSpec,
    GatedFFN,
    Init,
    Match,
    MixFFN,
    check_init,
    ffn_flops_per_token,
    hidden_dim_for_target,
    init_ffn,
    single_ffn_spec,
    spec_of,
    spec_param_count,
)
from ffnlab.core.memory import check_layer_count
from ffnlab.core.model import PROJECTIONS, param_generator, parse_attn_act
from ffnlab.tools.quantize import quiet_libraries

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.pytorch_utils import Conv1D


class AutoModelClass(Protocol):
    """The calls ffnlab makes of a transformers Auto class (AutoModelForCausalLM, ...), typed here: transformers
    leaves `from_config` unannotated and `from_pretrained`'s return too."""

    def from_config(self, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel: ...

    def from_pretrained(self, pretrained_model_name_or_path: str, *model_args: Any, **kwargs: Any) -> Any: ...


class UnsupportedModelError(ValueError):
    """The model's architecture is not in FAMILIES, or it lacks the FFN modules its family has."""


class PretrainedWeightsWarning(UserWarning):
    """A swap put freshly initialised FFNs into a model: its pretrained FFN weights no longer apply."""


class ActivationConfigWarning(UserWarning):
    """A config names two different activations (hidden_act and hidden_activation, as Gemma's did)."""


# ---- activation names -------------------------------------------------------------------------

# Hugging Face ACT2FN name -> ffnlab activation that computes it with the same expression, so a swap
# to the model's own activation is bit-for-bit what the model computed.
HF_ACTS = {
    "relu": "relu",
    "leaky_relu": "leaky_relu",
    "relu2": "relu2",
    "hardswish": "hardswish",
    "mish": "mish",
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_fast",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh",
    "gelu_accurate": "gelu_accurate",
    "gelu_python": "gelu_python",
    "gelu_10": "gelu_10",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "swish": "swish",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "linear": "identity",
    "gelu_python_tanh": "gelu_tanh",  # NOTE: same function, but Hugging Face writes it out: not the same bits
}
# ffnlab activation -> the Hugging Face name to write for it, where the names differ
HF_NAME = {"identity": "linear", "gelu_tanh": "gelu_pytorch_tanh", "gelu_sigmoid": "quick_gelu"}
# NOTE: T5 reads feed_forward_proj "gated-gelu" as gelu_new (the tanh approximation), for T5 v1.1
T5_LEGACY = {"gated-gelu": "gelu_new"}
# config fields that name the FFN activation, in the order they are read: T5's feed_forward_proj (which also
# says whether the FFN is gated), Gemma's hidden_activation (added to override hidden_act), hidden_act,
# GPT-2's activation_function, DistilBERT's activation
HF_KEYS = ("feed_forward_proj", "hidden_activation", "hidden_act", "activation_function", "activation")
# architectures whose MLP is gated (gate_proj/up_proj/down_proj): the activation their config names is the gate's
GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "gemma3",
                     "phi3", "olmo", "olmo2")  # fmt: skip


def canonical(act: str) -> str:
    """The registry entry an activation equals mathematically (gelu_new -> gelu_tanh)."""
    return ACTIVATIONS[act].same_as or act


def _hf_act(name: str) -> str:
    key = str(name).strip().lower()
    if key not in HF_ACTS:
        raise ValueError(
            f"unsupported Hugging Face activation '{name}'{closest(key, HF_ACTS)}; supported: {', '.join(HF_ACTS)}"
        )
    return HF_ACTS[key]


def _gated_name(act: str) -> str:
    """GATED variant whose activation is `act` up to an alias: gelu_new -> geglu_tanh."""
    for name, spec in GATED.items():
        if spec.acts[0] == canonical(act):
            return name
    raise ValueError(
        f"no gated ffnlab variant uses '{act}'; gated variants: "
        + ", ".join(f"{n} ({s.acts[0]})" for n, s in GATED.items())
    )


def hf_to_ffnlab(name: str) -> str:
    """ffnlab name for a Hugging Face activation string or T5 `feed_forward_proj`.

    Activation strings (hidden_act, hidden_activation, activation_function, dense_act_fn) give the
    ffnlab activation with the same expression, which is also the dense FFN variant of that name:
    'silu' -> 'silu', 'gelu_new' -> 'gelu_new', 'linear' -> 'identity'. T5's 'gated-ACT' gives the
    gated variant: 'gated-silu' -> 'swiglu', 'gated-gelu' -> 'geglu_tanh' (T5 runs gelu_new for it).
    """
    key = str(name).strip().lower()
    if key.startswith("gated-"):
        return _gated_name(_hf_act(T5_LEGACY.get(key, key[len("gated-") :])))
    return _hf_act(key)


def ffnlab_to_hf(name: str, key: str = "hidden_act") -> str:
    """Hugging Face string for an ffnlab activation or FFN variant, for the config field `key`.

    key "hidden_act" (likewise hidden_activation, activation_function) gives the activation; for a
    gated variant that is the gate's ('swiglu' -> 'silu'), the gating being the architecture's.
    key "feed_forward_proj" gives T5's form: 'relu', or 'gated-ACT' ('swiglu' -> 'gated-silu',
    'geglu_tanh' -> 'gated-gelu'). ValueError where no Hugging Face activation computes it.
    """
    if key not in HF_KEYS:
        raise ValueError(f"unknown config key '{key}'; valid: {', '.join(HF_KEYS)}")
    spec = single_ffn_spec(name)
    if spec.kind in ("mix", "switch"):
        raise ValueError(f"'{name}' mixes {len(spec.acts)} activations; Hugging Face configs name one")
    act = spec.acts[0]
    hf = HF_NAME.get(act, act)
    if hf not in HF_ACTS or canonical(HF_ACTS[hf]) != canonical(act):
        raise ValueError(
            f"no Hugging Face activation computes '{act}'; "
            f"ffnlab activations with one: {', '.join(sorted(set(HF_ACTS.values())))}"
        )
    if key != "feed_forward_proj" or spec.kind == "dense":
        return hf
    if canonical(act) == "gelu_tanh":
        return "gated-gelu"  # the T5 v1.1 string; it runs gelu_new, the same function
    # NOTE: 'gated-gelu' would mean gelu_new to T5, so exact GELU is spelt with its other name
    return "gated-" + ("gelu_python" if hf == "gelu" else hf)


def _get(config: object, key: str) -> Any:  # a config value, of any JSON type
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


@dataclass(frozen=True)
class ConfigActivation:
    """The FFN activation a Hugging Face config names: where, as written, and what ffnlab computes it with."""

    field: str  # the config field that names it, the first of HF_KEYS the config sets
    value: str  # as written there: 'silu', 'gated-gelu'
    hf_act: str  # the Hugging Face activation it runs: T5's 'gated-gelu' runs gelu_new
    gated: bool  # the activation is a GLU's gate: T5's 'gated-ACT', or an architecture in GATED_MODEL_TYPES
    overridden: str | None = None  # a hidden_act that hidden_activation overrides (Gemma's configs)

    @property
    def act(self) -> str | None:
        """The ffnlab activation with the same expression, None where ffnlab has none."""
        return HF_ACTS.get(self.hf_act)

    def variant(self) -> str:
        """The ffnlab FFN variant computing this FFN: the activation's dense variant ('gelu_new' for GPT-2) or
        its gated one ('swiglu' for LLaMA's silu). ValueError naming what ffnlab lacks."""
        act = _hf_act(self.hf_act)
        return _gated_name(act) if self.gated else act


def config_activation(config: dict[str, Any] | PretrainedConfig, where: str = "config") -> ConfigActivation:
    """Which activation a Hugging Face config's FFN runs: the one home of that question (swap_ffn, fine-tuning's
    own variant and `ffnlab advise --pretrained` read it here).

    T5's feed_forward_proj is read as T5 reads it ('gated-ACT' is a gated FFN running ACT, 'gated-gelu' runs
    gelu_new); where hidden_activation and hidden_act are both set, hidden_activation wins, the field added
    to override the legacy one. ValueError naming `where` when the config names no activation by name.
    """
    key = next((key for key in HF_KEYS if _get(config, key)), None)
    if key is None and isinstance(config, dict) and (family := family_defaults(config)) is not None:
        config = {**family.to_dict(), **config}  # what transformers runs: its default where the file names none
        key = next((key for key in HF_KEYS if _get(config, key)), None)
    if key is None:
        raise ValueError(f"{where} names no activation; looked for {', '.join(HF_KEYS)}")
    value = _get(config, key)
    if not isinstance(value, str):
        raise ValueError(f"{where}'s activation is {value!r}, not a name ffnlab can map")
    name = value.strip().lower()
    if key == "feed_forward_proj":
        return ConfigActivation(key, value, T5_LEGACY.get(name, name.split("-")[-1]), name.startswith("gated-"))
    hidden_act = _get(config, "hidden_act")
    overridden = hidden_act if key == "hidden_activation" and hidden_act and hidden_act != value else None
    return ConfigActivation(key, value, name, _get(config, "model_type") in GATED_MODEL_TYPES, overridden)


def family_defaults(config: dict[str, Any]) -> PretrainedConfig | None:
    """The config transformers builds for `config`'s model_type with nothing given: its defaults, which a
    config.json that leaves a field out runs with (a Llama config without hidden_act runs silu); None for a
    model_type transformers does not know."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    with quiet_transformers():
        return CONFIG_MAPPING[model_type]()


def model_activation(config: dict[str, Any] | PretrainedConfig) -> str:
    """ffnlab activation (exact expression) that a Hugging Face config's FFN runs (`config_activation`).

    ValueError where ffnlab has none. Where hidden_act and hidden_activation are both set and differ (Gemma
    configs have carried hidden_act="gelu" beside hidden_activation="gelu_pytorch_tanh"), hidden_activation
    wins and an ActivationConfigWarning says so.
    """
    found = config_activation(config)
    if found.overridden:
        warnings.warn(
            f"config has hidden_act='{found.overridden}' and hidden_activation='{found.value}'; "
            f"using hidden_activation='{found.value}'",
            ActivationConfigWarning,
            stacklevel=2,
        )
    return _hf_act(found.hf_act)


# ---- families: where the FFNs are and how to read and replace them ---------------------------


def _linear(prefix: str, lin: nn.Linear | Conv1D, transpose: bool = False) -> dict[str, torch.Tensor]:
    """A Linear's tensors under `prefix`; transpose for GPT-2's Conv1D, which stores (in, out)."""
    out = {f"{prefix}.weight": lin.weight.t() if transpose else lin.weight}
    if lin.bias is not None:
        out[f"{prefix}.bias"] = lin.bias
    return out


def _replace(model: nn.Module, path: str, new: nn.Module) -> dict[str, nn.Module]:
    old = model.get_submodule(path)
    model.set_submodule(path, new)
    return {path: old}


def _install_gpt2(model: nn.Module, path: str, ffn: nn.Module) -> dict[str, nn.Module]:
    # GPT2MLP ends with dropout(resid_pdrop) on its output; keep it there
    unit: Any = model.get_submodule(path)  # a GPT2MLP, read by attribute name as Family's units are
    return _replace(model, path, nn.Sequential(ffn, nn.Dropout(unit.dropout.p)))


def _install_bert(model: nn.Module, path: str, ffn: nn.Module) -> dict[str, nn.Module]:
    # BERT splits the FFN: intermediate = act(dense(h)), output = LayerNorm(dropout(dense(.)) + h).
    # The whole ffnlab FFN takes output.dense's place and intermediate becomes an identity, so the
    # FFN stays one module while BertOutput keeps its dropout, residual and LayerNorm.
    return {**_replace(model, f"{path}.intermediate", nn.Identity()), **_replace(model, f"{path}.output.dense", ffn)}


def _t5_weights(ff: Any) -> dict[str, torch.Tensor]:
    if hasattr(ff, "wi_0"):  # T5DenseGatedActDense: wo(act(wi_0 x) * wi_1 x): wi_0 is the gate
        return {**_linear("w_gate", ff.wi_0), **_linear("w_up", ff.wi_1), **_linear("w_down", ff.wo)}
    return {**_linear("w_in", ff.wi), **_linear("w_out", ff.wo)}


def _has(*paths: str) -> Callable[[str, Any], bool]:
    """is_ffn test: the module has every dotted attribute path (gone once swapped, so no double swap)."""

    def attr(m: object, dotted: str) -> object:
        for name in dotted.split("."):
            m = getattr(m, name, None)
        return m

    return lambda path, m: all(attr(m, p) is not None for p in paths)


# a family's install: (model, path, ffn) -> {path: module it replaced}
Install = Callable[[nn.Module, str, nn.Module], dict[str, nn.Module]]


@dataclass(frozen=True)
class Family:
    """One supported architecture family: how to find its FFNs, read them, and replace them."""

    model_types: tuple[str, ...]  # config.model_type values that belong here
    looks_like: str  # what one FFN is, for error messages
    # NOTE: a unit is the architecture's own module (GPT2MLP, BertLayer, ...), read by attribute
    # name (unit.c_fc, unit.intermediate.dense), so it is typed Any rather than nn.Module
    is_ffn: Callable[[str, Any], bool]  # (path, module) -> is this module one FFN unit
    weights: Callable[[Any], dict[str, torch.Tensor]]  # unit -> its tensors under ffnlab's names
    install: Install = _replace  # puts the ffnlab FFN at the unit's path
    hidden_dropout: Callable[[Any], float] = lambda unit: 0.0  # dropout after the activation
    # task -> config overrides (tokens: fine-tuning only, load_pretrained)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    # LLaMA, Mistral, Qwen2, Gemma: down_proj(act(gate_proj x) * up_proj x), no dropout
    "llama": Family(
        ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"),
        "mlp with gate_proj/up_proj/down_proj",
        _has("gate_proj", "up_proj", "down_proj"),
        lambda m: {**_linear("w_gate", m.gate_proj), **_linear("w_up", m.up_proj), **_linear("w_down", m.down_proj)},
        tasks={"lm": {}, "cls": {}, "tokens": {}},
    ),
    # GPT-2: transformer.h[i].mlp = dropout(c_proj(act(c_fc x))) with Conv1D weights
    "gpt2": Family(
        ("gpt2",),
        "mlp with Conv1D c_fc/c_proj",
        _has("c_fc", "c_proj"),
        lambda m: {**_linear("w_in", m.c_fc, transpose=True), **_linear("w_out", m.c_proj, transpose=True)},
        install=_install_gpt2,
        tasks={"lm": {}, "cls": {}, "tokens": {}},
    ),
    # BERT, RoBERTa: encoder.layer[i].intermediate.dense and .output.dense
    "bert": Family(
        ("bert", "roberta"),
        "layer with intermediate.dense/output.dense",
        _has("intermediate.dense", "output.dense"),
        lambda m: {**_linear("w_in", m.intermediate.dense), **_linear("w_out", m.output.dense)},
        install=_install_bert,
        tasks={"lm": {"is_decoder": True}, "cls": {}, "tokens": {}},
    ),  # causal mask for the LM
    # T5: block[i].layer[-1].DenseReluDense in encoder and decoder, gated or not, dropout on hidden
    # units. Encoder-decoder, so build_hf_model has no task for it (its classifier needs EOS tokens).
    "t5": Family(
        ("t5", "mt5"),
        "layer[-1].DenseReluDense with wi/wo",
        lambda path, m: path.endswith("DenseReluDense") and hasattr(m, "wo"),
        _t5_weights,
        hidden_dropout=lambda m: m.dropout.p,
    ),
}


def _supported() -> str:
    return "; ".join(f"{name} ({', '.join(f.model_types)})" for name, f in FAMILIES.items())


def model_family(model: nn.Module | dict[str, Any] | PretrainedConfig) -> tuple[str, Family]:
    """(name, Family) of a Hugging Face model (or config) by its model_type; UnsupportedModelError else."""
    config = getattr(model, "config", model)
    model_type = _get(config, "model_type")
    for name, family in FAMILIES.items():
        if model_type in family.model_types:
            return name, family
    if not model_type:
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a Hugging Face model (no config.model_type); supported: {_supported()}"
        )
    types = [t for f in FAMILIES.values() for t in f.model_types]
    raise UnsupportedModelError(
        f"unsupported architecture '{model_type}'{closest(model_type, types)}; supported: {_supported()}"
    )


# ---- swapping ---------------------------------------------------------------------------------


def swap_width(spec: FFNSpec, own: FFNSpec, d_model: int, d_ff: int, bias: bool, match: Match = "params") -> int:
    """Hidden width of `spec` that matches the model's own FFN (`own`, width d_ff) in parameters or
    FLOPs per token; match="none" keeps d_ff.

    d_ff stays where it already matches exactly (a swap to the same kind); any other width comes from
    `ffnlab.core.ffn.hidden_dim_for_target`, the rounding `matched_hidden_dim` uses: the coarsest
    multiple of 64, 32, 16, 8, 2, 1 within 1% of the target (even widths for mix).
    """
    if match not in MATCHES:
        raise ValueError(f"unknown match '{match}'; valid: {', '.join(MATCHES)}")
    if match == "none":
        return d_ff
    if match == "params":
        target, mine = (spec_param_count(s, d_model, d_ff, bias) for s in (own, spec))
    else:
        target, mine = (ffn_flops_per_token(s, d_model, d_ff, bias) for s in (own, spec))
    if mine == target:
        return d_ff
    return hidden_dim_for_target(spec, d_model, target, match, bias)


def _make_ffn(
    spec: FFNSpec, acts: tuple[str, ...], d_model: int, d_ff: int, bias: bool, p_hidden: float, exact: bool = False
) -> FFN:
    """ffnlab FFN of `spec`'s kind running `acts`, each followed by dropout p_hidden if non-zero.

    NOTE: in a gated FFN the dropout falls on act(gate) before the product; the mask scales the
    product's unit either way, so it drops the same units as T5's dropout after the product.
    `exact` keeps GatedFFN on its eager ops, the ones Hugging Face runs: the fused path computes
    bf16/fp16 in fp32, which would change the numbers of a model whose weights carried over.
    """

    def act(name: str) -> nn.Module:
        a = get_activation(name)
        return nn.Sequential(a, nn.Dropout(p_hidden)) if p_hidden else a

    ffn: FFN
    if spec.kind == "gated":
        ffn = GatedFFN(d_model, d_ff, act(acts[0]), bias, fused=False if exact else None)
    elif spec.kind == "mix":
        ffn = MixFFN(d_model, d_ff, tuple(act(a) for a in acts), bias)
    elif spec.kind == "switch":  # dropout after the mixture: the gate reads the undropped pre-activation
        mixture = InputMixture(acts, d_ff)
        ffn = DenseFFN(d_model, d_ff, nn.Sequential(mixture, nn.Dropout(p_hidden)) if p_hidden else mixture, bias)
    else:
        ffn = DenseFFN(d_model, d_ff, act(acts[0]), bias)
    ffn.spec, ffn.d_ff = spec, d_ff
    return ffn


def _of_kind(kind: str) -> list[str]:
    """The FFN variants of one kind (dense or gated), by name."""
    return [name for name, spec in FFNS.items() if spec.kind == kind]


def _own_name(kind: str, act: str) -> str:
    if kind == "dense":
        return act
    try:
        return _gated_name(act)
    except ValueError:
        return f"gated {act}"


def swap_ffn(
    model: PreTrainedModel, ffn: str, match: Match = "params", init: Init = DEFAULT_INIT, carry: bool = False
) -> dict[str, nn.Module]:
    """Replace every FFN of this Hugging Face model instance by the ffnlab variant `ffn`, in place.

    Returns {module path: module it replaced} (`restore_ffn` puts them back). Device and dtype stay.
    The new FFN keeps the original's bias convention and dropout placement, and its width matches
    the original's parameters (match="params"), FLOPs per token ("flops"), or width ("none").

    If `ffn` computes the model's own function (same kind, same activation up to a Hugging Face
    alias: 'gelu_tanh' for GPT-2's gelu_new), the weights carry over and the model's exact
    activation expression is kept, so logits are unchanged bit for bit. Otherwise the FFNs are
    freshly initialised (`init`, see ffnlab.core.ffn.init_ffn; global RNG) and a PretrainedWeightsWarning
    says the model needs (continued) training.

    `carry=True` is the activation-only swap of fine-tuning: `ffn` must be of the model's kind
    (dense or gated), keeps its width and takes over its weights; only the activation changes
    (recorded with match "none", the width kept). ValueError for a variant of the other kind.
    """
    family_name, family = model_family(model)
    units = [(path, m) for path, m in model.named_modules() if path and family.is_ffn(path, m)]
    if not units:
        raise UnsupportedModelError(
            f"{type(model).__name__} ({family_name} family) has no {family.looks_like} "
            "modules; was its FFN swapped already? (restore_ffn puts the originals back)"
        )
    spec = single_ffn_spec(ffn)
    if match not in MATCHES:
        raise ValueError(f"unknown match '{match}'; valid: {', '.join(MATCHES)}")
    check_init(init)
    own_act = model_activation(model.config)
    news, fresh = [], None
    for path, unit in units:  # build every new FFN first, so a failure leaves the model untouched
        state = family.weights(unit)
        kind: Literal["dense", "gated"] = "gated" if "w_gate.weight" in state else "dense"
        d_ff, d_model = state["w_up.weight" if kind == "gated" else "w_in.weight"].shape
        bias = any(k.endswith(".bias") for k in state)
        own = FFNSpec(_own_name(kind, own_act), kind, (own_act,), "", "")
        same = spec.kind == kind and canonical(spec.acts[0]) == canonical(own_act)
        if carry and spec.kind != kind:
            raise ValueError(
                f"'{spec.name}' is a {spec.kind} FFN but the model's are {kind}: a swap that keeps the "
                f"pretrained FFN weights changes the activation only; {kind} variants: {', '.join(_of_kind(kind))}"
            )
        width = d_ff if same or carry else swap_width(spec, own, d_model, d_ff, bias, match)
        new = _make_ffn(
            spec, own.acts if same else spec.acts, d_model, width, bias, family.hidden_dropout(unit), exact=same
        )
        if same or carry:  # copies; strict for the own function, else a learnable activation keeps its init
            new.load_state_dict(state, strict=same)
        else:
            init_ffn(new, init)
            fresh = own.name
        ref = next(iter(state.values()))
        news.append((path, new.to(device=ref.device, dtype=ref.dtype)))
    replaced = {}
    for path, new in news:
        for new_path, old in family.install(model, path, new).items():
            model.get_submodule(new_path).train(old.training)  # new modules start in train mode
            replaced[new_path] = old
    model.config.ffnlab_ffn = {
        "ffn": spec.name,
        "match": "none" if carry else match,
    }  # saved with the config: see load_swapped
    # ... and its digest saved with the weights, so an edited config.json cannot relabel them
    model.register_buffer(DIGEST_KEY, ffn_digest(model.config.ffnlab_ffn), persistent=True)
    if fresh:
        warnings.warn(
            f"{len(units)} FFNs swapped from {fresh} to {spec.name}: they are freshly initialised, so "
            "pretrained weights no longer fit and the model needs (continued) training",
            PretrainedWeightsWarning,
            stacklevel=2,
        )
    return replaced


def restore_ffn(model: nn.Module, replaced: dict[str, nn.Module]) -> None:
    """Put back the modules `swap_ffn` returned."""
    for path, module in replaced.items():
        model.set_submodule(path, module)
    if hasattr(model.config, "ffnlab_ffn"):
        del model.config.ffnlab_ffn
    if DIGEST_KEY in model._buffers:
        del model._buffers[DIGEST_KEY]


DIGEST_KEY = "ffnlab_ffn_digest"


def ffn_digest(description: dict[str, Any]) -> torch.Tensor:
    """sha256 of an FFN description ({"ffn", "match"}) as 32 uint8s: a buffer, so it is saved in the
    safetensors weights beside the FFNs it describes."""
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).digest()
    return torch.tensor(list(digest), dtype=torch.uint8)


def _tied_to(model: nn.Module, key: str, loaded: set[int]) -> bool:
    try:
        return model.get_parameter(key).data_ptr() in loaded
    except AttributeError:  # a buffer, or no such parameter
        return False


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers without its progress bars and warnings (load and save report nothing we need)."""
    from transformers.utils import logging as hf_logging

    # transformers leaves these two unannotated
    disable_bars: Callable[[], None] = hf_logging.disable_progress_bar
    enable_bars: Callable[[], None] = hf_logging.enable_progress_bar
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity(logging.ERROR)
    disable_bars()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            enable_bars()


def import_models() -> None:
    """Import transformers' model code quietly: transformers.modeling_utils imports torchao where it is installed
    (its quantisers), which logs that its CUDA extensions do not load on a CPU build and that it registers enums
    the old way, once per process: in every run of a sweep. Call before a model class is touched."""
    with quiet_libraries():
        import transformers.modeling_utils  # noqa: F401


# transformers reads a folder only from disk and never runs code the folder brings (an auto_map's
# Python files): without these it would ask on a terminal whether to run that code, and look a
# name that is not a folder up on the Hugging Face Hub
class LocalOnly(TypedDict):
    """from_pretrained's keywords for a folder on disk (a TypedDict, so a type checker matches each to its parameter)."""

    local_files_only: bool
    trust_remote_code: bool


LOCAL_ONLY = LocalOnly(local_files_only=True, trust_remote_code=False)


def folder_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The config.json of a local save_pretrained folder as a dict, checked before transformers reads
    the folder. ValueError, one line, when `folder` is not a folder (a Hub name such as 'gpt2' is
    never downloaded), has no config.json that parses, has a file transformers would open that is no
    regular file (`check_folder_files`), or asks to run code of its own (auto_map)."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(
            f"{folder} does not exist or is not a folder; give a local save_pretrained folder "
            "(nothing is downloaded from the Hugging Face Hub)"
        )
    if not os.path.lexists(path / "config.json"):
        raise ValueError(f"{folder} has no config.json: not a save_pretrained folder")
    config = load_hf_config(path / "config.json")
    check_folder_files(path)
    if "auto_map" in config:
        raise ValueError(
            f"{folder}/config.json asks to run Python code that comes with the model (auto_map); remote "
            "code is refused: ffnlab loads only the architectures transformers ships"
        )
    return config


def check_folder_files(path: Path) -> None:
    """ValueError, one line, for a JSON or safetensors file of a save_pretrained folder (config.json,
    generation_config.json, tokenizer.json, the weights), which ffnlab or transformers opens, that is no
    regular file (a FIFO would block, a device never end) or larger than such a file is (the weights, mapped
    into memory, have no limit)."""
    for file in sorted(path.glob("*.json")):
        tokenizer = file.name == "tokenizer.json"
        check_readable(
            file, "the tokenizer" if tokenizer else "the JSON file", TOKENIZER_LIMIT if tokenizer else JSON_LIMIT
        )
    for file in sorted(path.glob("*.safetensors")):
        check_readable(file, "the weights file")


def local_config(folder: str | os.PathLike[str], **overrides: Any) -> PretrainedConfig:
    """The PretrainedConfig of a local save_pretrained folder (`folder_config`) of a supported family,
    with `overrides`; ValueError, one line, for a config that transformers refuses."""
    from transformers import AutoConfig

    model_family(folder_config(folder))  # UnsupportedModelError (a ValueError) names the supported ones
    try:
        config: PretrainedConfig = AutoConfig.from_pretrained(os.fspath(folder), **LOCAL_ONLY, **overrides)
        return config
    except Exception as e:  # transformers' validators raise their own types, over several lines
        raise ValueError(f"{folder}/config.json is not a valid config: {' '.join(str(e).split())[:300]}") from None


def save_unswapped(model: PreTrainedModel, folder: str | os.PathLike[str]) -> None:
    """Save a swapped model as a plain Hugging Face folder (`from_pretrained` loads it): its config
    names the swapped activation and its FFN weights sit in the architecture's own modules.

    Possible where the ffnlab FFN is of the architecture's kind (dense or gated) and width and its
    activation has a Hugging Face name: swiglu or reglu in LLaMA, gelu_new or relu in GPT-2; else ValueError.
    Written whole or not at all (`atomic_folder`): a failure (a full disk) leaves `folder` as it was.
    """
    family_name, family = model_family(model)
    info = getattr(model.config, "ffnlab_ffn", None)
    if not isinstance(info, dict):
        raise ValueError("the model's FFN was not swapped by swap_ffn; save it with save_pretrained")
    config = copy.deepcopy(model.config)
    del config.ffnlab_ffn
    if config.pad_token_id == -1:
        # NOTE: build_hf_model's stand-in for a classifier without a pad token, set after construction;
        # saved, transformers warned of it at every load and made the last token's embedding a
        # padding row that fine-tuning never updates. load_pretrained sets it again.
        config.pad_token_id = None
    key = next(k for k in HF_KEYS if _get(config, k))
    setattr(config, key, ffnlab_to_hf(info["ffn"], key))
    with torch.random.fork_rng(devices=[]):
        plain = type(model)(config)
    units = [m for path, m in plain.named_modules() if path and family.is_ffn(path, m)]
    ffns = ffn_modules(model)
    with torch.no_grad():
        for unit, ffn in zip(units, ffns):
            targets, source = family.weights(unit), ffn.state_dict()
            if set(targets) != set(source) or any(t.shape != source[n].shape for n, t in targets.items()):
                raise ValueError(
                    f"a {spec_of(ffn).kind} {spec_of(ffn).name} FFN of width {ffn.d_ff} does not fit {family_name}'s own "
                    "FFN modules; train a variant of the architecture's kind with --match none to save this folder"
                )
            for name, target in targets.items():
                target.copy_(source[name])  # a view for GPT-2's transposed Conv1D: writes the parameter
        state = {k: v for k, v in model.state_dict().items() if k != DIGEST_KEY}
        plain.load_state_dict({k: v for k, v in state.items() if k in plain.state_dict()}, strict=False)
    with quiet_transformers(), atomic_folder(folder) as tmp:  # a failed save leaves no half-written folder
        plain.save_pretrained(os.fspath(tmp), safe_serialization=True)


def load_swapped(folder: str | os.PathLike[str], model_class: type[PreTrainedModel] | None = None) -> nn.Module:
    """A model that `swap_ffn` changed and `save_pretrained` wrote to `folder`, loaded back (eval mode).

    The architecture comes from config.json (`model_class`, default its `architectures[0]`), the
    FFNs are swapped again as `ffnlab_ffn` says, then every weight is read from the folder's
    safetensors files (no pickle). Plain `from_pretrained` would build the original FFNs and drop
    the swapped weights. `folder` must be a local folder: nothing is downloaded and no code the
    folder brings is run (`folder_config`).
    """
    import transformers
    from safetensors.torch import load_file

    import_models()
    folder = os.fspath(folder)
    config = local_config(folder)
    info = getattr(config, "ffnlab_ffn", None)
    if not isinstance(info, dict) or "ffn" not in info:
        raise ValueError(
            f"{folder}/config.json has no 'ffnlab_ffn': it was not saved after swap_ffn; load it with from_pretrained"
        )
    if model_class is None:
        name = config.architectures[0] if config.architectures else None
        model_class = getattr(transformers, name, None) if isinstance(name, str) else None
        if not (isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel)):
            raise ValueError(
                f"{folder}/config.json names no transformers model class ({name!r} in "
                "'architectures'); pass model_class"
            )
    wants = getattr(model_class, "config_class", None)
    if (
        isinstance(wants, type) and issubclass(wants, transformers.PretrainedConfig) and not isinstance(config, wants)
    ):  # else an AttributeError deep in its __init__
        raise ValueError(
            f"{model_class.__name__} is a {wants.model_type} model but {folder}/config.json is a "
            f"{config.model_type} config; name a {config.model_type} class in 'architectures' or pass model_class"
        )
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{folder} has no .safetensors weights; save with save_pretrained(safe_serialization=True)")
    try:
        state = {k: v for f in files for k, v in load_file(os.path.join(folder, f)).items()}
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"cannot read the weights in {folder}: {type(e).__name__}: {e}") from None
    saved_digest = state.pop(DIGEST_KEY, None)
    if saved_digest is None:
        raise ValueError(
            f"the weights in {folder} carry no FFN digest ({DIGEST_KEY}): they were not saved by "
            "save_pretrained after swap_ffn"
        )
    if not torch.equal(saved_digest, ffn_digest({"ffn": info["ffn"], "match": info.get("match", "params")})):
        raise ValueError(
            f"{folder}/config.json's ffnlab_ffn ({info}) is not the FFN the weights were saved with; "
            "was config.json edited?"
        )
    try:
        model = model_class(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PretrainedWeightsWarning)  # every weight is loaded next
            swap_ffn(model, info["ffn"], info.get("match", "params"))
        if getattr(config, "ffnlab_attn_act", None):
            swap_attn_act(model, config.ffnlab_attn_act)
        missing, unexpected = model.load_state_dict(state, strict=False)
    except (RuntimeError, TypeError, IndexError) as e:  # sizes in config.json that the weights do not have
        raise ValueError(
            f"the weights in {folder} do not fit its config.json: {str(e).splitlines()[0][:300]}"
        ) from None
    missing = [k for k in missing if k != DIGEST_KEY]
    loaded = {p.data_ptr() for name, p in model.named_parameters(remove_duplicate=False) if name in state}
    untied = [k for k in missing if not _tied_to(model, k, loaded)]  # save_pretrained drops tied copies
    if unexpected or untied:
        raise ValueError(
            f"{folder} does not fit {model_class.__name__} with {info['ffn']} FFNs: "
            f"unexpected {sorted(unexpected)[:3]}, missing {sorted(untied)[:3]}"
        )
    return nn.Module.eval(model)  # what PreTrainedModel.eval does; transformers leaves that one unannotated


def ffn_modules(model: nn.Module) -> list[FFN]:
    """The ffnlab FFNs inside a model (those `swap_ffn` or `build_ffn` made), in module order."""
    return [m for m in model.modules() if isinstance(m, FFN) and m.spec is not None]


# ---- Q/K/V activations ------------------------------------------------------------------------

# family -> names of the q, k and v projection Linears inside one attention module; GPT-2 fuses
# all three into one Conv1D, c_attn, whose output is q|k|v
QKV_NAMES = {"llama": ("q_proj", "k_proj", "v_proj"), "bert": ("query", "key", "value"), "t5": ("q", "k", "v")}


class ProjectionAct(nn.Module):
    """A q, k or v projection followed by an activation: act(proj(x))."""

    def __init__(self, proj: nn.Linear, act: nn.Module) -> None:
        super().__init__()
        self.proj, self.act = proj, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.proj(x))
        return out


class FusedQKVAct(nn.Module):
    """GPT-2's fused c_attn (output q|k|v, split_size each) with an activation on each third."""

    def __init__(self, proj: Conv1D, acts: dict[str, str | None], split_size: int) -> None:
        super().__init__()
        self.proj, self.split_size = proj, split_size
        self.acts = nn.ModuleDict({key: get_activation(name) for key, name in acts.items() if name})

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, 3C)
        parts = dict(zip(PROJECTIONS, self.proj(x).split(self.split_size, dim=-1)))
        return torch.cat([self.acts[key](t) if key in self.acts else t for key, t in parts.items()], dim=-1)


def _qkv_wrappers(
    family_name: str, path: str, module: Any, acts: dict[str, Any]
) -> dict[str, ProjectionAct | FusedQKVAct]:
    """{path of a projection: its replacement} for one module (any of the model's, read by attribute
    name): empty unless it is an attention."""
    if family_name == "gpt2":
        if not isinstance(getattr(module, "c_attn", None), nn.Module) or isinstance(module.c_attn, FusedQKVAct):
            return {}
        if hasattr(module, "q_attn"):
            raise UnsupportedModelError(
                f"{path} is GPT-2 cross-attention: its c_attn holds only K and V (Q is q_attn); "
                "Q/K/V activations cover GPT-2 self-attention only"
            )
        return {f"{path}.c_attn": FusedQKVAct(module.c_attn, acts, module.split_size)}
    names = QKV_NAMES[family_name]
    if not all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
        return {}
    return {
        f"{path}.{name}": ProjectionAct(getattr(module, name), get_activation(acts[key]))
        for key, name in zip(PROJECTIONS, names)
        if acts[key]
    }


def swap_attn_act(model: PreTrainedModel, spec: str | None) -> dict[str, nn.Module]:
    """Put the activations of an attn_act spec ("gelu", "q=gelu,k=gelu,v=identity"; see
    ffnlab.core.model.parse_attn_act) on the q, k and v projections of every attention of this
    Hugging Face model instance, in place.

    Each projection Linear becomes act(Linear(x)) (`ProjectionAct`); GPT-2's fused c_attn has its
    output split into q, k, v thirds, each with its own activation (`FusedQKVAct`). Weights carry
    over. Returns {module path: module it replaced}; `model.set_submodule(path, old)` puts one back.
    The spec is recorded as config.ffnlab_attn_act, so `load_swapped` applies it again.
    UnsupportedModelError (a ValueError) for a family without it or a model without q/k/v projections.
    """
    acts = parse_attn_act(spec)
    family_name, _ = model_family(model)
    if not any(acts.values()):
        return {}
    news: dict[str, ProjectionAct | FusedQKVAct] = {}
    for path, module in model.named_modules():  # every wrapper first, so a failure leaves the model untouched
        news.update(_qkv_wrappers(family_name, path, module, acts))
    if not news:
        raise UnsupportedModelError(
            f"{type(model).__name__} ({family_name} family) has no attention with q/k/v projections "
            f"({'c_attn' if family_name == 'gpt2' else '/'.join(QKV_NAMES[family_name])}); were they wrapped already?"
        )
    replaced = {}
    for path, new in news.items():
        weight = new.proj.weight  # learnable activations join the projection's device, dtype and mode
        replaced.update(
            _replace(model, path, new.to(device=weight.device, dtype=weight.dtype).train(new.proj.training))
        )
    model.config.ffnlab_attn_act = spec
    return replaced


# ---- Hugging Face architectures behind ffnlab's interface ------------------------------------

HEAD_TASKS = ("cls", "reg")  # AutoModelForSequenceClassification's: n_classes outputs, or one number (reg)


def head_task(task: str) -> str:
    """The task whose Family.tasks overrides `task` builds with: reg's head is a sequence classifier's."""
    return "cls" if task == "reg" else task


def head_config(task: str, n_classes: int) -> dict[str, Any]:
    """The config fields of `task`'s head: num_labels for cls (and tokens, a class per token), one label and
    problem_type 'regression' for reg (transformers' MSE head), none for the LM."""
    if task == "reg":
        return {"num_labels": 1, "problem_type": "regression"}
    return {"num_labels": n_classes} if task in ("cls", "tokens") else {}


@dataclass
class HFModelConfig:
    """What build_hf_model built; serialised with `asdict` beside results."""

    model_type: str
    ffn: str
    match: str
    seed: int
    task: str
    context: int  # longest sequence the model takes (its position table)
    vocab_size: int
    d_model: int
    d_ff: int  # of the swapped FFN
    n_layers: int
    n_classes: int
    init: str
    hf_config: dict[str, Any]  # the full Hugging Face config, as built
    attn_act: str | None = None  # activations on q, k, v (swap_attn_act)
    pad_id: int | None = None  # examples padded with this id (a pretrained tokenizer's): masked from attention
    segment_sep_id: int | None = None  # with pad_id, for a model with token types: the id that ends a pair's first
    # text (BERT's [SEP]), from which `model_inputs` derives the token types the tokenizer gives


class HFModel(nn.Module):
    """A Hugging Face model with ffnlab's interface: forward(idx, targets) -> (logits, loss)."""

    def __init__(self, hf: PreTrainedModel, cfg: HFModelConfig):
        super().__init__()
        self.hf, self.cfg = hf, cfg

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, vocab) for the LM, (B, n_classes) or (B, 1) for reg, and the loss
        (cross-entropy; reg: the mean squared error against float targets (B,)); (B, T, n_classes) for tokens,
        whose targets IGNORE_INDEX count in no loss. With cfg.pad_id the padding is masked (`model_inputs`).

        LM targets are already shifted by the caller (targets[t] is the token after idx[t]), as for
        ffnlab.core.model.Transformer; no labels go to Hugging Face, which would shift them again.
        """
        if idx.shape[1] > self.cfg.context:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the model's context {self.cfg.context}")
        logits = self.hf(**model_inputs(idx, self.cfg.pad_id, self.cfg.segment_sep_id)).logits
        if targets is None:
            return logits, None
        if self.cfg.task == "reg":
            return logits, F.mse_loss(logits.squeeze(-1).float(), targets.float())
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def ffn_modules(self) -> list[FFN]:
        return ffn_modules(self.hf)


def model_inputs(idx: torch.Tensor, pad_id: int | None, segment_sep_id: int | None = None) -> dict[str, torch.Tensor]:
    """A Hugging Face model's inputs for ids (B, T): input_ids; with `pad_id`, the attention mask of what is no
    padding; with `segment_sep_id` too, the token types a pair template gives (BERT's [CLS] a [SEP] b [SEP]: 0 up to
    the first separator, 1 after it), 0 on the padding, as the tokenizer pads them.

    NOTE: padding is what equals pad_id; a tokenizer without a pad token pads with its end-of-text id (GPT-2, LLaMA),
    which their templates never put inside an example."""
    if pad_id is None:
        return {"input_ids": idx}
    mask = (idx != pad_id).long()  # (B, T)
    inputs = {"input_ids": idx, "attention_mask": mask}
    if segment_sep_id is not None:
        is_sep = (idx == segment_sep_id).long()
        inputs["token_type_ids"] = ((is_sep.cumsum(dim=1) - is_sep) > 0).long() * mask  # 1 past the first separator
    return inputs


# the keys transformers' get_text_config reads as the text part of a composite (multimodal, encoder-decoder) config
SUB_CONFIGS = ("text_config", "decoder", "generator", "text_encoder")


def load_hf_config(config_path_or_dict: str | os.PathLike[str] | dict[str, Any] | PretrainedConfig) -> dict[str, Any]:
    """A Hugging Face config as a dict: from a JSON file (a regular file, `ffnlab._util.reading`), a dict or a
    PretrainedConfig. ValueError naming the file if it cannot be read or parsed, has no model_type, or holds a
    composite model's text part where a supported family's model_type is a single model."""
    source = "Hugging Face config"
    if isinstance(config_path_or_dict, (str, os.PathLike)):
        source = f"Hugging Face config {config_path_or_dict}"
        text = read_text(config_path_or_dict, "the Hugging Face config", JSON_LIMIT)
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"cannot parse {source}: {e}") from None
        except RecursionError:  # arrays nested thousands deep
            raise ValueError(f"cannot parse {source}: arrays or objects nested too deeply") from None
    elif isinstance(config_path_or_dict, dict):
        config = copy.deepcopy(config_path_or_dict)
    elif hasattr(config_path_or_dict, "to_dict"):
        config = config_path_or_dict.to_dict()
    else:
        raise ValueError(f"expected a config path, dict or PretrainedConfig, got {type(config_path_or_dict).__name__}")
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ValueError(f"{source} has no model_type")
    single = any(config["model_type"] in family.model_types for family in FAMILIES.values())
    if single and (parts := [key for key in SUB_CONFIGS if config.get(key) is not None]):
        # transformers keeps it as a plain dict and fails deep inside (AttributeError: 'dict' ... 'to_dict')
        raise ValueError(
            f"{source} holds '{parts[0]}', the text part of a composite model's config, but model_type "
            f"'{config['model_type']}' is a single model; remove '{parts[0]}', or give the text model's own config"
        )
    for key in DEPTH_KEYS:  # before a model is built layer by layer: minutes for 10^5 layers, even on meta
        if isinstance(depth := config.get(key), int) and not isinstance(depth, bool):
            check_layer_count(depth, f"{key} in {source}")
    return config


DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")  # the families' layer counts


def _hf_config_for(
    config: dict[str, Any], family: Family, task: str, vocab_size: int | None, context: int | None, n_classes: int
) -> PretrainedConfig:
    """The PretrainedConfig to build: `config` without its provenance fields and any auto_map (the model
    is built from model_type, never from code a config points to), with the task's overrides, no KV
    cache, and vocab_size, context and n_classes where given."""
    from transformers import AutoConfig

    config = {
        k: v
        for k, v in config.items()
        if k not in ("transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path", "auto_map")
    }
    config.update(family.tasks[head_task(task)], use_cache=False)
    if vocab_size is not None:
        config["vocab_size"] = vocab_size
        # NOTE: special-token ids belong to the config's own tokenizer (GPT-2's bos and eos are 50256);
        # past ffnlab's vocabulary they name no token, and transformers warned of them at every build
        # and at every load of a folder saved from the model
        defaults = AutoConfig.for_model(config["model_type"]).to_dict()
        foreign = [
            key
            for key, value in {**defaults, **config}.items()
            if key.endswith("_token_id") and isinstance(value, int) and not 0 <= value < vocab_size
        ]
        config.update(dict.fromkeys(foreign))  # None: no such token
    config.update(head_config(task, n_classes))
    hf_config = AutoConfig.for_model(**config)
    if context is not None:
        hf_config.max_position_embeddings = context  # n_positions for GPT-2, through its attribute map
    return hf_config


def hf_shape(config: dict[str, Any], task: str, context: int) -> dict[str, int]:
    """The shape of the model build_hf_model builds from `config` for `task` at `context` (which replaces the
    config's own, as in training): n_layers, n_heads, d_model and context, read through transformers' names
    for them (GPT-2's n_layer, n_head, n_embd)."""
    built = _hf_config_for(load_hf_config(config), model_family(config)[1], task, None, context, 2)
    return {
        "n_layers": built.num_hidden_layers,
        "n_heads": built.num_attention_heads,
        "d_model": built.hidden_size,
        "context": built.max_position_embeddings,
    }


def _init_ffns_seeded(hf: nn.Module, init: Init, seed: int) -> None:
    """Initialise every ffnlab FFN in `hf` by `init`, each weight from its own generator (as
    ffnlab.core.model.init_weights does), so one seed gives the same FFN weights whatever else changes."""
    for path, module in hf.named_modules():
        if isinstance(getattr(module, "spec", None), FFNSpec):
            init_ffn(module, init, functools.partial(param_generator, seed, f"{path}."))
            if isinstance(module, GatedFFN):
                module.fused = None  # re-initialised: no pretrained numbers to keep, so the fused default


def build_hf_model(
    config_path_or_dict: str | os.PathLike[str] | dict[str, Any] | PretrainedConfig,
    ffn: str,
    match: Match = "params",
    seed: int = 0,
    vocab_size: int | None = None,
    context: int | None = None,
    task: str = "lm",
    n_classes: int = 2,
    init: Init = DEFAULT_INIT,
    attn_act: str | None = None,
) -> HFModel:
    """Randomly initialised Hugging Face model from a config, its FFNs swapped to `ffn`.

    task "lm" builds AutoModelForCausalLM (BERT as a causal decoder), "cls" builds
    AutoModelForSequenceClassification with n_classes labels, "reg" the same with one (problem_type
    'regression'). vocab_size and context override the
    config's. Seeding: the Hugging Face weights come from `seed` under a forked RNG (the global
    RNG is untouched), so every FFN variant gets the same embeddings and attention for one seed;
    every FFN, even one that is the model's own, is then initialised by ffnlab's rule (`init`) from
    per-weight generators, as ffnlab.core.model.init_weights does. attn_act puts activations on
    the q, k and v projections (`swap_attn_act`).
    """
    config = load_hf_config(config_path_or_dict)
    family_name, family = model_family(config)
    if task not in ("lm", *HEAD_TASKS):
        raise ValueError(f"unknown task '{task}'; valid: lm, {', '.join(HEAD_TASKS)}")
    if head_task(task) not in family.tasks:
        have = [n for n, f in FAMILIES.items() if task in f.tasks]
        raise UnsupportedModelError(
            f"build_hf_model has no task '{task}' for {config['model_type']}; "
            f"families with it: {', '.join(have)} (else build the model, then swap_ffn)"
        )
    single_ffn_spec(ffn)
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import_models()
    hf_config = _hf_config_for(config, family, task, vocab_size, context, n_classes)
    auto: AutoModelClass = AutoModelForCausalLM if task == "lm" else AutoModelForSequenceClassification
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        warnings.simplefilter("ignore", PretrainedWeightsWarning)  # nothing pretrained here
        hf = auto.from_config(hf_config)
        swap_ffn(hf, ffn, match, init)
        swap_attn_act(hf, attn_act)
    if task in HEAD_TASKS and hf_config.pad_token_id is None:
        # NOTE: last-token classifiers (LLaMA, GPT-2) look for the last non-pad token and refuse
        # batches without a pad id; -1 never occurs, so they take the last position. Set after
        # construction so no embedding row became a padding row.
        hf.config.pad_token_id = -1
    _init_ffns_seeded(hf, init, seed)
    ffns = ffn_modules(hf)
    cfg = HFModelConfig(
        model_type=hf_config.model_type,
        ffn=spec_of(ffns[0]).name,
        match=match,
        seed=seed,
        task=task,
        context=hf_config.max_position_embeddings,
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        d_ff=ffns[0].d_ff,
        n_layers=hf_config.num_hidden_layers,
        n_classes=n_classes,
        init=init,
        hf_config=hf_config.to_dict(),
        attn_act=attn_act,
    )
    return HFModel(hf, cfg)
