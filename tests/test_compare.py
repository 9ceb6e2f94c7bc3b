"""`ffnlab compare` as one library call (ffnlab.study.compare): the study, its CSV and its report."""

import csv
from dataclasses import replace

import pytest

from ffnlab.run.presets import preset_config
from ffnlab.study.compare import compare, unfinished
from ffnlab.study.plan import Study
from ffnlab.study.report import default_out_dir


def tiny_study(**fields) -> Study:
    return Study(variants=["relu", "gelu"], seeds=2, base=replace(preset_config("smoke"), max_steps=2, eval_every=2),
                 **fields)  # fmt: skip


def test_the_ranking_comes_before_the_report_and_the_csv_holds_it(tmp_path):
    store, table = tmp_path / "s.db", tmp_path / "t.csv"
    report_then = []
    result = compare(tiny_study(), store, csv=str(table), ranked=lambda r: report_then.append(r.report), jobs=1,
                     quiet=True)  # fmt: skip
    assert report_then == [None] and result.report.html.is_file()  # the report is written after the ranking
    assert default_out_dir(store) == result.report.html.parent
    assert result.protocol is None and result.summaries == [result.summary]
    assert result.to_json() == result.summary.to_json() and unfinished(result.summary) == (0, 4)
    with open(table) as f:
        assert sorted(row["ffn"] for row in csv.DictReader(f)) == ["gelu", "relu"]  # a row per variant


def test_the_protocol_refuses_other_axes_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="--protocol runs its own lr, warm-up and context axes"):
        compare(tiny_study(axes={"depth": [1, 2]}), tmp_path / "s.db", protocol=True, csv=str(tmp_path / "t.csv"))
    assert list(tmp_path.iterdir()) == []
