"""Tokenizers: character-level, byte-level and byte-level BPE, one table from kind to builder.

`build_tokenizer(kind, texts)` makes one; `tok.state()` is a JSON-serialisable dict that goes into
a checkpoint and `tokenizer_from_state(state)` rebuilds the same tokenizer from it. BPE is trained
locally with Hugging Face `tokenizers` and cached on disk, keyed by the texts' sha256 and the vocab
size, in `cache_dir`, else $FFNLAB_CACHE/tokenizers, else ~/.cache/ffnlab/tokenizers.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Protocol

import numpy as np

from ffnlab._util.files import atomic_path
from ffnlab._util.names import closest
from ffnlab._util.text import first_line

DEFAULT_BPE_VOCAB = 4096
UNK = "\ufffd"  # what the char tokenizer's <unk> id decodes to: the Unicode replacement character


class Tokenizer(Protocol):
    """What the trainer needs from a tokenizer."""

    kind: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...  # same ids as encode, as int64, faster for MBs

    def decode(self, ids) -> str: ...

    def state(self) -> dict: ...  # JSON-serialisable; tokenizer_from_state(state) rebuilds it


def id_list(ids, vocab_size: int) -> list[int]:
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

    def __init__(self, chars):
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
        return self.encode_array(text).tolist()

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in id_list(ids, self.vocab_size))

    def state(self) -> dict:
        return {"kind": "char", "chars": "".join(self.chars)}


class ByteTokenizer:
    """The 256 byte values of the text's UTF-8 encoding; decoding replaces invalid sequences with U+FFFD."""

    kind = "byte"
    vocab_size = 256

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", "surrogatepass"))

    def decode(self, ids) -> str:
        return bytes(id_list(ids, 256)).decode("utf-8", errors="replace")

    def state(self) -> dict:
        return {"kind": "byte"}


CHUNK_CHARS = 1 << 16
# NOTE: after a newline that follows a non-space and precedes one, GPT-2's pre-tokenizer regex
# always ends a word; after '  \n' it would not ('\s+(?!\S)' keeps '  ' apart from '\n')
SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def safe_chunks(text: str, size: int = CHUNK_CHARS):
    """Pieces of about `size` characters, cut only where byte-level BPE pre-tokenization splits anyway."""
    start = 0
    while start < len(text):
        cut = SAFE_CUT.search(text, start + size)
        end = cut.start() if cut else len(text)
        yield text[start:end]
        start = end


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from Hugging Face `tokenizers`; lossless on any text. Also wraps a
    pretrained folder's tokenizer.json (any `tokenizers` model), without its special tokens."""

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

    def decode(self, ids) -> str:
        return self.tokenizer.decode(id_list(ids, self.vocab_size))

    def state(self) -> dict:
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


def train_bpe(texts: list[str], vocab_size: int) -> str:
    """Train a byte-level BPE on `texts`; its JSON (tokenizers' own format)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    # chunks, not whole texts, so training uses every core; cut where encoding splits words too,
    # so training counts exactly the words that encode() will see
    chunks = (chunk for text in texts for chunk in safe_chunks(text, 1 << 12))
    tokenizer.train_from_iterator(chunks, trainer)
    return tokenizer.to_str()


def build_bpe(texts: list[str], vocab_size: int, cache_dir: str | None) -> BPETokenizer:
    """A BPE tokenizer from the on-disk cache, or trained and then cached (written atomically)."""
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    path = folder / f"bpe-{vocab_size}-{texts_hash(texts)[:24]}.json"
    if path.is_file():
        try:
            return BPETokenizer(path.read_text(encoding="utf-8"))
        except Exception:  # a damaged cache file is retrained and replaced, never trusted
            pass
    tokenizer_json = train_bpe(texts, vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(tokenizer_json, encoding="utf-8")
    return BPETokenizer(tokenizer_json)


TOKENIZERS = ("char", "byte", "bpe")  # built from texts; 'pretrained' reads a folder's tokenizer.json


def folder_tokenizer(folder: str | None) -> BPETokenizer:
    """The tokenizer.json of a save_pretrained folder; ValueError if it has none or it cannot be read."""
    path = Path(folder or "") / "tokenizer.json"
    if not folder or not path.is_file():
        raise ValueError(
            f"tokenizer 'pretrained' reads the tokenizer.json of the folder fine-tuned from (--from); "
            f"{folder or 'no folder'} has none; use char, byte or bpe"
        )
    try:
        return BPETokenizer(path.read_text(encoding="utf-8"))
    except Exception as e:  # OSError, UnicodeDecodeError, or the plain Exception tokenizers raises for bad JSON
        raise ValueError(
            f"cannot read the tokenizer {path} ({first_line(e)}); save it again, or use --tokenizer char, byte or bpe"
        ) from None


def build_tokenizer(
    kind: str,
    texts: list[str],
    vocab_size: int | None = None,
    cache_dir: str | None = None,
    folder: str | None = None,
) -> Tokenizer:
    """A tokenizer of `kind` for `texts` (pass every split for 'char', so val/test have no <unk>).

    vocab_size is for 'bpe' only (default DEFAULT_BPE_VOCAB, at least 257); 'char' takes its size
    from the texts and 'byte' is always 256; 'pretrained' is the tokenizer.json in `folder`.
    """
    if kind == "pretrained":
        return folder_tokenizer(folder)
    if kind not in TOKENIZERS:
        valid = (*TOKENIZERS, "pretrained")
        raise ValueError(f"unknown tokenizer '{kind}'{closest(str(kind), valid)}; valid: {', '.join(valid)}")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if kind != "bpe" and vocab_size is not None:
        raise ValueError(f"vocab_size is for the 'bpe' tokenizer only; '{kind}' sets its own")
    if kind == "byte":
        return ByteTokenizer()
    if not any(texts):
        raise ValueError(f"no text to build a '{kind}' tokenizer from")
    if kind == "char":
        return CharTokenizer(set().union(*map(set, texts)))
    vocab_size = DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size
    if not isinstance(vocab_size, int) or vocab_size <= 256:
        raise ValueError(f"bpe vocab_size must be an integer above 256 (the byte alphabet), got {vocab_size}")
    return build_bpe(texts, vocab_size, cache_dir)


def tokenizer_from_state(state: dict) -> Tokenizer:
    """The tokenizer whose `state()` this is."""
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind == "char":
        return CharTokenizer(state["chars"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer(state["tokenizer"])
    raise ValueError(f"not a tokenizer state (kind {kind!r}); valid kinds: {', '.join(TOKENIZERS)}")
