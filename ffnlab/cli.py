"""Command-line interface: parses arguments and calls library functions, nothing more.

Every user error (bad name, bad size, missing file) ends as one line on stderr and exit code 2;
set FFNLAB_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import threading

from ffnlab._util.files import check_writable, write_atomic
from ffnlab.core.activations import ACTIVATIONS, aliases
from ffnlab.core.ffn import DEFAULT_INIT, FFNS, INITS, build_ffn, ffn_stats


class UsageError(Exception):
    """A mistake in what the user asked for; the CLI prints it as one line and exits 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:  # NOTE: argparse turns '--flag=--' into [] and skips the type check
            if action.option_strings and action.nargs is None and getattr(namespace, action.dest, None) == []:
                self.error(f"argument {action.option_strings[-1]}: expected a value, got '--'")
        return namespace, extras


def jobs_arg(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


# ---- list -------------------------------------------------------------------------------------


def list_rows(d_model: int = 512) -> list[dict]:
    """One row per activation and per FFN variant, with params of the FFN at `d_model`."""
    rows = []
    for name, a in ACTIVATIONS.items():
        rows.append(
            {
                "name": name,
                "kind": "activation",
                "gated": False,
                "aliases": aliases(name),
                "same_as": a.same_as,
                "formula": a.formula,
                "paper": a.paper,
                "flops_per_element": a.flops,
                "learnable": a.learnable,
                "family": a.family,
            }
        )
    for name, spec in FFNS.items():
        stats = ffn_stats(build_ffn(name, d_model))
        rows.append(
            {
                "name": name,
                "kind": "ffn",
                "gated": spec.gated,
                "aliases": aliases(name) if spec.kind == "dense" else [],
                "formula": spec.formula,
                "paper": spec.paper,
                "d_model": d_model,
                "d_ff": stats["d_ff"],
                "params": stats["params"],
                "flops_per_token": stats["flops_per_token"],
            }
        )
    return rows


def cmd_list(args):
    rows = list_rows(args.d_model)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'activation':<18} {'learnable':<9} formula")
    for r in rows:
        if r["kind"] == "activation":
            alias = f"  (= {r['same_as']}, Hugging Face name)" if r["same_as"] else ""
            print(f"{r['name']:<18} {'yes' if r['learnable'] else 'no':<9} {r['formula']}{alias}")
    print(
        f"\n{'ffn':<14} {'gated':<6} {'d_ff':>6} {'params':>10}  formula   (d_model={args.d_model}, "
        "matched to dense 4x params)"
    )
    for r in rows:
        if r["kind"] == "ffn":
            print(
                f"{r['name']:<14} {'yes' if r['gated'] else 'no':<6} {r['d_ff']:>6} {r['params']:>10,}  {r['formula']}"
            )
    print("\nmix:ACT1+ACT2 mixes two dense FFNs at half width each, e.g. mix:gelu+silu")


# ---- train ------------------------------------------------------------------------------------


