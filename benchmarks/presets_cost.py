"""What the literature's presets cost: a GPU estimate from FLOPs, and a few timed steps on this CPU.

    python benchmarks/presets_cost.py                 # the FLOP estimate (seconds; no training)
    python benchmarks/presets_cost.py --measure       # and a few steps of each preset on this CPU (minutes)

GPU, until measured: a run's FLOPs over a stated share (--mfu, 40%) of a GPU's dense bf16 peak (GPUS, the
vendors' datasheets). A run's FLOPs are ffnlab's own count, the one every result records: `train_flops` (3 x
forward FLOPs per token x tokens, attention over the full context and the output head counted) plus the forward
passes of its evaluations (the validation curve every eval_every steps, the final val, noisy val and test sets).
A study is the preset's default variants x the default seeds.

CPU, measured: `train()` of the preset at its shape and BPE vocabulary on the bundled corpus, at --batch-size
(the preset's own batch needs more memory and patience than 2 cores have), `--steps` steps. ffnlab's step time
is the median of the steps after the first (warm-up). The step at the preset's batch and vocabulary (the
bundled corpus gives fewer BPE tokens than asked) is extrapolated by FLOPs: the seconds per FLOP measured x
the preset's FLOPs per step. One variant per preset (its own FFN): the default variants match parameters, so
their FLOPs per token are within 0.1% of each other.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch

from ffnlab._util.machine import environment
from ffnlab.core.model import Transformer, param_count
from ffnlab.run.config import TrainConfig
from ffnlab.run.presets import PRESETS, preset_config
from ffnlab.run.train import model_flops_per_token, train, train_flops
from ffnlab.study.plan import DEFAULT_SEEDS, DEFAULT_VARIANTS

# dense (no sparsity) bf16 tensor-core peaks, FLOP/s: NVIDIA's A100 (SXM) and H100 (SXM5) datasheets
GPUS = {"A100": 312e12, "H100": 989e12}
LITERATURE = ("gpt2-small", "shazeer")


def forward_flops_per_token(cfg: TrainConfig, ffn: str) -> int:
    """ffnlab's forward FLOPs per token of the preset's model with FFN `ffn`, at its BPE vocabulary (built on the
    meta device: no memory, no time)."""
    with torch.device("meta"):
        model = Transformer(replace(cfg.model, ffn=ffn, vocab_size=cfg.bpe_vocab))
    return model_flops_per_token(model, cfg.model.d_model, cfg.model.n_layers, cfg.model.context, cfg.bpe_vocab)


def parameters(cfg: TrainConfig, ffn: str) -> int:
    with torch.device("meta"):
        return param_count(Transformer(replace(cfg.model, ffn=ffn, vocab_size=cfg.bpe_vocab)))


def evaluated_batches(cfg: TrainConfig) -> int:
    """Batches a run evaluates (forward only): the curve at step 0, every eval_every steps and at the end, the
    FFN probe's pass over the curve's batches, then final_eval_batches of val, noisy val and test."""
    curve = cfg.max_steps // cfg.eval_every + 1 + (cfg.max_steps % cfg.eval_every != 0)
    return (curve + 1) * cfg.eval_batches + 3 * cfg.final_eval_batches


def run_flops(cfg: TrainConfig, per_token: int) -> float:
    """A run's FLOPs: training (3 x forward) and its evaluations' forward passes."""
    tokens_per_batch = cfg.batch_size * cfg.model.context
    return (
        train_flops(per_token, cfg.max_steps * tokens_per_batch) + per_token * evaluated_batches(cfg) * tokens_per_batch
    )


def gpu_rows(mfu: float) -> list[str]:
    """The GPU estimate per preset, Markdown rows."""
    rows = []
    for name in LITERATURE:
        cfg, variants = preset_config(name), PRESETS[name].variants or DEFAULT_VARIANTS
        per_token = {ffn: forward_flops_per_token(cfg, ffn) for ffn in variants}
        flops = {ffn: run_flops(cfg, n) for ffn, n in per_token.items()}
        own = cfg.model.ffn
        tokens = cfg.max_steps * cfg.batch_size * cfg.model.context
        hours = {gpu: flops[own] / (mfu * peak) / 3600 for gpu, peak in GPUS.items()}
        study = {gpu: sum(flops.values()) * DEFAULT_SEEDS / (mfu * peak) / 3600 for gpu, peak in GPUS.items()}
        rows.append(
            f"| `{name}` ({own}) | {parameters(cfg, own) / 1e6:.1f}M | {per_token[own] / 1e6:.0f}M | "
            f"{tokens / 1e9:.2f}B | {flops[own]:.2e} | "
            + " | ".join(f"{hours[gpu]:.1f} h" for gpu in GPUS)
            + f" | {len(variants)} x {DEFAULT_SEEDS}: "
            + ", ".join(f"{study[gpu]:.0f} h {gpu}" for gpu in GPUS)
            + " |"
        )
    return rows


def cpu_row(name: str, batch_size: int, steps: int) -> str:
    """A few steps of the preset on this CPU and the whole run extrapolated from them by FLOPs, a Markdown row."""
    cfg = preset_config(name)
    short = replace(cfg, batch_size=batch_size, max_steps=steps, eval_batches=1, final_eval_batches=1, device="cpu")
    result = train(short)
    step_s = result.costs.step_time_s
    seconds_per_flop = step_s / train_flops(result.costs.flops_per_token, batch_size * cfg.model.context)
    per_token = forward_flops_per_token(cfg, cfg.model.ffn)
    preset_step = seconds_per_flop * train_flops(per_token, cfg.batch_size * cfg.model.context)
    total = seconds_per_flop * run_flops(cfg, per_token)
    return (
        f"| `{name}` ({cfg.model.ffn}, {result.precision}) | {batch_size} x {cfg.model.context}, "
        f"vocab {result.vocab_size:,} | {step_s * 1e3:,.0f} ms | {1 / seconds_per_flop / 1e12:.2f} | "
        f"{preset_step:,.0f} s | {total / 86400:,.0f} days | extrapolated from {steps - 1} steps |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measure", action="store_true", help="also time a few steps of each preset on this CPU")
    p.add_argument("--steps", type=int, default=5, help="steps per measurement, the first untimed (default 5)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per measured step (default 2)")
    p.add_argument("--mfu", type=float, default=0.4, help="the GPU's share of its bf16 peak assumed (default 0.4)")
    args = p.parse_args(argv)
    env = environment()
    print(f"command: python {' '.join(sys.argv)}")
    print(f"date: {datetime.date.today()}  ffnlab {env.get('git_rev')}  torch {torch.__version__}  cpu {env['cpu']}")
    peaks = ", ".join(f"{gpu} {peak / 1e12:.0f} TFLOP/s" for gpu, peak in GPUS.items())
    print(f"\nOne GPU at {args.mfu:.0%} of its dense bf16 peak ({peaks}); FLOPs: ffnlab's count, evaluation included\n")
    print("| preset (FFN) | params | fwd FLOPs/token | tokens | run FLOPs | " + " | ".join(f"{g} / run" for g in GPUS)
          + " | study (variants x seeds) |")  # fmt: skip
    print("|---" * (6 + len(GPUS)) + "|")
    print("\n".join(gpu_rows(args.mfu)))
    if args.measure:
        print(f"\nThis CPU ({torch.get_num_threads()} threads): {args.steps} steps at batch {args.batch_size}\n")
        print("| preset (FFN, precision) | measured batch | ms/step | TFLOP/s | preset's step | run | |")
        print("|---" * 7 + "|")
        for name in LITERATURE:
            print(cpu_row(name, args.batch_size, args.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
