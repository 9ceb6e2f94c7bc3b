"""Tokenizers: character-level, byte-level, byte-level BPE and word-level, one table from kind to builder.

`build_tokenizer(kind, texts)` makes one; `tok.state()` is a JSON-serialisable dict that goes into
a checkpoint and `tokenizer_from_state(state)` rebuilds the same tokenizer from it. BPE is trained
locally with Hugging Face `tokenizers` and cached on disk, keyed by the texts' sha256 and the vocab
size, in `cache_dir`, else $FFNLAB_CACHE/tokenizers, else ~/.cache/ffnlab/tokenizers. The word
tokenizer (WORD_PATTERN) keeps the most frequent words of the training texts and maps every other
word to `<unk>`, so a loss per token is a loss per word, as in the published WikiText numbers.
`SeparatedTokenizer` gives any of them one id more, which no text encodes to: the separator of a sentence
pair (ffnlab.data.pairs). A save_pretrained folder's own tokenizer ('pretrained') is ffnlab.data.checkpoint_tokenizer's.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from ffnlab._util.files import atomic_path
from ffnlab._util.names import closest
from ffnlab._util.reading import TOKENIZER_LIMIT, read_text
from ffnlab._util.text import first_line, shorten

if TYPE_CHECKING:
    import torch

DEFAULT_BPE_VOCAB = 4096
UNK = "\ufffd"  # what the char tokenizer's <unk> id decodes to: the Unicode replacement character
TokenIds: TypeAlias = "Iterable[int] | np.ndarray | torch.Tensor"  # 1-D: what decode takes


class Tokenizer(Protocol):
    """What the trainer needs from a tokenizer."""

    kind: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...  # same ids as encode, as int64, faster for MBs

    def decode(self, ids: TokenIds) -> str: ...

    def state(self) -> dict[str, Any]: ...  # JSON-serialisable; tokenizer_from_state(state) rebuilds it


def id_list(ids: TokenIds, vocab_size: int) -> list[int]:
    """ids (list, numpy array or torch tensor, 1-D) as a list of ints; ValueError if out of range."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(i for i in ids if not 0 <= i < vocab_size)
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    return ids


class CharTokenizer:
    """One id per character seen in the texts it was built from; id 0 is <unk> for any other."""

    kind = "char"
    unk_id = 0

    def __init__(self, chars: Iterable[str]):
        self.chars = sorted(set(chars))
        self.vocab_size = len(self.chars) + 1
        self.itos = [UNK] + self.chars
        # NOTE: a lookup table over code points turns encoding into one numpy gather; characters
        # past the table's end (code points above the highest known one) map to <unk>
        codes = np.array([ord(c) for c in self.chars], dtype=np.int64)
        self.table = np.zeros(int(codes.max()) + 1 if len(codes) else 1, dtype=np.int64)
        self.table[codes] = np.arange(1, len(codes) + 1)

    def encode_array(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.int64)
        return np.where(codes < len(self.table), self.table[np.minimum(codes, len(self.table) - 1)], self.unk_id)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.encode_array(text).tolist()
        return ids

    def decode(self, ids: TokenIds) -> str:
        return "".join(self.itos[i] for i in id_list(ids, self.vocab_size))

    def state(self) -> dict[str, Any]:
        return {"kind": "char", "chars": "".join(self.chars)}


class ByteTokenizer:
    """The 256 byte values of the text's UTF-8 encoding; decoding replaces invalid sequences with U+FFFD."""

    kind = "byte"
    vocab_size = 256

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", "surrogatepass"))

    def decode(self, ids: TokenIds) -> str:
        return bytes(id_list(ids, 256)).decode("utf-8", errors="replace")

    def state(self) -> dict[str, Any]:
        return {"kind": "byte"}


