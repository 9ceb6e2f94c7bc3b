"""Scores of a model's predictions beyond accuracy, and GLUE's official metrics and score.

macro-F1 weighs every class alike, so a model that always predicts the majority class scores low on an
unbalanced set where its accuracy is high. GLUE's official metrics (Wang et al. 2019, Table 1) are computed
with scikit-learn and scipy, as GLUE's own evaluation and Hugging Face's `evaluate` compute them: Matthews
correlation (CoLA), F1 of the positive class and accuracy (MRPC, QQP), Pearson and Spearman correlation
(STS-B), accuracy (the others; MNLI on its matched and mismatched dev sets). Every score here is a fraction
(accuracy 0.85, not 85): ffnlab reports accuracy so everywhere; GLUE's leaderboard prints them times 100.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence


def check_pairs(true: Sequence[object], predicted: Sequence[object], what: str) -> None:
    """ValueError for no examples or lists of different lengths."""
    if not len(true) or len(true) != len(predicted):
        raise ValueError(
            f"{what} needs one prediction per example, got {len(true)} examples, {len(predicted)} predictions"
        )


def macro_f1(true: Sequence[int], predicted: Sequence[int]) -> float:
    """The unweighted mean over classes of F1, over the classes in `true` or `predicted`:

        F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c)     (= 2 P R / (P + R), and 0 where TP_c = 0)

    as scikit-learn's f1_score(average='macro') computes it: a class only ever predicted, or never
    predicted, scores 0. ValueError for no examples or lists of different lengths."""
    check_pairs(true, predicted, "macro-F1")
    hits = Counter(t for t, p in zip(true, predicted) if t == p)  # TP per class
    truths, guesses = Counter(true), Counter(predicted)  # TP + FN, TP + FP per class
    classes = truths.keys() | guesses.keys()
    return sum(2 * hits[c] / (truths[c] + guesses[c]) for c in classes) / len(classes)


def accuracy(true: Sequence[int], predicted: Sequence[int]) -> float:
    """The fraction of predictions equal to the truth (sklearn.metrics.accuracy_score)."""
    from sklearn.metrics import accuracy_score

    check_pairs(true, predicted, "accuracy")
    return float(accuracy_score(true, predicted))


def matthews(true: Sequence[int], predicted: Sequence[int]) -> float:
    """Matthews correlation, CoLA's metric (sklearn.metrics.matthews_corrcoef); for two classes

        MCC = (TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN))

    and its multiclass generalisation (Gorodkin 2004) for more. 0 where the denominator is 0 (one class
    predicted, or one class true), as scikit-learn and GLUE's evaluation give it."""
    from sklearn.metrics import matthews_corrcoef

    check_pairs(true, predicted, "Matthews correlation")
    return float(matthews_corrcoef(true, predicted))


def binary_f1(true: Sequence[int], predicted: Sequence[int]) -> float:
    """F1 of the positive class (label 1), MRPC's and QQP's F1 (sklearn.metrics.f1_score, average 'binary'):

        F1 = 2 P R / (P + R),   P = TP / (TP + FP),   R = TP / (TP + FN)

    0 where nothing is predicted positive and nothing is positive. ValueError for labels other than 0 and 1."""
    from sklearn.metrics import f1_score

    check_pairs(true, predicted, "F1")
    if not {*true, *predicted} <= {0, 1}:
        raise ValueError(f"binary F1 needs labels 0 and 1, got {sorted({*true, *predicted})}")
    return float(f1_score(true, predicted, pos_label=1, average="binary", zero_division=0.0))


def correlation(kind: str, true: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Pearson's r ('pearson', scipy.stats.pearsonr) or Spearman's rho ('spearman', scipy.stats.spearmanr: Pearson's
    r of the ranks, ties given their mean rank) between the truth and the predictions, STS-B's metrics. None where
    it is undefined: fewer than 2 examples, or either side constant (r is 0/0 there; scipy warns and gives nan)."""
    from scipy.stats import pearsonr, spearmanr

    check_pairs(true, predicted, f"{kind} correlation")
    if len(true) < 2 or len(set(true)) < 2 or len(set(predicted)) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a near-constant side: scipy warns of its precision, and answers
        r = pearsonr(true, predicted)[0] if kind == "pearson" else spearmanr(true, predicted)[0]
    return float(r) if math.isfinite(r) else None


def pearson(true: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Pearson's r between the truth and the predictions (`correlation`)."""
    return correlation("pearson", true, predicted)


def spearman(true: Sequence[float], predicted: Sequence[float]) -> float | None:
    """Spearman's rho between the truth and the predictions (`correlation`)."""
    return correlation("spearman", true, predicted)


def task_score(metrics: Sequence[float]) -> float:
    """A GLUE task's score: the unweighted mean of its official metrics (MRPC: (F1 + accuracy) / 2; STS-B:
    (Pearson + Spearman) / 2; MNLI: (matched + mismatched accuracy) / 2; one metric: itself)."""
    if not metrics:
        raise ValueError("a task's score needs at least one metric")
    return math.fsum(metrics) / len(metrics)


def glue_score(task_scores: Mapping[str, float]) -> float:
    """The GLUE score: the unweighted mean over the tasks of each task's score (`task_score`).

    NOTE: as GLUE computes it (Wang et al. 2019, GLUE, ICLR; arXiv:1804.07461, Sec. 4 'Evaluation'): a task
    with several metrics scores their unweighted average, and the benchmark's score is the macro-average of the
    task scores. MNLI is one task there (Table 1: nine tasks, MNLI's metric 'acc. (match/mismatch)'), its matched
    and mismatched accuracies its two metrics, so it counts once, with the mean of the two, not as two tasks;
    the diagnostic set (AX) is no task of the score. Over a subset of the tasks this is the same mean over the
    tasks run, comparable only between runs of the same subset."""
    if not task_scores:
        raise ValueError("the GLUE score needs at least one task's score")
    return math.fsum(task_scores.values()) / len(task_scores)


def classifier_scores(true: Sequence[int], predicted: Sequence[int], n_classes: int) -> dict[str, float]:
    """A classifier's scores beyond accuracy on one split: 'macro_f1', 'mcc' (Matthews) and, with two classes,
    'binary_f1' (F1 of class 1, GLUE's F1 for MRPC and QQP)."""
    out = {"macro_f1": macro_f1(true, predicted), "mcc": matthews(true, predicted)}
    if n_classes == 2:
        out["binary_f1"] = binary_f1(true, predicted)
    return out


def regression_scores(true: Sequence[float], predicted: Sequence[float]) -> dict[str, float]:
    """A regressor's correlations with the truth on one split: 'pearson' and 'spearman', each where defined."""
    scores = {"pearson": pearson(true, predicted), "spearman": spearman(true, predicted)}
    return {name: value for name, value in scores.items() if value is not None}
