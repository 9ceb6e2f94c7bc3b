"""The per-machine-class table of benchmarks/README.md (issue #16), every row measured in one command.

    python benchmarks/machine_table.py --nanogpt DIR [--out FILE]    # 30-45 minutes, by machine class
    python benchmarks/machine_table.py --nanogpt DIR --recipe-gap     # and the recipe gap: about 20 more
    python benchmarks/machine_table.py --nanogpt DIR --smoke         # toy sizes: checks the plumbing
    python benchmarks/machine_table.py --nanogpt DIR --pairs 3       # each side-by-side 3 pairs: ~10 min more

Runs, one after another (so no row shares the CPU with another): nanoGPT beside ffnlab on its CPU recipe
in fp32, and again with ffnlab at `auto` precision and `--compile` (each gives two rows: tokens/s at equal
work, the implementation; and time to nanoGPT's quality with equal evaluation, recipe and implementation
together, from ffnlab's search for its shortest schedule); the default study; `ffnlab bench --quick`; the
monitors on and off; with --recipe-gap, what each recipe difference does to the loss at equal steps. Prints
the machine and a Markdown table whose rows give the result, the command and the date, ready to paste
under the machine's class; each script's own output is kept in --out (JSON lines) so every number can be
traced. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from compare_default import machine

HERE = Path(__file__).resolve().parent


def run_logged(cmd: list[str], log) -> tuple[str, float]:
    """(stdout, wall seconds) of cmd, which must succeed; both kept in the log."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    log.write(json.dumps({"command": cmd[1:], "rc": proc.returncode, "wall_s": wall, "stdout": proc.stdout}) + "\n")
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[1:])} failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return proc.stdout, wall


def last_json(text: str) -> dict:
    """The JSON object a benchmark prints last (indented over lines or on one)."""
    start = max(text.rfind("\n{"), -1) + 1
    return json.loads(text[start:])


def nanogpt_rows(stdout: str, label: str) -> list[tuple[str, str]]:
    """The side-by-side's two rows: tokens/s at equal work, and time to nanoGPT's quality."""
    out = last_json(stdout)
    n, f, q = out["runs"]["nanogpt"][0], out["runs"]["ffnlab"][0], out["time_to_quality"]
    pairs = len(out["runs"]["nanogpt"])
    med = {side: {k: statistics.median(r[k] for r in runs) for k in ("tokens_per_s", "ms_per_iter")}
           for side, runs in out["runs"].items()}  # fmt: skip
    speed = (
        f"nanoGPT {med['nanogpt']['tokens_per_s']:,.0f} tokens/s ({med['nanogpt']['ms_per_iter']} ms/iter); ffnlab "
        f"{med['ffnlab']['tokens_per_s']:,.0f} ({med['ffnlab']['ms_per_iter']} ms): "
        f"**{out['ffnlab_over_nanogpt_tokens_per_s']:.2f}x**" + (f" (medians of {pairs} pairs)" if pairs > 1 else "")
    )
    quality = (
        f"nanoGPT {n['steps']} steps, {q['nanogpt']['train_s']:.1f} s, loss {n['loss']:.3f} on ffnlab's fixed batches (its own "
        f"estimate {n['own_loss']:.3f}); ffnlab {f['steps']} steps: {f['loss']:.3f}; "
    )
    if q["ffnlab"] is None:
        quality += f"ffnlab does not reach it within {max(p['steps'] for p in q['probes'])} steps"
    else:
        short = f"{q['ffnlab']['short_at']} do not" if q["ffnlab"]["short_at"] else "the floor bounds it"
        quality += (
            f"ffnlab reaches it in {q['ffnlab']['steps']} steps ({short}), {q['ffnlab']['train_s']:.1f} s: "
            f"**{q['ffnlab_over_nanogpt_time']:.2f}x the time**, {q['ffnlab_over_nanogpt_steps']:.2f}x the steps "
            f"({len(q['probes'])} runs)"
        )
        if fresh := q.get("fresh_process"):
            quality += (
                f"; with a fresh process's compile ({fresh['first_step_s']:.1f} s first step) "
                f"**{fresh['ffnlab_over_nanogpt_time']:.2f}x**"
            )
        if b := q.get("back_to_back"):
            quality += f"; from each pair's median steps, timed back to back: {b['ffnlab_over_nanogpt_time']:.2f}x"
            if len(b["ratios"]) > 1:
                quality += f" (median of {', '.join(f'{r:.2f}' for r in b['ratios'])})"
    return [
        (f"nanoGPT recipe, {label}: tokens/s at equal work (implementation)", speed),
        (f"time to nanoGPT's quality, {label} (recipe and implementation)", quality),
    ]


