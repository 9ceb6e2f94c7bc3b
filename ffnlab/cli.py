"""Command-line interface: parses arguments, nothing more. Its subcommands and their flags (derived from the
config dataclasses where one holds them: ffnlab.flags) are declared here; each subcommand's function
(ffnlab.commands) calls the library.

Every user error (bad name, bad size, missing file) ends as one line on stderr and exit code 2;
set FFNLAB_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn, TypeAlias

from ffnlab._util.names import closest
from ffnlab._util.signals import stop_within
from ffnlab._util.text import one_line_warning, shorten
from ffnlab.commands import (
    cmd_advise,
    cmd_bench,
    cmd_compare,
    cmd_data_prepare,
    cmd_deploy,
    cmd_export,
    cmd_list,
    cmd_numerics,
    cmd_plot,
    cmd_report,
    cmd_train,
)
from ffnlab.core.model import ModelConfig
from ffnlab.errors import internal_error, user_error
from ffnlab.flags import UsageError, add_config_flags, add_study_flags, csv_list, int_list, positive_float, positive_int
from ffnlab.run.config import TrainConfig
from ffnlab.run.presets import DEFAULT_PRESET, PRESETS
from ffnlab.study.store import DEFAULT_PATH as DEFAULT_STORE


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # only whole flag names: argparse would read `--seed -1` as `--seeds -1`, a prefix of another flag
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})
        # NOTE: argparse takes '-1e-3', '-inf' for flags ('expected one argument'); no flag starts with
        # '-' and a digit, '.', 'inf' or 'nan', so such a word is a (negative) value
        self._negative_number_matcher = re.compile(r"^-(\.?\d|inf|nan)", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        # what argparse echoes here is what the user typed (a value, a choice, stray arguments): each
        # long word shortened as ffnlab's own errors echo names, so a 100k-character value is not printed
        raise UsageError(re.sub(r"[^\s']{61,}", lambda word: shorten(word.group()), message))

    def parse_known_args(  # type: ignore[override]  # one of typeshed's overloads: ffnlab passes no namespace
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:  # NOTE: argparse turns '--flag=--' into [] and skips the type check
            if action.option_strings and action.nargs is None and getattr(parsed, action.dest, None) == []:
                self.error(f"argument {action.option_strings[-1]}: expected a value, got '--'")
        for word in extras:  # a flag this command does not have: name the nearest one it has
            if word.startswith("--"):
                flag = word.split("=", 1)[0]
                self.error(f"{self.prog} has no flag {flag}{closest(flag, self._option_string_actions)}; see --help")
        return parsed, extras


Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"  # what add_subparsers returns


def jobs_arg(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def add_run_args(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Flags shared by `train` and `compare`: every TrainConfig and ModelConfig field (ffnlab.flags),
    a Hugging Face config, a TOML config file and --print-config. A flag the user did not give
    leaves the base config (the preset, then the --config file) as it is."""
    add_config_flags(p, TrainConfig, skip)
    add_config_flags(p, ModelConfig, skip)
    p.add_argument(
        "--hf-config",
        help="a Hugging Face config.json: train that architecture (random init) with each FFN variant swapped in",
    )
    p.add_argument("--config", help="a TOML file of config fields ([model] for the model); flags override it")
    p.add_argument("--print-config", action="store_true", help="print the resolved configuration as TOML and stop")


# ---- entry point --------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="ffnlab", description="Choose a Transformer FFN activation by measuring it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("list", help="activations and FFN variants with formulas and sizes")
    p.add_argument("--d-model", type=positive_int, default=512, help="width for the params column")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument(
        "--schedule", help="size a per-layer schedule instead, e.g. gelu*2+swiglu*2: d_ff and params per layer"
    )
    p.add_argument("--layers", "--n-layers", dest="n_layers", type=positive_int, default=None,
                   help="layers of the --schedule (default: as many as it names)")  # fmt: skip
    p.set_defaults(func=cmd_list)

    for name, what in (
        ("train", "train one model and print its result"),
        ("finetune", "fine-tune a save_pretrained folder (--from), its FFN activation kept or swapped (--ffn)"),
    ):
        p = sub.add_parser(name, help=what)
        add_run_args(p)
        p.add_argument("--preset", default=None, help=f"start from a named setup: {' | '.join(PRESETS)}")
        p.add_argument("--out", default=None, help="also write the full result (with curves) to this JSON file")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--profile", action="store_true", help=PROFILE_HELP)
        p.add_argument(
            "--save-pretrained",
            default=None,
            metavar="FOLDER",
            help="save the trained Hugging Face model (--hf-config or --from) there, for a later --from; with --peft "
            "the LoRA adapter, as peft saves it, and the base it needs (ffnlab.tools.lora.load_adapter)",
        )
        p.set_defaults(func=cmd_train)

    add_compare_parser(sub)
    add_data_parser(sub)
    add_tool_parsers(sub)
    add_study_tool_parsers(sub)
    return parser


