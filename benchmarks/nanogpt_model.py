"""nanoGPT's own model, imported from a checkout in a process of its own, for the benchmarks beside nanoGPT.

    python benchmarks/nanogpt_model.py eval --nanogpt DIR --checkpoint CKPT --batches FILE
    python benchmarks/nanogpt_model.py train --nanogpt DIR --config JSON --batches FILE

`eval`: the loss of nanoGPT's checkpoint (train.py's ckpt.pt, loaded with `weights_only=True`: it holds
plain dicts, numbers and tensors) on ffnlab's fixed validation batches, which FILE holds in nanoGPT's
token ids. `train`: nanoGPT's GPT module, built with its own initialisation and no biases (train.py's
`bias=False`), trained by ffnlab's loop on the run config JSON and evaluated on FILE's batches in
ffnlab's token ids: what nanoGPT's model alone does to the loss, with every other part ffnlab's.
Each prints one JSON line. DIR is put on sys.path in this process only, so nothing of nanoGPT is
copied into this repository and its top-level `model` module meets nothing of ours.

`mean_loss` is the one evaluation both sides' final losses come from (the benchmarks import it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn


@torch.no_grad()
def mean_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean next-token cross-entropy of `model(idx, targets) -> (logits, loss)` over batches x[i], y[i]
    ((n_batches, B, T) each), in fp32: ffnlab's `evaluate` for equal-sized batches, for any such module."""
    model.eval()
    return sum(model(xb, yb)[1].float().item() for xb, yb in zip(x, y)) / len(x)


def load_gpt(nanogpt: Path, checkpoint: Path) -> tuple[nn.Module, dict]:
    """nanoGPT's GPT with the checkpoint's weights, and the checkpoint (without the weights)."""
    sys.path.insert(0, str(nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt.pop("model").items()}  # a compiled run's keys
    model.load_state_dict(state)
    return model, ckpt


class GPTInLoop(nn.Module):
    """nanoGPT's GPT as ffnlab's loop takes a model: forward(idx, targets) -> (logits, loss), and `cfg`."""

    def __init__(self, nanogpt: Path, mcfg) -> None:
        super().__init__()
        sys.path.insert(0, str(nanogpt))
        from model import GPT, GPTConfig  # nanoGPT's model.py

        self.cfg = mcfg  # what ffnlab's cost accounting reads (d_model, n_layers)
        shape = {"n_layer": mcfg.n_layers, "n_head": mcfg.n_heads, "n_embd": mcfg.d_model, "block_size": mcfg.context}
        self.gpt = GPT(GPTConfig(**shape, vocab_size=mcfg.vocab_size, dropout=mcfg.dropout, bias=False))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.gpt(idx, targets)


def train_gpt(nanogpt: Path, config: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Train nanoGPT's GPT with ffnlab's loop on `config` (a TrainConfig as a dict); its loss on (x, y)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not
    from ffnlab.run.config import TrainConfig
    from ffnlab.run.train import train

    built = []

    def build(mcfg, seed: int) -> nn.Module:
        built.append(GPTInLoop(nanogpt, mcfg))
        return built[-1]

    result = train(TrainConfig.from_dict(config), model_factory=build)
    return {
        "loss": mean_loss(built[-1], x, y),
        "own_loss": result.val.loss,
        "train_s": result.costs.train_seconds,
        "status": result.status,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("eval", "train"))
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (outside this repository)")
    parser.add_argument("--batches", type=Path, required=True, help="a torch.save'd dict of (n, B, T) tensors")
    parser.add_argument("--checkpoint", type=Path, help="eval: nanoGPT's ckpt.pt")
    parser.add_argument("--config", help="train: the ffnlab TrainConfig as JSON")
    args = parser.parse_args()
    batches = torch.load(args.batches, weights_only=True)
    if args.mode == "eval":
        model, ckpt = load_gpt(args.nanogpt, args.checkpoint)
        out = {
            "loss": mean_loss(model, batches["nanogpt_x"], batches["nanogpt_y"]),
            "iter_num": ckpt["iter_num"],
            "own_val_loss": float(ckpt["best_val_loss"]),  # nanoGPT's estimate at its last evaluation
        }
    else:
        out = train_gpt(args.nanogpt, json.loads(args.config), batches["ffnlab_x"], batches["ffnlab_y"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
