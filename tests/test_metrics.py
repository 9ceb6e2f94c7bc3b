import csv
import math
import operator
from dataclasses import field, fields, make_dataclass

import pytest

from ffnlab.run import result
from ffnlab.run.result import SPLITS, Evaluation
from ffnlab.study import metrics
from ffnlab.study.advise import advise
from ffnlab.study.load import load_study
from ffnlab.study.metrics import (
    METRICS,
    TABLES,
    Measured,
    Metric,
    exp_mean,
    mean_of,
    metric,
    range_of,
    ranked_metric,
    ranked_task,
    ranking_metric,
)
from ffnlab.study.report import write_report
from ffnlab.study.store import Store
from ffnlab.study.summary import summarize_study
from ffnlab.study.table import format_table, write_csv
from tests import test_advise
from tests.conftest import run_result
from tests.test_advise import fabricated_store


def test_a_metric_declared_once_reaches_all_five_outputs(monkeypatch, tmp_path):
    toy = Metric("toy_score", "toy score", "", "lower", lambda r: 1000.0 + r.seed, format=lambda v: f"toy{v:.1f}",
                 tables=("ranking", "cost", "evidence"))  # fmt: skip
    monkeypatch.setattr(metrics, "METRICS", (*METRICS, toy))
    store = fabricated_store(tmp_path / "s.db", {"relu": 2.0, "gelu": 1.9})  # seeds 0, 1, 2: a mean of 1001
    study, runs, _ = load_study(store)
    summary = summarize_study(study, store, runs)
    assert "toy score" in format_table(summary) and "toy1001.0" in format_table(summary)  # the terminal
    assert [r["toy_score"] for r in summary.to_json()["variants"]] == [1001.0, 1001.0]  # compare --json
    write_csv(summary, tmp_path / "t.csv")
    with open(tmp_path / "t.csv") as f:
        assert [float(r["toy_score"]) for r in csv.DictReader(f)] == [1001.0, 1001.0]  # compare --csv
    report = write_report(store, tmp_path / "report")
    page, md = report.html.read_text(), report.markdown.read_text()
    assert page.count("toy1001.0") == 4 and "toy score" in page and "toy1001.0" in md  # ranking and cost tables
    advice = advise(store=store)
    evidence = advice.to_json()["evidence"]  # advise --json
    assert [v["toy_score"] for v in evidence["variants"].values()] == [1001.0, 1001.0]  # the evidence


def test_a_measured_quantity_is_one_field_on_its_record_and_one_entry_in_the_table(monkeypatch, tmp_path):
    # a copy of the records whose Evaluation measures one more quantity (a Brier score), and a copy of the table
    # with one more entry reading it: nothing else is edited, and it reaches the store and all five outputs
    measured = make_dataclass("Evaluation", [("brier", float | None, field(default=None))], bases=(Evaluation,),
                              frozen=True)  # fmt: skip
    monkeypatch.setattr(result, "Evaluation", measured)
    brier = Metric("final_val_brier", "val Brier", "", "lower", Measured("val", "brier"), format=lambda v: f"b{v:.3f}",
                   tables=("ranking", "evidence"))  # fmt: skip
    monkeypatch.setattr(metrics, "METRICS", (*METRICS, brier))
    # each run as train() would record it: evaluate() returned 'brier', 0.01 x (seed + 1)
    with_brier = lambda **f: run_result(**f, final_val_brier=0.01 * (f["seed"] + 1))
    monkeypatch.setattr(test_advise, "run_result", with_brier)
    store = test_advise.fabricated_store(tmp_path / "s.db", {"relu": 2.0, "gelu": 1.9})  # seeds 0, 1, 2
    with Store(store) as db:  # the store kept it, and reads it back
        assert {r.result.val.brier for r in db.runs()} == {0.01, 0.02, 0.03}
    study, runs, _ = load_study(store)
    assert Evaluation.measured({"loss": 2.0, "brier": 0.5}) == Evaluation(loss=2.0, ppl=math.exp(2.0))  # the
    # record as it is has no such field: measured() keeps the quantities its fields name
    summary = summarize_study(study, store, runs)
    assert "val Brier" in format_table(summary) and "b0.020" in format_table(summary)  # the terminal
    assert [r["final_val_brier"] for r in summary.to_json()["variants"]] == [pytest.approx(0.02)] * 2  # --json
    write_csv(summary, tmp_path / "t.csv")
    with open(tmp_path / "t.csv") as f:
        assert [float(r["final_val_brier"]) for r in csv.DictReader(f)] == [pytest.approx(0.02)] * 2  # --csv
    report = write_report(store, tmp_path / "report")
    assert "val Brier" in report.html.read_text() and "b0.020" in report.markdown.read_text()  # the report
    advice = advise(store=store)
    evidence = advice.to_json()["evidence"]  # advise --json
    assert [v["final_val_brier"] for v in evidence["variants"].values()] == [pytest.approx(0.02)] * 2


