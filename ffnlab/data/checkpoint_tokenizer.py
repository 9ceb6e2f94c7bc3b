"""A save_pretrained folder's own tokenizer (tokenizer 'pretrained', what `--from` picks when the folder has one),
read as transformers' fine-tuning examples read it, and the examples it encodes.

    has_tokenizer(folder)          whether the folder holds the files of a fast tokenizer (TOKENIZER_FILES)
    read_checkpoint_tokenizer(f)   the folder's tokenizer: transformers' AutoTokenizer, local files only, no remote code
    CheckpointTokenizer            its pipeline (tokenizer.json) and the special ids a model needs: an ffnlab Tokenizer
    checkpoint_splits(...)         the examples of tasks cls (one text or a pair) and tokens, with the template

Text for the LM encodes without special tokens, as `BPETokenizer` encodes any tokenizer.json. An example of task cls
or tokens holds the special tokens of the tokenizer's template ([CLS] a [SEP] b [SEP] for BERT, <s> a for LLaMA,
none for GPT-2), truncated to the context longest first: what `AutoTokenizer(folder)(a, b, truncation=True,
max_length=context)` gives. Batches pad it with `pad_id`, the tokenizer's pad token, else its end-of-text token (as
transformers' examples pad GPT-2 and LLaMA), and the model masks the padding (ffnlab.tools.hf.HFModel). Task tokens
labels the first sub-token of each word with the word's tag and every other token IGNORE_INDEX, as transformers'
token-classification example aligns labels, so the loss and the metrics count each word once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ffnlab._util.reading import JSON_LIMIT, TOKENIZER_LIMIT, check_readable, read_text
from ffnlab._util.text import first_line
from ffnlab.core.model import IGNORE_INDEX
from ffnlab.data.batches import PaddedSplit, Split
from ffnlab.data.pairs import split_pair
from ffnlab.data.tokenizer import BPETokenizer, file_tokenizer

if TYPE_CHECKING:
    from tokenizers import Encoding
    from tokenizers import Tokenizer as HFTokenizer

    from ffnlab.data.corpus import Corpus

# what a fast tokenizer reads its pipeline from, in the order transformers prefers them: tokenizer.json; WordPiece's
# vocab.txt (BERT); byte-level BPE's vocab.json and merges.txt (GPT-2)
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.txt",), ("vocab.json", "merges.txt"))
# and what else AutoTokenizer reads beside them: the class, the special tokens, tokens added to the vocabulary
TOKENIZER_SETTINGS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
ALTERNATIVES = "or give --tokenizer char, byte, bpe, word or a FILE.json, the one the model was pretrained with"


def tokenizer_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The files of the folder's tokenizer that are there (a dangling link too, refused when read): what a run's
    identity hashes of it (ffnlab.tools.pretrained.folder_digest)."""
    names = [name for group in TOKENIZER_FILES for name in group] + list(TOKENIZER_SETTINGS)
    return [Path(folder, name) for name in names if os.path.lexists(Path(folder, name))]


def has_tokenizer(folder: str | os.PathLike[str]) -> bool:
    """Whether the folder holds a fast tokenizer's pipeline: any group of TOKENIZER_FILES whole."""
    return any(all(os.path.lexists(Path(folder, name)) for name in group) for group in TOKENIZER_FILES)


def check_tokenizer_files(folder: str | os.PathLike[str]) -> None:
    """ValueError in one line for a file of the folder's tokenizer that is no regular file (a FIFO would block, a
    dangling link is not passed over) or larger than such a file is; opens none."""
    for path in tokenizer_files(folder):
        check_readable(path, "the tokenizer", JSON_LIMIT if path.name in TOKENIZER_SETTINGS else TOKENIZER_LIMIT)


def check_tokenizer_folder(folder: str | None) -> Path:
    """The folder as a Path; ValueError in one line when it holds no tokenizer (naming the files looked for and the
    alternatives), a file of it is no regular file, its tokenizer.json cannot be read, or its tokenizer_config.json
    asks to run code of its own."""
    if not folder or not has_tokenizer(folder):
        looked_for = ", ".join(" with ".join(group) for group in TOKENIZER_FILES)
        raise ValueError(
            f"tokenizer 'pretrained' is the tokenizer of the folder fine-tuned from (--from); {folder or 'no folder'} "
            f"has none (looked for {looked_for}); save the tokenizer into it (tokenizer.save_pretrained), {ALTERNATIVES}"
        )
    check_tokenizer_files(folder)
    if Path(folder, "tokenizer.json").exists():  # read as any tokenizer.json is, so that its errors read alike
        file_tokenizer(Path(folder, "tokenizer.json"))
    settings = Path(folder, "tokenizer_config.json")
    if settings.exists() and "auto_map" in json_object(settings):
        raise ValueError(
            f"{settings} asks to run Python code that comes with the tokenizer (auto_map); remote code is refused: "
            "ffnlab reads only the tokenizers transformers ships"
        )
    return Path(folder)


