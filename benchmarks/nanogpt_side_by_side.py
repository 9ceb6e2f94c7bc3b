"""nanoGPT itself beside `ffnlab train` on nanoGPT's CPU recipe: time to nanoGPT's quality, and tokens/s.

    python benchmarks/nanogpt_side_by_side.py --nanogpt DIR [--iters 2000] [--precision fp32] [--compile]
        [--pairs 1] [--floor 200] [--resolution 50] [--no-search] [--smoke]

DIR is a checkout of karpathy/nanoGPT outside this repository (MIT; nothing of it is copied here). Its
shakespeare_char data is prepared from the team's corpus copy (../shared/data/tinyshakespeare.txt, or
FFNLAB_BENCH_DATA) with nanoGPT's own prepare.py, which then downloads nothing. Both train the recipe of
nanoGPT's README ("I only have a macbook"): 4 layers, 4 heads, d_model 128, context 64, batch 12, lr 1e-3
cosine to 1e-4 with 100 warm-up steps, beta2 0.99, no dropout, fp32, no compile, torch's default threads.
Both hold out the same text: the last 10% of the characters (prepare.py's cut; ffnlab reads it from a
folder of train.txt / val.txt / test.txt written beside nanoGPT's data, test.txt a copy of val.txt).

What it measures, reported separately:
- implementation, tokens/s at equal work: the same model, batch and steps (`--iters`) on both sides,
  tokens per median step; runs alternate (nanoGPT, ffnlab, nanoGPT, ...) so drift on a shared machine
  hits both.
- recipe, steps to nanoGPT's quality: the fewest steps N of ffnlab's own schedule (its cosine over N
  steps, the recipe's warm-up) whose final loss reaches nanoGPT's final loss after `--iters`. Found by
  bisection on N between `--floor` and `--iters` to `--resolution` steps, each probe a whole run of N
  steps (every probe is reported). The recipes differ (initialisation, biases, ...):
  benchmarks/nanogpt_recipe_gap.py measures what each difference does.
- time to quality, both together: nanoGPT's training time for its whole run against ffnlab's for the
  run at that N, and their ratio.

Equal evaluation: both final losses come from one evaluation, `nanogpt_model.mean_loss` in fp32 on
ffnlab's fixed final validation batches (the recipe's `final_eval_batches`, drawn as ffnlab's final
evaluation draws them). nanoGPT saves its final checkpoint (`always_save_checkpoint`, one evaluation at
`--iters`), and a separate process imports nanoGPT's model from DIR and evaluates it on those batches
(saved with torch.save in nanoGPT's token ids). nanoGPT's own estimate (20 random batches) and ffnlab's
(its final evaluation, at its precision) are kept beside it.

Timed the same way: a side's training time is the wall time of its N updates, the first included, no
evaluation: nanoGPT's logged iteration times summed (its first iteration holds its step-0 evaluation, so
the median iteration stands in for it), ffnlab's `train_seconds` with one evaluation batch at the end (a
forward pass) and no other. ffnlab's first step holds torch.compile's compile time with `--compile`: each
run compiles again (torch._dynamo.reset(); the on-disk caches stay warm after the first), but in this process,
where inductor is imported and its kernels loaded, so it starts faster than a fresh `ffnlab train --compile`.
With `--compile` the time to quality is therefore also given with a fresh process's start: the found run's
first step replaced by that of the recipe trained for 2 steps in a process of its own (`fresh_first_step`).
The found run and nanoGPT's ran minutes apart, and this shared machine's load can change between them; so the
time to quality is also given from each pair's median steps, both timed back to back (`back_to_back`): that
first step plus N - 1 of ffnlab's median steps, against nanoGPT's iterations at its median step.
A benchmark, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import numpy as np
import torch
from compare_default import machine
from nanogpt_model import mean_loss
from torch import nn
from train_speed import DATA, RECIPE

from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.data.batches import eval_set
from ffnlab.data.load import load_data
from ffnlab.run.config import TrainConfig
from ffnlab.run.profile import StepProfile, format_profile, profile_training
from ffnlab.run.train import data_args, train

HERE = Path(__file__).resolve().parent
TOKENS_PER_ITER = RECIPE.batch_size * RECIPE.model.context
NANOGPT_EVAL_ITERS = 20  # nanoGPT's own estimate: this many random batches of its val.bin


@dataclass
class Run:
    """One training run of either side, as this benchmark reads it."""

    side: str  # "nanogpt" or "ffnlab"
    steps: int
    loss: float  # on ffnlab's fixed validation batches, fp32, by `mean_loss`: the equal evaluation
    own_loss: float  # the side's own: nanoGPT's 20 random batches, ffnlab's final evaluation at its precision
    train_s: float  # the `steps` updates, the first included, no evaluation (module doc)
    ms_per_iter: float  # the median step
    tokens_per_s: int
    first_step_s: float | None = None  # ffnlab: with --compile, the compile; nanoGPT's holds an evaluation

    def line(self) -> str:
        return (
            f"{self.side} {self.steps} steps: loss {self.loss:.4f} (own {self.own_loss:.4f}), "
            f"{self.train_s:.1f} s, {self.ms_per_iter:.2f} ms/step, {self.tokens_per_s:,} tokens/s"
        )


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


def save_eval_batches(recipe: TrainConfig, nanogpt: Path, data: Path, out: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """ffnlab's fixed final validation batches, drawn by `eval_set` as its final evaluation draws them, saved
    to `out` in both sides' token ids (ffnlab's char ids are nanoGPT's shifted by its <unk>); ffnlab's returned.
    Exits if ffnlab's validation tokens, mapped, are not nanoGPT's val.bin."""
    cfg = replace(recipe, data=str(data))
    _, tok, splits = load_data(*data_args(cfg))
    batches = eval_set(splits["val"], "lm", cfg.final_eval_batches, cfg.batch_size, cfg.model.context)
    x, y = torch.stack([b[0] for b in batches]), torch.stack([b[1] for b in batches])  # (n, B, T) each
    folder = nanogpt / "data" / "shakespeare_char"
    chars = sorted(set((folder / "input.txt").read_text()))  # prepare.py's vocabulary, in its order
    to_nanogpt = torch.tensor([chars.index(c) if c in chars else -1 for c in tok.itos])
    val = torch.from_numpy(np.fromfile(folder / "val.bin", dtype=np.uint16).astype(np.int64))
    if not torch.equal(to_nanogpt[splits["val"]], val):
        sys.exit("ffnlab's validation tokens are not nanoGPT's val.bin: the two do not hold out the same text")
    torch.save({"ffnlab_x": x, "ffnlab_y": y, "nanogpt_x": to_nanogpt[x], "nanogpt_y": to_nanogpt[y]}, out)
    return x, y


def last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def run_nanogpt(nanogpt: Path, iters: int, work: Path) -> Run:
    """nanoGPT's train.py for `iters` updates, its checkpoint saved after the last and evaluated on the
    batches in work/batches.pt by nanogpt_model.py in a process of its own."""
    flags = ["--device=cpu", "--compile=False", f"--eval_iters={NANOGPT_EVAL_ITERS}", "--log_interval=1",
             "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
             f"--max_iters={iters}", f"--lr_decay_iters={iters}", "--dropout=0.0", f"--eval_interval={iters}",
             "--always_save_checkpoint=True", f"--out_dir={work / 'nanogpt'}"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "train.py", "config/train_shakespeare_char.py", *flags],
        cwd=nanogpt,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ).stdout
    # NOTE: train.py evaluates and saves at the top of iteration `iters`, then runs that one more update
    # and stops: the checkpoint holds iterations 0..iters-1, the times of which are the first `iters` lines
    times = [float(ms) / 1e3 for ms in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", out, re.M)][:iters]
    median = statistics.median(times[1:] or times)
    evaluated = subprocess.run(
        [sys.executable, str(HERE / "nanogpt_model.py"), "eval", "--nanogpt", str(nanogpt),
         "--checkpoint", str(work / "nanogpt" / "ckpt.pt"), "--batches", str(work / "batches.pt")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    ev = last_json_line(evaluated)
    if ev["iter_num"] != iters:
        sys.exit(f"nanoGPT's checkpoint is from iteration {ev['iter_num']}, not {iters}")
    return Run(
        side="nanogpt",
        steps=iters,
        loss=ev["loss"],
        own_loss=ev["own_val_loss"],
        train_s=median + sum(times[1:]),  # iteration 0's time holds nanoGPT's step-0 evaluation
        ms_per_iter=round(median * 1e3, 2),
        tokens_per_s=round(TOKENS_PER_ITER / median),
        first_step_s=times[0],
    )


def ffnlab_config(recipe: TrainConfig, data: Path, steps: int, precision: str, compile: bool, **changes) -> TrainConfig:
    """The recipe over `steps` (its cosine over them, the recipe's warm-up) with torch's threads, as nanoGPT
    runs; the loop evaluates once, at the end, on one batch (what `train_seconds` then holds)."""
    return replace(recipe, data=str(data), max_steps=steps, precision=precision, compile=compile,
                   threads=None, eval_every=steps, eval_batches=1, **changes)  # fmt: skip


def run_ffnlab(
    cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, factory: Callable[[ModelConfig, int], nn.Module] = Transformer
) -> Run:
    """One `train(cfg)` with the model from `factory`, its final weights evaluated on (x, y) by `mean_loss`."""
    built = []

    def build(mcfg: ModelConfig, seed: int) -> nn.Module:
        built.append(factory(mcfg, seed))
        return built[-1]

    torch._dynamo.reset()  # compile again (the on-disk caches stay warm; a fresh process: `fresh_first_step`)
    r = train(cfg, model_factory=build)
    if r.status != "finished":
        sys.exit(f"ffnlab's run of {cfg.max_steps} steps ended {r.status}")
    return Run(
        side="ffnlab",
        steps=r.steps,
        loss=mean_loss(built[-1], x, y),
        own_loss=r.val.loss,
        train_s=r.costs.train_seconds,
        ms_per_iter=round(r.costs.step_time_s * 1e3, 2),
        tokens_per_s=round(r.costs.tokens_per_s),
        first_step_s=r.costs.first_step_s,
    )


def fresh_first_step(cfg: TrainConfig) -> float:
    """The first step of `cfg` (with `compile`, the compile) in a process of its own, as `ffnlab train` starts:
    the recipe trained for 2 steps in a subprocess, its first_step_s."""
    code = (
        "import json, sys\nfrom ffnlab.run.config import TrainConfig\nfrom ffnlab.run.train import train\n"
        "print(train(TrainConfig.from_dict(json.loads(sys.argv[1]))).costs.first_step_s)"
    )
    short = replace(cfg, max_steps=2, eval_every=2).to_dict()
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(short)], capture_output=True, text=True, check=True, env=env
    )
    return float(out.stdout.split()[-1])


@dataclass
class Search:
    """What the bisection found: the run of fewest steps that reached the target (None: none did), the most
    steps run that did not (None: none was run below it, only `--floor` bounds it), every probe in order."""

    found: Run | None
    short_at: int | None
    probes: list[Run]


def shortest_schedule(
    probe: Callable[[int], Run], target: float, at_iters: Run, floor: int, ceiling: int, resolution: int
) -> Search:
    """Bisection on ffnlab's steps N for the fewest whose final loss <= target, from the run at nanoGPT's
    iterations: N is in (floor, iters] if that run reaches the target, else in (iters, ceiling], whose top is
    run first. Stops when the bracket is `resolution` steps or narrower. Assumes the final loss falls as N
    grows; the probes show where it does not."""
    probes = [at_iters]

    def run(steps: int) -> Run:
        probes.append(probe(steps))
        reached = "reaches" if probes[-1].loss <= target else "short of"
        print(f"  probe: {probes[-1].line()}: {reached} {target:.4f}", flush=True)
        return probes[-1]

    lo, hi = (None, at_iters) if at_iters.loss <= target else (at_iters, None)
    if hi is None:
        top = run(ceiling) if ceiling > at_iters.steps else at_iters
        if top.loss > target:
            return Search(None, top.steps, probes)
        hi = top
    while hi.steps - (lo.steps if lo else floor) > resolution:
        mid = run(((lo.steps if lo else floor) + hi.steps) // 2)
        lo, hi = (lo, mid) if mid.loss <= target else (mid, hi)
    return Search(hi, lo.steps if lo else None, probes)


def back_to_back(pairs: Sequence[tuple[Run, Run]], steps: int, first_step: float) -> dict:
    """Time to quality from each pair's median steps instead of the found run's wall time: ffnlab's `steps`
    (`first_step`, then steps - 1 at its median step) against nanoGPT's iterations at its median, both sides
    timed back to back in one pair. The probes ran minutes after nanoGPT; on a shared machine the load then
    can differ (its step moved by 20% between runs here), which the pairs do not see."""
    ratios = [(first_step + (steps - 1) * f.ms_per_iter / 1e3) / (n.steps * n.ms_per_iter / 1e3) for n, f in pairs]
    return {"first_step_s": round(first_step, 2), "ratios": [round(r, 3) for r in ratios],
            "ffnlab_over_nanogpt_time": round(statistics.median(ratios), 3)}  # fmt: skip


def time_to_quality(
    nanogpt: Run, search: Search, fresh_first: float | None = None, pairs: Sequence[tuple[Run, Run]] = ()
) -> dict:
    """The time-to-quality part of the output: both sides' runs, the ratios and the probes; with `fresh_first`
    (a fresh process's first step, `fresh_first_step`) also the found run's time with that first step; with
    `pairs` (nanoGPT's and ffnlab's runs at --iters) also the ratio from their steps (`back_to_back`)."""
    found = search.found
    out = {
        "target_loss": nanogpt.loss,
        "nanogpt": {"steps": nanogpt.steps, "train_s": round(nanogpt.train_s, 2)},
        "ffnlab": None if found is None else {
            "steps": found.steps,
            "train_s": round(found.train_s, 2),
            "loss": round(found.loss, 4),
            "short_at": search.short_at,  # the most steps run that did not reach it; None: only the floor bounds N
        },
        "probes": [
            {"steps": p.steps, "loss": round(p.loss, 4), "reached": p.loss <= nanogpt.loss, "train_s": round(p.train_s, 2)}
            for p in search.probes
        ],
    }  # fmt: skip
    if found is not None:
        out["ffnlab_over_nanogpt_steps"] = round(found.steps / nanogpt.steps, 3)  # the recipe
        out["ffnlab_over_nanogpt_time"] = round(found.train_s / nanogpt.train_s, 3)  # recipe and implementation
        if fresh_first is not None and found.first_step_s is not None:
            fresh = found.train_s - found.first_step_s + fresh_first
            out["fresh_process"] = {"first_step_s": round(fresh_first, 2), "train_s": round(fresh, 2),
                                    "ffnlab_over_nanogpt_time": round(fresh / nanogpt.train_s, 3)}  # fmt: skip
        first = fresh_first if fresh_first is not None else found.first_step_s
        if pairs and first is not None:
            out["back_to_back"] = back_to_back(pairs, found.steps, first)
    return out


def describe(args, eval_batches: int, ratio: float, tps: dict, nano: Run, longest: Run, quality: dict | None) -> dict:
    """What each measure says, in words: the implementation, the equal evaluation, the recipe, both together."""
    measures = {
        "implementation": f"tokens/s at equal work ({args.iters} steps of the same model and batch): ffnlab "
        f"{tps['ffnlab']:,.0f} against nanoGPT {tps['nanogpt']:,.0f}, {ratio:.2f}x",
        "equal_evaluation": f"after {args.iters} steps on ffnlab's {eval_batches} fixed validation "
        f"batches, fp32: nanoGPT {nano.loss:.4f}, ffnlab {longest.loss:.4f} (their own: nanoGPT "
        f"{nano.own_loss:.4f} on {NANOGPT_EVAL_ITERS} random batches, ffnlab {longest.own_loss:.4f})",
    }
    if quality and quality["ffnlab"]:
        q = quality["ffnlab"]
        short = f"{q['short_at']} did not" if q["short_at"] else f"--floor {args.floor} bounds it, not run"
        measures["recipe"] = (
            f"steps to nanoGPT's {nano.loss:.4f}: ffnlab {q['steps']} (its cosine over them; {short}) against "
            f"nanoGPT {args.iters}, {quality['ffnlab_over_nanogpt_steps']:.2f}x the steps"
        )
        measures["time_to_quality"] = (
            f"both together: ffnlab {q['train_s']:.1f} s against nanoGPT {nano.train_s:.1f} s, "
            f"{quality['ffnlab_over_nanogpt_time']:.2f}x the time"
        )
        if fresh := quality.get("fresh_process"):
            measures["time_to_quality"] += (
                f"; with a fresh process's compile ({fresh['first_step_s']:.1f} s first step) {fresh['train_s']:.1f} s, "
                f"{fresh['ffnlab_over_nanogpt_time']:.2f}x"
            )
        if b := quality.get("back_to_back"):
            measures["time_to_quality"] += (
                f"; from each pair's median steps, timed back to back (that first step, then {q['steps'] - 1} "
                f"steps): {b['ffnlab_over_nanogpt_time']:.2f}x"
                + (
                    f" ({min(b['ratios']):.2f}-{max(b['ratios']):.2f} over {len(b['ratios'])} pairs)"
                    if len(b["ratios"]) > 1
                    else ""
                )
            )
    elif quality:
        measures["recipe"] = f"ffnlab does not reach nanoGPT's {nano.loss:.4f} within {args.ceiling} steps"
    return measures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", required=True, type=Path, help="a nanoGPT checkout (outside this repository)")
    parser.add_argument("--iters", type=int, default=2000, help="nanoGPT's run, and ffnlab's at equal work")
    parser.add_argument("--pairs", type=int, default=1, help="nanoGPT/ffnlab pairs at --iters, alternating")
    parser.add_argument("--precision", default="fp32", help="ffnlab's precision (nanoGPT's CPU recipe is fp32)")
    parser.add_argument("--compile", action="store_true", help="torch.compile ffnlab's model (nanoGPT's recipe: no)")
    parser.add_argument("--floor", type=int, default=200, help="the search's lower bound on ffnlab's steps")
    parser.add_argument("--ceiling", type=int, help="the search's upper bound (default --iters)")
    parser.add_argument("--resolution", type=int, default=50, help="the search stops when its bracket is this narrow")
    parser.add_argument("--no-search", action="store_true", help="tokens/s and the equal evaluation only")
    parser.add_argument("--smoke", action="store_true", help="toy budgets (10 iterations), to check the plumbing")
    parser.add_argument(
        "--profile", action="store_true", help="also where ffnlab's step goes (ffnlab.run.profile), by kind of work"
    )
    args = parser.parse_args()
    recipe = RECIPE
    if args.smoke:  # at 10 steps ffnlab is short of nanoGPT's loss, so the search runs above them too
        args.iters, args.floor, args.ceiling, args.resolution = 10, 5, 30, 6
        recipe = replace(RECIPE, final_eval_batches=4)
    args.ceiling = args.ceiling or args.iters
    print("command: python benchmarks/nanogpt_side_by_side.py " + " ".join(sys.argv[1:]))
    print("machine:", json.dumps(machine()))
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.nanogpt, capture_output=True, text=True).stdout.strip()
    print("nanogpt:", rev or "(not a git checkout)", flush=True)
    data = prepare(args.nanogpt)
    with tempfile.TemporaryDirectory(prefix="ffnlab-nanogpt-") as tmp:
        work = Path(tmp)
        x, y = save_eval_batches(recipe, args.nanogpt, data, work / "batches.pt")
        runs: dict[str, list[Run]] = {"nanogpt": [], "ffnlab": []}
        for _ in range(args.pairs):
            runs["nanogpt"].append(run_nanogpt(args.nanogpt, args.iters, work))
            print(runs["nanogpt"][-1].line(), flush=True)
            runs["ffnlab"].append(
                run_ffnlab(ffnlab_config(recipe, data, args.iters, args.precision, args.compile), x, y)
            )
            print(runs["ffnlab"][-1].line(), flush=True)
    tps = {side: statistics.median(r.tokens_per_s for r in rs) for side, rs in runs.items()}
    nano = replace(runs["nanogpt"][0], train_s=statistics.median(r.train_s for r in runs["nanogpt"]))
    longest = replace(runs["ffnlab"][0], train_s=statistics.median(r.train_s for r in runs["ffnlab"]))
    quality = None
    if not args.no_search:
        print(f"searching ffnlab's shortest schedule reaching nanoGPT's {nano.loss:.4f}", flush=True)
        probe = lambda n: run_ffnlab(ffnlab_config(recipe, data, n, args.precision, args.compile), x, y)
        search = shortest_schedule(probe, nano.loss, longest, args.floor, args.ceiling, args.resolution)
        fresh = None
        if args.compile and search.found is not None:
            fresh = fresh_first_step(ffnlab_config(recipe, data, search.found.steps, args.precision, True))
        quality = time_to_quality(nano, search, fresh, list(zip(runs["nanogpt"], runs["ffnlab"])))
    ratio = tps["ffnlab"] / tps["nanogpt"]
    measures = describe(args, recipe.final_eval_batches, ratio, tps, nano, longest, quality)
    for name, text in measures.items():
        print(f"{name}: {text}")
    profile = None
    if args.profile:  # the speed ratio's explanation, from ffnlab's own profiler (`ffnlab train --profile`)
        torch._dynamo.reset()
        cfg = ffnlab_config(recipe, data, args.iters, args.precision, args.compile)
        profile = profile_training(cfg, steps=5 if args.smoke else 40, warmup=5).to_json()
        print(format_profile(StepProfile.from_json(profile)))
    print(json.dumps({"runs": {side: [asdict(r) for r in rs] for side, rs in runs.items()},
                      "ffnlab_over_nanogpt_tokens_per_s": round(ratio, 2), "time_to_quality": quality,
                      "measures": measures, "ffnlab_profile": profile,
                      "held_equal": ["model size, batch, optimiser, iterations (tokens/s)",
                                     "validation text: the last 10%", f"final evaluation: ffnlab's "
                                     f"{recipe.final_eval_batches} fixed batches, fp32, one function"],
                      "not_equal": ["the recipe's details: initialisation, biases, schedule "
                                    "(benchmarks/nanogpt_recipe_gap.py)",
                                    f"ffnlab precision {args.precision}, compile {args.compile}"]},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