def add_run_args(p):
    """Flags shared by `train` and `compare`: data, model shape and budget. Their defaults are
    None: a flag the user did not give leaves the base config (or the preset) as it is."""
    from ffnlab.core.model import CHOICES

    p.add_argument("--data", help="bundled corpus (shakespeare), a local path, or a Hugging Face name")
    p.add_argument("--task", choices=CHOICES["task"], help="lm (default) or cls")
    p.add_argument("--tokenizer", choices=("char", "byte", "bpe"), help="default char")
    p.add_argument("--bpe-vocab", type=positive_int)
    p.add_argument("--text-field")
    p.add_argument("--label-field")
    p.add_argument("--layers", type=positive_int)
    p.add_argument("--heads", type=positive_int)
    p.add_argument("--d-model", type=positive_int)
    p.add_argument("--d-ff", type=positive_int, help="hidden width; default: matched by --match")
    p.add_argument("--context", type=positive_int)
    p.add_argument("--dropout", type=float)
    p.add_argument("--norm", choices=CHOICES["norm"])
    p.add_argument("--placement", choices=CHOICES["placement"])
    p.add_argument("--pos", choices=CHOICES["pos"])
    p.add_argument("--match", choices=CHOICES["ffn_match"], help="params (default), flops or none")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--steps", type=positive_int, help="optimizer steps")
    p.add_argument("--max-tokens", type=positive_int, help="token budget (overrides --steps)")
    p.add_argument("--max-seconds", type=float, help="wall-clock budget per run")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--min-lr", type=float, help="end of the cosine decay (default lr/10)")
    p.add_argument(
        "--init",
        choices=INITS,
        help=f"FFN initialisation, one scheme for every variant (default "
        f"{DEFAULT_INIT}); family: the literature's per-activation table (relu he, gelu normal 0.02, "
        "swish lecun_uniform), which makes init differ between variants",
    )
    p.add_argument("--warmup", type=int)
    p.add_argument("--eval-every", type=positive_int)
    p.add_argument(
        "--eval-batches", type=positive_int, help="fixed validation batches per evaluation during training (default 8)"
    )
    p.add_argument(
        "--final-eval-batches",
        type=positive_int,
        help="fixed batches of the final val and test evaluation, the number a comparison ranks by (default 32)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        help="auto (default): bf16 autocast on a CPU with AMX or a GPU with bf16, else fp32",
    )
    p.add_argument("--device", choices=("cpu", "cuda", "auto"))
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads per run (torch.set_num_threads); on a busy machine 1 beats 2 (benchmarks/train_speed.md)",
    )
    p.add_argument(
        "--hf-config",
        help="a Hugging Face config.json: train that architecture (random init) with each FFN variant swapped in",
    )


MODEL_FLAGS = {
    "layers": "n_layers",
    "heads": "n_heads",
    "d_model": "d_model",
    "d_ff": "d_ff",
    "context": "context",
    "dropout": "dropout",
    "norm": "norm",
    "placement": "placement",
    "pos": "pos",
    "match": "ffn_match",
    "task": "task",
    "init": "init",
}
RUN_FLAGS = {
    "data": "data",
    "tokenizer": "tokenizer",
    "bpe_vocab": "bpe_vocab",
    "text_field": "text_field",
    "label_field": "label_field",
    "batch_size": "batch_size",
    "steps": "max_steps",
    "max_tokens": "max_tokens",
    "max_seconds": "max_seconds",
    "lr": "lr",
    "min_lr": "min_lr",
    "warmup": "warmup_steps",
    "eval_every": "eval_every",
    "precision": "precision",
    "device": "device",
    "compile": "compile",
    "threads": "threads",
    "eval_batches": "eval_batches",
    "final_eval_batches": "final_eval_batches",
}


def apply_run_flags(base, args):
    """Copy of the TrainConfig `base` with every run flag the user gave; --max-seconds alone
    lifts the step budget so that time is the only limit."""
    from dataclasses import replace

    given = {k: v for k, v in vars(args).items() if v is not None}
    model = replace(base.model, **{MODEL_FLAGS[k]: v for k, v in given.items() if k in MODEL_FLAGS})
    run = {RUN_FLAGS[k]: v for k, v in given.items() if k in RUN_FLAGS}
    if "max_seconds" in given and "steps" not in given and "max_tokens" not in given:
        run["max_steps"] = 10**9
    if "hf_config" in given:
        from ffnlab.tools.hf import load_hf_config, model_family

        run["hf_config"] = load_hf_config(given["hf_config"])
        model_family(run["hf_config"])  # an unsupported architecture fails here, before any run
    return replace(base, model=model, **run)


def cmd_train(args):
    from dataclasses import replace

    from ffnlab.run.train import TrainConfig, progress_bar, train

    if args.out:
        check_writable(args.out)  # now, not after the training
    cfg = apply_run_flags(TrainConfig(), args)
    cfg = replace(
        cfg,
        seed=args.seed,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        model=replace(cfg.model, ffn=args.ffn),
    )
    show = None if args.quiet or args.json else progress_bar(f"{args.ffn} seed {args.seed}: ")
    result = train(cfg, progress=show)
    if args.out:
        write_atomic(args.out, json.dumps(result.to_dict(), indent=1))
    if args.json:
        print(json.dumps({k: v for k, v in result.to_dict().items() if k not in ("history", "config")}, indent=1))
        return
    print(format_run(result))


