import html
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from ffnlab.study.advise import advise
from ffnlab.study.metrics import learned_mean
from ffnlab.study.records import Cell, StudySettings, Summary, VariantRow
from ffnlab.study.render import render_html, render_markdown
from ffnlab.study.report import report_data
from ffnlab.study.stats import VariantStats, gap_heterogeneity, shared_ranks
from ffnlab.study.summary import across_cells, tuned_cells
from tests.test_readme import readme_keys

# the numbers of a row that every output must agree on
SHARED = (
    "mean",
    "ci_low",
    "ci_high",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "p_adj",
    "n_seeds",
    "diverged",
    "params",
    "train_mem_bytes",
)


@pytest.fixture(scope="module")
def two_axis_store(tmp_path_factory):
    """A real study with two axes (depth x placement), 2 variants x 3 seeds per cell, and its JSON."""
    from ffnlab.cli import main

    store = tmp_path_factory.mktemp("axes") / "s.db"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "compare",
                "--preset",
                "smoke",
                "--variants",
                "relu,swiglu",
                "--seeds",
                "3",
                "--steps",
                "8",
                "--eval-every",
                "8",
                "--depth",
                "1,2",
                "--placement-axis",
                "pre,post",
                "--store",
                str(store),
                "--json",
                "--no-report",
            ]
        )
    assert code == 0
    return store, json.loads(out.getvalue())


def by_axes(cells):
    return {json.dumps(c["axes"], sort_keys=True): c for c in cells}


def test_compare_report_and_advise_give_identical_numbers_per_cell(two_axis_store):
    store, printed = two_axis_store
    assert len(printed["cells"]) == 4  # depth x placement, never merged
    report = by_axes([view.cell.to_json() for view in report_data(store, attention=False).cells])
    assert set(report) == set(by_axes(printed["cells"]))
    for key, cell in by_axes(printed["cells"]).items():
        rep = {r["ffn"]: r for r in report[key]["variants"]}
        for row in cell["variants"]:
            for field in SHARED:
                assert rep[row["ffn"]][field] == row[field], (key, row["ffn"], field)
    # advise --depth 2 leaves two cells (pre and post): advised on separately, with the same numbers
    advice = advise(store=store, depth=2)
    assert [c.cell for c in advice.cells] == [{"depth": 2, "placement": "pre"}, {"depth": 2, "placement": "post"}]
    for cell_advice in advice.cells:
        printed_cell = by_axes(printed["cells"])[json.dumps(cell_advice.cell, sort_keys=True)]
        for row in printed_cell["variants"]:
            evidence = cell_advice.to_json()["evidence"]["variants"][row["ffn"]]  # advise --json
            for field in SHARED:
                assert evidence[field] == row[field], (cell_advice.cell, row["ffn"], field)
    pre, post = (
        by_axes(printed["cells"])[json.dumps({"depth": 2, "placement": p}, sort_keys=True)] for p in ("pre", "post")
    )
    assert pre["variants"][0]["mean"] != post["variants"][0]["mean"]  # different cells, different numbers


def test_compare_json_holds_the_gradients_by_depth_the_report_shows(two_axis_store):
    store, printed = two_axis_store
    shown = {
        json.dumps(view.cell.axes, sort_keys=True): view.layer_grads
        for view in report_data(store, attention=False).cells
    }
    assert set(shown) == set(by_axes(printed["cells"]))
    for key, cell in by_axes(printed["cells"]).items():
        grads = shown[key]
        assert cell["depth"] == ({"note": grads} if isinstance(grads, str) else json.loads(json.dumps(grads.to_json())))
        # 8 steps, the norms logged at step 0 only: within the warm-up, so none to test on (numbers: test_layer_grads)
        why = "1 layer" if cell["axes"]["depth"] == 1 else "no per-layer FFN gradient norms after warm-up"
        assert why in cell["depth"]["note"]


