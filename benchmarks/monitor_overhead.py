"""What the stability monitors cost per training step: the same run with them on and off, alternating.

    python benchmarks/monitor_overhead.py [--pairs 3] [--steps 200] [--precision fp32|bf16|auto]

"On" is a run as every study trains it: FFN gradient statistics every `log_every` (10) steps, loss
and gradient-norm spike detection every step, and the activation probe at the end. "Off" sets
log_every past the run's last step, so no gradient statistics are taken; spike detection reads two
numbers the step computes anyway (the loss and the clipped norm) and stays on in both. The probe
runs once after training and so is outside the step time. Runs alternate on and off so that drift on
a shared machine hits both alike; the output is the median over runs of each run's mean step time
(training time over steps, one evaluation at the end in both), and their ratio.
A benchmark, not a test: the numbers depend on the machine and on what else runs on it.
"""

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from compare_default import machine

from ffnlab.run.presets import standard
from ffnlab.run.train import train


def median_step(log_every: int, steps: int, precision: str) -> float:
    cfg = replace(standard(), max_steps=steps, eval_every=steps, log_every=log_every, precision=precision, threads=1)
    # the mean, not the median: gradient statistics run on one step in log_every, which a median skips
    result = train(cfg)
    return result.costs.train_seconds / result.steps  # one evaluation, at the end, in both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--precision", default="auto")
    args = parser.parse_args()
    print("command: python benchmarks/monitor_overhead.py " + " ".join(sys.argv[1:]))
    print("machine:", json.dumps(machine()))
    on, off = [], []
    for _ in range(args.pairs):
        on.append(median_step(10, args.steps, args.precision))
        off.append(median_step(10**9, args.steps, args.precision))
    on_ms, off_ms = statistics.median(on) * 1e3, statistics.median(off) * 1e3
    print(json.dumps({"step_ms_monitors_on": round(on_ms, 3), "step_ms_monitors_off": round(off_ms, 3),
                      "overhead": f"{(on_ms / off_ms - 1) * 100:+.1f}%",
                      "overhead_median_of_pairs": f"{(statistics.median(a / b for a, b in zip(on, off)) - 1) * 100:+.1f}%", "pairs": args.pairs, "steps": args.steps,
                      "on_runs_ms": [round(t * 1e3, 3) for t in on], "off_runs_ms": [round(t * 1e3, 3) for t in off]}))  # fmt: skip


if __name__ == "__main__":
    main()
