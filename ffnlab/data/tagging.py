"""Token classification (task 'tokens'): tagged sentences, their word vocabulary and batches, span F1.

A `Sentence` is words and one tag each, with where it came from (a file and line, or a dataset row) for
errors. `parse_conll` reads CoNLL-style text: a word and its tag per line, the tag the LAST of the
whitespace-separated columns (CoNLL-2003's POS and chunk columns in between are ignored), a blank line
between sentences, `-DOCSTART-` lines skipped. Tags are BIO or IOB2 (`O`, `B-TYPE`, `I-TYPE`; IOBES's
`E-` and `S-` are read too). `speaker_sentences` derives the offline task of the bundled plays: speaker
names mentioned in the speeches (see its docstring).

Each word is one input position: `word_vocabulary` keeps the training split's words (<unk> for any
other, <pad> for padding), `tagged_batch` pads or truncates sentences to the context with tag
IGNORE_INDEX where there is no word, so padding counts in neither the loss nor the metrics. `span_f1`
is seqeval's default (conlleval-compatible) micro F1 over entities, `spans` its chunking.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ffnlab._util.names import check_ids
from ffnlab._util.text import first_few, shorten
from ffnlab.core.model import IGNORE_INDEX
from ffnlab.data.tokenizer import WordTokenizer, split_words

TAG = re.compile(r"O|[BIES]-\S+")  # BIO / IOB2 (and IOBES): O, or a position and an entity type
PAD = "<pad>"  # the padding word: id 1, after <unk>, in every tagging vocabulary
PAD_ID = 1
SENTENCE_WORDS = 64  # the bundled task cuts speeches into sentences of at most this many words


@dataclass(frozen=True)
class Sentence:
    """One tagged sentence and where it came from."""

    words: tuple[str, ...]
    tags: tuple[str, ...]  # one per word
    source: str  # a file path, or 'dataset [split] row N'
    line: int | None = None  # a file's line of the first word (then word i is on line + i)

    def at(self, i: int) -> str:
        """Where word i is: 'train.txt line 12' or 'conll2003 [train] row 3, word 2'."""
        return f"{self.source} line {self.line + i}" if self.line is not None else f"{self.source}, word {i + 1}"

    @property
    def text(self) -> str:
        """The words joined by single spaces: the sentence as a corpus document (words hold no whitespace)."""
        return " ".join(self.words)


def check_tag(tag: str, where: str) -> None:
    """ValueError naming `where` unless `tag` is a BIO tag."""
    if not TAG.fullmatch(tag):
        raise ValueError(
            f"{where}: tag '{shorten(tag)}' is not a BIO tag (O, B-TYPE, I-TYPE; E- and S- also read); "
            "the tag is a line's last column"
        )


def parse_conll(text: str, source: str) -> list[Sentence]:
    """The tagged sentences of CoNLL-style text (module doc); ValueError naming `source` and the line of a
    line with a word but no tag, or a tag that is not BIO."""
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    first = 0
    for n, line in enumerate(text.split("\n"), 1):
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if words:
                sentences.append(Sentence(tuple(words), tuple(tags), source, first))
            words, tags = [], []
            continue
        if len(columns) < 2:
            raise ValueError(
                f"{source} line {n}: '{shorten(line.strip())}' has a word but no tag; a CoNLL line is a word, "
                "optional columns, and its tag last, separated by whitespace"
            )
        check_tag(columns[-1], f"{source} line {n}")
        if not words:
            first = n
        words.append(columns[0])
        tags.append(columns[-1])
    if words:
        sentences.append(Sentence(tuple(words), tuple(tags), source, first))
    if not sentences:
        raise ValueError(f"{source} has no tagged sentences (a word and its tag per line)")
    return sentences


def row_sentence(words: Sequence[Any], tags: Sequence[Any], names: Sequence[str] | None, where: str) -> Sentence:
    """A dataset row's sentence: its words and tags (ids into `names`, ClassLabel's, or tag strings).

    NOTE: a word is one position and a sentence is stored as its words joined by spaces, so whitespace
    inside a word becomes '_' (and an empty word is '_')."""
    for what, values, flag in (("words", words, "--text-field"), ("tags", tags, "--label-field")):
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise ValueError(
                f"{where}: the {what} are {type(values).__name__} {shorten(repr(values), 40)}, not a list; "
                f"name the column of {what} with {flag}"
            )
    if len(words) != len(tags):
        raise ValueError(f"{where}: {len(words)} words but {len(tags)} tags")
    if names is not None:
        check_ids(tags, names, where, "tag", ("tag", "tags"))
        tags = [names[t] for t in tags]
    for i, tag in enumerate(tags):
        check_tag(str(tag), f"{where}, word {i + 1}")
    return Sentence(tuple(re.sub(r"\s+", "_", str(w)) or "_" for w in words), tuple(map(str, tags)), where)


def tag_index(train: Sequence[Sentence], others: Sequence[Sentence]) -> dict[str, int]:
    """Tag -> id, the tags of the training sentences sorted; ValueError naming the word, file and line of
    the first tag in `others` (val and test) that training never has."""
    tags = sorted({t for s in train for t in s.tags})
    index = {tag: i for i, tag in enumerate(tags)}
    for sentence in others:
        for i, tag in enumerate(sentence.tags):
            if tag not in index:
                raise ValueError(
                    f"{sentence.at(i)}: tag '{shorten(tag)}' (word '{shorten(sentence.words[i])}') is not in the "
                    f"training split, whose {len(tags):,} tags are {first_few(tags)}; the tag set is read from the "
                    "training split"
                )
    return index


def check_spans(train: Sequence[Sentence], where: str) -> None:
    """ValueError naming `where` unless some training sentence holds an entity (`spans`): where every tag is
    O there is nothing to find, and span F1 is 0/0, undefined (it would rank every tagger as a tie)."""
    if not any(spans(sentence.tags) for sentence in train):
        raise ValueError(
            f"{where}: the training split's {len(train):,} sentences hold no entity span (every tag is O), so span "
            "F1 is undefined; tag the entities (B-TYPE, I-TYPE), or give task cls a label per sentence"
        )


# ---- the bundled task: speaker names in the plays ----------------------------------------------------

SPEAKER = re.compile(r"[A-Z][A-Z0-9 .,'&-]*:")  # a speaker line of the plays' plain text: 'FIRST CITIZEN:'


def speaker_sentences(play: str, text: str) -> list[Sentence]:
    """The speaker-name task of one play's plain text (`ffnlab.data.corpus.strip_markdown`'s), derived by rule.

    - A speech is a block (between blank lines) whose first line is a speaker line ('LADY MACBETH:'); its
      other lines are the speech. Stage directions in blocks of their own are left out.
    - A name word is a word of a speaker line, capitalised ('Lady', 'Macbeth'), that never occurs in lower
      case in the play: 'Macbeth', not 'Lady'.
    - Words are the word tokenizer's (WORD_PATTERN: punctuation apart, "'s" a word); a speech is cut on
      line boundaries into sentences of at most SENTENCE_WORDS words (a longer line by words).
    - A run of name words is one mention, tagged B-SPK then I-SPK ('Sir Toby Belch' gives O B-SPK
      I-SPK where 'sir' occurs in lower case); every other word is O.
    - Only sentences that mention a name are kept. NOTE: that makes mentions about 4% of the words
      rather than 1%, so a small model finds them within a quick preset's budget (with every sentence,
      150 steps of the quick preset still tag every word O: F1 0).
    """
    blocks = [block.split("\n") for block in text.split("\n\n")]
    speeches = [lines[1:] for lines in blocks if len(lines) > 1 and SPEAKER.fullmatch(lines[0])]
    speakers = {lines[0][:-1] for lines in blocks if len(lines) > 1 and SPEAKER.fullmatch(lines[0])}
    lower = {w for w in split_words(text) if w.islower()}
    names = {w for s in speakers for w in split_words(s.title()) if w[0].isalpha() and w.lower() not in lower}
    sentences = []
    for n, speech in enumerate(speeches, 1):
        for words in cut_words([[w for w in split_words(line) if w != "\n"] for line in speech], SENTENCE_WORDS):
            tags = [
                ("I-SPK" if i and words[i - 1] in names else "B-SPK") if w in names else "O"
                for i, w in enumerate(words)
            ]
            if "B-SPK" in tags:
                sentences.append(Sentence(tuple(words), tuple(tags), f"{play} speech {n}"))
    return sentences


def cut_words(lines: list[list[str]], limit: int) -> list[list[str]]:
    """Consecutive lines of words packed into pieces of at most `limit` words; a longer line is cut by words."""
    pieces: list[list[str]] = [[]]
    for line in lines:
        for start in range(0, len(line), limit):
            part = line[start : start + limit]
            if len(pieces[-1]) + len(part) > limit:
                pieces.append([])
            pieces[-1] += part
    return [piece for piece in pieces if piece]


# ---- words to ids, sentences to batches ----------------------------------------------------------


def word_vocabulary(sentences: Sequence[Sequence[str]], vocab_size: int | None = None) -> WordTokenizer:
    """<unk>, <pad> and the `vocab_size - 2` most frequent words of `sentences` (None: every word), ties in
    code-point order, so the vocabulary is the same on every machine; the word tokenizer's table."""
    vocab = WordTokenizer.from_counts(Counter(w for words in sentences for w in words), vocab_size, reserved=(PAD,))
    assert vocab.stoi[PAD] == PAD_ID
    return vocab


