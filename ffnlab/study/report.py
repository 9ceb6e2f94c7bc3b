"""The comparison report: the data it shows, gathered from a run store, and the folder it is written to
(report.html, summary.md and figures/*.png; `ffnlab.study.render` renders them).

Everything comes from the run store. When no study is given, the store's most recent one is reported
(`ffnlab.study.load`). The page holds the ranking with confidence intervals, the settings, loss curves
with bands over seeds, costs, stability, the FFN gradient norms by depth (with the claim that GELU gives the
bottom layers larger updates tested on them), the activation functions, attention maps of each variant's
trained model (read from the weights the sweep saves beside the store) and, when present, the
profiles of a training step, the deployment trade-off (`ffnlab deploy --store`) and the numerics results.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from ffnlab._util.files import atomic_folder, check_output_folder, write_atomic
from ffnlab._util.jsonio import json_kind
from ffnlab._util.text import first_line
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.run.config import TrainConfig
from ffnlab.run.profile import StepProfile
from ffnlab.study import plots
from ffnlab.study.deployment import damaged, deployment_path, load_deployment
from ffnlab.study.execute import weights_path
from ffnlab.study.load import load_study
from ffnlab.study.metrics import mean_of
from ffnlab.study.plan import Study
from ffnlab.study.protocol import Protocol, load_protocol
from ffnlab.study.records import (
    AcrossCells,
    Aggregate,
    Cell,
    LayerGrads,
    RunRecord,
    RunStatus,
    StudyScaling,
    StudySettings,
    Summary,
)
from ffnlab.study.render import (
    FIGURES_DIR,
    REPORT_HTML,
    SUMMARY_MD,
    deploy_fastest,
    deploy_held_equal,
    deploy_machine,
    deploy_notes,
    deploy_table,
    pareto_points,
    render_figures,
    render_html,
    render_markdown,
)
from ffnlab.study.stats import mean_ci
from ffnlab.study.store import Store
from ffnlab.study.summary import study_grad_norms, study_records, summarize
from ffnlab.tools.deploy import DeployResult

NUMERICS_JSON = "numerics.json"  # beside the store, written by `ffnlab report --numerics`
PROFILES_JSON = "profiles.json"  # beside the store, written by `ffnlab compare --profile`


# ---- the data the report shows ------------------------------------------------------------------


X = TypeVar("X", int, float)  # what a band is drawn against: steps or seconds


@dataclass(frozen=True)
class Band(Generic[X]):
    """A metric over seeds at each x (`seed_band`): its mean and t-interval, as a figure draws it."""

    x: list[X]
    mean: list[float]
    low: list[float]
    high: list[float]
    n: int  # seeds


def seed_band(series: list[dict[X, float]], level: float = 0.95) -> Band[X]:
    """Mean and t-interval over seeds at each x where a seed has a finite value.

    series: one {x: value} per seed. Where only one seed has a value the band collapses to the mean."""
    band: Band[X] = Band([], [], [], [], len(series))
    for x in sorted({x for s in series for x in s}):
        values = [s[x] for s in series if x in s and math.isfinite(s[x])]
        if not values:
            continue
        m = mean_ci(values, level)
        if m.mean is None:  # NOTE: never, with values; says so to the type checker
            continue
        band.x.append(x)
        band.mean.append(m.mean)
        band.low.append(m.ci_low if m.ci_low is not None else m.mean)
        band.high.append(m.ci_high if m.ci_high is not None else m.mean)
    return band


def time_band(losses: list[dict[int, float]], times: list[dict[int, float]], level: float = 0.95) -> Band[float]:
    """Loss against wall-clock time: at each evaluation step, the seeds' mean time (x) and the
    mean and t-interval of their loss."""
    band = seed_band(losses, level)
    seconds = [statistics.mean(t[step] for t in times if step in t) for step in band.x]
    return Band(seconds, band.mean, band.low, band.high, band.n)


@dataclass(frozen=True)
class FixedInput:
    """The one validation example every variant's attention is drawn on (`fixed_input`)."""

    ids: torch.Tensor  # (T,) token ids, or for task image one normalised image (channels, H, W)
    what: str  # what it is, as the report's caption says it: 'the first 64 validation tokens'
    text: str | None  # its text; None for an image
    model: ModelConfig  # the model config the trained weights need (vocabulary and classes from the data)


