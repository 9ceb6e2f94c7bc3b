"""Scores of a classifier's predictions beyond accuracy: macro-F1, which weighs every class alike, so a
model that always predicts the majority class scores low on an unbalanced set where its accuracy is high."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def macro_f1(true: Sequence[int], predicted: Sequence[int]) -> float:
    """The unweighted mean over classes of F1, over the classes in `true` or `predicted`:

        F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c)     (= 2 P R / (P + R), and 0 where TP_c = 0)

    as scikit-learn's f1_score(average='macro') computes it: a class only ever predicted, or never
    predicted, scores 0. ValueError for no examples or lists of different lengths."""
    if not true or len(true) != len(predicted):
        raise ValueError(
            f"macro-F1 needs one prediction per example, got {len(true)} examples, {len(predicted)} predictions"
        )
    hits = Counter(t for t, p in zip(true, predicted) if t == p)  # TP per class
    truths, guesses = Counter(true), Counter(predicted)  # TP + FN, TP + FP per class
    classes = truths.keys() | guesses.keys()
    return sum(2 * hits[c] / (truths[c] + guesses[c]) for c in classes) / len(classes)
