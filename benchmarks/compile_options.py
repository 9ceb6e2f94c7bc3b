"""Which torch.compile options make a training step of nanoGPT's recipe faster on this CPU, timed in one process.

    python benchmarks/compile_options.py [--options eager,python,cpp_wrapper] [--rounds 10] [--window 30]
        [--precision bf16]

Each option is the recipe (benchmarks/train_speed.py's RECIPE) set up once by `ffnlab.run.train.prepare`,
its step function replaced: `eager` the model itself; `python` torch.compile with Inductor's Python wrapper
(what `--compile` was before issue #26); `cpp_wrapper` the kernels called from C++ (what `--compile` runs
on the CPU now); `max_autotune` the C++ wrapper with Inductor's GEMM autotuning. A step is `train`'s: a
batch, the forward under the run's autocast, then `apply_gradients` (backward, clip, AdamW).

All options live in this one process and step in turns, `--window` steps each, `--rounds` times after a
warm-up round (which holds the compiles), so a burst of load on this shared machine falls on all alike
(separate runs of the same configuration moved by 20% here). Output: each option's median step and its
ratio to the first option's. A benchmark, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch
from compare_default import machine
from train_speed import RECIPE

from ffnlab.run.train import Setup, apply_gradients, batch_loss, prepare

OPTIONS = {  # name -> torch.compile's keyword arguments; None: no compile
    "eager": None,
    "python": {"options": {"cpp_wrapper": False}},
    "cpp_wrapper": {"options": {"cpp_wrapper": True}},
    "max_autotune": {"options": {"cpp_wrapper": True, "max_autotune": True}},
}


def setup(option: str, precision: str) -> Setup:
    """The recipe set up as `train` does, stepping through the option's step function."""
    s = prepare(replace(RECIPE, precision=precision, compile=False))
    kwargs = OPTIONS[option]
    if kwargs is not None:
        s.step_fn = torch.compile(s.model, dynamic=False, **kwargs)
    return s


def window(s: Setup, steps: int, first: int) -> list[float]:
    """`steps` training steps of `s` from step `first`: each one's seconds."""
    times = []
    for step in range(first, first + steps):
        t = time.perf_counter()
        apply_gradients(s, batch_loss(s), step)
        times.append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--options", default="eager,python,cpp_wrapper", help=f"of {', '.join(OPTIONS)}")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--window", type=int, default=30)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    args = p.parse_args(argv)
    names = args.options.split(",")
    if unknown := [n for n in names if n not in OPTIONS]:
        p.error(f"unknown option {unknown[0]!r}; valid: {', '.join(OPTIONS)}")
    print(f"command: python benchmarks/compile_options.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("machine:", json.dumps({**machine(), "precision": args.precision}))
    setups = {n: setup(n, args.precision) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds + 1):  # round 0: the warm-up (compiles), not kept
        for n in names:
            t = window(setups[n], args.window, r * args.window)
            if r:
                times[n] += t
    base = statistics.median(times[names[0]])
    for n in names:
        m = statistics.median(times[n])
        print(f"{n:13s} median step {m * 1e3:6.2f} ms  {m / base:.3f}x {names[0]}'s")


if __name__ == "__main__":
    main()
