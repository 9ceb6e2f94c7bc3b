"""Does GELU moved out of the FFN make training fail completely? The runs behind claims.json's placement row.

    python benchmarks/placement_claim.py [--preset standard] [--seeds 3] [--steps 480] [--ffn gelu]

Trains the same model with the activation at each `ModelConfig.act_position` (inside the FFN, before the
FFN's LayerNorm, after the residual add; `ffnlab.core.model.Block`), paired seeds (a seed's runs start
from the same weights), fp32, on the bundled corpus, and prints the command, the machine, the library
versions, a row per run, each position's final validation loss with its 95% CI over the seeds, and the
`args` of the claim (`measure_recorded_placement`) to paste into ffnlab/tools/claims.json. A run "fails
completely" when it diverges or ends no better than its untrained loss on the same validation batches
(`ffnlab.tools.claims.failed_completely`). The recorded output is benchmarks/placement_claim.md.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch
from compare_default import machine

from ffnlab._util.machine import environment
from ffnlab.core.model import ACT_POSITIONS
from ffnlab.run.config import TrainConfig
from ffnlab.run.presets import preset_config
from ffnlab.run.train import train
from ffnlab.study.stats import mean_ci
from ffnlab.tools.claims import failed_completely


def base_config(preset: str, ffn: str, steps: int | None) -> TrainConfig:
    """The preset's run in fp32 with `ffn`, evaluated at the end on its curve's batches, so that the
    untrained loss (the curve's step 0) and the final loss are measured on the same tokens."""
    cfg = preset_config(preset, model={"ffn": ffn}, precision="fp32")
    cfg = replace(cfg, max_steps=steps or cfg.max_steps)
    return replace(cfg, eval_batches=cfg.final_eval_batches)


def placement_runs(base: TrainConfig, seeds: int, log=print) -> dict[str, dict]:
    """Per act_position: each seed's untrained and final validation loss, whether it diverged, and the
    final loss's [mean, lo, hi] over the seeds that finished (claims.json's `runs`)."""
    runs: dict[str, dict] = {}
    for position in ACT_POSITIONS:
        record: dict = {"untrained": [], "final": [], "diverged": []}
        for seed in range(seeds):
            cfg = replace(base, seed=seed, model=replace(base.model, act_position=position))
            start = time.perf_counter()
            r = train(cfg)
            untrained = r.history.val[0].loss
            diverged = r.status == "diverged"
            record["untrained"].append(untrained)
            record["final"].append(None if diverged else r.val.loss)
            record["diverged"].append(diverged)
            fails = failed_completely(untrained, r.val.loss, diverged)
            log(
                f"| {position} | {seed} | {r.status}{f' ({r.diverged_kind})' if diverged else ''} | {untrained:.4f} "
                f"| {'-' if diverged else f'{r.val.loss:.4f}'} | {'yes' if fails else 'no'} "
                f"| {time.perf_counter() - start:.1f} |"
            )
        m = mean_ci([f for f in record["final"] if f is not None])
        record["mean_ci"] = [m.mean, m.ci_low, m.ci_high]
        runs[position] = record
    return runs


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="standard", help="the run's preset (ffnlab.run.presets)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the preset's)")
    p.add_argument("--ffn", default="gelu", help="a dense variant: its activation is the one moved")
    args = p.parse_args(argv)
    print("command:", " ".join(["python", "benchmarks/placement_claim.py", *(argv or sys.argv[1:])]))
    print(json.dumps({**machine(), "threads": torch.get_num_threads(), "ffnlab": environment().get("git_rev")}))
    base = base_config(args.preset, args.ffn, args.steps)
    m = base.model
    print(
        f"{args.ffn}, {m.n_layers} layers, d_model {m.d_model}, context {m.context}, {m.norm}, placement {m.placement}; "
        f"{base.max_steps} steps of {base.batch_size} sequences, lr {base.lr}, {base.precision}, "
        f"{base.final_eval_batches} validation batches"
    )
    print("\n| act_position | seed | status | untrained val loss | final val loss | failed completely | s |")
    print("|---|---|---|---|---|---|---|")
    runs = placement_runs(base, args.seeds)
    print("\n| act_position | final val loss, mean [95% CI] | failed completely |")
    print("|---|---|---|")
    for position, r in runs.items():
        mean, lo, hi = r["mean_ci"]
        shown = "all diverged" if mean is None else f"{mean:.4f}" + ("" if lo is None else f" [{lo:.4f}, {hi:.4f}]")
        failed = sum(failed_completely(*run) for run in zip(r["untrained"], r["final"], r["diverged"]))
        print(f"| {position} | {shown} | {failed}/{len(r['final'])} |")
    print('\nclaims.json "args" (one row per moved position):')
    print(json.dumps({"position": "before_norm", "runs": runs}))
    print(json.dumps({"load_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
