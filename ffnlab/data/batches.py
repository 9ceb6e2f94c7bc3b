"""Batches from a run's data: random training examples and the fixed evaluation batches.

A `Split` is one split of a corpus as `ffnlab.data.load.load_data` encodes it. `get_batch` draws a
training batch from it with the run's generator; `eval_set` gives every variant and seed the same
evaluation batches (drawn with EVAL_SEED, or examples evenly spaced over the split).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ffnlab.data.prepared import TokenFiles
from ffnlab.data.tagging import PAD_ID, tagged_batch

EVAL_SEED = 1234  # fixed, so every variant and seed is evaluated on the same batches

Batch = tuple[torch.Tensor, torch.Tensor]  # inputs (B, T) or images (B, ch, H, W), and targets: next tokens (B, T),
# labels (B,) or tags (B, T)


PaddedLabels = torch.Tensor | list[torch.Tensor]  # a label per example (cls, reg), or per token (tokens)


class PaddedSplit(tuple[list[torch.Tensor], PaddedLabels]):
    """A split of task cls or tokens whose examples hold the special tokens of a pretrained tokenizer's template and
    fit the context (ffnlab.data.checkpoint_tokenizer): (examples, labels) that batches pad with `pad_id` (task tokens'
    labels with IGNORE_INDEX), never crop or repeat. A tuple, so it unpacks as any (examples, labels) split does."""

    pad_id: int

    def __new__(cls, examples: list[torch.Tensor], labels: PaddedLabels, pad_id: int) -> PaddedSplit:
        split = super().__new__(cls, (examples, labels))
        split.pad_id = pad_id
        return split

    def __getnewargs__(self) -> tuple[list[torch.Tensor], PaddedLabels, int]:  # a copy or pickle keeps the pad id
        return (*self, self.pad_id)


# LM token ids (in memory, or files read through a memory map), (documents, labels) for cls, (sentences' word ids,
# their tag ids) for tokens, for task image (normalised images (N, ch, H, W), labels), or a split padded to a
# pretrained tokenizer's template
Split = (
    torch.Tensor
    | TokenFiles
    | tuple[list[torch.Tensor], torch.Tensor]
    | tuple[list[torch.Tensor], list[torch.Tensor]]
    | tuple[torch.Tensor, torch.Tensor]
    | PaddedSplit
)


def has_window(split_data: Split, task: str, context: int) -> bool:
    """Whether a split can give one example: a window of `context + 1` tokens, or a labelled document."""
    if task == "lm":
        return len(split_data) > context + 1
    assert isinstance(split_data, tuple)  # every other task's split is a pair (load_data)
    return len(split_data[0]) > 0


def check_data(splits: dict[str, Split], task: str, context: int, data: str) -> None:
    """ValueError when the train or val split is too small to give one example."""
    for split in ("train", "val"):
        if has_window(splits[split], task, context):
            continue
        if task == "lm":
            raise ValueError(
                f"the {split} split of '{data}' has {len(splits[split])} tokens, fewer than one context "
                f"window ({context + 1}); use more text or a smaller --context"
            )
        raise ValueError(f"the {split} split of '{data}' has no labelled examples")


def crop_or_repeat(ids: torch.Tensor, length: int, start: int = 0) -> torch.Tensor:
    """A window of `length` tokens from `ids` at `start`; short texts are repeated to fill it
    (no padding token or mask needed for the pooled classifier)."""
    if len(ids) == 0:
        ids = torch.zeros(1, dtype=torch.long)
    if len(ids) < length:
        ids = ids.repeat(length // len(ids) + 1)
    return ids[start : start + length]


def padded(examples: list[torch.Tensor], pick: list[int], context: int, pad_id: int) -> torch.Tensor:
    """The examples `pick` as (B, T) ids, each filled up to the context with `pad_id` (a PaddedSplit's examples fit
    it: truncated when encoded)."""
    x = torch.full((len(pick), context), pad_id, dtype=torch.long)
    for row, i in enumerate(pick):
        n = min(context, len(examples[i]))
        x[row, :n] = examples[i][:n]
    return x


def get_batch(split_data: Split, task: str, batch_size: int, context: int, gen: torch.Generator) -> Batch:
    """Random (x, y): LM windows with next-token targets, classification crops and labels, tagged sentences
    padded to the context (`ffnlab.data.tagging.tagged_batch`), or images and labels."""
    if task == "image":
        return image_batch(split_data, batch_size, gen)
    if task == "lm":
        assert isinstance(split_data, (torch.Tensor, TokenFiles))  # an LM split is its token ids (load_data)
        ix = torch.randint(len(split_data) - context - 1, (batch_size,), generator=gen)
        if isinstance(split_data, TokenFiles):  # the same windows, read from the files
            windows = split_data.windows(ix, context + 1)
        else:
            windows = split_data[ix[:, None] + torch.arange(context + 1)]  # (B, T+1): one gather, not B slices
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T) each
    assert isinstance(split_data, tuple)  # every other task's split is a pair (load_data)
    if task == "tokens":
        docs, tags = split_data
        assert isinstance(docs, list) and isinstance(tags, list)  # a tokens split: a tensor per sentence (load_data)
        pick = torch.randint(len(docs), (batch_size,), generator=gen).tolist()
        return tagged_batch(docs, tags, pick, context, getattr(split_data, "pad_id", PAD_ID))
    docs, labels = split_data
    ix = torch.randint(len(docs), (batch_size,), generator=gen)
    if isinstance(split_data, PaddedSplit):
        assert isinstance(docs, list)  # a tensor per example (checkpoint_splits)
        return padded(docs, ix.tolist(), context, split_data.pad_id), labels[ix]
    starts = [int(torch.randint(max(1, len(docs[i]) - context + 1), (1,), generator=gen)) for i in ix]
    return torch.stack([crop_or_repeat(docs[i], context, s) for i, s in zip(ix, starts)]), labels[ix]


def eval_set(split_data: Split, task: str, n_batches: int, batch_size: int, context: int) -> list[Batch]:
    """The fixed evaluation batches: LM windows drawn with EVAL_SEED; for classification, tagging and images
    n_batches * batch_size examples evenly spaced over the split (all, when fewer; first window of each)."""
    if task == "lm":
        gen = torch.Generator().manual_seed(EVAL_SEED)
        return [get_batch(split_data, task, batch_size, context, gen) for _ in range(n_batches)]
    assert isinstance(split_data, tuple)  # every other task's split is a pair (load_data)
    docs, labels = split_data
    pick = torch.unique(torch.linspace(0, len(docs) - 1, min(len(docs), n_batches * batch_size)).long())
    if task == "image":
        assert isinstance(docs, torch.Tensor) and isinstance(labels, torch.Tensor)  # one tensor (load_image_data)
        x, y = docs[pick], labels[pick]
    elif task == "tokens":
        assert isinstance(docs, list) and isinstance(labels, list)  # a tokens split: a tensor per sentence (load_data)
        x, y = tagged_batch(docs, labels, pick.tolist(), context, getattr(split_data, "pad_id", PAD_ID))
    elif isinstance(split_data, PaddedSplit):
        assert isinstance(docs, list)  # a tensor per example (checkpoint_splits)
        x, y = padded(docs, pick.tolist(), context, split_data.pad_id), labels[pick]
    else:
        assert isinstance(labels, torch.Tensor)  # a cls split's labels (load_data)
        x, y = torch.stack([crop_or_repeat(docs[i], context) for i in pick]), labels[pick]
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(pick), batch_size)]


def image_batch(split_data: Split, batch_size: int, gen: torch.Generator) -> Batch:
    """Random images of a split, drawn with replacement as documents are, and their labels."""
    assert isinstance(split_data, tuple)  # (images, labels) (load_image_data)
    images, labels = split_data
    assert isinstance(images, torch.Tensor)  # an image split is one tensor (load_image_data)
    ix = torch.randint(len(images), (batch_size,), generator=gen)
    return images[ix], labels[ix]


def on_device(batches: Iterable[Batch], device: str) -> list[Batch]:
    """The batches moved to `device`."""
    return [(x.to(device), y.to(device)) for x, y in batches]