CHUNK_CHARS = 1 << 16
# NOTE: after a newline that follows a non-space and precedes one, GPT-2's pre-tokenizer regex
# always ends a word; after '  \n' it would not ('\s+(?!\S)' keeps '  ' apart from '\n')
SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def safe_chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Pieces of about `size` characters, cut only where byte-level BPE pre-tokenization splits anyway."""
    start = 0
    while start < len(text):
        cut = SAFE_CUT.search(text, start + size)
        end = cut.start() if cut else len(text)
        yield text[start:end]
        start = end


# NOTE: a text with no safe cut for this long (no line break between words) is cut where it is, so that a stream
# is never held whole; its ids may differ from encode's by a token or two at such a cut
MAX_HELD_CHARS = 1 << 24


def stream_safe_chunks(pieces: Iterable[str], size: int = CHUNK_CHARS) -> Iterator[str]:
    """`safe_chunks(text, size)` of the text that `pieces` make, as they stream: the same chunks, without the
    whole text in memory (but MAX_HELD_CHARS)."""
    held = ""  # text not yet yielded
    for piece in pieces:
        held += piece
        start = 0
        while cut := SAFE_CUT.search(held, start + size):  # a cut at the very end waits for the next character
            yield held[start : cut.start()]
            start = cut.start()
        held = held[start:]
        if len(held) > MAX_HELD_CHARS:
            yield held
            held = ""
    if held:
        yield held


def stream_line_chunks(pieces: Iterable[str], size: int = CHUNK_CHARS) -> Iterator[str]:
    """The text that `pieces` make in chunks of about `size` characters or more, each cut just after a newline
    (where no word of WORD_PATTERN spans the cut), as they stream."""
    held = ""
    for piece in pieces:
        held += piece
        if len(held) >= size and (cut := held.rfind("\n") + 1):
            yield held[:cut]
            held = held[cut:]
    if held:
        yield held


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from Hugging Face `tokenizers`; lossless on any text. Also wraps any tokenizer.json
    (any `tokenizers` model), encoding without its special tokens."""

    kind = "bpe"

    def __init__(self, tokenizer_json: str):
        from tokenizers import Tokenizer as HFTokenizer

        self.json = tokenizer_json
        self.tokenizer = HFTokenizer.from_str(tokenizer_json)
        # NOTE: can be below the vocab size asked for when the texts have fewer distinct merges
        self.vocab_size = self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        if len(text) <= CHUNK_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        # one long encode runs on one core (10 s for 5 MB); chunks cut where the byte-level
        # pre-tokenizer splits anyway encode in parallel to the same ids
        encodings = self.tokenizer.encode_batch(list(safe_chunks(text, CHUNK_CHARS)), add_special_tokens=False)
        return [i for encoding in encodings for i in encoding.ids]

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids: TokenIds) -> str:
        return self.tokenizer.decode(id_list(ids, self.vocab_size))

    def state(self) -> dict[str, Any]:
        return {"kind": "bpe", "tokenizer": self.json}


def texts_hash(texts: list[str]) -> str:
    """sha256 hex of a list of texts, length-prefixed so ['ab'] and ['a', 'b'] differ."""
    h = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """$FFNLAB_CACHE/tokenizers, else ~/.cache/ffnlab/tokenizers."""
    root = os.environ.get("FFNLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ffnlab")
    return Path(root) / "tokenizers"


TRAIN_CHUNK_CHARS = 1 << 12
# NOTE: the BPE trainer's time grows with the square of a word's length (tokenizers 0.23, 4096 merges: one
# word of 50,000 characters 1.5 s, 100,000 6 s, 500,000 minutes, and Ctrl-C waits for it); below a few
# thousand characters it is linear. No real word is MAX_TRAIN_WORD characters long.
MAX_TRAIN_WORD = 1000
LONG_RUN = re.compile(rf"(?<!\S)\S{{{MAX_TRAIN_WORD},}}|(?<!\s)\s{{{MAX_TRAIN_WORD},}}")


def short_runs(chunk: str) -> Iterator[str]:
    """`chunk` (from `safe_chunks`) for training: its runs of MAX_TRAIN_WORD or more non-space (or space)
    characters cut into pieces of that length. A chunk cut within MAX_TRAIN_WORD characters past its size, as
    ordinary text gives, passes whole: its runs are short enough, and searching every chunk would slow
    training by a sixth."""
    if len(chunk) <= TRAIN_CHUNK_CHARS + MAX_TRAIN_WORD:
        yield chunk
        return
    start = 0
    for run in LONG_RUN.finditer(chunk):
        yield chunk[start : run.start()]
        long = run.group()
        yield from (long[i : i + MAX_TRAIN_WORD] for i in range(0, len(long), MAX_TRAIN_WORD))
        start = run.end()
    yield chunk[start:]


