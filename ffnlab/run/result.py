"""What one run measured (`RunResult`), as records: an `Evaluation` per split, `Costs`, `Memory`, `Monitors`.

    Outcome     how the run ended: finished or diverged
    Evaluation  one split's final evaluation: loss, perplexity, accuracy, F1s, correlations
    Costs       parameters, FLOPs, tokens and the times the run took
    Memory      a training step's memory, by part, and the CUDA allocator's peak
    Monitors    what the training monitors saw: spikes, gradient statistics, FFN behaviour, learned parameters
    History     the curves: training loss and gradient norm per step, the validation curve (`CurvePoint`),
                the FFN gradient statistics of each logged step (`GradStats`)
    Event       what the monitors noted at a step: a spike, a non-finite loss, a blow-up, an fp16 skip
    RunResult   one run: the records above, and what identifies the run

A new measured quantity is one field on its record (and one entry of `ffnlab.study.metrics.METRICS` to report
it). On disk, and in `ffnlab train --json`, a result is one flat JSON object (`RunResult.to_dict`): a record's
fields under their own names, a split's as '<prefix>_<field>' ('final_val_loss', 'noisy_val_acc'), the keys
results had before they were records, so that every stored result reads back (`RunResult.from_dict`).
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ffnlab._util.jsonio import field_problem


class Outcome(enum.StrEnum):
    """How a run ended: it finished, or it diverged (a non-finite or blown-up loss, `TrainConfig.diverge_factor`)."""

    FINISHED = "finished"
    DIVERGED = "diverged"


def perplexity(loss: float | None) -> float | None:
    """exp(loss); inf where that overflows a float, None without a loss."""
    if loss is None:
        return None
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class Evaluation:
    """One split's final evaluation (`ffnlab.run.train.evaluate` on final_eval_batches fixed batches); None
    where a task does not measure a quantity, or where it is undefined (span F1 of sentences without an
    entity, a correlation with a constant prediction)."""

    loss: float | None = None  # mean over the batches; task reg: the mean squared error
    ppl: float | None = None  # exp(loss)
    acc: float | None = None  # classification: accuracy; tagging (task tokens): accuracy per word
    f1: float | None = None  # task tokens: span F1 as seqeval computes it (ffnlab.data.tagging.span_f1)
    macro_f1: float | None = None  # classification (cls, image): F1 averaged over the classes (run.scores.macro_f1)
    mcc: float | None = None  # classification: Matthews correlation (GLUE's CoLA)
    binary_f1: float | None = None  # two classes: F1 of class 1 (GLUE's MRPC, QQP)
    pearson: float | None = None  # task reg: Pearson's r (GLUE's STS-B ranks by it)
    spearman: float | None = None  # task reg: Spearman's rank correlation

    @classmethod
    def measured(cls, values: dict[str, float]) -> Evaluation:
        """The record of what `evaluate` returned (its quantities by name), its perplexity from its loss; empty
        (every field None) for a split that was not evaluated."""
        names = {f.name for f in fields(cls)} - {"ppl"}
        return cls(ppl=perplexity(values.get("loss")), **{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True)
class Costs:
    """What a run cost: its size, compute, tokens and time (`ffnlab.run.train.measured_costs`)."""

    params: int
    ffn_params: int
    flops_per_token: int  # forward, whole model
    tokens: int
    train_flops: int  # training compute: 3 x flops_per_token x tokens (ffnlab.run.train.train_flops)
    tokens_per_s: float | None  # tokens per step over the median step time
    step_time_s: float
    first_step_s: float | None
    train_seconds: float
    wall_seconds: float
    trainable_params: int | None = None  # the parameters the optimiser updated: all of them, but under LoRA its
    # adapters and a classifier's new head (ffnlab.tools.lora); None in results from before it was recorded


@dataclass(frozen=True)
class Memory:
    """A training step's memory in bytes (ffnlab.core.memory): counted from the tensors, the same whatever ran
    before in the process; and the CUDA allocator's peak, which is not."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    saved_bytes: int  # kept for backward by one training forward pass
    train_mem_bytes: int  # the sum of the four above
    cuda_peak_bytes: int | None  # the CUDA allocator's peak since the run started; None off CUDA


