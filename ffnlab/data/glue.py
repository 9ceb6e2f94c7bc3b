"""GLUE's nine tasks from a folder (`--data glue:DIR`), as GLUE distributes them or as `datasets.save_to_disk`
writes them, each a corpus of its own task type (ffnlab.data.corpus.Corpus).

A GLUE task is named in a run's data as `glue:DIR:TASK` ('glue:/data/glue:cola'); `glue:DIR` alone names the
suite, which `compare` turns into a data axis of its tasks (ffnlab.study.plan.glue_study). The task folder is
DIR/<GLUE's name> or DIR/<the glue dataset's config name>, any case (DIR/CoLA or DIR/cola), holding either

- GLUE's TSV files: train.tsv and dev.tsv (MNLI: dev_matched.tsv and dev_mismatched.tsv), read with
  csv.QUOTE_NONE (GLUE's texts hold unbalanced quotes), the columns `GlueTask.tsv_text` and `tsv_label` by
  their header (CoLA's files have none: source, label, mark, sentence); or
- a DatasetDict saved by save_to_disk from the `glue` dataset's config: splits train and validation (MNLI:
  validation_matched, validation_mismatched), columns `GlueTask.saved_text` and 'label'.

Protocol. GLUE hides its test labels (-1 in the saved test split), so the test split of every task here is
GLUE's official dev set: what a comparison reports, with the task's official metrics (`GlueTask.metrics`,
ffnlab.run.scores). The validation split, for any choice made on the way (an lr, a number of steps), is the
10% of the training rows whose text hashes last (ffnlab.data.corpus.split_routes), so nothing is chosen on
what is reported. MNLI's mismatched dev set is a second test set (`Corpus.more_tests`), evaluated with the
same model as the matched one. Class ids follow the glue dataset's ClassLabel order in both formats
(MNLI: entailment, neutral, contradiction), so class 1 is the positive class of MRPC's and QQP's F1.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ffnlab._util.names import closest
from ffnlab._util.text import first_few, shorten
from ffnlab.data.corpus import (
    NEWLINES,
    Corpus,
    data_chunks,
    from_rows,
    is_saved_dataset,
    label_number,
    load_saved,
    text_lines,
)
from ffnlab.data.pairs import pair_documents

PREFIX = "glue:"
Kind = Literal["cls", "reg"]  # the task types GLUE's tasks train as (ffnlab.core.model.ModelConfig.task)


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its files are, what its rows hold, the task type it trains as and its metrics."""

    name: str  # the glue dataset's config name, and the task's name in --glue-tasks: cola, sst2, ...
    title: str  # GLUE's own name, its folder in GLUE's download: CoLA, SST-2, ...
    task: Kind  # ffnlab's task type: cls, or reg for STS-B's similarity score
    tsv_text: tuple[str, ...]  # the TSV's text columns: one sentence, or a pair
    tsv_label: str  # the TSV's label column
    saved_text: tuple[str, ...]  # the saved dataset's text columns
    classes: tuple[str, ...] | None  # class names in the glue dataset's ClassLabel order; None for reg
    metrics: tuple[str, ...]  # its official metrics, RunResult quantities on the test split (final_test_<m>)
    headings: tuple[str, ...]  # each metric's name in a table
    tsv_columns: tuple[str, ...] | None = None  # the columns of a TSV without a header (CoLA's)
    dev: tuple[str, ...] = ("dev",)  # the dev sets' file stems and saved splits' suffixes: test, then more tests
    tsv_labels: tuple[str, ...] | None = None  # the TSV's label spellings, by class id, where they are not 0, 1, ...
    # NOTE: QQP's train.tsv holds a few lines cut short (line 97,931: 3 fields of 6); they are skipped and counted, as
    # transformers' QqpProcessor skips them, where a short line of another task is an error
    skip_short: bool = False


