"""GLUE: the official metrics against their definitions (ffnlab.run.scores), the tasks read from GLUE's TSV files and
from save_to_disk folders (ffnlab.data.glue), and a GLUE study through the CLI."""

import math
import random

import pytest

from ffnlab.run.scores import accuracy, binary_f1, glue_score, matthews, pearson, spearman, task_score

# ---- the official metrics, by hand ----------------------------------------------------------------------


def confusion(true, predicted):
    """(TP, TN, FP, FN) of binary labels, class 1 positive."""
    pairs = list(zip(true, predicted))
    return (pairs.count((1, 1)), pairs.count((0, 0)), pairs.count((0, 1)), pairs.count((1, 0)))


def mcc_by_hand(true, predicted):
    """(TP TN - FP FN) / sqrt((TP + FP)(TP + FN)(TN + FP)(TN + FN)), 0 where the denominator is 0."""
    tp, tn, fp, fn = confusion(true, predicted)
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def multiclass_mcc_by_hand(true, predicted):
    """Gorodkin's R_K from the confusion matrix: (c s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)),
    c the correct predictions, s the examples, p_k and t_k how often k is predicted and true."""
    classes = sorted({*true, *predicted})
    c, s = sum(t == p for t, p in zip(true, predicted)), len(true)
    p = [predicted.count(k) for k in classes]
    t = [true.count(k) for k in classes]
    num = c * s - sum(pk * tk for pk, tk in zip(p, t))
    return num / math.sqrt((s * s - sum(x * x for x in p)) * (s * s - sum(x * x for x in t)))


def f1_by_hand(true, predicted):
    """2 P R / (P + R) with P = TP / (TP + FP), R = TP / (TP + FN)."""
    tp, _, fp, fn = confusion(true, predicted)
    if tp == 0:
        return 0.0
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall)


def pearson_by_hand(x, y):
    """cov(x, y) / (std(x) std(y)) from the sums."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def ranks_by_hand(values):
    """1-based ranks, tied values given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def test_matthews_correlation_is_the_confusion_matrix_formula():
    # TP 2, TN 3, FP 1, FN 2: (6 - 2) / sqrt(3 * 4 * 4 * 5)
    true = [1, 1, 1, 1, 0, 0, 0, 0]
    predicted = [1, 1, 0, 0, 0, 0, 0, 1]
    assert matthews(true, predicted) == pytest.approx(4 / math.sqrt(3 * 4 * 4 * 5))
    assert matthews([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert matthews([0, 1, 1, 0], [0, 0, 0, 0]) == 0.0  # one class predicted: 0/0, given 0 as GLUE does
    rng = random.Random(1)
    for _ in range(30):
        true = [rng.randrange(2) for _ in range(25)]
        predicted = [rng.randrange(2) for _ in range(25)]
        assert matthews(true, predicted) == pytest.approx(mcc_by_hand(true, predicted))
        true3 = [rng.randrange(3) for _ in range(25)]
        predicted3 = [rng.randrange(3) for _ in range(25)]
        assert matthews(true3, predicted3) == pytest.approx(multiclass_mcc_by_hand(true3, predicted3))


def test_f1_is_the_positive_class_from_precision_and_recall():
    # TP 2, FP 1, FN 2: P 2/3, R 1/2, F1 4/7
    true = [1, 1, 1, 1, 0, 0, 0, 0]
    predicted = [1, 1, 0, 0, 0, 0, 0, 1]
    assert binary_f1(true, predicted) == pytest.approx(4 / 7)
    assert binary_f1([0, 0], [0, 0]) == 0.0  # no positive anywhere
    assert accuracy(true, predicted) == pytest.approx(5 / 8)
    rng = random.Random(2)
    for _ in range(30):
        true = [rng.randrange(2) for _ in range(20)]
        predicted = [rng.randrange(2) for _ in range(20)]
        assert binary_f1(true, predicted) == pytest.approx(f1_by_hand(true, predicted))
        assert accuracy(true, predicted) == pytest.approx(sum(t == p for t, p in zip(true, predicted)) / 20)
    with pytest.raises(ValueError, match="labels 0 and 1"):
        binary_f1([0, 2], [0, 1])
    with pytest.raises(ValueError, match="one prediction per example"):
        binary_f1([0, 1], [0])


def test_pearson_is_the_covariance_formula_and_spearman_the_pearson_of_ranks():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [2.0, 1.0, 4.0, 3.0, 7.0]
    assert pearson(x, y) == pytest.approx(pearson_by_hand(x, y))
    # ties: ranks [1, 2.5, 2.5, 4] and [1, 3, 2, 4]
    assert ranks_by_hand([0.5, 2.0, 2.0, 3.0]) == [1, 2.5, 2.5, 4]
    assert spearman([0.5, 2.0, 2.0, 3.0], [1, 3, 2, 4]) == pytest.approx(
        pearson_by_hand([1, 2.5, 2.5, 4], [1, 3, 2, 4])
    )
    rng = random.Random(3)
    for _ in range(30):
        a = [rng.choice([0.0, 1.0, 1.5, 2.0, 2.5, 3.0]) for _ in range(15)]  # STS-B-like scores, many ties
        b = [round(rng.gauss(0, 1), 1) for _ in range(15)]
        if len(set(a)) < 2 or len(set(b)) < 2:
            continue
        assert pearson(a, b) == pytest.approx(pearson_by_hand(a, b))
        assert spearman(a, b) == pytest.approx(pearson_by_hand(ranks_by_hand(a), ranks_by_hand(b)))
    # undefined: a constant side (0/0), or a single example
    assert pearson([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) is None and spearman([1.0, 1.0], [1.0, 2.0]) is None
    assert pearson([1.0], [1.0]) is None


def test_the_glue_score_averages_each_tasks_metrics_then_the_tasks():
    # CoLA one metric; MRPC F1 and accuracy; STS-B Pearson and Spearman; MNLI matched and mismatched: one task each
    tasks = {
        "cola": task_score([0.30]),
        "mrpc": task_score([0.80, 0.70]),
        "stsb": task_score([0.60, 0.50]),
        "mnli": task_score([0.62, 0.64]),
    }
    assert tasks == pytest.approx({"cola": 0.30, "mrpc": 0.75, "stsb": 0.55, "mnli": 0.63})
    assert glue_score(tasks) == pytest.approx((0.30 + 0.75 + 0.55 + 0.63) / 4)
    # MNLI's m and mm are not two tasks: counting them so would weigh MNLI twice
    assert glue_score(tasks) != pytest.approx((0.30 + 0.75 + 0.55 + 0.62 + 0.64) / 5)
    with pytest.raises(ValueError, match="at least one"):
        glue_score({})
    with pytest.raises(ValueError, match="at least one"):
        task_score([])
