"""Token classification: CoNLL parsing, the bundled speaker-name task, vocabulary and batches, span F1."""

import random
import re
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ffnlab.core.model import IGNORE_INDEX
from ffnlab.data.tagging import (
    PAD_ID,
    Sentence,
    cut_words,
    parse_conll,
    span_f1,
    spans,
    speaker_sentences,
    tag_index,
    tagged_batch,
    word_ids,
    word_vocabulary,
)

# ---- a small learnable task the tests write: names and places among filler words --------------------

NAMES, SURNAMES, PLACES = ["Alice", "Bob", "Carol", "Dave"], ["Smith", "Jones"], ["Paris", "Rome"]
FILLER = ["the", "saw", "went", "to", "and", "met", "in", "a", "big", "city", "."]


def tagged_sentence(rng: random.Random) -> list[tuple[str, str]]:
    """3-8 pieces: a person (B-PER, maybe I-PER), a place (B-LOC) or a filler word (O)."""
    pairs = []
    for _ in range(rng.randint(3, 8)):
        draw = rng.random()
        if draw < 0.2:
            pairs.append((rng.choice(NAMES), "B-PER"))
            if rng.random() < 0.5:
                pairs.append((rng.choice(SURNAMES), "I-PER"))
        elif draw < 0.3:
            pairs.append((rng.choice(PLACES), "B-LOC"))
        else:
            pairs.append((rng.choice(FILLER), "O"))
    return pairs


def write_conll(folder: Path, sizes=(200, 40, 40), names=("train.txt", "valid.txt", "test.txt"), seed=0) -> Path:
    """CoNLL-2003-style files (a -DOCSTART- line, a POS column between word and tag) of `sizes` sentences."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in zip(names, sizes):
        sentences = ["\n".join(f"{word} X {tag}" for word, tag in tagged_sentence(rng)) for _ in range(n)]
        (folder / name).write_text("-DOCSTART- -X- O\n\n" + "\n\n".join(sentences) + "\n", encoding="utf-8")
    return folder


# ---- reading CoNLL -------------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

-DOCSTART- -X- -X- O
Peter\tI-PER


Blackburn B-PER
"""


def test_conll_lines_are_words_and_their_last_column():
    sentences = parse_conll(CONLL, "eng.train")
    assert [s.words for s in sentences] == [("EU", "rejects", "German", "call", "."), ("Peter",), ("Blackburn",)]
    assert [s.tags for s in sentences] == [("B-ORG", "O", "B-MISC", "O", "O"), ("I-PER",), ("B-PER",)]
    assert sentences[0].at(2) == "eng.train line 5" and sentences[1].at(0) == "eng.train line 10"
    assert sentences[0].text == "EU rejects German call ."


@pytest.mark.parametrize(
    "text,needle",
    [
        ("EU B-ORG\nrejects\n", "f.txt line 2: 'rejects' has a word but no tag"),
        ("EU NNP\n", "f.txt line 1: tag 'NNP' is not a BIO tag"),
        ("-DOCSTART- O\n\n\n", "f.txt has no tagged sentences"),
    ],
)
def test_a_line_without_a_tag_is_named_by_file_and_line(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_conll(text, "f.txt")


def test_a_tag_training_never_has_is_named_with_its_file_and_line():
    train = parse_conll("Paris B-LOC\nis O\n", "train.txt")
    test = parse_conll("Bob B-PER\n\nRome B-LOC\nfell B-EVENT\n", "test.txt")
    with pytest.raises(ValueError, match=r"test.txt line 1: tag 'B-PER' \(word 'Bob'\) is not in the training split"):
        tag_index(train, test)
    assert tag_index(train, test[1:][:0]) == {"B-LOC": 0, "O": 1}


# ---- span F1, as seqeval computes it -------------------------------------------------------------------

# seqeval's README and docstrings (https://github.com/chakki-works/seqeval)
Y_TRUE = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
Y_PRED = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]


def test_span_f1_on_seqevals_documented_example():
    assert span_f1(Y_TRUE, Y_PRED) == 0.5
    assert span_f1(Y_TRUE, Y_TRUE) == 1.0 and span_f1(Y_TRUE, [["O"] * 7, ["O"] * 3]) == 0.0
    assert spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]  # get_entities' docstring
    assert spans(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4)]  # IOB1
    assert spans(["B-PER", "I-LOC", "S-ORG", "B-X", "E-X"]) == [
        ("PER", 0, 0),
        ("LOC", 1, 1),
        ("ORG", 2, 2),
        ("X", 3, 4),
    ]
    with pytest.raises(ValueError, match="one predicted tag per true tag"):
        span_f1(Y_TRUE, [["O"]])


