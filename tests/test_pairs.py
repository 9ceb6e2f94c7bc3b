"""Sentence pairs (ffnlab.data.pairs): two text columns as one classification example, joined by a separator id
that no text encodes to, truncated longest first; and the one-line errors around them."""

import csv
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffnlab.data.corpus import load_corpus
from ffnlab.data.pairs import PAIR_JOIN, encode_pair, fit_pair, join_pair, split_pair, text_fields
from ffnlab.data.tokenizer import TOKENIZERS, SeparatedTokenizer, build_tokenizer, tokenizer_from_state
from tests.conftest import TINY_MODEL

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "past", "houses", "under", "grey", "skies"]


def pair_rows(n: int = 120) -> list[dict]:
    """(premise, hypothesis, label) rows whose label says whether the hypothesis's word is in the premise."""
    rows = []
    for i in range(n):
        premise = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4 + i % 5))
        word = WORDS[(i * 7) % len(WORDS)]
        rows.append({"premise": premise, "hypothesis": f"{word} {i}", "label": "yes" if word in premise else "no"})
    return rows


def write_csv(path, rows, columns=("premise", "hypothesis", "label")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_text_field_names_one_column_or_two():
    assert text_fields("text") == ["text"]
    assert text_fields("premise, hypothesis") == ["premise", "hypothesis"]
    for bad, needle in (("a,b,c", "got 3 names: 'a', 'b', 'c'"), ("a,", "got 2 names: 'a', ''")):
        with pytest.raises(ValueError, match="one text column, or two for a sentence pair") as err:
            text_fields(bad)
        assert needle in str(err.value)


def test_a_pair_is_one_document_and_splits_back():
    doc = join_pair(f"a{PAIR_JOIN}b", "c")  # the joining character inside a text becomes a space
    assert doc == f"a b{PAIR_JOIN}c" and split_pair(doc) == ("a b", "c")
    with pytest.raises(ValueError, match="not a sentence pair"):
        split_pair("one text")


@pytest.mark.parametrize(
    "lengths, budget, kept",
    [
        ((3, 4), 10, (3, 4)),  # both fit: nothing cut
        ((3, 20), 10, (3, 7)),  # the short premise stays whole, the long hypothesis takes the rest
        ((20, 3), 10, (7, 3)),
        ((20, 20), 10, (5, 5)),  # both long: half each
        ((20, 20), 9, (5, 4)),  # the premise keeps the odd token
        ((6, 5), 9, (5, 4)),  # the longer loses one to draw level, then each loses one
        ((5, 5), 0, (0, 0)),
    ],
)
def test_pairs_are_truncated_longest_first(lengths, budget, kept):
    assert fit_pair(*lengths, budget) == kept


@given(st.integers(0, 60), st.integers(0, 60), st.integers(0, 80))
def test_truncation_fills_the_budget_and_cuts_the_longer_text_first(first, second, budget):
    a, b = fit_pair(first, second, budget)
    assert 0 <= a <= first and 0 <= b <= second and a + b == min(first + second, budget)
    # a text is cut only down to the other's kept length (the first text may keep one token more)
    assert a == first or a >= b
    assert b == second or b >= a - 1


@pytest.mark.parametrize("kind", TOKENIZERS)
def test_the_separator_is_an_id_no_text_encodes_to(tmp_path, kind):
    texts = [text for row in pair_rows(40) for text in (row["premise"], row["hypothesis"])]
    base = build_tokenizer(kind, texts, 300 if kind == "bpe" else None, cache_dir=str(tmp_path))
    tok = SeparatedTokenizer(base)
    assert tok.sep_id == base.vocab_size and tok.vocab_size == base.vocab_size + 1
    # the joining character and ASCII separators encode as the base tokenizer encodes them: never to sep_id
    for text in [*texts, f"a{PAIR_JOIN}b", "\x1c\x1d\x1e [SEP] <sep>"]:
        assert tok.sep_id not in tok.encode(text)
    premise, hypothesis = "the cat sat on a mat", "dogs ran"
    ids = encode_pair(tok, join_pair(premise, hypothesis), context=64)
    assert ids == [*base.encode(premise), tok.sep_id, *base.encode(hypothesis), tok.sep_id]
    assert " [SEP] " in tok.decode(ids)
    again = tokenizer_from_state(json.loads(json.dumps(tok.state())))
    assert isinstance(again, SeparatedTokenizer) and again.vocab_size == tok.vocab_size
    assert again.encode(premise) == tok.encode(premise)


def test_a_long_premise_is_cut_before_the_hypothesis(tmp_path):
    from ffnlab.data.load import load_data

    rows = pair_rows()
    rows[0]["premise"] = "the cat sat " * 40  # far past the context
    path = write_csv(tmp_path / "pairs.csv", rows)
    corpus, tok, splits = load_data(str(path), "cls", "char", None, "premise,hypothesis", "label", None, 32)
    assert corpus.classes == ["no", "yes"] and PAIR_JOIN not in tok.base.state()["chars"]
    for split in ("train", "val", "test"):
        for doc, ids in zip(corpus.documents(split), splits[split][0]):
            premise, hypothesis = split_pair(doc)
            ids = ids.tolist()
            assert len(ids) <= 32 and ids.count(tok.sep_id) == 2 and ids[-1] == tok.sep_id
            if len(premise) + len(hypothesis) > 30:  # cut: the hypothesis (short) stays whole
                assert ids[-len(hypothesis) - 1 : -1] == tok.encode(hypothesis) and len(ids) == 32


def test_a_sentence_pair_csv_trains_and_reports_accuracy_and_macro_f1(run_cli, tmp_path):
    path = write_csv(tmp_path / "pairs.csv", pair_rows())
    out = tmp_path / "r.json"
    code, printed, err = run_cli(
        "train", *TINY_MODEL, "--steps", 4, "--eval-every", 4, "--quiet", "--precision", "fp32", "--task", "cls", "--data", path,
        "--text-field", "premise,hypothesis", "--out", out,
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out.read_text())
    assert result["task"] == "cls" and result["vocab_size"] == len(set("".join(WORDS) + " 0123456789")) + 2
    assert 0.0 <= result["final_val_macro_f1"] <= 1.0 and 0.0 <= result["final_test_macro_f1"] <= 1.0
    assert "macro-F1" in printed


def test_pair_mistakes_are_one_line_naming_the_columns(run_cli, tmp_path):
    path = write_csv(tmp_path / "pairs.csv", pair_rows())
    tiny = ["train", *TINY_MODEL, "--steps", 2, "--quiet", "--out", tmp_path / "r.json"]
    for flags, needles in (
        # one text field where the data has two: the columns there are, and how to name the pair
        (["--task", "cls", "--data", path], ["no column 'text'", "columns: premise, hypothesis, label",
                                             "--text-field premise,hypothesis"]),
        (["--task", "cls", "--data", path, "--text-field", "premise,hypothesis,label"], ["got 3 names"]),
        (["--task", "cls", "--data", path, "--text-field", "premise, premise"], ["names the column 'premise' twice"]),
        (["--data", path, "--text-field", "premise,hypothesis"], ["sentence pair", "is for task cls, not lm"]),
        (["--task", "cls", "--text-field", "premise,hypothesis"], ["shakespeare corpus has no columns to pair"]),
        (["--task", "cls", "--data", path, "--text-field", "premise,claim"], ["no column 'claim'", "columns: "]),
    ):  # fmt: skip
        code, _, err = run_cli(*tiny, *flags)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert all(needle in err for needle in needles), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.csv"]  # nothing half-written


def test_a_pair_for_another_task_is_refused_in_the_same_words_by_the_config_and_the_loader(tmp_path):
    """TrainConfig and load_corpus each checked it, with messages of their own."""
    from ffnlab.data.corpus import load_corpus
    from ffnlab.run.config import TrainConfig

    path = write_csv(tmp_path / "pairs.csv", pair_rows())
    said = []
    for check in (lambda: TrainConfig(data=str(path), text_field="premise,hypothesis"),
                  lambda: load_corpus(str(path), "lm", text_field="premise,hypothesis")):  # fmt: skip
        with pytest.raises(ValueError) as e:
            check()
        said.append(str(e.value))
    said_once = "a sentence pair (text_field 'premise,hypothesis') is for task cls, not lm (task reg, a number per pair, reads one too)"
    assert said == [said_once] * 2


def test_a_saved_dataset_pairs_its_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = pair_rows()
    columns = {name: [r[name] for r in rows] for name in ("premise", "hypothesis", "label")}
    datasets.Dataset.from_dict({**columns, "idx": list(range(len(rows)))}).save_to_disk(str(tmp_path / "nli"))
    corpus = load_corpus(str(tmp_path / "nli"), task="cls", text_field="premise,hypothesis")
    truth = {join_pair(r["premise"], r["hypothesis"]): r["label"] for r in rows}
    for split in ("train", "val", "test"):
        for doc, label in zip(corpus.documents(split), corpus.labels(split)):
            assert corpus.classes[label] == truth[doc]
    with pytest.raises(ValueError, match="columns: premise, hypothesis, label, idx; a sentence pair names two"):
        load_corpus(str(tmp_path / "nli"), task="cls")


def test_a_pair_has_one_spelling_in_the_config():
    from ffnlab.core.model import ModelConfig
    from ffnlab.run.config import TrainConfig
    from ffnlab.study.plan import run_id

    spaced, tight = (
        TrainConfig(model=ModelConfig(task="cls"), text_field=f) for f in ("premise, hypothesis", "premise,hypothesis")
    )
    assert spaced.text_field == "premise,hypothesis" and run_id(spaced) == run_id(tight)
    assert TrainConfig(text_field=" text ").text_field == "text"


def test_a_sentence_pair_comparison_ranks_by_accuracy_with_macro_f1_beside_it(run_cli, tmp_path):
    path = write_csv(tmp_path / "pairs.csv", pair_rows())
    code, out, err = run_cli("compare", "--task", "cls", "--data", path, "--text-field", "premise,hypothesis",
                             "--variants", "relu,gelu", "--seeds", 2, *TINY_MODEL, "--steps", 2, "--eval-every", 2,
                             "--jobs", 1, "--store", tmp_path / "s.db", "--csv", tmp_path / "t.csv", "--no-report")  # fmt: skip
    assert code == 0, err
    head = next(line for line in out.splitlines() if line.split()[:2] == ["rank", "ffn"])
    assert "val acc [95% CI]" in head and "val macro-F1" in head
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["metric"] for r in rows] == ["final_val_acc"] * 2
    assert all(0 <= float(r["final_val_macro_f1"]) <= 1 and 0 <= float(r["final_test_macro_f1"]) <= 1 for r in rows)
    # the report's settings name the two columns (they said only 'pairs.csv (cls, char tokenizer)')
    from ffnlab.study.load import load_study
    from ffnlab.study.render import settings_rows
    from ffnlab.study.summary import settings_of

    settings = settings_of(load_study(tmp_path / "s.db")[0])
    assert settings.pair == ["premise", "hypothesis"] and type(settings).from_json(settings.to_json()) == settings
    data = dict(settings_rows(settings, {}, "relu", "s.db"))["data"]
    assert data == f"{path} (cls, sentence pairs: premise [SEP] hypothesis, char tokenizer)"