PROFILE_HELP = (
    "first profile a few steps after warm-up and print where a step's time goes (attention, FFN matrices, "
    "activation, norms, backward, optimizer; top operators)"
)


def add_compare_parser(sub: Subcommands) -> None:
    """compare: the Study's flags (ffnlab.flags.add_study_flags), the run's, and how the study runs and reports."""
    p = sub.add_parser("compare", help="multi-seed comparison of FFN variants with statistics (the main job)")
    add_study_flags(p)
    names = (f"{name} (default)" if name == DEFAULT_PRESET else name for name in PRESETS)
    p.add_argument("--preset", default=None, help=" | ".join(names))
    p.add_argument("--no-stats", action="store_true", help="allow a single seed (no intervals or p-values)")
    p.add_argument(
        "--extrapolate-to",
        type=positive_float,
        default=None,
        metavar="FLOPS",
        help="with --scale: also read each multiplier at this compute, marked as an extrapolation",
    )
    p.add_argument(
        "--protocol",
        action="store_true",
        help="the validation protocol: 1. compare at fixed settings, "
        "2. tune lr and warm-up per variant (chosen on validation, compared on test), 3. check the "
        "ranking at other contexts; --lr-axis, --warmup-axis, --context-axis set its grids",
    )
    add_run_args(p, skip=("ffn", "seed", "checkpoint_dir", "nproc"))
    p.add_argument("--store", default=str(DEFAULT_STORE), help="SQLite run store")
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default="auto",
        help="runs at once: auto (default) runs one single-threaded process per core (one run on a GPU), "
        "divided among each run's --nproc-per-run processes, or a number",
    )
    p.add_argument(
        "--nproc-per-run",
        dest="nproc",
        type=positive_int,
        default=None,
        help="processes each run trains in (DDP; on Ray one task holding that many CPUs or GPUs); "
        "the global batch is --batch-size x this x --grad-accum (config default: 1)",
    )
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local one)")
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
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
    p.add_argument("--profile", action="store_true", help=PROFILE_HELP + ", for the first run of each variant")
    p.set_defaults(func=cmd_compare)


def add_data_parser(sub: Subcommands) -> None:
    """data prepare: a corpus tokenised once into a folder of token files that --data reads (ffnlab.data.prepared)."""
    p = sub.add_parser("data", help="prepare a corpus once as token files that train and compare read (--data DIR)")
    tasks = p.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    p = tasks.add_parser(
        "prepare",
        help="tokenise SOURCE once into DIR/train.bin, val.bin, test.bin and manifest.json (task lm)",
        description="Tokenise SOURCE once, streaming, into DIR: one file of token ids per split (uint16 where the "
        "vocabulary fits, else uint32) and manifest.json, written last; train --data DIR samples windows from them "
        "through a memory map.",
    )
    p.add_argument("source", help="a .txt file or a folder of them (split as train reads them); rows and datasets too")
    p.add_argument("--out", required=True, metavar="DIR", help="the new folder to write")
    p.add_argument(
        "--tokenizer",
        default="char",
        help="char (default), byte, bpe (trained on the train split), or a tokenizer.json saved by tokenizers "
        "(FILE.json: GPT-2's, LLaMA's)",
    )
    p.add_argument("--bpe-vocab", type=positive_int, default=None, help="the bpe tokenizer's vocabulary (default 4096)")
    p.add_argument("--text-field", default="text", help="the text column of rows (JSON lines, CSV, Parquet, datasets)")
    p.add_argument("--workers", type=positive_int, default=None, help="threads that tokenise (default: every core)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_data_prepare)


def add_tool_parsers(sub: Subcommands) -> None:
    """numerics, export, bench and deploy."""
    p = sub.add_parser("numerics", help="forward/backward error of every activation against a float64 reference")
    p.add_argument("names", nargs="?", default=None, help="comma-separated activations (default: all)")
    p.add_argument("--dtypes", default="fp32,fp16,bf16", help="comma-separated: fp32, fp16, bf16, int8")
    p.add_argument("--range", default="-10,10", help="LO,HI of the x grid, e.g. -10,10")
    p.add_argument("--points", type=positive_int, default=None, help="grid points (default 200001)")
    p.add_argument("--no-claims", action="store_true", help="skip the claims table (it times kernels)")
    p.add_argument("--json", action="store_true", help="print strict JSON instead of tables")
    p.set_defaults(func=cmd_numerics)

    p = sub.add_parser("export", help="export an FFN variant (alone or in a model) to ONNX, checked in onnxruntime")
    p.add_argument(
        "--ffn", required=True, help="FFN variant (see ffnlab list), mix:ACT1+ACT2, or with --model small a schedule"
    )
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
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, few repeats, nothing that compiles (its wall time per machine: benchmarks/README.md)",
    )
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (its rows say so)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_bench)
    add_deploy_parser(sub)