BINARY = ("0", "1")
TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", "CoLA", "cls", ("sentence",), "label", ("sentence",), ("unacceptable", "acceptable"),
                 ("mcc",), ("Matthews",), tsv_columns=("source", "label", "mark", "sentence")),
        GlueTask("sst2", "SST-2", "cls", ("sentence",), "label", ("sentence",), ("negative", "positive"), ("acc",),
                 ("acc",)),
        GlueTask("mrpc", "MRPC", "cls", ("#1 String", "#2 String"), "Quality", ("sentence1", "sentence2"),
                 ("not_equivalent", "equivalent"), ("binary_f1", "acc"), ("F1", "acc")),
        GlueTask("qqp", "QQP", "cls", ("question1", "question2"), "is_duplicate", ("question1", "question2"),
                 ("not_duplicate", "duplicate"), ("binary_f1", "acc"), ("F1", "acc"), skip_short=True),
        GlueTask("stsb", "STS-B", "reg", ("sentence1", "sentence2"), "score", ("sentence1", "sentence2"), None,
                 ("pearson", "spearman"), ("Pearson", "Spearman")),
        GlueTask("mnli", "MNLI", "cls", ("sentence1", "sentence2"), "gold_label", ("premise", "hypothesis"),
                 ("entailment", "neutral", "contradiction"), ("acc", "mismatched_acc"), ("m acc", "mm acc"),
                 dev=("dev_matched", "dev_mismatched"), tsv_labels=("entailment", "neutral", "contradiction")),
        GlueTask("qnli", "QNLI", "cls", ("question", "sentence"), "label", ("question", "sentence"),
                 ("entailment", "not_entailment"), ("acc",), ("acc",), tsv_labels=("entailment", "not_entailment")),
        GlueTask("rte", "RTE", "cls", ("sentence1", "sentence2"), "label", ("sentence1", "sentence2"),
                 ("entailment", "not_entailment"), ("acc",), ("acc",), tsv_labels=("entailment", "not_entailment")),
        GlueTask("wnli", "WNLI", "cls", ("sentence1", "sentence2"), "label", ("sentence1", "sentence2"),
                 ("not_entailment", "entailment"), ("acc",), ("acc",)),
    )
}  # fmt: skip
MORE_TESTS = {"dev_mismatched": "mismatched"}  # a further dev set -> its name in Corpus.more_tests


def task_key(name: str) -> str:
    """A task's name as --glue-tasks reads it: any case, GLUE's spelling too ('SST-2', 'STS-B' -> sst2, stsb)."""
    return name.strip().lower().replace("-", "")


def glue_task(name: str) -> GlueTask:
    """The GLUE task `name` (`task_key`); ValueError naming the valid ones."""
    task = TASKS.get(task_key(name))
    if task is None:
        raise ValueError(
            f"unknown GLUE task '{shorten(name)}'{closest(task_key(name), TASKS)}; valid: {', '.join(TASKS)}"
        )
    return task


def is_glue(data: str) -> bool:
    """Whether a run's data names GLUE ('glue:DIR' or 'glue:DIR:TASK')."""
    return str(data).startswith(PREFIX)


def parse_glue(data: str) -> tuple[str, GlueTask | None]:
    """(DIR, its task or None) of 'glue:DIR:TASK' or 'glue:DIR'; ValueError for 'glue:' without a folder."""
    spec = str(data).removeprefix(PREFIX)
    folder, sep, last = spec.rpartition(":")
    if sep and folder and task_key(last) in TASKS:
        return folder, TASKS[task_key(last)]
    if not spec:
        raise ValueError("--data glue:DIR needs the folder of GLUE's tasks, e.g. glue:data/glue")
    return spec, None


def glue_data(folder: str, task: GlueTask) -> str:
    """The data of one GLUE task of `folder`: 'glue:DIR:TASK'."""
    return f"{PREFIX}{folder}:{task.name}"


