"""Scores of a classifier's predictions (ffnlab.run.scores)."""

import random

import pytest

from ffnlab.run.scores import macro_f1


def test_macro_f1_by_hand():
    # class 0: TP 2, FP 1, FN 0 -> F1 4/5; class 1: TP 1, FP 0, FN 2 -> 1/2; class 2 predicted once, never true -> 0
    true = [0, 0, 1, 1, 1]
    predicted = [0, 0, 0, 1, 2]
    assert macro_f1(true, predicted) == pytest.approx((4 / 5 + 1 / 2 + 0) / 3)
    assert macro_f1([1, 1, 0], [1, 1, 0]) == 1.0
    # always the majority class: accuracy 0.9, macro-F1 (18/19 + 0) / 2
    assert macro_f1([0] * 9 + [1], [0] * 10) == pytest.approx(18 / 19 / 2)
    with pytest.raises(ValueError, match="one prediction per example"):
        macro_f1([0, 1], [0])
    with pytest.raises(ValueError, match="one prediction per example"):
        macro_f1([], [])


def test_macro_f1_matches_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for _ in range(50):
        n, k = rng.randint(1, 40), rng.randint(1, 5)
        true = [rng.randrange(k) for _ in range(n)]
        predicted = [rng.randrange(k) for _ in range(n)]
        want = metrics.f1_score(true, predicted, average="macro", zero_division=0)
        assert macro_f1(true, predicted) == pytest.approx(want)