def add_deploy_parser(sub: Subcommands) -> None:
    """deploy: a store's trained runs (--store) or fresh models (--ffn and the sizes); unset flags keep
    the library's defaults (ffnlab.tools.deploy.run_deploy)."""
    p = sub.add_parser("deploy", help="inference cost (and, from a store, quality) per variant, precision, runtime")
    p.add_argument("--store", default=None, help="measure this run store's trained runs; writes deploy.json beside it")
    p.add_argument("--ffn", type=csv_list, default=None, help="comma-separated variants: fresh models, or the store's")
    for flag, what in (("--d-model", "width"), ("--n-layers", "layers"), ("--n-heads", "heads"),
                       ("--context", "context"), ("--vocab-size", "vocabulary")):  # fmt: skip
        p.add_argument(flag, type=positive_int, default=None, help=f"fresh model's {what} (default: ModelConfig's)")
    p.add_argument(
        "--precisions", default=None, help="comma-separated: fp32, bf16, fp16, int8 (default: fp32,bf16,int8)"
    )
    p.add_argument("--runtimes", default=None, help="comma-separated: eager, compile, onnxruntime (default: all)")
    p.add_argument("--batch", type=positive_int, default=None, help="the throughput batch (default 16)")
    p.add_argument("--seq", type=positive_int, default=None, help="tokens per sequence (default: the context)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed calls per median (default 20)")
    p.add_argument("--warmup", type=int, default=None, help="least untimed rounds; more till times settle (default 3)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--onnx-dir", default=None, metavar="FOLDER", help="keep the ONNX files there")
    p.add_argument("--no-roofline", action="store_true", help="skip the roofline (it times a memory copy)")
    p.add_argument("--json", action="store_true", help="print strict JSON instead of the table")
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    p.set_defaults(func=cmd_deploy)


def add_study_tool_parsers(sub: Subcommands) -> None:
    """report, plot and advise."""
    p = sub.add_parser("report", help="HTML report, Markdown summary and figures of the latest study in a store")
    p.add_argument("--store", default=str(DEFAULT_STORE), help="SQLite run store")
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

    add_advise_parser(sub)


def add_advise_parser(sub: Subcommands) -> None:
    """advise: one flag per field of the situation (ffnlab.study.advise.Situation), the inputs of the decision
    flow (ffnlab.study.advise.flow); --store is where measurements come from, --json how the advice is printed."""
    from ffnlab.study.advise import Situation

    p = sub.add_parser(
        "advise",
        help="recommend an FFN variant for a situation, with the evidence and its source",
        description="Recommend an FFN variant. The flow: --situation (from a checkpoint: keep its activation, "
        "or for inference run it fastest; from scratch: --store measurements, else published results), then "
        "--hardware, --seq-len, --model-size and the budgets; every reason says its evidence "
        "(measured, published or rule of thumb).",
    )
    add_config_flags(p, Situation)
    p.add_argument("--store", default=None, help="run store with your measurements (default: published results)")
    p.add_argument("--json", action="store_true", help="print recommendation, reasons, evidence, alternatives as JSON")
    p.set_defaults(func=cmd_advise)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI. Exit 0 on success, 1 when runs did not finish or on an internal error (one line,
    the full trace written to a file it names), 2 on a user error (one line naming the problem)."""
    previous_format, warnings.formatwarning = warnings.formatwarning, one_line_warning
    try:
        # SIGTERM unwinds like Ctrl-C, so `finally` blocks remove temporary files; either ends the process
        # within seconds even while library code holds the main thread
        with stop_within():
            return run_command(argv)
    finally:
        warnings.formatwarning = previous_format


def run_command(argv: Sequence[str] | None) -> int:
    """main() without the signal handling."""
    try:
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()  # output still buffered (all of it, where it fits) meets a closed pipe here, not at exit
        return code if isinstance(code, int) else 0
    except BrokenPipeError:  # the reader of the output left (`ffnlab list | head`): stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        print("ffnlab: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("FFNLAB_DEBUG"):
            raise
        message = user_error(e)
        if message is None:
            return internal_error(e)
        print(f"ffnlab: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
