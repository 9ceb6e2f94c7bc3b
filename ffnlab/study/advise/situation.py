"""What the user says about their use: the `Situation` every source of evidence weighs, one `ffnlab advise`
flag per field, and the sizes people write ('125M', '7B', '16GiB')."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ffnlab._util.text import sci, shorten
from ffnlab.study.advise.flow import (
    DEPLOY_HARDWARE,
    HARDWARE,
    HARDWARE_MEMORY,
    LONG_CONTEXT_SHARE,
    PRIORITIES,
    STAGES,
    SYMPTOMS,
    TASK_TYPES,
    Deploy,
    Hardware,
    Priority,
    Stage,
    Symptom,
    TaskType,
    check_choice,
    deploy_of,
    ffn_flop_share,
    model_shape,
    resolve_hardware,
)
from ffnlab.study.published import MODEL_FAMILIES

# ---- sizes as people write them ------------------------------------------------------------------

COUNT_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}
BYTE_SUFFIX = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
# NOTE: the most a size may be: a thousand times the largest published models (about 1e12 parameters)
# and a million TB. Beyond them a size is a typo, and '1e400' reads as inf ('A infB model')
MOST_PARAMS = 1e15
MOST_BYTES = 1e18
# likewise a hundred times the deepest published models (~100 layers) and the longest contexts (~10M tokens)
MOST_LAYERS = 10_000
MOST_TOKENS = 1_000_000_000


def parse_quantity(text: str, units: dict[str, float], what: str, example: str, most: float) -> float:
    """'1.5M' -> 1.5e6 with the given suffix table; ValueError naming the valid suffixes, or the
    range (0, most] when the value is outside it."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in units:
        valid = ", ".join(u for u in units if u)
        raise ValueError(
            f"cannot read {what} '{shorten(text)}'; give a number with an optional suffix ({valid}), e.g. {example}"
        )
    value = float(match.group(1)) * units[match.group(2).lower()]
    if not 0 < value <= most:
        raise ValueError(f"{what} must be positive and at most {sci(most)}, got '{shorten(text)}'")
    return value


def parse_params(text: str) -> int:
    """A parameter budget: '125M', '7B', '1.5e6'."""
    return int(parse_quantity(text, COUNT_SUFFIX, "parameter budget", "125M", MOST_PARAMS))


def parse_bytes(text: str) -> int:
    """A memory budget: '16GB' (powers of 1000), '2GiB' or '2G' (powers of 1024), plain bytes."""
    return int(parse_quantity(text, BYTE_SUFFIX, "memory budget", "16GiB", MOST_BYTES))


def parse_model_size(text: str) -> float:
    """The parameters of a planned model: '125M', '1B', '7B'."""
    return parse_quantity(text, COUNT_SUFFIX, "model size", "1B", MOST_PARAMS)


def size_from(value: float | str | None, parse: Callable[[str], float]) -> float | None:
    """A size given as a number, or as text that `parse` reads."""
    return parse(value) if isinstance(value, str) else value


def written_as(parse: Callable[[str], float]) -> Any:
    """A size field (None by default) whose flag takes the text `parse` reads: '7B', '16GiB'."""
    return field(default=None, metadata={"parse": parse})


# ---- the situation ----------------------------------------------------------------------------------

# the fields `advise --json` prints under "situation", in the order it has always had (the fields, and so the
# flags, follow the flow); the checkpoint is left out, the evidence names it
JSON_FIELDS = ("params_budget", "memory_budget", "latency_sensitive", "deploy", "depth", "stage", "hardware",
               "seq_len", "model_size", "priority", "task_type", "symptom")  # fmt: skip


