"""Advice when starting from a pretrained model (fine-tuning, PEFT, inference): keep the activation it was
trained with, its weights assume it. The activation is read from a Hugging Face config.json, or from the
table of model families (study/model_families.csv), by the one reader of `ffnlab.tools.hf.config_activation`."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ffnlab._util.names import closest
from ffnlab._util.reading import JSON_LIMIT, read_text
from ffnlab._util.text import first_line, shorten
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.kernels.fused import FUSED_ACTS
from ffnlab.run.presets import DEFAULT_PRESET, preset_config
from ffnlab.study.advise.advice import Advice
from ffnlab.study.advise.evidence import PretrainedEvidence, RejectedAlternative
from ffnlab.study.advise.flow import Rule, apply_rule, rule_line
from ffnlab.study.advise.situation import Situation
from ffnlab.study.published import MODEL_FAMILIES
from ffnlab.tools.hf import ConfigActivation, config_activation


@dataclass(frozen=True)
class Checkpoint:
    """A pretrained model to start from: its FFN as its config states it, and where that was read."""

    model: str  # its name or id
    model_type: str
    field: str  # the config field that names the activation
    hf_act: str  # that field's value
    act: str  # the ffnlab activation with the same expression (the Hugging Face name where ffnlab has none)
    gated: bool  # the activation is a GLU's gate
    ffn: str | None  # the ffnlab variant computing the same FFN; None where ffnlab has none
    source: str  # where the facts come from: the config file, or the table of model families

    @classmethod
    def of(cls, found: ConfigActivation, model: str, model_type: str, source: str) -> Checkpoint:
        """A checkpoint whose config names the activation `found`."""
        try:
            ffn: str | None = found.variant()
        except ValueError:  # ffnlab lacks the activation, or a gated variant of it: the advice says so
            ffn = None
        return cls(model, model_type, found.field, found.value, found.act or found.hf_act, found.gated, ffn, source)


def read_config(path: Path) -> Checkpoint:
    """The checkpoint a Hugging Face config.json (or the folder holding it) describes; ValueError naming the
    file where it is no regular file (a FIFO, /dev/zero: `ffnlab._util.reading`) or not a JSON object."""
    file = path / "config.json" if path.is_dir() else path
    text = read_text(file, "the model config", JSON_LIMIT)
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"cannot read the model config {file}: {first_line(e)}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a Hugging Face config (expected a JSON object)")
    found = config_activation(config, where=str(file))
    model_type = str(config.get("model_type", "unknown"))
    name = config.get("_name_or_path") or (config.get("architectures") or [model_type])[0]
    return Checkpoint.of(found, str(name), model_type, f"{file} ({found.field}: {found.value!r})")


def lookup_family(name: str) -> Checkpoint:
    """The checkpoint of a known model id or family name, from ffnlab.study.published.MODEL_FAMILIES: the
    config field and value the family's config.json has, read as that config would be."""
    key = name.strip().lower()
    last = key.rsplit("/", 1)[-1]
    matches = [f for f in MODEL_FAMILIES if key == f.example.lower() or last.startswith(f.family)]
    if not matches:
        known = sorted({f.example for f in MODEL_FAMILIES})
        hint = closest(last, [f.family for f in MODEL_FAMILIES])
        raise ValueError(
            f"unknown pretrained model '{shorten(name)}'{hint}; give the path to its config.json, "
            f"or one of: {', '.join(known)}"
        )
    f = max(matches, key=lambda f: (key == f.example.lower(), len(f.family)))
    found = config_activation({"model_type": f.model_type, f.field: f.hf_act})
    source = (
        f"ffnlab's table of model families: {f.family} ({f.example}) sets {f.field}={f.hf_act!r} "
        "in its Hugging Face config.json"
    )
    return Checkpoint.of(found, name, f.model_type, source)


def resolve_pretrained(name_or_config: str) -> Checkpoint:
    """A pretrained model from a config.json path (or its folder) or a known name."""
    path = Path(name_or_config)
    if path.suffix == ".json" or os.path.lexists(path):  # a dangling link is refused by read_config, as such
        if not os.path.lexists(path):
            raise FileNotFoundError(f"no model config at {path}")
        return read_config(path)
    return lookup_family(name_or_config)


# what changing the activation would do, per situation that starts from a checkpoint
CHANGE_COSTS = {
    "finetune": "Fine-tuning with a different activation feeds those weights a function they were never trained "
    "with: the pre-trained behaviour is lost and must be relearned, which defeats the point of starting from it.",
    "peft": "Parameter-efficient fine-tuning keeps those weights frozen, so they could not even adapt to "
    "a different activation: the model would simply compute something else.",
    "inference": "For inference the checkpoint fixes it: any other activation computes a different function "
    "with the same weights.",
}
STAGE_RULES = {"finetune": "keep-pretrained", "peft": "peft-frozen", "inference": "inference-fixed"}