def train_bpe(texts: list[str], vocab_size: int) -> str:
    """Train a byte-level BPE on `texts`; its JSON (tokenizers' own format)."""
    # chunks, not whole texts, so training uses every core; cut where encoding splits words too, so
    # training counts exactly the words that encode() will see (but runs longer than any word: short_runs)
    chunks = (chunk for text in texts for chunk in safe_chunks(text, TRAIN_CHUNK_CHARS))
    return train_bpe_chunks(chunks, vocab_size)


def train_bpe_chunks(chunks: Iterable[str], vocab_size: int) -> str:
    """`train_bpe` on texts already cut by `safe_chunks(text, TRAIN_CHUNK_CHARS)`, as they stream."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator((piece for chunk in chunks for piece in short_runs(chunk)), trainer)
    return tokenizer.to_str()


def build_bpe(texts: list[str], vocab_size: int, cache_dir: str | None) -> BPETokenizer:
    """A BPE tokenizer from the on-disk cache, or trained and then cached (written atomically)."""
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    path = folder / f"bpe-{vocab_size}-{texts_hash(texts)[:24]}.json"
    if path.is_file():
        try:
            return BPETokenizer(read_text(path, "the cached tokenizer", TOKENIZER_LIMIT))
        except Exception:  # a damaged (or huge) cache file is retrained and replaced, never trusted
            pass
    tokenizer_json = train_bpe(texts, vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(tokenizer_json, encoding="utf-8")
    return BPETokenizer(tokenizer_json)


# NOTE: WikiText's own tokens come out whole, so on its pre-tokenized text this is (almost) its split
# on spaces: '<unk>'; '@-@', '@,@' and '@.@', its escaped hyphen, comma and point ('1 @,@ 000');
# the clitics "'s", "'t", "'re", "'ve", "'m", "'ll", "'d" (GPT-2's list; "king's" and WikiText's
# "king 's" give the same two tokens). A word is a run of letters, digits and underscores in any script,
# inner points included ('Media.Vision', '3.5'); any other non-space character is a token of its own
# ('...' is three); each newline is a token (the published setups' <eos> per line), other whitespace
# only separates. Case is kept, as WikiText keeps it. Where it differs from WikiText: a final point
# of an abbreviation ('U.S.', 'H.') is a token of its own.
WORD_PATTERN = re.compile(r"<unk>|@[-,.]@|(?i:'(?:s|t|re|ve|m|ll|d))\b|\w+(?:\.\w+)*|[^\w\s]|\n")
WORD_UNK = "<unk>"  # id 0: words outside the vocabulary, and WikiText's own <unk>
MAX_WORD_VOCAB = 1_000_000  # WikiText-103 has 267,735 words; past this the embeddings dwarf the FFNs compared


def split_words(text: str) -> Iterator[str]:
    """The words of `text` by WORD_PATTERN, matched in pieces cut after a newline (no word spans one)."""
    start = 0
    while start < len(text):
        cut = text.find("\n", start + CHUNK_CHARS)
        end = len(text) if cut < 0 else cut + 1
        yield from WORD_PATTERN.findall(text, start, end)
        start = end


def check_word_vocab(size: int) -> None:
    """ValueError unless `size` is a word vocabulary size: 2 (<unk> and one word) to MAX_WORD_VOCAB."""
    if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= MAX_WORD_VOCAB:
        raise ValueError(f"word_vocab must be an integer from 2 (<unk> and one word) to {MAX_WORD_VOCAB:,}, got {size}")


class WordTokenizer:
    """One id per word (WORD_PATTERN) of a fixed vocabulary, id 0 `<unk>` for any other; lossy: decoding
    joins the words with single spaces (no spaces around newlines) and unknown words come back as <unk>."""

    kind = "word"
    unk_id = 0

    def __init__(self, words: list[str]):
        self.itos = [WORD_UNK, *words]
        self.vocab_size = len(self.itos)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def from_texts(cls, texts: list[str], vocab_size: int | None = None) -> WordTokenizer:
        """The `vocab_size - 1` most frequent words of `texts` and <unk> (None: every word); ties go to the
        word first in code-point order, so the vocabulary is the same on every machine."""
        counts = Counter(w for text in texts for w in split_words(text))
        if not counts.keys() - {"\n", WORD_UNK}:
            raise ValueError("the training text has no words (only whitespace and <unk>) to build a vocabulary from")
        return cls.from_counts(counts, vocab_size)

    @classmethod
    def from_counts(
        cls, counts: Counter[str], vocab_size: int | None = None, reserved: tuple[str, ...] = ()
    ) -> WordTokenizer:
        """<unk>, the `reserved` words (ids 1, 2, ...) and the most frequent of `counts` up to `vocab_size` words in
        all (None: every word); ties go to the word first in code-point order, so the vocabulary is the same on
        every machine. A counted <unk> (WikiText's own) or reserved word is ours, whatever its count."""
        counts = Counter({w: n for w, n in counts.items() if w != WORD_UNK and w not in reserved})
        ranked = sorted(counts, key=lambda w: (-counts[w], w))
        kept = ranked if vocab_size is None else ranked[: max(0, vocab_size - 1 - len(reserved))]
        return cls([*reserved, *kept])

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(w, self.unk_id) for w in split_words(text)]

    def encode_array(self, text: str) -> np.ndarray:
        return np.fromiter((self.stoi.get(w, self.unk_id) for w in split_words(text)), dtype=np.int64)

    def decode(self, ids: TokenIds) -> str:
        return re.sub(r" ?\n ?", "\n", " ".join(self.itos[i] for i in id_list(ids, self.vocab_size)))

    def state(self) -> dict[str, Any]:
        return {"kind": "word", "words": self.itos[1:]}


