"""Where GatedFFN's fused path is at least as fast as eager: a whole FFN forward+backward, fused vs
eager timed in turns, per thread count, size and precision (fp32, bf16 autocast). The result decides
`ffnlab.core.kernels.fused_is_faster`, GatedFFN's default; the numbers are in benchmarks/README.md
("The default") and, in full, HISTORY.md.

    python benchmarks/fused_default.py [--repeats 3] [--steps 30]
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch

from ffnlab._util.machine import environment
from ffnlab.core.ffn import build_ffn

SIZES = ((128, 1024), (256, 4096), (512, 4096))  # (d_model, tokens): the default study's, two larger


def step_ms(ffn, x, bf16: bool, steps: int) -> float:
    """Median milliseconds of forward + backward after 5 warm-up steps."""
    times = []
    for _ in range(steps + 5):
        t = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            y = ffn(x)
        y.float().sum().backward()
        times.append(time.perf_counter() - t)
    return statistics.median(times[5:]) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--variants", default="swiglu,geglu")
    args = p.parse_args(argv)
    print(
        json.dumps(
            {"cpu": environment()["cpu"], "cores": os.cpu_count(), "torch": torch.__version__, "load": os.getloadavg()}
        )
    )
    print(
        "| threads | d_model | tokens | d_ff | hidden elements | ffn | precision | fused ms | eager ms | eager/fused |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for threads in (2, 1):
        torch.set_num_threads(threads)
        for d_model, tokens in SIZES:
            for name in args.variants.split(","):
                for bf16 in (False, True):
                    ffn = build_ffn(name, d_model=d_model)
                    x = torch.randn(tokens, d_model, requires_grad=True)
                    ms = {True: [], False: []}
                    for _ in range(args.repeats):
                        for fused in (True, False):
                            ffn.fused = fused
                            ms[fused].append(step_ms(ffn, x, bf16, args.steps))
                    f, e = statistics.median(ms[True]), statistics.median(ms[False])
                    print(
                        f"| {threads} | {d_model} | {tokens} | {ffn.d_ff} | {tokens * ffn.d_ff:,} | {name} | "
                        f"{'bf16 autocast' if bf16 else 'fp32'} | {f:.2f} | {e:.2f} | {e / f:.2f} |",
                        flush=True,
                    )
    print(json.dumps({"load_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
