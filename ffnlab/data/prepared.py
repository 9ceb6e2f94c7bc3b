"""Prepared tokens: a corpus tokenised once into files of token ids, one per split, that runs sample windows from
through a memory map (task lm only).

`prepare(source, out)` writes a folder of train.bin, val.bin and test.bin (raw little-endian uint16 where the
vocabulary fits, as nanoGPT's train.bin, else uint32) and manifest.json (`Manifest`: the tokenizer's state, the
dtype, the tokens and documents of each split, the sha256 of the source and the split rule). The folder is written
whole beside `out` and renamed into place, its manifest last, so a killed prepare leaves nothing that looks
finished, and a rerun starts over. The source streams through it, never whole in memory, split by the rules of
`load_corpus`, each split's text cut where its tokenizer cuts anyway (`stream_safe_chunks`), so its ids are
`encode(text)`'s, written as they come. Text files: by `text_files_plan` (a cut by position takes a pass to find
it). Rows (JSON lines a line at a time, CSV, Parquet a batch of its text and split columns at a time, a saved
dataset or a dataset's name from its memory-mapped Arrow files): one pass counts them (which splits the source
names, and the text_bucket of each row: `split_routes` needs the first, the empty-split check the second), then
each split reads them again and keeps the rows routed to it, so no rule needs them all at once. The bundled plays
(5 MB) are read whole.

`load_tokens(folder)` reads such a folder back as a `TokenFiles` per split, and tokens prepared elsewhere: the
shards llm.c and modded-nanogpt write (`*_train*.bin`, `*_val*.bin`: a header of 256 int32, magic 20240520,
version 1 and the token count, then uint16 tokens) and nanoGPT's raw uint16 train.bin and val.bin, whose
tokenizer is not known (`IdTokenizer`: a vocabulary size).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import numpy as np
import torch

from ffnlab._util.files import atomic_folder, check_free_space, check_output_folder
from ffnlab._util.jsonio import json_problem
from ffnlab._util.reading import TOKENIZER_LIMIT, check_readable, read_chunks, read_text
from ffnlab._util.text import first_line
from ffnlab.data.corpus import (
    DATA_FILE,
    EVERY_BUCKET,
    ROW_READERS,
    SPLIT_NAMES,
    SPLITS,
    check_pair,
    data_chunks,
    data_files,
    file_split,
    folder_files,
    hf_named,
    is_saved_dataset,
    load_corpus,
    load_saved,
    need_texts,
    parquet_rows,
    row_text,
    split_routes,
    text_bucket,
    text_files_plan,
)
from ffnlab.data.tokenizer import (
    CHUNK_CHARS,
    TRAIN_CHUNK_CHARS,
    BPETokenizer,
    ByteTokenizer,
    IdTokenizer,
    Tokenizer,
    build_tokenizer,
    check_bpe_vocab,
    file_tokenizer,
    is_tokenizer_file,
    stream_safe_chunks,
    tokenizer_from_state,
    train_bpe_chunks,
)

if TYPE_CHECKING:
    from tokenizers import Encoding

MANIFEST = "manifest.json"
FORMAT = "ffnlab-tokens"
VERSION = 1  # of the folder's format; a reader refuses a later one
DOC_SEP = "\n\n"  # between the documents of a split, as `Corpus.text` joins them
PREPARE_KINDS = ("char", "byte", "bpe")  # and a FILE.json; word needs the vocabulary of a whole split first
LLMC_MAGIC, LLMC_VERSION = 20240520, 1  # llm.c's GPT-2 shards (dev/data/data_common.py)
LLMC_HEADER = 256 * 4  # bytes: 256 int32
GPT2_VOCAB = 50257  # llm.c's and nanoGPT's tokens are GPT-2's unless told otherwise
SCAN_TOKENS = 1 << 24  # tokens read at a time where ids are checked against the vocabulary
LLMC_SHARD = re.compile(r".*_(train|val)(_\d+)?\.bin")  # fineweb_train_000001.bin, TinyStories_val.bin
TEMP_FOLDER = re.compile(r"\..+\.\d+\.tmp")  # atomic_folder's temporary folder: .NAME.PID.tmp

Document = Iterable[str]  # a document's text, as it streams
Documents = Callable[[], Iterator[Document]]  # a split's documents as they stream, read again at each call
Rows = Callable[[], Iterator[tuple[str, object]]]  # a source's rows (the split it names them, as it spells it, and
# their text) as they stream, read again at each call
Log = Callable[[str], None]


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype a prepared folder stores ids of a `vocab_size` vocabulary in: little-endian uint16 where every id
    fits (ids 0 to 65535), else uint32."""
    return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


