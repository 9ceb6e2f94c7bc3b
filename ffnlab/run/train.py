"""One training run: `train(config) -> result`, a loop that reads top to bottom.

AdamW, linear warm-up then cosine decay, gradient clipping, evaluation every `eval_every` steps
on a fixed held-out set (the same batches for every variant and seed), budgets by steps, tokens
or seconds, bf16 autocast as an option, safetensors checkpoints that resume to the same result,
and stability monitors: gradient statistics of each FFN, gradient-norm and loss spikes, the
first non-finite step (the run ends as `diverged`), dead units, sparsity, activation scale, and
validation loss with noise on the embeddings.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ffnlab._util.machine import bf16_native
from ffnlab.core.ffn import DenseFFN, GatedFFN, ffn_flops_per_token
from ffnlab.core.memory import saved_bytes, training_memory
from ffnlab.core.model import ModelConfig, Transformer, param_count
from ffnlab.run.config import RunResult, TrainConfig

EVAL_SEED = 1234  # fixed, so every variant and seed is evaluated on the same batches


# ---- data -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def load_data(data: str, task: str, tokenizer: str, bpe_vocab: int, text_field: str, label_field: str):
    """Corpus -> tokenizer and token tensors per split, cached per process for sweeps."""
    from ffnlab.run.data import load_corpus
    from ffnlab.run.tokenizer import build_tokenizer

    corpus = load_corpus(data, task=task, text_field=text_field, label_field=label_field)
    all_text = corpus.train + corpus.val + corpus.test
    tok = build_tokenizer(
        tokenizer,
        all_text if tokenizer == "char" else corpus.train,
        vocab_size=bpe_vocab if tokenizer == "bpe" else None,
    )
    splits = {}
    for split in ("train", "val", "test"):
        if task == "lm":
            splits[split] = torch.from_numpy(tok.encode_array(corpus.text(split)))
        else:
            docs = [torch.tensor(tok.encode(t), dtype=torch.long) for t in getattr(corpus, split)]
            splits[split] = (docs, torch.tensor(getattr(corpus, f"{split}_labels"), dtype=torch.long))
    return corpus, tok, splits


def has_window(split_data, task: str, context: int) -> bool:
    """Whether a split can give one example: a window of `context + 1` tokens, or a labelled document."""
    return len(split_data) > context + 1 if task == "lm" else len(split_data[0]) > 0


def check_data(splits, task: str, context: int, data: str):
    """ValueError when the train or val split is too small to give one example."""
    for split in ("train", "val"):
        if has_window(splits[split], task, context):
            continue
        if task == "lm":
            raise ValueError(
                f"the {split} split of '{data}' has {len(splits[split])} tokens, fewer than one context "
                f"window ({context + 1}); use more text or a smaller --context"
            )
        raise ValueError(f"the {split} split of '{data}' has no labelled examples")


def machine_memory(device: str) -> int:
    """Bytes of memory the run can use at most: the GPU's, or this machine's physical RAM."""
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(cfg: TrainConfig, mcfg: ModelConfig, device: str):
    """ValueError, before anything is allocated, when the built-in model cannot train on this machine:
    sizes that overflow, or more memory than it has for fp32 weights, gradients and AdamW's two
    moments (16 bytes a parameter) plus a floor on the activations backward keeps (ten fp32
    (batch, context, d_model) tensors a layer)."""
    try:
        with torch.device("meta"):  # shapes only: nothing is allocated
            n_params = param_count(Transformer(mcfg, cfg.seed))
    except (RuntimeError, OverflowError) as e:
        raise ValueError(
            f"the model's sizes overflow ({str(e).splitlines()[0][:120]}); use a smaller --d-model, "
            "--layers or --context"
        ) from None
    need = 16 * n_params + 40 * cfg.batch_size * mcfg.context * mcfg.d_model * mcfg.n_layers
    have = machine_memory(device)
    if need > have:
        raise ValueError(
            f"{mcfg.n_layers} layers of d_model {mcfg.d_model} ({n_params:,} parameters) at batch "
            f"{cfg.batch_size} x context {mcfg.context} need at least {need / 2**30:,.1f} GiB, more than "
            f"the {have / 2**30:,.1f} GiB here; use a smaller --d-model, --layers or --batch-size"
        )


def fit(ids: torch.Tensor, length: int, start: int = 0) -> torch.Tensor:
    """A window of `length` tokens from `ids` at `start`; short texts are repeated to fill it
    (no padding token or mask needed for the pooled classifier)."""
    if len(ids) == 0:
        ids = torch.zeros(1, dtype=torch.long)
    if len(ids) < length:
        ids = ids.repeat(length // len(ids) + 1)
    return ids[start : start + length]


def get_batch(split_data, task: str, batch_size: int, context: int, gen: torch.Generator):
    """Random (x, y): LM windows with next-token targets, or classification crops and labels."""
    if task == "lm":
        ix = torch.randint(len(split_data) - context - 1, (batch_size,), generator=gen)
        windows = split_data[ix[:, None] + torch.arange(context + 1)]  # (B, T+1): one gather, not B slices
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T) each
    docs, labels = split_data
    ix = torch.randint(len(docs), (batch_size,), generator=gen)
    starts = [int(torch.randint(max(1, len(docs[i]) - context + 1), (1,), generator=gen)) for i in ix]
    return torch.stack([fit(docs[i], context, s) for i, s in zip(ix, starts)]), labels[ix]


def eval_set(split_data, task: str, n_batches: int, batch_size: int, context: int):
    """The fixed evaluation batches: LM windows drawn with EVAL_SEED; for classification
    n_batches * batch_size examples evenly spaced over the split (first window of each)."""
    if task == "lm":
        gen = torch.Generator().manual_seed(EVAL_SEED)
        return [get_batch(split_data, task, batch_size, context, gen) for _ in range(n_batches)]
    docs, labels = split_data
    pick = torch.linspace(0, len(docs) - 1, min(len(docs), n_batches * batch_size)).long().unique()
    x = torch.stack([fit(docs[i], context) for i in pick])
    y = labels[pick]
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(pick), batch_size)]


# ---- schedule and optimiser ---------------------------------------------------------------------


def lr_at(progress: float, step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from lr to min_lr (lr/10 unless set) as
    progress goes 0 -> 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    min_lr = cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: str) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (>= 2 dims) only; fused where the build supports it."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=True)
    except (RuntimeError, TypeError):  # fused AdamW not built for this device
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))


# ---- monitors -----------------------------------------------------------------------------------


def ffn_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every dense or gated FFN inside the model (mixed FFNs give their branches),
    the built-in Transformer's or those swapped into a Hugging Face model."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (DenseFFN, GatedFFN))]


def grad_stats(ffns) -> dict[str, float]:
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


class ActivationProbe:
    """Forward hooks that record, per FFN, which hidden units ever activate and how large the
    activations are. Recomputes the pre-activation from the FFN's input, so it sees the same
    numbers whether the FFN runs an eager or a fused kernel."""

    def __init__(self, ffns):
        self.stats, self.handles = {}, []
        for name, ffn in ffns:
            self.handles.append(ffn.register_forward_pre_hook(functools.partial(self.record, name)))

    @torch.no_grad()
    def record(self, name, ffn, inputs):
        x = inputs[0].float()
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

    def summary(self) -> dict[str, dict]:
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

    def remove(self):
        for h in self.handles:
            h.remove()


def spike(value: float, history: list[float], factor: float, window: int = 50) -> bool:
    """True when value exceeds `factor` times the median of the last `window` values (>= 10 seen)."""
    recent = history[-window:]
    return len(recent) >= 10 and value > factor * statistics.median(recent)


def model_flops_per_token(model: nn.Module, d_model: int, n_layers: int, context: int, n_out: int) -> int:
    """Forward FLOPs per token: attention projections and scores over the full context, every FFN
    built by `build_ffn` (by its formula), and the output head of n_out logits."""
    attn = n_layers * (2 * 4 * d_model * d_model + 2 * 2 * context * d_model)
    ffn = sum(
        ffn_flops_per_token(m.spec, d_model, m.d_ff, any(n.endswith("bias") for n, _ in m.named_parameters()))
        for m in model.modules()
        if hasattr(m, "spec") and hasattr(m, "d_ff")
    )
    return attn + ffn + 2 * d_model * n_out


def hf_factory(hf_config: dict):
    """model_factory building a Hugging Face architecture from its config with the FFN swapped."""
    from ffnlab.tools.hf import build_hf_model

    def build(mcfg: ModelConfig, seed: int):
        return build_hf_model(
            hf_config,
            mcfg.ffn,
            match=mcfg.ffn_match,
            seed=seed,
            vocab_size=mcfg.vocab_size,
            context=mcfg.context,
            task=mcfg.task,
            n_classes=mcfg.n_classes,
            init=mcfg.init,
        )

    return build


def learned_params(ffns) -> dict[str, dict]:
    """Per FFN layer, the learned parameters of its activation: {"beta": 1.3}, {"tau": 0.9}, or a
    switch's mixture {"weights": {"relu": 0.2, ...}}; layers without any are left out."""
    out = {}
    for name, ffn in ffns:
        act = getattr(ffn, "act", None)
        if act is None:
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