# ---- rows that are no pair, labels that are no class ------------------------------------------------------


def one_line(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("field", ["premise", "hypothesis"])
def test_a_pair_without_one_of_its_texts_is_refused_naming_the_row_and_field(tmp_path, field):
    rows = pair_rows()
    rows[5][field], rows[9][field] = "", "  "  # were accepted: the example was its other text and two separators
    path = write_csv(tmp_path / "pairs.csv", rows)
    message = one_line(lambda: load_corpus(str(path), "cls", text_field="premise,hypothesis"))
    assert message.startswith(f"{path} row 6: field '{field}' is empty (2 rows in all); a sentence pair needs both")
    rows[5][field], rows[9][field] = None, "fine"
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    message = one_line(lambda: load_corpus(str(tmp_path / "pairs.jsonl"), "cls", text_field="premise,hypothesis"))
    assert f"row 6: field '{field}' is null;" in message


def test_a_saved_dataset_pair_without_a_text_is_refused_not_dropped(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = pair_rows()
    columns = {name: [r[name] for r in rows] for name in ("premise", "hypothesis", "label")}
    columns["hypothesis"][7] = None  # was dropped silently
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "nli"))
    message = one_line(lambda: load_corpus(str(tmp_path / "nli"), task="cls", text_field="premise,hypothesis"))
    assert "[all] row 8: field 'hypothesis' is null" in message


