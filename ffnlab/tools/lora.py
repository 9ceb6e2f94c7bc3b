"""LoRA fine-tuning of a pretrained folder through peft (Hu et al. 2021, arXiv:2106.09685): keep against swap with
the pretrained weights frozen, the FFN's included.

    default_targets(model_type)          peft's own default target modules for the architecture
    resolved_targets(folder, task, given) the targets a run adapts: the given ones checked, else the family's default
    with_lora(model, folder, lora)       the fine-tuning model (`load_pretrained`'s HFModel) with peft's LoRA applied
    save_adapter(model, folder, path)    the trained adapter as peft saves it, with what base it needs
    load_adapter(folder, adapter_dir)    that base rebuilt (the folder, ffnlab's FFN swap) and the adapter applied
    trained_text(config, trainable, ...) which parameters a run trained, in words

A LoRA run loads the folder's model as a full fine-tune does (`ffnlab.tools.pretrained.load_pretrained`: the FFN's
activation kept or swapped, its weights carried over), then wraps it with `peft.get_peft_model`: low-rank adapters
on the target modules (attention projections by default) and, for a classifier, the new classification head trained
whole (peft's `modules_to_save`). Everything else is frozen: the optimiser gets only what requires a gradient, and
the FFN's gradient monitors see no gradients. A target inside the FFN is refused: the comparison is of activations
under frozen pretrained FFN weights (the "LoRA: Swish or GELU?" question), and a swapped FFN has no module of the
folder's own names.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from ffnlab._util.files import atomic_folder
from ffnlab.core.ffn import FFN
from ffnlab.tools.hf import HFModel, import_models, model_family, quiet_transformers
from ffnlab.tools.quantize import quiet_libraries

if TYPE_CHECKING:
    from transformers import PreTrainedModel

HEADS = ("classifier", "score")  # a task head transformers adds under one of these names (peft's SEQ_CLS list)
TASK_TYPES = {"lm": "CAUSAL_LM", "tokens": "TOKEN_CLS"}  # peft's task type per ffnlab task; other tasks: SEQ_CLS
NOTE = "ffnlab_adapter.json"  # beside peft's files: the base an adapter needs


@dataclass(frozen=True)
class LoraSettings:
    """A run's LoRA: rank, scale (the update is scaled by alpha / r) and the module names it adapts."""

    r: int
    alpha: int
    targets: tuple[str, ...]


def require_peft() -> None:
    """ValueError in one line when peft is not installed."""
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ValueError("--peft lora needs the 'peft' package: pip install 'ffnlab[peft]'")


def default_targets(model_type: str) -> list[str]:
    """peft's default LoRA targets for a model type (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING):
    BERT and RoBERTa query,value; GPT-2 c_attn; LLaMA, Mistral, Qwen and Gemma q_proj,v_proj. ValueError for a
    type peft has none for."""
    require_peft()
    with quiet_libraries():
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if model_type not in DEFAULTS:
        raise ValueError(f"peft has no default LoRA targets for model type '{model_type}'; give --lora-targets")
    return list(DEFAULTS[model_type])


# ---- which modules LoRA may adapt --------------------------------------------------------------


class FFNPlace(nn.Module):
    """Where swap_ffn puts ffnlab's FFN, in a skeleton of the model: the module names LoRA targets are checked
    against before any weight is read."""


def skeleton(folder: str | os.PathLike[str], task: str) -> PreTrainedModel:
    """The folder's model for `task` on the meta device (no weights read), each FFN replaced by an `FFNPlace`
    where `swap_ffn` installs ffnlab's: the module names the fine-tuning model has."""
    from ffnlab.core.memory import build_on_meta
    from ffnlab.tools.pretrained import auto_class, fitting_config

    import_models()
    hf_config = fitting_config(folder, task, None, None)
    auto = auto_class(task)  # the task's model, as load_pretrained builds it
    model = build_on_meta(lambda: auto.from_config(hf_config), f"check the sizes in {folder}/config.json")
    _, family = model_family(model)
    for path in [path for path, m in model.named_modules() if path and family.is_ffn(path, m)]:
        family.install(model, path, FFNPlace())
    return model