def format_run(r) -> str:
    """A finished run in a few lines: loss, what it cost, and what the monitors saw."""
    f = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"
    first = r.history["val"][0] if r.history["val"] else None
    lines = [
        f"{r.ffn}: {r.status} after {r.steps} steps, val loss {f(r.final_val_loss)}"
        + (f" (step {first['step']}: {first['loss']:.4f})" if first else "")
        + f", {r.params:,} params, {r.tokens_per_s or 0:,.0f} tokens/s in {r.precision}, {r.train_seconds:.1f} s"
    ]
    if r.task == "lm":
        lines.append(
            f"  perplexity {f(r.final_val_ppl, 2)}, test loss {f(r.final_test_loss)}, "
            f"with embedding noise {f(r.noisy_val_loss)}"
        )
    else:
        lines.append(
            f"  accuracy {f(r.final_val_acc)}, test {f(r.final_test_acc)}, with embedding noise {f(r.noisy_val_acc)}"
        )
    lines.append(
        f"  memory {r.train_mem_bytes / 2**20:.1f} MiB (params {r.param_bytes / 2**20:.1f}, grads "
        f"{r.grad_bytes / 2**20:.1f}, optimizer {r.optimizer_bytes / 2**20:.1f}, saved for backward "
        f"{r.saved_bytes / 2**20:.1f})"
        + (f", CUDA peak {r.cuda_peak_bytes / 2**20:.1f} MiB" if r.cuda_peak_bytes is not None else "")
    )
    lines.append(
        f"  FFN gradient mean {f(r.ffn_grad_mean, 6)} std {f(r.ffn_grad_std, 6)}, spikes "
        f"{r.n_grad_spikes} gradient / {r.n_loss_spikes} loss, dead units {f(r.dead_frac, 3)}"
    )
    for layer, values in r.learned.items():
        lines.append(f"  learned {layer}: {json.dumps(values)}")
    return "\n".join(lines)


# ---- compare ----------------------------------------------------------------------------------


def csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got '{text}'")
    return items


def int_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"values must be positive, got '{text}'")
    return values


def float_list(text: str) -> list[float]:
    try:
        values = [float(t) for t in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got '{text}'") from None
    if any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"values must be positive, got '{text}'")
    return values


def study_from_args(args):
    """A Study from `compare` flags: the preset first, then every flag the user gave."""
    from ffnlab.run.presets import PRESETS, preset_config
    from ffnlab.study.plan import DEFAULT_SEEDS, DEFAULT_VARIANTS, Study

    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset '{args.preset}'; valid: {', '.join(PRESETS)}")
    base = apply_run_flags(preset_config(args.preset), args)
    axes = {
        a: getattr(args, a)
        for a in (
            "depth",
            "width",
            "placement_axis",
            "norm_axis",
            "task_axis",
            "data_axis",
            "init_axis",
            "lr_axis",
            "warmup_axis",
            "context_axis",
        )
        if getattr(args, a)
    }
    axes = {a.removesuffix("_axis"): v for a, v in axes.items()}
    seeds = DEFAULT_SEEDS if args.seeds is None else args.seeds
    if seeds < 2 and not args.no_stats:
        raise UsageError(
            f"statistics need at least 2 seeds per variant (p-values 3), got --seeds {seeds}; "
            "use --seeds 3 or more, or --no-stats"
        )
    return Study(
        variants=args.variants or list(DEFAULT_VARIANTS),
        seeds=seeds,
        base=base,
        axes=axes,
        baseline=args.baseline,
        noise_floor=args.noise_floor,
    )


def format_table(summary: dict) -> str:
    """The ranked table of each cell of a study (and of the tuned comparison), with the verdict under
    it, then what the comparison held equal."""
    lines = []
    for cell in summary["cells"] + summary.get("tuned", []):
        lines += format_cell(cell, summary["baseline"]) + [""]
    return "\n".join(lines + held_equal_lines(summary["settings"]))


