"""What makes ffnlab learn faster per step than nanoGPT on nanoGPT's CPU recipe: each difference between the
two recipes switched to nanoGPT's choice, one run each, against the gap at equal steps and equal evaluation.

    python benchmarks/nanogpt_recipe_gap.py --nanogpt DIR [--iters 2000] [--precision fp32] [--smoke]

Runs, one after another: nanoGPT's train.py for --iters, its checkpoint evaluated on ffnlab's fixed
validation batches (as benchmarks/nanogpt_side_by_side.py does); ffnlab's recipe for the same steps with
seed 0, and with seed 1 (the spread between two seeds: a row that moves the loss less than that is not
resolved by one run); ffnlab with each of DIFFERENCES alone switched to nanoGPT's choice; the model's
differences at once; all of them at once; and nanoGPT's GPT module itself trained by ffnlab's loop
(nanogpt_model.py, in a process of its own: nanoGPT's model with ffnlab's schedule, data and loop).
Every loss is `mean_loss` on the same batches in fp32.

The table: difference, ffnlab's choice, nanoGPT's, the final loss with it switched, and the gap closed,
(loss - ffnlab's) in nats and as a share of (nanoGPT's - ffnlab's). The evaluation needs no run: above the
table, the gap as first reported (each side's own evaluation) and the part of it that evaluation made
(nanoGPT's own estimate on 20 random batches against its loss on ffnlab's batches). What is the same on both sides (SAME)
and what differs but is not switched (NOT_SWITCHED) is listed with the reason.

ffnlab's code is not edited: the model is changed by a model factory (initialisation, biases), and the
schedule by putting nanoGPT's formula in place of `ffnlab.run.train.lr_at` for that run
(unittest.mock.patch). Ten runs of --iters steps: about 20 minutes at 2000 on a quiet 2-core CPU.
A benchmark, not a test: the losses hardly depend on the machine (rounding), but each row is one run of one seed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

import torch
from compare_default import machine
from nanogpt_side_by_side import ffnlab_config, last_json_line, prepare, run_ffnlab, run_nanogpt, save_eval_batches
from torch import nn
from train_speed import RECIPE

import ffnlab.run.train
from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.run.config import TrainConfig

HERE = Path(__file__).resolve().parent


@torch.no_grad()
def nanogpt_ffn_init(model: Transformer, seed: int) -> None:
    """The FFN weights drawn as nanoGPT draws its MLP's: normal(0, 0.02), the output projection (its
    residual c_proj) 0.02 / sqrt(2 n_layers); biases stay zero."""
    gen = torch.Generator().manual_seed(seed)
    for block in model.blocks:
        block.ffn.w_in.weight.normal_(0.0, 0.02, generator=gen)
        block.ffn.w_out.weight.normal_(0.0, 0.02 / math.sqrt(2 * model.cfg.n_layers), generator=gen)


def no_linear_biases(model: nn.Module, seed: int) -> None:
    """Every Linear without its bias (nanoGPT's bias=False)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.bias = None


def no_layernorm_biases(model: nn.Module, seed: int) -> None:
    """Every LayerNorm without its bias (nanoGPT's bias=False)."""
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.bias = None


def nanogpt_lr(progress: float, step: int, cfg: TrainConfig) -> float:
    """nanoGPT's learning rate (train.py's get_lr, with lr_decay_iters the run's steps) in `lr_at`'s place:
    warm-up lr (step + 1) / (warmup + 1), then cosine from lr to min_lr over the steps after the warm-up."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    decay = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, decay))) * (cfg.lr - cfg.min_lr)


@dataclass(frozen=True)
class Difference:
    """One way nanoGPT's run differs from ffnlab's, and how ffnlab's run is switched to nanoGPT's choice."""

    name: str
    ffnlab: str
    nanogpt: str
    model: Callable[[nn.Module, int], None] | None = None  # changes the built model in place: (model, seed)
    schedule: Callable[[float, int, TrainConfig], float] | None = None  # in place of ffnlab.run.train.lr_at


DIFFERENCES = (
    Difference(
        "FFN initialisation",
        "LeCun normal: W_in std 1/sqrt(128) = 0.088, W_out 1/sqrt(512) = 0.044",
        "normal(0, 0.02); W_out (c_proj) 0.02/sqrt(2 n_layer) = 0.0071",
        model=nanogpt_ffn_init,
    ),
    Difference(
        "Linear biases",
        "on: attention qkv and output, FFN W_in and W_out",
        "none (train.py's bias=False; the Shakespeare config keeps it)",
        model=no_linear_biases,
    ),
    Difference("LayerNorm bias", "on", "none (bias=False)", model=no_layernorm_biases),
    Difference(
        "learning-rate schedule",
        "warm-up lr (s+1)/100; cosine over s/N from step 0",
        "warm-up lr (s+1)/101; cosine over (s-100)/(N-100)",
        schedule=nanogpt_lr,
    ),
)
SAME = (
    ("weight-decay groups", "tensors of 2+ dims decay (matrices, both embeddings, tied once); biases and norms do not"),
    ("other initialisation", "embeddings and attention normal(0, 0.02), attention output 0.02/sqrt(2 n_layer), "
     "biases 0, LayerNorm 1 and 0"),
    ("architecture", "pre-norm, learned positions, tied embeddings, exact GELU, 4x FFN (512), causal SDPA, "
     "LayerNorm eps 1e-5, no dropout"),
    ("optimiser", "AdamW (0.9, 0.99), eps 1e-8, weight decay 0.1, clip 1.0 (ffnlab's fused kernel, nanoGPT's "
     "one tensor at a time on a CPU: the same arithmetic up to rounding)"),
    ("data", "the same 90/10 text; uniform random windows of 64 tokens, batch 12; steps: nanoGPT's checkpoint "
     "holds iterations 0..N-1 (it runs one more after saving), as many as ffnlab's N"),
)  # fmt: skip
NOT_SWITCHED = (
    ("random streams", "seed 0 (weights drawn per parameter name, data order)", "torch.manual_seed(1337)",
     "not the same stream in any case: the seed 1 row gives the spread"),
    ("vocabulary", "66 ids: the 65 characters and <unk>", "65", "<unk> never occurs; its row in the tied "
     "embedding only learns a low logit (the nanoGPT-in-ffnlab's-loop row has it too)"),
    ("evaluation", "its fixed validation batches (final_eval_batches)", "20 random validation batches",
     "made equal: every loss here is on ffnlab's batches; the line above the table shows what it changed"),
)  # fmt: skip


def build_with(changes: tuple[Difference, ...]) -> Callable[[ModelConfig, int], nn.Module]:
    """A model factory: ffnlab's Transformer with the changes' model switches applied."""

    def build(mcfg: ModelConfig, seed: int) -> nn.Module:
        model = Transformer(mcfg, seed)
        for change in changes:
            if change.model is not None:
                change.model(model, seed)
        return model

    return build


def run_changed(cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, changes: tuple[Difference, ...]) -> float:
    """The loss on (x, y) of ffnlab's run `cfg` with `changes` switched to nanoGPT's choices."""
    schedules = [c.schedule for c in changes if c.schedule is not None]
    patch = mock.patch.object(ffnlab.run.train, "lr_at", schedules[0]) if schedules else contextlib.nullcontext()
    with patch:
        return run_ffnlab(cfg, x, y, factory=build_with(changes)).loss


def run_gpt_in_loop(nanogpt: Path, cfg: TrainConfig, batches: Path) -> float:
    """The loss of nanoGPT's GPT module trained by ffnlab's loop on `cfg` (nanogpt_model.py's `train`)."""
    out = subprocess.run(
        [sys.executable, str(HERE / "nanogpt_model.py"), "train", "--nanogpt", str(nanogpt),
         "--config", json.dumps(cfg.to_dict()), "--batches", str(batches)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return last_json_line(out)["loss"]


def table(rows: list[dict], base: float, nano: float) -> str:
    """The Markdown table of the rows, gap closed against ffnlab's loss `base` and nanoGPT's `nano`."""
    lines = ["| difference | ffnlab | nanoGPT | loss, switched to nanoGPT's | gap closed |", "|---|---|---|---|---|"]
    for row in rows:
        closed = row["loss"] - base
        share = f" ({closed / (nano - base):.0%})" if nano != base else ""
        lines.append(
            f"| {row['name']} | {row['ffnlab']} | {row['nanogpt']} | {row['loss']:.4f} | {closed:+.4f}{share} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", required=True, type=Path, help="a nanoGPT checkout (outside this repository)")
    parser.add_argument("--iters", type=int, default=2000, help="steps of every run, both sides")
    parser.add_argument("--precision", default="fp32", help="ffnlab's precision (nanoGPT's CPU recipe is fp32)")
    parser.add_argument("--smoke", action="store_true", help="toy budgets (10 steps), to check the plumbing")
    args = parser.parse_args()
    recipe = replace(RECIPE, final_eval_batches=4) if args.smoke else RECIPE
    iters = 10 if args.smoke else args.iters
    print("command: python benchmarks/nanogpt_recipe_gap.py " + " ".join(sys.argv[1:]))
    print("machine:", json.dumps(machine()), flush=True)
    data = prepare(args.nanogpt)
    cfg = ffnlab_config(recipe, data, iters, args.precision, compile=False)
    rows = []

    def record(name: str, ffnlab_choice: str, nanogpt_choice: str, loss: float) -> None:
        rows.append({"name": name, "ffnlab": ffnlab_choice, "nanogpt": nanogpt_choice, "loss": loss})
        print(f"{name}: {loss:.4f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="ffnlab-nanogpt-") as tmp:
        work = Path(tmp)
        x, y = save_eval_batches(recipe, args.nanogpt, data, work / "batches.pt")
        nanogpt = run_nanogpt(args.nanogpt, iters, work)
        print(nanogpt.line(), flush=True)
        ffnlab = run_ffnlab(cfg, x, y)
        print(ffnlab.line(), flush=True)
        spread = run_ffnlab(replace(cfg, seed=1), x, y).loss
        record("seed: the spread between two, not a difference", "seed 0", "(ffnlab's recipe, seed 1)", spread)
        for change in DIFFERENCES:
            record(change.name, change.ffnlab, change.nanogpt, run_changed(cfg, x, y, (change,)))
        model_changes = tuple(c for c in DIFFERENCES if c.model is not None)
        names = ", ".join(c.name for c in model_changes)
        record("the model's at once", "as above", names, run_changed(cfg, x, y, model_changes))
        record("all at once", "as above", "every row above", run_changed(cfg, x, y, DIFFERENCES))
        gpt = run_gpt_in_loop(args.nanogpt, cfg, work / "batches.pt")
        record("nanoGPT's model itself, in ffnlab's loop", "Transformer", "GPT from model.py", gpt)
    gap = nanogpt.loss - ffnlab.loss
    first = nanogpt.own_loss - ffnlab.own_loss
    print(f"\ngap as first reported (each side's own evaluation): nanoGPT {nanogpt.own_loss:.4f} - ffnlab "
          f"{ffnlab.own_loss:.4f} = {first:+.4f}; evaluation made {first - gap:+.4f} of it (nanoGPT's 20 random "
          f"batches against ffnlab's {recipe.final_eval_batches} fixed ones)")  # fmt: skip
    print(f"gap at equal evaluation, after {iters} steps: nanoGPT {nanogpt.loss:.4f} - ffnlab {ffnlab.loss:.4f} "
          f"= {gap:+.4f}; each row: ffnlab's run with that switched to nanoGPT's choice\n")  # fmt: skip
    print(table(rows, ffnlab.loss, nanogpt.loss))
    print("\nthe same on both sides: " + "; ".join(f"{name}: {what}" for name, what in SAME))
    print(
        "differs, not switched: " + "; ".join(f"{n} (ffnlab {f}, nanoGPT {g}): {why}" for n, f, g, why in NOT_SWITCHED)
    )
    print(json.dumps({"iters": iters, "precision": args.precision, "nanogpt": nanogpt.loss,
                      "nanogpt_own": nanogpt.own_loss, "ffnlab": ffnlab.loss, "ffnlab_own": ffnlab.own_loss,
                      "gap": gap, "gap_own": first, "rows": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