@dataclass(frozen=True)
class Monitors:
    """What the training monitors saw (`ffnlab.run.monitors.monitor_summary`)."""

    n_grad_spikes: int
    n_loss_spikes: int
    max_grad_norm: float | None  # largest global gradient norm before clipping
    ffn_grad_mean: float | None  # mean over logged steps and FFN layers of the FFN weights' gradient mean
    ffn_grad_std: float | None  # ... and of its std
    behaviour: dict[str, dict[str, float]]  # per FFN layer: dead units, sparsity, activation scale (ActivationProbe)
    dead_frac: float | None
    learned: dict[str, dict[str, Any]]  # per FFN layer: a learnable activation's parameters (beta, tau, mixtures)


@dataclass(frozen=True, kw_only=True)
class CurvePoint(Evaluation):
    """One point of the validation curve: `evaluate` on the eval_batches batches, every eval_every steps."""

    step: int
    time: float | None = None  # seconds trained by then

    def to_json(self) -> dict[str, Any]:
        """{'step', the quantities evaluate measured, 'time'}: a point as `train --out` and the store's curves
        (val_loss, val_acc, val_time, ...) keep it. Perplexity is left out: the loss gives it."""
        measured = {k: v for k, v in asdict(self).items() if k in names(Evaluation) and k != "ppl" and v is not None}
        return {"step": self.step, **measured, "time": self.time}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CurvePoint:
        quantities = {k: v for k, v in d.items() if k not in ("step", "time")}
        return cls(step=d["step"], time=d.get("time"), **asdict(Evaluation.measured(quantities)))


@dataclass(frozen=True)
class GradStats:
    """The FFN weights' gradient statistics at one logged step (every log_every): 'grad_mean/<weight>',
    'grad_std/<weight>', 'grad_norm/<weight>' (ffnlab.run.monitors.grad_stats)."""

    step: int
    stats: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, **self.stats}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GradStats:
        return cls(d["step"], {k: v for k, v in d.items() if k != "step"})