def new_modules(model: nn.Module, folder: str | os.PathLike[str], task: str) -> list[str]:
    """The modules LoRA trains whole (peft's `modules_to_save`), those a fine-tune initialises anew: a classifier's
    head ('classifier', 'score'; trained whole as peft's SEQ_CLS does, also where the folder has one), and BERT's
    pooler where the folder's weights have none (a folder saved from a language model). Empty for an LM, whose
    head is the folder's."""
    if task == "lm":
        return []
    children = dict(model.named_children())
    names = [name for name in HEADS if name in children]
    pooler = any(path.endswith("pooler") for path, _ in model.named_modules())
    if pooler and not any(".pooler." in f".{key}" for key in weight_keys(folder)):
        names.append("pooler")
    return names


def weight_keys(folder: str | os.PathLike[str]) -> list[str]:
    """The tensor names in the folder's safetensors files (their headers only)."""
    from safetensors import safe_open

    from ffnlab.tools.pretrained import weight_files

    keys: list[str] = []
    for file in weight_files(Path(folder)):
        with safe_open(file, "pt") as f:
            keys += list(f.keys())
    return keys


def matches(path: str, target: str) -> bool:
    """Whether peft's LoRA adapts the module at `path` for a target name: the name itself or its last parts."""
    return path == target or path.endswith(f".{target}")


def check_targets(model: nn.Module, targets: list[str], new: list[str], where: str) -> None:
    """ValueError, one line naming the valid choices, for a target that matches no linear layer of `model`
    outside its FFNs and new heads (`new_modules`), or that matches one inside them."""
    from transformers.pytorch_utils import Conv1D

    modules = dict(model.named_modules())
    ffns = [path for path, m in modules.items() if isinstance(m, FFNPlace | FFN)]
    heads = [path for path in modules if any(matches(path, name) for name in new)]

    def inside(path: str, places: list[str]) -> bool:
        return any(path == p or path.startswith(f"{p}.") for p in places)

    frozen = [path for path in modules if inside(path, ffns)]  # the FFNs and every module in them
    kept = [path for path in modules if inside(path, heads)]
    valid = [path for path, m in modules.items() if isinstance(m, (nn.Linear, Conv1D)) and path not in frozen + kept]
    names = ", ".join(dict.fromkeys(short_name(path, frozen + kept) for path in valid))
    for target in targets:
        if any(matches(path, target) for path in frozen):
            raise ValueError(
                f"--lora-targets {target}: the FFN stays frozen under LoRA (keep against swap with its pretrained "
                f"weights); valid targets in {where}: {names}"
            )
        if any(matches(path, target) for path in kept):
            raise ValueError(f"--lora-targets {target}: the new head trains whole; valid targets in {where}: {names}")
        if not any(matches(path, target) for path in valid):
            raise ValueError(
                f"--lora-targets {target} matches no linear layer outside the FFN of the model in {where}; "
                f"valid: {names}"
            )


def short_name(path: str, refused: list[str]) -> str:
    """The fewest last parts of `path` that name no module of `refused`: 'attention.output.dense' in BERT, whose
    'output.dense' is the FFN."""
    parts = path.split(".")
    for n in range(1, len(parts)):
        name = ".".join(parts[-n:])
        if not any(matches(other, name) for other in refused):
            return name
    return path