def ffn_grad_summary(grad_rows: list[dict]) -> dict[str, float | None]:
    """Mean over logged steps and layers of the FFN gradient's mean and std (None if nothing logged)."""
    out = {}
    for stat in ("grad_mean", "grad_std"):
        values = [v for row in grad_rows for k, v in row.items() if k.startswith(stat + "/") and math.isfinite(v)]
        out[f"ffn_{stat}"] = statistics.mean(values) if values else None
    return out


def step_saved_bytes(model: nn.Module, x, y, autocast) -> int:
    """Bytes autograd keeps for backward in one training forward pass of the eager model on (x, y);
    the graph is dropped unused and the RNG left as it was (dropout draws would shift it)."""
    state = torch.get_rng_state()
    try:
        with autocast():
            return saved_bytes(lambda: model(x, y), exclude=model.parameters())
    finally:
        torch.set_rng_state(state)


# ---- checkpoints --------------------------------------------------------------------------------


def save_weights(model: nn.Module, path: Path):
    """Weights as safetensors, written to a temporary name and renamed (never half-written)."""
    from safetensors.torch import save_model

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_model(model, str(tmp))
    os.replace(tmp, path)


def save_checkpoint(directory: Path, model: nn.Module, state: dict):
    """Weights to safetensors and trainer state to a torch file, each written to a temporary
    name and renamed; `latest.json` is switched last, so a kill leaves the previous pair usable."""
    step = state["step"]
    save_weights(model, directory / f"model-{step}.safetensors")
    tmp = directory / f"state-{step}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, directory / f"state-{step}.pt")
    tmp = directory / "latest.json.tmp"
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, directory / "latest.json")
    for old in directory.glob("*-*.*"):  # older pairs are no longer needed
        if old.stem.split("-")[-1] != str(step) and not old.name.endswith(".tmp"):
            old.unlink(missing_ok=True)