def held_equal_lines(settings: dict) -> list[str]:
    """What the comparison held equal and what not, one item a line."""
    return (
        ["held equal:"]
        + [f"  {what}: {how}" for what, how in settings["held_equal"]]
        + ["not equal:"]
        + [f"  {what}: {why}" for what, why in settings["not_equal"]]
    )


def format_cell(cell: dict, baseline: str) -> list[str]:
    from ffnlab.study.summary import literature_text, p_label

    f = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"
    lines = []
    if cell["axes"]:
        lines.append("  ".join(f"{k}={v}" for k, v in cell["axes"].items()))
    tuned = "selected_on" in cell
    if tuned:
        lines.append(
            f"tuned: each variant at its best {' x '.join(cell['tuned_axes'])} on validation, compared on "
            f"{cell['metric']}"
        )
    metric = {"final_val_loss": "val loss", "final_val_acc": "val acc"}.get(cell["metric"], cell["metric"][6:])
    lines.append(
        f"{'rank':<4} {'ffn':<14} {metric + ' (95% CI)':<26} {'delta vs ' + baseline + ' (95% CI)':<30}"
        f" {'p_adj':>7} "
        + (
            "setting"
            if tuned
            else f"{'params':>9} {'tok/s':>7} {'mem MiB':>7} {'test':>7} "
            f"{'noise +':>7} {'events':>6} {'dead':>5} {'div':>3}"
        )
    )
    for r in cell["variants"]:
        ci = f"{f(r['mean'])} [{f(r['ci_low'])}, {f(r['ci_high'])}]"
        sig = "*" if r["significant"] else " "
        delta = (
            "baseline"
            if r["ffn"] == baseline
            else f"{r['delta']:+.4f} [{f(r['delta_ci_low'])}, {f(r['delta_ci_high'])}]{sig}"
            if r["delta"] is not None
            else "-"
        )
        p = p_label(r, baseline)
        if tuned:
            setting = ", ".join(f"{a} {r.get(a)}" for a in cell["tuned_axes"])
            lines.append(f"{r['rank']:<4} {r['ffn']:<14} {ci:<26} {delta:<30} {p:>7} {setting}")
            continue
        lines.append(
            f"{r['rank']:<4} {r['ffn']:<14} {ci:<26} {delta:<30} {p:>7} "
            f"{r['params'] or 0:>9,} {r['tokens_per_s'] or 0:>7,.0f} {(r['train_mem_bytes'] or 0) / 2**20:>7.1f} "
            f"{f(r['test_mean']):>7} {f(r['noise_delta']):>7} {r['stability_events']:>6} "
            f"{f(r['dead_frac'], 2):>5} {r['diverged']:>3}"
        )
    lines.append(cell["verdict"])
    if cell.get("noise_floor"):
        nf = cell["noise_floor"]
        lines.append(f"noise floor ({baseline}, {nf['n']} seeds): std {nf['std']}, range {nf['range']}")
    lit = cell.get("literature")
    if lit and lit["tau"] is not None:
        lines.append(literature_text(lit))
    return lines


def write_csv(summary: dict, path: str):
    """One row per (cell, variant), tuned cells included, written atomically."""
    import csv
    import io

    from ffnlab.study.summary import ROW_FIELDS

    buf = io.StringIO()
    cells = summary["cells"] + summary.get("tuned", [])
    axes = sorted({k for c in cells for k in c["axes"]})
    writer = csv.DictWriter(buf, fieldnames=axes + ["metric", *ROW_FIELDS], extrasaction="ignore")
    writer.writeheader()
    for cell in cells:
        for r in cell["variants"]:
            writer.writerow({**cell["axes"], "metric": cell["metric"], **r})
    write_atomic(path, buf.getvalue())


def summary_json(summary: dict) -> dict:
    """What `compare --json` prints: the summary's cells as they are (the report and advise read the
    same cells), with the single cell's rows and verdict at the top level when there are no axes."""
    out = {k: summary[k] for k in ("store", "baseline", "seeds", "settings", "cells") if k in summary}
    if "tuned" in summary:
        out["tuned"] = summary["tuned"]
    if "variants" in summary:
        out["variants"] = summary["cells"][0]["variants"]
        out["verdict"] = summary["verdict"]
    return out


