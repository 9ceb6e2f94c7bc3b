"""A study's trained models deployed: what each variant costs at inference, and the quality each precision,
runtime and int8 scheme keeps, over the study's seeds (`deploy_store`).

The runs are a store's finished runs of one setting (they differ only by FFN, seed and `qat_from`), rebuilt
from their stored config (`TrainConfig.from_dict`) and saved weights (`ffnlab.study.execute.weights_path`):

- cost: `ffnlab.tools.deploy`'s rows, measured on each variant's first seed (the seeds share the shapes);
- quality: every seed's deployed model on the study's own fixed final batches (val and test, as `train`
  evaluates them at the end), in the runtime it deploys to (a compiled model computes what its eager one
  does, so compile rows repeat eager's numbers and say so); static int8 calibrates on batches of the
  training split. Deltas pair each seed with the same run in fp32 PyTorch eager (`paired_diff`);
- QAT: a run with `qat_from` is converted (torchao int8-dynamic of its weights, what its fake quantisation
  trained for) and paired by seed with the plain run of its variant: against that run's fp32 loss, and
  against the int8-dynamic PTQ of that run (`vs_ptq`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ffnlab._util.files import write_atomic
from ffnlab._util.jsonio import json_number, json_problem, strict_dumps
from ffnlab._util.machine import check_threads
from ffnlab._util.reading import check_readable, kind_problem, read_text
from ffnlab._util.text import first_line, shorten
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.core.model import ModelConfig, param_count
from ffnlab.data.batches import Batch, eval_set, get_batch, has_window
from ffnlab.data.load import load_data
from ffnlab.run.config import TrainConfig
from ffnlab.run.train import data_args, data_model_config, default_factory, evaluate
from ffnlab.study.execute import weights_path
from ffnlab.study.records import RunRecord
from ffnlab.study.stats import paired_diff
from ffnlab.study.store import Store
from ffnlab.tools import deploy as dp

CALIBRATION_SEED = 4321  # the training-split batches static int8 calibrates on: the same for every run


@dataclass
class TrainedRun:
    """One stored run rebuilt: its config, the model with its final weights, and the batches it is judged on."""

    record: RunRecord
    cfg: TrainConfig
    model_cfg: ModelConfig  # vocabulary and classes set from the data, as the run trained
    model: nn.Module  # fp32, eval mode, CPU
    batches: dict[str, list[Batch]]  # "val" and, where the split has a window, "test": the final evaluation batches
    calibration: list[torch.Tensor]  # inputs from the training split
    tags: list[str] = field(default_factory=list)  # task tokens: the tag names, for span F1

    @property
    def ffn(self) -> str:
        return self.cfg.model.ffn

    @property
    def seed(self) -> int:
        return self.cfg.seed


def load_weights(model: nn.Module, path: Path, what: str) -> None:
    """The safetensors file `path` loaded into `model`, every tensor and no other; ValueError in one line naming
    the file (`what` says whose it is) where it is no such file: damaged (a lying header, random bytes, empty), or
    holding a tensor too many, too few or of another shape."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    check_readable(path, what)  # a FIFO or a device is refused unopened
    try:
        load_model(model, str(path))  # strict: missing and unexpected tensors fail too
    except (SafetensorError, OSError, RuntimeError) as e:
        reason = " ".join(str(e).split())  # load_state_dict's message lists the tensors on lines of their own
        raise ValueError(f"{what} {path} cannot be loaded: {shorten(reason, 200)}; it is damaged or another "
                         "model's: train the run again into a new store") from None  # fmt: skip


def load_trained(store_path: str | Path, record: RunRecord) -> TrainedRun:
    """A finished run of a store as a model with its saved weights, and its data's final batches; ValueError
    naming the store and the run when its weights were not saved, and the file where they cannot be loaded."""
    cfg = TrainConfig.from_dict(record.config)
    path = weights_path(Path(store_path), record.id)
    if not os.path.lexists(path):
        raise ValueError(
            f"run store {store_path} has no saved weights for run {record.id} ({cfg.model.ffn}, seed {cfg.seed}); "
            "deploy needs a store whose runs saved their weights (ffnlab compare)"
        )
    corpus, tok, splits = load_data(*data_args(cfg))
    task = cfg.model.task
    mcfg = data_model_config(cfg, corpus, tok)
    model = default_factory(cfg, tok)(mcfg, cfg.seed)
    load_weights(model, path, f"the weights of run {record.id} ({cfg.model.ffn}, seed {cfg.seed})")
    context, size = mcfg.context, cfg.batch_size
    batches = {
        split: eval_set(splits[split], task, cfg.final_eval_batches, size, context)
        for split in ("val", "test")
        if has_window(splits[split], task, context)
    }
    gen = torch.Generator().manual_seed(CALIBRATION_SEED)
    calibration = [get_batch(splits["train"], task, size, context, gen)[0] for _ in range(dp.CALIBRATION_BATCHES)]
    tags = list(corpus.classes or []) if task == "tokens" else []
    return TrainedRun(record, cfg, mcfg, model.eval(), batches, calibration, tags)