def fixed_input(cfg: TrainConfig) -> FixedInput:
    """The first `context` tokens of the validation split (a classifier's or tagger's first example), or its first
    image, and the model config the trained weights need."""
    from ffnlab.data.batches import PaddedSplit, crop_or_repeat
    from ffnlab.data.images import ImageSet
    from ffnlab.data.load import load_data
    from ffnlab.run.train import data_args, data_model_config

    corpus, tokenizer, splits = load_data(*data_args(cfg))
    context, val = cfg.model.context, splits["val"]
    model = data_model_config(cfg, corpus, tokenizer)
    if isinstance(corpus, ImageSet):  # a ViT's positions are its patches, row by row after any class token
        assert isinstance(val, tuple)  # (images, labels)
        image, label = val[0][0], int(val[1][0])
        patch, grid = model.patch_size, corpus.image_size // model.patch_size
        what = (
            f"the first validation image (class '{corpus.classes[label]}', {corpus.image_size}x{corpus.image_size} "
            f"pixels): its {grid * grid} patches of {patch}x{patch} pixels row by row"
            + (f", after the class token ({grid * grid + 1} positions)" if model.pool == "cls" else "")
        )
        return FixedInput(image, what, None, model)
    # a language model's split is one token tensor, a classifier's its documents and labels; an example of a folder's
    # own tokenizer holds its special tokens and fits the context: taken as it is, not repeated
    if isinstance(val, PaddedSplit):
        ids = val[0][0][:context]
    else:
        ids = crop_or_repeat(val[0][0], context) if isinstance(val, tuple) else val[:context]
    return FixedInput(ids, f"the first {len(ids)} validation tokens", tokenizer.decode(ids.tolist()), model)


SPARSE_WEIGHT = 0.01  # an attention weight below this counts as sparse: under 1% of a query's attention


@dataclass(frozen=True)
class AttentionStats:
    """How concentrated a model's attention is at one layer (`attention_stats`)."""

    entropy: float  # nats, the mean over heads and queries
    uniform_entropy: float  # the same for even attention over the keys each query can see: the ceiling
    sparsity: float  # the share of the weights a query can place that are below SPARSE_WEIGHT


def attention_stats(probs: np.ndarray, causal: bool) -> AttentionStats:
    """Entropy and sparsity of attention probabilities (n_heads, T, T), each query's row summing to 1.

    entropy: the mean over heads and queries of -sum_j p_j log p_j, in nats (0 log 0 = 0): 0 when
    every query attends to a single key, log T when it spreads evenly over T keys.
    uniform_entropy: that mean for even attention over the keys each query can see (log T, or the
    mean of log(i + 1) over queries i for a causal LM), the ceiling to read the entropy against.
    sparsity: the fraction of the weights a query can place (keys j <= i for a causal LM, all T
    otherwise) that are below SPARSE_WEIGHT (0.01): 0 for even attention over up to 100 keys,
    near 1 when each query attends to a few keys only.
    """
    probs = np.asarray(probs, dtype=np.float64)
    T = probs.shape[-1]
    visible = np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)
    logs = np.log(np.where(probs > 0, probs, 1.0))  # 0 log 0 = 0
    return AttentionStats(
        entropy=float((-(probs * logs).sum(-1)).mean()),
        uniform_entropy=float(np.log(visible.sum(-1)).mean()),
        sparsity=float((probs < SPARSE_WEIGHT)[..., visible].mean()),
    )


