"""Stability and behaviour monitors of a training run, read by the loop in `ffnlab.run.train`.

Gradient statistics of each FFN, gradient-norm and loss spikes against a running median, a loss that blows
up without going non-finite (`BlowupWatch`), an
activation probe for dead units, sparsity and activation scale, and the learned parameters of
learnable activations; `monitor_summary` turns what they saw into a run's `Monitors` record.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ffnlab.core.activations import InputMixture
from ffnlab.core.ffn import DenseFFN, GatedFFN
from ffnlab.run.result import Monitors

SPIKE_WINDOW = 50  # a spike is judged against the median of this many previous values

NamedFFNs = list[tuple[str, DenseFFN | GatedFFN]]


def named_ffns(model: nn.Module) -> NamedFFNs:
    """(name, module) of every dense or gated FFN inside the model (mixed FFNs give their branches),
    the built-in Transformer's or those swapped into a Hugging Face model."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (DenseFFN, GatedFFN))]


def grad_stats(ffns: Iterable[tuple[str, nn.Module]]) -> dict[str, float]:
    """Mean, std and norm of the gradient of each FFN's weights, keyed 'grad_norm/<layer>' etc."""
    out = {}
    for name, ffn in ffns:
        grads = [p.grad.detach().float().flatten() for p in ffn.parameters() if p.grad is not None]
        if grads:
            g = torch.cat(grads)
            out[f"grad_mean/{name}"] = g.mean().item()
            out[f"grad_std/{name}"] = g.std().item()
            out[f"grad_norm/{name}"] = g.norm().item()
    return out


def spike(value: float, history: list[float], factor: float, window: int = SPIKE_WINDOW) -> bool:
    """True when value exceeds `factor` times the median of the last `window` values (>= 10 seen)."""
    recent = history[-window:]
    return len(recent) >= 10 and value > factor * statistics.median(recent)


def spike_events(
    step: int, grad_norm: float, loss: float, hist: dict[str, list[Any]], factor: float
) -> list[dict[str, Any]]:
    """The 'grad_spike' and 'loss_spike' events of a step, judged against the history before it."""
    events = []
    for kind, value, series in (("grad_spike", grad_norm, hist["grad_norm"]), ("loss_spike", loss, hist["train_loss"])):
        if spike(value, series, factor):
            events.append(
                {"step": step, "kind": kind, "value": value, "median": statistics.median(series[-SPIKE_WINDOW:])}
            )
    return events


BEST_WINDOW = 10  # the best loss so far is the lowest median of this many consecutive steps: one lucky batch is no best


@dataclass
class BlowupWatch:
    """Divergence without a NaN: the training loss has stayed above `factor` times its best so far (the lowest
    running median of BEST_WINDOW steps) for `steps` consecutive steps (TrainConfig.diverge_factor, diverge_steps).
    `update` takes the loss history with the new step's loss last; `above` counts the steps above the bound."""

    factor: float
    steps: int
    best: float = math.inf
    above: int = 0

    def update(self, losses: list[float]) -> bool:
        """Whether the run has now blown up, the history `losses` ending with the step just taken."""
        if len(losses) >= BEST_WINDOW:
            self.best = min(self.best, statistics.median(losses[-BEST_WINDOW:]))
        self.above = self.above + 1 if losses[-1] > self.factor * self.best else 0
        return self.above >= self.steps

    def replay(self, losses: list[float]) -> None:
        """The watch's state after `losses` (a resumed run's history)."""
        for i in range(1, len(losses) + 1):
            self.update(losses[max(0, i - BEST_WINDOW) : i])

    def event(self, step: int, loss: float) -> dict[str, Any]:
        """The 'blowup' event of the step it is declared at."""
        return {"step": step, "kind": "blowup", "loss": loss, "best": self.best, "factor": self.factor,
                "since": step - self.above + 1}  # fmt: skip


