"""Time the default study (`ffnlab compare` with no arguments) end to end on this machine.

    python benchmarks/compare_default.py [--keep DIR] [extra compare flags...]

Runs the command in a fresh store (a temporary folder unless --keep), prints the command, the
machine, the library versions, the wall time and the ranking, so the documentation's numbers can be
traced. A benchmark, not a test: the time depends on the machine and on what else runs on it.
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from ffnlab._util.machine import cpu_flags, cpu_has_amx, environment
from ffnlab.run.device import resolve_precision


def machine_class() -> str:
    """'AMX' (bf16 native), 'AVX-512' (with or without avx512_bf16) or 'AVX2 only': the CPU classes this
    project's machines come in."""
    flags = cpu_flags()
    if not flags:
        return "unknown"
    if cpu_has_amx():
        return "AMX"
    return "AVX-512" + (" with avx512_bf16" if "avx512_bf16" in flags else "") if "avx512f" in flags else "AVX2 only"


def machine() -> dict:
    return {
        "cpu": environment()["cpu"],
        "class": machine_class(),
        "cores": os.cpu_count(),
        "precision": resolve_precision("auto", "cpu"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
    }


def main(argv):
    keep = None
    if argv[:1] == ["--keep"]:
        keep, argv = argv[1], argv[2:]
    folder = keep or tempfile.mkdtemp(prefix="ffnlab-bench-")
    cmd = [sys.executable, "-m", "ffnlab.cli", "compare", "--store", os.path.join(folder, "ffnlab.db"), "--json", *argv]
    print("command:", " ".join(cmd[1:]))
    print("machine:", json.dumps(machine()))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(proc.stderr)
    out = json.loads(proc.stdout)
    print(f"wall: {wall:.0f} s ({wall / 60:.1f} min), load after: {os.getloadavg()}")
    for r in out["variants"]:
        p = "-" if r["p_adj"] is None else f"{r['p_adj']:.2g}"
        print(
            f"  {r['ffn']:<8} loss {r['mean']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]  "
            f"delta {r['delta']:+.4f} [{r['delta_ci_low']:+.4f}, {r['delta_ci_high']:+.4f}]  p_adj {p}  "
            f"{r['tokens_per_s']:,.0f} tok/s"
        )
    print("verdict:", out["verdict"])


if __name__ == "__main__":
    main(sys.argv[1:])