def test_every_gap_is_tested_across_the_cells_in_every_output(two_axis_store):
    store, printed = two_axis_store
    across = printed["across_cells"]
    documented = readme_keys("With two or more cells, `across_cells`", "a repeated-measures")
    assert documented - {"across_cells"} <= set(across) | set(across["variants"]["swiglu"])
    assert across["cells"] == [", ".join(f"{k}={v}" for k, v in c["axes"].items()) for c in printed["cells"]]
    swiglu = across["variants"]["swiglu"]
    assert swiglu["gaps"] == [next(r for r in c["variants"] if r["ffn"] == "swiglu")["delta"] for c in printed["cells"]]
    # the test recomputed from the per-seed values the JSON prints (one variant: Holm changes nothing)
    rows = [{r["ffn"]: r["values"] for r in c["variants"]} for c in printed["cells"]]
    want = gap_heterogeneity([{s: r["swiglu"][s] - r["relu"][s] for s in r["swiglu"]} for r in rows])
    assert (swiglu["n"], swiglu["df"]) == (3, [3, 6]) and swiglu["p"] == pytest.approx(want.p) == swiglu["p_adj"]
    assert across["best"] == [[c["variants"][0]["ffn"]] for c in printed["cells"]]  # no ties here
    data = report_data(store, attention=False)
    assert data.across_cells is not None and data.across_cells.sentences == across["sentences"]
    for cell in advise(store=store, depth=2).cells:  # the advice quotes them for its choice
        (line,) = [r for r in cell.reasons if r.startswith("Across the study's 4 cells: ")]
        assert line.endswith(across["sentences"][-1])
        assert cell.recommendation == "relu" or f"{cell.recommendation}'s gap to relu" in line
    for page in (render_html(data, {}), render_markdown(data, set())):
        assert "Across the 4 cells" in page and "swiglu's gap to relu" in html.unescape(page)


def test_the_summary_reads_back_from_its_json(two_axis_store):
    """protocol.json keeps summaries as JSON: every record reads back to the same JSON (the across-cells
    tests, the literature, the settings)."""
    _, printed = two_axis_store
    again = Summary.from_json(printed)
    assert again.across_cells is not None and again.cells[0].literature is not None
    assert json.loads(json.dumps(again.to_json())) == printed


def row(ffn: str, **fields) -> VariantRow:
    """A VariantRow with empty statistics but `fields`."""
    stats = VariantStats(ffn=ffn, rank=1, n_seeds=0, mean=None, std=None, ci_low=None, ci_high=None, delta=None,
                         delta_ci_low=None, delta_ci_high=None, n_pairs=0, p=None, p_adj=None, significant=False,
                         diverged=0)  # fmt: skip
    return replace(VariantRow.of(stats), **fields)


def cell(axes: dict, rows: list[VariantRow]) -> Cell:
    return Cell(axes, "lm", "final_val_loss", "relu", "lower", 0.05, 0.95, rows, verdict="")


def test_across_cells_words_holm_and_the_best_of_each_cell():
    def lr_cell(lr, gelu_shift, swiglu_shift):
        base = {0: 2.0, 1: 2.3, 2: 2.1, 3: 2.6}  # large seed-to-seed spread, shared by the variants
        noise = {0: 0.001, 1: -0.002, 2: 0.0, 3: 0.001} if lr < 5e-3 else {0: -0.001, 1: 0.0, 2: 0.002, 3: -0.001}
        values = {
            "relu": base,
            "gelu": {s: x + gelu_shift + noise[s] for s, x in base.items()},
            "swiglu": {s: x + swiglu_shift - noise[s] for s, x in base.items()},
        }
        means = {v: sum(x.values()) / 4 for v, x in values.items()}
        ranks = shared_ranks(means)  # as compare ranks them
        rows = [row(v, values=values[v], mean=means[v], rank=ranks[v], delta=means[v] - means["relu"]) for v in values]
        return cell({"lr": lr}, sorted(rows, key=lambda r: r.mean))

    # gelu's gap does not move (0.01 in both cells); swiglu's goes from -0.05 to +0.05: it wins one cell only
    got = across_cells([lr_cell(1e-3, 0.01, -0.05), lr_cell(1e-2, 0.01, 0.05)], "relu")
    assert got is not None
    gelu, swiglu = got.variants["gelu"], got.variants["swiglu"]
    assert swiglu.p is not None and not gelu.differs and swiglu.differs and swiglu.p_adj == min(1.0, 2 * swiglu.p)
    assert got.best == [["swiglu"], ["relu"]]
    words = {sentence.split("'")[0]: sentence for sentence in got.sentences[:2]}  # the first cell's ranking order
    assert words["gelu"].startswith("gelu's gap to relu shows no detectable change between cells (F(1, 3) = ")
    assert words["swiglu"].startswith("swiglu's gap to relu changes between cells (F(1, 3) = ")
    assert "-0.0500 at lr=0.001; +0.0500 at lr=0.01." in words["swiglu"]
    assert got.sentences[2] == "The best mean differs between cells: swiglu at lr=0.001; relu at lr=0.01."
    assert across_cells([lr_cell(1e-3, 0.01, -0.05)], "relu") is None  # one cell: nothing to compare across


