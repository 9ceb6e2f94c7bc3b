"""A local `save_pretrained` folder as the start of a fine-tuning run, its FFN activation optionally swapped.

    check_folder(folder)              the folder's config as a dict; one-line ValueError if it cannot be used
    folder_digest(folder)             sha256 of config.json and the safetensors weights: part of a run's identity
    pretrained_ffn(folder)            the ffnlab FFN variant the folder's model runs (the "keep" variant)
    pretrained_context(folder)        the context it trains at by default: the model's own positions
    load_pretrained(folder, ffn, ...) the model with its weights (safetensors only), behind ffnlab's interface

Supported: the llama (LLaMA, Mistral, Qwen2, Qwen3, Gemma), gpt2 and bert (BERT, RoBERTa) families of
`ffnlab.tools.hf.FAMILIES`, for the LM, classification (one text or a pair) and token classification tasks, each with
the model's own head (`auto_class`; T5, encoder-decoder, is not).
A swap changes the activation only (`swap_ffn(carry=True)`): gelu -> silu in a dense FFN, swiglu ->
geglu in a gated one. Every weight carries over (attention, embeddings, norms and the FFN matrices);
nothing is newly initialised but a classification head the folder does not have. A swap to the other
kind (dense -> gated) would need new FFN weights and is refused.
The tokenizer is the folder's own (`tokenizer="pretrained"`, what `--from` picks when the folder has one;
ffnlab.data.checkpoint_tokenizer), whose ids the model's embedding must hold and whose padded examples the model
masks (`example_padding`), or one of ffnlab's, whose vocabulary must have the model's size (a folder that ffnlab
pretrained with `--save-pretrained` on the same data and tokenizer fits).
"""

from __future__ import annotations