ONE_CELL = "run the cell to deploy into a store of its own (compare with that cell's settings and --store)"


def setting_key(config: dict[str, Any]) -> str:
    """What the runs deployed together share: the config but for FFN, seed, qat_from and checkpoint folder."""
    d = json.loads(json.dumps(config))
    for key in ("seed", "qat_from", "checkpoint_dir"):
        d.pop(key, None)
    d["model"].pop("ffn", None)
    return json.dumps(d, sort_keys=True)


def store_settings(store_path: str | Path) -> int:
    """How many settings besides FFN, seed and qat_from the store's finished runs are of (`store_runs` takes one);
    0 where there is no store yet."""
    if not Path(store_path).is_file():
        return 0
    with Store(store_path, read_only=True) as store:
        return len({setting_key(r.config) for r in store.runs("finished")})


def store_runs(store_path: str | Path, ffns: Iterable[str] | None = None) -> list[RunRecord]:
    """The store's finished runs of `ffns` (all by default); ValueError naming the store when it has none, or
    runs of more than one setting besides FFN, seed and qat_from (deploy measures one)."""
    with Store(store_path, create=False) as store:
        records = [r for r in store.runs("finished")]
    if ffns is not None:
        wanted = {get_ffn_spec(f).name for f in ffns}
        records = [r for r in records if r.config["model"]["ffn"] in wanted]
    if not records:
        raise ValueError(f"run store {store_path} holds no finished runs" + (" of those variants" if ffns else ""))
    settings = {setting_key(r.config) for r in records}
    if len(settings) > 1:
        raise ValueError(
            f"run store {store_path} holds runs of {len(settings)} settings besides FFN and seed; "
            f"deploy measures one: {ONE_CELL}"
        )
    return records


# ---- quality --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scores:
    """A deployed model's quality on one run's final batches (`judge`)."""

    val_loss: float
    test_loss: float | None = None  # where the test split has a window
    val_acc: float | None = None  # a classifier's
    test_acc: float | None = None
    val_f1: float | None = None  # a tagger's span F1
    test_f1: float | None = None


Score = Literal["val_loss", "test_loss", "val_acc", "test_acc", "val_f1", "test_f1"]  # a field of Scores
PerSeed = dict[int, Scores]  # seed -> one target's scores of that seed's run


def judge(module: nn.Module, run: TrainedRun) -> Scores:
    """Loss (and accuracy for cls and image, span F1 for tokens) of a deployed module on a run's final batches."""
    task = run.cfg.model.task
    with dp.quiet_libraries():  # a compiled int8 model compiles again here, with targets
        val = evaluate(module, run.batches["val"], task, contextlib.nullcontext, tags=run.tags)
        test = {}
        if "test" in run.batches:
            test = evaluate(module, run.batches["test"], task, contextlib.nullcontext, tags=run.tags)
    module.eval()  # evaluate leaves it in training mode
    return Scores(val["loss"], test.get("loss"), val.get("acc"), test.get("acc"), val.get("f1"), test.get("f1"))


def delta(values: PerSeed, reference: PerSeed, score: Score) -> dp.Delta | None:
    """`score` of `values` minus that of `reference`, paired by seed (ffnlab.study.stats.paired_diff)."""
    a = {seed: x for seed, v in values.items() if (x := getattr(v, score)) is not None}
    b = {seed: x for seed, v in reference.items() if (x := getattr(v, score)) is not None}
    if not a or not b:
        return None
    paired = paired_diff(a, b)
    return dp.Delta(paired.n, paired.delta, paired.ci_low, paired.ci_high, paired.p)