def test_tuned_cells_choose_on_validation_and_compare_on_test():
    def measured(ffn, val, test):
        return row(ffn, mean=sum(val.values()) / len(val), test_values=test)

    # relu is best at lr 1e-3 on validation, swiglu at 2e-3; the test numbers are what gets compared
    cells = [
        cell(
            {"lr": 1e-3},
            [
                measured("relu", {0: 2.0, 1: 2.1, 2: 2.0}, {0: 2.05, 1: 2.15, 2: 2.07}),
                measured("swiglu", {0: 2.2, 1: 2.2, 2: 2.3}, {0: 9.0, 1: 9.0, 2: 9.0}),
            ],
        ),
        cell(
            {"lr": 2e-3},
            [
                measured("relu", {0: 2.5, 1: 2.5, 2: 2.5}, {0: 9.0, 1: 9.0, 2: 9.0}),
                measured("swiglu", {0: 1.9, 1: 1.95, 2: 1.9}, {0: 1.96, 1: 2.0, 2: 1.98}),
            ],
        ),
    ]
    (tuned,) = tuned_cells(cells, "lr")
    rows = {r.ffn: r for r in tuned.variants}
    assert tuned.axes == {"lr": "tuned"} and tuned.metric == "final_test_loss"
    assert rows["relu"].tuned["lr"] == 1e-3 and rows["swiglu"].tuned["lr"] == 2e-3
    assert rows["swiglu"].mean == pytest.approx((1.96 + 2.0 + 1.98) / 3)
    assert rows["swiglu"].delta == pytest.approx((1.96 + 2.0 + 1.98 - 2.05 - 2.15 - 2.07) / 3)
    assert rows["swiglu"].tuned["val_mean"] == pytest.approx((1.9 + 1.95 + 1.9) / 3)
    assert rows["swiglu"].to_json()["lr"] == 2e-3  # compare --json keeps the chosen setting beside the row


def test_learned_parameters_average_over_seeds():
    per_seed = [
        {"blocks.0.ffn": {"beta": 1.0, "weights": {"relu": 0.2, "gelu": 0.8}}},
        {"blocks.0.ffn": {"beta": 2.0, "weights": {"relu": 0.4, "gelu": 0.6}}},
    ]
    got = learned_mean(per_seed)["blocks.0.ffn"]
    assert got["beta"] == 1.5 and got["weights"]["relu"] == pytest.approx(0.3)
    assert math.isclose(sum(got["weights"].values()), 1.0)


DATA = Path(__file__).parent / "data"


def assert_holds(recorded, printed, where="compare --json"):
    """Every key and value of `recorded` is in `printed` (which may add keys); floats to 1e-12."""
    if isinstance(recorded, dict):
        assert isinstance(printed, dict), where
        for key, value in recorded.items():
            assert key in printed, f"{where}: '{key}' is gone"
            assert_holds(value, printed[key], f"{where}.{key}")
    elif isinstance(recorded, list):
        assert isinstance(printed, list) and len(printed) == len(recorded), where
        for i, (a, b) in enumerate(zip(recorded, printed)):
            assert_holds(a, b, f"{where}[{i}]")
    elif isinstance(recorded, float):
        assert printed == pytest.approx(recorded, rel=1e-12, abs=0), where
    else:
        assert printed == recorded, where


