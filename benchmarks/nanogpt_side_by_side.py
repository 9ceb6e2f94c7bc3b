"""nanoGPT itself beside `ffnlab train` on nanoGPT's CPU recipe: tokens/s and validation loss, alternating.

    python benchmarks/nanogpt_side_by_side.py --nanogpt DIR [--iters 2000] [--pairs 1] [--precision fp32]

DIR is a checkout of karpathy/nanoGPT outside this repository (MIT; nothing of it is copied here). Its
shakespeare_char data is prepared from the team's corpus copy (../shared/data/tinyshakespeare.txt, or
FFNLAB_BENCH_DATA) with nanoGPT's own prepare.py, which then downloads nothing. Both train the recipe of
nanoGPT's README ("I only have a macbook"): 4 layers, 4 heads, d_model 128, context 64, batch 12, lr 1e-3
cosine to 1e-4 over the run with 100 warm-up steps, beta2 0.99, no dropout, fp32, no compile, torch's
default threads. Runs alternate (nanoGPT, ffnlab, nanoGPT, ...) so drift on a shared machine hits both.

Both hold out the same text: nanoGPT's prepare.py keeps the last 10% of the characters for validation, and
ffnlab reads the same cut from a folder of train.txt / val.txt / test.txt written beside nanoGPT's data
(test.txt a copy of val.txt: ffnlab's rule for named files, README "Data"). Not held equal, and said in
the output: nanoGPT estimates its validation loss on 20 random batches, ffnlab on the recipe's fixed
batches. A benchmark, not a test: the numbers depend on the machine.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from compare_default import machine
from train_speed import DATA, RECIPE

from ffnlab.run.train import train

TOKENS_PER_ITER = RECIPE.batch_size * RECIPE.model.context


def prepare(nanogpt: Path) -> Path:
    """nanoGPT's shakespeare_char train.bin/val.bin from our copy of the corpus, by its own prepare.py,
    and the same split as text files for ffnlab: the folder it trains on."""
    folder = nanogpt / "data" / "shakespeare_char"
    if not (folder / "train.bin").exists():
        shutil.copyfile(DATA, folder / "input.txt")
        subprocess.run([sys.executable, "prepare.py"], cwd=folder, check=True, capture_output=True)
    text = (folder / "input.txt").read_text()
    cut = int(len(text) * 0.9)  # prepare.py's cut: data[:int(n*0.9)] trains, the rest validates
    split = folder / "ffnlab_split"
    split.mkdir(exist_ok=True)
    for name, part in (("train.txt", text[:cut]), ("val.txt", text[cut:]), ("test.txt", text[cut:])):
        (split / name).write_text(part)
    return split


def run_nanogpt(nanogpt: Path, iters: int) -> dict:
    flags = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
             "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", f"--max_iters={iters}",
             f"--lr_decay_iters={iters}", "--dropout=0.0", "--always_save_checkpoint=False", "--eval_interval=250"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "train.py", "config/train_shakespeare_char.py", *flags],
        cwd=nanogpt,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ).stdout
    times = [float(ms) for ms in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", out, re.M)][1:]
    val = [float(v) for v in re.findall(r"^step \d+: train loss [\d.]+, val loss ([\d.]+)", out, re.M)]
    ms = statistics.median(times)
    return {"ms_per_iter": round(ms, 2), "tokens_per_s": round(TOKENS_PER_ITER / ms * 1e3), "val_loss": val[-1]}


def run_ffnlab(iters: int, precision: str, data: Path, compile: bool) -> dict:
    cfg = replace(RECIPE, data=str(data), max_steps=iters, precision=precision, threads=None, compile=compile)
    r = train(cfg)
    return {
        "ms_per_iter": round(r.step_time_s * 1e3, 2),
        "tokens_per_s": round(r.tokens_per_s),
        "val_loss": r.final_val_loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", required=True, type=Path, help="a nanoGPT checkout (outside this repository)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--precision", default="fp32", help="ffnlab's precision (nanoGPT's CPU recipe is fp32)")
    parser.add_argument("--compile", action="store_true", help="torch.compile ffnlab's model (nanoGPT's recipe: no)")
    args = parser.parse_args()
    print("command: python benchmarks/nanogpt_side_by_side.py " + " ".join(sys.argv[1:]))
    print("machine:", json.dumps(machine()))
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.nanogpt, capture_output=True, text=True).stdout.strip()
    print("nanogpt:", rev or "(not a git checkout)")
    data = prepare(args.nanogpt)
    runs = {"nanogpt": [], "ffnlab": []}
    for _ in range(args.pairs):
        runs["nanogpt"].append(run_nanogpt(args.nanogpt, args.iters))
        runs["ffnlab"].append(run_ffnlab(args.iters, args.precision, data, args.compile))
    tps = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    print(json.dumps({"runs": runs, "ffnlab_over_nanogpt_tokens_per_s": round(tps["ffnlab"] / tps["nanogpt"], 2),
                      "held_equal": ["model, batch, schedule, optimiser, iterations", "validation text: the last 10%"],
                      "not_equal": [f"evaluation: nanoGPT 20 random batches, ffnlab {RECIPE.final_eval_batches} "
                                    "fixed batches", f"ffnlab precision {args.precision}, compile {args.compile}"]},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
