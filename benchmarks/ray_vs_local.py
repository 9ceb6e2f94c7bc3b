"""Ray against local --jobs: the same small study run three ways, each into a fresh store.

    python benchmarks/ray_vs_local.py [--repeats 2] [--preset quick] [--variants relu,swiglu] [--seeds 3]

Runs `ffnlab compare` as a user would (a subprocess, `--json --no-report`) with `--jobs 1`, `--jobs 2`
and `--backend ray` (a local Ray cluster that ffnlab starts with `ray.init()`), in turns when
repeated, and prints the command, the machine, the date and one JSON result:

- wall_s: the whole command, Python start to exit (median over the repeats);
- fixed_s: what the command costs with no run to train (the same command again on a finished store:
  Python and torch imports, planning, the summary), paid by every backend alike;
- parallelism: runs trained at once (1; 2 workers; Ray one task per CPU of the local cluster, 2 here);
- overhead_per_run_s = (wall_s - runs_wall_s / parallelism) / n_runs, where runs_wall_s is the sum
  of the runs' own `wall_seconds` from the store (setup, training, final evaluation): everything the
  backend adds, fixed_s and Ray's start-up included, spread over the runs (the runs' times are
  those of the last round);
- ray_start_s: `import ray`, `ray.init(...)` as `run_on_ray` calls it, a first one-CPU task, and
  `ray.shutdown()`, timed in a process of their own.

Every run's final validation and test losses must be bitwise equal across the backends (each run
trains on one thread in a sweep); the script exits 1 when they are not.
A benchmark, not a test: the times depend on the machine and on what else runs on it.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from compare_default import machine

from ffnlab.study.store import Store

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"jobs 1": ["--jobs", "1"], "jobs 2": ["--jobs", "2"], "ray": ["--backend", "ray"]}
RAY_START = """
import json, os, time
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
ray.init(include_dashboard=False, log_to_driver=False, num_cpus=os.cpu_count())  # as run_on_ray
t2 = time.perf_counter()
ray.get(ray.remote(num_cpus=1)(lambda: 1).remote())
t3 = time.perf_counter()
ray.shutdown()
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "init": t2 - t1, "first_task": t3 - t2, "shutdown": t4 - t3}))
"""


def env() -> dict:
    """This checkout's ffnlab first on the path, for the command and for the Ray workers it starts."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def compare(study_flags: list[str], store: Path, backend_flags: list[str]) -> float:
    """Wall seconds of one `ffnlab compare` into `store`; exits with its stderr if it fails."""
    cmd = [sys.executable, "-m", "ffnlab.cli", "compare", *study_flags, *backend_flags]
    cmd += ["--store", str(store), "--json", "--no-report"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env())
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[1:])} failed:\n{proc.stderr}")
    return wall


def stored_runs(store: Path) -> dict[tuple[str, int], dict]:
    """(ffn, seed) -> the run's final losses and times, from the store."""
    with Store(store, create=False) as s:
        runs = s.runs()
    keys = ("final_val_loss", "final_test_loss", "train_seconds", "wall_seconds")
    return {(r.config["model"]["ffn"], r.config["seed"]): {k: getattr(r.result, k) for k in keys} for r in runs}


def ray_start() -> dict:
    proc = subprocess.run([sys.executable, "-c", RAY_START], capture_output=True, text=True, env=env())
    if proc.returncode:
        sys.exit(f"ray start-up failed:\n{proc.stderr}")
    return {k: round(v, 2) for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the three backends, in turns")
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--variants", default="relu,swiglu")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the stores (printed as 'stores')")
    args = parser.parse_args()
    study_flags = ["--preset", args.preset, "--variants", args.variants, "--seeds", str(args.seeds)]
    print("command: python benchmarks/ray_vs_local.py " + " ".join(sys.argv[1:]))
    print("compare: ffnlab compare " + " ".join(study_flags) + " {--jobs 1 | --jobs 2 | --backend ray}")
    print("machine:", json.dumps(machine()))
    print("date:", datetime.date.today().isoformat())

    folder = Path(tempfile.mkdtemp(prefix="ffnlab-ray-vs-local-"))
    walls = {name: [] for name in BACKENDS}
    runs = {}  # backend -> (ffn, seed) -> losses and times, from its last repeat
    t_all = time.perf_counter()
    for rep in range(args.repeats):
        for name, flags in BACKENDS.items():
            store = folder / f"{name.replace(' ', '')}-{rep}" / "ffnlab.db"
            walls[name].append(compare(study_flags, store, flags))
            runs[name] = stored_runs(store)
            print(f"  round {rep + 1} {name}: {walls[name][-1]:.1f} s", file=sys.stderr)
    fixed = compare(study_flags, folder / "jobs1-0" / "ffnlab.db", BACKENDS["jobs 1"])  # every run skipped
    start = ray_start()

    reference = runs["jobs 1"]
    n_runs = len(reference)
    identical = all(set(r) == set(reference) for r in runs.values())
    max_diff = 0.0
    for r in runs.values():
        for key in reference.keys() & r.keys():
            for loss in ("final_val_loss", "final_test_loss"):
                identical &= r[key][loss] == reference[key][loss]
                max_diff = max(max_diff, abs(r[key][loss] - reference[key][loss]))
    backends = {}
    for name, r in runs.items():
        parallelism = 1 if name == "jobs 1" else min(2 if name == "jobs 2" else os.cpu_count(), n_runs)
        wall = statistics.median(walls[name])
        runs_wall = sum(v["wall_seconds"] for v in r.values())
        backends[name] = {
            "wall_s": round(wall, 2),
            "walls_s": [round(w, 2) for w in walls[name]],
            "parallelism": parallelism,
            "runs_wall_s": round(runs_wall, 2),
            "runs_train_s": round(sum(v["train_seconds"] for v in r.values()), 2),
            "overhead_per_run_s": round((wall - runs_wall / parallelism) / n_runs, 2),
        }
    result = {
        "n_runs": n_runs,
        "backends": backends,
        "fixed_s": round(fixed, 2),
        "ray_start_s": start,
        "identical": identical,
        "max_abs_diff": max_diff,
        "final_val_loss": {f"{ffn} seed {seed}": v["final_val_loss"] for (ffn, seed), v in sorted(reference.items())},
        "total_s": round(time.perf_counter() - t_all, 1),
        "load_after": os.getloadavg(),
        "stores": str(folder) if args.keep else None,
    }
    print(json.dumps(result, indent=1))
    if not args.keep:
        shutil.rmtree(folder)
    if not identical:
        sys.exit("results differ between the backends")


if __name__ == "__main__":
    main()