@pytest.mark.parametrize("suffix", [".jsonl", "hf"])
def test_a_null_label_is_an_error_naming_the_row_as_a_missing_label_is(tmp_path, suffix):
    rows = pair_rows()
    rows[5]["label"] = None  # was dropped silently, while a row without the key was an error
    if suffix == "hf":
        datasets = pytest.importorskip("datasets")
        columns = {name: [r[name] for r in rows] for name in ("premise", "hypothesis", "label")}
        datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "nli"))
        path, where = tmp_path / "nli", f"{tmp_path / 'nli'} [all] row 6"
    else:
        path, where = tmp_path / "pairs.jsonl", f"{tmp_path / 'pairs.jsonl'} row 6"
        path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    message = one_line(lambda: load_corpus(str(path), "cls", text_field="premise,hypothesis"))
    assert message.startswith(f"{where}: field 'label' is null; every row of task cls needs its label")
    if suffix != "hf":
        del rows[5]["label"]
        path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
        assert one_line(lambda: load_corpus(str(path), "cls", text_field="premise,hypothesis")).startswith(
            f"{where} has no column 'label'"
        )


def test_one_class_pair_data_is_refused_as_one_class_of_images_is(tmp_path):
    path = write_csv(tmp_path / "pairs.csv", [dict(r, label="yes") for r in pair_rows()])  # trained to accuracy 1.0
    message = one_line(lambda: load_corpus(str(path), "cls", text_field="premise,hypothesis"))
    assert message.startswith(f"{path} has one class, 'yes', in its ") and "needs at least two classes" in message


