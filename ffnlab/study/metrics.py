"""The one table of metrics: every quantity a comparison reports about a variant, declared once.

Each `Metric` says what it is called, its unit, which direction is better, where a run's value comes
from (a quantity of one split's `Evaluation`, `Measured`; a field of one of the result's records, by its
attribute path, 'costs.params'; or a function of the result), how a variant's seeds are reduced to one
number, how it is printed, which tables show it and whether a task ranks by it. The terminal table,
`compare --json` and `--csv`, the report's tables and advise's evidence all iterate `METRICS`, so a
new measured metric is one field on its record (`ffnlab.run.result`) and one entry here (and its test),
nothing else.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ffnlab._util.text import human, num
from ffnlab.data.glue import GlueTask, is_glue, parse_glue
from ffnlab.run.result import SPLITS as SPLIT_KEYS
from ffnlab.run.result import RunResult
from ffnlab.run.scores import task_score

# the tables a metric can appear in: the ranking (terminal and report), the report's cost, stability and
# signal tables, seed 002's four columns (perplexity, stability events, peak memory, step time), and the
# evidence an advice quotes
TABLES = ("ranking", "cost", "stability", "signals", "seed002", "evidence")
Better = Literal["lower", "higher", "ranking"]  # "ranking": the direction of the task's ranking metric
SPELLED = {"val": "validation", "acc": "accuracy"}  # a label's abbreviations, spelled out in prose
SPLITS = ("val", "test")  # the words of a label that name the split, not the quantity


def finite(values: Sequence[Any]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def mean_of(values: Sequence[Any]) -> float | None:
    """The mean of the finite numbers among `values`; None when there is none."""
    values = finite(values)
    return math.fsum(values) / len(values) if values else None


def median_of(values: Sequence[Any]) -> float | None:
    values = finite(values)
    return statistics.median(values) if values else None


def max_of(values: Sequence[Any]) -> float | None:
    return max(values, default=None)


def first_of(values: Sequence[Any]) -> Any:
    """The first seed's value: for what every seed shares (parameters, FLOPs)."""
    return values[0] if values else None


def range_of(values: Sequence[Any]) -> list[float] | None:
    """[min, max] over the seeds: the spread of a timing."""
    values = finite(values)
    return [min(values), max(values)] if values else None


def exp_mean(values: Sequence[Any]) -> float | None:
    """exp of the mean: perplexity from the mean loss (not the mean of the seeds' perplexities)."""
    m = mean_of(values)
    return None if m is None else math.exp(m)