def cmd_compare(args):
    from ffnlab.study.execute import run_study

    if args.log_to:
        import importlib.util

        module = {"mlflow": "mlflow", "tensorboard": "tensorboard"}[args.log_to]
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"--log-to {args.log_to} needs the '{module}' package, which is not installed")
    if args.address and args.backend != "ray":
        raise UsageError(f"--address {args.address} is for --backend ray; add --backend ray or drop --address")
    study = study_from_args(args)
    grid = protocol_grid_from(study) if args.protocol else None  # checked before anything is written
    if args.csv:
        check_writable(args.csv)
    if not args.no_report:  # fail now, not after the sweep, when the report cannot be written
        from ffnlab.study.report import check_out_dir, default_out_dir

        check_out_dir(default_out_dir(args.store))
    run = dict(
        jobs=args.jobs, backend=args.backend, address=args.address, quiet=args.quiet or args.json, log_to=args.log_to
    )
    if args.protocol:
        return compare_protocol(args, study, grid, run)
    summary = run_study(study, args.store, **run)
    if args.csv:
        write_csv(summary, args.csv)
    if not args.json and not args.quiet:  # the ranking as soon as it is known; the report takes seconds more
        print(format_table(summary))
        print(f"store: {summary['store']}", flush=True)
    if not args.no_report:
        from ffnlab.study.report import write_report

        report = write_report(args.store, study=study)
        if not args.json and not args.quiet:
            print(f"report: {report['html']} (summary: {report['markdown']})")
    if args.json:
        print(json.dumps(summary_json(summary), indent=1))
    return incomplete(summary)


def incomplete(summary: dict) -> int:
    """Exit status of a finished sweep: 1, with one line on stderr, when planned runs did not finish."""
    missing = sum(len(seeds) for cell in summary["cells"] for seeds in cell.get("missing", {}).values())
    if not missing:
        return 0
    planned = sum(1 for cell in summary["cells"] for r in cell["variants"]) * summary["seeds"]
    print(
        f"ffnlab: error: {missing} of {planned} planned runs did not finish (their errors are above and in the "
        f"store); the table rests on the rest. Run the same command again to retry them",
        file=sys.stderr,
    )
    return 1


def protocol_grid_from(study) -> dict:
    """The protocol's grid: --lr-axis, --warmup-axis and --context-axis where given (taken out of the
    study's axes), its defaults otherwise; ValueError if the study has other axes."""
    from ffnlab.study.protocol import check_protocol_study, protocol_grid

    given = {a: study.axes.pop(a) for a in ("lr", "warmup", "context") if a in study.axes}
    check_protocol_study(study)
    return protocol_grid(study, given.get("lr"), given.get("warmup"), given.get("context"))


def compare_protocol(args, study, grid: dict, run: dict):
    """`compare --protocol`: the three stages of ffnlab.study.protocol, each printed as its own table."""
    from ffnlab.study.protocol import run_protocol

    result = run_protocol(study, args.store, grid, **run)
    code = max(incomplete(stage["summary"]) for stage in result["stages"])
    if args.csv:
        write_csv(result["stages"][1]["summary"], args.csv)
    report = None
    if not args.no_report:
        from ffnlab.study.report import write_report

        report = write_report(args.store, study=study)
    if args.json:
        print(
            json.dumps(
                {
                    "grid": result["grid"],
                    "choice": result["choice"],
                    "stages": [{"name": st["name"], **summary_json(st["summary"])} for st in result["stages"]],
                },
                indent=1,
            )
        )
    elif not args.quiet:
        print(format_protocol(result))
        print(f"store: {args.store}")
        if report:
            print(f"report: {report['html']} (summary: {report['markdown']})")
    return code