def target_list(text: str | None) -> list[str]:
    """'query, value' -> ['query', 'value'] (empty for None)."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def resolved_targets(folder: str, task: str, given: str | None) -> str:
    """The LoRA targets a run of `folder` adapts, comma-separated: the `given` ones checked against the folder's
    model (`check_targets`, on a skeleton: no weights read), else peft's default for its family. Called where
    the folder's digest is taken (a planned study, a run's start), so a bad target fails before any run."""
    require_peft()
    model = skeleton(folder, task)
    targets = target_list(given) or default_targets(model.config.model_type)
    check_targets(model, targets, new_modules(model, folder, task), folder)
    return ",".join(targets)


# ---- the model, its adapter saved and loaded back -----------------------------------------------


def with_lora(model: HFModel, folder: str | os.PathLike[str], lora: LoraSettings) -> HFModel:
    """The fine-tuning model (`load_pretrained`'s, FFN kept or swapped) with peft's LoRA on `lora.targets` and the
    new modules trained whole (`new_modules`); every other parameter frozen. Its `hf` becomes the PeftModel.
    ValueError for a target `check_targets` refuses."""
    require_peft()
    from transformers.pytorch_utils import Conv1D

    with quiet_libraries():
        from peft import LoraConfig, get_peft_model

    task = model.cfg.task
    new = new_modules(model.hf, folder, task)
    check_targets(model.hf, list(lora.targets), new, os.fspath(folder))
    conv = any(
        isinstance(m, Conv1D) for path, m in model.hf.named_modules() if any(matches(path, t) for t in lora.targets)
    )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        target_modules=list(lora.targets),
        lora_dropout=0.0,
        bias="none",
        modules_to_save=new or None,
        fan_in_fan_out=conv,  # GPT-2's Conv1D stores its weight (in, out)
        task_type=TASK_TYPES.get(task, "SEQ_CLS"),
    )
    with quiet_transformers(), quiet_peft():
        # NOTE: a PeftModel passes what it lacks on to the model it wraps: HFModel keeps using it as that one
        model.hf = cast("PreTrainedModel", get_peft_model(model.hf, config))
    return model


def is_lora(model: nn.Module) -> bool:
    """Whether an HFModel carries peft's adapters (`with_lora`)."""
    return isinstance(model, HFModel) and hasattr(model.hf, "peft_config")


def save_adapter(
    model: HFModel, folder: str | os.PathLike[str], digest: str | None, path: str | os.PathLike[str]
) -> None:
    """The trained adapter (and new head) as peft's `save_pretrained` writes it (adapter_config.json,
    adapter_model.safetensors), with NOTE beside it: the base it needs, the folder with ffnlab's FFN swap, which
    `load_adapter` rebuilds. Written whole or not at all."""
    from ffnlab.tools.pretrained import pretrained_ffn

    cfg = model.cfg
    note = {
        "base": os.fspath(Path(folder).absolute()),
        "digest": digest,
        "ffn": cfg.ffn,
        "pretrained_ffn": pretrained_ffn(folder),  # the folder's own: 'ffn' differs where the run swapped it
        "task": cfg.task,
        "n_classes": cfg.n_classes,
        "vocab_size": cfg.vocab_size,
        "pad_id": cfg.pad_id,  # the run read padded examples of the folder's own tokenizer (its pad id), or none
        "load": "ffnlab.tools.lora.load_adapter(base, adapter_dir): the base folder with its FFN activation "
        "swapped to 'ffn' by ffnlab (weights kept), then peft.PeftModel.from_pretrained(base, adapter_dir)",
    }
    with quiet_transformers(), quiet_peft(), atomic_folder(path) as tmp:
        model.hf.save_pretrained(os.fspath(tmp), safe_serialization=True)
        (tmp / NOTE).write_text(json.dumps(note, indent=1) + "\n")
        with open(tmp / "README.md", "a") as card:  # peft's model card
            card.write(f"\n## Base model (ffnlab)\n\n{base_text(note)}\n")


def base_text(note: dict[str, Any]) -> str:
    """The base an adapter needs, in words, from its NOTE."""
    swap = (
        f"its FFN activation kept ({note['ffn']})"
        if note["ffn"] == note.get("pretrained_ffn")
        else f"its FFN activation swapped from {note.get('pretrained_ffn')} to {note['ffn']} by ffnlab (weights kept)"
    )
    return (
        f"This LoRA adapter was trained on the save_pretrained folder {note.get('base')} (digest {note.get('digest')}), "
        f"{swap}, for task {note['task']}. Load both with ffnlab.tools.lora.load_adapter(folder, adapter_dir); "
        "peft.PeftModel.from_pretrained(base, adapter_dir) needs that same base."
    )


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft without its notes on the layers it wraps and transformers' deprecation warnings it triggers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def read_note(adapter_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The NOTE `save_adapter` wrote; ValueError, one line, where there is none or it does not parse."""
    path = Path(adapter_dir) / NOTE
    try:
        note = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{adapter_dir} has no {NOTE}: not an adapter ffnlab saved; load it with peft.PeftModel.from_pretrained"
        ) from None
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(note, dict) or not {"ffn", "task", "n_classes"} <= set(note):
        raise ValueError(f"{path} does not say which base the adapter needs (ffn, task, n_classes); save it again")
    return note