def test_compare_json_of_the_default_study_is_unchanged(run_cli, tmp_path):
    # default_study.db: `./run.sh compare --json` on the Intel Xeon (AMX) class, metrics and events cut out
    # (the summary reads neither), and what that ffnlab (0.2.0, before typed records) printed
    store = tmp_path / "s.db"
    shutil.copy(DATA / "default_study.db", store)
    # bf16 as recorded: with the machine's own 'auto' another CPU would plan other runs and train them
    code, out, err = run_cli("compare", "--json", "--no-report", "--precision", "bf16", "--store", store)
    assert code == 0, err
    printed = json.loads(out)
    assert printed.pop("store") == str(store)
    assert_holds(json.loads((DATA / "default_study.json").read_text()), printed)


@pytest.mark.parametrize("task", ["lm", "cls", "reg"])
def test_compare_json_of_a_recorded_store_of_each_task_is_unchanged(run_cli, tmp_path, monkeypatch, task):
    # recorded_study/store.db: `ffnlab compare --preset smoke --seeds 2 --steps 5 --jobs 1 --precision fp32
    # --store store.db --json --no-report`, then with `--data cls.jsonl --task cls` and `--data reg.jsonl --task
    # reg` (two classes: accuracy, macro-F1, Matthews, F1 of class 1; a regressor: Pearson, Spearman, MSE), by the
    # ffnlab of flat run results (metrics and events cut out: the summary reads neither); compare.json is what
    # each printed. Every run is in the store, so nothing trains and every number is the stored one
    for name in ("store.db", "cls.jsonl", "reg.jsonl"):
        shutil.copy(DATA / "recorded_study" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)  # the runs' configs name their data relative to where they ran
    data = [] if task == "lm" else ["--data", f"{task}.jsonl", "--task", task]
    flags = ["--preset", "smoke", "--seeds", 2, "--steps", 5, "--precision", "fp32", "--store", "store.db"]
    code, out, err = run_cli("compare", *flags, *data, "--json", "--no-report")
    assert code == 0, err
    printed = json.loads(out)
    assert printed.pop("store") == "store.db"
    recorded = json.loads((DATA / "recorded_study" / "compare.json").read_text())[task]
    assert_holds(recorded, printed)
    # the one key added since: each cell's gradients by depth, here a note (the store holds no logged norms)
    assert all(set(cell.pop("depth")) == {"note"} for cell in printed["cells"])
    assert_holds(printed, recorded, "compare --json (no other key added)")


def test_the_stability_table_counts_non_finite_and_blown_up_runs_apart():
    from ffnlab.run.config import TrainConfig
    from ffnlab.study.metrics import shown_in
    from ffnlab.study.records import RunRecord, RunStatus
    from ffnlab.study.summary import summarize_cell
    from tests.conftest import run_result

    def item(ffn, seed, kind=None):
        cfg = TrainConfig(model=replace(TrainConfig().model, ffn=ffn), seed=seed)
        if kind is None:
            status, result = RunStatus.FINISHED, run_result(ffn=ffn, seed=seed, final_val_loss=2.0 + seed / 10)
        else:  # an older store's diverged run has no diverged_kind: it went non-finite, the only kind there was
            status = RunStatus.DIVERGED
            result = run_result(ffn=ffn, seed=seed, status="diverged", final_val_loss=None, diverged_step=7,
                                diverged_kind=None if kind == "old" else kind)  # fmt: skip
        record = RunRecord(f"{ffn}{seed}", cfg.to_dict(), status, result, None, {}, None, 1, 0.0, 0.0, 1.0)
        return cfg, record

    items = [item("relu", s) for s in range(4)]
    items += [item("gelu", 0), item("gelu", 1, "blowup"), item("gelu", 2, "nonfinite"), item("gelu", 3, "old")]
    cell = summarize_cell(items, ["relu", "gelu"], "relu", 4, {})
    rows = {r.ffn: r for r in cell.variants}
    assert (rows["gelu"].metrics["nonfinite_runs"], rows["gelu"].metrics["blowup_runs"]) == (2, 1)
    assert (rows["relu"].metrics["nonfinite_runs"], rows["relu"].metrics["blowup_runs"]) == (0, 0)
    assert rows["gelu"].diverged == 3 and rows["gelu"].runs == 4
    assert {"nonfinite_runs", "blowup_runs"} <= {m.name for m in shown_in("stability")}