def learned_mean(per_seed: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Learned activation parameters per layer, averaged over seeds (switch weights per activation)."""
    layers: dict[str, dict[str, list[Any]]] = {}
    for learned in per_seed:
        for layer, params in learned.items():
            for name, value in params.items():
                layers.setdefault(layer, {}).setdefault(name, []).append(value)
    out: dict[str, dict[str, Any]] = {}
    for layer, params in layers.items():
        out[layer] = {}
        for name, values in params.items():
            if isinstance(values[0], dict):
                out[layer][name] = {k: mean_of([v[k] for v in values]) for k in values[0]}
            elif isinstance(values[0], (int, float)):
                out[layer][name] = mean_of(values)
            else:  # a vector parameter: element-wise
                out[layer][name] = [mean_of(col) for col in zip(*values)]
    return out


def ms(seconds: float | None) -> str:
    return num(seconds * 1e3 if seconds is not None else None, 1)


def ms_range(span: list[float] | None) -> str:
    return f"{span[0] * 1e3:.1f}-{span[1] * 1e3:.1f}" if span else "-"


def three_digits(value: object) -> str:
    """A number to 3 significant digits ('1.23e-05'), '-' for None. NOTE: not `human`: gradient means
    span many decades, and an SI suffix would hide that."""
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def learned_text(learned: dict[str, dict[str, Any]]) -> str:
    """'blocks.0.ffn: beta 1.21; blocks.1.ffn: beta 1.05' (mixture weights as relu 0.31, ...)."""
    parts = []
    for layer, params in learned.items():
        values = []
        for name, v in params.items():
            if isinstance(v, dict):
                values.append(", ".join(f"{k} {x:.2f}" for k, x in v.items()))
            elif isinstance(v, (int, float)):
                values.append(f"{name} {v:.3g}")
            else:
                values.append(f"{name} {[round(x, 3) for x in v]}")
        parts.append(f"{layer}: {'; '.join(values)}")
    return "; ".join(parts) or "-"


@dataclass(frozen=True)
class Measured:
    """A metric's source where it is one quantity of one split's `Evaluation`: Measured("val", "loss") reads
    `result.val.loss`; `on` is the same quantity on another split (the test twin of a ranking metric)."""

    split: str  # a RunResult field holding an Evaluation: 'val', 'test', 'noisy_val'
    quantity: str  # a field of `ffnlab.run.result.Evaluation`: 'loss', 'acc', 'f1', ...

    def __call__(self, r: RunResult) -> float | None:
        value: float | None = getattr(getattr(r, self.split), self.quantity)
        return value

    def on(self, split: str) -> Measured:
        return replace(self, split=split)

    @property
    def key(self) -> str:
        """Its key in a result's flat JSON, and the name of a metric of it: 'final_val_loss'."""
        return f"{SPLIT_KEYS[self.split]}_{self.quantity}"


def ranked(r: RunResult, split: str) -> float | None:
    """The run's ranking metric on `split`: 'val', 'test' or 'noisy_val' (val with embedding noise)."""
    source = ranking_metric(r.task).source
    assert isinstance(source, Measured)  # a ranking metric is one split's quantity
    return source.on(split)(r)


def on_test(r: RunResult) -> float | None:
    """The run's ranking metric on the test split."""
    return ranked(r, "test")


def under_noise(r: RunResult) -> float | None:
    """The run's validation metric with Gaussian noise on the token embeddings (a robustness probe)."""
    return ranked(r, "noisy_val")


def noise_effect(r: RunResult) -> float | None:
    """How much the embedding noise moved the validation metric."""
    clean = ranked(r, "val")
    noisy = under_noise(r)
    return None if noisy is None or clean is None else noisy - clean


def glue_task_of(r: RunResult) -> GlueTask | None:
    """The GLUE task a run trained on (its data 'glue:DIR:TASK', ffnlab.data.glue), else None."""
    data = str(r.config.get("data", ""))
    return parse_glue(data)[1] if is_glue(data) else None


def official_metrics(r: RunResult, task: GlueTask) -> dict[str, float | None]:
    """A GLUE run's official metrics on its test split (GLUE's dev set), by name: {'binary_f1': .., 'acc': ..}."""
    return {m: getattr(r.test, m) for m in task.metrics}


def glue_task_score(r: RunResult) -> float | None:
    """A GLUE run's task score on its test split, GLUE's dev set: the mean of its task's official metrics
    (ffnlab.run.scores.task_score); None for other data, or where one of them is undefined."""
    task = glue_task_of(r)
    if task is None:
        return None
    values = list(official_metrics(r, task).values())
    return None if any(v is None for v in values) else task_score([v for v in values if v is not None])


def sparsity(r: RunResult) -> float | None:
    """The fraction of exact zeros in the FFN's hidden activations, averaged over layers."""
    behaviour = r.monitors.behaviour
    return mean_of([b.get("zero_frac") for b in behaviour.values()]) if behaviour else None


@dataclass(frozen=True)
class Metric:
    """One measured quantity of a variant (see the module's docstring)."""

    name: str  # its key in a row, in compare --json and in the CSV header
    label: str  # its column heading
    unit: str  # '' for a count or a fraction
    better: Better | None  # None: neither direction is better (a setting, a count of parameters)
    source: Measured | str | Callable[[RunResult], Any]  # a split's quantity; the attribute path of a field of a
    # result's record ('costs.params'), or a function of one run's result
    reduce: Callable[[Sequence[Any]], Any] = mean_of  # the variant's seeds -> one value
    format: Callable[[Any], str] = num
    tables: tuple[str, ...] = ()  # where it is shown, of TABLES; compare --json always holds it
    ranks: tuple[str, ...] = ()  # the tasks that rank variants by it (its statistics are the row's)
    tasks: tuple[str, ...] = ("lm", "cls", "image", "tokens", "reg")  # the tasks it is measured for; None elsewhere
    csv: bool = True  # a scalar the CSV has a column for
    ended: bool = False  # over every ended run, diverged ones too (a count of what went wrong); else the finished
    task_labels: tuple[tuple[str, str], ...] = ()  # (task, heading) where `label` would mislead: a ViT's tokens
    # are its image patches
    undefined: str = ""  # why a finished run can lack it, where it can: said where a ranking leaves such runs out

    def heading(self, task: str | None = None) -> str:
        """Its column heading in a table of `task`'s results."""
        return dict(self.task_labels).get(task or "", self.label)

    def spelled(self) -> str:
        """Its label in prose, abbreviations spelled out: 'validation accuracy', 'validation F1'."""
        return " ".join(SPELLED.get(word, word) for word in self.label.split(" "))

    def quantity(self) -> str:
        """What it measures in prose, on whichever split: 'loss', 'accuracy', 'F1', 'token accuracy'."""
        return " ".join(SPELLED.get(word, word) for word in self.label.split(" ") if word not in SPLITS)

    def value(self, result: RunResult) -> Any:
        """This metric of one run."""
        return operator.attrgetter(self.source)(result) if isinstance(self.source, str) else self.source(result)

    @property
    def split(self) -> str | None:
        """The split it is measured on ('val', 'test', 'noisy_val'); None for a metric of the whole run."""
        return self.source.split if isinstance(self.source, Measured) else None

    def on(self, split: str) -> Metric:
        """This metric on another split of the same runs ('val loss' -> 'test loss', named by its key in a
        result's JSON, 'final_test_loss'); ValueError for a metric that is not one split's quantity."""
        if not isinstance(self.source, Measured):
            raise ValueError(f"metric '{self.name}' is not measured on a split")
        source = self.source.on(split)
        label = " ".join(
            [
                split if split in SPLITS else split.replace("_", " "),
                *(w for w in self.label.split(" ") if w not in SPLITS),
            ]
        )
        return replace(self, name=source.key, label=label, source=source)

    def of(self, results: Sequence[RunResult], task: str) -> Any:
        """This metric of a variant: its seeds' values reduced; None for a task it is not measured for."""
        if task not in self.tasks:
            return None
        return self.reduce([v for v in (self.value(r) for r in results) if v is not None])


METRICS: tuple[Metric, ...] = (
    Metric("final_val_loss", "val loss", "nats", "lower", Measured("val", "loss"), ranks=("lm",), tasks=("lm",)),
    Metric("final_val_acc", "val acc", "", "higher", Measured("val", "acc"), ranks=("cls", "image"),
           tasks=("cls", "image")),
    Metric("final_val_f1", "val F1", "", "higher", Measured("val", "f1"), ranks=("tokens",), tasks=("tokens",),
           undefined="the validation sentences evaluated hold no entity span, so span F1 is 0/0"),
    Metric("final_val_pearson", "val Pearson", "", "higher", Measured("val", "pearson"), ranks=("reg",), tasks=("reg",),
           undefined="the predictions on the validation examples are constant, so Pearson's r is 0/0"),
    Metric("ppl", "perplexity", "", "lower", Measured("val", "loss"), exp_mean, lambda v: num(v, 2),
           ("signals", "seed002"), tasks=("lm",)),
    Metric("test_mean", "test", "", "ranking", on_test, tables=("ranking", "signals")),
    Metric("final_val_macro_f1", "val macro-F1", "", "higher", Measured("val", "macro_f1"),
           tables=("ranking", "signals"), tasks=("cls", "image")),  # shown beside accuracy, which ranks: macro-F1
    # weighs every class alike
    Metric("final_test_macro_f1", "test macro-F1", "", "higher", Measured("test", "macro_f1"), tables=("signals",),
           tasks=("cls", "image")),
    Metric("noisy_mean", "with embedding noise", "", "ranking", under_noise, tables=("signals",)),
    Metric("noise_delta", "noise effect", "", None, noise_effect, format=lambda v: "-" if v is None else f"{v:+.4f}",
           tables=("ranking", "signals")),
    Metric("val_mse", "val MSE", "", "lower", Measured("val", "loss"), tables=("ranking", "signals"), tasks=("reg",)),
    Metric("final_val_spearman", "val Spearman", "", "higher", Measured("val", "spearman"),
           tables=("ranking", "signals"), tasks=("reg",)),
    Metric("final_test_spearman", "test Spearman", "", "higher", Measured("test", "spearman"), tables=("signals",),
           tasks=("reg",)),  # STS-B's second metric, beside Pearson's r
    Metric("final_val_mcc", "val Matthews", "", "higher", Measured("val", "mcc"), tables=("signals",), tasks=("cls",)),
    Metric("final_test_mcc", "test Matthews", "", "higher", Measured("test", "mcc"), tables=("signals",),
           tasks=("cls",)),
    Metric("final_val_binary_f1", "val F1 of class 1", "", "higher", Measured("val", "binary_f1"), tables=("signals",),
           tasks=("cls",)),  # two classes only: MRPC's and QQP's F1
    Metric("final_test_binary_f1", "test F1 of class 1", "", "higher", Measured("test", "binary_f1"),
           tables=("signals",), tasks=("cls",)),
    Metric("token_acc", "token acc", "", "higher", Measured("val", "acc"), tables=("ranking", "signals"),
           tasks=("tokens",)),
    Metric("test_token_acc", "test token acc", "", "higher", Measured("test", "acc"), tables=("signals",),
           tasks=("tokens",)),
    Metric("glue_score", "GLUE score", "", "higher", glue_task_score, tasks=("cls", "reg")),  # a GLUE task's
    # score on GLUE's dev set; over a study's tasks, the GLUE score (ffnlab.study.summary.glue_aggregate)
    Metric("params", "params", "", None, "costs.params", first_of, human, ("ranking", "cost", "evidence")),
    Metric("flops_per_token", "FLOPs/token", "FLOPs", None, "costs.flops_per_token", first_of, human, ("cost",),
           task_labels=(("image", "FLOPs/patch"),)),
    Metric("tokens_per_s", "tokens/s", "tokens/s", "higher", "costs.tokens_per_s", format=human,
           tables=("ranking", "cost", "evidence"), task_labels=(("image", "patches/s"),)),
    Metric("step_time_s", "step time (ms)", "s", "lower", "costs.step_time_s", median_of, ms,
           ("cost", "seed002", "evidence")),
    Metric("step_time_range", "seeds' range (ms)", "s", None, "costs.step_time_s", range_of, ms_range, ("cost",),
           csv=False),
    Metric("train_seconds", "train time (s)", "s", "lower", "costs.train_seconds", format=lambda v: num(v, 1),
           tables=("cost",)),
    Metric("train_mem_bytes", "training memory", "B", "lower", "memory.train_mem_bytes", max_of,
           lambda v: human(v, "B"), ("ranking", "cost", "seed002", "evidence")),
    Metric("param_bytes", "parameters", "B", "lower", "memory.param_bytes", max_of, lambda v: human(v, "B")),
    Metric("grad_bytes", "gradients", "B", "lower", "memory.grad_bytes", max_of, lambda v: human(v, "B")),
    Metric("optimizer_bytes", "optimizer state", "B", "lower", "memory.optimizer_bytes", max_of,
           lambda v: human(v, "B")),
    Metric("saved_bytes", "saved for backward", "B", "lower", "memory.saved_bytes", max_of, lambda v: human(v, "B"),
           ("cost",)),
    Metric("cuda_peak_bytes", "CUDA peak", "B", "lower", "memory.cuda_peak_bytes", max_of, lambda v: human(v, "B"),
           ("seed002",)),  # seed 002's peak memory where the runs measured it, training memory's otherwise
    Metric("grad_spikes", "gradient spikes", "", "lower", "monitors.n_grad_spikes", sum, str, ("stability",)),
    Metric("loss_spikes", "loss spikes", "", "lower", "monitors.n_loss_spikes", sum, str, ("stability",)),
    Metric("stability_events", "events", "", "lower", lambda r: r.monitors.n_grad_spikes + r.monitors.n_loss_spikes,
           sum, str, ("ranking", "seed002"), csv=False),
    Metric("nonfinite_runs", "non-finite runs", "", "lower", lambda r: int(r.status == "diverged" and r.diverged_kind
           != "blowup"), sum, str, ("stability",), ended=True),  # before diverged_kind, every divergence was one
    Metric("blowup_runs", "blown-up runs", "", "lower", lambda r: int(r.diverged_kind == "blowup"), sum, str,
           ("stability",), ended=True),
    Metric("max_grad_norm", "max gradient norm", "", "lower", "monitors.max_grad_norm", max_of, lambda v: num(v, 3),
           ("stability",)),
    Metric("dead_frac", "dead units", "", "lower", "monitors.dead_frac", format=lambda v: num(v, 3),
           tables=("ranking", "stability")),
    Metric("sparsity", "sparsity", "", None, sparsity, format=lambda v: num(v, 3), tables=("stability",)),
    Metric("ffn_grad_mean", "FFN grad mean", "", None, "monitors.ffn_grad_mean", format=three_digits,
           tables=("stability",)),
    Metric("ffn_grad_std", "FFN grad std", "", None, "monitors.ffn_grad_std", format=three_digits,
           tables=("stability",)),
    Metric("learned", "learned activation parameters", "", None, "monitors.learned", learned_mean, learned_text,
           ("signals",), csv=False),
)  # fmt: skip


def metric(name: str) -> Metric:
    """The declared metric `name`; ValueError naming the valid ones otherwise."""
    for m in METRICS:
        if m.name == name:
            return m
    raise ValueError(f"unknown metric '{name}'; valid: {', '.join(m.name for m in METRICS)}")


# the metrics code reads by name, looked up once: a renamed entry fails at import, not as a silent None
STEP_TIME, STEP_TIME_RANGE = metric("step_time_s"), metric("step_time_range")
PARAMS, TRAIN_MEMORY, CUDA_PEAK = metric("params"), metric("train_mem_bytes"), metric("cuda_peak_bytes")


def ranking_metric(task: str) -> Metric:
    """The metric a comparison of `task` ranks by: validation loss for an LM, accuracy for a classifier (cls,
    image), span F1 for a tagger (tokens), Pearson's r for a regressor (reg: scale-free, STS-B's first metric)."""
    for m in METRICS:
        if task in m.ranks:
            return m
    raise ValueError(f"no ranking metric for task '{task}'")


def ranked_metric(name: str) -> Metric:
    """The ranking metric `name` names, on the split it names: 'final_test_f1' is span F1 on the test split (a
    tuned cell compares there); ValueError naming the valid ones otherwise."""
    ranking = [m.on(split) for m in METRICS if m.ranks for split in ("val", "test")]
    for m in ranking:
        if m.name == name:
            return m
    raise ValueError(f"unknown ranking metric '{name}'; valid: {', '.join(m.name for m in ranking)}")


def ranked_task(name: str) -> str:
    """The task whose ranking metric `name` is, on val or test ('final_test_f1' -> 'tokens'); 'lm' if none."""
    return next((task for m in METRICS if m.ranks and name in (m.name, m.on("test").name) for task in m.ranks), "lm")


def row_metrics() -> list[Metric]:
    """The metrics a variant's row holds beside the statistics of its ranking metric: all but the rankable."""
    return [m for m in METRICS if not m.ranks]


def shown_in(table: str, task: str | None = None) -> list[Metric]:
    """The metrics a table of TABLES shows (for a task, or for any), in declaration order."""
    return [m for m in row_metrics() if table in m.tables and (task is None or task in m.tasks)]
