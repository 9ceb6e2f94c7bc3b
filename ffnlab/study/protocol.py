"""The validation protocol the literature recommends, built in: `ffnlab compare --protocol`.

    stage 1  fixed    every variant at the same settings: the plain comparison
    stage 2  tune     a learning-rate x warm-up grid; each variant takes the grid cell with its best
                      mean validation metric, and the variants are compared on the test split at
                      their own settings, so the selection cannot flatter the winner (Melis et al.
                      2018: with each model tuned, rankings change)
    stage 3  context  each variant at its tuned setting, at shorter and longer contexts: does the
                      ranking hold at other sequence lengths?

Every stage is an ordinary study in the same store: runs shared between stages are trained once
(stage 2's base cell is stage 1, stage 3's base context is stage 2's chosen cells), a rerun skips
finished runs, and a killed protocol resumes where it stopped. The stages' summaries are written to
`protocol.json` beside the store, which `ffnlab report` shows.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ffnlab._util.files import write_atomic
from ffnlab.study.execute import run_study
from ffnlab.study.plan import Study
from ffnlab.study.records import Summary
from ffnlab.study.summary import settings_of

PROTOCOL_JSON = "protocol.json"
STAGES = ("fixed", "tune", "context")
STAGE_TITLES = {
    "fixed": "1: every variant at the same settings",
    "tune": "2: each variant at its own lr and warm-up (chosen on validation), compared on test",
    "context": "3: each variant at its tuned setting, at other context lengths",
}


def protocol_grid(
    study: Study, lrs: list[float] | None = None, warmups: list[int] | None = None, contexts: list[int] | None = None
) -> dict[str, list[Any]]:
    """The values stages 2 and 3 try: by default lr x {1/2, 1, 2}, warm-up x {1, 4} (at least 1 step),
    context x {1/2, 1, 2} (at least 8 tokens), each including the base value; fine-tuning a folder's model
    (init_from), no default context longer than its positions, and ValueError for a given one."""
    b_lr, b_warm, b_ctx = study.base.lr, study.base.warmup_steps, study.base.model.context
    ctx = list(contexts or dict.fromkeys([max(8, b_ctx // 2), b_ctx, 2 * b_ctx]))
    if folder := study.base.init_from:
        from ffnlab.tools.pretrained import check_context_axis, folder_positions

        if contexts:
            check_context_axis(folder, ctx)  # the user's: each must fit
        else:
            ctx = [c for c in ctx if c <= folder_positions(folder)]
    return {
        "lr": list(lrs or [b_lr / 2, b_lr, b_lr * 2]),
        "warmup": list(warmups or dict.fromkeys([b_warm, max(1, 4 * b_warm)])),
        "context": ctx,
    }


def check_protocol_study(study: Study) -> None:
    """ValueError unless the study can run the protocol: no axes of its own (the protocol adds them)."""
    if study.axes:
        raise ValueError(
            f"--protocol runs its own lr, warm-up and context axes; drop the study's axes "
            f"({', '.join(study.axes)}) or run them as a separate comparison"
        )


@dataclass
class Protocol:
    """The protocol's outcome: its grid, each variant's chosen setting and the summary of each stage."""

    grid: dict[str, list[Any]]  # axis -> the values stages 2 and 3 try (`protocol_grid`)
    choice: dict[str, dict[str, Any]]  # variant -> {"lr", "warmup_steps"} chosen in stage 2
    stages: list[tuple[str, Summary]]  # (stage name, its summary), in STAGES order

    def to_json(self) -> dict[str, Any]:
        """protocol.json, and compare --protocol --json without each stage's summary spread out."""
        return {
            "grid": self.grid,
            "choice": self.choice,
            "stages": [{"name": name, "summary": s.to_json()} for name, s in self.stages],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Protocol:
        stages = [(st["name"], Summary.from_json(st["summary"])) for st in d["stages"]]
        return cls(d["grid"], d["choice"], stages)


def run_protocol(
    study: Study, store_path: str | os.PathLike[str], grid: dict[str, list[Any]] | None = None, **run: Any
) -> Protocol:
    """Run the three stages into one store. `run` goes to `run_study` (jobs, backend, quiet, ...). The
    result is also written to protocol.json beside the store (through a temporary file)."""
    check_protocol_study(study)
    grid = grid or protocol_grid(study)
    fixed = run_study(study, store_path, **run)
    tune = run_study(replace(study, axes={"lr": grid["lr"], "warmup": grid["warmup"]}), store_path, **run)
    (tuned,) = tune.tuned
    choice = {
        r.ffn: {"lr": r.tuned["lr"], "warmup_steps": r.tuned["warmup"]}
        for r in tuned.variants
        if r.tuned.get("lr") is not None
    }
    missing = [v for v in study.variants if v not in choice]
    if missing:
        raise ValueError(
            f"stage 2 left no finished run to choose a setting for {', '.join(missing)}; see the store's failed runs"
        )
    at_choice = replace(study, axes={"context": grid["context"]}, per_variant=choice)
    context = run_study(at_choice, store_path, **run)
    # its per-variant settings are the protocol's choice, not the user's (protocol.json tells later readers so)
    context.settings = settings_of(at_choice, chosen_by_protocol=True)
    result = Protocol(grid, choice, list(zip(STAGES, (fixed, tune, context))))
    write_atomic(protocol_path(store_path), json.dumps(result.to_json(), indent=1, allow_nan=True))
    return result


def protocol_path(store_path: str | os.PathLike[str]) -> Path:
    return Path(store_path).parent / PROTOCOL_JSON


def load_protocol(store_path: str | os.PathLike[str]) -> Protocol | None:
    """protocol.json beside the store, or None when the store has none (or it cannot be read)."""
    try:
        return Protocol.from_json(json.loads(protocol_path(store_path).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