# ---- the folder's records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitTokens:
    """What one split of a prepared folder holds."""

    tokens: int
    documents: int  # files, pieces of a file or rows; 0 where unknown (tokens prepared elsewhere)


@dataclass(frozen=True)
class Manifest:
    """manifest.json of a prepared folder: what its token files hold and where they came from."""

    tokenizer: dict[str, Any]  # the tokenizer's state(): tokenizer_from_state rebuilds it
    dtype: Literal["uint16", "uint32"]
    vocab_size: int
    splits: dict[str, SplitTokens]
    source: str  # the path or name prepared
    source_sha256: str  # of the files read (their names and bytes), or of the rows' texts for a dataset's name
    split_rule: str
    task: Literal["lm"] = "lm"
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps({"format": self.format, "version": self.version, **asdict(self)}, indent=1)


@dataclass(frozen=True)
class TokenFolder:
    """What `load_tokens` read, in the place `load_data` gives a corpus: no classes (task lm), the split rule."""

    name: str
    classes: None = None
    meta: dict[str, Any] = field(default_factory=dict)  # {"source": ..., "split_rule": ..., "tokens": {split: count}}


@dataclass(frozen=True)
class TokenFile:
    """`count` token ids of `dtype` in the file `path`, from byte `offset` on."""

    path: Path
    offset: int
    count: int
    dtype: str

    def map(self) -> np.memmap:
        """The ids, read-only through a memory map."""
        return np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r", offset=self.offset, shape=(self.count,))


