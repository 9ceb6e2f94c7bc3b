"""Scale benchmarks: what preparing a large corpus costs.

    python benchmarks/scale.py prepare --size-mb 100 [--repeats 1] [--workdir DIR]

prepare: writes a text file of SIZE MB (the bundled corpus repeated), then times `ffnlab data prepare` on it in a
child process with a BPE tokenizer saved beforehand (trained on the bundled corpus, so the time is the
tokenising, not the training) against `tokenizers`' own encode_batch of the same text in the same chunks and
batches in this process, and reports the ratio (MB/s of prepare over MB/s of encode_batch) and the peak RSS of the
prepare process. Then it times `prepare --tokenizer bpe` once, training included. Prints the command, the
machine and the library versions. A benchmark, not a test: the times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ffnlab._util.machine import environment
from ffnlab._util.reading import text_chunks
from ffnlab.data.corpus import load_corpus
from ffnlab.data.prepared import BATCH_CHUNKS, batched
from ffnlab.data.tokenizer import CHUNK_CHARS, BPETokenizer, stream_safe_chunks, train_bpe

MB = 1_000_000


def corpus_file(path: Path, size_mb: int) -> Path:
    """A text file of `size_mb` MB: the bundled corpus's text, repeated (whole plays, cut at the end)."""
    corpus = load_corpus("shakespeare")
    block = "\n\n".join(corpus.train + corpus.val + corpus.test).encode("utf-8") + b"\n\n"
    left = size_mb * MB
    with open(path, "wb") as f:
        while left > 0:
            f.write(block[:left])
            left -= len(block)
    return path


def encode_batch_seconds(tokenizer: BPETokenizer, path: Path) -> float:
    """Seconds `tokenizers` spends in encode_batch on the file's text, in prepare's chunks and batches."""
    seconds = 0.0
    for batch in batched(stream_safe_chunks(text_chunks(path, "the data file"), CHUNK_CHARS), BATCH_CHUNKS):
        start = time.perf_counter()
        tokenizer.tokenizer.encode_batch(batch, add_special_tokens=False)
        seconds += time.perf_counter() - start
    return seconds


def timed_child(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of a child process."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}")
    return seconds, usage.ru_maxrss * 1024  # Linux: KiB


def timed_prepare(source: Path, out: Path, tokenizer: str) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of `ffnlab data prepare` in a child process of its own."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "ffnlab", "data", "prepare", str(source), "--out", str(out)]
    return timed_child([*argv, "--tokenizer", tokenizer, "--quiet"])


def bench_prepare(args) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ffnlab-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    source = corpus_file(work / f"corpus-{args.size_mb}mb.txt", args.size_mb)
    bundled = load_corpus("shakespeare")
    tokenizer_json = work / "bpe-4096.json"
    tokenizer_json.write_text(train_bpe(bundled.train, 4096), encoding="utf-8")
    tokenizer = BPETokenizer(tokenizer_json.read_text(encoding="utf-8"))
    mb = source.stat().st_size / MB
    rows = []
    for _ in range(args.repeats):  # in turns, so that a change in the machine's load falls on both
        library = encode_batch_seconds(tokenizer, source)
        seconds, rss = timed_prepare(source, work / "tokens", str(tokenizer_json))
        rows.append((library, seconds, library / seconds, rss))
    library, seconds, ratio, rss = (statistics.median(column) for column in zip(*rows))
    trained, trained_rss = timed_prepare(source, work / "tokens", "bpe")
    _, import_rss = timed_child([sys.executable, "-c", "import ffnlab.cli, ffnlab.data.prepared, tokenizers"])
    print("command:", " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
    env = environment()
    print("machine:", json.dumps({"cpu": env["cpu"], "cores": os.cpu_count(), "load": os.getloadavg()}))
    versions = {name: importlib.metadata.version(name) for name in ("torch", "numpy", "tokenizers")}
    print("versions:", json.dumps({"python": env["python"], **versions, "ffnlab": env["git_rev"]}))
    print(f"text: {mb:,.0f} MB; median of {args.repeats}")
    print(f"tokenizers encode_batch (same chunks, batches of {BATCH_CHUNKS}): {mb / library:,.2f} MB/s")
    print(
        f"ffnlab data prepare --tokenizer FILE.json: {seconds:,.1f} s, {mb / seconds:,.2f} MB/s "
        f"({ratio:.2f}x of encode_batch; each repeat {', '.join(f'{row[2]:.2f}x' for row in rows)}), "
        f"peak RSS {rss / 2**20:,.0f} MiB (importing ffnlab alone: {import_rss / 2**20:,.0f} MiB)"
    )
    print(
        f"ffnlab data prepare --tokenizer bpe (4096, trained on the train split): {trained:,.1f} s, "
        f"{mb / trained:,.2f} MB/s, peak RSS {trained_rss / 2**20:,.0f} MiB"
    )
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    prepare = sub.add_parser("prepare", help="ffnlab data prepare against tokenizers' encode_batch")
    prepare.add_argument("--size-mb", type=int, default=100)
    prepare.add_argument("--repeats", type=int, default=1)
    prepare.add_argument("--workdir", default=None, help="keep the text and tokens here (default: a temporary folder)")
    prepare.set_defaults(func=bench_prepare)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