TAGS = st.sampled_from(["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "E-LOC", "S-PER"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(TAGS, TAGS), min_size=1, max_size=8), min_size=1, max_size=4))
def test_span_f1_equals_seqevals_f1_score(pairs):
    metrics = pytest.importorskip("seqeval.metrics")
    y_true = [[t for t, _ in sentence] for sentence in pairs]
    y_pred = [[p for _, p in sentence] for sentence in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns where no entity is found or to be found
        # where no entity is to be found seqeval says 0.0; span_f1 says undefined (None), not a tie at 0
        expected = metrics.f1_score(y_true, y_pred) if any(spans(tags) for tags in y_true) else None
        assert span_f1(y_true, y_pred) == pytest.approx(expected)
        assert span_f1(Y_TRUE, Y_PRED) == metrics.f1_score(Y_TRUE, Y_PRED)


# ---- the bundled task's derivation ------------------------------------------------------------------

PLAY = """ACT I

LADY MACBETH:
Come, Macbeth, and you, Sir Toby Belch.
The lady sleeps.

Enter MACBETH

MACBETH:
Lady Macbeth's here.

SIR TOBY BELCH:
sir, aye."""


def test_speaker_names_mentioned_in_speeches_are_tagged():
    sentences = speaker_sentences("play", PLAY)
    tagged = [[(w, t) for w, t in zip(s.words, s.tags) if t != "O"] for s in sentences]
    # 'Lady' and 'Sir' occur in lower case, so they are no name words; 'Enter MACBETH' is no speech
    assert tagged == [[("Macbeth", "B-SPK"), ("Toby", "B-SPK"), ("Belch", "I-SPK")], [("Macbeth", "B-SPK")]]
    assert sentences[1].words == ("Lady", "Macbeth", "'s", "here", ".") and sentences[1].source == "play speech 2"
    assert len(sentences) == 2  # 'sir, aye.' mentions no name: left out


def test_long_speeches_are_cut_on_lines_then_words():
    lines = [["a"] * 3, ["b"] * 2, ["c"] * 7, ["d"]]
    assert cut_words(lines, 5) == [["a"] * 3 + ["b"] * 2, ["c"] * 5, ["c"] * 2 + ["d"]]


# ---- words to ids, batches -----------------------------------------------------------------------------


def test_vocabulary_pads_with_its_own_id_and_keeps_the_most_frequent_words():
    vocab = word_vocabulary([["the", "cat", "the"], ["a", "<pad>", "the", "cat"]], vocab_size=4)
    assert vocab.itos == ["<unk>", "<pad>", "the", "cat"] and vocab.stoi["<pad>"] == PAD_ID
    assert word_ids(vocab, ["the", "dog"]).tolist() == [2, 0]
    docs = [torch.tensor([2, 3, 2]), torch.tensor([3])]
    tags = [torch.tensor([0, 1, 1]), torch.tensor([2])]
    x, y = tagged_batch(docs, tags, [1, 0], context=2)
    assert x.tolist() == [[3, PAD_ID], [2, 3]] and y.tolist() == [[2, IGNORE_INDEX], [0, 1]]  # padded, truncated


def test_a_dataset_rows_words_and_tags_become_a_sentence():
    from ffnlab.data.tagging import row_sentence

    s = row_sentence(["New York", "", "x"], [1, 2, 0], ["O", "B-LOC", "I-LOC"], "ds [train] row 3")
    assert s == Sentence(("New_York", "_", "x"), ("B-LOC", "I-LOC", "O"), "ds [train] row 3")
    with pytest.raises(ValueError, match="ds row 1: tag 7 is not a tag id"):
        row_sentence(["a"], [7], ["O"], "ds row 1")
    with pytest.raises(ValueError, match="the words are str 'a b', not a list; name the column of words"):
        row_sentence("a b", [0, 0], ["O"], "ds row 1")


# ---- data without entities: span F1 is undefined there -------------------------------------------------


def untag(folder: Path, *names: str) -> None:
    """Every tag of the files `names` in `folder` made O: sentences without an entity."""
    for name in names:
        path = folder / name
        path.write_text(re.sub(r" [BIES]-\S+$", " O", path.read_text(), flags=re.M))


def test_training_sentences_without_an_entity_are_refused(tmp_path):
    from ffnlab.data.corpus import load_corpus

    untag(write_conll(tmp_path / "ner"), "train.txt", "valid.txt", "test.txt")  # F1 0.0000 for every variant: a tie
    with pytest.raises(ValueError) as err:
        load_corpus(str(tmp_path / "ner"), task="tokens")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'ner'}: the training split's 200 sentences hold no")
    assert "span F1 is undefined" in message and "tag the entities (B-TYPE, I-TYPE)" in message


def test_span_f1_is_undefined_where_no_entity_is_to_be_found_and_the_run_says_so(run_cli, tmp_path):
    assert span_f1([["O", "O"]], [["B-PER", "O"]]) is None and span_f1([["O"]], [["O"]]) is None
    assert span_f1([["B-PER", "O"]], [["O", "O"]]) == 0.0  # an entity missed: 0, defined
    untag(write_conll(tmp_path / "ner"), "valid.txt")
    code, out, err = run_cli("train", "--task", "tokens", "--data", tmp_path / "ner", "--layers", 1, "--heads", 2,
                             "--d-model", 32, "--context", 32, "--batch-size", 4, "--steps", 2, "--eval-every", 2,
                             "--precision", "fp32", "--quiet")  # fmt: skip
    assert code == 0, err
    line = next(line for line in out.splitlines() if "span F1" in line)
    assert line.startswith("  span F1 undefined, test 0.") and "with embedding noise undefined" in line  # was 0.0000
    assert "span F1 is undefined where the sentences evaluated hold no entity span" in out


def test_a_ranking_leaves_out_runs_whose_span_f1_is_undefined_and_says_why():
    """Every variant's F1 was 0.0000, ranked as a tie at 1 with no word of why."""
    from dataclasses import replace

    from ffnlab.run.config import TrainConfig
    from ffnlab.study.records import RunRecord, RunStatus
    from ffnlab.study.summary import summarize_cell
    from ffnlab.study.table import ranking_table
    from tests.conftest import run_result

    items = []
    for ffn in ("relu", "gelu"):
        for seed in range(2):
            cfg = TrainConfig(model=replace(TrainConfig().model, task="tokens", ffn=ffn), seed=seed)
            result = run_result(ffn=ffn, seed=seed, task="tokens", final_val_acc=0.9, final_val_f1=None)
            record = RunRecord(f"{ffn}{seed}", cfg.to_dict(), RunStatus.FINISHED, result, None, {}, None, 1, 0, 0, 1)
            items.append((cfg, record))
    cell = summarize_cell(items, ["relu", "gelu"], "relu", 2, {})
    assert not cell.missing  # they finished: not 'failed or not yet run'
    assert "val F1 is undefined (the validation sentences evaluated hold no entity span" in cell.verdict
    assert "left out: relu seeds 0, 1; gelu seeds 0, 1." in cell.verdict
    assert all(r.mean is None and r.runs == 2 and r.metrics["token_acc"] == 0.9 for r in cell.variants)
    assert [row[0] for row in ranking_table(cell).rows] == ["-", "-"]  # no mean, no rank: not a tie for first


# ---- messages that list the data's names stay short ---------------------------------------------------


def test_a_tag_training_lacks_is_named_among_the_first_few_of_20000(tmp_path):
    from ffnlab.data.corpus import load_corpus

    (tmp_path / "train.txt").write_text("\n\n".join(f"w{i} B-T{i}" for i in range(20_000)) + "\n")
    (tmp_path / "valid.txt").write_text("w B-NEW\n")
    (tmp_path / "test.txt").write_text("w B-T0\n")
    with pytest.raises(ValueError) as err:
        load_corpus(str(tmp_path), task="tokens")
    message = str(err.value)  # was 151,663 characters
    assert len(message) < 600 and "whose 20,000 tags are B-T0, B-T1, " in message and "and 19,992 more" in message
    with pytest.raises(ValueError) as err:
        from ffnlab.data.tagging import row_sentence

        row_sentence(["a"], [20_000], [f"B-T{i}" for i in range(20_000)], "ds row 1")
    assert len(str(err.value)) < 600 and "ds row 1: tag 20000 is not a tag id of the 20,000 tags" in str(err.value)