def test_a_short_csv_row_names_its_row_and_the_missing_columns(tmp_path):
    path = write_csv(tmp_path / "pairs.csv", pair_rows())
    lines = path.read_text().splitlines()
    lines[6] = lines[6].split(",")[0]  # row 6 has its premise only
    lines[9] += ",extra"  # row 9 one field too many: an unquoted comma
    path.write_text("\n".join(lines) + "\n")
    message = one_line(lambda: load_corpus(str(path), "cls", text_field="premise,hypothesis"))
    assert message == (
        f"{path} row 6 (line 7) has 1 field where the header names 3 (premise, hypothesis, label); "
        "missing: hypothesis, label"
    )  # was "field 'hypothesis' is NoneType"
    lines[6] = ",".join(pair_rows()[5].values())
    path.write_text("\n".join(lines) + "\n")
    message = one_line(lambda: load_corpus(str(path), "cls", text_field="premise,hypothesis"))
    assert message.startswith(f"{path} row 9 (line 10) has 4 fields where the header names 3") and "quote" in message


def test_a_context_too_short_for_a_pair_is_refused_naming_the_minimum(run_cli, tmp_path):
    from ffnlab.core.model import ModelConfig
    from ffnlab.run.config import TrainConfig

    for context in (1, 3):  # 1 trained on separators alone; 4 holds a token of each text and two separators
        with pytest.raises(ValueError, match=f"context {context} is too short for a sentence pair, .* at least 4"):
            TrainConfig(model=ModelConfig(task="cls", context=context), text_field="premise,hypothesis")
    TrainConfig(model=ModelConfig(task="cls", context=4), text_field="premise,hypothesis")
    TrainConfig(model=ModelConfig(task="cls", context=1))  # one text: any context
    path = write_csv(tmp_path / "pairs.csv", pair_rows())
    code, _, err = run_cli("train", *TINY_MODEL, "--context", 1, "--task", "cls", "--data", path,
                           "--text-field", "premise,hypothesis", "--out", tmp_path / "r.json")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "give --context 4 or more" in err, err


def test_a_pair_regression_trains_through_the_cli_and_a_score_that_is_no_number_exits_2(run_cli, tmp_path):
    rows = [dict(r, label=f"{len(r['premise']) / 10:.1f}") for r in pair_rows(60)]  # a number per pair, as STS-B's
    path = write_csv(tmp_path / "sts.csv", rows)
    tiny = ["train", *TINY_MODEL, "--task", "reg", "--steps", 2, "--quiet", "--text-field", "premise,hypothesis"]
    code, out, err = run_cli(*tiny, "--data", path)
    assert code == 0, err
    assert "Pearson" in out and "Spearman" in out and "MSE" in out
    rows[9]["label"] = "n/a"
    code, _, err = run_cli(*tiny, "--data", write_csv(tmp_path / "bad.csv", rows))
    assert code == 2 and err.count("\n") == 1 and "bad.csv row 10: label 'n/a' in field 'label' is not a number" in err