def quality(per_seed: PerSeed, reference: PerSeed, against: str, runtime: str) -> dp.Quality:
    """A row's Quality from its per-seed losses and those of its reference runs."""

    def mean(score: Score) -> float | None:
        values = [x for v in per_seed.values() if (x := getattr(v, score)) is not None and math.isfinite(x)]
        return sum(values) / len(values) if values else None

    return dp.Quality(
        seeds=sorted(per_seed),
        val_loss=mean("val_loss"),
        test_loss=mean("test_loss"),
        val_acc=mean("val_acc"),
        test_acc=mean("test_acc"),
        val_loss_delta=delta(per_seed, reference, "val_loss"),
        test_loss_delta=delta(per_seed, reference, "test_loss"),
        val_acc_delta=delta(per_seed, reference, "val_acc"),
        reference=against,
        measured_in=runtime,
        val_losses={seed: v.val_loss for seed, v in sorted(per_seed.items())},
        val_f1=mean("val_f1"),
        test_f1=mean("test_f1"),
        val_f1_delta=delta(per_seed, reference, "val_f1"),
    )


# ---- one variant --------------------------------------------------------------------------------------


@dataclass
class Settings:
    """How deploy_store measures: the targets, the timing inputs and counts, the folder for ONNX files, and who
    hears about the progress."""

    targets: list[dp.Target]
    inputs: dp.Inputs
    repeats: int
    warmup: int
    workdir: dp.Workdir
    log: Callable[[str], None] | None = None

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)


def deploy_target(
    runs: Sequence[TrainedRun], target: dp.Target, settings: Settings, label: str, judged: bool = True
) -> tuple[dp.Pending, PerSeed]:
    """A target's row set up on the first run (its cost: timed later, with every other row's, by `dp.time_rows`),
    and (if `judged`) every run's quality under it."""
    pending: dp.Pending | None = None
    per_seed: PerSeed = {}
    for run in runs if judged else runs[:1]:
        deployed = dp.deploy(
            run.model, onnx_name(label, run.seed), target, settings.inputs.many, settings.workdir, run.calibration
        )
        if pending is None:
            pending = dp.prepare(run.ffn, deployed, target, settings.inputs), deployed.module
        if judged:
            per_seed[run.seed] = judge(deployed.module, run)
    if pending is None:
        raise ValueError(f"no runs to deploy as {target.label()}")
    return pending, per_seed


def onnx_name(label: str, seed: int) -> str:
    """What a run's ONNX files are named after: its variant (`label`: 'gelu', or 'gelu-qat') and seed."""
    return f"{label}-seed{seed}"


def deploy_targets(
    runs: Sequence[TrainedRun], settings: Settings, label: str, known: dict[str, PerSeed]
) -> list[tuple[dp.Pending, PerSeed, str]]:
    """(row set up, per-seed values, runtime they were measured in) per target: a target already measured (fp32
    eager) or computing what another does (compile, as eager, when eager was measured) is not evaluated again. A
    target that is unavailable or fails gives its row's reason and no values."""
    out: list[tuple[dp.Pending, PerSeed, str]] = []
    for target in settings.targets:
        eager = replace(target, runtime="eager").label()
        reuse = (
            target.label()
            if target.label() in known
            else eager
            if target.runtime == "compile" and eager in known
            else None
        )
        try:
            pending, per_seed = deploy_target(runs, target, settings, label, judged=reuse is None)
        except dp.Unavailable as e:
            pending, per_seed = (dp.unmeasured(runs[0].ffn, target, str(e)), None), {}
        except Exception as e:  # a quantiser, compiler or exporter failing for this variant is a result
            pending, per_seed = (dp.unmeasured(runs[0].ffn, target, first_line(e)), None), {}
        else:
            if reuse is not None:
                per_seed = known[reuse]
            known[target.label()] = per_seed
        runtime = "eager" if reuse == eager and reuse != target.label() else target.runtime
        pending[0].qat_from = runs[0].cfg.qat_from
        settings.say(dp.progress_line(pending[0]) + (f", {len(runs)} seeds judged" if per_seed else ""))
        out.append((pending, per_seed, runtime))
    return out


def deploy_variant(runs: Sequence[TrainedRun], settings: Settings) -> tuple[list[dp.Pending], dict[str, PerSeed]]:
    """Every target for one variant's runs (its seeds): rows with quality against fp32 eager of the same runs, set
    up for their timings. Returns them and the per-seed values by target label (QAT pairs with them)."""
    reference = {run.seed: judge(run.model, run) for run in runs}
    known = {"fp32/eager": reference}
    rows = []
    for (row, module), per_seed, runtime in deploy_targets(runs, settings, runs[0].ffn, known):
        if per_seed:
            row.quality = quality(per_seed, reference, "fp32 eager of the same runs", runtime)
        rows.append((row, module))
    return rows, known