@pytest.mark.parametrize(
    "task, field", [("tokens", "final_val_f1"), ("cls", "final_val_acc"), ("image", "final_val_acc")]
)
def test_a_cell_of_a_scored_task_ranks_the_higher_score_first_whatever_the_loss(task, field):
    from ffnlab.run.config import TrainConfig
    from ffnlab.study.records import RunRecord, RunStatus
    from ffnlab.study.summary import summarize_cell
    from tests.conftest import run_result

    score = {"relu": 0.4, "gelu": 0.7, "silu": 0.55}  # the lowest loss is relu's: a loss ranking would put it first
    items = []
    for ffn, value in score.items():
        for seed in range(3):
            cfg = TrainConfig(model=replace(TrainConfig().model, task=task, ffn=ffn), seed=seed)
            result = run_result(ffn=ffn, seed=seed, task=task, final_val_loss=value, **{field: value + seed / 100})
            items.append((cfg, RunRecord(f"{ffn}{seed}", cfg.to_dict(), RunStatus.FINISHED, result, None, {}, None, 1,
                                         0.0, 0.0, 1.0)))  # fmt: skip
    cell = summarize_cell(items, list(score), "relu", 3, {})
    assert cell.metric == field and cell.metric_direction == "higher"
    assert [(r.ffn, r.rank) for r in cell.variants] == [("gelu", 1), ("silu", 2), ("relu", 3)]
    assert cell.variants[0].mean == pytest.approx(0.71)


def test_an_exact_tie_is_named_wherever_the_best_mean_is(tmp_path):
    """0.5625 = 0.5625: no variant alone has the best mean, in the sentences across cells, the table and the advice."""
    from ffnlab.study.load import load_study
    from ffnlab.study.summary import summarize_study
    from ffnlab.study.table import format_table
    from tests.test_advise import fabricated_store

    ranked = lambda means: [row(v, mean=m, rank=shared_ranks(means)[v], values={}) for v, m in means.items()]
    tie = ranked({"gelu": 0.5625, "relu": 0.5625, "silu": 0.6})
    alone = ranked({"gelu": 0.5, "relu": 0.5625, "silu": 0.6})
    both = across_cells([cell({"lr": 1}, tie), cell({"lr": 2}, tie)], "relu")
    assert both is not None and both.best == [["gelu", "relu"], ["gelu", "relu"]]
    assert both.sentences[-1] == "The best mean is tied between gelu and relu in every cell."
    one = across_cells([cell({"lr": 1}, tie), cell({"lr": 2}, alone)], "relu")
    assert one is not None and one.best == [["gelu", "relu"], ["gelu"]]
    assert one.sentences[-1] == "The best mean differs between cells: gelu and relu (tied) at lr=1; gelu at lr=2."
    assert type(one).from_json({**one.to_json(), "best": ["gelu", None]}).best == [["gelu"], []]  # an older JSON

    store = fabricated_store(tmp_path / "s.db", {"relu": 2.0, "gelu": 0.5625, "swiglu": 0.5625})
    study, runs, _ = load_study(store)
    summary = summarize_study(study, store, runs)
    assert [(r.ffn, r.rank) for r in summary.cells[0].variants] == [("gelu", 1), ("swiglu", 1), ("relu", 3)]
    table = format_table(summary).splitlines()
    assert [line.split()[:2] for line in table[1:4]] == [["1", "gelu"], ["1", "swiglu"], ["3", "relu"]]
    reasons = " ".join(advise(store=store).reasons)
    assert "gelu and swiglu tie for the best mean final val loss" in reasons and "gelu has the best" not in reasons