def test_every_metric_reads_a_field_runs_have_and_shows_in_known_tables():
    quantities = {f.name for f in fields(Evaluation)}
    for m in METRICS:
        if isinstance(m.source, Measured):  # a quantity of a split's Evaluation, named by its key in the JSON
            assert m.source.split in SPLITS and m.source.quantity in quantities, m.name
            assert m.name == m.source.key or not m.name.startswith(("final_", "noisy_")), m.name
        elif isinstance(m.source, str):  # a field of one of the result's records
            operator.attrgetter(m.source)(run_result())
        assert set(m.tables) <= set(TABLES) and set(m.tasks) <= {"lm", "cls", "image", "tokens", "reg"}, m.name
        m.value(run_result())  # computed sources read fields that exist
    assert len({m.name for m in METRICS}) == len(METRICS)


def test_the_ranking_metric_follows_the_task():
    assert ranking_metric("lm").name == "final_val_loss" and ranking_metric("lm").better == "lower"
    assert ranking_metric("cls").name == "final_val_acc" and ranking_metric("cls").better == "higher"
    assert ranking_metric("tokens").name == "final_val_f1" and ranking_metric("tokens").better == "higher"
    assert [ranked_task(m) for m in ("final_test_f1", "final_val_acc", "final_val_loss")] == ["tokens", "cls", "lm"]
    assert ranking_metric("image").name == "final_val_acc"  # a ViT classifies, as cls does
    assert ranking_metric("reg").name == "final_val_pearson" and ranked_task("final_test_pearson") == "reg"
    # a ranking metric on the test split, as a tuned cell names it: the same quantity, read from the test split
    test_f1 = ranked_metric("final_test_f1")
    assert (test_f1.label, test_f1.split, ranking_metric("tokens").split) == ("test F1", "test", "val")
    assert test_f1.value(run_result(task="tokens", final_val_f1=0.5, final_test_f1=0.25)) == 0.25
    assert ranking_metric("lm").on("test").name == "final_test_loss" and metric("params").split is None
    with pytest.raises(ValueError, match="unknown ranking metric 'final_test_macro_f1'; valid: final_val_loss"):
        ranked_metric("final_test_macro_f1")
    # what advice calls a difference in it: a tagger's is span F1, not accuracy
    assert [ranking_metric(t).quantity() for t in ("lm", "cls", "tokens")] == ["loss", "accuracy", "F1"]
    with pytest.raises(ValueError, match="no ranking metric for task 'audio'"):
        ranking_metric("audio")
    with pytest.raises(ValueError, match="unknown metric 'bogus'; valid: final_val_loss, final_val_acc"):
        metric("bogus")


def test_macro_f1_is_shown_for_every_task_ranked_by_accuracy():
    classifiers = set(metric("final_val_acc").ranks)  # cls and image: a class per example
    for name in ("final_val_macro_f1", "final_test_macro_f1"):
        assert set(metric(name).tasks) == classifiers, name
    image = run_result(task="image", final_val_loss=None, final_val_acc=0.5, final_val_macro_f1=0.4)
    assert metric("final_val_macro_f1").of([image], "image") == 0.4
    assert "final_val_macro_f1" in {m.name for m in metrics.shown_in("ranking", "image")}


def test_reducers_over_seeds():
    results = [run_result(seed=s, final_val_loss=x, step_time_s=t) for s, x, t in ((0, 2.0, 0.01), (1, 4.0, 0.03))]
    assert metric("ppl").of(results, "lm") == pytest.approx(math.exp(3.0))  # exp of the mean loss
    assert metric("ppl").of(results, "cls") is None  # not measured for a classifier
    assert metric("step_time_range").of(results, "lm") == [0.01, 0.03]
    assert metric("step_time_s").of(results, "lm") == pytest.approx(0.02)  # the median
    assert metric("grad_spikes").of([], "lm") == 0 and metric("params").of([], "lm") is None
    assert mean_of([1.0, None, math.nan, 3.0]) == 2.0 and mean_of([]) is None
    assert range_of([math.inf]) is None and exp_mean([None]) is None
    noisy = run_result(final_val_loss=2.0, noisy_val_loss=2.25)
    assert metric("noise_delta").of([noisy], "lm") == 0.25
    acc = run_result(task="cls", final_val_loss=None, final_val_acc=0.5, final_test_acc=0.75, noisy_val_acc=0.25)
    assert metric("test_mean").of([acc], "cls") == 0.75 and metric("noise_delta").of([acc], "cls") == -0.25
    tags = run_result(task="tokens", final_val_f1=0.5, final_test_f1=0.75, noisy_val_f1=0.25, final_val_acc=0.9)
    assert metric("test_mean").of([tags], "tokens") == 0.75 and metric("noise_delta").of([tags], "tokens") == -0.25
    assert metric("token_acc").of([tags], "tokens") == 0.9 and metric("token_acc").of([acc], "cls") is None