def format_protocol(result: dict) -> str:
    """The protocol's three stages as text: each stage's tables under a heading."""
    from ffnlab.study.protocol import STAGE_TITLES

    lines = []
    for stage in result["stages"]:
        s = stage["summary"]
        lines.append(f"== stage {STAGE_TITLES[stage['name']]} ==")
        cells = s.get("tuned", []) if stage["name"] == "tune" else s["cells"]
        for cell in cells:
            lines += format_cell(cell, s["baseline"]) + [""]
    return "\n".join(lines + held_equal_lines(result["stages"][0]["summary"]["settings"]))


# ---- numerics -----------------------------------------------------------------------------------


def cmd_numerics(args):
    from ffnlab.tools.numerics import format_numerics, parse_range, run_numerics, to_json

    lo, hi = parse_range(args.range)
    report = run_numerics(args.names, args.dtypes, lo, hi, points=args.points, claims=not args.no_claims)
    print(to_json(report) if args.json else format_numerics(report))


# ---- export -------------------------------------------------------------------------------------


def cmd_export(args):
    from ffnlab.tools.export import OPSET, export_variant, format_export

    report = export_variant(args.ffn, args.out, args.model, args.d_model, args.n_layers, args.opset or OPSET)
    print(json.dumps(report, indent=1) if args.json else format_export(report))


# ---- bench --------------------------------------------------------------------------------------


