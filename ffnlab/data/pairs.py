"""Sentence pairs for classification and regression: two text columns (`--text-field premise,hypothesis`) as one
example (task cls, or reg for a similarity score such as STS-B's).

A corpus holds a pair as one document, its two texts joined by PAIR_JOIN (a control character that no
text keeps: inside either text it becomes a space), so that splitting by hash, deduplication and the
corpus fingerprint treat a pair as they treat any document. `pair_splits` takes it apart again: each
text is encoded on its own by the run's tokenizer and the two are joined as

    first [SEP] second [SEP]

where [SEP] is the `SeparatedTokenizer`'s `sep_id`, an id one past the tokenizer's own vocabulary. No
text encodes to it, whatever the tokenizer (char, byte, bpe or word), so the model always sees where
the first text ends, and the tokenizer is built from the texts alone, never from the joining character.
The trailing [SEP] keeps a pair's end marked where a short example is repeated to fill the context
(ffnlab.data.batches.crop_or_repeat). A pair longer than the context is truncated longest first
(`fit_pair`): tokens come off the end of the longer text until both are equally long, then off both
alike, so a long premise cannot crowd out the hypothesis. An example is never cropped after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ffnlab._util.text import first_few, shorten
from ffnlab.data.tokenizer import SeparatedTokenizer, build_tokenizer, texts_to_build_from

if TYPE_CHECKING:
    from ffnlab.data.batches import Split
    from ffnlab.data.corpus import Corpus

PAIR_TASKS = ("cls", "reg")  # the tasks that read a sentence pair: a label, or a number, per pair
PAIR_JOIN = "\x1f"  # ASCII 'unit separator': joins a pair's two texts in one corpus document
SEPARATORS = 2  # [SEP] ids in an encoded pair: after each text
MIN_PAIR_CONTEXT = SEPARATORS + 2  # a token of each text and its separator: shorter, a pair is separators only


def text_fields(text_field: str) -> list[str]:
    """The columns `text_field` names: one, or two separated by a comma (a sentence pair); ValueError otherwise."""
    names = [name.strip() for name in str(text_field).split(",")]
    if len(names) > 2 or not all(names):
        raise ValueError(
            f"text_field names one text column, or two for a sentence pair (e.g. premise,hypothesis); got "
            f"{len(names):,} name{'s' if len(names) > 1 else ''}: {first_few([repr(n) for n in names])}"
        )
    if len(names) == 2 and names[0] == names[1]:  # a text paired with itself: a typo, not a sentence pair
        raise ValueError(
            f"text_field names the column '{shorten(names[0])}' twice; a sentence pair names two columns "
            "(e.g. premise,hypothesis)"
        )
    return names


def is_pair(text_field: str) -> bool:
    """Whether `text_field` names two columns, a sentence pair."""
    return len(text_fields(text_field)) == 2


def check_pair_task(text_field: str, task: str) -> None:
    """ValueError when `text_field` names a sentence pair for a task that reads one text (PAIR_TASKS read pairs)."""
    if is_pair(text_field) and task not in PAIR_TASKS:
        raise ValueError(
            f"a sentence pair (text_field '{shorten(text_field)}') is for task cls, not {task} (task reg, a number "
            "per pair, reads one too)"
        )


def check_pair_context(context: int) -> None:
    """ValueError unless `context` holds a token of each text and the SEPARATORS (MIN_PAIR_CONTEXT)."""
    if context < MIN_PAIR_CONTEXT:
        raise ValueError(
            f"context {context} is too short for a sentence pair, which needs at least {MIN_PAIR_CONTEXT} positions "
            f"(a token of each text and {SEPARATORS} separators); give --context {MIN_PAIR_CONTEXT} or more"
        )


def join_pair(first: str, second: str) -> str:
    """The corpus document of a pair: the two texts joined by PAIR_JOIN (which either text loses to a space)."""
    return first.replace(PAIR_JOIN, " ") + PAIR_JOIN + second.replace(PAIR_JOIN, " ")


def pair_documents(first: Sequence[Any], second: Sequence[Any], names: Sequence[str], where: str) -> list[str]:
    """Two text columns, row by row, as pair documents (`join_pair`); ValueError naming the first row whose text
    in either column is empty, missing or not text, and how many rows are so: a pair needs both its texts."""
    for name, column in zip(names, (first, second)):
        bad = [i for i, text in enumerate(column) if not isinstance(text, str) or not text.strip()]
        if bad:
            value = column[bad[0]]
            what = (
                "empty" if isinstance(value, str) else "null" if value is None else f"{type(value).__name__}, not text"
            )
            rows = f" ({len(bad):,} rows in all)" if len(bad) > 1 else ""
            raise ValueError(
                f"{where} row {bad[0] + 1}: field '{shorten(name)}' is {what}{rows}; a sentence pair needs both its "
                "texts: fill them in or remove such rows"
            )
    return [join_pair(a, b) for a, b in zip(first, second)]


def split_pair(document: str) -> tuple[str, str]:
    """The two texts of a pair's document (`join_pair`); ValueError for a document that is no pair."""
    first, joined, second = document.partition(PAIR_JOIN)
    if not joined:
        raise ValueError(f"not a sentence pair (no separator): {document[:40]!r}")
    return first, second


def fit_pair(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text a pair keeps within `budget` tokens, longest first.

        both fit:            (first, second)
        otherwise:           keep_first  = min(first, max(budget - second, ceil(budget / 2)))
                             keep_second = min(second, budget - keep_first)

    The shorter text stays whole when it fits in half the budget and the longer one takes the rest;
    otherwise each keeps half, the first text the odd token."""
    budget = max(budget, 0)
    if first + second <= budget:
        return first, second
    keep_first = min(first, max(budget - second, (budget + 1) // 2))
    return keep_first, min(second, budget - keep_first)


def encode_pair(tok: SeparatedTokenizer, document: str, context: int) -> list[int]:
    """A pair's ids, `first [SEP] second [SEP]`, each text truncated from its end by `fit_pair` so that
    the whole fits in `context` tokens."""
    first, second = (tok.encode(text) for text in split_pair(document))
    keep_first, keep_second = fit_pair(len(first), len(second), context - SEPARATORS)
    return [*first[:keep_first], tok.sep_id, *second[:keep_second], tok.sep_id]


def pair_splits(
    corpus: Corpus, kind: str, vocab_size: int | None, folder: str | None, context: int
) -> tuple[SeparatedTokenizer, dict[str, Split]]:
    """A pair corpus's tokenizer and, per split, each example's ids (`encode_pair`) and the labels.

    The tokenizer is built from the pairs' texts as ffnlab.data.load.load_data builds one
    (`texts_to_build_from`), then given its separator id."""
    import torch  # here: the corpus loader (ffnlab.data.corpus) imports this module and needs no torch

    texts = {
        split: [t for doc in corpus.documents(split) for t in split_pair(doc)] for split in ("train", "val", "test")
    }
    built_from = texts_to_build_from(kind, texts["train"], texts["val"], texts["test"])
    tok = SeparatedTokenizer(build_tokenizer(kind, built_from, vocab_size=vocab_size, folder=folder))
    splits: dict[str, Split] = {}
    for split in ("train", "val", "test"):
        ids = [torch.tensor(encode_pair(tok, doc, context), dtype=torch.long) for doc in corpus.documents(split)]
        labels = torch.tensor(corpus.labels(split), dtype=torch.float if corpus.task == "reg" else torch.long)
        splits[split] = (ids, labels)
    return tok, splits
