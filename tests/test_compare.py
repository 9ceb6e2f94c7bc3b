"""`ffnlab compare` as one library call (ffnlab.study.compare): the study, its CSV and its report."""

import csv
import json
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


def test_a_tagging_comparison_ranks_by_span_f1_in_the_table_json_csv_and_report(run_cli, tmp_path):
    from tests.test_tagging import write_conll

    write_conll(tmp_path / "ner", sizes=(60, 16, 16))
    argv = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", 2, "--steps", 4, "--eval-every", 2,
            "--jobs", 1, "--task", "tokens", "--data", tmp_path / "ner", "--store", tmp_path / "s.db"]  # fmt: skip
    code, out, err = run_cli(*argv, "--csv", tmp_path / "t.csv", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["cells"][0]["metric"] == "final_val_f1" and summary["cells"][0]["metric_direction"] == "higher"
    assert all(0 <= v["mean"] <= 1 and 0 <= v["token_acc"] <= 1 for v in summary["variants"])
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["metric"] for r in rows] == ["final_val_f1"] * 2 and all(r["token_acc"] for r in rows)
    report = default_out_dir(tmp_path / "s.db")
    assert "val F1" in (report / "report.html").read_text() and "val F1" in (report / "summary.md").read_text()
    code, out, err = run_cli(*argv, "--no-report")  # the runs are stored: the table at once
    assert code == 0 and "val F1 [95% CI]" in out and "token acc" in out and "perplexity" not in out, err


@pytest.mark.slow
def test_the_bundled_speaker_name_task_compares_offline(run_cli, tmp_path):
    argv = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", 2, "--steps", 4, "--eval-every", 2,
            "--jobs", 1, "--task", "tokens", "--word-vocab", 2000, "--store", tmp_path / "s.db"]  # fmt: skip
    code, out, err = run_cli(*argv, "--csv", tmp_path / "t.csv", "--json")
    assert code == 0, err
    cell = json.loads(out)["cells"][0]
    assert cell["metric"] == "final_val_f1" and len(cell["variants"]) == 2
    with open(tmp_path / "t.csv") as f:
        assert [r["metric"] for r in csv.DictReader(f)] == ["final_val_f1"] * 2
    report = default_out_dir(tmp_path / "s.db")
    assert "val F1 [95% CI]" in (report / "report.html").read_text()
    assert "| data | shakespeare (tokens, word tokenizer) |" in (report / "summary.md").read_text()
    code, out, err = run_cli(*argv, "--no-report")  # stored: the table at once
    assert code == 0 and "val F1 [95% CI]" in out, err
