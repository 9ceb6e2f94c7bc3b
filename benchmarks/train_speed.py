"""Training speed of `ffnlab.run.train` on this CPU: nanoGPT's Shakespeare-char CPU recipe in fp32 eager
(the reference) against faster configurations of the same run, timed in turns in one process.

    python benchmarks/train_speed.py                     # windows, full 2000-step runs, defaults check
    python benchmarks/train_speed.py --repeats 3 --window 100 --skip full,defaults   # a quick look

The recipe (nanoGPT README, CPU): char-level tiny Shakespeare, 4 layers, 4 heads, d_model 128,
context 64, batch 12, 2000 iterations, dropout 0, dense GELU FFN 4x with biases, learned positions,
pre-norm LayerNorm, tied embeddings, AdamW lr 1e-3 -> 1e-4 (cosine), warm-up 100, beta2 0.99,
weight decay 0.1, clip 1.0.

Windows: each candidate is the recipe with a few fields changed (CANDIDATES). One window is one
`train()` call of `--window` steps; its tokens/s is tokens per step over the run's median step time,
so evaluation and the first step (which holds torch.compile's compile time, reported on its own) are
left out. Windows run in turns (every candidate's repeat 1, then every repeat 2, ...) so a burst of
load from other processes falls on all of them alike; each candidate's ratio to the reference is the
median over repeats of its tokens/s over the reference's in the same repeat. Every window records the
1-minute load average and the cores the process got (CPU seconds per wall second), because on a
shared 2-core machine those decide the numbers more than anything in the code.

Full runs: the reference and `--fast` for the whole 2000 steps, validation loss on `--eval-batches`
fixed batches of the val split (ffnlab splits a local .txt 90/5/5 by position; nanoGPT 90/10).
Defaults check: `ffnlab train --steps 200` as the CLI runs it (TrainConfig defaults, bundled corpus).
`--competitor` runs the windows next to another 2-thread fp32 training process, as when another
job shares the machine (start it under OMP_WAIT_POLICY=PASSIVE to see what libgomp's spinning costs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch

from ffnlab._util.machine import (
    cpu_has_amx,
    environment,
)
from ffnlab.core.model import ModelConfig
from ffnlab.run.profile import profile_training
from ffnlab.run.train import TrainConfig, train

# the team's copy of nanoGPT's corpus, beside the repository (../shared/data); FFNLAB_BENCH_DATA overrides it
DATA = os.environ.get(
    "FFNLAB_BENCH_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt")
)
RECIPE = TrainConfig(
    model=ModelConfig(context=64, n_layers=4, n_heads=4, d_model=128, ffn="gelu", dropout=0.0),
    data=DATA,
    batch_size=12,
    max_steps=2000,
    lr=1e-3,
    min_lr=1e-4,
    warmup_steps=100,
    beta2=0.99,
    weight_decay=0.1,
    grad_clip=1.0,
    eval_every=250,
    eval_batches=100,
    threads=2,
    precision="fp32",
)
REFERENCE = "fp32 eager"  # the recipe as nanoGPT runs it: fp32, no compile, torch's two threads here
CANDIDATES = {
    REFERENCE: {},
    "fp32 eager 1 thread": {"threads": 1},
    "bf16 eager": {"precision": "bf16"},
    "bf16 eager 1 thread": {"precision": "bf16", "threads": 1},
    "fp32 compile": {"compile": True},
    "bf16 compile": {"precision": "bf16", "compile": True},
    "bf16 compile 1 thread": {"precision": "bf16", "compile": True, "threads": 1},
}
DEFAULT_THREADS = torch.get_num_threads()  # what a fresh `ffnlab train` process gets
PUBLISHED = {
    "nanoGPT README (CPU recipe)": "val loss 1.88 in about 3 minutes",
    "issue, this machine class": "about 21,000 tokens/s, val loss 1.874 after 2000 iterations",
}


def machine() -> dict:
    """CPU model, cores, AMX, library versions and thread settings: what the numbers depend on."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = None
    return {
        "cpu": environment()["cpu"],
        "cores": os.cpu_count(),
        "amx_bf16": cpu_has_amx(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_AFFINITY", "OMP_PROC_BIND", "TORCHINDUCTOR_CACHE_DIR")
            if k in os.environ
        },
        "commit": commit,
    }