@dataclass(frozen=True)
class AttentionMaps:
    """Each variant's attention at one layer of its trained model, on one fixed input (`attention_data`)."""

    layer: int
    maps: dict[str, np.ndarray]  # variant -> (n_heads, T, T) probabilities, rows are queries
    stats: dict[str, AttentionStats]  # variant -> entropy and sparsity of its map
    seeds: dict[str, int]  # variant -> the seed of the run drawn
    input: str  # what the input is, in words (FixedInput.what)
    text: str | None  # its text; None for an image


def attention_data(
    store_path: Path, runs: dict[str, list[tuple[TrainConfig, RunRecord]]], layer: int | None
) -> AttentionMaps | str:
    """Attention maps (n_heads, T, T) of each variant's lowest-seed finished model at one layer,
    on the same fixed input; a note saying why none are drawn when the weights or the data are not at hand."""
    if not any(rec.status is RunStatus.FINISHED for items in runs.values() for _, rec in items):
        return "no run finished (all diverged or failed): there is no trained model to draw"
    picks = {}
    for variant, items in runs.items():
        done = [
            (c, rec)
            for c, rec in items
            if rec.status is RunStatus.FINISHED and weights_path(store_path, rec.id).exists()
        ]
        if done:
            picks[variant] = min(done, key=lambda run: run[0].seed)
    hf = next((c.hf_config for c, _ in picks.values() if c.hf_config), None)
    if hf:
        return (
            "attention maps are drawn for ffnlab's own Transformer; this study trained a Hugging Face "
            f"architecture ({hf.get('model_type', 'unknown model_type')})"
        )
    if not picks:
        return (
            f"no saved weights under {Path(store_path).parent / 'weights'}: the runs were trained "
            "by an ffnlab that did not save them; run the study again into a new store"
        )
    return draw_attention(store_path, picks, layer)


def draw_attention(
    store_path: Path, picks: dict[str, tuple[TrainConfig, RunRecord]], layer: int | None
) -> AttentionMaps | str:
    """`attention_data` of the runs picked, one per variant."""
    from safetensors.torch import load_model

    cfg = next(iter(picks.values()))[0]
    n_layers = cfg.model.n_layers
    layer = n_layers - 1 if layer is None else layer
    if not 0 <= layer < n_layers:
        raise ValueError(
            f"attention layer {layer} is out of range; the models have {n_layers} layers (0-{n_layers - 1})"
        )
    try:
        shown = fixed_input(cfg)
    except Exception as e:  # the data may be gone or need a network; the rest of the report stands
        return f"attention maps skipped: cannot load the data '{cfg.data}' ({first_line(e)})"
    maps = {}
    for variant, (c, rec) in picks.items():
        model = Transformer(fixed_input(c).model, c.seed)  # the data is cached: this only sets the variant's FFN
        try:
            load_model(model, str(weights_path(store_path, rec.id)))
        except Exception as e:  # a damaged or foreign file: the rest of the report stands
            return f"attention maps skipped: cannot read {weights_path(store_path, rec.id)} ({first_line(e)})"
        model.eval()
        with torch.no_grad():
            maps[variant] = model.attention_maps(shown.ids[None], layer)[0].float().numpy()  # (n_heads, T, T)
    return AttentionMaps(
        layer=layer,
        maps=maps,
        stats={variant: attention_stats(m, cfg.model.task == "lm") for variant, m in maps.items()},
        seeds={v: c.seed for v, (c, _) in picks.items()},
        input=shown.what,
        text=shown.text,
    )


@dataclass(frozen=True)
class Trace:
    """One run's gradient norm per step, as `plots.traces_figure` draws it."""

    x: list[int]  # steps
    y: list[float]  # the global gradient norm before clipping
    spikes: list[tuple[int, float]]  # (step, norm) of each gradient spike
    diverged: int | None  # the step it went non-finite


# quantity -> its mean over seeds (None: no finite value), per FFN layer, per variant
Behaviour = dict[str, dict[str, dict[str, float | None]]]


