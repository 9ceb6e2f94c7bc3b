import json
import os

import numpy as np
import pytest

from ffnlab.run import tokenizer as tk
from ffnlab.run.tokenizer import TOKENIZERS, build_tokenizer, tokenizer_from_state

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


@pytest.mark.parametrize("kind", TOKENIZERS)
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
    with pytest.raises(ValueError, match="bpe' tokenizer only"):
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
        tokenizer_from_state({"kind": "word"})


def test_a_folder_tokenizer_that_cannot_be_read_is_one_line(tmp_path):
    damaged = {
        "garbage": lambda path: path.write_text("garbage{"),  # was tokenizers' plain Exception: an internal error
        "not_utf8": lambda path: path.write_bytes(b"\xff\xfe{"),
    }
    if os.path.exists("/proc/self/mem"):  # a link to a file whose every read fails (EIO), even for root
        damaged["link"] = lambda path: path.symlink_to("/proc/self/mem")
    for name, damage in damaged.items():
        folder = tmp_path / name
        folder.mkdir()
        damage(folder / "tokenizer.json")
        with pytest.raises(ValueError, match=f"cannot read the tokenizer {folder}/tokenizer.json") as e:
            build_tokenizer("pretrained", [], folder=str(folder))
        assert "\n" not in str(e.value)