def deploy_qat(
    qat_runs: Sequence[TrainedRun], plain: dict[str, PerSeed], settings: Settings
) -> tuple[list[dp.Pending], dp.QatSummary]:
    """The converted models of one variant's QAT runs (int8-dynamic, on the torch runtimes asked for), set up for
    their timings: quality paired by seed with the plain runs in fp32 and under int8-dynamic PTQ (vs_ptq); and the
    QAT-against-PTQ summary."""
    first = qat_runs[0]
    if first.cfg.qat_from is None:
        raise ValueError(f"run {first.record.id} was not trained with qat_from")
    wanted = replace(settings, targets=[t for t in settings.targets if t.scheme == "int8-dynamic"])
    known: dict[str, PerSeed] = {}
    rows = []
    for (row, module), per_seed, runtime in deploy_targets(qat_runs, wanted, f"{first.ffn}-qat", known):
        if per_seed:
            row.quality = quality(per_seed, plain["fp32/eager"], "fp32 eager of the plain runs", runtime)
            row.quality.vs_ptq = delta(per_seed, plain.get(PTQ, {}), "val_loss")
        rows.append((row, module))
    return rows, qat_summary(first.ffn, first.cfg.qat_from, known.get(PTQ, {}), plain)


PTQ = "int8/eager/int8-dynamic"  # the target a QAT run converts to, and the PTQ it is paired with
QAT_FLOOR = 0.02  # nats: a PTQ increase below this leaves too little for "how much QAT recovers" to mean anything


def qat_summary(ffn: str, qat_from: float, qat: PerSeed, plain: dict[str, PerSeed]) -> dp.QatSummary:
    """How much of PTQ's validation-loss increase QAT recovers, 1 - (QAT - fp32) / (PTQ - fp32) over the paired
    seeds' means; None where PTQ loses QAT_FLOOR nats or less (issue #25's target asks it only there)."""
    ptq = delta(plain.get(PTQ, {}), plain["fp32/eager"], "val_loss")
    qat_increase = delta(qat, plain["fp32/eager"], "val_loss")
    if not (ptq and qat_increase and ptq.delta is not None and qat_increase.delta is not None):
        return dp.QatSummary(ffn, qat_from, ptq, qat_increase, None, "not measured (no int8-dynamic eager row of both)")
    text = f"qat_from {qat_from:g}: int8 validation loss {qat_increase.delta:+.4f} against fp32, PTQ {ptq.delta:+.4f}"
    if ptq.delta <= QAT_FLOOR:
        text += f"; PTQ loses no more than {QAT_FLOOR} nats, so there is little for QAT to recover"
        return dp.QatSummary(ffn, qat_from, ptq, qat_increase, None, text)
    recovered = 1.0 - qat_increase.delta / ptq.delta
    text += f"; QAT recovers {recovered:.0%} of PTQ's increase"
    return dp.QatSummary(ffn, qat_from, ptq, qat_increase, recovered, text)


# ---- the store ----------------------------------------------------------------------------------------


def check_plain_runs(store_path: str | Path, records: Sequence[RunRecord]) -> None:
    """ValueError in one line naming a variant whose runs all trained with qat_from: a QAT run is judged against
    plain runs of its variant, so without them it would give no row."""
    plain = {r.config["model"]["ffn"] for r in records if r.config.get("qat_from") is None}
    alone = list(dict.fromkeys(r.config["model"]["ffn"] for r in records if r.config["model"]["ffn"] not in plain))
    if alone:
        other = f", or leave {alone[0]} out (--ffn {','.join(sorted(plain))})" if plain else ""
        raise ValueError(f"run store {store_path} holds QAT runs (qat_from) of {alone[0]} but no plain runs of it, "
                         f"which deploy pairs them with: train plain runs of {alone[0]} into it too{other}")  # fmt: skip