class TokenFiles:
    """One split's token ids in files read one after another (llm.c's shards), as a 1-D sequence: its length and
    windows. NOTE: each read maps the files it needs afresh and lets them go, as nanoGPT's train.py does, so the
    pages a long run touches do not stay in its resident memory."""

    def __init__(self, parts: list[TokenFile]):
        self.parts = parts
        self.starts = np.cumsum([0] + [part.count for part in parts])  # of each part in the split

    def __len__(self) -> int:
        return int(self.starts[-1])

    def windows(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """The `length` ids from each of `starts` (B,), as int64 (B, length); a window may span two files."""
        index = starts.numpy()[:, None] + np.arange(length)  # (B, length) positions in the split
        part = np.searchsorted(self.starts, index, side="right") - 1
        out = np.empty(index.shape, dtype=np.int64)
        for p in np.unique(part):
            here = part == p
            out[here] = self.parts[p].map()[index[here] - self.starts[p]]
        return torch.from_numpy(out)

    def __getitem__(self, span: slice) -> torch.Tensor:
        """The ids of a slice of the split, as int64."""
        start, stop, step = span.indices(len(self))
        if step != 1 or stop <= start:
            raise ValueError("a split of prepared tokens is read in windows of consecutive ids")
        return self.windows(torch.tensor([start]), stop - start)[0]


# ---- prepare: the source's documents ---------------------------------------------------------------------


def joined(files: list[Path]) -> Iterator[str]:
    """The text of `files` joined with DOC_SEP, as it streams."""
    for i, path in enumerate(files):
        if i:
            yield DOC_SEP
        yield from data_chunks(path)


def position_cuts(files: list[Path], fractions: tuple[float, float, float]) -> list[int]:
    """Where `split_text` cuts the joined text of `files` into train, val and test, in characters: two passes
    over it (its length, then the line break after each cut), never the whole text in memory."""
    total = sum(len(chunk) for chunk in joined(files))
    targets = [int(total * fractions[0]), int(total * (fractions[0] + fractions[1]))]
    cuts: list[int | None] = [None, None]
    at = 0  # of the chunk in the text
    for chunk in joined(files):
        for i, target in enumerate(targets):
            if cuts[i] is None and at + len(chunk) > target:
                newline = chunk.find("\n", max(0, target - at))
                cuts[i] = at + newline + 1 if newline >= 0 else None
        at += len(chunk)
        if None not in cuts:
            break
    found = [target if cut is None else cut for cut, target in zip(cuts, targets)]
    return [found[0], max(found)]


def text_span(files: list[Path], start: int, end: int | None) -> Iterator[str]:
    """Characters [start, end) of the joined text of `files` (None: to its end), as they stream."""
    at = 0
    for chunk in joined(files):
        if end is not None and at >= end:
            return
        if at + len(chunk) > start:
            yield chunk[max(0, start - at) : None if end is None else end - at]
        at += len(chunk)


def empty_split(source: str, split: str) -> ValueError:
    """The error for a split without text, as `Corpus` words it."""
    return ValueError(
        f"{source}: the {split} split is empty; give a source with more documents (plays, files or rows) or more text"
    )


def span_document(files: list[Path], start: int, end: int | None, source: str, split: str) -> Callable[[], Document]:
    """The piece [start, end) of the joined text of `files`, the one document of `split`: ValueError where it holds
    only whitespace, which leaves the split empty."""

    def stream() -> Iterator[str]:
        blank = True
        for chunk in text_span(files, start, end):
            blank = blank and chunk.isspace()
            yield chunk
        if blank:
            raise empty_split(source, split)

    return stream


@dataclass(frozen=True)
class Source:
    """A source to prepare: the documents of each split, streamed at each read, and where they came from."""

    documents: dict[str, Documents]
    split_rule: str
    sha256: str
    size: int  # bytes of text: at most one id each


def files_sha256(files: list[Path], root: Path) -> str:
    """sha256 over the files read (each one's name under `root` and its bytes), streamed."""
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(root).as_posix() if root.is_dir() else path.name
        digest.update(f"{len(name)}:{name}:{path.stat().st_size}:".encode("utf-8", "surrogatepass"))
        for chunk in read_chunks(path, DATA_FILE):
            digest.update(chunk)
    return digest.hexdigest()


def each(streams: list[Callable[[], Document]]) -> Documents:
    """A split's documents that are `streams`, each read afresh at each call."""
    return lambda: (stream() for stream in streams)


def text_source(root: Path, files: list[Path]) -> Source:
    """The documents of text files by the split rules of `load_corpus` (`text_files_plan`): whole files, or
    pieces of their joined text cut by position."""
    by_name = {(f.relative_to(root).as_posix() if root.is_dir() else f.name): f for f in files}
    plan = text_files_plan(list(by_name))
    streams: dict[str, list[Callable[[], Document]]] = {
        split: [functools.partial(data_chunks, by_name[name]) for name in plan.whole.get(split, [])] for split in SPLITS
    }
    if plan.joined:
        pieces = [by_name[name] for name in plan.joined]
        starts = [0, *position_cuts(pieces, plan.fractions)]
        for split, fraction, start, end in zip(SPLITS, plan.fractions, starts, [*starts[1:], None]):
            if fraction:
                streams[split].append(span_document(pieces, start, end, str(root), split))
    documents = {split: each(streams[split]) for split in SPLITS}
    return Source(documents, plan.rule, files_sha256(files, root), sum(f.stat().st_size for f in files))


def row_split(spelled: str) -> str | None:
    """Our split ('train', 'val', 'test', or 'all' where the source names none) of rows the source puts in
    `spelled`; None for a split `from_rows` ignores (imdb's 'unsupervised')."""
    return SPLIT_NAMES.get(spelled, "all" if spelled == "all" else None)


def is_document(text: object) -> TypeGuard[str]:
    """Whether a row's text is a document: text, not blank (`from_rows` drops the other rows)."""
    return isinstance(text, str) and bool(text.strip())


@dataclass(frozen=True)
class RowCounts:
    """One pass over a source's rows, none of them held: what `split_routes` needs, and how many rows go where."""

    spelled: list[str]  # the source's split names as it spells them, in the order they come
    buckets: dict[str, list[int]]  # for each of our splits that rows name (or 'all'): its documents per text_bucket
    size: int  # bytes of the documents' text
    sha256: str  # of the documents, each with the split it is named


def count_rows(rows: Iterable[tuple[str, object]], spelled: list[str]) -> RowCounts:
    """The `RowCounts` of `rows`; `spelled`: split names the source has before its rows are read (a dataset's)."""
    names = dict.fromkeys(spelled)
    buckets: dict[str, list[int]] = {}
    size, digest = 0, hashlib.sha256()
    for split, text in rows:
        names.setdefault(split)
        if (ours := row_split(split)) is None or not is_document(text):
            continue
        buckets.setdefault(ours, [0] * 100)[text_bucket(text)] += 1
        data = text.encode("utf-8", "surrogatepass")
        size += len(data)
        digest.update(f"{len(split)}:{split}:{len(data)}:".encode("utf-8", "surrogatepass") + data)
    return RowCounts(list(names), buckets, size, digest.hexdigest())


def routed(rows: Rows, routes: dict[str, dict[str, tuple[int, int]]], spelled: list[str], split: str) -> Documents:
    """The documents of our `split`: the texts of the rows `routes` send there (`split_routes`), in `from_rows`'
    order: the rows of each split name of the source in turn (most sources spell each split one way)."""
    names = [(theirs, to[split]) for theirs in spelled if split in (to := routes.get(row_split(theirs) or "", {}))]

    def documents() -> Iterator[Document]:
        for name, (lo, hi) in names:
            for theirs, text in rows():
                if theirs == name and is_document(text) and ((lo, hi) == EVERY_BUCKET or lo <= text_bucket(text) < hi):
                    yield (text,)

    return documents


def rows_source(name: str, rows: Rows, digest: str | None, spelled: list[str] | None = None) -> Source:
    """The documents of rows split as `from_rows` splits them, as they stream: one pass counts them (the splits
    the source has, the text_bucket of each row), then each split's documents are the rows routed to it, read
    again. `digest`: the source's (its files'), else that of its documents."""
    counts = count_rows(rows(), spelled or [])
    present = set(counts.buckets)
    if "all" in present and len(present) > 1:  # rows without a split name next to named splits: ignored
        present.discard("all")
    routes, rule = split_routes(name, present, counts.spelled)
    for split in SPLITS:  # as `Corpus` checks them, before anything is tokenised
        if not any(sum(counts.buckets[theirs][slice(*to[split])]) for theirs, to in routes.items() if split in to):
            raise empty_split(name, split)
    documents = {split: routed(rows, routes, counts.spelled, split) for split in SPLITS}
    return Source(documents, rule, digest or counts.sha256, counts.size)


def file_rows(files: list[Path], suffix: str, text_field: str) -> Iterator[tuple[str, object]]:
    """The rows of data files of one format as they stream: the split its `split` field names, else its file's
    name, and its text; ValueError naming a row without the text column or whose field is not text
    (`rows_by_split`'s checks). Parquet reads only the text and split columns."""
    read = (
        functools.partial(parquet_rows, columns=[text_field, "split"]) if suffix == ".parquet" else ROW_READERS[suffix]
    )
    for path in files:
        named = file_split(path)
        for i, row in enumerate(read(path), 1):
            where = f"{path} row {i}"
            need_texts([text_field], row, where, None)
            split = str(row.get("split", "all")).lower()
            yield (named if split == "all" else split), row_text(row, text_field, where)


def dataset_splits(loaded: Any) -> dict[str, Any]:
    """{split: datasets.Dataset} of a `DatasetDict`, or {'all': it} of a `Dataset` (rows without splits)."""
    return loaded if hasattr(loaded, "keys") else {"all": loaded}


HF_ROWS = 1024  # rows of a dataset read at a time from its memory-mapped Arrow files


def dataset_rows(name: str, loaded: Any, text_field: str) -> Iterator[tuple[str, object]]:
    """The rows of a `datasets.Dataset` or `DatasetDict` as they stream, HF_ROWS at a time, their text column
    alone; a split `from_hf` ignores is not read."""
    for split, dataset in dataset_splits(loaded).items():
        if row_split(split) is None:
            continue
        need_texts([text_field], dataset.column_names, f"{name} [{split}]", None)
        for batch in dataset.select_columns([text_field]).iter(batch_size=HF_ROWS):
            for text in batch[text_field]:
                yield split, text


def one_document(text: str) -> Document:
    """A document whose text is `text`, as one piece."""
    return (text,)


def whole_source(source: str, text_field: str) -> Source:
    """The documents of a source `load_corpus` reads whole: the bundled plays (5 MB); for a source that is none of
    the others, its error."""
    corpus = load_corpus(source, "lm", text_field=text_field)
    documents: dict[str, Documents] = {
        split: functools.partial(map, one_document, corpus.documents(split)) for split in SPLITS
    }
    size = sum(len(text.encode("utf-8", "surrogatepass")) for split in SPLITS for text in corpus.documents(split))
    return Source(documents, corpus.meta.get("split_rule", ""), corpus.fingerprint(), size)


def source_of(source: str, text_field: str) -> Source:
    """The `Source` of a path or name, as `load_corpus` reads it, streamed: text files (`text_source`); rows of
    data files, of a saved dataset or of a dataset's name (`rows_source`)."""
    check_pair(source, "lm", text_field)
    path = Path(os.path.expanduser(source))
    if source == "shakespeare":
        return whole_source(source, text_field)
    if named := hf_named(source, text_field):
        loaded, column, _ = named
        rows = functools.partial(dataset_rows, source, loaded, column)
        return rows_source(source, rows, None, list(dataset_splits(loaded)))
    if not source or not os.path.lexists(path):  # NOTE: Path('') is '.', as in load_corpus
        return whole_source(source, text_field)  # which raises load_corpus' error
    if path.is_dir() and is_saved_dataset(path):
        loaded = load_saved(path)
        rows = functools.partial(dataset_rows, str(path), loaded, text_field)
        return rows_source(str(path), rows, files_sha256(folder_files(path), path), list(dataset_splits(loaded)))
    files, suffix = data_files(path)
    if suffix == ".txt":
        return text_source(path, files)
    return rows_source(str(path), functools.partial(file_rows, files, suffix, text_field), files_sha256(files, path))


def split_text_stream(documents: Iterable[Document]) -> Iterator[str]:
    """A split's text, its documents joined with DOC_SEP (`Corpus.text`), as it streams."""
    for i, document in enumerate(documents):
        if i:
            yield DOC_SEP
        yield from document


# ---- prepare: tokenising -------------------------------------------------------------------------------------


def stream_tokenizer(kind: str, source: Source, bpe_vocab: int | None) -> Tokenizer:
    """The tokenizer `build_tokenizer` builds for `kind` from the source's documents, built as they stream: 'char'
    from every split's characters, 'bpe' trained on the training split's documents; or a FILE.json's."""
    if is_tokenizer_file(kind):
        return file_tokenizer(kind)
    if kind not in PREPARE_KINDS:
        raise ValueError(f"prepare takes the tokenizers {', '.join(PREPARE_KINDS)} or a FILE.json, not '{kind}'")
    if bpe_vocab is not None and kind != "bpe":
        raise ValueError(f"--bpe-vocab is for the bpe tokenizer; {kind} sets its own")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        chars: set[str] = set()
        for document in (d for split in SPLITS for d in source.documents[split]()):
            for chunk in document:
                chars.update(chunk)
        return build_tokenizer("char", ["".join(sorted(chars))])
    vocab = check_bpe_vocab(bpe_vocab)
    chunks = (chunk for d in source.documents["train"]() for chunk in stream_safe_chunks(d, TRAIN_CHUNK_CHARS))
    return BPETokenizer(train_bpe_chunks(chunks, vocab))


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    """Lists of `size` items (the last shorter) as the items stream."""
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch


# chunks encoded at once: enough for every core, few enough that their encodings stay small
BATCH_CHUNKS = 4 * (os.cpu_count() or 1)


def gathered(pieces: Iterable[str], size: int) -> Iterator[str]:
    """The text `pieces` make, in pieces of `size` characters or more (the last one shorter), as they stream."""
    held: list[str] = []
    count = 0
    for piece in pieces:
        held.append(piece)
        count += len(piece)
        if count >= size:
            yield "".join(held)
            held, count = [], 0
    if held:
        yield "".join(held)


def encoded(tokenizer: Tokenizer, text: Iterable[str]) -> Iterator[np.ndarray]:
    """The ids of a text that streams as `text`, as they come: `encode(text)`'s. BPE encodes chunks cut where its
    encode cuts a long text (`stream_safe_chunks`), a batch at a time on every core (tokenizers' encode_batch)."""
    if not isinstance(tokenizer, BPETokenizer):  # char and byte: any cut gives the same ids
        yield from map(tokenizer.encode_array, gathered(text, CHUNK_CHARS))  # rows are many short pieces
        return
    # NOTE: encode_batch lets go of the GIL: while its threads encode one batch, this one reads the next and turns
    # the last one's encodings into ids, so that serial work does not leave the cores idle
    with ThreadPoolExecutor(1) as encoder:
        pending = None
        for batch in batched(stream_safe_chunks(text, CHUNK_CHARS), BATCH_CHUNKS):
            running = encoder.submit(tokenizer.tokenizer.encode_batch, batch, add_special_tokens=False)
            if pending is not None:
                yield encoding_ids(pending.result())
            pending = running
        if pending is not None:
            yield encoding_ids(pending.result())


def encoding_ids(encodings: list[Encoding]) -> np.ndarray:
    """The ids of tokenizers' encodings, one after another."""
    return np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64)


