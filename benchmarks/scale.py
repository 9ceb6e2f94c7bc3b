"""Scale benchmarks: what preparing a large corpus costs, training from it, and one run over two processes.

    python benchmarks/scale.py prepare --size-mb 100 [--repeats 1] [--workdir DIR]
    python benchmarks/scale.py train --size-mb 100 [--steps 60] [--repeats 3]
    python benchmarks/scale.py ddp [--steps 40] [--batch-size 64] [--repeats 3]

prepare: writes a text file of SIZE MB (the bundled corpus repeated), then times `ffnlab data prepare` on it in a
child process with a BPE tokenizer saved beforehand (trained on the bundled corpus, so the time is the
tokenising, not the training) against `tokenizers`' own encode_batch of the same text in the same chunks and
batches in this process, and reports the ratio (MB/s of prepare over MB/s of encode_batch) and the peak RSS of the
prepare process. Then it times `prepare --tokenizer bpe` once, training included. Prints the command, the
machine and the library versions. A benchmark, not a test: the times depend on the machine and its load.

train: prepares a text file of SIZE MB with a BPE tokenizer saved beforehand, then trains ffnlab's default model
on the prepared folder and on the bundled corpus given as text with the same tokenizer (the same model, the same
vocabulary), in turns, each in a child process of its own: the seconds from the child's first line to the end of
its first step, its peak RSS and its tokens/s (medians).

ddp: ffnlab's default model in fp32, 1 process x 1 thread at batch B against 2 processes x 1 thread at batch B
each (double the global batch), in turns: tokens/s of each and the ratio (target: at least 1.8x).
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
from dataclasses import replace
from pathlib import Path

from ffnlab._util.machine import environment
from ffnlab._util.reading import text_chunks
from ffnlab.data.corpus import load_corpus
from ffnlab.data.prepared import BATCH_CHUNKS, batched
from ffnlab.data.tokenizer import CHUNK_CHARS, BPETokenizer, stream_safe_chunks, train_bpe
from ffnlab.run.config import TrainConfig

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


# a child that times its own first step: from its first line (before torch is imported) to the end of step 1 (-1 for
# a run of several processes, whose steps are counted in its ranks)
TIMED_TRAIN = (
    "import time; t0 = time.perf_counter()\n"
    "import json, sys\n"
    "from ffnlab.run.config import TrainConfig\n"
    "from ffnlab.run.train import train\n"
    "first = []\n"
    "def seen(step, total, m):\n"
    "    first or first.append(time.perf_counter() - t0)\n"
    "r = train(TrainConfig.from_dict(json.loads(sys.argv[1])), progress=seen)\n"
    "print(json.dumps({'first_step_s': first[0] if first else -1, 'tokens_per_s': r.costs.tokens_per_s}))\n"
)


def timed_train(cfg: TrainConfig) -> dict:
    """{first_step_s, tokens_per_s, peak_rss} of `cfg` trained in a child process of its own (a run of several
    processes: the launcher's RSS; tokens/s is rank 0's, over the global batch)."""
    child = subprocess.Popen([sys.executable, "-c", TIMED_TRAIN, json.dumps(cfg.to_dict())], stdout=subprocess.PIPE)
    assert child.stdout is not None
    out = child.stdout.read().decode()
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"training failed: {cfg}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss": usage.ru_maxrss * 1024}


def in_turns(configs: dict[str, TrainConfig], repeats: int) -> dict[str, dict]:
    """Each config's `timed_train`, in turns (the order reversed every other round), medians over `repeats`."""
    rows: dict[str, list[dict]] = {name: [] for name in configs}
    names = list(configs)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            rows[name].append(timed_train(configs[name]))
    return {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in rows.items()}