def deploy_store(
    store_path: str | Path,
    ffns: Iterable[str] | None = None,
    precisions: str | Iterable[str] | None = None,
    runtimes: str | Iterable[str] = dp.RUNTIMES,
    *,
    batch: int = 16,
    seq: int | None = None,
    repeats: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    workdir: str | Path | None = None,
    roofline: bool = True,
    log: Callable[[str], None] | None = None,
) -> dp.DeployResult:
    """The trained models of a store's study, one row per variant x target with its cost and quality (module
    docstring), QAT runs beside the plain runs they pair with, the Pareto front marked. On the CPU. Every row is set
    up and judged first, then all are timed in turns (`dp.time_rows`); `log` hears about the progress. ValueError in
    one line for an unknown or repeated precision or runtime, a thread count beyond the machine's CPUs, a store
    without finished runs, saved weights or plain runs beside its QAT runs, damaged weights, runs of several
    settings, or an ONNX file that cannot be written."""
    wanted = dp.targets(dp.default_precisions() if precisions is None else precisions, runtimes)
    wanted.sort(key=lambda t: dp.RUNTIMES.index(t.runtime))  # eager first: compile rows take its numbers
    if threads is not None:
        check_threads(threads)
    if ffns is not None:
        dp.once([get_ffn_spec(f).name for f in ffns], "FFN variant")
    records = store_runs(store_path, ffns)
    check_plain_runs(store_path, records)
    asked = TrainConfig.from_dict(records[0].config).model
    dp.check_settings(batch, dp.model_seq(asked, seq), asked.context, repeats, warmup)  # before the runs load
    plain_names = {
        onnx_name(r.config["model"]["ffn"], r.config["seed"]) for r in records if not r.config.get("qat_from")
    }
    dp.check_workdir(workdir, sorted(plain_names), wanted)
    runs = [load_trained(store_path, r) for r in records]
    mcfg = runs[0].model_cfg
    seq = dp.model_seq(mcfg, seq)  # a ViT's: its patches, known once its data is
    inputs = dp.model_inputs(mcfg, batch, seq)
    pending: list[dp.Pending] = []
    qat: list[dp.QatSummary] = []
    with dp.threads_set(threads) as used, dp.work_folder(workdir) as folder, dp.compiled_together():
        settings = Settings(wanted, inputs, repeats, warmup, folder, log)
        for ffn in dict.fromkeys(r.ffn for r in runs):
            plain = [r for r in runs if r.ffn == ffn and r.cfg.qat_from is None]
            trained_qat: dict[float, list[TrainedRun]] = {}  # by qat_from
            for r in runs:
                if r.ffn == ffn and r.cfg.qat_from is not None:
                    trained_qat.setdefault(r.cfg.qat_from, []).append(r)
            variant_rows, by_label = deploy_variant(plain, settings)
            pending += variant_rows
            for qat_from in sorted(trained_qat):
                qat_rows, summary = deploy_qat(trained_qat[qat_from], by_label, settings)
                pending += qat_rows
                qat.append(summary)
        dp.time_rows(pending, inputs, repeats, warmup, log=log)
        rows = [row for row, _ in pending]
        del pending  # the deployed models: before the roofline's copy takes its memory
        copy_gbs = dp.add_roofline(rows) if roofline else None
    dp.mark_front(rows)
    setup = {"batch": batch, "seq": seq, "repeats": repeats, "warmup": warmup, "threads": used, "device": "cpu",
             "targets": [t.label() for t in wanted], "copy_gbs": copy_gbs, "timing": dp.TIMING,
             "seeds": sorted({r.seed for r in runs}), "quality_batches": runs[0].cfg.final_eval_batches,
             "quality_batch_size": runs[0].cfg.batch_size}  # fmt: skip
    params = {r.ffn: param_count(r.model) for r in runs}
    return dp.DeployResult(
        f"store {store_path}",
        {**asdict(mcfg), "ffn": list(params), "params": params},
        setup,
        dp.environment(),
        rows,
        qat,
    )


# ---- deploy.json beside the store -------------------------------------------------------------------

DEPLOY_JSON = "deploy.json"  # beside the store, written by `ffnlab deploy --store`: the report and advise read it


def deployment_path(store_path: str | Path) -> Path:
    return Path(store_path).parent / DEPLOY_JSON


def save_deployment(store_path: str | Path, result: dp.DeployResult) -> Path:
    """`result` written (atomically) to deploy.json beside the store, replacing an earlier measurement."""
    return write_atomic(deployment_path(store_path), strict_dumps(result.to_json()))