def write_split(documents: Documents, tokenizer: Tokenizer, dtype: np.dtype, path: Path) -> SplitTokens:
    """Encode a split's documents into `path` as they stream; its tokens and documents."""
    tokens, count = 0, 0

    def counted() -> Iterator[Document]:
        nonlocal count
        for document in documents():
            count += 1
            yield document

    with open(path, "wb") as f:
        for ids in encoded(tokenizer, split_text_stream(counted())):
            ids.astype(dtype).tofile(f)
            tokens += len(ids)
    return SplitTokens(tokens, count)


def check_new_folder(out: str | os.PathLike[str]) -> Path:
    """`out` as a Path; ValueError in one line unless it is a new folder (or an empty one) that can be written."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; prepare writes a new folder: remove it or give another --out")
    check_output_folder(out, "the prepared tokens")
    return out


def prepare(
    source: str,
    out: str | os.PathLike[str],
    tokenizer: str = "char",
    bpe_vocab: int | None = None,
    text_field: str = "text",
    log: Log | None = None,
) -> Manifest:
    """Tokenise `source` once into the prepared folder `out` (the module doc); its manifest. `tokenizer`: char, byte,
    bpe (trained on the training split, `bpe_vocab` ids) or a FILE.json."""
    say = log or (lambda line: None)
    out = check_new_folder(out)
    found = source_of(source, text_field)
    say(f"building the {tokenizer} tokenizer")
    tok = stream_tokenizer(tokenizer, found, bpe_vocab)
    dtype = token_dtype(tok.vocab_size)
    check_free_space(out, found.size * dtype.itemsize, "the prepared tokens")  # a byte of text gives one id at most
    if out.is_dir():  # and empty (check_new_folder): the folder is made by one rename, not filled file by file
        out.rmdir()
    with atomic_folder(out) as tmp:
        splits = {}
        for split in SPLITS:
            splits[split] = write_split(found.documents[split], tok, dtype, tmp / f"{split}.bin")
            if not splits[split].tokens:
                raise empty_split(source, split)
            say(f"{split}: {splits[split].tokens:,} tokens")
        name: Literal["uint16", "uint32"] = "uint16" if dtype.itemsize == 2 else "uint32"
        manifest = Manifest(tok.state(), name, tok.vocab_size, splits, str(source), found.sha256, found.split_rule)
        (tmp / MANIFEST).write_text(manifest.to_json(), encoding="utf-8")  # last: no manifest, not finished
    return manifest


# ---- reading ----------------------------------------------------------------------------------------------


def is_token_folder(data: str) -> bool:
    """Whether `data` is a folder of tokens (prepared, or prepared elsewhere) rather than text: it holds a
    manifest.json, llm.c's shards or a train.bin, or it is the temporary folder of a prepare."""
    path = Path(os.path.expanduser(data))
    if not path.is_dir():
        return False
    names = {entry.name for entry in path.iterdir()}
    return (
        MANIFEST in names
        or "train.bin" in names
        or bool(TEMP_FOLDER.fullmatch(path.name))
        or any(LLMC_SHARD.fullmatch(name) for name in names)
    )