def header() -> None:
    """The command, the machine and the library versions."""
    print("command:", " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
    env = environment()
    print("machine:", json.dumps({"cpu": env["cpu"], "cores": os.cpu_count(), "load": os.getloadavg()}))
    print("versions:", json.dumps({"python": env["python"], "torch": env.get("torch"), "ffnlab": env["git_rev"]}))


def bench_train(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="ffnlab-scale-"))
    source = corpus_file(work / f"corpus-{args.size_mb}mb.txt", args.size_mb)
    tokenizer_json = work / "bpe-512.json"
    tokenizer_json.write_text(train_bpe(load_corpus("shakespeare").train, 512), encoding="utf-8")
    timed_child([sys.executable, "-m", "ffnlab", "data", "prepare", str(source), "--out", str(work / "tokens"),
                 "--tokenizer", str(tokenizer_json), "--quiet"])  # fmt: skip
    base = TrainConfig(max_steps=args.steps, threads=1, eval_every=10**6, tokenizer=str(tokenizer_json))
    got = in_turns({"prepared": replace(base, data=str(work / "tokens")), "text": base}, args.repeats)
    header()
    print(f"model: ffnlab's default, BPE 512, {args.steps} steps, 1 thread; median of {args.repeats}, in turns")
    for name, what in (("prepared", f"the prepared {args.size_mb} MB"), ("text", "the bundled corpus as text")):
        r = got[name]
        print(f"{what}: first step {r['first_step_s']:.1f} s after start, peak RSS {r['peak_rss'] / 2**20:,.0f} MiB, "
              f"{r['tokens_per_s']:,.0f} tokens/s")  # fmt: skip
    p, t = got["prepared"], got["text"]
    print(f"prepared against text: tokens/s {p['tokens_per_s'] / t['tokens_per_s']:.3f}x (target within 3%), "
          f"peak RSS {(p['peak_rss'] - t['peak_rss']) / 2**20:+,.0f} MiB (target at most +200)")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


def bench_ddp(args) -> None:
    base = TrainConfig(max_steps=args.steps, batch_size=args.batch_size, threads=1, precision="fp32",
                       eval_every=10**6, eval_batches=2, final_eval_batches=2)  # fmt: skip
    got = in_turns({"one": base, "two": replace(base, nproc=2)}, args.repeats)
    header()
    m = base.model
    print(f"model: ffnlab's default ({m.n_layers} layers, d_model {m.d_model}, context {m.context}), fp32, "
          f"{args.steps} steps, batch {args.batch_size} per process; median of {args.repeats}, in turns")  # fmt: skip
    one, two = got["one"]["tokens_per_s"], got["two"]["tokens_per_s"]
    print(f"1 process x 1 thread (global batch {args.batch_size}): {one:,.0f} tokens/s")
    print(f"2 processes x 1 thread (global batch {2 * args.batch_size}): {two:,.0f} tokens/s, {two / one:.2f}x "
          "(target: at least 1.8x)")  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    prepare = sub.add_parser("prepare", help="ffnlab data prepare against tokenizers' encode_batch")
    prepare.add_argument("--size-mb", type=int, default=100)
    prepare.add_argument("--repeats", type=int, default=1)
    prepare.add_argument("--workdir", default=None, help="keep the text and tokens here (default: a temporary folder)")
    prepare.set_defaults(func=bench_prepare)
    train = sub.add_parser("train", help="training from a prepared folder against the same model on text")
    train.add_argument("--size-mb", type=int, default=100)
    train.add_argument("--steps", type=int, default=60)
    train.add_argument("--repeats", type=int, default=3)
    train.set_defaults(func=bench_train)
    ddp = sub.add_parser("ddp", help="2 processes x 1 thread against 1 process x 1 thread")
    ddp.add_argument("--steps", type=int, default=40)
    # NOTE: the gradients' all-reduce costs the same at any batch: at 16 per process it held 2 processes to 1.59x of
    # one, at 64 they reached 1.85x (AMX Xeon, 2 cores, idle)
    ddp.add_argument("--batch-size", type=int, default=64)
    ddp.add_argument("--repeats", type=int, default=3)
    ddp.set_defaults(func=bench_ddp)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