class IdTokenizer:
    """The tokenizer of tokens prepared elsewhere (llm.c's shards, nanoGPT's train.bin) whose tokenizer is not known:
    only its vocabulary size; decoding shows the ids, and there is no text to encode."""

    kind = "ids"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        raise ValueError("tokens prepared elsewhere come without their tokenizer: there is no text to encode")

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids: TokenIds) -> str:
        return " ".join(map(str, id_list(ids, self.vocab_size)))

    def state(self) -> dict[str, Any]:
        return {"kind": "ids", "vocab_size": self.vocab_size}


SEP_TEXT = " [SEP] "  # how a SeparatedTokenizer decodes its separator id


class SeparatedTokenizer:
    """A tokenizer with one id more, `sep_id` (the base tokenizer's vocab_size), that no text encodes to:
    the separator of a sentence pair (ffnlab.data.pairs), distinct whatever the base tokenizer's kind.
    Text encodes as the base encodes it; decoding shows the separator as SEP_TEXT."""

    def __init__(self, base: Tokenizer):
        self.base = base
        self.kind = base.kind
        self.sep_id = base.vocab_size
        self.vocab_size = base.vocab_size + 1

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        return self.base.encode_array(text)

    def decode(self, ids: TokenIds) -> str:
        pieces: list[str] = []
        run: list[int] = []
        for i in id_list(ids, self.vocab_size):
            if i == self.sep_id:
                pieces += [self.base.decode(run), SEP_TEXT]
                run = []
            else:
                run.append(i)
        return "".join([*pieces, self.base.decode(run)])

    def state(self) -> dict[str, Any]:
        return {**self.base.state(), "separator": True}


TOKENIZERS = ("char", "byte", "bpe", "word")  # built from texts; 'pretrained' reads a save_pretrained folder's own
# tokenizer, and a name ending in .json is a tokenizer saved by `tokenizers` (GPT-2's or LLaMA's tokenizer.json)


def is_tokenizer_file(name: str) -> bool:
    """Whether a tokenizer name is a file (FILE.json, `file_tokenizer`) rather than a kind."""
    return name.lower().endswith(".json")


def check_tokenizer_name(name: str) -> str:
    """`name` if it names a tokenizer (TOKENIZERS, 'pretrained' or a FILE.json); ValueError in one line otherwise."""
    valid = (*TOKENIZERS, "pretrained")
    if name not in valid and not is_tokenizer_file(name):
        raise ValueError(
            f"unknown tokenizer '{shorten(name)}'{closest(name, valid)}; valid: {', '.join(valid)}, or a "
            "tokenizer.json file (FILE.json)"
        )
    return name