def word_ids(vocab: WordTokenizer, words: Sequence[str]) -> torch.Tensor:
    """The ids of a sentence's words, one each (<unk> for a word outside the vocabulary)."""
    return torch.tensor([vocab.stoi.get(w, vocab.unk_id) for w in words], dtype=torch.long)


def tagged_batch(
    docs: Sequence[torch.Tensor], tags: Sequence[torch.Tensor], pick: Sequence[int], context: int, pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sentences `pick` as word ids (B, T) padded with `pad_id` (<pad>'s; a pretrained tokenizer's for its
    sub-word ids) and tag ids (B, T) padded with IGNORE_INDEX; a sentence longer than the context is truncated to
    its first `context` positions."""
    x = torch.full((len(pick), context), pad_id, dtype=torch.long)
    y = torch.full((len(pick), context), IGNORE_INDEX, dtype=torch.long)
    for row, i in enumerate(pick):
        n = min(context, len(docs[i]))
        x[row, :n], y[row, :n] = docs[i][:n], tags[i][:n]
    return x, y


# ---- metrics -----------------------------------------------------------------------------------------


def chunk_ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """seqeval's end_of_chunk: whether an entity ended at the previous word."""
    return (
        prev_tag in ("E", "S")
        or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
        or (prev_tag not in ("O", ".") and prev_type != type_)
    )


def chunk_starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """seqeval's start_of_chunk: whether an entity starts at this word."""
    return (
        tag in ("B", "S")
        or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
        or (tag not in ("O", ".") and prev_type != type_)
    )


def spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one sentence's tags as (type, first word, last word), chunked as seqeval's default
    mode (and conlleval) chunks: an I- after O or after another type starts an entity (IOB1 reads too)."""
    found = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, chunk in enumerate([*tags, "O"]):
        tag, type_ = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if chunk_ends(prev_tag, tag, prev_type, type_):
            found.append((prev_type, begin, i - 1))
        if chunk_starts(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return found


def span_f1(true: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float | None:
    """Micro-averaged span F1 over sentences, as seqeval.metrics.f1_score computes it: an entity counts when
    its type, first and last word all match; 0.0 where none is found. None where `true` has no entity: the
    recall is 0/0 there, so F1 is undefined (seqeval says 0.0 with a warning, which would rank as a tie)."""
    if len(true) != len(pred) or any(len(t) != len(p) for t, p in zip(true, pred)):
        raise ValueError("span_f1 needs one predicted tag per true tag, sentence by sentence")
    gold = {(n, *span) for n, tags in enumerate(true) for span in spans(tags)}
    if not gold:
        return None
    found = {(n, *span) for n, tags in enumerate(pred) for span in spans(tags)}
    hits = len(gold & found)
    if not hits:
        return 0.0
    precision, recall = hits / len(found), hits / len(gold)
    return 2 * precision * recall / (precision + recall)
