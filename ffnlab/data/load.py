"""A run's data in tensors: the corpus loaded, its tokenizer built and each split encoded (`load_data`).

The corpus comes from `ffnlab.data.corpus`, the tokenizer from `ffnlab.data.tokenizer`; sentence pairs
are encoded by `ffnlab.data.pairs`, tagged sentences by `ffnlab.data.tagging`, images loaded by
`ffnlab.data.images`; a folder of tokens (`ffnlab data prepare`'s, llm.c's shards, nanoGPT's train.bin) is read
through a memory map by `ffnlab.data.prepared`. What each split becomes is a `ffnlab.data.batches.Split`.
"""

from __future__ import annotations

import functools

import torch

from ffnlab.data.batches import Split
from ffnlab.data.checkpoint_tokenizer import checkpoint_splits, read_checkpoint_tokenizer
from ffnlab.data.corpus import Corpus, load_corpus
from ffnlab.data.images import ImageSet, PixelInput, load_images
from ffnlab.data.pairs import encode_pair, is_pair, pair_splits
from ffnlab.data.prepared import TokenFolder, is_token_folder, load_tokens
from ffnlab.data.tagging import word_ids, word_vocabulary
from ffnlab.data.tokenizer import SeparatedTokenizer, Tokenizer, build_tokenizer, texts_to_build_from


@functools.lru_cache(maxsize=8)
def load_data(
    data: str,
    task: str,
    tokenizer: str,
    vocab_size: int | None,
    text_field: str,
    label_field: str,
    folder: str | None = None,
    example_context: int | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    ids_vocab: int | None = None,
) -> tuple[Corpus | ImageSet | TokenFolder, Tokenizer, dict[str, Split]]:
    """Corpus -> tokenizer and token tensors per split, cached per process for sweeps; `vocab_size` is the
    'bpe' or 'word' tokenizer's (None for the others), `folder` the save_pretrained folder of the 'pretrained' one.
    The tokenizer is built from the train split only (but 'char', whose alphabet is every split's), so val
    and test words it never saw are <unk> for 'word'. With `example_context` (a sentence pair: two text fields)
    each example is a pair, truncated to that context (`ffnlab.data.pairs.pair_splits`). Task tokens gives
    each word of a sentence one position (`ffnlab.data.tagging.word_vocabulary`). The folder's own tokenizer
    ('pretrained') encodes the examples of every task but lm with its template, each truncated to `example_context`
    (`ffnlab.data.checkpoint_tokenizer.checkpoint_splits`). Task image:
    `load_image_data`. A folder of tokens (task lm) brings its tokenizer (`ffnlab.data.prepared.load_tokens`;
    `ids_vocab`: the vocabulary size of tokens prepared elsewhere)."""
    if task == "image":
        return load_image_data(data, image_size, channels)
    if is_token_folder(data):
        if task != "lm":
            raise ValueError(f"{data} is a folder of tokens, for task lm only; task {task} reads text")
        tokens, tok, token_splits = load_tokens(data, tokenizer, ids_vocab, folder)
        return tokens, tok, {**token_splits}
    if ids_vocab is not None:
        raise ValueError(f"ids_vocab (--ids-vocab) is the vocabulary of tokens prepared elsewhere; {data} is text")
    corpus = load_corpus(data, task=task, text_field=text_field, label_field=label_field)
    if tokenizer == "pretrained" and task != "lm":
        assert example_context is not None  # data_args gives the context of every example with special tokens
        tok = read_checkpoint_tokenizer(folder)
        return corpus, tok, checkpoint_splits(corpus, tok, task, is_pair(text_field), example_context)
    if task == "tokens":
        return (corpus, *tagged_splits(corpus, vocab_size))
    if example_context is not None:
        pair_tok, pairs = pair_splits(corpus, tokenizer, vocab_size, folder, example_context)
        return corpus, pair_tok, {**pairs, **more_test_splits(corpus, pair_tok, example_context)}
    texts = texts_to_build_from(tokenizer, corpus.train, corpus.val, corpus.test)
    tok = build_tokenizer(tokenizer, texts, vocab_size=vocab_size, folder=folder)
    splits: dict[str, Split] = {}
    for split in ("train", "val", "test"):
        if task == "lm":
            splits[split] = torch.from_numpy(tok.encode_array(corpus.text(split)))
        else:
            docs = [torch.tensor(tok.encode(t), dtype=torch.long) for t in getattr(corpus, split)]
            dtype = torch.float if task == "reg" else torch.long  # reg: a number per document, else a class id
            splits[split] = (docs, torch.tensor(getattr(corpus, f"{split}_labels"), dtype=dtype))
    return corpus, tok, {**splits, **more_test_splits(corpus, tok)}


def more_test_splits(corpus: Corpus, tok: Tokenizer, pair_context: int | None = None) -> dict[str, Split]:
    """Each further test set of `corpus` (MNLI's mismatched dev set, `Corpus.more_tests`) encoded as its test split
    is, as 'test_<name>': a sentence pair by `encode_pair` in `pair_context`."""
    splits: dict[str, Split] = {}
    for name, (docs, labels) in corpus.more_tests.items():
        if pair_context is not None:
            assert isinstance(tok, SeparatedTokenizer)  # pair_splits's
            ids = [encode_pair(tok, doc, pair_context) for doc in docs]
        else:
            ids = [tok.encode(doc) for doc in docs]
        dtype = torch.float if corpus.task == "reg" else torch.long
        splits[f"test_{name}"] = ([torch.tensor(i, dtype=torch.long) for i in ids], torch.tensor(labels, dtype=dtype))
    return splits


def tagged_splits(corpus: Corpus, vocab_size: int | None) -> tuple[Tokenizer, dict[str, Split]]:
    """Task tokens: the training sentences' word vocabulary and, per split, each sentence's word ids and tag ids."""
    vocab = word_vocabulary([doc.split(" ") for doc in corpus.train], vocab_size)
    splits: dict[str, Split] = {}
    for split in ("train", "val", "test"):
        words = [word_ids(vocab, doc.split(" ")) for doc in corpus.documents(split)]
        splits[split] = (words, [torch.tensor(tags, dtype=torch.long) for tags in corpus.labels(split) or []])
    return vocab, splits


def load_image_data(
    data: str, image_size: int | None, channels: int | None
) -> tuple[ImageSet, Tokenizer, dict[str, Split]]:
    """`load_data` for task image: the images (ffnlab.data.images) and, per split, (images normalised by the
    training split's per-channel mean and std, labels); no tokenizer (`PixelInput`)."""
    images = load_images(data, image_size, channels)
    splits: dict[str, Split] = {split: (images.normalised(split), images.labels[split]) for split in images.images}
    return images, PixelInput(), splits