def cmd_bench(args):
    from ffnlab.tools.bench import format_bench, run_bench

    log = None if args.json else (lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
    result = run_bench(
        args.ffn,
        args.tokens,
        args.d_model,
        quick=args.quick,
        compile=not args.no_compile,
        repeats=args.repeats,
        log=log,
    )
    print(json.dumps(result, indent=1) if args.json else format_bench(result))


# ---- report, plot, advise -----------------------------------------------------------------------


def cmd_report(args):
    from ffnlab.study.report import write_report

    paths = write_report(args.store, args.out, baseline=args.baseline, layer=args.layer, numerics=args.numerics)
    print(
        f"report: {paths['html']}\nsummary: {paths['markdown']}\n"
        f"figures: {len(paths['figures'])} PNG in {paths['html'].parent / 'figures'}"
    )


def cmd_plot(args):
    from ffnlab.study.plots import activation_labels, activations_figure, figure_format, save

    figure_format(args.out)  # a bad extension fails before any drawing
    labels = activation_labels(args.names)
    save(activations_figure(list(labels), args.xmin, args.xmax, labels=labels), args.out)
    print(f"wrote {args.out}")


def cmd_advise(args):
    from ffnlab.study.advise import advise, format_advice

    advice = advise(
        args.store,
        args.params_budget,
        args.memory_budget,
        args.latency_sensitive,
        args.pretrained,
        args.deploy,
        args.depth,
    )
    print(json.dumps(advice, indent=1) if args.json else format_advice(advice))


# ---- entry point --------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="ffnlab", description="Choose a Transformer FFN activation by measuring it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("list", help="activations and FFN variants with formulas and sizes")
    p.add_argument("--d-model", type=positive_int, default=512, help="width for the params column")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("train", help="train one model and print its result")
    p.add_argument("--ffn", default="gelu", help="FFN variant (see ffnlab list)")
    p.add_argument("--seed", type=int, default=0)
    add_run_args(p)
    p.add_argument("--checkpoint-dir", default=None, help="save checkpoints here and resume from them")
    p.add_argument("--checkpoint-every", type=positive_int, default=100, help="steps between checkpoints")
    p.add_argument("--out", default=None, help="also write the full result (with curves) to this JSON file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="multi-seed comparison of FFN variants with statistics (the main job)")
    p.add_argument("--variants", type=csv_list, default=None, help="comma-separated FFN variants")
    p.add_argument("--seeds", type=positive_int, default=None, help="seeds per variant (default 4)")
    p.add_argument("--baseline", default="relu")
    p.add_argument("--preset", default="standard", help="smoke | quick | standard | paper")
    p.add_argument("--noise-floor", type=int, default=0, help="extra baseline-only seeds to show seed noise")
    p.add_argument("--depth", type=int_list, default=None, help="axis: layer counts, e.g. 2,6,12")
    p.add_argument("--width", type=int_list, default=None, help="axis: d_model values")
    p.add_argument("--placement-axis", type=csv_list, default=None, help="axis: pre,post")
    p.add_argument("--norm-axis", type=csv_list, default=None, help="axis: layernorm,rmsnorm")
    p.add_argument("--task-axis", type=csv_list, default=None, help="axis: lm,cls")
    p.add_argument("--data-axis", type=csv_list, default=None, help="axis: data sources")
    p.add_argument(
        "--init-axis",
        type=csv_list,
        default=None,
        help=f"axis: FFN inits, e.g. lecun,he,family (valid: {', '.join(INITS)})",
    )
    p.add_argument(
        "--lr-axis",
        type=float_list,
        default=None,
        help="axis: peak learning rates, e.g. 1e-3,2e-3,4e-3; "
        "adds a 'tuned' summary (each variant at its best lr on validation, reported on test)",
    )
    p.add_argument("--warmup-axis", type=int_list, default=None, help="axis: warm-up steps, e.g. 10,40")
    p.add_argument("--context-axis", type=int_list, default=None, help="axis: context lengths (tokens per sequence)")
    p.add_argument(
        "--protocol",
        action="store_true",
        help="the validation protocol: 1. compare at fixed settings, "
        "2. tune lr and warm-up per variant (chosen on validation, compared on test), 3. check the "
        "ranking at other contexts; --lr-axis, --warmup-axis, --context-axis set its grids",
    )
    add_run_args(p)
    p.add_argument("--store", default="ffnlab-runs/ffnlab.db", help="SQLite run store")
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default="auto",
        help="local worker processes: auto (default) runs one "
        "single-threaded worker per core (one process on a GPU), or a number",
    )
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local one)")
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--no-stats", action="store_true", help="allow a single seed (no intervals or p-values)")
    p.add_argument(
        "--log-to",
        default=None,
        choices=("mlflow", "tensorboard"),
        help="mirror finished runs there (mlflow: your tracking URI, else mlflow.db beside the store)",
    )
    p.add_argument(
        "--no-report",
        action="store_true",
        help="skip the HTML/Markdown report (default: written to report/ beside the store)",
    )
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("numerics", help="forward/backward error of every activation against a float64 reference")
    p.add_argument("names", nargs="?", default=None, help="comma-separated activations (default: all)")
    p.add_argument("--dtypes", default="fp32,fp16,bf16", help="comma-separated: fp32, fp16, bf16")
    p.add_argument("--range", default="-10,10", help="LO,HI of the x grid, e.g. -10,10")
    p.add_argument("--points", type=positive_int, default=None, help="grid points (default 200001)")
    p.add_argument("--no-claims", action="store_true", help="skip the claims table (it times kernels)")
    p.add_argument("--json", action="store_true", help="print strict JSON instead of tables")
    p.set_defaults(func=cmd_numerics)
    import re  # NOTE: argparse reads '--range -10,10' as a flag; let a leading -digit be a value here

    p._negative_number_matcher = re.compile(r"^-\.?\d")

    p = sub.add_parser("export", help="export an FFN variant (alone or in a model) to ONNX, checked in onnxruntime")
    p.add_argument("--ffn", required=True, help="FFN variant (see ffnlab list), or mix:ACT1+ACT2")
    p.add_argument(
        "--model",
        default="ffn",
        help="ffn (the FFN alone), small (ffnlab Transformer with that FFN), or a Hugging Face config.json",
    )
    p.add_argument(
        "--d-model", type=positive_int, default=None, help="width (default: 64 for ffn, ModelConfig's for small)"
    )
    p.add_argument("--n-layers", type=positive_int, default=None, help="layers of the small model")
    p.add_argument("--opset", type=positive_int, default=None, help="ONNX opset (default 20, the first with Gelu)")
    p.add_argument("--out", required=True, help="the .onnx file to write (atomically)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("bench", help="time FFN variants eager, fused and compiled; saved bytes, memory, GFLOP/s")
    p.add_argument(
        "--ffn",
        type=csv_list,
        default=None,
        help="comma-separated FFN variants (default: swiglu,geglu,geglu_tanh,reglu,glu,gelu; quick: swiglu,gelu)",
    )
    p.add_argument(
        "--tokens", type=int_list, default=None, help="comma-separated token counts (default 4096; quick 512)"
    )
    p.add_argument("--d-model", type=int_list, default=None, help="comma-separated widths (default 512; quick 256)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed repeats per median (default 7; quick 3)")
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats: under a minute on 2 cores")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (its rows say so)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="HTML report, Markdown summary and figures of the latest study in a store")
    p.add_argument("--store", default="ffnlab-runs/ffnlab.db", help="SQLite run store")
    p.add_argument("--out", default=None, help="output folder (default: report/ beside the store)")
    p.add_argument(
        "--baseline",
        default=None,
        help="variant the others are compared with (default: relu if it was run, else the first)",
    )
    p.add_argument("--layer", type=int, default=None, help="layer of the attention maps (default: the last)")
    p.add_argument(
        "--numerics",
        action="store_true",
        help="also measure the compared activations' numerics (numerics.json beside the store)",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("plot", help="draw activations and their derivatives to a PNG or SVG file")
    p.add_argument("what", choices=("activations",))
    p.add_argument("names", type=csv_list, help="comma-separated activations or FFN variants, e.g. gelu,silu,gelu_tanh")
    p.add_argument("--out", default="activations.png", help="file to write: .png or .svg")
    p.add_argument("--xmin", type=float, default=-4.0, help="left end of the x range")
    p.add_argument("--xmax", type=float, default=4.0, help="right end of the x range")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("advise", help="recommend an FFN variant for a situation, with the evidence and its source")
    p.add_argument("--store", default=None, help="run store with your measurements (default: published results)")
    p.add_argument("--params-budget", default=None, help="most parameters the model may have, e.g. 125M")
    p.add_argument("--memory-budget", default=None, help="most training memory, e.g. 16GiB or 500MB")
    p.add_argument("--latency-sensitive", action="store_true", help="prefer the faster of statistically tied variants")
    p.add_argument(
        "--pretrained",
        default=None,
        help="fine-tuning this model: path to its config.json, or a name "
        "such as bert-base-uncased, gpt2, t5-base, mistral",
    )
    p.add_argument("--deploy", choices=("cpu", "gpu", "edge"), default=None, help="where the model will run")
    p.add_argument("--depth", type=positive_int, default=None, help="number of layers you plan")
    p.add_argument("--json", action="store_true", help="print recommendation, reasons, evidence, alternatives as JSON")
    p.set_defaults(func=cmd_advise)
    return parser


# failures that come from what the user asked for (a name, a size, a path, a store): one line, exit 2
USER_ERRORS = (
    UsageError,
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    UnicodeDecodeError,
    MemoryError,
    OverflowError,
    sqlite3.Error,
)


def main(argv=None) -> int:
    """Run the CLI. Exit 0 on success, 1 when runs did not finish or on an internal error (one line,
    the full trace written to a file it names), 2 on a user error (one line naming the problem)."""
    # SIGTERM (a scheduler's stop, `kill`) unwinds like Ctrl-C, so `finally` blocks remove temporary files
    previous = (
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        return run_command(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_command(argv) -> int:
    """main() without the signal handling."""
    try:
        args = build_parser().parse_args(argv)
        code = args.func(args)
        return code if isinstance(code, int) else 0
    except USER_ERRORS as e:
        if os.environ.get("FFNLAB_DEBUG"):
            raise
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, sqlite3.Error):
            message = f"the run store cannot be used ({type(e).__name__}: {message}); check --store"
        elif isinstance(e, (MemoryError, OverflowError)):
            message = f"the requested sizes do not fit ({type(e).__name__}{': ' + message if str(e) else ''})"
        print(f"ffnlab: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ffnlab: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: one line, and the trace where it can be read and reported
        if os.environ.get("FFNLAB_DEBUG"):
            raise
        import tempfile
        import traceback

        fd, trace = tempfile.mkstemp(prefix="ffnlab-error-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            traceback.print_exc(file=f)
        first = str(e).splitlines()[0] if str(e) else ""
        print(
            f"ffnlab: internal error: {type(e).__name__}{': ' + first if first else ''} (full trace in {trace})",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