def load_adapter(
    folder: str | os.PathLike[str], adapter_dir: str | os.PathLike[str], ffn: str | None = None
) -> HFModel:
    """The model a LoRA run trained, in eval mode: the pretrained `folder` loaded with its FFN activation swapped
    to the adapter's `ffn` (as the run did: `load_pretrained`, weights kept), then `peft.PeftModel.from_pretrained`
    with `adapter_dir` (save_adapter's). ValueError where the folder changed since the adapter was trained, or
    `ffn` is not the one it was trained with."""
    from ffnlab.data.checkpoint_tokenizer import read_checkpoint_tokenizer
    from ffnlab.tools.pretrained import folder_digest, load_pretrained

    require_peft()
    with quiet_libraries():
        from peft import PeftModel

    note = read_note(adapter_dir)
    if ffn is not None and ffn != note["ffn"]:
        raise ValueError(f"the adapter in {adapter_dir} was trained on {note['ffn']} FFNs, not {ffn}; leave ffn out")
    if note.get("digest") and (digest := folder_digest(folder)) != note["digest"]:
        raise ValueError(
            f"the adapter in {adapter_dir} was trained on a base with digest {note['digest']}; {folder} has {digest}"
        )
    own = note.get("pad_id") is not None  # the run read padded examples with the folder's own tokenizer: so does this
    tokenizer = read_checkpoint_tokenizer(os.fspath(folder)) if own else None
    model = load_pretrained(folder, note["ffn"], note["task"], note["n_classes"], tokenizer=tokenizer)
    with quiet_transformers(), quiet_peft():
        model.hf = cast(
            "PreTrainedModel", PeftModel.from_pretrained(model.hf, os.fspath(adapter_dir))
        )  # as in with_lora
    return model.eval()


# ---- what trained, in words ---------------------------------------------------------------------


def trained_text(config: dict[str, Any], trainable: int | None = None, params: int | None = None) -> str | None:
    """Which parameters a fine-tune (`config`, a TrainConfig's dict) trained, with their count where measured:
    'LoRA r=8 alpha=16 on query,value and the new classification head (1,090 parameters, 0.41% of 266,306);
    frozen: every pretrained weight, the FFN's included', or 'every parameter ...' for a full fine-tune. None for
    a model trained from scratch."""
    if not config.get("init_from"):
        return None
    count = ""
    if trainable is not None and params:  # LoRA's adapters and head
        count = f" ({trainable:,} parameters, {100 * trainable / params:.2g}% of {params:,})"
    if config.get("peft") != "lora":
        return f"every parameter{f' ({trainable:,})' if trainable is not None else ''}, the FFN's included"
    task = config.get("model", {}).get("task", "lm")
    head = {"lm": "", "reg": " and the new regression head"}.get(task, " and the new classification head")
    return (
        f"LoRA r={config.get('lora_r')} alpha={config.get('lora_alpha')} on {config.get('lora_targets') or '-'}"
        f"{head}{count}; frozen: every pretrained weight, the FFN's included"
    )
