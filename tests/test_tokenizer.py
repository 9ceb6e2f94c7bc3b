import functools
import json
import os
import random

import numpy as np
import pytest

from ffnlab.data import tokenizer as tk
from ffnlab.data.tokenizer import TOKENIZERS, build_tokenizer, tokenizer_from_state
from ffnlab.run.config import TrainConfig, identity
from tests.conftest import TINY_MODEL, within

CORPUS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n",
] * 20
SAMPLE = "To be, or not to be: the slings\nand arrows of fortune,\n"  # only characters of CORPUS
UNICODE = "caf\u00e9 \u00fcber na\u00efve \u2014 \u6771\u4eac \U0001f642\n"


@pytest.fixture
def build(tmp_path):
    """build_tokenizer with the BPE cache in tmp_path."""

    def make(kind, texts=CORPUS, vocab_size=None):
        return build_tokenizer(kind, texts, vocab_size if kind == "bpe" else None, cache_dir=str(tmp_path))

    return make


LOSSLESS = [kind for kind in TOKENIZERS if kind != "word"]  # word decodes words joined by spaces


@pytest.mark.parametrize("kind", LOSSLESS)
def test_round_trip_and_state(build, kind):
    tok = build(kind, CORPUS + [UNICODE], 300)
    assert tok.kind == kind
    for text in (SAMPLE, UNICODE, ""):
        ids = tok.encode(text)
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
        assert tok.encode_array(text).tolist() == ids
    assert tok.decode(np.array(tok.encode(SAMPLE))) == SAMPLE  # arrays (and tensors) decode too
    again = tokenizer_from_state(json.loads(json.dumps(tok.state())))
    assert again.kind == kind and again.vocab_size == tok.vocab_size
    assert again.encode(SAMPLE + UNICODE) == tok.encode(SAMPLE + UNICODE)


def test_char_vocab_is_sorted_characters_plus_unk(build):
    tok = build("char")
    chars = sorted(set("".join(CORPUS)))
    assert tok.vocab_size == len(chars) + 1
    assert tok.encode("".join(chars)) == list(range(1, len(chars) + 1))
    unseen = "Zx\u00e9\U0001f642"  # none of these is in CORPUS
    assert tok.encode(unseen) == [tk.CharTokenizer.unk_id] * 4
    assert tok.decode(tok.encode("Tox")) == "To" + tk.UNK
    naive = {c: i + 1 for i, c in enumerate(chars)}
    assert tok.encode(SAMPLE * 50) == [naive[c] for c in SAMPLE * 50]


def test_byte_ids_are_utf8_bytes_and_bad_bytes_decode_replaced(build):
    tok = build("byte")
    assert tok.vocab_size == 256
    assert tok.encode(UNICODE) == list(UNICODE.encode("utf-8"))
    assert len(tok.encode("\u00e9")) == 2
    assert tok.decode([0x41, 0xFF, 0xE6, 0x9D, 0x42]) == "A\ufffd\ufffdB"


def test_bpe_is_cached_on_disk(tmp_path, monkeypatch):
    trainings = []
    real_train = tk.train_bpe
    monkeypatch.setattr(
        tk, "train_bpe", lambda texts, vocab_size: trainings.append(vocab_size) or real_train(texts, vocab_size)
    )
    first = build_tokenizer("bpe", CORPUS, 300, cache_dir=str(tmp_path))
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".json" and trainings == [300]
    os.utime(files[0], (0, 0))  # a rewrite would move the mtime
    second = build_tokenizer("bpe", CORPUS, 300, cache_dir=str(tmp_path))
    assert trainings == [300] and files[0].stat().st_mtime == 0
    assert second.encode(SAMPLE) == first.encode(SAMPLE)
    assert 256 < first.vocab_size <= 300 and len(first.encode(SAMPLE)) < len(SAMPLE.encode())
    build_tokenizer("bpe", CORPUS, 280, cache_dir=str(tmp_path))  # another size, another entry
    build_tokenizer("bpe", CORPUS[:3], 300, cache_dir=str(tmp_path))  # other texts, another entry
    assert trainings == [300, 280, 300] and len(list(tmp_path.iterdir())) == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_bpe_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FFNLAB_CACHE", str(tmp_path))
    build_tokenizer("bpe", CORPUS, 270)
    assert len(list((tmp_path / "tokenizers").glob("bpe-270-*.json"))) == 1


