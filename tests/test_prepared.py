"""Prepared tokens (ffnlab.data.prepared): `ffnlab data prepare` writes what `--data DIR` reads, with the ids the
text path encodes; tokens prepared elsewhere (llm.c's shards, nanoGPT's train.bin) read; bad folders refused."""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ffnlab._util import reading
from ffnlab.data import prepared
from ffnlab.data.batches import eval_set, get_batch
from ffnlab.data.corpus import LINE_BREAKS, NEWLINES, parquet_rows, text_lines
from ffnlab.data.load import load_data
from ffnlab.data.prepared import LLMC_MAGIC, TokenFile, TokenFiles, load_tokens, prepare, token_dtype
from ffnlab.data.tokenizer import CHUNK_CHARS, file_tokenizer

WORDS = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
         "not", "he", "this", "are", "or", "his", "from", "at", "which"]  # fmt: skip


def text(n_lines: int, seed: int = 0) -> str:
    """Lines of words (a blank line now and then, an accented word), as a corpus has them."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS + ["café"]) for _ in range(rng.randint(3, 14))) for _ in range(n_lines)]
    return "".join(line + ("\n\n" if i % 7 == 0 else "\n") for i, line in enumerate(lines))


LAYOUTS = {  # file name -> lines: each of text_files_plan's rules
    "one file": {"corpus.txt": 3000},  # past CHUNK_CHARS: a BPE text cut in chunks
    "named": {"train.txt": 300, "valid.txt": 60},  # test = val, by name
    "named three": {"train.txt": 300, "valid.txt": 60, "test.txt": 60},
    "by hash": {f"part{i}.txt": 80 for i in range(6)},
    "two joined": {"a.txt": 200, "b.txt": 200},
}


def write_layout(root: Path, layout: dict[str, int]) -> str:
    """The files of a layout under `root`; the source to give (the file itself where there is one)."""
    root.mkdir()
    for i, (name, lines) in enumerate(layout.items()):
        (root / name).write_text(text(lines, seed=i), encoding="utf-8")
    return str(root / next(iter(layout))) if len(layout) == 1 else str(root)


@pytest.fixture
def small_reads(monkeypatch, tmp_path):
    """Files read in chunks of 1000 bytes (a character cut between two), and BPE tokenizers cached under tmp_path."""
    monkeypatch.setattr(reading, "CHUNK", 1000)
    monkeypatch.setenv("FFNLAB_CACHE", str(tmp_path / "cache"))


def ids(split) -> torch.Tensor:
    return split if isinstance(split, torch.Tensor) else split[: len(split)]


@pytest.mark.parametrize("kind", ["char", "bpe"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prepared_ids_are_the_ids_of_the_text(tmp_path, small_reads, kind, layout):
    source = write_layout(tmp_path / "text", LAYOUTS[layout])
    manifest = prepare(source, tmp_path / "tokens", kind, bpe_vocab=300 if kind == "bpe" else None)
    corpus, tok, splits = load_data(source, "lm", kind, 300 if kind == "bpe" else None, "text", "label")
    folder, read_tok, read = load_tokens(str(tmp_path / "tokens"))
    assert read_tok.state() == tok.state()  # BPE trained on the streamed training split: the same merges
    for split in ("train", "val", "test"):
        assert torch.equal(ids(read[split]), splits[split]), split
        assert manifest.splits[split].tokens == len(splits[split])
        assert manifest.splits[split].documents == len(corpus.documents(split))
    assert manifest.split_rule == corpus.meta["split_rule"] == folder.meta["split_rule"]
    if layout == "one file":
        assert len(corpus.text("train")) > CHUNK_CHARS


def test_the_dtype_holds_every_id_of_the_vocabulary():
    assert token_dtype(256) == np.dtype("<u2") and token_dtype(1 << 16) == np.dtype("<u2")
    assert token_dtype((1 << 16) + 1) == np.dtype("<u4")


def word_level_json(path: Path, size: int) -> Path:
    """A tokenizer.json of `size` words, w0 ... (tokenizers' WordLevel, split on whitespace)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


def test_a_vocabulary_past_uint16_is_stored_as_uint32(tmp_path):
    tokenizer = word_level_json(tmp_path / "big.json", 70_000)
    (tmp_path / "words.txt").write_text("\n".join(f"w{i} w{69_999 - i}" for i in range(0, 70_000, 7)) + "\n")
    manifest = prepare(str(tmp_path / "words.txt"), tmp_path / "tokens", str(tokenizer))
    assert manifest.dtype == "uint32" and manifest.vocab_size == 70_000
    assert (tmp_path / "tokens" / "train.bin").stat().st_size == 4 * manifest.splits["train"].tokens
    _, _, splits = load_data(str(tmp_path / "words.txt"), "lm", str(tokenizer), None, "text", "label")
    _, _, read = load_data(str(tmp_path / "tokens"), "lm", "char", None, "text", "label")
    assert torch.equal(ids(read["train"]), splits["train"]) and int(splits["train"].max()) > 65_535


def tiny_bpe_json(path: Path, corpus: str) -> Path:
    """A BPE tokenizer trained with tokenizers on `corpus` and saved, as GPT-2's tokenizer.json is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer)
    tok.save(str(path))
    return path


def test_a_saved_tokenizer_json_prepares_and_trains_on_text_alike(tmp_path, small_reads):
    (tmp_path / "c.txt").write_text(text(400))
    tokenizer = str(tiny_bpe_json(tmp_path / "tokenizer.json", text(50, seed=9)))
    prepare(str(tmp_path / "c.txt"), tmp_path / "tokens", tokenizer)
    _, tok, splits = load_data(str(tmp_path / "c.txt"), "lm", tokenizer, None, "text", "label")
    _, read_tok, read = load_data(str(tmp_path / "tokens"), "lm", tokenizer, None, "text", "label")
    assert tok.vocab_size == read_tok.vocab_size == file_tokenizer(tokenizer).vocab_size
    assert all(torch.equal(ids(read[s]), splits[s]) for s in splits)


def test_memory_mapped_windows_are_the_tensor_windows(tmp_path):
    tokens = np.arange(5000, dtype="<u2") % 997
    split_at = 1234  # two files: some windows span both
    (tmp_path / "a.bin").write_bytes(tokens[:split_at].tobytes())
    (tmp_path / "b.bin").write_bytes(tokens[split_at:].tobytes())
    files = TokenFiles([TokenFile(tmp_path / "a.bin", 0, split_at, "uint16"),
                        TokenFile(tmp_path / "b.bin", 0, len(tokens) - split_at, "uint16")])  # fmt: skip
    tensor = torch.from_numpy(tokens.astype(np.int64))
    for batch in (get_batch, lambda s, *a: eval_set(s, "lm", 3, 64, 32)[2]):
        gens = [torch.Generator().manual_seed(3) for _ in range(2)]
        x, y = batch(files, "lm", 64, 32, gens[0])
        x_ref, y_ref = batch(tensor, "lm", 64, 32, gens[1])
        assert x.dtype == torch.int64 and torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert torch.equal(files[1200:1300], tensor[1200:1300])


def tiny_config(data: str, **kw):
    from ffnlab.core.model import ModelConfig
    from ffnlab.run.config import TrainConfig

    model = ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32)
    return TrainConfig(model=model, data=data, batch_size=4, max_steps=4, eval_every=2, eval_batches=2,
                       final_eval_batches=2, warmup_steps=1, **kw)  # fmt: skip


def test_a_prepared_folder_trains_to_the_loss_of_its_text(tmp_path):
    from ffnlab.run.train import train

    (tmp_path / "c.txt").write_text(text(600))
    prepare(str(tmp_path / "c.txt"), tmp_path / "tokens")
    from_text = train(tiny_config(str(tmp_path / "c.txt")))
    from_tokens = train(tiny_config(str(tmp_path / "tokens")))
    assert from_tokens.val.loss == pytest.approx(from_text.val.loss, abs=1e-6)
    assert from_tokens.test.loss == pytest.approx(from_text.test.loss, abs=1e-6)
    assert from_tokens.vocab_size == from_text.vocab_size


# ---- a killed prepare ---------------------------------------------------------------------------------------


def test_a_prepare_killed_midway_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    (tmp_path / "c.txt").write_text(text(300))
    write_split = prepared.write_split

    def killed(documents, tokenizer, dtype, path):
        if path.name == "val.bin":
            raise KeyboardInterrupt  # as Ctrl-C or SIGTERM unwind
        return write_split(documents, tokenizer, dtype, path)

    monkeypatch.setattr(prepared, "write_split", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(tmp_path / "c.txt"), tmp_path / "tokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]  # no folder, no temporary one
    monkeypatch.setattr(prepared, "write_split", write_split)
    leftover = tmp_path / ".tokens.999999999.tmp"  # what a kill -9 leaves: a process that is gone
    leftover.mkdir()
    (leftover / "train.bin").write_bytes(b"\0\0")
    prepare(str(tmp_path / "c.txt"), tmp_path / "tokens")  # a rerun starts over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "tokens"]


def unfinished_folders(tmp_path: Path) -> list[Path]:
    """A prepared folder without its manifest, and a prepare's temporary folder with everything in it."""
    (tmp_path / "c.txt").write_text(text(300))
    prepare(str(tmp_path / "c.txt"), tmp_path / "tokens")
    no_manifest = tmp_path / "no-manifest"
    no_manifest.mkdir()
    for name in ("train.bin", "val.bin", "test.bin"):
        (no_manifest / name).write_bytes((tmp_path / "tokens" / name).read_bytes())
    temporary = tmp_path / ".tokens.12345.tmp"
    (tmp_path / "tokens").rename(temporary)
    return [no_manifest, temporary]


def test_an_unfinished_folder_is_refused_in_one_line(tmp_path, run_cli):
    for folder in unfinished_folders(tmp_path):
        code, _, err = run_cli("train", "--data", folder, "--max-steps", 1)
        assert code == 2 and err.count("\n") == 1 and "is not a finished prepared folder" in err, err


# ---- tokens prepared elsewhere ----------------------------------------------------------------------------------


def write_shard(path: Path, tokens, magic: int = LLMC_MAGIC, version: int = 1, count: int | None = None) -> Path:
    """An llm.c shard: 256 int32 (magic, version, token count), then uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())
    return path


def llmc_folder(root: Path) -> tuple[Path, np.ndarray]:
    """Two train shards and a val shard of GPT-2 ids; all the train tokens, in order."""
    root.mkdir()
    rng = np.random.default_rng(0)
    train = rng.integers(0, 50257, size=3000)
    write_shard(root / "fineweb_train_000001.bin", train[:1800])
    write_shard(root / "fineweb_train_000002.bin", train[1800:])
    write_shard(root / "fineweb_val_000000.bin", rng.integers(0, 50257, size=600))
    return root, train


def test_llmc_shards_are_read_as_one_split_test_is_val(tmp_path):
    folder, train = llmc_folder(tmp_path / "shards")
    info, tok, splits = load_data(str(folder), "lm", "bpe", None, "text", "label")  # a preset's bpe: the ids'
    assert tok.kind == "ids" and tok.vocab_size == 50257 and "test = val" in info.meta["split_rule"]
    assert torch.equal(ids(splits["train"]), torch.from_numpy(train)) and len(splits["test"]) == 600
    result_x, _ = get_batch(splits["train"], "lm", 8, 32, torch.Generator().manual_seed(0))
    reference_x, _ = get_batch(torch.from_numpy(train), "lm", 8, 32, torch.Generator().manual_seed(0))
    assert torch.equal(result_x, reference_x)


BAD_SHARDS = {  # what is wrong -> (how the val shard is written, what the error says)
    "truncated": (lambda p: write_shard(p, [1, 2, 3], count=10), "is truncated or damaged"),
    "wrong magic": (lambda p: write_shard(p, [1, 2, 3], magic=1234), "magic 1234, expected 20240520"),
    "other version": (lambda p: write_shard(p, [1, 2, 3], version=7), "version 7; valid: 1"),
    "short header": (lambda p: p.write_bytes(b"\0" * 100), "less than an llm.c shard's header"),
    "id past the vocabulary": (lambda p: write_shard(p, [1, 50257, 3]), "token id 50257, at or past the vocabulary"),
    "empty split": (lambda p: write_shard(p, []), "the val split of"),
}


@pytest.mark.parametrize("bad", BAD_SHARDS)
def test_a_bad_shard_is_one_line_and_exit_2(tmp_path, run_cli, bad):
    folder, _ = llmc_folder(tmp_path / "shards")
    write, needle = BAD_SHARDS[bad]
    write(folder / "fineweb_val_000000.bin")
    code, _, err = run_cli("train", "--data", folder, "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_ids_past_a_given_vocabulary_and_a_missing_val_are_refused(tmp_path, run_cli):
    folder, _ = llmc_folder(tmp_path / "shards")
    code, _, err = run_cli("train", "--data", folder, "--ids-vocab", 1000, "--max-steps", 1)
    assert code == 2 and "at or past the vocabulary size 1,000" in err, err
    (folder / "fineweb_val_000000.bin").unlink()
    code, _, err = run_cli("train", "--data", folder, "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1 and "no val shard" in err, err


def test_nanogpt_bins_need_their_vocabulary_size(tmp_path, run_cli):
    folder = tmp_path / "nanogpt"
    folder.mkdir()
    (folder / "train.bin").write_bytes(np.arange(2000, dtype="<u2").tobytes())
    (folder / "val.bin").write_bytes(np.arange(500, dtype="<u2").tobytes())
    code, _, err = run_cli("train", "--data", folder, "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1 and "need --ids-vocab N" in err, err
    info, tok, splits = load_data(str(folder), "lm", "char", None, "text", "label", ids_vocab=2000)
    assert tok.vocab_size == 2000 and len(splits["train"]) == 2000 and "test = val" in info.meta["split_rule"]
    code, _, err = run_cli("train", "--data", folder, "--ids-vocab", 1999, "--max-steps", 1)
    assert code == 2 and "token id 1999, at or past the vocabulary size 1,999" in err, err
    (folder / "val.bin").write_bytes(b"\0\0\0")
    code, _, err = run_cli("train", "--data", folder, "--ids-vocab", 2000, "--max-steps", 1)
    assert code == 2 and "not a whole number of uint16 tokens" in err, err


# ---- a prepared folder's own checks ------------------------------------------------------------------------------


def test_another_tokenizer_than_the_manifests_is_refused_naming_both(tmp_path, run_cli):
    (tmp_path / "c.txt").write_text(text(300))
    prepare(str(tmp_path / "c.txt"), tmp_path / "tokens")  # char
    code, _, err = run_cli("train", "--data", tmp_path / "tokens", "--tokenizer", "bpe", "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1, err
    assert "prepared with the char tokenizer" in err and "not bpe" in err, err
    code, _, err = run_cli("train", "--data", tmp_path / "tokens", "--ids-vocab", 50, "--max-steps", 1)
    assert code == 2 and "--ids-vocab is for tokens prepared elsewhere" in err, err
    other = tiny_bpe_json(tmp_path / "other.json", text(50))
    prepare(str(tmp_path / "c.txt"), tmp_path / "bpe-tokens", str(tiny_bpe_json(tmp_path / "t.json", text(40, 1))))
    code, _, err = run_cli("train", "--data", tmp_path / "bpe-tokens", "--tokenizer", other, "--max-steps", 1)
    assert code == 2 and f"not {other}" in err and "prepared with the bpe tokenizer" in err, err


def test_a_damaged_prepared_folder_is_one_line(tmp_path, run_cli):
    (tmp_path / "c.txt").write_text(text(300))
    prepare(str(tmp_path / "c.txt"), tmp_path / "tokens")
    val = tmp_path / "tokens" / "val.bin"
    val.write_bytes(val.read_bytes()[:-2])
    code, _, err = run_cli("train", "--data", tmp_path / "tokens", "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1 and "val.bin is truncated or damaged" in err, err
    manifest = tmp_path / "tokens" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "dtype": "int8"}))
    code, _, err = run_cli("train", "--data", tmp_path / "tokens", "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1 and "dtype is 'int8'" in err, err


def test_data_prepare_on_the_command_line(tmp_path, run_cli):
    (tmp_path / "c.txt").write_text(text(300))
    code, out, err = run_cli("data", "prepare", tmp_path / "c.txt", "--out", tmp_path / "tokens", "--quiet")
    assert code == 0 and "tokens of uint16, tokenizer char" in out and err == "", err
    for argv, needle in [
        ((tmp_path / "c.txt", "--out", tmp_path / "tokens"), "exists and is not empty"),
        ((tmp_path / "missing.txt", "--out", tmp_path / "new"), "missing.txt"),
        ((tmp_path / "c.txt", "--out", tmp_path / "new", "--tokenizer", "word"), "prepare takes the tokenizers"),
        ((tmp_path / "c.txt", "--out", tmp_path / "new", "--bpe-vocab", 300), "--bpe-vocab is for the bpe"),
    ]:
        code, _, err = run_cli("data", "prepare", *argv, "--quiet")
        assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "new").exists()


def test_an_empty_split_is_refused(tmp_path, run_cli):
    folder = tmp_path / "named"
    folder.mkdir()
    (folder / "train.txt").write_text(text(100))
    (folder / "valid.txt").write_text(" \n\n ")
    code, _, err = run_cli("data", "prepare", folder, "--out", tmp_path / "tokens", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "valid.txt is empty" in err, err
    assert not (tmp_path / "tokens").exists()


def test_rows_are_prepared_as_the_text_path_splits_them(tmp_path):
    rows = [{"text": text(3, seed=i), "split": "train" if i % 5 else "validation"} for i in range(60)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = prepare(str(tmp_path / "rows.jsonl"), tmp_path / "tokens", "byte")
    corpus, _, splits = load_data(str(tmp_path / "rows.jsonl"), "lm", "byte", None, "text", "label")
    _, _, read = load_tokens(str(tmp_path / "tokens"))
    assert all(torch.equal(ids(read[s]), splits[s]) for s in splits)
    assert manifest.split_rule == corpus.meta["split_rule"] and manifest.splits["test"].documents == 12


# ---- rows, streamed ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_lines_are_cut_as_the_whole_text_cuts_them_however_it_streams(seed):
    rng = random.Random(seed)
    whole = "".join(rng.choice(["a", "b ", "\r", "\n", "\r\n", "\x85", "\u2028", "\x0c", "é"]) for _ in range(400))
    cuts = sorted(rng.sample(range(1, len(whole)), 40))
    for chunks in ([whole[i:j] for i, j in zip([0, *cuts], [*cuts, len(whole)])], list(whole)):
        assert list(text_lines(chunks, LINE_BREAKS)) == whole.splitlines(keepends=True)
        assert list(text_lines(chunks, NEWLINES)) == list(io.StringIO(whole, newline=""))  # as csv reads a file


def source_rows(n: int, splits: list[str] | None) -> list[dict]:
    """Rows as sources have them: texts of a few lines (a duplicate now and then, a blank one), an id column, and
    where `splits` is given a split column that cycles through them."""
    rows = []
    for i in range(n):
        body = "  \n" if i % 13 == 5 else text(3, seed=i - 5 if i % 10 == 9 else i)
        rows.append({"id": i, "text": body, **({"split": splits[i % len(splits)]} if splits else {})})
    return rows


def write_rows(path: Path, rows: list[dict]) -> None:
    """`rows` as a JSON-lines, CSV or Parquet file, by the suffix of `path`."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)


# how the rows are laid out -> {file name: (rows, their split column's values)}: each of split_routes' rules
ROW_LAYOUTS = {
    # test = val, spelled two ways (their order is the source's); val carved from train; 'unsupervised' ignored
    "split column": {"rows": (200, ["train", "train", "valid", "train", "validation", "unsupervised", "train"])},
    "no splits": {"rows": (150, None)},  # 80/10/10 by text hash
    "files named": {"train": (150, None), "test": (30, None)},  # val carved from train
}


def write_row_layout(root: Path, layout: str, suffix: str) -> str:
    """The files of a row layout under `root`, in one format; the source to give (the file where there is one)."""
    root.mkdir()
    files = ROW_LAYOUTS[layout]
    for offset, (name, (n, splits)) in enumerate(files.items()):
        write_rows(root / f"{name}{suffix}", source_rows(n, splits)[offset:])
    return str(root / f"rows{suffix}") if len(files) == 1 else str(root)


def assert_prepared_as_loaded(source: str, out: Path, kind: str = "byte") -> None:
    """`prepare(source)`, which streams it (it never calls load_corpus), holds the ids, documents and split rule
    that `load_data(source)` gives."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepared, "load_corpus", None)
        manifest = prepare(source, out, kind, bpe_vocab=300 if kind == "bpe" else None)
    corpus, tok, splits = load_data(source, "lm", kind, 300 if kind == "bpe" else None, "text", "label")
    _, read_tok, read = load_tokens(str(out))
    assert read_tok.state() == tok.state()
    for split in ("train", "val", "test"):
        assert torch.equal(ids(read[split]), splits[split]), split
        assert manifest.splits[split].documents == len(corpus.documents(split)), split
    assert manifest.split_rule == corpus.meta["split_rule"]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
def test_rows_stream_to_the_ids_and_splits_load_corpus_gives(tmp_path, small_reads, suffix, layout):
    assert_prepared_as_loaded(write_row_layout(tmp_path / "rows", layout, suffix), tmp_path / "tokens")


def test_parquet_reads_the_columns_asked_for_or_every_one_where_one_is_missing(tmp_path):
    write_rows(tmp_path / "rows.parquet", source_rows(5, ["train"]))
    assert set(next(parquet_rows(tmp_path / "rows.parquet", ["text", "split"]))) == {"text", "split"}
    assert set(next(parquet_rows(tmp_path / "rows.parquet", ["words", "split"]))) == {"id", "text", "split"}


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_rows_stream_with_every_tokenizer_alike(tmp_path, small_reads, kind):
    assert_prepared_as_loaded(write_row_layout(tmp_path / "rows", "split column", ".jsonl"), tmp_path / "tokens", kind)


def text_column(rows: list[dict]) -> dict[str, list]:
    """The columns of a dataset of `rows`' texts."""
    return {"text": [row["text"] for row in rows]}


def saved_datasets(root: Path) -> dict[str, str]:
    """A DatasetDict (train, validation, unsupervised) and a Dataset without splits, saved to disk."""
    datasets = pytest.importorskip("datasets")
    named = {
        "train": source_rows(150, None),
        "validation": source_rows(40, None)[20:],
        "unsupervised": source_rows(9, None),
    }
    datasets.DatasetDict({k: datasets.Dataset.from_dict(text_column(v)) for k, v in named.items()}).save_to_disk(
        root / "dd"
    )
    datasets.Dataset.from_dict(text_column(source_rows(150, None))).save_to_disk(root / "ds")
    return {"splits": str(root / "dd"), "no splits": str(root / "ds")}


def test_saved_and_named_datasets_stream_to_the_ids_load_corpus_gives(tmp_path, monkeypatch):
    from ffnlab.data import corpus

    saved = saved_datasets(tmp_path)
    for name, folder in saved.items():
        assert_prepared_as_loaded(folder, tmp_path / f"tokens {name}")
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(corpus, "load_hf", lambda name, path, config: datasets.load_from_disk(saved["splits"]))
    assert_prepared_as_loaded("hf:someone/rows", tmp_path / "tokens named")


BAD_ROWS = {  # what is wrong -> (file name, its content): load_corpus' error, and prepare's
    "no text column": ("a.jsonl", '{"text": "a b"}\n{"body": "c d"}\n'),
    "not JSON": ("a.jsonl", '{"text": "a b"}\n{"text": \n'),
    "not text": ("a.jsonl", '{"text": "a b"}\n{"text": 7}\n'),
    "a short row": ("a.csv", "text,split\na b,train\nc d\n"),
    "no train split": ("a.jsonl", '{"text": "a b", "split": "validation"}\n{"text": "c", "split": "test"}\n'),
    "an empty split": ("a.jsonl", "".join(json.dumps({"text": f"t{i}", "split": "train"}) + "\n" for i in range(3))),
    "only blank lines": ("a.jsonl", " \n\n"),
}


@pytest.mark.parametrize("bad", BAD_ROWS)
def test_bad_rows_are_refused_in_load_corpus_words(tmp_path, bad):
    from ffnlab.data.corpus import load_corpus

    name, content = BAD_ROWS[bad]
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError) as loaded:
        load_corpus(str(tmp_path / name))
    with pytest.raises(ValueError) as prepared_error:
        prepare(str(tmp_path / name), tmp_path / "tokens")
    assert str(prepared_error.value) == str(loaded.value) and "\n" not in str(loaded.value)
    assert not (tmp_path / "tokens").exists()


