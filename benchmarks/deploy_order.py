"""Does a deploy row's speed depend on the rows timed before it? Rows timed one after another against the same
rows timed in turns (ffnlab.tools.deploy.time_rows), in both orders of the variants.

    python benchmarks/deploy_order.py [--ffn relu,gelu] [--precisions fp32] [--runtimes eager] [--d-model 512]
                                      [--n-layers 6] [--context 256] [--batch 16] [--threads 2] [--repeats 10]
                                      [--warmup 3] [--busy] [--json]

For each order (as given, then reversed) every row is set up once (`set_up`), then timed twice: each row's calls
back to back, the rows one after another (how deploy timed before it took turns), and all rows' calls in turns.
Beside each row's throughput it prints what each throughput call cost the process: minor page faults, involuntary
context switches and CPU seconds per wall second, which tell the allocator (faults), other work on the cores
(switches) and threads spinning or waiting (CPU/wall) apart. --busy starts a busy loop on CPU 0 for the run, as
other work on one core of a shared machine. A benchmark, not a test: timings depend on the machine and its load.
"""

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch
from compare_default import machine

from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.tools import deploy as dp


class Costs:
    """A function that records what each call of it cost the process (getrusage) beside its wall time."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        self.fn()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        self.calls.append((after.ru_minflt - before.ru_minflt, after.ru_nivcsw - before.ru_nivcsw, cpu / wall))

    def summary(self, skip: int) -> dict:
        """Medians over the timed calls (the last ones, after `skip` warm-up calls)."""
        timed = self.calls[skip:]
        faults, switches, cpu = (statistics.median(c[i] for c in timed) for i in range(3))
        return {"faults_per_call": faults, "switches_per_call": switches, "cpu_per_wall": round(cpu, 2)}


def measure(order: list[str], args, mode: str) -> list[dict]:
    """Every row of the variants in `order`, timed one after another ('sequence') or in turns ('turns')."""
    inputs = dp.model_inputs(ModelConfig(context=args.context), args.batch, args.context)
    wanted = dp.targets(args.precisions, args.runtimes)
    with dp.threads_set(args.threads), dp.work_folder(None) as folder, dp.compiled_together():
        pending = []
        for ffn in order:
            model = Transformer(ModelConfig(ffn=ffn, d_model=args.d_model, n_layers=args.n_layers, n_heads=8,
                                            context=args.context)).eval()  # fmt: skip
            pending += [dp.set_up(ffn, model, t, inputs, folder) for t in wanted]
        live = [(row, Costs(partial(module, inputs.many))) for row, module in pending if module is not None]
        started = time.perf_counter()
        groups = [live] if mode == "turns" else [[r] for r in live]
        out = []
        with torch.inference_mode():
            for group in groups:
                turns = dp.time_in_turns([costs for _, costs in group], args.repeats, args.warmup)
                for (row, costs), times in zip(group, turns.times):
                    lat = dp.spread(times, args.batch, args.context, turns.warmup, args.threads)
                    tokens = args.batch * args.context
                    out.append({"order": ",".join(order), "mode": mode, "row": f"{row.ffn} {row.target.label()}",
                                "tokens_per_s": round(lat.tokens_per_s), "q1": round(tokens / lat.q3_s),
                                "q3": round(tokens / lat.q1_s), "warmup": turns.warmup,
                                "at_s": round(time.perf_counter() - started), **costs.summary(turns.warmup)})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ffn", default="relu,gelu")
    p.add_argument("--precisions", default="fp32")
    p.add_argument("--runtimes", default="eager")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=6)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--busy", action="store_true", help="a busy loop on CPU 0 while it runs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {json.dumps(machine())}")
    busy = None
    if args.busy:
        busy = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"])
    try:
        order = args.ffn.split(",")
        results = []
        for variants in (order, order[::-1]):
            for mode in ("sequence", "turns"):
                results += measure(variants, args, mode)
                for r in results[-len(variants) * len(dp.targets(args.precisions, args.runtimes)) :]:
                    print(f"{r['order']:<10} {r['mode']:<8} {r['row']:<28} {r['tokens_per_s']:>7} tokens/s "
                          f"[{r['q1']}-{r['q3']}] at {r['at_s']:>4} s: {r['faults_per_call']:.0f} faults, "
                          f"{r['switches_per_call']:.0f} switches a call, CPU/wall {r['cpu_per_wall']}", flush=True)  # fmt: skip
    finally:
        if busy is not None:
            with contextlib.suppress(ProcessLookupError):
                busy.kill()
            busy.wait()
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
