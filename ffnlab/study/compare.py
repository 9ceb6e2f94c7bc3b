"""`ffnlab compare` in one call: the study (or the validation protocol's three), then its CSV and its report,
each output checked before the first run starts. The command line prints what it returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ffnlab._util.files import check_output_folder, check_writable, write_atomic
from ffnlab.run.config import TrainConfig
from ffnlab.run.profile import StepProfile, profile_training
from ffnlab.study.execute import SWEEP_THREADS, run_study
from ffnlab.study.plan import Study, iter_plan
from ffnlab.study.protocol import Protocol, check_protocol_study, protocol_grid, run_protocol
from ffnlab.study.records import Summary
from ffnlab.study.report import ReportFiles, default_out_dir, profiles_path, write_report
from ffnlab.study.summary import summarize_study
from ffnlab.study.table import write_csv


@dataclass
class Comparison:
    """What `compare` produced: the summary the CSV holds, the protocol's stages where it ran, the report's files."""

    summary: Summary  # the study's; with the protocol, its tuned stage's
    protocol: Protocol | None = None
    report: ReportFiles | None = None  # what ffnlab.study.report.write_report wrote; None: not written
    profiles: dict[str, StepProfile] | None = None  # variant -> where its first run's step goes (--profile)

    @property
    def summaries(self) -> list[Summary]:
        return [s for _, s in self.protocol.stages] if self.protocol else [self.summary]

    def to_json(self) -> dict[str, Any]:
        """`compare --json`: the summary, or the protocol's grid, choice and stages, each its summary's JSON;
        with --profile, where each variant's step goes."""
        profiles = {"profiles": {v: p.to_json() for v, p in self.profiles.items()}} if self.profiles else {}
        if self.protocol is None:
            return self.summary.to_json() | profiles
        stages = [{"name": name, **summary.to_json()} for name, summary in self.protocol.stages]
        return {"grid": self.protocol.grid, "choice": self.protocol.choice, "stages": stages} | profiles


def compare(
    study: Study,
    store: str | Path,
    *,
    protocol: bool = False,
    csv: str | None = None,
    report: bool = True,
    extrapolate_to: float | None = None,
    ranked: Callable[[Comparison], None] | None = None,
    profile: bool = False,
    **run: Any,
) -> Comparison:
    """Run `study` into the run store `store` (`protocol`: the three stages of ffnlab.study.protocol, its grids
    from the study's lr, warmup and context axes), then write the table to `csv` and the report beside the store.
    `ranked` sees the result as soon as the ranking is known, before the report (seconds more); `extrapolate_to`
    reads each compute multiplier at that compute; `profile` first profiles the first run of each variant
    (`profile_variants`); `run` goes to `run_study` (jobs, backend, quiet, ...)."""
    grid = protocol_grid_of(study) if protocol else None  # checked before anything is written
    if csv:
        check_writable(csv)
    if report:
        check_output_folder(default_out_dir(store), "the report")
    profiles = profile_variants(study, store) if profile else None
    if grid is not None:
        stages = run_protocol(study, store, grid, **run)
        result = Comparison(stages.stages[1][1], stages)  # the tuned stage: each variant at its best setting
    elif extrapolate_to is None:
        result = Comparison(run_study(study, store, **run))
    else:
        run_study(study, store, **run)
        result = Comparison(summarize_study(study, store, extrapolate_to=extrapolate_to))
    result.profiles = profiles
    if csv:
        write_csv(result.summary, csv)
    if ranked:
        ranked(result)
    if report:  # the report of the study as given: with the protocol, that is its first stage (every variant at the
        # same settings), whose summary its stages hold
        shown = result.protocol.stages[0][1] if result.protocol else result.summary
        result.report = write_report(store, study=study, summary=shown)
    return result


def profile_variants(study: Study, store: str | Path) -> dict[str, StepProfile]:
    """Where a training step's time goes (`ffnlab.run.profile.profile_training`) for the first planned run of
    each variant, written to profiles.json beside the store, which the report's cost section shows."""
    first: dict[str, TrainConfig] = {}
    for cfg in iter_plan(study, seeds=1):  # not the whole plan: 10^5 runs took seconds to plan
        first.setdefault(cfg.model.ffn, cfg)
    # on the threads a sweep gives each run (ffnlab.study.execute.SWEEP_THREADS), unless the config names its own
    profiles = {v: profile_training(replace(cfg, threads=cfg.threads or SWEEP_THREADS)) for v, cfg in first.items()}
    write_atomic(profiles_path(store), json.dumps({v: p.to_json() for v, p in profiles.items()}, indent=1))
    return profiles


def protocol_grid_of(study: Study) -> dict[str, list[Any]]:
    """The protocol's grid: the study's lr, warmup and context axes where it has them (taken out of its axes),
    the protocol's defaults otherwise; ValueError if the study has other axes."""
    given = {axis: study.axes.pop(axis) for axis in ("lr", "warmup", "context") if axis in study.axes}
    check_protocol_study(study)
    return protocol_grid(study, given.get("lr"), given.get("warmup"), given.get("context"))


def unfinished(summary: Summary) -> tuple[int, int]:
    """(runs that did not finish, runs planned) of a summary."""
    missing = sum(len(seeds) for cell in summary.cells for seeds in cell.missing.values())
    return missing, sum(len(cell.variants) for cell in summary.cells) * summary.seeds