class ActivationProbe:
    """Forward hooks that record, per FFN, which hidden units ever activate and how large the
    activations are. Recomputes the pre-activation from the FFN's input, so it sees the same
    numbers whether the FFN runs an eager or a fused kernel. For a switch_x FFN it also sums the
    gate's mixture weights over the tokens it sees (`mixture_weights`)."""

    def __init__(self, ffns: Iterable[tuple[str, DenseFFN | GatedFFN]]) -> None:
        self.stats: dict[str, dict[str, Any]] = {}  # name -> sums over the tokens seen (see record)
        self.handles = []
        self.mixtures: dict[str, list[Any]] = {}  # name -> [candidate names, sum of g(h) over tokens, tokens]
        for name, ffn in ffns:
            self.handles.append(ffn.register_forward_pre_hook(functools.partial(self.record, name)))

    @torch.no_grad()
    def record(self, name: str, ffn: DenseFFN | GatedFFN, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].float()
        if isinstance(ffn, GatedFFN):
            x = ffn.gate_input(x)  # normed first where its glu_norm is pre or both
        w = ffn.w_gate if isinstance(ffn, GatedFFN) else ffn.w_in
        pre = nn.functional.linear(x, w.weight.float(), None if w.bias is None else w.bias.float())
        post = ffn.act(pre).flatten(0, -2)  # (tokens, d_ff)
        pre = pre.flatten(0, -2)
        s = self.stats.setdefault(
            name,
            {
                "active": torch.zeros(pre.shape[-1], dtype=torch.bool),
                "n": 0,
                "zero": 0,
                "pos": 0,
                "pre": [0.0, 0.0],
                "post": [0.0, 0.0],
                "max": 0.0,
            },
        )
        s["active"] |= (pre > 0).any(dim=0)
        s["n"] += post.numel()
        s["zero"] += (post == 0).sum().item()
        s["pos"] += (pre > 0).sum().item()
        for key, t in (("pre", pre), ("post", post)):
            s[key][0] += t.sum().item()
            s[key][1] += t.square().sum().item()
        hidden = post * ffn.w_up(x).flatten(0, -2) if isinstance(ffn, GatedFFN) else post
        s["max"] = max(s["max"], hidden.abs().max().item())
        if isinstance(ffn.act, InputMixture):
            with torch.autocast(pre.device.type, enabled=False):  # fp32 weights that sum to 1, under bf16 too
                weights = ffn.act.weights(pre.float())  # (tokens, n_acts)
            total = self.mixtures.setdefault(name, [ffn.act.names, torch.zeros(weights.shape[-1]), 0])
            total[1] += weights.sum(dim=0)
            total[2] += weights.shape[0]

    def mixture_weights(self) -> dict[str, dict[str, float]]:
        """Per switch_x FFN, its gate's weight of each candidate averaged over every token seen."""
        return {name: dict(zip(acts, (total / n).tolist())) for name, (acts, total, n) in self.mixtures.items()}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per FFN: dead units (never active), zero and inactive fractions, pre- and
        post-activation std, and the largest hidden activation."""
        out = {}
        for name, s in self.stats.items():
            n = s["n"]
            std = {k: math.sqrt(max(0.0, s[k][1] / n - (s[k][0] / n) ** 2)) for k in ("pre", "post")}
            out[name] = {
                "dead_frac": 1.0 - s["active"].float().mean().item(),
                "zero_frac": s["zero"] / n,
                "inactive_frac": 1.0 - s["pos"] / n,
                "std_pre": std["pre"],
                "std_post": std["post"],
                "max_abs_hidden": s["max"],
            }
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def learned_params(
    ffns: Iterable[tuple[str, nn.Module]], mixtures: dict[str, dict[str, float]] | None = None
) -> dict[str, dict[str, Any]]:
    """Per FFN layer, the learned parameters of its activation: {"beta": 1.3}, {"tau": 0.9}, or a
    switch's mixture {"weights": {"relu": 0.2, ...}}; layers without any are left out. A switch_x
    layer's gate depends on the token, so its "weights" are the average over the evaluated tokens,
    `mixtures` (`ActivationProbe.mixture_weights`), and its gate matrix is not listed."""
    out = {}
    for name, ffn in ffns:
        act = getattr(ffn, "act", None)
        if act is None:
            continue
        if isinstance(act, InputMixture):
            if mixtures and name in mixtures:
                out[name] = {"weights": mixtures[name]}
            continue
        values = {}
        for pname, p in act.named_parameters(recurse=False):
            if pname == "logits" and hasattr(act, "names"):  # a switch: its softmax weights by activation
                values["weights"] = dict(zip(act.names, torch.softmax(p.detach().float(), 0).tolist()))
            else:
                values[pname] = p.detach().float().tolist()
        if values:
            out[name] = values
    return out


def ffn_grad_average(grad_rows: list[dict[str, float]], stat: str) -> float | None:
    """Mean over logged steps and layers of one FFN gradient statistic, 'grad_mean' or 'grad_std'
    (None if nothing was logged)."""
    values = [v for row in grad_rows for k, v in row.items() if k.startswith(stat + "/") and math.isfinite(v)]
    return statistics.mean(values) if values else None


def monitor_summary(
    hist: dict[str, list[Any]],
    behaviour: dict[str, dict[str, float]],
    ffns: NamedFFNs,
    mixtures: dict[str, dict[str, float]] | None = None,
) -> Monitors:
    """What the monitors saw of a run: spike counts, the largest gradient norm, FFN gradient statistics,
    behaviour and its mean dead fraction, and the learned activation parameters (with switch_x's mean
    mixture weights, `mixtures`)."""
    return Monitors(
        n_grad_spikes=sum(e["kind"] == "grad_spike" for e in hist["events"]),
        n_loss_spikes=sum(e["kind"] == "loss_spike" for e in hist["events"]),
        max_grad_norm=max(hist["grad_norm"], default=None),
        ffn_grad_mean=ffn_grad_average(hist["grad_ffn"], "grad_mean"),
        ffn_grad_std=ffn_grad_average(hist["grad_ffn"], "grad_std"),
        behaviour=behaviour,
        dead_frac=statistics.mean(b["dead_frac"] for b in behaviour.values()) if behaviour else None,
        learned=learned_params(ffns, mixtures),
    )