import copy
import hashlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ffnlab._util.machine import check_memory
from ffnlab._util.text import first_line
from ffnlab.core.ffn import spec_of
from ffnlab.core.memory import build_on_meta, check_layer_count
from ffnlab.core.model import layered_param_count, param_count
from ffnlab.data.checkpoint_tokenizer import tokenizer_files
from ffnlab.tools.hf import (
    FAMILIES,
    HEAD_TASKS,
    LOCAL_ONLY,
    AutoModelClass,
    HFModel,
    HFModelConfig,
    PretrainedWeightsWarning,
    config_activation,
    ffn_modules,
    folder_config,
    head_config,
    head_task,
    import_models,
    local_config,
    model_family,
    quiet_transformers,
    swap_ffn,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from ffnlab.data.checkpoint_tokenizer import CheckpointTokenizer

TASK_FAMILIES = tuple(name for name, family in FAMILIES.items() if family.tasks)  # what fine-tuning supports


def check_folder(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The config.json of a save_pretrained folder as a dict. ValueError, one line, when the folder is
    missing, has no config.json or readable safetensors weights, asks to run code of its own, was
    saved after swap_ffn, or its family is not supported for fine-tuning."""
    path = Path(folder)
    config = folder_config(path)
    family_name, _ = model_family(config)  # UnsupportedModelError (a ValueError) names the supported ones
    if family_name not in TASK_FAMILIES:
        raise ValueError(
            f"fine-tuning does not support the {family_name} family ('{config['model_type']}'); "
            f"supported families: {', '.join(TASK_FAMILIES)}"
        )
    if "ffnlab_ffn" in config:
        raise ValueError(f"{folder} was saved after swap_ffn; fine-tune from the folder of the unswapped model")
    if not weight_files(path):
        raise ValueError(f"{folder} has no .safetensors weights; save with save_pretrained(safe_serialization=True)")
    for file in weight_files(path):  # a damaged file fails here, in one line, not inside from_pretrained
        check_weights(file)
    return config


def check_weights(file: Path) -> None:
    """ValueError when `file` is not a whole safetensors file (damaged header, truncated) or cannot be
    read (a link to a device); reads the header only."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, "pt"):
            pass
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file} is not a readable safetensors file ({e}); save the folder again") from None


def check_float_weights(folder: str | os.PathLike[str], model: nn.Module) -> None:
    """ValueError naming a tensor in the folder's weights that loads into a parameter of `model` but is
    not floating point: from_pretrained would cast int64 weights to float and train them. Reads the
    safetensors headers only; integer buffers (position ids) pass."""
    from safetensors import safe_open

    params = {name for name, _ in model.named_parameters()}
    bad: dict[str, str] = {}
    for file in weight_files(Path(folder)):
        with safe_open(file, "pt") as f:
            dtypes = {key: f.get_slice(key).get_dtype() for key in params.intersection(f.keys())}
        # safetensors' dtype names: F64, F32, F16, BF16, F8_E4M3, ... are floating point; I64, U8, BOOL are not
        bad |= {key: dtype for key, dtype in dtypes.items() if not dtype.startswith(("F", "BF"))}
    if bad:
        key, dtype = min(bad.items())
        raise ValueError(
            f"{key} in {folder} is {dtype}, not floating point ({len(bad)} such tensors); fine-tuning trains "
            "floating-point weights: save them as float32, float16 or bfloat16"
        )


def weight_files(path: Path) -> list[Path]:
    """The folder's safetensors files, sorted."""
    return sorted(path.glob("*.safetensors"))


def folder_digest(folder: str | os.PathLike[str]) -> str:
    """sha256 (16 hex digits) of config.json, the tokenizer's files (tokenizer.json, vocabulary files,
    tokenizer_config.json: `tokenizer_files`) and every safetensors file: a folder whose weights, config or tokenizer
    changed is a different start, so a different run."""
    path = Path(folder)
    check_folder(path)
    digest = hashlib.sha256()
    tokenizer = [file for file in tokenizer_files(path) if file.is_file()]  # no FIFO: a run refuses it when it reads
    for file in [path / "config.json", *tokenizer, *weight_files(path)]:
        digest.update(file.name.encode())
        try:
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:  # a link to a file that cannot be read (no permission, an I/O error)
            raise ValueError(f"cannot read {file} ({first_line(e)})") from None
    return digest.hexdigest()[:16]


def pretrained_ffn(folder: str | os.PathLike[str]) -> str:
    """The ffnlab FFN variant the folder's model runs: 'swiglu' for LLaMA, 'gelu_new' for GPT-2."""
    return config_activation(check_folder(folder)).variant()


def pretrained_context(folder: str | os.PathLike[str], context: int | None = None) -> int:
    """The context a fine-tune of the folder's model trains at: `context`, or None for the model's own
    positions (max_position_embeddings; n_positions for GPT-2, read through transformers' config as
    `fitting_config` reads it). ValueError, one line, when `context` exceeds them."""
    positions = folder_positions(folder)
    check_context(folder, context, positions)
    return positions if context is None else context


def folder_positions(folder: str | os.PathLike[str]) -> int:
    """How many positions the folder's model has: max_position_embeddings (n_positions for GPT-2)."""
    return int(local_config(folder).max_position_embeddings)


def check_context_axis(folder: str | os.PathLike[str], contexts: list[int]) -> None:
    """ValueError, one line, for a context axis value longer than the positions of the model in `folder`."""
    positions = folder_positions(folder)
    if too_long := [c for c in contexts if c > positions]:
        raise ValueError(
            f"context axis value{'s' if len(too_long) > 1 else ''} {', '.join(map(str, too_long))} exceed"
            f"{'' if len(too_long) > 1 else 's'} the {positions} positions of the model in {folder}; valid: 1 to "
            f"{positions}"
        )


def check_context(folder: str | os.PathLike[str], context: int | None, positions: int) -> None:
    """ValueError when `context` is longer than the `positions` of the model in `folder`."""
    if context is not None and context > positions:
        raise ValueError(
            f"--context {context} exceeds the {positions} positions of the model in {folder}; valid: 1 to "
            f"{positions} (the default is {positions}, the model's own)"
        )


def fitting_config(
    folder: str | os.PathLike[str], task: str, vocab_size: int | None, context: int | None, own_tokenizer: bool = False
) -> PretrainedConfig:
    """The folder's Hugging Face config for `task`; ValueError when the task, the tokenizer's vocabulary or
    the context does not fit the model. A tokenizer ffnlab built must have the model's vocabulary; the folder's own
    (`own_tokenizer`) may have fewer ids (an embedding padded to a multiple of 64), never more (`check_vocab`)."""
    _, family = model_family(check_folder(folder))
    if head_task(task) not in family.tasks:
        valid = [*family.tasks, *(["reg"] if "cls" in family.tasks else [])]
        raise ValueError(f"unknown task '{task}'; valid: {', '.join(valid)}")
    hf_config = local_config(folder, use_cache=False, **family.tasks[head_task(task)])
    check_vocab(folder, vocab_size, hf_config.vocab_size, own_tokenizer)
    check_context(folder, context, hf_config.max_position_embeddings)
    return hf_config


def check_vocab(folder: str | os.PathLike[str], vocab_size: int | None, model_vocab: int, own_tokenizer: bool) -> None:
    """ValueError, one line, when the tokenizer's `vocab_size` does not fit the model's `model_vocab` embedding rows:
    a tokenizer ffnlab built from the corpus must have as many; the folder's own may have fewer, not more."""
    if vocab_size is None or vocab_size == model_vocab or (own_tokenizer and vocab_size < model_vocab):
        return
    if own_tokenizer:
        raise ValueError(
            f"the tokenizer of {folder} has ids up to {vocab_size - 1} (its added tokens included), past the "
            f"{model_vocab} rows of the model's embedding; resize the embedding to the tokenizer "
            "(model.resize_token_embeddings(len(tokenizer))) and save the folder again"
        )
    raise ValueError(
        f"the model in {folder} has a vocabulary of {model_vocab} tokens, the tokenizer gives "
        f"{vocab_size}; fine-tune with the data and --tokenizer it was pretrained with"
    )


def check_loaded(folder: str | os.PathLike[str], task: str, base_prefix: str, info: dict[str, Any]) -> None:
    """ValueError naming a weight from_pretrained found missing or of another size: it initialises such a
    weight at random and only logs it, but a fine-tune must start from the folder's weights, all but a new
    classification head (outside the base model `base_prefix`)."""
    new = {k: None for k in info["missing_keys"]} | {k: (list(a), list(b)) for k, a, b in info["mismatched_keys"]}
    inside = {k for k in new if k.startswith(f"{base_prefix}.") and ".pooler." not in k}
    new = {k: v for k, v in sorted(new.items()) if task == "lm" or k in inside}
    if new:
        key, sizes = next(iter(new.items()))
        raise ValueError(
            f"the weights in {folder} do not fit its config.json: "
            + (f"{key} is {sizes[0]} there, {sizes[1]} in the model" if sizes else f"{key} is missing")
            + f" ({len(new)} such tensors); save the folder again"
        )


def check_depth(
    folder: str | os.PathLike[str], hf_config: PretrainedConfig, build: Callable[[PretrainedConfig], nn.Module]
) -> None:
    """ValueError, before the model's layers are built one by one (minutes for 100,000 of them, even on the
    meta device), for a num_hidden_layers past MAX_LAYERS or fp32 weights more than this machine holds, the
    weights counted by arithmetic (`layered_param_count`)."""
    depth, where = getattr(hf_config, "num_hidden_layers", None), f"{folder}/config.json"
    if not isinstance(depth, int):
        return
    check_layer_count(depth, f"num_hidden_layers in {where}")

    def shallow(n_layers: int) -> nn.Module:
        config = copy.deepcopy(hf_config)
        config.num_hidden_layers = n_layers
        return build(config)

    n_params = layered_param_count(shallow, depth, f"check the sizes in {where}")
    what = f"the fp32 weights of the model in {folder} ({n_params:,} parameters)"
    check_memory(4 * n_params, "cpu", what, "check the sizes in its config.json")


def load_pretrained(
    folder: str | os.PathLike[str],
    ffn: str,
    task: str = "lm",
    n_classes: int = 2,
    vocab_size: int | None = None,
    context: int | None = None,
    tokenizer: CheckpointTokenizer | None = None,
) -> HFModel:
    """The folder's model with its weights, its FFN activation swapped to `ffn` (weights carried over,
    see the module docstring), as an HFModel for training. `tokenizer`: the folder's own, whose examples the model
    reads padded (`example_padding`). ValueError when the vocabulary or context does not fit, a weight is missing,
    of another size or not floating point, the model would not fit in memory, or `ffn` is of the other kind than
    the model's FFN."""
    import_models()

    hf_config = fitting_config(folder, task, vocab_size, context, own_tokenizer=tokenizer is not None)
    context = context or hf_config.max_position_embeddings
    for key, value in head_config(task, n_classes).items():  # a classifier's labels, or reg's one number
        setattr(hf_config, key, value)
    auto = auto_class(task)
    check_depth(folder, hf_config, auto.from_config)
    skeleton = build_on_meta(lambda: auto.from_config(hf_config), f"check the sizes in {folder}/config.json")
    n_params = param_count(skeleton)  # from_pretrained loads the fp32 weights on the CPU first
    what = f"the fp32 weights of the model in {folder} ({n_params:,} parameters)"
    check_memory(4 * n_params, "cpu", what, "check the sizes in its config.json")
    check_float_weights(folder, skeleton)
    with quiet_transformers():  # the new classification head is named in the comparison's settings
        # NOTE: with output_loading_info=True from_pretrained returns (model, info); its annotation has the model only
        hf, info = cast(
            "tuple[PreTrainedModel, dict[str, Any]]",
            auto.from_pretrained(
                os.fspath(folder),
                config=hf_config,
                use_safetensors=True,
                **LOCAL_ONLY,
                dtype=torch.float32,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # checked below, by name
            ),
        )
    check_loaded(folder, task, hf.base_model_prefix, info)
    padding = example_padding(hf, task, tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainedWeightsWarning)
        swap_ffn(hf, ffn, match="none", carry=True)
    ffns = ffn_modules(hf)
    cfg = HFModelConfig(
        model_type=hf_config.model_type,
        ffn=spec_of(ffns[0]).name,
        match="none",
        seed=0,
        task=task,
        context=context,
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        d_ff=ffns[0].d_ff,
        n_layers=hf_config.num_hidden_layers,
        n_classes=n_classes,
        init="pretrained",
        hf_config=hf_config.to_dict(),
        **padding,
    )
    return HFModel(hf, cfg)


def auto_class(task: str) -> AutoModelClass:
    """The transformers Auto class of a task's model: the LM's, a sequence classifier (cls and reg, whose head is
    one number) or a token classifier (tokens): the model's own head, newly initialised where the folder has none."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

    return {"lm": AutoModelForCausalLM, "tokens": AutoModelForTokenClassification}.get(
        task, AutoModelForSequenceClassification
    )


def example_padding(hf: PreTrainedModel, task: str, tokenizer: CheckpointTokenizer | None) -> dict[str, Any]:
    """How the model reads a batch of examples (HFModelConfig's pad_id and segment_sep_id). With the folder's own
    tokenizer, for every task but the LM: padded with its pad id, which the model's config.pad_token_id names too
    (a last-token classifier, GPT-2's or LLaMA's, finds the last token that is no padding by it, as transformers'
    examples set it), and where the model has token types (BERT) its pair separator. Otherwise no padding: the LM's
    windows, and the examples of ffnlab's own tokenizers, cropped or repeated to the context (a classifier without a
    pad id gets build_hf_model's stand-in -1: its last position is its last token)."""
    if task == "lm" or tokenizer is None:
        if task in HEAD_TASKS and hf.config.pad_token_id is None:
            hf.config.pad_token_id = -1
        return {}
    hf.config.pad_token_id = tokenizer.pad_id  # after construction, so no embedding row became a padding row
    types = getattr(hf.config, "type_vocab_size", 0) > 1
    return {"pad_id": tokenizer.pad_id, "segment_sep_id": tokenizer.segment_sep_id if types else None}