def load_deployment(store_path: str | Path) -> dp.DeployResult | None:
    """deploy.json beside the store (`ffnlab deploy --store`), or None when there is none. ValueError in one line
    naming the file, what is wrong and what to do where it is there but is no deployment ffnlab can show (a
    folder, not JSON, a row of an unknown precision): a damaged file is said to be damaged, never read as none."""
    path = deployment_path(store_path)
    try:
        problem = kind_problem(path)
    except FileNotFoundError:
        return None
    try:
        if problem is not None:
            raise ValueError(f"the deployment file {path} {problem}")
        return deployment_from_text(read_text(path, "the deployment file"), path)
    except ValueError as e:
        raise damaged(store_path, str(e)) from None


def damaged(store_path: str | Path, problem: str) -> ValueError:
    """The one line for a deploy.json that is damaged: `problem` (naming the file), and what to do."""
    return ValueError(
        f"{problem}; the file is damaged: measure it again with `ffnlab deploy --store {store_path}`, or remove it"
    )


# what the report and advise read of the free-form parts, and must find of its kind
SETUP_KINDS = {"batch": int, "seq": int, "repeats": int, "warmup": int, "threads": int, "device": str,
               "copy_gbs": float | None, "seeds": list[int] | None, "targets": list[str], "quality_batches": int,
               "quality_batch_size": int}  # fmt: skip
ENVIRONMENT_KINDS = {"cpu_flags": list[str] | None}
TIMES = ("median_s", "q1_s", "q3_s", "min_s", "max_s")  # a Latency's seconds: a timed call takes some time
COUNTS = ("batch", "seq", "repeats", "threads")  # and at least one of each


def deployment_from_text(text: str, path: Path) -> dp.DeployResult:
    """deploy.json's text as a DeployResult, checked first (`deployment_problem`); ValueError naming `path`."""
    if not text.strip():
        raise ValueError(f"the deployment file {path} is empty")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the deployment file {path} is not JSON ({e})") from None
    except RecursionError:  # json's parser recurses per nested array or object
        raise ValueError(f"the deployment file {path} nests deeper than JSON's parser goes") from None
    problem = deployment_problem(d)
    if problem is not None:
        raise ValueError(f"the deployment file {path}: {problem}")
    try:
        return dp.DeployResult.from_json(d)
    except (TypeError, KeyError, AttributeError, ValueError) as e:  # a key the records do not have
        raise ValueError(
            f"the deployment file {path} does not read back as a deployment ({first_line(e, 120)})"
        ) from None


def deployment_problem(d: Any) -> str | None:
    """What in deploy.json's JSON is not what `ffnlab deploy --store` writes ("rows[0].precision is 'fp64', ...");
    None where nothing is: the records' field kinds, the setup and machine fields that are read, positive times
    and counts, and every row's variant, precision, runtime and int8 scheme among those ffnlab deploys."""
    problem = json_problem(d, dp.DeployResult)
    for part, kinds in (("setup", SETUP_KINDS), ("environment", ENVIRONMENT_KINDS)):
        for key, kind in kinds.items():
            if problem is None and key in d[part]:
                problem = json_problem(d[part][key], kind, f"{part}.{key}")
    for i, row in enumerate(d["rows"] if problem is None else []):
        problem = problem or row_problem(row, f"rows[{i}]")
    return problem


def row_problem(row: dict[str, Any], where: str) -> str | None:
    """What in a row (of the kinds DeployRow declares) names no deployment ffnlab measures, or times nothing."""
    for key, valid in (("precision", dp.PRECISIONS), ("runtime", dp.RUNTIMES)):
        if row[key] not in valid:
            return f"{where}.{key} is '{shorten(row[key])}', which ffnlab does not deploy; valid: {', '.join(valid)}"
    valid_targets = dp.targets([row["precision"]], [row["runtime"]])
    if dp.Target(row["precision"], row["runtime"], row["scheme"]) not in valid_targets:
        schemes = ", ".join(str(t.scheme) for t in valid_targets)
        return (
            f"{where}.scheme is {json.dumps(row['scheme'])[:60]}, not a scheme of {row['precision']} on "
            f"{row['runtime']}; valid: {'null' if schemes == 'None' else schemes}"
        )
    try:
        get_ffn_spec(row["ffn"])
    except ValueError as e:
        return f"{where}.ffn: {e}"
    for timing in ("latency", "throughput"):
        latency = row[timing] or {}
        for key in (*TIMES, *COUNTS):
            value = json_number(latency.get(key, 1))
            if not (math.isfinite(value) and value > 0):
                return f"{where}.{timing}.{key} is {value}, not above 0"
    return None