@dataclass(frozen=True)
class History:
    """A run's curves. The store keeps them in its metrics table, not in the result (`Store.metrics`)."""

    train_loss: tuple[float, ...] = ()  # every step's
    grad_norm: tuple[float, ...] = ()  # every step's global gradient norm, before clipping
    val: tuple[CurvePoint, ...] = ()
    grad_ffn: tuple[GradStats, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "train_loss": list(self.train_loss),
            "grad_norm": list(self.grad_norm),
            "val": [p.to_json() for p in self.val],
            "grad_ffn": [g.to_json() for g in self.grad_ffn],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> History:
        """The curves from their JSON (`to_json`, or the training loop's own lists); a curve not there is empty."""
        return cls(
            train_loss=tuple(d.get("train_loss", ())),
            grad_norm=tuple(d.get("grad_norm", ())),
            val=tuple(CurvePoint.from_json(p) for p in d.get("val", ())),
            grad_ffn=tuple(GradStats.from_json(g) for g in d.get("grad_ffn", ())),
        )


@dataclass(frozen=True)
class Event:
    """What the monitors noted at a step, and what its kind records (the value, the median it was judged against,
    the fp16 scale). Kinds: 'grad_spike', 'loss_spike' (ffnlab.run.monitors.spike_events), 'nonfinite',
    'blowup' (the two that end a run, ffnlab.run.config.DIVERGENCE) and 'fp16_skip'."""

    step: int
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """{'step', 'kind', ...detail}: an event as the store keeps it (`Store.add_events`)."""
        return {"step": self.step, "kind": self.kind, **self.detail}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Event:
        return cls(d["step"], d["kind"], {k: v for k, v in d.items() if k not in ("step", "kind")})


# each split's Evaluation, and the prefix of its keys in the flat JSON: 'final_val' + 'loss' -> 'final_val_loss'
SPLITS = {
    "val": "final_val",
    "test": "final_test",
    "noisy_val": "noisy_val",
    "test_mismatched": "final_test_mismatched",
}
RECORDS = {"costs": Costs, "memory": Memory, "monitors": Monitors}  # records whose fields keep their own names
# what a key that a result does not hold reads as, where not None: the store keeps curves and events in tables of
# their own, and a result older than the field lacks it
EMPTY: dict[str, Any] = {"history": {}, "events": [], "config": {}, "behaviour": {}, "learned": {}}


@dataclass(frozen=True)
class RunResult:
    """What one run measured. `to_dict()` is what the store keeps (the sweep files `history` and `events` in
    tables of their own); metrics a run could not measure (a diverged run's final loss, a split too small to
    evaluate) are None."""

    ffn: str
    seed: int
    status: Outcome
    task: str
    steps: int
    val: Evaluation  # the validation split: where a comparison ranks, and an lr is chosen
    test: Evaluation  # the test split: where a tuned comparison reports; empty when the split is too small
    noisy_val: Evaluation  # robustness: validation with noise on the token embeddings (TrainConfig.noise_std)
    costs: Costs
    memory: Memory
    monitors: Monitors
    diverged_step: int | None
    diverged_kind: str | None  # 'nonfinite' (a NaN or inf loss or gradient) or 'blowup' (TrainConfig.diverge_factor)
    vocab_size: int
    device: str
    precision: str
    threads: int  # bf16 results depend on it at the 1e-4 level
    history: History = History()  # empty in a result read from the store, which keeps curves apart
    events: tuple[Event, ...] = ()  # ... and events
    config: dict[str, Any] = field(default_factory=dict)
    test_mismatched: Evaluation = Evaluation()  # MNLI's mismatched dev set, a further test set (ffnlab.data.glue)

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON object the store keeps and `ffnlab train --json` prints (see the module's docstring)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SPLITS:
                out.update({f"{SPLITS[f.name]}_{k}": v for k, v in asdict(value).items()})
            elif f.name in RECORDS:
                out.update(asdict(value))
            elif f.name == "history":
                out["history"] = self.history.to_json()
            elif f.name == "events":
                out["events"] = [e.to_json() for e in self.events]
            else:
                out[f.name] = value.value if isinstance(value, Outcome) else value
        return out

    if not TYPE_CHECKING:  # typed code reads the records; this is for code written before them

        def __getattr__(self, name: str) -> Any:
            """A flat name of results before 0.3 ('final_val_loss'), read from its record (`val.loss`) with a
            DeprecationWarning; those names go in 0.4."""
            path = old_names().get(name)
            if path is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            attr, sub = path
            warnings.warn(
                f"RunResult.{name} is RunResult.{attr}.{sub} since ffnlab 0.3; the flat name goes in 0.4",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(getattr(self, attr), sub)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """A result from its flat JSON (`to_dict`, of this ffnlab or an older one: a key an older one did not
        write reads as None, or as empty); ValueError naming a key that is not a result's, or a value not of its
        field's kind."""
        keys = dict(flat_keys())
        unknown = sorted(set(d) - set(keys))
        if unknown:
            raise ValueError(f"its result has keys a run result does not: {', '.join(unknown)}")
        problem = result_problem(d)
        if problem:
            raise ValueError(problem)
        splits = {
            name: Evaluation(**{k: d.get(f"{prefix}_{k}") for k in names(Evaluation)})
            for name, prefix in SPLITS.items()
        }
        records = {
            name: record(**{k: d.get(k, EMPTY.get(k)) for k in names(record)}) for name, record in RECORDS.items()
        }
        top = {k: d.get(k, EMPTY.get(k)) for k in names(cls) if k not in SPLITS and k not in RECORDS}
        typed = {
            "status": Outcome(str(top["status"])),
            "history": History.from_json(top["history"] or {}),
            "events": tuple(Event.from_json(e) for e in top["events"] or ()),
        }
        return cls(**{**top, **splits, **records, **typed})


def names(record: type) -> list[str]:
    return [f.name for f in fields(record)]


def flat_keys() -> Iterator[tuple[str, tuple[type, str]]]:
    """Each key of a result's flat JSON, with the record and field it holds: ('final_val_loss', (Evaluation,
    'loss'))."""
    for name in names(RunResult):
        if name in SPLITS:
            yield from ((f"{SPLITS[name]}_{k}", (Evaluation, k)) for k in names(Evaluation))
        elif name in RECORDS:
            yield from ((k, (RECORDS[name], k)) for k in names(RECORDS[name]))
        else:
            yield name, (RunResult, name)


def old_names() -> dict[str, tuple[str, str]]:
    """Each flat key of a result that is a field of a record, with its path: 'final_val_loss' -> ('val', 'loss'),
    'params' -> ('costs', 'params')."""
    paths = {f"{prefix}_{k}": (name, k) for name, prefix in SPLITS.items() for k in names(Evaluation)}
    return paths | {k: (name, k) for name, record in RECORDS.items() for k in names(record)}


def result_problem(d: dict[str, Any]) -> str | None:
    """The first key of a result's flat JSON whose value is not of the kind its field declares ("'learned' is a
    string, not an object"); None when every one is. Nulls and keys of no field are left alone."""
    keys = dict(flat_keys())
    for key, value in d.items():
        if key not in keys:
            continue
        record, name = keys[key]
        problem = field_problem({name: value}, record)
        if problem:
            return problem.replace(f"'{name}'", f"'{key}'", 1)
    return None