def test_bpe_damaged_cache_is_retrained(tmp_path):
    first = build_tokenizer("bpe", CORPUS, 300, cache_dir=str(tmp_path))
    path = next(tmp_path.iterdir())
    path.write_text("{not json", encoding="utf-8")
    assert build_tokenizer("bpe", CORPUS, 300, cache_dir=str(tmp_path)).encode(SAMPLE) == first.encode(SAMPLE)
    assert json.loads(path.read_text(encoding="utf-8"))


def test_bpe_long_text_encodes_in_chunks_to_the_same_ids(build, monkeypatch):
    # trailing spaces before a blank line teach merges across '  \n', which a cut after '  \n' would use
    tok = build("bpe", CORPUS + ["a line  \n\nNext line  \n\n" * 50], vocab_size=320)
    text = "".join(CORPUS) * 3 + "a line  \nNext " * 100 + "".join(CORPUS) + UNICODE * 10
    whole = tok.tokenizer.encode(text).ids
    monkeypatch.setattr(tk, "CHUNK_CHARS", 200)
    assert len(list(tk.safe_chunks(text, 200))) > 10
    assert tok.encode(text) == whole and tok.decode(whole) == text


def test_bad_input(build):
    with pytest.raises(ValueError, match="did you mean 'byte'"):
        build_tokenizer("bytes", CORPUS)
    with pytest.raises(ValueError, match="'bpe' and 'word' tokenizers only"):
        build_tokenizer("char", CORPUS, vocab_size=100)
    with pytest.raises(ValueError, match="above 256"):
        build_tokenizer("bpe", CORPUS, vocab_size=200)
    with pytest.raises(ValueError, match="no text"):
        build_tokenizer("char", ["", ""])
    for kind in TOKENIZERS:
        tok = build(kind, vocab_size=300)
        for bad in ([tok.vocab_size], [-1]):
            with pytest.raises(ValueError, match="outside the vocabulary"):
                tok.decode(bad)
    with pytest.raises(ValueError, match="not a tokenizer state"):
        tokenizer_from_state({"kind": "sentencepiece"})


def test_a_folder_tokenizer_that_cannot_be_read_is_one_line(tmp_path):
    damaged = {  # (damage, message after the path)
        "garbage": (lambda path: path.write_text("garbage{"), "cannot read the tokenizer"),  # was an internal error
        "not_utf8": (lambda path: path.write_bytes(b"\xff\xfe{"), "is not UTF-8 text (byte 0xff at 0)"),
        # these were passed over: --from took the char tokenizer
        "dangling": (
            lambda path: path.symlink_to("gone.json"),
            "is a symbolic link to gone.json, which does not exist",
        ),
        "folder": (lambda path: path.mkdir(), "is a folder; give a regular file"),
        "fifo": (os.mkfifo, "is a FIFO (a named pipe), which may block for ever; give a regular file"),
        "zero": (lambda path: path.symlink_to("/dev/zero"), "is a character device, which may never end"),
    }
    if os.path.exists("/proc/self/mem"):  # a link to a file whose every read fails (EIO), even for root
        damaged["link"] = (lambda path: path.symlink_to("/proc/self/mem"), "cannot be read (Input/output error)")
    for name, (damage, message) in damaged.items():
        folder = tmp_path / name
        folder.mkdir()
        damage(folder / "tokenizer.json")
        with pytest.raises(ValueError) as e:
            within(30, functools.partial(build_tokenizer, "pretrained", [], folder=str(folder)))
        assert "\n" not in str(e.value) and f"tokenizer {folder}/tokenizer.json" in str(e.value), name
        assert message in str(e.value), name


def test_bpe_training_cuts_runs_longer_than_any_word(build, monkeypatch):
    from tokenizers import Tokenizer

    word = "a" * 120_000  # as one word the trainer took the square of its length: 18 s, 500,000 characters minutes
    trained_on = []
    real = Tokenizer.train_from_iterator
    monkeypatch.setattr(Tokenizer, "train_from_iterator", lambda self, it, *a, **k: real(self, spy(it), *a, **k))

    def spy(pieces):
        for piece in pieces:
            trained_on.append(len(piece))
            yield piece

    tok = build("bpe", [word + " and more words\n" * 3], vocab_size=300)
    assert trained_on and max(trained_on) <= tk.MAX_TRAIN_WORD  # the trainer never saw the 120,000-character run
    assert tok.decode(tok.encode(word)) == word and len(tok.encode(word)) < len(word) // 100
    pieces = list(tk.short_runs(word + "\n" + " \n" * 3000 + "b"))
    assert "".join(pieces) == word + "\n" + " \n" * 3000 + "b" and max(map(len, pieces)) == tk.MAX_TRAIN_WORD