def load_checkpoint(directory: Path, model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> dict | None:
    """Resume from the latest checkpoint: weights into `model`, optimizer state, data and torch RNG;
    returns the trainer state, or None when there is no checkpoint.

    A checkpoint that cannot be read or applied whole (truncated, not safetensors, a pickle that
    weights_only refuses, weights of another model) is discarded with a warning naming it, and
    DamagedCheckpoint is raised: `model` and `opt` may be half-set, so the caller starts from a
    fresh model at step 0, which ends with the same result as an uninterrupted run.
    """
    from safetensors.torch import load_model

    latest = directory / "latest.json"
    if not latest.exists():
        return None
    try:
        step = int(json.loads(latest.read_text())["step"])
        state = torch.load(directory / f"state-{step}.pt", weights_only=True)
        if not isinstance(state, dict) or state.get("step") != step:
            raise ValueError(f"state-{step}.pt is not the trainer state of step {step}")
        load_model(model, str(directory / f"model-{step}.safetensors"), strict=True)
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
    except Exception as e:  # any damage: a resumed run must not fail on it forever
        warnings.warn(
            f"discarding the unreadable checkpoint in {directory} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else '-'}); the run starts again from step 0",
            CheckpointWarning,
            stacklevel=2,
        )
        for stale in directory.glob("*"):
            if stale.is_file():
                stale.unlink(missing_ok=True)
        raise DamagedCheckpoint(str(directory)) from None
    return state


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and was discarded."""


class DamagedCheckpoint(Exception):
    """Raised by load_checkpoint after discarding a checkpoint it could not read."""


# ---- the run ------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model, batches, task: str, autocast, noise_std: float = 0.0) -> dict:
    """Mean loss (and accuracy for classification) over fixed batches; with noise_std, Gaussian
    noise of that std is added to the token embeddings (the same noise for every variant)."""
    model.eval()
    losses, correct, n = [], 0, 0
    rng_state = torch.get_rng_state()
    hook = None
    if noise_std:
        torch.manual_seed(EVAL_SEED)
        hook = token_embedding(model).register_forward_hook(lambda m, i, out: out + noise_std * torch.randn_like(out))
    try:
        for x, y in batches:
            with autocast():
                logits, loss = model(x, y)
            losses.append(loss.float().item() * len(y))
            n += len(y)
            if task == "cls":
                correct += (logits.argmax(-1) == y).sum().item()
    finally:
        if hook is not None:
            hook.remove()
        torch.set_rng_state(rng_state)
        model.train()
    out = {"loss": sum(losses) / n}
    if task == "cls":
        out["acc"] = correct / n
    return out


def token_embedding(model: nn.Module) -> nn.Embedding:
    """The token embedding: the first nn.Embedding, in ffnlab's Transformer and in Hugging Face
    models alike (it is registered before position embeddings)."""
    return next(m for m in model.modules() if isinstance(m, nn.Embedding))


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; valid here: cpu, auto")
    return device


def resolve_precision(precision: str, device: str) -> str:
    """'auto' -> 'bf16' where bf16 matmuls are native (`bf16_native`: a CUDA GPU with bf16, a CPU with
    AMX or AVX512_BF16), else 'fp32'.

    bf16 autocast trains 1.38x faster than fp32 on this project's AMX Xeon (benchmarks/train_speed.md)
    and 1.51x on an AVX512_BF16 EPYC (Zen 4), with final losses within 1e-3 nats, less than the spread
    between two seeds (README, "The default study"); on an AVX2-only CPU it is emulated and ~40x
    slower. A 'cuda' or 'auto' device on a machine without CUDA stays 'auto': the machine that runs it
    decides.
    """
    if precision != "auto":
        return precision
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "bf16" if bf16_native("cpu") else "fp32"
    if not torch.cuda.is_available():
        return "auto"
    return "bf16" if bf16_native("cuda") else "fp32"


def train(
    cfg: TrainConfig, progress=None, model_factory=None, weights_path: str | os.PathLike | None = None
) -> RunResult:
    """Run one training and return what it measured.

    `progress(step, total, metrics)` is called after every step (for a progress bar).
    `model_factory(model_cfg, seed) -> nn.Module` replaces the built-in Transformer (by default a
    Hugging Face architecture when `cfg.hf_config` is set); the module must take (idx, targets)
    and return (logits, loss).
    `weights_path`: where to write the final weights (safetensors) of a finished run.
    A run that hits a non-finite loss or gradient ends with status 'diverged'; it never raises.
    """
    t_start = time.perf_counter()
    device = resolve_device(cfg.device)
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device))  # the stored config says what ran
    task = cfg.model.task
    if cfg.threads:  # NOTE: on a shared machine one thread per run beats two fighting for cores (train_speed.md)
        torch.set_num_threads(cfg.threads)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    # -- data and model
    corpus, tok, splits = load_data(cfg.data, task, cfg.tokenizer, cfg.bpe_vocab, cfg.text_field, cfg.label_field)
    mcfg = replace(
        cfg.model, vocab_size=tok.vocab_size, n_classes=len(corpus.classes) if task == "cls" else cfg.model.n_classes
    )
    check_data(splits, task, mcfg.context, cfg.data)
    if model_factory is None and not cfg.hf_config:
        check_fits(cfg, mcfg, device)
    if model_factory is None:
        model_factory = hf_factory(cfg.hf_config) if cfg.hf_config else Transformer

    def build():
        torch.manual_seed(cfg.seed)
        model = model_factory(mcfg, cfg.seed).to(device)
        gen = torch.Generator().manual_seed(cfg.seed)  # data order: same for every variant with this seed
        return model, make_optimizer(model, cfg, device), gen

    model, opt, gen = build()
    val_batches = [
        (x.to(device), y.to(device))
        for x, y in eval_set(splits["val"], task, cfg.eval_batches, cfg.batch_size, mcfg.context)
    ]
    tokens_per_step = cfg.batch_size * mcfg.context
    total = math.ceil(cfg.max_tokens / tokens_per_step) if cfg.max_tokens else cfg.max_steps
    autocast = functools.partial(
        torch.autocast, device_type=device, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"
    )

    # -- resume
    hist = {"train_loss": [], "grad_norm": [], "val": [], "grad_ffn": [], "events": [], "step_time": []}
    step, elapsed, status = 0, 0.0, "finished"
    ckpt_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if ckpt_dir is not None:
        try:
            state = load_checkpoint(ckpt_dir, model, opt, gen)
        except DamagedCheckpoint:  # discarded with a warning: a fresh model, as if never started
            model, opt, gen = build()
            state = None
        if state is not None:
            step, elapsed, hist = state["step"], state["elapsed"], state["hist"]
    ffns = ffn_modules(model)
    # NOTE: static shapes: else a second shape in one process (a sweep) recompiles for symbolic shapes, which
    # ran 3x slower than eager here (benchmarks/train_speed.md)
    step_fn = torch.compile(model, dynamic=False) if cfg.compile else model

    # -- train
    saved = step_saved_bytes(model, *val_batches[0], autocast)  # a batch of the training shape
    if step == 0:  # the untrained model's loss anchors every curve
        hist["val"].append({"step": 0, **evaluate(model, val_batches, task, autocast), "time": 0.0})
    model.train()
    t0 = time.perf_counter() - elapsed
    while step < total:
        elapsed = time.perf_counter() - t0
        if cfg.max_seconds and elapsed >= cfg.max_seconds:
            break
        t_step = time.perf_counter()
        progress_frac = max(step / total, elapsed / cfg.max_seconds if cfg.max_seconds else 0.0)
        lr = lr_at(progress_frac, step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch(splits["train"], task, cfg.batch_size, mcfg.context, gen)
        x, y = x.to(device), y.to(device)
        with autocast():
            _, loss = step_fn(x, y)
        loss.backward()
        if step % cfg.log_every == 0:
            hist["grad_ffn"].append({"step": step, **grad_stats(ffns)})
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
        loss_value = loss.item()
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):  # stop before the update
            hist["events"].append(
                {"step": step, "kind": "nonfinite", "loss": str(loss_value), "grad_norm": str(grad_norm)}
            )
            status = "diverged"
            opt.zero_grad(set_to_none=True)
            break
        opt.step()
        opt.zero_grad(set_to_none=True)
        for kind, value, series in (
            ("grad_spike", grad_norm, hist["grad_norm"]),
            ("loss_spike", loss_value, hist["train_loss"]),
        ):
            if spike(value, series, cfg.spike_factor):
                hist["events"].append(
                    {"step": step, "kind": kind, "value": value, "median": statistics.median(series[-50:])}
                )
        hist["train_loss"].append(loss_value)
        hist["grad_norm"].append(grad_norm)
        hist["step_time"].append(time.perf_counter() - t_step)
        step += 1
        if step % cfg.eval_every == 0 or step == total:
            hist["val"].append(
                {"step": step, **evaluate(model, val_batches, task, autocast), "time": time.perf_counter() - t0}
            )
        if ckpt_dir is not None and step % cfg.checkpoint_every == 0 and step < total:
            save_checkpoint(
                ckpt_dir,
                model,
                {
                    "step": step,
                    "elapsed": time.perf_counter() - t0,
                    "hist": hist,
                    "optimizer": opt.state_dict(),
                    "data_rng": gen.get_state(),
                    "torch_rng": torch.get_rng_state(),
                },
            )
        if progress is not None:
            progress(step, total, {"loss": loss_value, "lr": lr, "elapsed": time.perf_counter() - t0})
    train_seconds = time.perf_counter() - t0

    # -- final evaluation (on final_eval_batches) and behaviour
    behaviour, final, robust, test = {}, {}, {}, {}
    if status == "finished":
        if not hist["val"] or hist["val"][-1]["step"] != step:
            hist["val"].append({"step": step, **evaluate(model, val_batches, task, autocast), "time": train_seconds})
        final_sets = {
            split: [
                (x.to(device), y.to(device))
                for x, y in eval_set(splits[split], task, cfg.final_eval_batches, cfg.batch_size, mcfg.context)
            ]
            for split in ("val", "test")
            if has_window(splits[split], task, mcfg.context)
        }
        final = evaluate(model, final_sets["val"], task, autocast)
        probe = ActivationProbe(ffns)
        evaluate(model, val_batches, task, autocast)
        probe.remove()
        behaviour = probe.summary()
        robust = evaluate(model, final_sets["val"], task, autocast, noise_std=cfg.noise_std)
        test = evaluate(model, final_sets["test"], task, autocast) if "test" in final_sets else {}
        if not math.isfinite(final["loss"]):
            status = "diverged"
            hist["events"].append({"step": step, "kind": "nonfinite", "loss": str(final["loss"])})
        elif weights_path is not None:
            save_weights(model, Path(weights_path))
    step_times = hist["step_time"][1:] or hist["step_time"]  # the first step includes warm-up
    median_step = statistics.median(step_times) if step_times else float("nan")
    return RunResult(
        ffn=mcfg.ffn,
        seed=cfg.seed,
        status=status,
        task=task,
        steps=step,
        final_val_loss=final.get("loss"),
        final_val_ppl=math.exp(final["loss"]) if final else None,
        final_val_acc=final.get("acc"),
        final_test_loss=test.get("loss"),
        final_test_acc=test.get("acc"),
        noisy_val_loss=robust.get("loss"),
        noisy_val_acc=robust.get("acc"),
        diverged_step=next((e["step"] for e in hist["events"] if e["kind"] == "nonfinite"), None),
        params=param_count(model),
        ffn_params=sum(p.numel() for _, f in ffns for p in f.parameters()),
        flops_per_token=model_flops_per_token(
            model,
            getattr(model.cfg, "d_model", mcfg.d_model),
            getattr(model.cfg, "n_layers", mcfg.n_layers),
            mcfg.context,
            mcfg.vocab_size if task == "lm" else mcfg.n_classes,
        ),
        tokens=step * tokens_per_step,
        tokens_per_s=tokens_per_step / median_step if step_times else None,
        step_time_s=median_step,
        first_step_s=hist["step_time"][0] if hist["step_time"] else None,
        train_seconds=train_seconds,
        wall_seconds=time.perf_counter() - t_start,
        **training_memory(model, opt, saved),
        cuda_peak_bytes=torch.cuda.max_memory_allocated() if device == "cuda" else None,
        n_grad_spikes=sum(e["kind"] == "grad_spike" for e in hist["events"]),
        n_loss_spikes=sum(e["kind"] == "loss_spike" for e in hist["events"]),
        max_grad_norm=max(hist["grad_norm"], default=None),
        **ffn_grad_summary(hist["grad_ffn"]),
        behaviour=behaviour,
        dead_frac=statistics.mean(b["dead_frac"] for b in behaviour.values()) if behaviour else None,
        learned=learned_params(ffns),
        vocab_size=tok.vocab_size,
        device=device,
        precision=cfg.precision,
        threads=torch.get_num_threads(),
        history={
            "train_loss": hist["train_loss"],
            "grad_norm": hist["grad_norm"],
            "val": hist["val"],
            "grad_ffn": hist["grad_ffn"],
        },
        events=hist["events"],
        config=cfg.to_dict(),
    )


# ---- progress bar -------------------------------------------------------------------------------


def progress_bar(prefix: str = "", stream=sys.stderr):
    """A one-line progress display: steps, ETA, loss and tokens/s; silent when not a terminal."""
    last = [0.0]

    def show(step, total, m):
        now = time.perf_counter()
        if now - last[0] < 0.2 and step != total:
            return
        last[0] = now
        rate = step / m["elapsed"] if m["elapsed"] else 0.0
        eta = f"{(total - step) / rate:5.0f}s" if total and rate else "    ?"
        frac = f"{step}/{total}" if total else f"{step}"
        stream.write(f"\r{prefix}{frac} steps  eta {eta}  loss {m['loss']:.4f}  lr {m['lr']:.2e}")
        if step == total:
            stream.write("\n")
        stream.flush()

    return show
