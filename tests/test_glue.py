"""GLUE: the official metrics against their definitions (ffnlab.run.scores), the tasks read from GLUE's TSV files and
from save_to_disk folders (ffnlab.data.glue), and a GLUE study through the CLI."""

import json
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


# ---- GLUE's tasks from its TSV files and from save_to_disk -----------------------------------------------

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "past", "houses", "under", "grey", "skies"]
MNLI = ("entailment", "neutral", "contradiction")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7)))


def glue_rows(n: int = 40, dev: int = 12, seed: int = 0) -> dict[str, dict[str, list[tuple]]]:
    """Rows of four tasks, per split: CoLA (sentence, class), MRPC and MNLI (a pair, class), STS-B (a pair, score);
    MNLI has a matched and a mismatched dev set. A CoLA sentence holds an unbalanced quote, as GLUE's do."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, list[tuple]]] = {}
    for task, splits in (("cola", ("train", "dev")), ("mrpc", ("train", "dev")), ("stsb", ("train", "dev")),
                         ("mnli", ("train", "dev_matched", "dev_mismatched"))):  # fmt: skip
        rows[task] = {}
        for split in splits:
            k = n if split == "train" else dev
            if task == "cola":
                rows[task][split] = [(sentence(rng) + (' "so' if i == 3 else ""), i % 2) for i in range(k)]
            elif task == "stsb":
                rows[task][split] = [(sentence(rng), sentence(rng), (i % 11) / 2) for i in range(k)]
            else:
                rows[task][split] = [(sentence(rng), sentence(rng), i % (3 if task == "mnli" else 2)) for i in range(k)]
    return rows


def write_tsv(path, header, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(map(str, line)) + "\n" for line in ([header] if header else []) + lines), "utf-8")


def write_glue_tsv(root, rows):
    """The rows in GLUE's own layout: DIR/CoLA/train.tsv (no header), DIR/MRPC (a byte-order mark before its
    header), DIR/STS-B (its many columns), DIR/MNLI/dev_matched.tsv and dev_mismatched.tsv (labels as words)."""
    for split, lines in rows["cola"].items():
        write_tsv(root / "CoLA" / f"{split}.tsv", None, [("gj04", y, "" if y else "*", s) for s, y in lines])
    for split, lines in rows["mrpc"].items():
        write_tsv(root / "MRPC" / f"{split}.tsv", ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                  [(y, i, i + 1, a, b) for i, (a, b, y) in enumerate(lines)])  # fmt: skip
    for split, lines in rows["stsb"].items():
        header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
                  "score"]  # fmt: skip
        write_tsv(root / "STS-B" / f"{split}.tsv", header,
                  [(i, "main", "f", "2012", i, "s", "s", a, b, f"{y:.3f}") for i, (a, b, y) in enumerate(lines)])  # fmt: skip
    for split, lines in rows["mnli"].items():
        write_tsv(root / "MNLI" / f"{split}.tsv", ["index", "genre", "sentence1", "sentence2", "label1", "gold_label"],
                  [(i, "fiction", a, b, MNLI[y], MNLI[y]) for i, (a, b, y) in enumerate(lines)])  # fmt: skip
    return root


def write_glue_saved(root, rows):
    """The same rows as the `glue` dataset's configs saved by save_to_disk (DIR/cola, ...), a hidden test split
    (labels -1) beside them as GLUE has it."""
    datasets = pytest.importorskip("datasets")
    columns = {"cola": ("sentence",), "mrpc": ("sentence1", "sentence2"), "stsb": ("sentence1", "sentence2"),
               "mnli": ("premise", "hypothesis")}  # fmt: skip
    for task, splits in rows.items():
        parts = {}
        for split, lines in {**splits, "test": splits["train"][:5]}.items():
            table = {name: [line[i] for line in lines] for i, name in enumerate(columns[task])}
            table["label"] = (
                [-1.0 if task == "stsb" else -1] * len(lines) if split == "test" else [line[-1] for line in lines]
            )
            table["idx"] = list(range(len(lines)))
            parts[split.replace("dev", "validation")] = datasets.Dataset.from_dict(table)
        datasets.DatasetDict(parts).save_to_disk(str(root / task))
    return root


def test_the_tasks_read_alike_from_glues_tsv_files_and_from_save_to_disk(tmp_path):
    from ffnlab.data.corpus import load_corpus
    from ffnlab.data.pairs import join_pair

    rows = glue_rows()
    tsv, saved = write_glue_tsv(tmp_path / "tsv", rows), write_glue_saved(tmp_path / "saved", rows)
    for name, task in (("cola", "cls"), ("mrpc", "cls"), ("stsb", "reg"), ("mnli", "cls")):
        texts = {split: [line[0] if name == "cola" else join_pair(line[0], line[1]) for line in lines]
                 for split, lines in rows[name].items()}  # fmt: skip
        labels = {split: [float(line[-1]) if task == "reg" else line[-1] for line in lines]
                  for split, lines in rows[name].items()}  # fmt: skip
        a, b = (load_corpus(f"glue:{root}:{name}", task) for root in (tsv, saved))
        for corpus in (a, b):
            assert corpus.task == task
            # test is GLUE's dev set (matched for MNLI), val the 10% of train whose text hashes last
            dev = "dev_matched" if name == "mnli" else "dev"
            assert corpus.test == texts[dev] and corpus.test_labels == labels[dev]
            assert sorted(corpus.train + corpus.val) == sorted(texts["train"]) and 0 < len(corpus.val) < 10
            assert "test = GLUE's official dev set" in corpus.meta["split_rule"]
        assert (a.train, a.val, a.train_labels, a.val_labels, a.classes) == (
            b.train,
            b.val,
            b.train_labels,
            b.val_labels,
            b.classes,
        )
    mnli = load_corpus(f"glue:{tsv}:MNLI", "cls")  # any spelling of a task
    assert mnli.classes == list(MNLI) and mnli.more_tests == {
        "mismatched": (texts["dev_mismatched"], labels["dev_mismatched"])
    }
    assert load_corpus(f"glue:{tsv}:cola", "cls").test[3].endswith(' "so')  # an unbalanced quote, read as it is


def test_a_glue_task_trains_as_its_own_task_type():
    from ffnlab.run.config import TrainConfig

    stsb, cola, mnli = (TrainConfig(data=f"glue:/data/glue:{t}") for t in ("stsb", "cola", "mnli"))
    assert (stsb.model.task, stsb.text_field) == ("reg", "sentence1,sentence2")
    assert (cola.model.task, cola.text_field) == ("cls", "sentence")
    assert (mnli.model.task, mnli.text_field, mnli.label_field) == ("cls", "premise,hypothesis", "label")
    assert TrainConfig(data="glue:/data/glue").model.task == "lm"  # the suite: compare makes it a data axis


def test_qqps_lines_cut_short_are_skipped_and_named_as_transformers_skips_them(tmp_path):
    from ffnlab.data.corpus import load_corpus

    rng = random.Random(4)
    lines = [(i, 2 * i, 2 * i + 1, sentence(rng), sentence(rng), i % 2) for i in range(70)]
    header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    write_tsv(tmp_path / "QQP" / "train.tsv", header, lines[:20] + [("", "Was it real?", 0)] + lines[20:60])
    write_tsv(tmp_path / "QQP" / "dev.tsv", header, lines[60:])
    corpus = load_corpus(f"glue:{tmp_path}:qqp", "cls")
    assert len(corpus.train) + len(corpus.val) == 60 and len(corpus.test) == 10
    assert corpus.meta["skipped_lines"] == [f"{tmp_path / 'QQP' / 'train.tsv'} line 22"]


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("no_folder", "GLUE task STS-B: no folder"),
        ("no_column", "STS-B/train.tsv has no column 'score' (STS-B; columns: index, genre"),
        ("bad_label", "CoLA/dev.tsv line 3: label 'x' is not one of 0, 1 (CoLA)"),
        ("bad_score", "STS-B/dev.tsv line 4: label 'high' in field 'score' is not a number"),
        ("short_row", "MNLI/dev_mismatched.tsv line 2 has 3 fields, no 'sentence2'"),
        ("no_dev", "GLUE task CoLA:"),
    ],
)
def test_a_missing_or_malformed_task_exits_2_in_one_line(run_cli, tmp_path, damage, needle):
    root = write_glue_tsv(tmp_path / "glue", glue_rows(n=12, dev=4))
    if damage == "no_folder":
        for f in (root / "STS-B").iterdir():
            f.unlink()
        (root / "STS-B").rmdir()
    elif damage == "no_column":
        path = root / "STS-B" / "train.tsv"
        path.write_text(path.read_text("utf-8").replace("\tscore\n", "\tsimilarity\n", 1), "utf-8")
    elif damage == "bad_label":
        path = root / "CoLA" / "dev.tsv"
        lines = path.read_text("utf-8").splitlines()
        lines[2] = "gj04\tx\t\tthe cat"
        path.write_text("\n".join(lines) + "\n", "utf-8")
    elif damage == "bad_score":
        path = root / "STS-B" / "dev.tsv"
        lines = path.read_text("utf-8").splitlines()
        lines[3] = lines[3].rsplit("\t", 1)[0] + "\thigh"
        path.write_text("\n".join(lines) + "\n", "utf-8")
    elif damage == "short_row":
        path = root / "MNLI" / "dev_mismatched.tsv"
        lines = path.read_text("utf-8").splitlines()
        lines[1] = "\t".join(lines[1].split("\t")[:3])
        path.write_text("\n".join(lines) + "\n", "utf-8")
    else:
        (root / "CoLA" / "dev.tsv").unlink()
    flags = ["--glue-tasks", "cola,stsb,mnli", "--variants", "gelu,relu", "--seeds", 2, "--steps", 1]
    code, out, err = run_cli("compare", "--data", f"glue:{root}", *flags, "--store", tmp_path / "s.db", "--no-report")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err


def test_an_unknown_task_name_exits_2_naming_the_valid_ones(run_cli, tmp_path):
    root = write_glue_tsv(tmp_path / "glue", glue_rows(n=12, dev=4))
    code, _, err = run_cli("compare", "--data", f"glue:{root}", "--glue-tasks", "cola,stbs", "--store", tmp_path / "s")
    assert code == 2 and err.count("\n") == 1
    assert (
        "unknown GLUE task 'stbs' (did you mean 'stsb'?); valid: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli"
        in err
    )
    code, _, err = run_cli("compare", "--glue-tasks", "cola", "--store", tmp_path / "s")
    assert code == 2 and "--glue-tasks picks tasks of GLUE's suite: add --data glue:DIR" in err
    code, _, err = run_cli("train", "--data", f"glue:{root}", "--steps", 1)
    assert code == 2 and "names GLUE's suite; a run trains one task: glue:" in err


# ---- a GLUE study through the CLI ---------------------------------------------------------------------------


def test_compare_on_glue_prints_each_tasks_official_metrics_and_the_glue_score(run_cli, tmp_path):
    root = write_glue_tsv(tmp_path / "glue", glue_rows())
    store = tmp_path / "s.db"
    study = ["compare", "--data", f"glue:{root}", "--glue-tasks", "stsb,CoLA", "--variants", "gelu,swiglu",
             "--seeds", 2, "--steps", 5, "--preset", "smoke", "--precision", "fp32", "--jobs", 1, "--store", store]  # fmt: skip
    code, out, err = run_cli(*study)
    assert code == 0, err
    assert f"data=glue:{root}:cola" in out and f"data=glue:{root}:stsb" in out  # a cell per task, in GLUE's order
    assert "GLUE score over 2 tasks (per seed the mean over each task's score" in out
    head = next(line for line in out.splitlines() if "CoLA Matthews" in line)
    assert head.split()[:8] == ["rank", "ffn", "CoLA", "Matthews", "STS-B", "Pearson", "STS-B", "Spearman"]
    assert "GLUE score [95% CI]" in head and "GLUE protocol: test = each task's official dev set" in out
    code, out, err = run_cli(*study, "--json", "--no-report")  # trains nothing twice
    assert code == 0, err
    printed = json.loads(out)
    (agg,) = printed["aggregate"]
    assert agg["metric"] == "glue_score" and agg["columns"] == ["CoLA Matthews", "STS-B Pearson", "STS-B Spearman"]
    cells = {c["axes"]["data"].rsplit(":", 1)[1]: {r["ffn"]: r for r in c["variants"]} for c in printed["cells"]}
    results = {}  # (task, ffn, seed) -> the run's result, as the store holds it
    from ffnlab.study.store import Store

    with Store(store, read_only=True) as s:
        for rec in s.runs():
            results[(rec.config["data"].rsplit(":", 1)[1], rec.config["model"]["ffn"], rec.config["seed"])] = rec.result
    for ffn in ("gelu", "swiglu"):
        for seed in (0, 1):
            cola, stsb = results[("cola", ffn, seed)], results[("stsb", ffn, seed)]
            want = glue_score({"cola": cola.test.mcc,
                               "stsb": task_score([stsb.test.pearson, stsb.test.spearman])})  # fmt: skip
            assert agg["values"][ffn][str(seed)] == pytest.approx(want)
        mean = sum(agg["values"][ffn].values()) / 2
        assert next(r for r in agg["variants"] if r["ffn"] == ffn)["mean"] == pytest.approx(mean)
        pearsons = [results[("stsb", ffn, s)].test.pearson for s in (0, 1)]
        assert agg["scores"][ffn][1] == pytest.approx(sum(pearsons) / 2)
        assert cells["stsb"][ffn]["glue_score"] is not None and cells["cola"][ffn]["final_test_mcc"] is not None
    pages = [p.read_text(encoding="utf-8") for p in (tmp_path / "report").glob("*") if p.suffix in (".html", ".md")]
    assert len(pages) == 2 and all("GLUE score over 2 tasks" in p and "STS-B Spearman" in p for p in pages)