@dataclass
class CellReport:
    """One cell of the report: its summary (the numbers every output shares) and the data of its figures."""

    cell: Cell
    curves: dict[str, Band[int]]  # variant -> validation loss over seeds against steps (`seed_band`)
    time_curves: dict[str, Band[float]]  # variant -> the same against wall-clock time (`time_band`)
    traces: dict[str, list[Trace]]  # variant -> one per seed
    behaviour: Behaviour  # variant -> per FFN layer, dead units and sparsity, mean over seeds
    attention: AttentionMaps | str | None  # `attention_data`'s maps or its note, None where not drawn

    @property
    def layer_grads(self) -> LayerGrads | str:
        """The cell's FFN gradient norms by depth and the claim tested on them, as its summary holds them
        (`ffnlab.study.summary.layer_grads`), or why there are none."""
        if self.cell.depth is None:
            return "the summary holds no FFN gradient norms by depth (it was made without the store's logged norms)"
        return self.cell.depth


def run_trace(store: Store, rid: str, grad_norm: dict[int, float]) -> Trace:
    """A stored run's gradient norm with its spikes and divergence (the run's events)."""
    events = store.events(rid)
    return Trace(
        x=list(grad_norm),
        y=list(grad_norm.values()),
        spikes=[(e["step"] + 1, e["value"]) for e in events if e["kind"] == "grad_spike"],
        diverged=next((e["step"] for e in events if e["kind"] == "nonfinite"), None),
    )


def cell_report(
    store: Store,
    study: Study,
    items: list[tuple[TrainConfig, RunRecord | None]],
    cell: Cell,
    store_path: Path,
    layer: int | None,
    attention: bool,
) -> CellReport:
    """One cell of the study for the report: its summary and, for the figures, curves, gradient traces and
    per-layer behaviour from the store."""
    by_variant: dict[str, list[tuple[TrainConfig, RunRecord]]] = {v: [] for v in study.variants}
    for cfg, rec in items:
        if rec is not None and rec.done and cfg.seed < study.seeds:
            by_variant[cfg.model.ffn].append((cfg, rec))
    curves: dict[str, Band[int]] = {}
    time_curves: dict[str, Band[float]] = {}
    traces: dict[str, list[Trace]] = {}
    behaviour: Behaviour = {}
    for v, runs in by_variant.items():
        losses: list[dict[int, float]] = []
        times: list[dict[int, float]] = []
        traces[v] = []
        layers: dict[str, list[dict[str, Any]]] = {}
        for _, rec in runs:
            series: dict[str, dict[int, float]] = {}
            for step, name, value in store.metrics(rec.id):
                series.setdefault(name, {})[step] = value
            traces[v].append(run_trace(store, rec.id, series.get("grad_norm", {})))
            if rec.status is not RunStatus.FINISHED or rec.result is None:
                continue
            losses.append(series.get("val_loss", {}))
            times.append(series.get("val_time", {}))
            for name, b in rec.result.monitors.behaviour.items():
                layers.setdefault(name, []).append(b)
        curves[v] = seed_band(losses)
        time_curves[v] = time_band(losses, times)
        behaviour[v] = {
            name: {k: mean_of([b.get(k) for b in bs]) for k in ("dead_frac", "zero_frac", "inactive_frac")}
            for name, bs in layers.items()
        }
    drawn = attention_data(store_path, by_variant, layer) if attention else None
    return CellReport(cell, curves, time_curves, traces, behaviour, drawn)


@dataclass(frozen=True)
class NumericsFile:
    """numerics.json beside the store, as `ffnlab numerics --json` writes it, or why it cannot be read."""

    contents_json: dict[str, Any] = field(default_factory=dict)  # the documented JSON (ffnlab.tools.numerics)
    error: str | None = None


