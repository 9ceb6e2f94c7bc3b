"""Batches from a run's data (ffnlab.data.batches): training windows and examples, the fixed evaluation batches."""

import torch

from ffnlab.data.batches import eval_set, get_batch


def test_lm_batch_is_windows_and_their_next_tokens():
    data = torch.arange(1000)  # token id == position, so each row shows where its window starts
    x, y = get_batch(data, "lm", 6, 16, torch.Generator().manual_seed(3))
    starts = torch.randint(1000 - 16 - 1, (6,), generator=torch.Generator().manual_seed(3))
    for row, i in enumerate(starts.tolist()):
        assert x[row].tolist() == list(range(i, i + 16)) and y[row].tolist() == list(range(i + 1, i + 17))
    assert x.shape == y.shape == (6, 16) and x.is_contiguous() and y.is_contiguous() and x.dtype == data.dtype


def test_evaluation_batches_are_the_same_every_time_and_take_all_of_a_small_split():
    first, again = (eval_set(torch.arange(1000), "lm", 3, 4, 16) for _ in range(2))
    assert len(first) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    docs = [torch.tensor([i, i]) for i in range(5)]
    batches = eval_set((docs, torch.arange(5)), "cls", 4, 2, 3)
    assert [y.tolist() for _, y in batches] == [[0, 1], [2, 3], [4]]  # all five: fewer than 4 batches of 2
    assert batches[0][0].tolist() == [[0, 0, 0], [1, 1, 1]]  # each document repeated to fill the context
