"""Time parsing the bundled corpus (the first thing every run of a fresh process does).

    python benchmarks/data_load.py [--repeats 5]

Prints the machine and the median of the repeats, each from a cold cache. A benchmark, not a test:
the time depends on the machine and on what else runs on it.
"""

import argparse
import json
import os
import statistics
import time

from ffnlab._util.machine import environment
from ffnlab.data import corpus


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    times = []
    for _ in range(args.repeats):
        corpus.bundled_plays.cache_clear()
        corpus._shakespeare.cache_clear()
        start = time.perf_counter()
        corpus.load_corpus("shakespeare")
        times.append(time.perf_counter() - start)
    print("machine:", json.dumps({"cpu": environment()["cpu"], "cores": os.cpu_count(), "load": os.getloadavg()}))
    print(
        f"load_corpus('shakespeare'), cold: median {statistics.median(times):.3f} s over {args.repeats} "
        f"(min {min(times):.3f}, max {max(times):.3f})"
    )


if __name__ == "__main__":
    main()