def unfinished(folder: Path, why: str) -> ValueError:
    """The error for a folder that is not a finished prepared one."""
    return ValueError(f"{folder} is not a finished prepared folder ({why}); run ffnlab data prepare again")


def read_manifest(folder: Path) -> Manifest:
    """A prepared folder's manifest, checked; ValueError in one line naming what is wrong."""
    path = folder / MANIFEST
    try:
        data = json.loads(read_text(path, "the manifest", TOKENIZER_LIMIT))
    except json.JSONDecodeError as e:
        raise unfinished(folder, f"its {MANIFEST} is not JSON: {e.msg}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise unfinished(folder, f"its {MANIFEST} is not one ffnlab data prepare writes")
    if isinstance(data.get("version"), int) and data["version"] > VERSION:
        raise ValueError(f"{path} is of format version {data['version']}; this ffnlab reads {VERSION}: update it")
    if problem := json_problem(data, Manifest):
        raise unfinished(folder, f"its {MANIFEST}: {problem}")
    known = {f.name: data[f.name] for f in fields(Manifest) if f.name in data}
    return Manifest(**{**known, "splits": {split: SplitTokens(**n) for split, n in data["splits"].items()}})


def prepared_files(folder: Path, manifest: Manifest) -> dict[str, list[TokenFile]]:
    """The token file of each split of a prepared folder, its size checked against the manifest's count."""
    dtype = np.dtype(manifest.dtype)
    parts = {}
    for split in SPLITS:
        if split not in manifest.splits:
            raise unfinished(folder, f"its {MANIFEST} has no {split} split")
        path = check_readable(folder / f"{split}.bin", "the token file")
        count = manifest.splits[split].tokens
        if path.stat().st_size != count * dtype.itemsize:
            raise ValueError(
                f"{path} is truncated or damaged: its manifest says {count:,} tokens of {manifest.dtype}, "
                f"its size {path.stat().st_size:,} bytes; prepare it again"
            )
        parts[split] = [TokenFile(path, 0, count, manifest.dtype)]
    return parts


def llmc_shard(path: Path) -> TokenFile:
    """One llm.c shard: its header checked (magic, version, a token count its size holds)."""
    size = check_readable(path, "the token shard").stat().st_size
    header = np.fromfile(path, dtype="<i4", count=256) if size >= LLMC_HEADER else np.zeros(0, dtype="<i4")
    if len(header) < 256:
        raise ValueError(f"{path} is truncated: {size:,} bytes, less than an llm.c shard's header ({LLMC_HEADER:,})")
    magic, version, count = (int(v) for v in header[:3])
    if magic != LLMC_MAGIC:
        raise ValueError(f"{path} is not an llm.c token shard: magic {magic}, expected {LLMC_MAGIC}")
    if version != LLMC_VERSION:
        raise ValueError(f"{path} is an llm.c shard of version {version}; valid: {LLMC_VERSION} (uint16 GPT-2 tokens)")
    if size != LLMC_HEADER + 2 * count:
        raise ValueError(
            f"{path} is truncated or damaged: its header says {count:,} tokens ({LLMC_HEADER + 2 * count:,} bytes), "
            f"the file has {size:,} bytes"
        )
    return TokenFile(path, LLMC_HEADER, count, "uint16")


def raw_file(path: Path) -> TokenFile:
    """nanoGPT's raw uint16 token file."""
    size = check_readable(path, "the token file").stat().st_size
    if size % 2:
        raise ValueError(f"{path} is truncated: {size:,} bytes, not a whole number of uint16 tokens")
    return TokenFile(path, 0, size // 2, "uint16")


def foreign_files(folder: Path, names: set[str], ids_vocab: int | None) -> tuple[dict[str, list[TokenFile]], str]:
    """The token files of each split of tokens prepared elsewhere, and the split rule: llm.c's shards, else
    nanoGPT's train.bin and val.bin (with `ids_vocab`); test is val where there is no test."""
    shards: dict[str, list[TokenFile]] = {"train": [], "val": []}
    for name in sorted(names):
        if match := LLMC_SHARD.fullmatch(name):
            shards[match.group(1)].append(llmc_shard(folder / name))
    if shards["train"] or shards["val"]:
        for split in ("train", "val"):
            if not shards[split]:
                raise ValueError(f"{folder} has llm.c shards but no {split} shard (*_{split}_*.bin)")
        rule = f"llm.c shards: train = {len(shards['train'])} *_train*.bin, val = {len(shards['val'])} *_val*.bin"
        return {**shards, "test": shards["val"]}, rule + "; test = val"
    if ids_vocab is None:
        raise unfinished(folder, f"no {MANIFEST}; nanoGPT's raw train.bin and val.bin need --ids-vocab N")
    if "val.bin" not in names:
        raise ValueError(f"{folder} has a train.bin but no val.bin; nanoGPT's folder has both")
    files = {split: [raw_file(folder / f"{split}.bin")] for split in ("train", "val")}
    has_test = "test.bin" in names
    files["test"] = [raw_file(folder / "test.bin")] if has_test else files["val"]
    return files, "nanoGPT's train.bin and val.bin" + ("" if has_test else "; test = val")


def check_ids(parts: list[TokenFile], vocab_size: int) -> None:
    """ValueError naming the file of the first token id at or past `vocab_size`, read a block at a time."""
    for part in parts:
        with open(part.path, "rb") as f:
            f.seek(part.offset)
            for _ in range(0, part.count, SCAN_TOKENS):  # a file's size holds its count (llmc_shard, raw_file)
                block = np.fromfile(f, dtype=np.dtype(part.dtype), count=SCAN_TOKENS)
                if (top := int(block.max())) >= vocab_size:
                    raise ValueError(
                        f"{part.path} holds token id {top}, at or past the vocabulary size {vocab_size:,}; "
                        "give the vocabulary size of its tokenizer (--ids-vocab)"
                    )


def check_tokenizer(asked: str, state: dict[str, Any], folder: Path, init_from: str | None) -> None:
    """ValueError naming both unless the run's tokenizer `asked` can be the prepared folder's tokenizer (`state`):
    'char', the default, takes the folder's; a kind must be its kind; a FILE.json (or 'pretrained', the init_from
    folder's) must hold the same tokenizer. Tokens prepared elsewhere (kind ids) take 'char' or 'bpe'."""
    kind = state.get("kind")
    if asked == "char" or asked == kind or (kind == "ids" and asked == "bpe"):
        return
    if kind == "bpe" and (is_tokenizer_file(asked) or asked == "pretrained"):
        path = Path(init_from or "", "tokenizer.json") if asked == "pretrained" else Path(asked)
        if json.loads(file_tokenizer(path).json) == json.loads(state["tokenizer"]):
            return
        asked = str(path)
    raise ValueError(
        f"{folder} was prepared with the {kind} tokenizer (vocabulary {tokenizer_from_state(state).vocab_size:,}), "
        f"not {asked}; drop --tokenizer: a prepared folder brings its own"
    )


def manifest_tokenizer(folder: Path, state: dict[str, Any]) -> Tokenizer:
    """The tokenizer a manifest's state rebuilds; ValueError in one line where it cannot be rebuilt."""
    try:
        return tokenizer_from_state(state)
    except Exception as e:  # a key missing, or the plain Exception tokenizers raises for bad JSON
        raise unfinished(folder, f"the tokenizer of its {MANIFEST} cannot be rebuilt: {first_line(e)}") from None


def load_tokens(
    data: str, tokenizer: str = "char", ids_vocab: int | None = None, init_from: str | None = None
) -> tuple[TokenFolder, Tokenizer, dict[str, TokenFiles]]:
    """A folder of tokens (`is_token_folder`) -> what it is, its tokenizer and a `TokenFiles` per split. A prepared
    folder's tokenizer is its manifest's (`check_tokenizer`); tokens prepared elsewhere are an `IdTokenizer` of
    `ids_vocab` ids (llm.c's: GPT2_VOCAB unless given), every id checked against it. ValueError in one line for
    anything not whole."""
    folder = Path(os.path.expanduser(data))
    if TEMP_FOLDER.fullmatch(folder.name):
        raise unfinished(folder, "the temporary folder of a prepare that did not end")
    names = {entry.name for entry in folder.iterdir()}
    if MANIFEST in names:
        manifest = read_manifest(folder)
        tok = manifest_tokenizer(folder, manifest.tokenizer)
        check_tokenizer(tokenizer, manifest.tokenizer, folder, init_from)
        if ids_vocab is not None:
            raise ValueError(
                f"--ids-vocab is for tokens prepared elsewhere; {folder} names its tokenizer and vocabulary"
            )
        files, rule = prepared_files(folder, manifest), manifest.split_rule
    else:
        files, rule = foreign_files(folder, names, ids_vocab)
        check_tokenizer(tokenizer, {"kind": "ids", "vocab_size": ids_vocab or GPT2_VOCAB}, folder, init_from)
        tok = IdTokenizer(ids_vocab or GPT2_VOCAB)
        check_ids(
            [*files["train"], *files["val"], *(p for p in files["test"] if p not in files["val"])], tok.vocab_size
        )
    splits = {split: TokenFiles(files[split]) for split in SPLITS}
    for split, tokens in splits.items():
        if not len(tokens):
            raise ValueError(f"the {split} split of {folder} has no tokens")
    meta = {"source": str(folder), "split_rule": rule, "tokens": {split: len(t) for split, t in splits.items()}}
    return TokenFolder(str(folder), meta=meta), tok, splits
