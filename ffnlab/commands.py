"""One function per `ffnlab` subcommand: it takes the parsed arguments, calls the library and prints what it
returns. cli.py declares the subcommands and their flags; a mistake in the flags is a `UsageError`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from ffnlab._util.files import check_output_folder, check_writable, write_atomic
from ffnlab._util.jsonio import strict_dumps
from ffnlab.flags import UsageError, given, run_flags, study_flags
from ffnlab.run.config import TrainConfig
from ffnlab.run.config_file import RUN_TABLES, config_from_sources, file_fields, read_toml, to_toml
from ffnlab.run.presets import preset_config
from ffnlab.study.plan import Study, study_toml
from ffnlab.study.table import format_protocol, format_table

if TYPE_CHECKING:
    from ffnlab.study.compare import Comparison
    from ffnlab.study.records import Summary


def cmd_list(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from ffnlab.core.catalog import format_list, format_schedule, list_rows, schedule_sizes

    if args.schedule:
        sizes = schedule_sizes(args.schedule, args.d_model, args.n_layers)
        print(json.dumps(asdict(sizes), indent=1) if args.json else format_schedule(sizes))
        return
    if args.n_layers:
        raise UsageError("--layers sizes a schedule: add --schedule, e.g. --schedule gelu*2+swiglu*2")
    rows = list_rows(args.d_model)
    print(json.dumps([asdict(row) for row in rows], indent=1) if args.json else format_list(rows, args.d_model))


def cmd_train(args: argparse.Namespace) -> int | None:
    from ffnlab.run.distributed import RankFailed, leave, this_rank
    from ffnlab.run.result_text import format_run
    from ffnlab.run.train import progress_bar, train

    if args.out:
        check_writable(args.out)  # now, not after the training
    file = read_toml(args.config, RUN_TABLES) if args.config else {}
    base = preset_config(args.preset) if args.preset is not None else TrainConfig()
    cfg = config_from_sources(base, file, run_flags(args))
    if args.print_config:
        print(to_toml(file_fields(cfg)))
        return None
    if args.command == "finetune" and not cfg.init_from:
        raise UsageError("finetune needs --from FOLDER, a save_pretrained folder")
    if args.save_pretrained:  # a folder, written when the run has finished: checked now, not then
        check_output_folder(args.save_pretrained, "--save-pretrained")
    ranks = this_rank()  # torchrun's processes each run this command; rank 0 alone prints and writes
    if args.profile and (cfg.nproc > 1 or ranks.world > 1):
        raise UsageError("--profile times one process; drop it or --nproc (or start it without torchrun)")
    profile = None
    if args.profile:  # a few steps of a run of its own, before the one that counts
        from ffnlab.run.profile import format_profile, profile_training

        profile = profile_training(cfg)
        if not args.json:
            print(format_profile(profile) + "\n", flush=True)
    show = None if args.quiet or args.json else progress_bar(f"{cfg.model.ffn} seed {cfg.seed}: ")
    try:
        result = train(cfg, progress=show, pretrained_path=args.save_pretrained)
    except RankFailed as e:  # a rank died: one line, the checkpoint kept for a rerun
        print(f"ffnlab: error: {e}", file=sys.stderr)
        return 1
    finally:
        leave()
    if not ranks.main:
        return 0
    if args.out:
        write_atomic(args.out, json.dumps(result.to_dict(), indent=1))
    if args.json:
        printed = {k: v for k, v in result.to_dict().items() if k not in ("history", "config")}
        print(json.dumps(printed | ({"profile": profile.to_json()} if profile else {}), indent=1))
        return None
    print(format_run(result))
    return None


def cmd_compare(args: argparse.Namespace) -> int:
    from ffnlab.study.compare import compare

    if args.log_to:
        import importlib.util

        if importlib.util.find_spec(args.log_to) is None:  # the package is named as the choice
            raise UsageError(f"--log-to {args.log_to} needs the '{args.log_to}' package, which is not installed")
    if args.address and args.backend != "ray":
        raise UsageError(f"--address {args.address} is for --backend ray; add --backend ray or drop --address")
    study = Study.from_sources(args.preset, args.config, study_flags(args))
    if study.per_variant and args.protocol:
        raise UsageError("--opt sets per-variant optimiser settings, which --protocol tunes itself; drop one")
    if args.extrapolate_to is not None and not study.scale:
        raise UsageError("--extrapolate-to FLOPS reads the scaling fits: add --scale AXIS=... or --preset scaling")
    if args.print_config:
        print(study_toml(study))
        return 0
    talk = not args.json and not args.quiet
    result = compare(
        study,
        args.store,
        protocol=args.protocol,
        csv=args.csv,
        report=not args.no_report,
        extrapolate_to=args.extrapolate_to,
        ranked=print_ranking if talk else None,
        profile=args.profile,
        jobs=args.jobs,
        backend=args.backend,
        address=args.address,
        quiet=not talk,
        log_to=args.log_to,
    )
    if talk and result.report:
        print(f"report: {result.report.html} (summary: {result.report.markdown})")
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    return max(incomplete(summary) for summary in result.summaries)


def print_ranking(result: Comparison) -> None:
    """The ranking (the protocol's three), as soon as it is known: the report takes seconds more; where each
    variant's step went, with --profile."""
    from ffnlab.run.profile import format_profile

    print(format_protocol(result.protocol.stages) if result.protocol else format_table(result.summary))
    for profile in (result.profiles or {}).values():
        print("\n" + format_profile(profile))
    print(f"store: {result.summary.store}", flush=True)


def incomplete(summary: Summary) -> int:
    """Exit status of a finished sweep: 1, with one line on stderr, when planned runs did not finish."""
    from ffnlab.study.compare import unfinished

    missing, planned = unfinished(summary)
    if missing:
        print(
            f"ffnlab: error: {missing} of {planned} planned runs did not finish (their errors are above and in the "
            f"store); the table rests on the rest. Run the same command again to retry them",
            file=sys.stderr,
        )
    return 1 if missing else 0


def cmd_data_prepare(args: argparse.Namespace) -> None:
    if args.workers:  # tokenizers' thread pool reads it when it starts, at the first batch
        os.environ["RAYON_NUM_THREADS"] = str(args.workers)
    from ffnlab.data.prepared import prepare

    log = None if args.quiet else (lambda line: print(f"prepare: {line}", file=sys.stderr, flush=True))
    manifest = prepare(args.source, args.out, args.tokenizer, args.bpe_vocab, args.text_field, log=log)
    counts = ", ".join(f"{split} {n.tokens:,}" for split, n in manifest.splits.items())
    print(
        f"{args.out}: {counts} tokens of {manifest.dtype}, tokenizer {manifest.tokenizer['kind']} "
        f"(vocabulary {manifest.vocab_size:,}); split: {manifest.split_rule}"
    )


def cmd_numerics(args: argparse.Namespace) -> None:
    from ffnlab.tools.numerics import format_numerics, parse_range, run_numerics, to_json

    lo, hi = parse_range(args.range)
    report = run_numerics(args.names, args.dtypes, lo, hi, points=args.points, claims=not args.no_claims)
    print(to_json(report) if args.json else format_numerics(report))


def cmd_export(args: argparse.Namespace) -> None:
    from ffnlab.tools.export import OPSET, export_variant, format_export

    report = export_variant(args.ffn, args.out, args.model, args.d_model, args.n_layers, args.opset or OPSET)
    print(json.dumps(report, indent=1) if args.json else format_export(report))


def cmd_bench(args: argparse.Namespace) -> None:
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


def cmd_report(args: argparse.Namespace) -> None:
    from ffnlab.study.report import write_report

    files = write_report(args.store, args.out, baseline=args.baseline, layer=args.layer, numerics=args.numerics)
    print(
        f"report: {files.html}\nsummary: {files.markdown}\n"
        f"figures: {len(files.figures)} PNG in {files.html.parent / 'figures'}"
    )
    for problem in files.unshown:  # the page says it where the section would be; the terminal says it too
        print(f"ffnlab: warning: {problem}", file=sys.stderr)


def cmd_plot(args: argparse.Namespace) -> None:
    from ffnlab.study.plots import activation_labels, activations_figure, figure_format, save

    figure_format(args.out)  # a bad extension or place fails before any drawing
    check_writable(args.out)
    labels = activation_labels(args.names)
    save(activations_figure(list(labels), args.xmin, args.xmax, labels=labels), args.out)
    print(f"wrote {args.out}")


def cmd_advise(args: argparse.Namespace) -> None:
    from ffnlab.study.advise import Situation, advice_for, format_advice
    from ffnlab.study.advise.from_lora import lora_checkpoint

    args.pretrained = lora_checkpoint(args.stage, args.pretrained, args.store)  # a LoRA study's folder
    advice = advice_for(Situation(**given(args, Situation)), args.store)
    print(strict_dumps(advice.to_json()) if args.json else format_advice(advice))  # a size or a gap may not be finite


MODEL_SIZES = ("d_model", "n_layers", "n_heads", "context", "vocab_size")  # deploy's flags for a fresh model
TIMING = ("precisions", "runtimes", "batch", "seq", "repeats", "warmup", "threads")  # unset: the library's defaults


def cmd_deploy(args: argparse.Namespace) -> int:
    from ffnlab.study.deployment import deploy_store, deployment_path, save_deployment
    from ffnlab.tools.deploy import format_deploy, run_deploy

    check_deploy_flags(args)
    settings = {k: v for k in TIMING if (v := getattr(args, k)) is not None}
    settings |= {"workdir": args.onnx_dir, "roofline": not args.no_roofline}
    settings["log"] = None if args.json else (lambda line: print(f"deploy: {line}", file=sys.stderr, flush=True))
    saved = None
    if args.store is None:
        sizes = {k: v for k in MODEL_SIZES if (v := getattr(args, k)) is not None}
        result = run_deploy(args.ffn, **settings, **sizes)
    else:
        if os.path.isfile(args.store):  # else deploy_store names the store
            check_writable(deployment_path(args.store))  # now, not after the measurements
        result = deploy_store(args.store, args.ffn, **settings)
        saved = save_deployment(args.store, result)
    text = strict_dumps(result.to_json())  # a latency or a delta may not be finite
    if args.out:
        write_atomic(args.out, text)
    print(text if args.json else format_deploy(result))
    if saved:  # with --json, beside the JSON on stdout, not in it
        where = sys.stderr if args.json else sys.stdout
        print(f"deployment: {saved} (the report and advise --store read it)", file=where)
    if all(row.reason for row in result.rows):  # as compare exits 1 when runs did not finish
        print("ffnlab: no row was measured; each row above says why", file=sys.stderr)
        return 1
    return 0


def check_deploy_flags(args: argparse.Namespace) -> None:
    """A UsageError for flags `deploy` cannot act on, before anything is measured or written."""
    if args.store is None and args.ffn is None:
        raise UsageError("deploy measures a store's trained runs (--store STORE) or fresh models (--ffn gelu,relu)")
    sized = [k for k in MODEL_SIZES if getattr(args, k) is not None]
    if args.store is not None and sized:
        flag = "--" + sized[0].replace("_", "-")
        raise UsageError(f"{flag} sizes a fresh model; the runs of --store {args.store} keep their own: drop one")
    if args.onnx_dir and os.path.exists(args.onnx_dir) and not os.path.isdir(args.onnx_dir):
        raise UsageError(f"--onnx-dir {args.onnx_dir} is a file; give a folder")
    if args.out:
        check_writable(args.out)
