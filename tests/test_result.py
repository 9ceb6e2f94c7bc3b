import json
import math
import sqlite3
from pathlib import Path

import pytest

from ffnlab.run.result import Evaluation, History, Outcome, RunResult, result_problem
from tests.conftest import run_result

DATA = Path(__file__).parent / "data"


def test_a_result_is_its_flat_json_and_back():
    r = run_result(task="cls", final_val_acc=0.5, final_test_macro_f1=0.25, noisy_val_acc=0.4, params=123)
    assert (r.val.acc, r.test.macro_f1, r.noisy_val.acc, r.costs.params) == (0.5, 0.25, 0.4, 123)
    flat = r.to_dict()
    assert flat["final_val_acc"] == 0.5 and flat["final_test_macro_f1"] == 0.25 and flat["params"] == 123
    assert flat["status"] == "finished" and type(flat["status"]) is str  # JSON's own kind, not the enum
    assert RunResult.from_dict(json.loads(json.dumps(flat))) == r
    assert r.status is Outcome.FINISHED


def test_results_stored_by_the_flat_record_read_back_into_the_records():
    # every result of tests/data's stores, written before a result was records: each key lands in its record
    for store in ("recorded_study/store.db", "default_study.db"):
        with sqlite3.connect(DATA / store) as db:
            stored = [json.loads(text) for (text,) in db.execute("SELECT result FROM runs")]
        for flat in stored:
            r = RunResult.from_dict(flat)
            assert r.val.loss == flat["final_val_loss"] and r.test.acc == flat["final_test_acc"]
            assert r.memory.train_mem_bytes == flat["train_mem_bytes"] and r.monitors.learned == flat["learned"]
            again = r.to_dict()
            assert {k: again[k] for k in flat} == flat  # the same keys and values; later keys are added
    assert "trainable_params" not in stored[0] and r.costs.trainable_params is None  # older than the field


def test_an_older_result_without_the_later_fields_reads_them_as_empty():
    flat = {k: v for k, v in run_result().to_dict().items() if k not in ("behaviour", "learned", "history", "events")}
    r = RunResult.from_dict(flat)
    assert (r.monitors.behaviour, r.monitors.learned, r.history, r.events) == ({}, {}, History(), ())


def test_a_stale_key_or_a_value_of_the_wrong_kind_is_named():
    with pytest.raises(ValueError, match="keys a run result does not: final_val_brier"):
        run_result(final_val_brier=0.1)
    assert result_problem({"final_test_loss": "low"}) == "'final_test_loss' is a string, not a number"
    assert result_problem({"learned": [], "params": 3}) == "'learned' is an array, not an object"
    assert result_problem({"final_val_loss": None, "x": "unknown keys are left to from_dict"}) is None


def test_an_evaluation_keeps_what_its_fields_name_and_its_perplexity():
    e = Evaluation.measured({"loss": 2.0, "acc": 0.5, "brier": 0.1})
    assert e == Evaluation(loss=2.0, ppl=math.exp(2.0), acc=0.5)
    assert Evaluation.measured({"loss": 1e4}).ppl == math.inf  # exp overflows a float
    assert Evaluation.measured({}) == Evaluation()  # a split too small to evaluate


def test_code_written_before_the_records_still_reads_a_result_with_a_warning():
    from ffnlab.run.config import RunResult as Moved  # where it was before 0.3

    result = run_result(final_val_loss=2.5, params=1234)
    assert Moved is RunResult
    with pytest.warns(DeprecationWarning, match=r"RunResult.final_val_loss is RunResult.val.loss since ffnlab 0.3"):
        assert result.final_val_loss == 2.5 == result.val.loss
    with pytest.warns(DeprecationWarning, match=r"RunResult.params is RunResult.costs.params"):
        assert result.params == 1234
    with pytest.raises(AttributeError, match="no attribute 'final_val_lss'"):
        result.final_val_lss  # noqa: B018