def test_bpe_training_counts_ordinary_text_as_encoding_splits_it():
    text = "".join(CORPUS) * 50
    line = " ".join(CORPUS).replace("\n", " ") * 50  # one line, one chunk: searched for long runs, and none found
    for chunk in [*tk.safe_chunks(text, tk.TRAIN_CHUNK_CHARS), line]:
        assert list(tk.short_runs(chunk)) == [chunk]


# ---- the word tokenizer -----------------------------------------------------------------------------

# as WikiText's raw files are: a space around every token, headings between blank lines, its own <unk>
WIKI = (
    " = Valkyria Chronicles III = \n"
    " \n"
    " Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ playing game , sold 1 @,@ 000 copies . \n"
    " \n"
    " = = Gameplay = = \n"
    " The game 's battles ( 3 @.@ 5 hours ) are <unk> ... \n"
)
WIKI_DECODED = (
    "= Valkyria Chronicles III =\n"
    "\n"
    "Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ playing game , sold 1 @,@ 000 copies .\n"
    "\n"
    "= = Gameplay = =\n"
    "The game 's battles ( 3 @.@ 5 hours ) are <unk> . . .\n"
)


def test_word_round_trip_on_wikitext_style_text(build):
    tok = build("word", [WIKI])
    ids = tok.encode(WIKI)
    words = [tok.itos[i] for i in ids]
    assert words[:6] == ["=", "Valkyria", "Chronicles", "III", "=", "\n"]  # spaces gone, newlines kept
    assert {"@-@", "@,@", "@.@", "'s", "Senjō"} <= set(words)  # WikiText's own tokens stay whole
    assert words.count("\n") == 6 and words.count(".") == 4
    assert [i for i, w in zip(ids, words) if w == "<unk>"] == [0, 0]  # WikiText's <unk> is ours
    assert tok.decode(ids) == WIKI_DECODED  # lossy: one space between words, none around newlines
    assert tok.encode(tok.decode(ids)) == ids and tok.encode_array(WIKI).tolist() == ids
    assert tok.decode(np.array(ids)) == WIKI_DECODED
    assert tok.vocab_size == len(set(words) - {"<unk>"}) + 1  # every word, <unk> once


def test_word_punctuation_splits_raw_text(build):
    tok = build("word")
    assert [tok.itos[i] for i in tok.encode("To be, or not: 'tis nobler\n")] == [
        "To", "be", ",", "or", "not", ":", "'", "tis", "nobler", "\n"
    ]  # fmt: skip
    assert tok.encode("king's") == tok.encode("king 's")  # a clitic splits the same either way
    assert tok.decode(tok.encode("to  Be,\tor\n")) == "to <unk> , or\n"  # case kept: 'Be' was never seen


def test_word_vocab_is_cut_by_frequency_ties_in_code_point_order(build):
    texts = ["b a c a\nb c d a", "e e e e <unk> <unk> <unk> <unk> <unk> Z"]  # a:3 b:2 c:2 d:1 e:4 Z:1 \n:1
    assert build("word", texts).itos == ["<unk>", "e", "a", "b", "c", "\n", "Z", "d"]
    tok = build_tokenizer("word", texts, vocab_size=4)
    assert tok.vocab_size == 4 and tok.itos == ["<unk>", "e", "a", "b"]  # c ties with b and comes after
    assert tok.encode("a b c d e Z zebra <unk>") == [2, 3, 0, 0, 1, 0, 0, 0]  # cut or unseen: <unk>
    assert build_tokenizer("word", texts, vocab_size=100).vocab_size == 8  # asking for more keeps them all
    assert build_tokenizer("word", list(reversed(texts)), vocab_size=4).itos == tok.itos  # order of texts


