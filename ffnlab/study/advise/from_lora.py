"""Advice for parameter-efficient fine-tuning from a store of a LoRA study (`compare --from FOLDER --peft lora`):
keep against swap, measured with every pretrained weight frozen, the FFN's included. The measurement is said
first, the rule of thumb (keep the checkpoint's activation: from_checkpoint.py) after it, and where the two
disagree the advice says so and follows the measurement."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ffnlab.study.advise.advice import Advice
from ffnlab.study.advise.evidence import MeasuredCellsEvidence, MeasuredEvidence, PretrainedEvidence
from ffnlab.study.advise.from_store import advise_measured
from ffnlab.study.advise.situation import Situation


def lora_folder(store: str | Path | None) -> str | None:
    """The pretrained folder the store's latest study fine-tuned with LoRA; None for any other store, or none."""
    if store is None or not Path(store).is_file():
        return None
    from ffnlab.study.load import load_study

    study, _, _ = load_study(store)
    return study.base.init_from if study.base.peft else None


def measures(store: str | Path | None, pretrained: str) -> bool:
    """Whether the store's latest study fine-tuned the checkpoint `pretrained` (its folder or config.json) with LoRA."""
    folder, path = lora_folder(store), Path(pretrained)
    return folder is not None and (path.parent if path.suffix == ".json" else path).resolve() == Path(folder).resolve()


def lora_checkpoint(stage: str | None, pretrained: str | None, store: str | Path | None) -> str | None:
    """The checkpoint `advise --situation peft` advises on: the one given, else the folder of a LoRA study's store."""
    return pretrained or (lora_folder(store) if stage == "peft" else None)


def advise_lora(checkpoint: Advice, store: str | Path, situation: Situation) -> Advice:
    """A checkpoint's PEFT advice (`advise_pretrained`) with the LoRA study of that checkpoint in `store` (`measures`)
    measured first: its recommendation where the measurement separates the variants, the rule of thumb after it."""
    measured = advise_measured(store, situation)
    assert isinstance(measured.evidence, MeasuredEvidence | MeasuredCellsEvidence)
    assert isinstance(checkpoint.evidence, PretrainedEvidence)
    kept, folder = checkpoint.recommendation, lora_folder(store)
    head = (
        f"Measured under LoRA in {store}: fine-tuned from {folder} with every pretrained weight frozen, the FFN's "
        f"included, keeping its activation against swapping it."
    )
    verdict = (
        f"The measurement agrees with the rule of thumb below: keep {kept}."
        if measured.recommendation == kept
        else f"The measurement disagrees with the rule of thumb below (keep {kept}): said first, as measured."
    )
    return replace(
        measured,
        reasons=[head, *measured.reasons, verdict, *checkpoint.reasons],
        rules=checkpoint.rules + measured.rules,
        evidence=replace(measured.evidence, checkpoint=checkpoint.evidence),
    )