def load_numerics(store_path: str | Path, variants: Iterable[str], run: bool) -> NumericsFile | None:
    """numerics.json beside the store (computed first when `run`), or None when there is none."""
    path = Path(store_path).parent / NUMERICS_JSON
    if run:
        from ffnlab.tools.numerics import run_numerics, to_json

        acts = list(dict.fromkeys(a for v in variants for a in get_ffn_spec(v).acts))
        text = to_json(run_numerics(names=acts, points=20_001, claims=False))
        write_atomic(path, text)
    if not path.exists():
        return None
    try:
        contents = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return NumericsFile(error=f"cannot read {path}: {e}")
    if not isinstance(contents, dict):
        return NumericsFile(error=f"cannot read {path}: it holds {json_kind(contents)}, not an object")
    return NumericsFile(contents)


def shown_deployment(store_path: str | Path) -> tuple[DeployResult | None, str | None]:
    """deploy.json beside the store (`ffnlab deploy --store`) as the report shows it, or why it cannot be shown:
    (None, None) where there is none; (None, the one line) where it is damaged (`load_deployment`), which the
    deployment section then says in place of its table: a damaged file costs the report that section, never the
    report, and is never passed over as if none were measured."""
    try:
        result = load_deployment(store_path)
    except ValueError as e:
        return None, str(e)
    if result is None:
        return None, None
    try:  # what the section shows, built here first so that what the checks let through fails here, not in the page
        deploy_table(result)
        deploy_notes(result)
        deploy_fastest(result)
        deploy_held_equal(result)
        deploy_machine(result)
        pareto_points(result.rows)
    except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError) as e:
        problem = f"the deployment file {deployment_path(store_path)} cannot be shown ({first_line(e, 120)})"
        return None, str(damaged(store_path, problem))
    return result, None


@dataclass
class ReportData:
    """Everything the report shows: the summary's cells with their figures' data, settings and environment."""

    store: str
    baseline: str
    variants: list[str]
    architecture: str | None  # a Hugging Face architecture's name, None for ffnlab's own Transformer
    settings: StudySettings  # ffnlab.study.summary.settings_of
    env: dict[str, Any]  # the machine of the most recently finished run
    cells: list[CellReport]
    tuned: list[Cell]
    across_cells: AcrossCells | None
    scaling: StudyScaling | None
    other_studies: int  # in the same store, not shown
    activations: dict[str, str]  # activation -> its label in the figure
    numerics: NumericsFile | None  # numerics.json beside the store
    profiles: dict[str, StepProfile] | None  # profiles.json beside the store: where each variant's step goes
    deployment: DeployResult | None  # deploy.json beside the store: inference cost against quality
    deployment_error: str | None  # why deploy.json, which is there, cannot be shown (it is damaged)
    protocol: Protocol | None  # protocol.json beside the store
    generated: str  # when, ISO 8601
    aggregate: list[Aggregate] = field(default_factory=list)  # with a data axis: the GLUE-style average

    @property
    def level(self) -> float:
        return self.cells[0].cell.level

    @property
    def alpha(self) -> float:
        return self.cells[0].cell.alpha