def test_word_state_restores_the_same_tokenizer(build):
    tok = build_tokenizer("word", [WIKI, *CORPUS], vocab_size=20)
    again = tokenizer_from_state(json.loads(json.dumps(tok.state())))
    assert again.kind == "word" and again.vocab_size == tok.vocab_size == 20 and again.itos == tok.itos
    for text in (WIKI, SAMPLE, UNICODE, ""):
        assert again.encode(text) == tok.encode(text) and again.decode(tok.encode(text)) == tok.decode(tok.encode(text))


def test_word_long_text_encodes_in_pieces_to_the_same_ids(build, monkeypatch):
    tok = build("word", [WIKI])
    text = (WIKI + "".join(CORPUS)) * 20
    whole = [tok.stoi.get(w, 0) for w in tk.WORD_PATTERN.findall(text)]
    monkeypatch.setattr(tk, "CHUNK_CHARS", 50)
    assert tok.encode(text) == whole and tok.encode_array(text).tolist() == whole


@pytest.mark.parametrize("size", [0, 1, -5, tk.MAX_WORD_VOCAB + 1, 2.5, True])
def test_a_bad_word_vocab_is_one_line(size):
    for make in (lambda: build_tokenizer("word", CORPUS, vocab_size=size), lambda: TrainConfig(word_vocab=size)):
        with pytest.raises(ValueError, match="word_vocab must be an integer from 2") as e:
            make()
        assert "\n" not in str(e.value)


def test_no_training_words_is_one_line():
    with pytest.raises(ValueError, match="no text to build a 'word' tokenizer"):
        build_tokenizer("word", ["", ""])
    with pytest.raises(ValueError, match="no words") as e:
        build_tokenizer("word", [" \n\n <unk> \n", "\t"])
    assert "\n" not in str(e.value)


def test_word_vocab_joins_a_run_identity_only_when_set():
    assert "word_vocab" not in identity(TrainConfig(tokenizer="word"))  # stored runs keep their ids
    assert identity(TrainConfig(tokenizer="word", word_vocab=100))["word_vocab"] == 100


# ---- `--tokenizer word` end to end ------------------------------------------------------------------


def write_wikitext(folder, seed=0):
    """A WikiText-style folder (train.txt, valid.txt, test.txt): articles of a heading and paragraphs,
    spaces around every token, @-@ and @,@, and <unk>; val and test have words train never has."""
    rng = random.Random(seed)
    words = ["the", "of", "and", "in", "a", "river", "city", "was", "built", "is", "game", "first", "<unk>"]
    folder.mkdir()
    for name, n_articles, extra in (("train", 30, []), ("valid", 4, ["Zanzibar"]), ("test", 4, ["Quito"])):
        lines = []
        for _ in range(n_articles):
            lines += [" \n", f" = {rng.choice(['Ohio', 'Lyon', 'Nile'])} River = \n", " \n"]
            for _ in range(3):
                sentence = " ".join(rng.choice(words + extra) for _ in range(12))
                lines.append(f" {sentence} , some 1 @,@ 200 km @-@ long . \n")
        (folder / f"{name}.txt").write_text("".join(lines), encoding="utf-8")
    return folder


def test_train_with_the_word_tokenizer_on_wikitext_style_text(run_cli, tmp_path):
    data = write_wikitext(tmp_path / "wiki")
    argv = ["train", *TINY_MODEL, "--steps", 2, "--eval-every", 2, "--final-eval-batches", 2, "--quiet"]
    code, out, err = run_cli(
        *argv, "--data", data, "--tokenizer", "word", "--word-vocab", 12, "--out", tmp_path / "r.json"
    )
    assert code == 0, err
    assert "  perplexity per word " in out  # the loss is per token, and a token is a word
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["status"] == "finished" and result["vocab_size"] == 12 and result["final_val_loss"] > 0
    assert result["config"]["tokenizer"] == "word" and result["config"]["word_vocab"] == 12


@pytest.mark.parametrize("value,needle", [("1", "word_vocab must be an integer from 2"), ("x", "invalid int value")])
def test_a_bad_word_vocab_flag_exits_2(run_cli, tmp_path, value, needle):
    code, _, err = run_cli("train", *TINY_MODEL, "--tokenizer", "word", "--word-vocab", value, "--quiet")
    assert code == 2 and needle in err and err.count("\n") == 1, err