@dataclass(frozen=True)
class Situation:
    """What the user says about their use, which every source of evidence weighs (ffnlab.study.advise.flow lists
    the inputs and their branches). Each field is a flag of `ffnlab advise`, its help the comment beside it
    (ffnlab.flags.add_config_flags); `resolved` fills in what follows from the rest."""

    stage: Stage | None = field(default=None, metadata={"flag": "--situation"})  # pretrain: from scratch;
    # finetune: full fine-tuning; peft: parameter-efficient fine-tuning; inference: deployment only
    # (default: finetune with --pretrained, else pretrain)
    pretrained: str | None = None  # the checkpoint (finetune, peft, inference): path to its config.json, or
    # a name such as bert-base-uncased, gpt2, t5-base, mistral
    hardware: Hardware | None = None  # where the model trains or runs; a gpu-NNgb tier is also a memory budget,
    # and its VRAM tier (less than 16, 16 to 32, more than 32 GB) a rule while --model-size is not given
    deploy: Deploy | None = None  # older form of --hardware: cpu, gpu, edge (= mobile)
    seq_len: int | None = None  # tokens per sequence (long context: see rules)
    model_size: float | None = written_as(parse_model_size)  # parameters of the planned model, e.g. 125M, 1B, 7B
    params_budget: float | None = written_as(parse_params)  # most parameters the model may have, e.g. 125M
    memory_budget: float | None = written_as(parse_bytes)  # most training memory, e.g. 16GiB or 500MB
    latency_sensitive: bool = False  # prefer the faster of statistically tied variants
    depth: int | None = None  # number of layers you plan (tiers: fewer than 6, 6 to 12, more than 12)
    priority: Priority | None = None  # what matters most besides quality: research (evidence; cost breaks no
    # ties), industrial (seed 002: GELU by default, compared with GEGLU on several tasks), maintenance
    # (long-term: GELU, the most widely supported)
    task_type: TaskType | None = None  # nlp or cv: what seed 000's two tables are of (their cells are not quoted
    # here, so it changes the suggested command, not the pick)
    symptom: Symptom | None = None  # troubleshooting instead of a pick, from seed 002's list: nan (NaN loss), slow
    # (slower training), mismatch (outputs that differ between frameworks); checks in order, each with its command

    def __post_init__(self) -> None:
        check_choice(self.stage, STAGES, "situation")
        check_choice(self.priority, PRIORITIES, "priority")
        check_choice(self.task_type, TASK_TYPES, "task type")
        check_choice(self.symptom, SYMPTOMS, "symptom")
        if self.stage not in (None, "pretrain") and not self.pretrained:
            known = ", ".join(sorted({f.example for f in MODEL_FAMILIES})[:4])
            raise ValueError(
                f"--situation {self.stage} starts from a checkpoint: give --pretrained (its config.json or a "
                f"name such as {known})"
            )
        if self.stage == "pretrain" and self.pretrained:
            raise ValueError(
                "--pretrained names a checkpoint to start from; --situation pretrain trains from scratch: give one "
                "of them"
            )
        resolve_hardware(self.hardware, self.deploy)  # both names known, and not contradicting each other
        for flag, value, most in (("--seq-len", self.seq_len, MOST_TOKENS), ("--depth", self.depth, MOST_LAYERS)):
            if value is not None and not 0 < value <= most:
                raise ValueError(f"{flag} must be between 1 and {most:,}, got {value:,}")

    def resolved(self) -> Situation:
        """The situation with what follows from it filled in: the stage (finetune from a checkpoint, else
        pretrain), the hardware from --deploy and --deploy from the hardware, and a GPU tier's memory as the
        memory budget where it is the smaller."""
        resolved = resolve_hardware(self.hardware, self.deploy)
        # the names resolve_hardware and deploy_of give, as the choices the fields hold
        hardware = next((tier for tier in HARDWARE if tier == resolved), None)
        deploy = next((name for name in DEPLOY_HARDWARE if name == deploy_of(hardware)), None)
        tier_memory = HARDWARE_MEMORY.get(hardware) if hardware else None
        budgets = [m for m in (self.memory_budget, tier_memory) if m]
        return replace(
            self,
            stage=self.stage or ("finetune" if self.pretrained else "pretrain"),
            hardware=hardware,
            deploy=deploy,
            memory_budget=min(budgets, default=None),
        )

    def to_json(self) -> dict[str, Any]:
        """The situation as `advise --json` prints it (JSON_FIELDS)."""
        return {name: getattr(self, name) for name in JSON_FIELDS}

    @property
    def first_attempt(self) -> bool:
        """Training from scratch with nothing else stated: seed 002's first attempt."""
        stated = [f.name for f in fields(self) if f.name != "stage" and getattr(self, f.name)]
        return self.stage in (None, "pretrain") and not stated

    @property
    def d_model(self) -> int:
        """The width the FLOP shares are computed at: of the published shape nearest the model size,
        else T5-base's 768 (the published comparison's)."""
        return model_shape(self.model_size).d_model if self.model_size else 768

    @property
    def long_context(self) -> bool:
        """The context dominates a layer's FLOPs (the FFN's share is below LONG_CONTEXT_SHARE)."""
        return self.seq_len is not None and ffn_flop_share(self.d_model, self.seq_len) < LONG_CONTEXT_SHARE

    @property
    def cost_sensitive(self) -> bool:
        """Speed decides between tied variants: latency matters or the model runs on a CPU or at the edge,
        unless the priority is research (quality and evidence first)."""
        return (self.latency_sensitive or self.deploy in ("cpu", "edge")) and self.priority != "research"

    @property
    def vram(self) -> float | None:
        """The GPU's memory in GiB, which the VRAM tiers read: the memory budget on a GPU; None elsewhere."""
        return self.memory_budget / 2**30 if self.deploy == "gpu" and self.memory_budget else None


def unused_inputs(situation: Situation) -> list[str]:
    """A reason naming the inputs a checkpoint's situation does not weigh, if any were given."""
    given = {
        "the model size": situation.model_size,
        "the sequence length": situation.seq_len,
        "the parameter budget": situation.params_budget,
        "the memory budget": situation.memory_budget,
        "the depth": situation.depth,
        "the priority": situation.priority,
        "the task type": situation.task_type,
    }
    named = [flag for flag, value in given.items() if value]
    if situation.stage == "pretrain" or not named:
        return []
    return [
        f"{', '.join(named).capitalize()} did not change this: the checkpoint fixes the activation ({situation.stage})."
    ]