@pytest.mark.parametrize(
    ("axis", "values", "row", "fixed"),
    [
        (
            "warmup",
            [2, 10],
            "learning rate and schedule",
            ("{b.warmup_steps} warm-up steps", "of {b.warmup_steps} steps"),
        ),
        ("lr", [1e-3, 3e-3], "learning rate and schedule", ("peak {b.lr:g}",)),
        ("context", [16, 64], "budget", ("x {b.model.context} tokens",)),
        ("tokens", [4096, 8192], "budget", ("{b.max_steps} steps",)),
        ("precision", ["fp32", "bf16"], "precision", ()),  # it said the base's one precision
    ],
)
def test_what_an_axis_varies_is_never_said_to_be_held_equal_at_the_base_value(axis, values, row, fixed):
    """compare --warmup-axis 2,10 (with --from too) held equal 'a fresh warm-up of 20 steps': the base's value."""
    from ffnlab.run.presets import preset_config
    from ffnlab.study.plan import Study
    from ffnlab.study.summary import held_equal

    base = preset_config("smoke")
    for b in (base, replace(base, init_from="/a/folder", init_digest="0" * 16)):  # fine-tuning: its warm-up row too
        held = dict(held_equal(Study(["relu", "gelu"], 2, b, axes={axis: values})).held_equal)
        assert f"per the {axis} axis ({', '.join(map(str, values))})" in held[row]
        for phrase in fixed:
            assert all(phrase.format(b=b) not in how for how in held.values()), (phrase, held)
        if b.init_from and axis == "warmup":
            assert held["warm-up"].endswith("its steps per the warmup axis (2, 10)")


def test_settings_per_variant_are_the_users_unless_the_protocol_chose_them(tmp_path):
    """--opt gelu:lr=1e-3 was described as 'tuned on validation', though the user set it."""
    from ffnlab.run.presets import preset_config
    from ffnlab.study.plan import Study
    from ffnlab.study.protocol import Protocol, load_protocol, protocol_path
    from ffnlab.study.summary import chosen_by_protocol, settings_of

    store = tmp_path / "s.db"
    study = Study(["relu", "gelu"], 2, preset_config("smoke"), per_variant={"gelu": {"lr": 1e-3, "warmup_steps": 2}})

    def per_variant_row(study):
        return dict(settings_of(study, chosen_by_protocol(study, load_protocol(store))).not_equal)[
            "per-variant settings"
        ]

    assert per_variant_row(study) == (
        "lr, warmup_steps set per variant (gelu: lr 0.001, warmup_steps 2) by the user; the rest of the schedule as "
        "in the base"
    )
    protocol_path(store).write_text(json.dumps(Protocol({}, study.per_variant, []).to_json()))  # what it chose
    assert "by the validation protocol, each chosen on validation" in per_variant_row(study)
    own = replace(study, per_variant={"gelu": {"lr": 2e-3}})  # the user's own settings in the same store
    assert per_variant_row(own).endswith("(gelu: lr 0.002) by the user; the rest of the schedule as in the base")
    assert "tuned" not in per_variant_row(own)


@pytest.mark.slow
def test_the_settings_of_a_hugging_face_study_give_the_shape_it_trained(run_cli, tmp_path):
    """compare --hf-config reported ffnlab's own model (the preset's layers, heads and d_model), not the config's."""
    from ffnlab.study.render import settings_rows

    config = tmp_path / "gpt2.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 24, "n_layer": 3, "n_head": 3}))
    small = ["--steps", 2, "--eval-batches", 1, "--final-eval-batches", 1, "--no-stats", "--no-report", "--json"]
    argv = ["--preset", "smoke", "--variants", "gelu_new,relu", "--seeds", 1, *small]
    code, out, err = run_cli("compare", *argv, "--hf-config", config, "--store", tmp_path / "s.db")
    assert code == 0, err
    settings = json.loads(out)["settings"]
    # the config's depth, heads and width, at the context the runs trained at (the preset's: it overrides n_positions)
    assert settings["model"] == {"n_layers": 3, "n_heads": 3, "d_model": 24, "context": 32}
    architecture = "Hugging Face gpt2 (FFN swapped per variant)"
    rows = dict(settings_rows(StudySettings.from_json(settings), {}, "gelu_new", "s.db", architecture))
    assert rows["model"] == "3 layers, 3 heads, d_model 24, context 32"  # no norm or positions of ffnlab's own
    assert "task lm, 3 layers, d_model 24" in advise(store=tmp_path / "s.db").reasons[0]  # advise's evidence too