def advise_pretrained(pretrained: str, situation: Situation) -> Advice:
    """Keep the activation of the checkpoint `pretrained` (fine-tuning, PEFT) or run it fastest (inference)."""
    model, stage = resolve_pretrained(pretrained), situation.stage or "finetune"  # (the resolved stage)
    shape = "as the gate of a gated (GLU) FFN" if model.gated else "in a dense FFN"
    ffn = model.ffn or model.act
    reasons = [
        f"{model.model} (model_type {model.model_type}) was pre-trained with {model.act} {shape}; "
        f"its FFN weights were learned for that nonlinearity.",
        CHANGE_COSTS[stage],
        f"So keep {ffn}"
        + (f" (ffnlab name; Hugging Face calls it '{model.hf_act}')" if model.hf_act != ffn else "")
        + ".",
    ]
    if model.ffn is None:
        reasons.append(f"ffnlab has no entry for '{model.act}', so it cannot measure this model's FFN itself.")
    why_not = (
        "invalidates the pre-trained FFN weights; if you must, follow the fine-tuning rule and measure the swap "
        "(command below)"
        if stage == "finetune"
        else "invalidates the pre-trained FFN weights; compare activations only when training from scratch"
    )
    rules, how, command = [apply_rule(STAGE_RULES[stage], act=model.act)], None, None
    if stage == "inference":
        how, more = implementation(model, situation.hardware)
        rules += more
    if stage == "finetune":
        swap, command = swap_rule(model.act), swap_command(pretrained)
        rules.append(swap)
    return Advice(
        recommendation=ffn,
        basis="pretrained",
        reasons=reasons + [rule_line(r) for r in rules],
        evidence=PretrainedEvidence(model),
        alternatives=[RejectedAlternative("any other", why_not)],
        rules=rules,
        implementation=how,
        command=command,
    )


# NOTE: the fine-tuning rule's numbers (about 0.5x the learning rate, twice the warm-up) against the settings
# `compare --from` starts from
SWAP_LR, SWAP_WARMUP = 0.5, 2


def swap_rule(act: str) -> Rule:
    """The fine-tuning rule, with its numbers against the learning rate and warm-up `compare` starts from."""
    base = preset_config(DEFAULT_PRESET)
    return apply_rule(
        "finetune-swap",
        act=act,
        lr=base.lr,
        lr_half=SWAP_LR * base.lr,
        warmup=base.warmup_steps,
        warmup_long=SWAP_WARMUP * base.warmup_steps,
    )


def swap_command(pretrained: str) -> str:
    """The `compare --from` command that measures a swap made by the fine-tuning rule against keeping the
    checkpoint's activation: the swapped variant at its learning rate and warm-up (--opt)."""
    path = Path(pretrained)
    folder = shlex.quote(str(path if path.is_dir() else path.parent)) if path.exists() else "YOUR_FOLDER"
    base = preset_config(DEFAULT_PRESET)
    opt = f"YOUR_VARIANT:lr={SWAP_LR * base.lr:g},warmup_steps={SWAP_WARMUP * base.warmup_steps}"
    return f"ffnlab compare --from {folder} --variants YOUR_VARIANT --opt {opt} --seeds 3 --data YOUR_DATA"


def implementation(model: Checkpoint, hardware: str | None = None) -> tuple[str, list[Rule]]:
    """The fastest exact way to run a checkpoint's FFN on `hardware`, and the rules behind it."""
    act, ffn = model.act, model.ffn or model.act
    canon = ACTIVATIONS[act].same_as or act if act in ACTIVATIONS else act
    rules = []
    if canon in ("gelu", "gelu_tanh"):
        forms = ("exact (erf)", "tanh-approximation")
        form, other = forms if canon == "gelu" else forms[::-1]
        rules.append(apply_rule("inference-gelu-exact", act=act, form=form, other=other))
    if model.gated and canon in FUSED_ACTS:
        rules.append(apply_rule("inference-fused", ffn=ffn, act=act))
        how = f"fused act(gate) * up: ffnlab.core.kernels.fused.gated_act(gate, up, act='{canon}')"
    else:
        rules.append(apply_rule("inference-dense", ffn=ffn, act=canon))
        how = f"the framework's built-in {canon}, fused into the matmul by torch.compile"
    if hardware in ("cpu", "mobile"):
        rules.append(apply_rule("inference-export", hardware=hardware, ffn=ffn, act=act))
        how += f"; on {hardware}, ONNX Runtime (ffnlab export --ffn {ffn})"
    return how, rules