def glue_fields(data: str) -> tuple[Kind, str, str] | None:
    """(task type, text field, label field) a run of the GLUE task `data` names trains with ('cls',
    'sentence1,sentence2', 'label'), the saved dataset's columns; None for other data and for the whole suite."""
    if not is_glue(data):
        return None
    _, task = parse_glue(data)
    return None if task is None else (task.task, ",".join(task.saved_text), "label")


def task_folder(folder: str, task: GlueTask) -> Path:
    """DIR/<GLUE's name> or DIR/<config name>, any case; ValueError naming the task and where it looked."""
    root = Path(os.path.expanduser(folder))
    if not root.is_dir():
        raise ValueError(f"--data glue:{folder}: no such folder; give the folder that holds GLUE's task folders")
    wanted = {task.title.lower(), task.name}
    found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.lower() in wanted)
    if not found:
        raise ValueError(
            f"GLUE task {task.title}: no folder {root / task.title} (or {root / task.name}); download it there, or "
            "leave it out with --glue-tasks"
        )
    return found[0]


def glue_tasks(folder: str, names: list[str] | None) -> list[GlueTask]:
    """The tasks a GLUE study runs: `names` (--glue-tasks) in GLUE's order, or all nine; ValueError for an unknown
    name or a task without its folder under `folder`."""
    wanted = {glue_task(name).name for name in names} if names else set(TASKS)
    tasks = [task for task in TASKS.values() if task.name in wanted]
    for task in tasks:
        task_folder(folder, task)
    return tasks


# ---- reading a task ------------------------------------------------------------------------------


def tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each line of a GLUE TSV: tab-separated, no quoting (csv.QUOTE_NONE), a byte-order
    mark before the first field dropped (MRPC's files have one)."""
    reader = csv.reader(text_lines(data_chunks(path), NEWLINES), delimiter="\t", quoting=csv.QUOTE_NONE)
    for fields in reader:
        if reader.line_num == 1 and fields:
            fields[0] = fields[0].removeprefix("\ufeff")
        if fields:
            yield reader.line_num, fields


def tsv_label(task: GlueTask, value: str, where: str) -> int | float:
    """A TSV label as the class id (or for STS-B the number) it spells; ValueError naming `where` otherwise."""
    if task.classes is None:
        return label_number(value, task.tsv_label, where)
    spellings = task.tsv_labels or BINARY
    if value.strip() not in spellings:
        raise ValueError(f"{where}: label '{shorten(value)}' is not one of {', '.join(spellings)} ({task.title})")
    return spellings.index(value.strip())


def read_tsv(path: Path, task: GlueTask, skipped: list[str] | None = None) -> tuple[list[str], list[int | float]]:
    """The documents (a pair joined, ffnlab.data.pairs) and labels of one GLUE TSV; ValueError, one line, naming
    the file (and line) for a missing file or column, a row too short for a column (QQP's are skipped, each named
    in `skipped`: `GlueTask.skip_short`), or a bad label."""
    if not path.is_file():
        raise ValueError(f"GLUE task {task.title}: {path} is missing")
    rows = tsv_rows(path)
    header = list(task.tsv_columns or next(rows, (0, []))[1])
    index = {}
    for column in (*task.tsv_text, task.tsv_label):
        if column not in header:
            raise ValueError(f"{path} has no column '{column}' ({task.title}; columns: {first_few(header) or 'none'})")
        index[column] = header.index(column)
    texts: list[list[str]] = [[] for _ in task.tsv_text]
    labels: list[int | float] = []
    for line, fields in rows:
        where = f"{path} line {line}"
        short = [(column, at) for column, at in index.items() if at >= len(fields)]
        if short and task.skip_short and skipped is not None:
            skipped.append(where)
            continue
        if short:
            column, at = short[0]
            raise ValueError(f"{where} has {len(fields)} fields, no '{column}' (field {at + 1}; {task.title})")
        labels.append(tsv_label(task, fields[index[task.tsv_label]], where))
        for column, kept in zip(task.tsv_text, texts):
            kept.append(fields[index[column]])
    if not labels:
        raise ValueError(f"{path} has no rows ({task.title})")
    return documents(texts, task.tsv_text, str(path)), labels


def documents(texts: list[list[str]], names: tuple[str, ...], where: str) -> list[str]:
    """One text column's documents, or a pair's two joined (`pair_documents`, which names an empty text's row)."""
    return texts[0] if len(texts) == 1 else pair_documents(texts[0], texts[1], list(names), where)


def read_saved(loaded: Any, split: str, task: GlueTask, where: str) -> tuple[list[str], list[Any]]:
    """The documents and labels of one split of a saved glue DatasetDict; ValueError naming it for a missing split
    or column, a hidden label (-1: GLUE's test split) or, for STS-B, a label that is no number."""
    if split not in loaded:
        raise ValueError(f"{where} has no split '{split}' ({task.title}; splits: {first_few(list(loaded))})")
    dataset = loaded[split]
    for column in (*task.saved_text, "label"):
        if column not in dataset.column_names:
            raise ValueError(
                f"{where} [{split}] has no column '{column}' ({task.title}; columns: {first_few(dataset.column_names)})"
            )
    columns = dataset.select_columns([*task.saved_text, "label"]).to_dict()
    labels = columns["label"]
    for i, label in enumerate(labels):
        row = f"{where} [{split}] row {i + 1}"
        if task.classes is None:
            label_number(label, "label", row)
        elif not isinstance(label, int) or not 0 <= label < len(task.classes):
            raise ValueError(f"{row}: label {shorten(repr(label))} is no class id of {task.title} (0 to "
                             f"{len(task.classes) - 1}; -1 is a hidden test label)")  # fmt: skip
    return documents([columns[c] for c in task.saved_text], task.saved_text, f"{where} [{split}]"), labels


def saved_split(stem: str) -> str:
    """The saved dataset's split of a dev file's stem: dev -> validation, dev_matched -> validation_matched."""
    return stem.replace("dev", "validation")


def load_glue(data: str) -> Corpus:
    """The corpus of the GLUE task `data` names ('glue:DIR:TASK'): train from its train rows, test from its official
    dev set, val carved from train by text hash (the module's protocol), MNLI's mismatched dev set as a further
    test set. ValueError, one line, for the suite without a task, a missing folder or file, or a malformed one."""
    folder, task = parse_glue(data)
    if task is None:
        raise ValueError(
            f"--data {shorten(data)} names GLUE's suite; a run trains one task: glue:{folder}:TASK with TASK one of "
            f"{', '.join(TASKS)} (compare runs them all)"
        )
    where = task_folder(folder, task)
    parts: dict[str, tuple[list[str], list[Any]]] = {}
    skipped: list[str] = []  # QQP's lines cut short (`GlueTask.skip_short`)
    if is_saved_dataset(where):
        loaded = load_saved(where)
        parts["train"] = read_saved(loaded, "train", task, str(where))
        dev = [read_saved(loaded, saved_split(stem), task, str(where)) for stem in task.dev]
        source = f"GLUE {task.title}, saved dataset {where}"
    else:
        parts["train"] = read_tsv(where / "train.tsv", task, skipped)
        dev = [read_tsv(where / f"{stem}.tsv", task, skipped) for stem in task.dev]
        source = f"GLUE {task.title}, TSV files under {where}"
    parts["test"] = dev[0]
    corpus = from_rows(data, task.task, parts, list(task.classes) if task.classes else None, source)
    corpus.more_tests = {MORE_TESTS[stem]: rows for stem, rows in zip(task.dev[1:], dev[1:])}
    corpus.meta["split_rule"] = (
        f"test = GLUE's official dev set ({', '.join(task.dev)}; GLUE hides its test labels); val = the 10% of "
        "train rows whose text hashes last"
    )
    if skipped:  # named, so that a reader can find them
        corpus.meta["skipped_lines"] = skipped
    return corpus