# ---- the GLUE-style average over the datasets of a data axis ----------------------------------------


def cls_cell(axes: dict, values: dict[str, dict[int, float]]) -> Cell:
    """A classification cell whose rows hold per-seed accuracies `values` and their means."""
    rows = [row(v, values=x, mean=sum(x.values()) / len(x)) for v, x in values.items()]
    return Cell(axes, "cls", "final_val_acc", "relu", "higher", 0.05, 0.95, rows, verdict="")


def test_the_glue_style_average_is_paired_over_datasets_and_seeds():
    from ffnlab.study.records import Aggregate
    from ffnlab.study.stats import paired_diff
    from ffnlab.study.summary import aggregate
    from ffnlab.study.table import aggregate_lines

    # seed 1 is hard on dataset a and easy on b for both variants: pairing by seed cancels it
    a = cls_cell(
        {"data": "glue/a.csv"}, {"relu": {0: 0.6, 1: 0.4, 2: 0.7}, "gelu": {0: 0.64, 1: 0.45, 2: 0.73, 3: 0.9}}
    )
    b = cls_cell({"data": "glue/b.csv"}, {"relu": {0: 0.5, 1: 0.8, 2: 0.6}, "gelu": {0: 0.52, 1: 0.81, 2: 0.63}})
    (agg,) = aggregate([a, b], "relu")
    assert agg.datasets == ["glue/a.csv", "glue/b.csv"] and agg.axes == {} and agg.metric == "final_val_acc"
    assert agg.values["gelu"] == pytest.approx({0: 0.58, 1: 0.63, 2: 0.68})  # seed 3 ran on a only
    assert agg.left_out == {"gelu": [3]}
    assert agg.scores["gelu"] == pytest.approx([(0.64 + 0.45 + 0.73 + 0.9) / 4, (0.52 + 0.81 + 0.63) / 3])
    gelu = agg.row("gelu")
    want = paired_diff(agg.values["gelu"], agg.values["relu"])
    assert gelu.mean == pytest.approx(0.63) and gelu.rank == 1 and gelu.n_seeds == 3
    assert (gelu.delta, gelu.delta_ci_low, gelu.delta_ci_high, gelu.p) == (
        want.delta,
        want.ci_low,
        want.ci_high,
        want.p,
    )
    assert gelu.delta == pytest.approx(0.03) and gelu.significant  # the seeds' spread cancels in the pairs
    assert Aggregate.from_json(json.loads(json.dumps(agg.to_json()))) == agg  # protocol.json reads it back
    lines = aggregate_lines(agg)
    assert lines[0].startswith("GLUE-style average over 2 datasets (per seed the mean over the datasets")
    assert lines[1].split()[:5] == ["rank", "ffn", "a.csv", "b.csv", "average"]
    assert lines[2].split()[:4] == ["1", "gelu", "0.6800", "0.6533"]
    assert lines[-1] == "  left out of the average (not finished on every dataset): gelu seed 3"

    # one average per setting of the other axes; none over one dataset, none for language models
    by_depth = [cls_cell({"data": d, "depth": n}, {"relu": {0: 0.5}, "gelu": {0: 0.6}}) for n in (1, 2) for d in "ab"]
    assert [g.axes for g in aggregate(by_depth, "relu")] == [{"depth": 1}, {"depth": 2}]
    assert aggregate([a], "relu") == [] and aggregate([cls_cell({"depth": 1}, {"relu": {0: 0.5}})], "relu") == []
    lm = [replace(c, task="lm", metric="final_val_loss", metric_direction="lower") for c in (a, b)]
    assert aggregate(lm, "relu") == []


