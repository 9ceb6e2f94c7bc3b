"""The edge anecdote as a claim check: GELU -> ReLU is faster at inference at a quality cost, and a quantised GELU
recovers the speed (issue #25: "about 20% faster inference but 3-5 F1 points lost; a quantised GELU won").

    python benchmarks/deploy_tradeoff.py [--store S] [--size issue|default] [--steps 200] [--seeds 3]
                                         [--qat-from 0.8] [--threads N] [--runtimes eager,compile,onnxruntime]
                                         [--smoke] [--json]

Trains gelu and relu on the same seeds (and gelu with quantisation-aware training over its last 20%) at the
issue's size, d_model 512, 6 layers, context 256 (or takes the runs of --store), then measures every
variant x precision x runtime with ffnlab.study.deployment: cost on batch 1 and a throughput batch, quality on
the study's fixed validation batches paired over seeds. It prints the command, the machine and its class, the
library versions, the table, and the verdicts:

  1. relu is faster than gelu at fp32 (throughput ratio, per runtime; within 5% is "within noise")
  2. relu costs quality (its validation loss minus gelu's, paired over seeds, with the CI)
  3. a quantised gelu recovers the speed: its fastest int8 row at least as fast as fp32 relu in the same
     runtime, at a lower validation loss than relu's

and the issue's performance targets: int8 over fp32 eager throughput (>= 2x on a CPU with VNNI or AMX-int8,
at <= 0.02 nats for the best PTQ row), QAT recovering at least half of PTQ's increase where PTQ loses more
than 0.02, and the fastest runtime at batch 1 with its distance from the roofline (weights read once at
the copy bandwidth). Training at the default size takes hours on a 2-core CPU; --smoke checks the plumbing
on a tiny model in a minute or two. A benchmark, not a test: timings depend on the machine and its load.
"""

import argparse
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from compare_default import machine

from ffnlab._util.jsonio import strict_dumps
from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.study.deployment import deploy_store, save_deployment
from ffnlab.study.execute import execute
from ffnlab.study.stats import paired_diff
from ffnlab.tools.deploy import DeployResult, DeployRow, format_deploy

SIZES = {
    "issue": ModelConfig(d_model=512, n_layers=6, n_heads=8, context=256),  # the model
    "default": ModelConfig(),  # ffnlab's default model (d_model 128, 4 layers, context 128): trains to
    # convergence on the plays in minutes, where int8 may cost more than on an early model
    "smoke": ModelConfig(d_model=64, n_layers=2, n_heads=4, context=32),
}
NOISE = 0.05  # speed ratios within 5% of 1 are "within noise" on a shared machine
QUALITY_BUDGET = 0.02  # nats: the bound on the best PTQ row's validation-loss increase