def file_tokenizer(path: str | os.PathLike[str]) -> BPETokenizer:
    """The tokenizer saved by `tokenizers` in the file `path` (GPT-2's or LLaMA's tokenizer.json); ValueError in one
    line naming it if it cannot be read."""
    text = read_text(path, "the tokenizer", TOKENIZER_LIMIT)
    try:
        return BPETokenizer(text)
    except Exception as e:  # the plain Exception tokenizers raises for bad JSON
        raise ValueError(
            f"cannot read the tokenizer {path} ({first_line(e)}); save it again, or use --tokenizer char, byte, bpe or word"
        ) from None


def texts_to_build_from(kind: str, train: list[str], val: list[str], test: list[str]) -> list[str]:
    """The texts `build_tokenizer` builds a `kind` tokenizer from: every split's for 'char' (so val and test
    have no <unk>), the training split's for the others."""
    return [*train, *val, *test] if kind == "char" else train


def build_tokenizer(
    kind: str,
    texts: list[str],
    vocab_size: int | None = None,
    cache_dir: str | None = None,
    folder: str | None = None,
) -> Tokenizer:
    """A tokenizer of `kind` for `texts` (pass every split for 'char', so val/test have no <unk>).

    vocab_size is for 'bpe' (default DEFAULT_BPE_VOCAB, at least 257) and 'word' (<unk> included, 2 to
    MAX_WORD_VOCAB; default every word of the texts); 'char' takes its size from the texts and 'byte' is
    always 256; 'pretrained' is the tokenizer of the save_pretrained `folder` (ffnlab.data.checkpoint_tokenizer); a
    FILE.json is that file's (`file_tokenizer`).
    """
    if kind == "pretrained":
        from ffnlab.data.checkpoint_tokenizer import read_checkpoint_tokenizer  # here: it builds on this module

        return read_checkpoint_tokenizer(folder)
    if is_tokenizer_file(check_tokenizer_name(kind)):
        if vocab_size is not None:
            raise ValueError(f"vocab_size is for the 'bpe' and 'word' tokenizers only; {kind} sets its own")
        return file_tokenizer(kind)
    texts = [texts] if isinstance(texts, str) else list(texts)
    if kind not in ("bpe", "word") and vocab_size is not None:
        raise ValueError(f"vocab_size is for the 'bpe' and 'word' tokenizers only; '{kind}' sets its own")
    if kind == "byte":
        return ByteTokenizer()
    if not any(texts):
        raise ValueError(f"no text to build a '{kind}' tokenizer from")
    if kind == "char":
        return CharTokenizer(set().union(*map(set, texts)))
    if kind == "word":
        if vocab_size is not None:
            check_word_vocab(vocab_size)
        return WordTokenizer.from_texts(texts, vocab_size)
    return build_bpe(texts, check_bpe_vocab(vocab_size), cache_dir)


def check_bpe_vocab(vocab_size: int | None) -> int:
    """A BPE vocabulary size (None: DEFAULT_BPE_VOCAB); ValueError unless it is an integer above 256."""
    vocab_size = DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size
    if not isinstance(vocab_size, int) or vocab_size <= 256:
        raise ValueError(f"bpe vocab_size must be an integer above 256 (the byte alphabet), got {vocab_size}")
    return vocab_size


def tokenizer_from_state(state: dict[str, Any]) -> Tokenizer:
    """The tokenizer whose `state()` this is."""
    if isinstance(state, dict) and state.get("separator"):  # a SeparatedTokenizer: its base, and the separator
        return SeparatedTokenizer(tokenizer_from_state({k: v for k, v in state.items() if k != "separator"}))
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind == "char":
        return CharTokenizer(state["chars"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer(state["tokenizer"])
    if kind == "word":
        return WordTokenizer(state["words"])
    if kind == "ids":
        return IdTokenizer(state["vocab_size"])
    if kind == "pretrained":
        from ffnlab.data.checkpoint_tokenizer import CheckpointTokenizer  # here: it builds on this module

        return CheckpointTokenizer.from_state(state)
    raise ValueError(f"not a tokenizer state (kind {kind!r}); valid kinds: {', '.join(TOKENIZERS)}")