def json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object; ValueError in one line naming it where it is no JSON object."""
    try:
        value = json.loads(read_text(path, "the tokenizer", JSON_LIMIT))
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"cannot read the tokenizer {path} ({first_line(e)}); save it again, {ALTERNATIVES}") from None
    if not isinstance(value, dict):
        raise ValueError(f"the tokenizer {path} holds {type(value).__name__}, not a JSON object; save it again")
    return value


def read_checkpoint_tokenizer(folder: str | None) -> CheckpointTokenizer:
    """The folder's own tokenizer as transformers reads it (AutoTokenizer: tokenizer.json, or the vocabulary files of
    a fast tokenizer, and tokenizer_config.json), from local files only and without code of its own; ValueError in
    one line where there is none or it cannot be read."""
    path = check_tokenizer_folder(folder)
    from transformers import AutoTokenizer

    try:
        auto = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # JSON, the tokenizers library's and transformers' own errors, each its own type
        raise ValueError(
            f"cannot read the tokenizer in {path} ({first_line(e)}); save it again, {ALTERNATIVES}"
        ) from None
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: sentencepiece's tokenizer.model without a tokenizer.json
        raise ValueError(
            f"the tokenizer in {path} is {type(auto).__name__}, not a fast tokenizer; save it with a tokenizer.json "
            f"(AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained), {ALTERNATIVES}"
        )
    pad_id = auto.pad_token_id if auto.pad_token_id is not None else auto.eos_token_id
    return CheckpointTokenizer(backend.to_str(), pad_id, segment_sep_id(backend), str(path))


def segment_sep_id(backend: HFTokenizer) -> int | None:
    """The special token that ends a pair's first text where the template gives the second text token type 1 (BERT's
    [SEP]: [CLS] a [SEP] | b [SEP]); None where it gives none, or no special token ends the first text (LLaMA's
    <s> a <s> b has its <s> on the second text's side). A model with token types reads them from it (HFModel)."""
    encoding = backend.encode("a", "b")
    if 1 not in encoding.type_ids:
        return None
    second = encoding.type_ids.index(1)
    return encoding.ids[second - 1] if second and encoding.special_tokens_mask[second - 1] else None


class CheckpointTokenizer(BPETokenizer):
    """A save_pretrained folder's tokenizer (`read_checkpoint_tokenizer`): its pipeline as transformers set it up
    (normaliser, pre-tokenizer, model, template), the id it pads with and the one that ends a pair's first text.
    `encode` gives text without special tokens (the LM's stream); `encode_texts` and `encode_words` give examples
    with the template. Its vocabulary counts added tokens: the model's embedding may be larger, never smaller."""

    kind = "pretrained"

    def __init__(self, tokenizer_json: str, pad_id: int | None, sep_id: int | None = None, source: str = "") -> None:
        super().__init__(tokenizer_json)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.vocab_size = max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self.pad_id = pad_id  # the pad token, else end-of-text; None: neither (the LM needs none)
        self.segment_sep_id = sep_id
        self.source = source  # the folder, for errors (not part of the state: the same pipeline wherever it lies)

    def state(self) -> dict[str, Any]:
        return {
            "kind": "pretrained",
            "tokenizer": self.json,
            "pad_id": self.pad_id,
            "segment_sep_id": self.segment_sep_id,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CheckpointTokenizer:
        return cls(state["tokenizer"], state.get("pad_id"), state.get("segment_sep_id"))

    def template(self, context: int, pair: bool) -> HFTokenizer:
        """The pipeline with its template, truncating to `context` tokens longest first (a copy: `encode`'s has no
        truncation); ValueError in one line where the context cannot hold a token of each text and the template's
        special tokens."""
        from tokenizers import Tokenizer as HFTokenizer

        specials = self.tokenizer.num_special_tokens_to_add(pair)
        if context < specials + 1 + pair:
            raise ValueError(
                f"context {context} is too short for the template of the tokenizer of {self.source or 'the folder'}, "
                f"which adds {specials} special tokens to {'a pair' if pair else 'a text'}; give --context "
                f"{specials + 1 + pair} or more"
            )
        tokenizer = HFTokenizer.from_str(self.json)
        tokenizer.enable_truncation(context, strategy="longest_first")
        return tokenizer

    def padding(self) -> int:
        """The id batches of examples are padded with; ValueError in one line where the tokenizer has none."""
        if self.pad_id is None:
            raise ValueError(
                f"the tokenizer of {self.source or 'the folder'} has neither a pad token nor an end-of-text token to "
                "pad examples with; set its pad_token and save it again"
            )
        return self.pad_id

    def encode_texts(self, texts: Sequence[str] | Sequence[tuple[str, str]], context: int) -> list[list[int]]:
        """Each text, or pair of texts, as the template encodes it ([CLS] a [SEP] b [SEP]), truncated to `context`."""
        pair = bool(texts) and isinstance(texts[0], tuple)
        return [encoding.ids for encoding in self.template(context, pair).encode_batch(list(texts))]

    def encode_words(
        self, sentences: Sequence[Sequence[str]], context: int
    ) -> list[tuple[list[int], list[int | None]]]:
        """Each sentence (its words joined by single spaces) as the template encodes it, truncated to `context`, and
        for each token the index of the word it begins (`word_starts`)."""
        encodings = self.template(context, False).encode_batch([" ".join(words) for words in sentences])
        return [(encoding.ids, word_starts(encoding, words)) for encoding, words in zip(encodings, sentences)]


def word_starts(encoding: Encoding, words: Sequence[str]) -> list[int | None]:
    """For each token of `encoding` (of `words` joined by single spaces), the index of the word whose first token it
    is; None for a later token of a word, a special token, or a token of spaces alone. A token belongs to the word of
    its first character that is no space, read from its offsets: transformers' `word_ids()`, for any pre-tokenizer
    (GPT-2's 'Ġword' and LLaMA's '▁word' carry the space before the word)."""
    owner: list[int] = []  # each character's word, -1 for the space after it
    for i, text in enumerate(words):
        owner += [i] * len(text) + [-1]
    starts: list[int | None] = []
    seen: set[int | None] = {None}
    for (start, end), special in zip(encoding.offsets, encoding.special_tokens_mask):
        word = None if special else next((w for w in owner[start:end] if w >= 0), None)
        starts.append(None if word in seen else word)
        seen.add(word)
    return starts


def checkpoint_splits(
    corpus: Corpus, tok: CheckpointTokenizer, task: str, pair: bool, context: int
) -> dict[str, Split]:
    """Per split (and per further test set, 'test_<name>': MNLI's mismatched dev set), each example encoded with the
    template and its label (`PaddedSplit`, which batches pad with the tokenizer's pad id): task cls (reg) one text or
    a pair (`encode_texts`), task tokens a sentence (`word_labels`)."""
    pad_id = tok.padding()
    sets = {split: (corpus.documents(split), corpus.labels(split) or []) for split in ("train", "val", "test")}
    sets |= {f"test_{name}": (docs, labels) for name, (docs, labels) in corpus.more_tests.items()}
    splits: dict[str, Split] = {}
    for name, (docs, labels) in sets.items():
        if task == "tokens":
            splits[name] = PaddedSplit(*word_labels(tok, docs, labels, context), pad_id)
            continue
        encoded = tok.encode_texts([split_pair(doc) for doc in docs] if pair else docs, context)
        dtype = torch.float if task == "reg" else torch.long  # reg: a number per example, else a class id
        ids = [torch.tensor(example, dtype=torch.long) for example in encoded]
        splits[name] = PaddedSplit(ids, torch.tensor(labels, dtype=dtype), pad_id)
    return splits


def word_labels(
    tok: CheckpointTokenizer, docs: Sequence[str], tags: Sequence[Sequence[int]], context: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Task tokens: each sentence's ids (`encode_words`) and a label per id: its word's tag on the word's first
    sub-token, IGNORE_INDEX on the others and on special tokens (a word truncated away has none)."""
    encoded = tok.encode_words([doc.split(" ") for doc in docs], context)
    ids = [torch.tensor(token_ids, dtype=torch.long) for token_ids, _ in encoded]
    labels = [
        torch.tensor([IGNORE_INDEX if word is None else word_tags[word] for word in starts], dtype=torch.long)
        for (_, starts), word_tags in zip(encoded, tags)
    ]
    return ids, labels