def test_a_parquet_file_or_dataset_without_the_text_column_names_its_columns(tmp_path, run_cli, capsys):
    write_rows(tmp_path / "rows.parquet", [{"id": 1, "body": "a b"}])
    saved = saved_datasets(tmp_path)
    capsys.readouterr()  # datasets' progress bars
    code, _, err = run_cli("data", "prepare", tmp_path / "rows.parquet", "--out", tmp_path / "tokens", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "has no column 'text'" in err and "columns: id, body" in err, err
    code, _, err = run_cli(
        "data", "prepare", saved["splits"], "--out", tmp_path / "tokens", "--text-field", "body", "--quiet"
    )
    assert code == 2 and err.count("\n") == 1 and "[train] has no column 'body'" in err, err
    code, _, err = run_cli(
        "data", "prepare", saved["splits"], "--out", tmp_path / "tokens", "--text-field", "a,b", "--quiet"
    )
    assert code == 2 and err.count("\n") == 1 and "is for task cls, not lm" in err, err


# prepare in a child process; prints its peak resident memory (KiB, Linux's ru_maxrss)
PEAK_RSS = (
    "import resource, sys; from ffnlab.data.prepared import prepare; prepare(sys.argv[1], sys.argv[2], 'byte'); "
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


def peak_rss_of_prepare(source: Path, out: Path) -> int:
    """Bytes of resident memory at the peak of a child that prepares `source` into `out`."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(source), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1]) * 1024


def write_jsonl_of_size(path: Path, size: int) -> Path:
    """A JSON-lines file of about `size` bytes, rows without split names drawn from a few hundred texts."""
    pool = [json.dumps({"text": text(20, seed=i)}) + "\n" for i in range(300)]
    with open(path, "w", encoding="utf-8") as f:
        written, i = 0, 0
        while written < size:
            written += f.write(pool[i % len(pool)])
            i += 1
    return path


@pytest.mark.slow
def test_a_large_jsonl_is_prepared_without_holding_it(tmp_path):
    small, large = 8 << 20, 64 << 20  # the small one is two of the chunks a file is read in: past those buffers
    small_peak = peak_rss_of_prepare(write_jsonl_of_size(tmp_path / "small.jsonl", small), tmp_path / "small")
    large_peak = peak_rss_of_prepare(write_jsonl_of_size(tmp_path / "large.jsonl", large), tmp_path / "large")
    grown = large_peak - small_peak  # about 5 MiB streamed; 82 MiB where load_corpus read the rows whole
    assert grown < (large - small) // 4, f"peak RSS grew by {grown >> 20} MiB for {(large - small) >> 20} MiB more rows"