def report_data(
    store_path: str | Path,
    study: Study | None = None,
    runs: list[TrainConfig] | None = None,
    baseline: str | None = None,
    layer: int | None = None,
    numerics: bool = False,
    attention: bool = True,
    summary: Summary | None = None,
) -> ReportData:
    """Everything the report shows: the summary, settings, environment and per cell of the study its
    rows, curves, traces, behaviour and attention maps.

    `summary` is the study's summary where the caller holds it (`compare`'s); without it, it is computed here,
    once. The figures' data (curves, traces, behaviour, attention) is read from the store either way."""
    store_path = Path(store_path)
    others = 0
    if study is None:
        study, runs, others = load_study(store_path, baseline)
    records = study_records(study, store_path, runs)
    protocol = load_protocol(store_path)
    if summary is None:
        grad_norms = study_grad_norms(store_path, records, study.seeds)
        summary = summarize(study, records, store_path, protocol if study.per_variant else None, grad_norms=grad_norms)
    done = [rec for items in records.values() for _, rec in items if rec is not None and rec.done]
    if not done:
        raise ValueError(f"run store {store_path} holds no finished runs of this study; run `ffnlab compare` first")
    env = max(done, key=lambda r: r.finished_at or 0.0).env
    cells = {tuple(c.axes.items()): c for c in summary.cells}  # a cell's axes are its group key
    with Store(store_path, read_only=True) as store:
        out_cells = [
            cell_report(store, study, items, cells[key], store_path, layer, attention) for key, items in records.items()
        ]
    hf = study.base.hf_config
    deployment, deployment_error = shown_deployment(store_path)
    return ReportData(
        store=str(store_path),
        baseline=summary.baseline,
        variants=study.variants,
        architecture=f"Hugging Face {hf.get('model_type', '?')} (FFN swapped per variant)" if hf else None,
        settings=summary.settings,
        env=env,
        cells=out_cells,
        tuned=summary.tuned,
        across_cells=summary.across_cells,
        scaling=summary.scaling,
        other_studies=others,
        activations=plots.activation_labels(study.variants),
        numerics=load_numerics(store_path, study.variants, numerics),
        profiles=load_profiles(store_path),
        deployment=deployment,
        deployment_error=deployment_error,
        protocol=protocol,
        generated=datetime.datetime.now().isoformat(timespec="seconds"),
        aggregate=summary.aggregate,
    )


# ---- writing ------------------------------------------------------------------------------------


def profiles_path(store_path: str | Path) -> Path:
    return Path(store_path).parent / PROFILES_JSON


def load_profiles(store_path: str | Path) -> dict[str, StepProfile] | None:
    """profiles.json beside the store (`compare --profile`), or None when there is none or it cannot be read."""
    try:
        return {v: StepProfile.from_json(p) for v, p in json.loads(profiles_path(store_path).read_text()).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def default_out_dir(store_path: str | Path) -> Path:
    """The report folder beside the store: ffnlab-runs/ffnlab.db -> ffnlab-runs/report."""
    return Path(store_path).parent / "report"


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote."""

    html: Path  # report.html, the page
    markdown: Path  # summary.md
    figures: list[Path]  # figures/*.png
    unshown: list[str] = field(default_factory=list)  # files beside the store a section could not show, and why


def write_report(
    store_path: str | Path,
    out_dir: str | Path | None = None,
    study: Study | None = None,
    runs: list[TrainConfig] | None = None,
    baseline: str | None = None,
    layer: int | None = None,
    numerics: bool = False,
    summary: Summary | None = None,
) -> ReportFiles:
    """Render the report of a store and write report.html, summary.md and figures/*.png into
    `out_dir` (default: `report/` beside the store). Returns the written paths. `summary`: the study's summary
    where the caller already holds it (`compare`), so that it is not computed twice (`report_data`).

    Everything is rendered in memory first, then written whole to a temporary folder moved into place
    (`atomic_folder`), so a failure (a full disk) leaves neither a half-written report nor an empty
    folder, and a previous report stays as it was."""
    store_path = Path(store_path)
    if not store_path.is_file():
        raise ValueError(f"no run store at {store_path}; run `ffnlab compare` first or pass --store")
    out_dir = check_output_folder(out_dir or default_out_dir(store_path), "the report")
    data = report_data(store_path, study, runs, baseline, layer, numerics, summary=summary)
    figures = render_figures(data)
    page = render_html(data, figures)
    markdown = render_markdown(data, figures)
    with atomic_folder(out_dir) as tmp:
        (tmp / FIGURES_DIR).mkdir()
        for name, png in figures.items():
            (tmp / FIGURES_DIR / name).write_bytes(png)
        (tmp / SUMMARY_MD).write_text(markdown, encoding="utf-8")
        (tmp / REPORT_HTML).write_text(page, encoding="utf-8")
    unshown = [e for e in (data.deployment_error, data.numerics and data.numerics.error) if e]
    return ReportFiles(
        out_dir / REPORT_HTML, out_dir / SUMMARY_MD, [out_dir / FIGURES_DIR / n for n in figures], unshown
    )
