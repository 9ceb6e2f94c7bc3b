"""Command-line interface: parses arguments and calls library functions, nothing more.

Every user error (bad name, bad size, missing file) ends as one line on stderr and exit code 2;
set FFNLAB_DEBUG=1 to see the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ffnlab.activations import ACTIVATIONS, aliases
from ffnlab.ffn import FFNS, build_ffn, ffn_stats


class UsageError(Exception):
    """A mistake in what the user asked for; the CLI prints it as one line and exits 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)


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
        rows.append({"name": name, "kind": "activation", "gated": False, "aliases": aliases(name),
                     "same_as": a.same_as, "formula": a.formula, "paper": a.paper,
                     "flops_per_element": a.flops, "learnable": a.learnable, "family": a.family})
    for name, spec in FFNS.items():
        stats = ffn_stats(build_ffn(name, d_model))
        rows.append({"name": name, "kind": "ffn", "gated": spec.gated,
                     "aliases": aliases(name) if spec.kind == "dense" else [],
                     "formula": spec.formula, "paper": spec.paper, "d_model": d_model, "d_ff": stats["d_ff"],
                     "params": stats["params"], "flops_per_token": stats["flops_per_token"]})
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
    print(f"\n{'ffn':<14} {'gated':<6} {'d_ff':>6} {'params':>10}  formula   (d_model={args.d_model}, "
          "matched to dense 4x params)")
    for r in rows:
        if r["kind"] == "ffn":
            print(f"{r['name']:<14} {'yes' if r['gated'] else 'no':<6} {r['d_ff']:>6} {r['params']:>10,}  "
                  f"{r['formula']}")
    print("\nmix:ACT1+ACT2 mixes two dense FFNs at half width each, e.g. mix:gelu+silu")


# ---- entry point --------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="ffnlab", description="Choose a Transformer FFN activation by measuring it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("list", help="activations and FFN variants with formulas and sizes")
    p.add_argument("--d-model", type=positive_int, default=512, help="width for the params column")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=cmd_list)
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.func(args)
        return 0
    except (UsageError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError,
            UnicodeDecodeError) as e:
        if os.environ.get("FFNLAB_DEBUG"):
            raise
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"ffnlab: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ffnlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