def train_store(folder: Path, model: ModelConfig, steps: int, seeds: int, qat_from: float | None, threads: int) -> Path:
    """gelu and relu on seeds 0..seeds-1 (and gelu with qat_from) trained into a store in `folder`, one run after
    another on `threads` threads."""
    store = folder / "store.db"
    base = TrainConfig(model=model, max_steps=steps, eval_every=max(1, steps // 4), threads=threads)
    runs = [replace(base, model=replace(model, ffn=f), seed=s) for f in ("gelu", "relu") for s in range(seeds)]
    if qat_from is not None:
        runs += [replace(base, model=replace(model, ffn="gelu"), seed=s, qat_from=qat_from) for s in range(seeds)]
    for i, cfg in enumerate(runs):
        started = time.perf_counter()
        status = execute(cfg.to_dict(), str(store))
        qat = f" qat_from {cfg.qat_from}" if cfg.qat_from is not None else ""
        print(f"trained {i + 1}/{len(runs)}: {cfg.model.ffn} seed {cfg.seed}{qat}: {status} "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)  # fmt: skip
    return store


def row(result: DeployResult, ffn: str, precision: str, runtime: str) -> list[DeployRow]:
    """The measured plain-run rows of one variant, precision and runtime."""
    return [
        r
        for r in result.rows
        if (r.ffn, r.precision, r.runtime, r.qat_from, r.reason) == (ffn, precision, runtime, None, None)
    ]


def speed_verdict(ratio: float) -> str:
    return "holds" if ratio > 1 + NOISE else "does not hold" if ratio < 1 - NOISE else "within noise"


def claim_faster(result: DeployResult) -> dict:
    """1. relu's fp32 throughput and batch-1 latency against gelu's, per runtime."""
    out = {}
    for runtime in dict.fromkeys(r.runtime for r in result.rows):
        relu, gelu = row(result, "relu", "fp32", runtime), row(result, "gelu", "fp32", runtime)
        if relu and gelu:
            ratio = relu[0].throughput.tokens_per_s / gelu[0].throughput.tokens_per_s
            out[runtime] = {"throughput_relu_over_gelu": ratio,
                            "latency_gelu_over_relu": gelu[0].latency.median_s / relu[0].latency.median_s,
                            "verdict": speed_verdict(ratio)}  # fmt: skip
    return out


def claim_quality_cost(result: DeployResult) -> dict:
    """2. relu's fp32 validation loss minus gelu's, paired over seeds."""
    relu, gelu = row(result, "relu", "fp32", "eager"), row(result, "gelu", "fp32", "eager")
    if not (relu and gelu and relu[0].quality and gelu[0].quality):
        return {"verdict": "not measurable here"}
    d = paired_diff(relu[0].quality.val_losses, gelu[0].quality.val_losses)
    if d.ci_low is None or d.ci_high is None:
        verdict = "not measurable here (one seed)"
    else:
        verdict = "holds" if d.ci_low > 0 else "does not hold" if d.ci_high < 0 else "not separated by these seeds"
    return {**d.to_json(), "verdict": verdict}


def claim_quantised_gelu(result: DeployResult) -> dict:
    """3. gelu's fastest int8 row against fp32 relu in the same runtime: at least as fast, and a lower loss."""
    out = {}
    for runtime in dict.fromkeys(r.runtime for r in result.rows):
        relu = row(result, "relu", "fp32", runtime)
        int8 = [r for r in row(result, "gelu", "int8", runtime) if r.quality]
        if not (relu and relu[0].quality and int8):
            continue
        best = max(int8, key=lambda r: r.throughput.tokens_per_s)
        speed = best.throughput.tokens_per_s / relu[0].throughput.tokens_per_s
        better = best.quality.val_loss < relu[0].quality.val_loss
        out[runtime] = {"scheme": best.scheme, "throughput_over_fp32_relu": speed,
                        "val_loss_int8_gelu": best.quality.val_loss, "val_loss_fp32_relu": relu[0].quality.val_loss,
                        "verdict": "holds" if speed >= 1 - NOISE and better else "does not hold"}  # fmt: skip
    return out


def performance_targets(result: DeployResult) -> dict:
    """The issue's performance targets, per variant."""
    out = {"int8_speedup": {}, "qat": [asdict(q) for q in result.qat], "batch1": {}}
    for ffn in ("gelu", "relu"):
        fp32 = row(result, ffn, "fp32", "eager")
        int8 = [
            r for r in result.rows if r.ffn == ffn and r.precision == "int8" and r.qat_from is None and r.reason is None
        ]
        if fp32 and int8:
            ok = [r for r in int8 if r.quality and r.quality.val_loss_delta.delta is not None]
            best = max(int8, key=lambda r: r.throughput.tokens_per_s)
            best_ptq = min(ok, key=lambda r: r.quality.val_loss_delta.delta) if ok else None
            out["int8_speedup"][ffn] = {
                "fastest": f"{best.runtime}/{best.scheme}",
                "throughput_over_fp32_eager": best.throughput.tokens_per_s / fp32[0].throughput.tokens_per_s,
                "best_ptq": best_ptq and f"{best_ptq.runtime}/{best_ptq.scheme}",
                "best_ptq_val_loss_increase": best_ptq and best_ptq.quality.val_loss_delta.delta,
                "within_budget": best_ptq is not None and best_ptq.quality.val_loss_delta.delta <= QUALITY_BUDGET,
            }
        measured = [r for r in result.rows if r.ffn == ffn and r.qat_from is None and r.latency]
        if measured:
            fastest = min(measured, key=lambda r: r.latency.median_s)
            out["batch1"][ffn] = {"fastest": fastest.target.label(), "latency_ms": fastest.latency.median_s * 1e3,
                                  "over_roofline": fastest.roofline_s and fastest.latency.median_s / fastest.roofline_s}  # fmt: skip
    return out


def verdict_lines(report: dict) -> list[str]:
    lines = ["", "Claim check (the edge anecdote)"]
    for runtime, c in report["claims"]["1_relu_faster"].items():
        lines.append(f"1. relu faster than gelu, fp32 {runtime}: throughput x{c['throughput_relu_over_gelu']:.3f}, "
                     f"batch-1 x{c['latency_gelu_over_relu']:.3f} -> {c['verdict'].upper()}")  # fmt: skip
    q = report["claims"]["2_relu_costs_quality"]
    delta = (
        f"relu - gelu val loss {q['delta']:+.4f} [{q['ci_low']:+.4f}, {q['ci_high']:+.4f}] "
        if q.get("ci_low") is not None
        else ""
    )
    lines.append(f"2. relu costs quality: {delta}-> {q['verdict'].upper()}")
    for runtime, c in report["claims"]["3_quantised_gelu_recovers"].items():
        lines.append(f"3. int8 gelu ({c['scheme']}, {runtime}) vs fp32 relu: throughput x{c['throughput_over_fp32_relu']:.3f}, "
                     f"val loss {c['val_loss_int8_gelu']:.4f} vs {c['val_loss_fp32_relu']:.4f} -> {c['verdict'].upper()}")  # fmt: skip
    lines += ["", "Performance targets (issue #25)"]
    for ffn, t in report["targets"]["int8_speedup"].items():
        lines.append(f"int8 {ffn}: fastest {t['fastest']} x{t['throughput_over_fp32_eager']:.2f} fp32 eager throughput "
                     f"(target >= 2x with VNNI/AMX-int8); best PTQ {t['best_ptq']} "
                     f"{t['best_ptq_val_loss_increase']:+.4f} nats (target <= {QUALITY_BUDGET})")  # fmt: skip
    for q in report["targets"]["qat"]:
        lines.append(
            f"QAT {q['ffn']}: {q['summary']} (target: half of PTQ's increase where it exceeds {QUALITY_BUDGET})"
        )
    for ffn, b in report["targets"]["batch1"].items():
        roof = f", {b['over_roofline']:.3g}x the roofline" if b["over_roofline"] else ""
        lines.append(f"batch 1 {ffn}: fastest {b['fastest']} at {b['latency_ms']:.3g} ms{roof}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="a store of trained gelu and relu runs (one setting) instead of training")
    parser.add_argument(
        "--size",
        choices=["issue", "default"],
        default="issue",
        help="the model trained: "
        + "; ".join(
            f"{k}: d_model {m.d_model}, {m.n_layers} layers, context {m.context}"
            for k, m in SIZES.items()
            if k != "smoke"
        ),
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--qat-from", type=float, default=0.8, help="also train gelu with QAT from this fraction; -1: no QAT runs"
    )
    parser.add_argument("--threads", type=int, default=None, help="threads for the timings (default: torch's count)")
    parser.add_argument(
        "--train-threads", type=int, default=1, help="threads each training run uses (runs are sequential)"
    )
    parser.add_argument("--runtimes", default="eager,compile,onnxruntime")
    parser.add_argument("--precisions", default=None, help="default: fp32, bf16 where the hardware has it, int8")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, few steps and repeats: checks the plumbing")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--keep", type=Path, default=None, help="train into this folder and keep it (the store, ONNX files)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.seeds, args.repeats, args.batch = 20, 2, 3, 4
        args.runtimes = "eager,onnxruntime" if args.runtimes == parser.get_default("runtimes") else args.runtimes
        args.precisions = args.precisions or "fp32,int8"
        args.qat_from = 0.5 if args.qat_from == parser.get_default("qat_from") else args.qat_from
    model = SIZES["smoke" if args.smoke else args.size]
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ffnlab-tradeoff-")))
        folder.mkdir(parents=True, exist_ok=True)
        store = args.store or train_store(
            folder,
            model,
            args.steps,
            args.seeds,
            None if args.qat_from < 0 else args.qat_from,
            args.train_threads,
        )
        result = deploy_store(store, precisions=args.precisions, runtimes=args.runtimes, batch=args.batch,
                              repeats=args.repeats, threads=args.threads, workdir=folder / "onnx",
                              log=lambda line: print(f"deploy: {line}", file=sys.stderr, flush=True))  # fmt: skip
        if args.keep:  # the report's deployment section and advise --store read it
            save_deployment(store, result)
    report = {
        "command": "python benchmarks/deploy_tradeoff.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "model": "the --store's runs" if args.store else f"d_model {model.d_model}, {model.n_layers} layers, context {model.context}, {args.steps} steps, {args.seeds} seeds",
        "claims": {"1_relu_faster": claim_faster(result), "2_relu_costs_quality": claim_quality_cost(result),
                   "3_quantised_gelu_recovers": claim_quantised_gelu(result)},
        "targets": performance_targets(result),
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    if args.json:
        print(strict_dumps({**report, "result": result.to_json()}))
        return
    print("command:", report["command"])
    print("machine:", json.dumps(report["machine"]))
    print("model:", report["model"])
    print(format_deploy(result))
    print("\n".join(verdict_lines(report)))
    print(
        f"({report['seconds']:.0f} s; timings are medians of {args.repeats} calls: compare rows of one run, on a quiet machine)"
    )


if __name__ == "__main__":
    main()