def recipe_gap_row(stdout: str) -> str:
    """The recipe gap in one cell: both losses at equal steps and what each difference switched does."""
    out = last_json(stdout)
    rows = ", ".join(f"{r['name']} {r['loss'] - out['ffnlab']:+.3f}" for r in out["rows"])
    return (
        f"{out['iters']} steps, equal evaluation: nanoGPT {out['nanogpt']:.3f}, ffnlab {out['ffnlab']:.3f} (their "
        f"own: {out['nanogpt_own']:.3f}, {out['ffnlab_own']:.3f}); ffnlab's loss moved by each switched to "
        f"nanoGPT's: {rows}"
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout outside this repository")
    parser.add_argument("--out", type=Path, default=Path("machine_table.jsonl"), help="each script's output")
    parser.add_argument("--recipe-gap", action="store_true", help="also nanogpt_recipe_gap.py (~10 more runs)")
    parser.add_argument("--smoke", action="store_true", help="toy budgets, to check the plumbing")
    parser.add_argument("--pairs", type=int, default=1, help="nanoGPT/ffnlab pairs per side-by-side (medians)")
    args = parser.parse_args(argv)
    py, date = sys.executable, time.strftime("%Y-%m-%d")
    budget = ["--smoke"] if args.smoke else ["--iters", "2000"]
    nano = [py, str(HERE / "nanogpt_side_by_side.py"), "--nanogpt", str(args.nanogpt), *budget]
    nano += ["--pairs", str(args.pairs)] if args.pairs > 1 else []
    gap = [py, str(HERE / "nanogpt_recipe_gap.py"), "--nanogpt", str(args.nanogpt), *budget]
    study = [py, str(HERE / "compare_default.py"), *(["--preset", "smoke", "--seeds", "2"] if args.smoke else [])]
    pairs = ["--pairs", "1", "--steps", "20"] if args.smoke else ["--pairs", "9"]
    monitors = [py, str(HERE / "monitor_overhead.py"), *pairs, "--precision", "fp32"]
    rows = []
    with args.out.open("w") as log:
        m = machine()
        print("machine:", json.dumps(m), flush=True)
        log.write(json.dumps({"machine": m}) + "\n")
        rows += [(*row, nano) for row in nanogpt_rows(run_logged(nano, log)[0], "fp32 both")]
        fast = [*nano, "--precision", "auto", "--compile"]
        rows += [(*row, fast) for row in nanogpt_rows(run_logged(fast, log)[0], "ffnlab `auto` + `--compile`")]
        if args.recipe_gap:
            rows.append(("recipe gap at equal steps, fp32", recipe_gap_row(run_logged(gap, log)[0]), gap))
        out, wall = run_logged(study, log)
        verdict = re.search(r"^verdict: (.*)$", out, re.M)
        rows.append(("default study", f"{wall:.0f} s ({wall / 60:.1f} min); {verdict[1] if verdict else ''}", study))
        bench = [py, "-m", "ffnlab.cli", "bench", "--quick", "--json"]
        rows.append(("`bench --quick`", f"{run_logged(bench, log)[1]:.1f} s wall", bench))
        over = last_json(run_logged(monitors, log)[0])
        on, off = over["step_ms_monitors_on"], over["step_ms_monitors_off"]
        result = f"{over['overhead_median_of_pairs']} (median of {over['pairs']} on/off pairs; {on} vs {off} ms/step)"
        rows.append(("monitor overhead", result, monitors))
    print(f"\n**{m['cpu']} ({m['class']}), {m['cores']} cores** — `auto` precision is {m['precision']} here.\n")
    print("| row | result | command | date |\n|---|---|---|---|")
    for name, result, cmd in rows:
        command = " ".join(["python" if c == py else c for c in cmd]).replace(str(HERE.parent) + "/", "")
        print(f"| {name} | {result} | `{command}` | {date} |")


if __name__ == "__main__":
    main(sys.argv[1:])