def start_competitor() -> subprocess.Popen:
    """Another process training the recipe in fp32 on two threads until killed (or for 30 minutes): a
    neighbour's job, with OpenMP's default waiting policy whatever this process was started with."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from dataclasses import replace; "
        "from train_speed import RECIPE; from ffnlab.run.train import train; "
        "train(replace(RECIPE, max_steps=10**9, max_seconds=1800, eval_every=10**9, eval_batches=1, threads=2))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.Popen(
        [sys.executable, "-c", code, str(Path(__file__).parent)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def window(cfg: TrainConfig) -> dict:
    """One timed `train()` call: tokens/s of the median step, first-step seconds, load and cores used."""
    load0, wall0, cpu0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    r = train(cfg).to_dict()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "tokens_per_s": r["tokens_per_s"],
        "first_step_s": r["first_step_s"],
        "step_time_s": r["step_time_s"],
        "load": round((load0 + os.getloadavg()[0]) / 2, 2),
        "cores_used": round(cpu / wall, 2),
        "val_loss": r["final_val_loss"],
    }


def time_windows(names: list[str], repeats: int, steps: int, log) -> dict[str, list[dict]]:
    """Every candidate's windows, run in turns; the first repeat is a warm-up round and is not kept
    (it holds one-off costs: data loading, compiling)."""
    out = {name: [] for name in names}
    for rep in range(repeats + 1):
        for name in names:
            cfg = replace(RECIPE, max_steps=steps, eval_every=steps, eval_batches=2, **CANDIDATES[name])
            w = window(cfg)
            log(
                f"repeat {rep}{' (warm-up)' if rep == 0 else ''} {name:22s} {w['tokens_per_s']:8.0f} tokens/s  "
                f"first step {w['first_step_s']:6.2f} s  load {w['load']:.2f}  cores used {w['cores_used']:.2f}"
            )
            if rep == 0:
                out[name + " (warm-up)"] = [w]
            else:
                out[name].append(w)
    return out


def summarize(windows: dict[str, list[dict]], names: list[str]) -> list[dict]:
    """Median and best tokens/s per candidate, and the median over repeats of its ratio to the reference."""
    ref = [w["tokens_per_s"] for w in windows[REFERENCE]]
    rows = []
    for name in names:
        tps = [w["tokens_per_s"] for w in windows[name]]
        rows.append(
            {
                "name": name,
                "tokens_per_s": statistics.median(tps),
                "best_tokens_per_s": max(tps),
                "ratio": statistics.median(t / r for t, r in zip(tps, ref)),
                "first_step_s": windows[name + " (warm-up)"][0]["first_step_s"],
                "load": statistics.median(w["load"] for w in windows[name]),
                "cores_used": statistics.median(w["cores_used"] for w in windows[name]),
            }
        )
    return rows


def full_run(name: str, log, seed: int = 0) -> dict:
    """The whole 2000-step recipe for one candidate: val loss, median-step and end-to-end tokens/s."""
    torch._dynamo.reset()  # compile again, as a fresh `ffnlab train` would (the on-disk cache stays warm)
    load0, cpu0, wall0 = os.getloadavg()[0], time.process_time(), time.perf_counter()
    r = train(replace(RECIPE, seed=seed, **CANDIDATES[name])).to_dict()
    wall = time.perf_counter() - wall0
    row = {
        "name": name,
        "seed": seed,
        "status": r["status"],
        "val_loss": r["final_val_loss"],
        "val_loss_step0": r["history"]["val"][0]["loss"],
        "tokens_per_s": r["tokens_per_s"],
        "end_to_end_tokens_per_s": r["tokens"] / r["train_seconds"],
        "train_seconds": r["train_seconds"],
        "first_step_s": r["first_step_s"],
        "load": round((load0 + os.getloadavg()[0]) / 2, 2),
        "cores_used": round((time.process_time() - cpu0) / wall, 2),
    }
    log(
        f"full run {name}: val loss {row['val_loss']:.4f}, {row['tokens_per_s']:.0f} tokens/s (median step), "
        f"{row['end_to_end_tokens_per_s']:.0f} end to end, {row['train_seconds']:.1f} s, load {row['load']}"
    )
    return row


def defaults_check(log) -> list[dict]:
    """`ffnlab train --steps 200` with every default (bundled corpus; precision auto, which is bf16 on an
    AMX CPU), and the same in fp32, compiled and with one thread: seconds and val loss at steps 0 and 200."""
    rows = []
    for label, overrides in (
        ("defaults (auto precision)", {}),
        ("defaults, fp32", {"precision": "fp32"}),
        ("defaults, compile", {"compile": True}),
        ("defaults, 1 thread", {"threads": 1}),
        ("defaults, fp32, 1 thread", {"precision": "fp32", "threads": 1}),
    ):
        torch.set_num_threads(DEFAULT_THREADS)
        load0, wall0 = os.getloadavg()[0], time.perf_counter()
        r = train(replace(TrainConfig(max_steps=200), **overrides)).to_dict()
        val = r["history"]["val"]
        rows.append(
            {
                "name": label,
                "wall_seconds": time.perf_counter() - wall0,
                "train_seconds": r["train_seconds"],
                "tokens_per_s": r["tokens_per_s"],
                "val_loss_step0": val[0]["loss"],
                "val_loss": val[-1]["loss"],
                "load": round((load0 + os.getloadavg()[0]) / 2, 2),
            }
        )
        log(f"{label}: {rows[-1]['wall_seconds']:.1f} s, val loss {val[0]['loss']:.3f} -> {val[-1]['loss']:.3f}")
    return rows


def attention_times(repeats: int = 7, calls: int = 20) -> list[dict]:
    """Milliseconds of one attention forward+backward at the recipe's shape (B 12, 4 heads, T 64, head 32)
    per dtype and SDPA backend, and of `ffnlab.core.model.attend` (which runs bf16 in fp32 on the CPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ffnlab.core.model import attend

    def run(dtype, backend):
        q, k, v = (torch.randn(12, 4, 64, 32, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(12, 4, 64, 32, dtype=dtype)

        def once():
            if backend == "attend":
                out = attend(q, k, v, causal=True)
            else:
                with sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)

        return once

    fns = {
        (str(dtype)[6:], name): run(dtype, backend)
        for dtype in (torch.float32, torch.bfloat16)
        for name, backend in (
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("math", SDPBackend.MATH),
            ("ffnlab attend", "attend"),
        )
    }
    times = {key: [] for key in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[key].append((time.perf_counter() - start) / calls * 1e3)
    return [
        {"dtype": d, "backend": b, "ms": statistics.median(t), "threads": torch.get_num_threads()}
        for (d, b), t in times.items()
    ]


def profile_breakdown(name: str, steps: int = 40, warm: int = 5) -> dict:
    """Where a step of one candidate goes, by ffnlab's own profiler (`ffnlab train --profile`,
    `ffnlab.run.profile`): on one thread (a neighbour's job can stretch two threads many times over, see
    --competitor), over `steps` steps after `warm` (compile and warm-up left out); its kinds of work (matmul,
    attention, compiled kernels, elementwise, dispatch) are the work a faster step would have to cut."""
    torch._dynamo.reset()
    cfg = replace(RECIPE, eval_every=10**6, eval_batches=1, **{**CANDIDATES[name], "threads": 1})
    return profile_training(cfg, steps=steps, warmup=warm).to_json()


def markdown(result: dict) -> str:
    """The tables of a result, as Markdown."""
    lines = [
        f"command: `{result['command']}`",
        "",
        f"machine: `{json.dumps(result['machine'])}`",
        "",
        f"uptime at start: `{result['uptime_start']}`; at end: `{result['uptime_end']}`",
        "",
    ]
    if result.get("windows"):
        lines += [
            "| configuration | tokens/s (median) | best | x reference (median of paired ratios) | "
            "first step s (compile) | load | cores used |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in result["windows"]:
            lines.append(
                f"| {r['name']} | {r['tokens_per_s']:,.0f} | {r['best_tokens_per_s']:,.0f} | "
                f"{r['ratio']:.2f} | {r['first_step_s']:.1f} | {r['load']:.2f} | {r['cores_used']:.2f} |"
            )
        lines.append("")
    if result.get("full"):
        lines += [
            "| full 2000-step run | val loss | tokens/s (median step) | tokens/s end to end | train s | "
            "first step s | load | cores used |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in result["full"]:
            lines.append(
                f"| {r['name']} (seed {r['seed']}) | {r['val_loss']:.4f} | {r['tokens_per_s']:,.0f} | "
                f"{r['end_to_end_tokens_per_s']:,.0f} | {r['train_seconds']:.1f} | {r['first_step_s']:.1f} | "
                f"{r['load']:.2f} | {r['cores_used']:.2f} |"
            )
        for name, text in PUBLISHED.items():
            lines.append(f"| {name} | {text} | | | | | | |")
        lines.append("")
    if result.get("attention"):
        lines += ["| attention fwd+bwd, (12, 4, 64, 32) | fp32 ms | bf16 ms |", "|---|---|---|"]
        for backend in ("flash", "math", "ffnlab attend"):
            ms = {r["dtype"]: r["ms"] for r in result["attention"] if r["backend"] == backend}
            lines.append(f"| {backend} | {ms['float32']:.2f} | {ms['bfloat16']:.2f} |")
        lines.append("")
    if result.get("profile"):
        profiles = result["profile"]
        lines += [
            "| `train --profile`, 1 thread: ms per step (own time by kind of work) | " + " | ".join(profiles) + " |",
            "|---|" + "---|" * len(profiles),
        ]
        for i, kind in enumerate(next(iter(profiles.values()))["kinds"]):
            lines.append(
                f"| {kind['name']} | " + " | ".join(f"{p['kinds'][i]['ms']:.1f}" for p in profiles.values()) + " |"
            )
        lines.append(
            "| step (the three phases) | " + " | ".join(f"{p['step_ms']:.1f}" for p in profiles.values()) + " |"
        )
        for name, p in profiles.items():
            top = "; ".join(f"{o['name'][:32]} {o['ms']:.2f}" for o in p["operators"][:6])
            lines.append(f"| {name}: top operators | {top} |" + " |" * (len(profiles) - 1))
        lines.append("")
    if result.get("defaults"):
        lines += [
            "| `ffnlab train --steps 200` | wall s | train s | tokens/s | val loss step 0 -> 200 | load |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["defaults"]:
            lines.append(
                f"| {r['name']} | {r['wall_seconds']:.1f} | {r['train_seconds']:.1f} | {r['tokens_per_s']:,.0f} | "
                f"{r['val_loss_step0']:.3f} -> {r['val_loss']:.3f} | {r['load']:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated names from CANDIDATES")
    p.add_argument("--repeats", type=int, default=5, help="timing windows per candidate (after a warm-up round)")
    p.add_argument("--window", type=int, default=200, help="steps per timing window")
    p.add_argument("--fast", default="bf16 compile", help="comma-separated candidates given a full 2000-step run")
    p.add_argument("--seeds", type=int, default=1, help="full runs per configuration")
    p.add_argument(
        "--skip", default="", help="comma-separated parts to skip: attention, windows, profile, full, defaults"
    )
    p.add_argument("--competitor", action="store_true", help="time the windows next to another training process")
    p.add_argument("--json", help="also write the whole result here")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    fast = [n.strip() for n in args.fast.split(",") if n.strip()]
    unknown = [n for n in names + fast if n not in CANDIDATES]
    if unknown:
        p.error(f"unknown candidate {unknown[0]!r}; valid: {', '.join(CANDIDATES)}")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)
    skip = set(args.skip.split(","))
    log = lambda text: print(text, file=sys.stderr, flush=True)
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    print(
        f"command: {result['command']}\nmachine: {json.dumps(result['machine'])}\nuptime: {result['uptime_start']}",
        flush=True,
    )
    if "attention" not in skip:
        torch.set_num_threads(DEFAULT_THREADS)
        result["attention"] = attention_times()
    if "windows" not in skip:
        competitor = start_competitor() if args.competitor else None
        try:
            windows = time_windows(names, args.repeats, args.window, log)
        finally:
            if competitor is not None:
                competitor.kill()
                competitor.wait()
        result["windows"] = summarize(windows, names)
        result["raw_windows"] = windows
    if "profile" not in skip:
        result["profile"] = {name: profile_breakdown(name) for name in [REFERENCE, *fast]}
    if "full" not in skip:
        result["full"] = [full_run(name, log, seed) for seed in range(args.seeds) for name in [REFERENCE, *fast]]
    if "defaults" not in skip:
        result["defaults"] = defaults_check(log)
    result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(markdown(result))
    print(f"uptime: {result['uptime_end']}")
    if args.json:
        tmp = f"{args.json}.tmp"
        Path(tmp).write_text(json.dumps(result, indent=1))
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