def write_cls_csv(path, offset: int):
    """A tiny classification CSV: the label says whether the row's number is odd."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            "text,label\n" + "".join(f"item {i + offset} of {i % 7},{'odd' if i % 2 else 'even'}\n" for i in range(80))
        )
    return path


@pytest.mark.slow
def test_a_two_dataset_study_prints_the_glue_style_average(run_cli, tmp_path):
    first, second = write_cls_csv(tmp_path / "first.csv", 0), write_cls_csv(tmp_path / "second.csv", 1000)
    store = tmp_path / "s.db"
    study = ["compare", "--preset", "smoke", "--precision", "fp32", "--task", "cls", "--variants", "relu,gelu", "--seeds", 3, "--steps", 3,
             "--eval-every", 3, "--jobs", 1, "--data-axis", f"{first},{second}", "--store", store]  # fmt: skip
    code, out, err = run_cli(*study)
    assert code == 0, err
    assert "GLUE-style average over 2 datasets (per seed the mean over the datasets" in out
    head = next(line for line in out.splitlines() if line.split()[:3] == ["rank", "ffn", "first.csv"])
    assert "second.csv" in head and "average val acc [95% CI]" in head and "Δ vs relu" in head
    code, out, err = run_cli(*study, "--json", "--no-report")  # trains nothing twice
    printed = json.loads(out)
    (agg,) = printed["aggregate"]
    assert agg["datasets"] == [str(first), str(second)] and agg["metric"] == "final_val_acc"
    cells = {c["axes"]["data"]: {r["ffn"]: r for r in c["variants"]} for c in printed["cells"]}
    for ffn in ("relu", "gelu"):
        assert agg["scores"][ffn] == [cells[d][ffn]["mean"] for d in agg["datasets"]]
        per_seed = {s: (cells[str(first)][ffn]["values"][s] + cells[str(second)][ffn]["values"][s]) / 2 for s in "012"}
        assert agg["values"][ffn] == pytest.approx(per_seed)
    report = (tmp_path / "report").glob("*")
    pages = {p.name: p.read_text(encoding="utf-8") for p in report if p.suffix in (".html", ".md")}
    assert all("GLUE-style average over 2 datasets" in page for page in pages.values()) and len(pages) == 2


def test_an_lm_whose_activation_reads_the_batch_is_said_not_to_be_causal():
    """quantile ranks a token among all of the batch's, later positions too: its LM loss is not a causal LM's, and
    the comparison said nothing of it."""
    from ffnlab.run.presets import preset_config
    from ffnlab.study.plan import Study
    from ffnlab.study.summary import held_equal

    base = preset_config("smoke")
    rows = lambda study: dict(held_equal(study).not_equal)
    leaky = rows(Study(["gelu", "quantile", "mix:relu+quantile"], 2, base))["causality"]
    assert leaky.startswith("quantile and mix:relu+quantile: quantile ranks each token") and "unlike the other" in leaky
    assert "causality" not in rows(Study(["gelu", "relu"], 2, base))
    cls = replace(base, model=replace(base.model, task="cls"))
    assert "causality" not in rows(Study(["gelu", "quantile"], 2, cls))  # no LM: nothing to leak
    assert "causality" in rows(Study(["gelu", "quantile"], 2, cls, axes={"task": ["cls", "lm"]}))
    on_qkv = replace(base, model=replace(base.model, attn_act="quantile"))
    assert rows(Study(["gelu", "relu"], 2, on_qkv))["causality of attention"].startswith("quantile on Q/K/V")
    assert "causality of attention" in rows(Study(["gelu", "relu"], 2, base, axes={"attn_act": ["none", "k=quantile"]}))


def test_a_glu_norm_axis_says_which_variants_it_leaves_as_they_are():
    from ffnlab.study.plan import Study
    from ffnlab.study.summary import held_equal

    rows = dict(held_equal(Study(variants=["gelu", "swiglu"], axes={"glu_norm": ["none", "pre"]})).held_equal)
    assert rows["glu_norm"] == "norms around gated FFNs only: every cell trains the same model for gelu"
    assert "glu_norm" not in dict(held_equal(Study(variants=["gelu", "swiglu"])).held_equal)
