"""One training run: `train(config) -> result`, a loop that reads top to bottom.

`prepare` sets a run up (data, model, optimizer, resume from a checkpoint), `train` is the loop
(learning rate, batch, forward, backward, clip, step, evaluate, checkpoint) and `finish` wraps up
(final evaluations on val and test, behaviour, costs: the RunResult). AdamW, linear warm-up then
cosine decay, gradient clipping, evaluation every `eval_every` steps on a fixed held-out set (the
same batches for every variant and seed), budgets by steps, tokens or seconds, bf16 autocast or fp16
autocast with a gradient scaler as options, and activation checkpointing (ModelConfig.activation_checkpointing;
a Hugging Face model's own, per layer). Checkpoints (safetensors, resuming to the same result)
are in `ffnlab.run.checkpoint`; the stability monitors (FFN gradient statistics, gradient-norm and loss spikes,
dead units, sparsity, activation scale) in `ffnlab.run.monitors`; device and precision choice in `ffnlab.run.device`;
the data (corpus, tokenizer, batches) in `ffnlab.data`.
A run that hits a non-finite loss or gradient, or whose loss stays far above its best (TrainConfig.diverge_factor
and diverge_steps), ends as `diverged`. Under fp16 a non-finite gradient with a finite loss is not divergence: the
gradient scaler skips that update and halves its scale (the step is not counted, an 'fp16_skip' event says so);
only a non-finite loss, or a scale that fell below FP16_MIN_SCALE, ends an fp16 run as diverged.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch
from torch import nn
from torch.autograd.profiler import record_function

from ffnlab._util.files import check_free_space, check_output_folder
from ffnlab._util.machine import check_threads
from ffnlab.core.ffn import FFN, MixFFN, ffn_flops_per_token, spec_of
from ffnlab.core.memory import saved_bytes, training_memory
from ffnlab.core.model import (
    IGNORE_INDEX,
    ModelConfig,
    PatchEmbed,
    Transformer,
    image_tokens,
    param_count,
    qkv_act_spec,
)
from ffnlab.data.batches import EVAL_SEED, Batch, Split, check_data, eval_set, get_batch, has_window, on_device
from ffnlab.data.checkpoint_tokenizer import CheckpointTokenizer
from ffnlab.data.images import ImageSet
from ffnlab.data.load import load_data
from ffnlab.data.pairs import is_pair
from ffnlab.data.tagging import span_f1
from ffnlab.run.checkpoint import (
    DamagedCheckpoint,
    check_checkpoint_folder,
    load_checkpoint,
    save_checkpoint,
    save_weights,
    trainer_state,
)
from ffnlab.run.config import DIVERGENCE, TrainConfig
from ffnlab.run.device import (
    check_fits,
    hold_freed_heap,
    resolve_device,
    resolve_precision,
    skip_known_vec_isa_probes,
)
from ffnlab.run.distributed import (
    Ranks,
    check_ranks,
    gathered,
    gradient_sync,
    join,
    launch,
    mean_over_ranks,
    rank_zero_first,
    rank_zero_value,
    replicate,
    started_by_torchrun,
    this_rank,
    whole_optimizer_state,
    whole_weights,
)
from ffnlab.run.monitors import (
    ActivationProbe,
    BlowupWatch,
    NamedFFNs,
    grad_stats,
    monitor_summary,
    named_ffns,
    spike_events,
)
from ffnlab.run.result import Costs, Evaluation, Event, History, Memory, Outcome, RunResult
from ffnlab.run.scores import classifier_scores, regression_scores

if TYPE_CHECKING:
    from ffnlab.data.corpus import Corpus
    from ffnlab.data.prepared import TokenFolder
    from ffnlab.data.tokenizer import Tokenizer
    from ffnlab.tools.hf import HFModel
    from ffnlab.tools.lora import LoraSettings

# NOTE: the gradient scaler halves its scale at every overflow; below 1 the gradients overflow fp16 unscaled, which
# no scale mends: the run has diverged
FP16_MIN_SCALE = 1.0
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the precisions that autocast, and to what

ModelFactory = Callable[[ModelConfig, int], nn.Module]  # (model config, seed) -> module(idx, targets)
Progress = Callable[[int, int, dict[str, float]], None]  # (step, total, {"loss", "lr", "elapsed"})
Autocast = Callable[[], contextlib.AbstractContextManager[None]]


# ---- data -------------------------------------------------------------------------------------


# load_data's arguments: data, task, tokenizer, vocab_size, text_field, label_field, folder, example_context,
# image_size, channels, ids_vocab
DataArgs = tuple[str, str, str, int | None, str, str, str | None, int | None, int | None, int | None, int | None]


def data_args(cfg: TrainConfig) -> DataArgs:
    """The arguments of `load_data` for a config (the folder only for its 'pretrained' tokenizer)."""
    folder = cfg.init_from if cfg.tokenizer == "pretrained" else None
    vocab_size = {"bpe": cfg.bpe_vocab, "word": cfg.word_vocab}.get(cfg.tokenizer)
    # a sentence pair, or an example with the folder's special tokens, is cut to fit the context
    example_context = cfg.model.context if is_pair(cfg.text_field) or cfg.special_tokens else None
    image = (cfg.model.image_size, cfg.model.channels) if cfg.model.task == "image" else (None, None)
    return (cfg.data, cfg.model.task, cfg.tokenizer, vocab_size, cfg.text_field, cfg.label_field, folder,
            example_context, *image, cfg.ids_vocab)  # fmt: skip


def image_model_config(cfg: TrainConfig, images: ImageSet) -> ModelConfig:
    """`data_model_config` for task image: the data's classes, image size and channels, and as context the
    patches (and class token) an image makes; ValueError for a patch size that does not divide the images."""
    if images.image_size % cfg.model.patch_size:
        raise ValueError(
            f"the images of '{cfg.data}' are {images.image_size}x{images.image_size}, not a multiple of "
            f"--patch-size {cfg.model.patch_size}; give another patch size or --image-size"
        )
    n_classes = data_classes(cfg, len(images.classes))
    mcfg = replace(cfg.model, n_classes=n_classes, image_size=images.image_size, channels=images.channels)
    return replace(mcfg, context=image_tokens(mcfg))


def data_model_config(cfg: TrainConfig, corpus: Corpus | ImageSet | TokenFolder, tokenizer: Tokenizer) -> ModelConfig:
    """The model config a run builds on its data: the tokenizer's vocabulary and, for a classifier or a
    tagger, the corpus's classes or tags (`load_data`'s); for task image `image_model_config`."""
    if cfg.model.task == "image":
        assert isinstance(corpus, ImageSet)  # load_data's for task image
        return image_model_config(cfg, corpus)
    found = len(corpus.classes) if cfg.model.task in ("cls", "tokens") and corpus.classes else None
    found = 1 if cfg.model.task == "reg" else found  # one number out
    return replace(cfg.model, vocab_size=tokenizer.vocab_size, n_classes=data_classes(cfg, found))


def data_classes(cfg: TrainConfig, found: int | None) -> int:
    """The classes (or tags) a run's head predicts: those `found` in its data. ValueError where the config
    names another number: n_classes would change the run's identity without changing what it computes."""
    default = ModelConfig.__dataclass_fields__["n_classes"].default
    if found is None:
        if cfg.model.task == "lm" and cfg.model.n_classes != default:
            raise ValueError(f"n_classes is for tasks cls, tokens and image; task {cfg.model.task} predicts tokens")
        return cfg.model.n_classes
    if cfg.model.n_classes not in (default, found):
        raise ValueError(
            f"n_classes {cfg.model.n_classes} does not match the {found} classes of '{cfg.data}'; leave it out: "
            "it is read from the data"
        )
    return found


# ---- model, schedule and optimiser ------------------------------------------------------------


def hf_factory(hf_config: dict[str, Any]) -> ModelFactory:
    """model_factory building a Hugging Face architecture from its config with the FFN swapped."""
    from ffnlab.tools.hf import build_hf_model

    def build(mcfg: ModelConfig, seed: int) -> nn.Module:
        model = build_hf_model(
            hf_config,
            mcfg.ffn,
            match=mcfg.ffn_match,
            seed=seed,
            vocab_size=mcfg.vocab_size,
            context=mcfg.context,
            task=mcfg.task,
            n_classes=mcfg.n_classes,
            init=mcfg.init,
            attn_act=qkv_act_spec(mcfg),
        )
        return hf_checkpointing(model, mcfg)

    return build


def pretrained_factory(
    folder: str, lora: LoraSettings | None = None, tokenizer: CheckpointTokenizer | None = None
) -> ModelFactory:
    """model_factory loading a save_pretrained folder, its FFN activation swapped to model.ffn with
    the weights kept (ffnlab.tools.pretrained); the seed only draws a new classification head (and, with `lora`,
    the adapters that train on the frozen model: ffnlab.tools.lora). `tokenizer`: the folder's own, whose padded
    examples the model masks."""
    from ffnlab.tools.lora import with_lora
    from ffnlab.tools.pretrained import load_pretrained

    def build(mcfg: ModelConfig, seed: int) -> nn.Module:
        model = load_pretrained(
            folder, mcfg.ffn, mcfg.task, mcfg.n_classes, mcfg.vocab_size, mcfg.context, tokenizer=tokenizer
        )
        model = hf_checkpointing(model, mcfg)
        return with_lora(model, folder, lora) if lora else model

    return build


def hf_checkpointing(model: HFModel, mcfg: ModelConfig) -> HFModel:
    """A Hugging Face model with each layer's activations recomputed in backward where mcfg asks for 'block'
    checkpointing (non-reentrant); TrainConfig refuses 'ffn' for it."""
    if mcfg.activation_checkpointing == "block":
        non_reentrant = {"use_reentrant": False}
        if hasattr(model.hf, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns there
            model.hf.activation_checkpointing_enable(non_reentrant)
        else:
            # transformers leaves gradient_checkpointing_enable unannotated
            model.hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)  # type: ignore[no-untyped-call]
    return model


def resolve_init(cfg: TrainConfig) -> TrainConfig:
    """cfg with init_digest set from its init_from folder and, with --peft, its LoRA targets resolved (`resolve_lora`);
    ValueError if the folder changed since the run was planned (its digest then differs from the one in the config)."""
    if not cfg.init_from:
        return cfg
    from ffnlab.tools.pretrained import folder_digest

    digest = folder_digest(cfg.init_from)
    if cfg.init_digest not in (None, digest):
        raise ValueError(
            f"{cfg.init_from} changed since the run was planned (digest {digest}, planned {cfg.init_digest}); "
            "plan the study again"
        )
    return resolve_lora(replace(cfg, init_digest=digest))


def resolve_lora(cfg: TrainConfig) -> TrainConfig:
    """cfg with lora_targets set (given ones checked against the folder's model, else its family's default);
    unchanged without --peft or a folder."""
    if cfg.peft is None or not cfg.init_from:
        return cfg
    from ffnlab.tools.lora import resolved_targets

    return replace(cfg, lora_targets=resolved_targets(cfg.init_from, cfg.model.task, cfg.lora_targets))


def lora_settings(cfg: TrainConfig) -> LoraSettings | None:
    """A config's LoRA settings (its targets resolved), or None for a full fine-tune."""
    if cfg.peft != "lora":
        return None
    from ffnlab.tools.lora import LoraSettings, target_list

    cfg = resolve_lora(cfg)  # a planned run's are already
    return LoraSettings(cfg.lora_r, cfg.lora_alpha, tuple(target_list(cfg.lora_targets)))


def default_factory(cfg: TrainConfig, tokenizer: Tokenizer | None = None) -> ModelFactory:
    """The model a config asks for: a pretrained folder (with its own `tokenizer`, where the run reads text with it),
    a Hugging Face architecture, or ffnlab's Transformer."""
    if cfg.init_from:
        own = tokenizer if isinstance(tokenizer, CheckpointTokenizer) else None
        return pretrained_factory(cfg.init_from, lora_settings(cfg), own)
    return hf_factory(cfg.hf_config) if cfg.hf_config else Transformer


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


def build_model(
    cfg: TrainConfig, mcfg: ModelConfig, model_factory: ModelFactory, device: str, rank: int = 0
) -> tuple[nn.Module, torch.optim.AdamW, torch.Generator]:
    """The model initialised from `cfg.seed` (the same in every rank), its optimizer, and the generator of the
    data order (the same in every rank: each draws the global batch and keeps its share)."""
    torch.manual_seed(cfg.seed)
    model = model_factory(mcfg, cfg.seed).to(device)
    # NOTE: building draws a variant-dependent amount from the global stream (nn.Linear's default init, which
    # init_weights then overwrites); seeding again gives every variant with this seed the same dropout masks,
    # and each rank masks its share of the batch with masks of its own
    torch.manual_seed(cfg.seed if rank == 0 else (cfg.seed + rank) % 2**64)
    gen = torch.Generator().manual_seed(cfg.seed)  # data order: same for every variant with this seed
    return model, make_optimizer(model, cfg, device), gen


# ---- evaluation and costs ---------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    task: str,
    autocast: Autocast,
    noise_std: float = 0.0,
    tags: Sequence[str] = (),
) -> dict[str, float]:
    """Mean loss (and accuracy, macro-F1, Matthews correlation and with two classes F1 of class 1 for
    classification, cls and image, `ffnlab.run.scores.classifier_scores`; Pearson and Spearman correlation for
    regression, task reg; accuracy per word for tagging) over fixed batches; with noise_std, Gaussian noise of
    that std is added to the token embeddings (the same noise for every variant). For task tokens, given the tag
    names `tags`, also 'f1': the span F1 (`ffnlab.data.tagging.span_f1`); a tagger's loss and accuracy are over
    words, its padding left out."""
    model.eval()
    losses, correct, n = [], 0, 0
    labels: list[int] = []  # cls, image: each example's class, and the one predicted (macro-F1)
    predicted: list[int] = []
    n_classes = 0  # the classifier's outputs
    values: list[float] = []  # reg: each example's number, and the one predicted (correlations)
    estimates: list[float] = []
    true_tags: list[list[str]] = []  # task tokens: each sentence's tags, and the predicted ones
    predicted_tags: list[list[str]] = []
    rng_state = torch.get_rng_state()
    hook = None
    if noise_std:
        torch.manual_seed(EVAL_SEED)
        hook = token_embedding(model).register_forward_hook(lambda m, i, out: out + noise_std * torch.randn_like(out))
    try:
        for x, y in batches:
            with autocast():
                logits, loss = model(x, y)
            counted = int((y != IGNORE_INDEX).sum()) if task == "tokens" else len(y)  # words, or examples
            losses.append(loss.float().item() * counted)
            n += counted
            if task not in ("lm", "reg"):
                correct += (logits.argmax(-1) == y).sum().item()  # padding's IGNORE_INDEX is never a class
            if task in ("cls", "image"):
                labels += y.tolist()
                predicted += logits.argmax(-1).tolist()
                n_classes = logits.shape[-1]
            if task == "reg":
                values += y.float().tolist()
                estimates += logits.float().squeeze(-1).tolist()
            if task == "tokens" and tags:
                for true_ids, pred_ids in zip(y.tolist(), logits.argmax(-1).tolist()):
                    words = [i for i, t in enumerate(true_ids) if t != IGNORE_INDEX]
                    true_tags.append([tags[true_ids[i]] for i in words])
                    predicted_tags.append([tags[pred_ids[i]] for i in words])
    finally:
        if hook is not None:
            hook.remove()
        torch.set_rng_state(rng_state)
        model.train()
    out = {"loss": sum(losses) / n}
    if task not in ("lm", "reg"):
        out["acc"] = correct / n
    if labels:
        out.update(classifier_scores(labels, predicted, n_classes))
    if values:
        out.update(regression_scores(values, estimates))
    if true_tags:
        f1 = span_f1(true_tags, predicted_tags)
        if f1 is not None:  # None: the sentences evaluated hold no entity span, so span F1 is undefined there
            out["f1"] = f1
    return out


def token_embedding(model: nn.Module) -> nn.Module:
    """The token embedding: the first nn.Embedding, in ffnlab's Transformer and in Hugging Face
    models alike (it is registered before position embeddings); an image model's PatchEmbed."""
    return next(m for m in model.modules() if isinstance(m, (nn.Embedding, PatchEmbed)))


def model_flops_per_token(model: nn.Module, d_model: int, n_layers: int, context: int, n_out: int) -> int:
    """Forward FLOPs per token: attention projections and scores over the full context, every FFN
    built by `build_ffn` (by its formula), the output head of n_out logits, and an image model's patch
    projection (counted for every token, the class token's too: a small overcount)."""
    attn = n_layers * (2 * 4 * d_model * d_model + 2 * 2 * context * d_model)
    ffns = [m for m in model.modules() if isinstance(m, FFN)]
    branches = {id(branch) for m in ffns if isinstance(m, MixFFN) for branch in m.branches}  # counted in their mix
    ffn = sum(
        ffn_flops_per_token(spec_of(m), d_model, m.d_ff, any(n.endswith("bias") for n, _ in m.named_parameters()))
        for m in ffns
        if id(m) not in branches
    )
    patches = sum(2 * m.proj.in_features * m.proj.out_features for m in model.modules() if isinstance(m, PatchEmbed))
    return attn + ffn + 2 * d_model * n_out + patches


def train_flops(flops_per_token: int, tokens: int) -> int:
    """Training compute of a run: forward FLOPs per token (`model_flops_per_token`, the whole model) x 3
    (backward costs twice the forward: a gradient for the input and one for the weights of each matmul)
    x tokens trained. Kaplan et al. 2020's C = 6 N D, with attention and the head counted."""
    return 3 * flops_per_token * tokens


def training_shape(batch: Batch, batch_size: int) -> Batch:
    """The first `batch_size` rows of a batch: what one forward pass of training takes."""
    x, y = batch
    return x[:batch_size], y[:batch_size]


def step_saved_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: Autocast) -> int:
    """Bytes autograd keeps for backward in one training forward pass of the eager model on (x, y), in training
    mode (dropout masks, activation checkpointing: a checkpointed region counts only the inputs it keeps); the
    graph is dropped unused and the RNG left as it was (dropout draws would shift it)."""
    state = torch.get_rng_state()
    model.train()  # NOTE: from_pretrained hands a model over in eval mode
    try:
        with autocast():
            return saved_bytes(lambda: model(x, y), exclude=model.parameters())
    finally:
        torch.set_rng_state(state)


# ---- the run ------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What `prepare` builds for the loop: the config as it runs, the data, the model and its
    optimizer, and the step, clock and history to go on from (step 0 unless resumed)."""

    cfg: TrainConfig  # precision and nproc resolved: the stored config says what ran
    model_cfg: ModelConfig  # vocabulary and classes set from the data
    device: str
    ranks: Ranks  # this process's place in the run (rank 0 of 1 without torchrun)
    vocab_size: int
    splits: dict[str, Split]
    val_batches: list[Batch]  # the fixed batches of the validation curve
    model: nn.Module
    step_fn: nn.Module  # the model, compiled when cfg.compile, in DDP when the run has more than one process
    opt: torch.optim.AdamW
    gen: torch.Generator  # the data order
    ffns: NamedFFNs  # what the monitors watch
    autocast: Autocast
    scaler: torch.amp.GradScaler  # fp16's loss scaling; disabled (every call a no-op) in other precisions
    total: int  # steps in the budget (from max_tokens, else max_steps)
    tokens_per_step: int  # over the global batch
    saved: int  # bytes one training step keeps for backward
    step: int
    elapsed: float  # seconds trained before this process (a resumed run)
    hist: dict[str, list[Any]]  # new_history's lists
    checkpoint_dir: Path | None
    started: float  # time.perf_counter() when the run began
    qat: bool = False  # the model is fake-quantised (start_qat)
    tags: list[str] = field(default_factory=list)  # task tokens: the tag names, for the final span F1

    @property
    def task(self) -> str:
        return self.model_cfg.task


def step_function(model: nn.Module, cfg: TrainConfig, device: str) -> Callable[..., Any]:
    """What a training step calls: the model, or with cfg.compile the model under torch.compile."""
    if not cfg.compile:
        return model
    # NOTE: static shapes: else a second shape in one process (a sweep) recompiles for symbolic shapes, which
    # ran 3x slower than eager here (benchmarks/train_speed.md). cpp_wrapper on the CPU: the compiled graph calls
    # its kernels from C++, not from Python: a bf16 step of nanoGPT's recipe 5% faster at the same start (AMX Xeon,
    # benchmarks/README.md, issue #26); not under activation checkpointing, whose saved RNG state it cannot compile
    if device == "cpu":
        skip_known_vec_isa_probes()
    cpp_wrapper = device == "cpu" and cfg.model.activation_checkpointing == "none"
    return torch.compile(model, dynamic=False, options={"cpp_wrapper": True} if cpp_wrapper else None)


def parallel_step(model: nn.Module, cfg: TrainConfig, device: str, ranks: Ranks) -> nn.Module:
    """`step_function`, in DDP where the run has more than one process (compiled first, as DDP expects)."""
    step = step_function(model, cfg, device)
    assert isinstance(step, nn.Module)  # torch.compile's is a module too
    return step if cfg.shard else replicate(step, ranks, device)


def new_history() -> dict[str, list[Any]]:
    """What a run records as it goes, empty: the curves, the events and the step times."""
    return {"train_loss": [], "grad_norm": [], "val": [], "grad_ffn": [], "events": [], "step_time": []}


def settle(cfg: TrainConfig) -> tuple[TrainConfig, str, Ranks]:
    """What `prepare` settles before the data: the device, this process's ranks (the process group joined), the
    config as it will run (precision, nproc and init resolved: the stored config says what ran), the checks that
    need no data, and the threads and allocator."""
    device = resolve_device(cfg.device)
    check_ranks(cfg.nproc, this_rank(), device)  # before the process group waits for ranks that never come
    ranks = join(device)  # torchrun's processes: this one's rank, and the process group
    cfg = resolve_init(replace(cfg, precision=resolve_precision(cfg.precision, device), nproc=ranks.world))
    if cfg.checkpoint_dir:  # a folder ffnlab may not use is refused before the data is read
        check_checkpoint_folder(Path(cfg.checkpoint_dir))
    if cfg.qat_from is not None:  # known now, not at qat_from of the way through
        from ffnlab.tools.quantize import require_torchao

        require_torchao("quantisation-aware training (qat_from)")
    if cfg.threads:  # NOTE: on a shared machine one thread per run beats two fighting for cores (train_speed.md)
        torch.set_num_threads(check_threads(cfg.threads))  # a config file is no flag: checked here too
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        hold_freed_heap()  # steps reuse the heap, not fault it in again (30% of a step, 1 process in 5, AMX Xeon)
    return cfg, device, ranks


def prepare(cfg: TrainConfig, model_factory: ModelFactory | None = None) -> Setup:
    """Set a run up: device and precision, data, model and optimizer, then resume from the checkpoint
    in `cfg.checkpoint_dir` if there is one. ValueError when the data is too small or the built-in
    model cannot fit this machine."""
    started = time.perf_counter()
    cfg, device, ranks = settle(cfg)
    task = cfg.model.task

    # -- data and model
    corpus, tok, splits = load_data(*data_args(cfg))
    mcfg = data_model_config(cfg, corpus, tok)
    check_data(splits, task, mcfg.context, cfg.data)
    if model_factory is None and not (cfg.hf_config or cfg.init_from):
        check_fits(cfg, mcfg, device)
    model_factory = model_factory or default_factory(cfg, tok)
    model, opt, gen = build_model(cfg, mcfg, model_factory, device, ranks.rank)
    if cfg.qat_from is not None:
        from ffnlab.tools.quantize import check_qat_model

        check_qat_model(model)  # before training, not at qat_from of the way through
    # NOTE: batches of the global batch's size, evaluated whole in every rank: the same batches, and the same
    # embedding noise, as one process with that batch
    val_batches = on_device(eval_set(splits["val"], task, cfg.eval_batches, cfg.global_batch, mcfg.context), device)
    tokens_per_step = cfg.global_batch * mcfg.context
    dtype = AUTOCAST_DTYPES.get(cfg.precision)
    autocast = functools.partial(
        torch.autocast, device_type=device, dtype=dtype or torch.bfloat16, enabled=dtype is not None
    )
    new_scaler = functools.partial(torch.amp.GradScaler, device, enabled=cfg.precision == "fp16")
    scaler = new_scaler()

    # -- resume
    hist = new_history()
    step, elapsed = 0, 0.0
    checkpoint_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if checkpoint_dir is not None:
        with rank_zero_first(ranks):  # a checkpoint rank 0 discards, the others do not find
            try:
                state = load_checkpoint(checkpoint_dir, model, opt, gen, scaler)
            except DamagedCheckpoint:  # discarded with a warning: a fresh model, as if never started
                model, opt, gen = build_model(cfg, mcfg, model_factory, device, ranks.rank)
                scaler, state = new_scaler(), None
        if state is not None:
            step, elapsed, hist = state["step"], state["elapsed"], state["hist"]
            rank_rng = state.get("rank_rng", [])
            if len(rank_rng) == ranks.world:  # each rank's dropout goes on from where it was
                torch.set_rng_state(rank_rng[ranks.rank])
    saved = step_saved_bytes(model, *training_shape(val_batches[0], cfg.batch_size), autocast)  # before sharding
    if cfg.shard:
        from ffnlab.run.distributed import shard

        shard(model, opt, ranks)
    step_fn = parallel_step(model, cfg, device, ranks)
    total = math.ceil(cfg.max_tokens / tokens_per_step) if cfg.max_tokens else cfg.max_steps
    return Setup(cfg=cfg, model_cfg=mcfg, device=device, ranks=ranks,  # the run
                 vocab_size=tok.vocab_size, splits=splits, val_batches=val_batches,  # its data
                 tags=list(corpus.classes or []) if task == "tokens" else [],
                 model=model, step_fn=step_fn, ffns=named_ffns(model), opt=opt, gen=gen,  # the model, its optimiser
                 autocast=autocast, scaler=scaler, saved=saved,  # and its precision
                 total=total, tokens_per_step=tokens_per_step,  # the budget
                 step=step, elapsed=elapsed, hist=hist, checkpoint_dir=checkpoint_dir, started=started)  # fmt: skip


def train(
    cfg: TrainConfig,
    progress: Progress | None = None,
    model_factory: ModelFactory | None = None,
    weights_path: str | os.PathLike[str] | None = None,
    pretrained_path: str | os.PathLike[str] | None = None,
) -> RunResult:
    """Run one training and return what it measured.

    `progress(step, total, metrics)` is called after every step (for a progress bar).
    `model_factory(model_cfg, seed) -> nn.Module` replaces the built-in Transformer (by default a
    Hugging Face architecture when `cfg.hf_config` is set); the module must take (idx, targets)
    and return (logits, loss).
    `weights_path`: where to write the final weights (safetensors) of a finished run.
    `pretrained_path`: a folder to `save_pretrained` a finished Hugging Face model (hf_config or
    init_from) into, for fine-tuning later (`init_from`); ValueError at once for ffnlab's Transformer.
    A run that hits a non-finite loss or gradient, or whose training loss stays above diverge_factor times its best
    for diverge_steps steps, ends with status 'diverged'; it never raises. Under fp16 a step whose gradients
    overflowed is skipped by the gradient scaler and trained again on the next batch (module docstring).
    """
    if pretrained_path is not None and not (cfg.hf_config or cfg.init_from):
        raise ValueError("saving a save_pretrained folder needs a Hugging Face model: add --hf-config CONFIG.json")
    if pretrained_path is not None:
        check_output_folder(pretrained_path, "the save_pretrained folder")
    if cfg.shard:
        check_shard(cfg, pretrained_path)
    if cfg.nproc > 1 and not started_by_torchrun():  # start the run's processes (torchrun's launcher) and wait
        if model_factory is not None:
            raise ValueError("a model_factory builds the model in this process; start nproc > 1 with torchrun")
        return launch(cfg, progress is not None, weights_path, pretrained_path)
    setup = prepare(cfg, model_factory)
    if pretrained_path is not None:  # the fp32 weights (LoRA: what trained), saved after training: now, not then
        n_params = sum(p.numel() for p in setup.model.parameters() if p.requires_grad or not cfg.peft)
        check_free_space(pretrained_path, 4 * n_params, f"the save_pretrained folder ({n_params:,} parameters)")
    cfg, model, opt, hist, step, total = setup.cfg, setup.model, setup.opt, setup.hist, setup.step, setup.total
    progress = progress if setup.ranks.main else None  # rank 0 alone reports
    status = Outcome.FINISHED
    blowup = BlowupWatch(cfg.diverge_factor, cfg.diverge_steps)
    blowup.replay(hist["train_loss"])  # a resumed run goes on from where its history left the watch
    if step == 0:  # the untrained model's loss anchors every curve
        hist["val"].append({"step": 0, **evaluate(model, setup.val_batches, setup.task, setup.autocast), "time": 0.0})
    model.train()
    t0 = time.perf_counter() - setup.elapsed
    while step < total:
        elapsed = run_time(setup, t0)
        if cfg.max_seconds and elapsed >= cfg.max_seconds:
            break
        t_step = time.perf_counter()
        # the schedule follows the larger of step and time progress
        fraction = max(step / total, elapsed / cfg.max_seconds if cfg.max_seconds else 0.0)
        lr = lr_at(fraction, step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        if cfg.qat_from is not None and fraction >= cfg.qat_from and not setup.qat:
            start_qat(setup)
        loss = forward_backward(setup)
        grad_norm, loss_value, outcome = apply_gradients(setup, loss, step)
        if outcome == "skipped":
            continue  # fp16 overflowed: the same step again, on the next batch
        if outcome == "nonfinite":
            status = Outcome.DIVERGED
            break
        hist["events"] += spike_events(step, grad_norm, loss_value, hist, cfg.spike_factor)
        hist["train_loss"].append(loss_value)
        hist["grad_norm"].append(grad_norm)
        hist["step_time"].append(time.perf_counter() - t_step)
        if blowup.update(hist["train_loss"]):  # stayed far above its best loss: no NaN, but diverged all the same
            hist["events"].append(blowup.event(step, loss_value))
            status = Outcome.DIVERGED
            break
        step += 1
        if step % cfg.eval_every == 0 or step == total:
            val = evaluate(model, setup.val_batches, setup.task, setup.autocast)
            hist["val"].append({"step": step, **val, "time": time.perf_counter() - t0})
        if setup.checkpoint_dir is not None and step % cfg.checkpoint_every == 0 and step < total:
            checkpoint(setup, step, time.perf_counter() - t0)
        if progress is not None:
            progress(step, total, {"loss": loss_value, "lr": lr, "elapsed": time.perf_counter() - t0})
    return finish(setup, status, step, time.perf_counter() - t0, weights_path, pretrained_path)


def check_shard(cfg: TrainConfig, pretrained_path: str | os.PathLike[str] | None = None) -> None:
    """ValueError where a sharded run (cfg.shard) has one process, or asks for what is not built for a model in
    pieces over the ranks: quantisation-aware training, a save_pretrained folder."""
    if cfg.nproc == 1 and not started_by_torchrun():
        raise ValueError("--shard divides the model over a run's processes; give --nproc 2 or more")
    if cfg.qat_from is not None:
        raise ValueError("--shard cannot give quantisation-aware training yet; drop --qat-from, or --shard")
    if pretrained_path is not None:
        raise ValueError("--shard cannot give a save_pretrained folder yet; drop --save-pretrained, or --shard")


def run_time(setup: Setup, t0: float) -> float:
    """Seconds trained since `t0`; under a time budget rank 0's clock on every rank, so all stop and schedule alike."""
    elapsed = time.perf_counter() - t0
    return rank_zero_value(elapsed, setup.ranks) if setup.cfg.max_seconds else elapsed


def step_batches(setup: Setup) -> list[Batch]:
    """This rank's share of a step's global batch, in grad_accum micro-batches on the device. The run's generator
    draws the whole global batch, in every rank alike and as one process with that batch draws it; micro-batch i
    of rank r is its (i x nproc + r)-th slice of batch_size rows."""
    cfg, ranks = setup.cfg, setup.ranks
    x, y = get_batch(setup.splits["train"], setup.task, cfg.global_batch, setup.model_cfg.context, setup.gen)
    shares = range(ranks.rank, cfg.nproc * cfg.grad_accum, cfg.nproc)
    rows = [slice(k * cfg.batch_size, (k + 1) * cfg.batch_size) for k in shares]
    return [(x[r].to(setup.device), y[r].to(setup.device)) for r in rows]


def forward_backward(setup: Setup) -> torch.Tensor:
    """A step's forward and backward passes over this rank's micro-batches (`step_batches`), each loss divided by
    grad_accum so that the gradients add up to the global batch's mean (DDP averages them over the ranks in the
    last backward); returns that mean loss, the same in every rank."""
    cfg = setup.cfg
    with record_function("forward"):  # the phases `ffnlab.run.profile` reads
        batches = step_batches(setup)
    total = torch.zeros((), device=setup.device)
    for i, (x, y) in enumerate(batches):
        with gradient_sync(setup.step_fn, sync=i == len(batches) - 1):
            with record_function("forward"), setup.autocast():
                _, loss = setup.step_fn(x, y)
            with record_function("backward"):
                setup.scaler.scale(loss / cfg.grad_accum).backward()
        total += loss.detach().float() / cfg.grad_accum
    return mean_over_ranks(total, setup.ranks)


def apply_gradients(setup: Setup, loss: torch.Tensor, step: int) -> tuple[float, float, str]:
    """After `forward_backward`, the monitors, clip and update: (gradient norm, loss, outcome). The outcome is
    'stepped'; 'skipped' when fp16 overflowed (no update, half the scale for the next batch); or 'nonfinite', stopped
    before the update: a non-finite loss or gradient (under fp16 only a non-finite loss or a scale that collapsed)."""
    with record_function("optimizer"):
        return step_optimizer(setup, loss, step)


def checkpoint(setup: Setup, step: int, elapsed: float) -> None:
    """Rank 0 writes a checkpoint of `step`, with every rank's RNG state (each rank's dropout masks its own share).
    A sharded run's model and optimizer state are gathered whole first, by every rank, into the files an unsharded
    run writes: `prepare` resumes them before sharding, with --shard or without."""
    assert setup.checkpoint_dir is not None  # the loop checkpoints only with one
    state = trainer_state(step, elapsed, setup.hist, setup.opt, setup.gen, setup.scaler)
    weights: nn.Module | dict[str, torch.Tensor] = setup.model
    if setup.cfg.shard:
        weights = whole_weights(setup.model, setup.ranks)
        state["optimizer"] = whole_optimizer_state(setup.model, setup.opt, setup.ranks)
    if setup.ranks.world > 1:
        state["rank_rng"] = gathered(torch.get_rng_state(), setup.ranks)
    if setup.ranks.main:
        save_checkpoint(setup.checkpoint_dir, weights, state)


def step_optimizer(setup: Setup, loss: torch.Tensor, step: int) -> tuple[float, float, str]:
    """`apply_gradients` after the backward: unscale, monitors, clip and update."""
    cfg, model, opt, scaler, hist = setup.cfg, setup.model, setup.opt, setup.scaler, setup.hist
    scaler.unscale_(opt)  # the true gradients, for the monitors and the clip (nothing to undo without fp16)
    params = list(model.parameters())  # one walk of the modules for the norm and the clip
    total_norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    grad_norm, loss_value = total_norm.item(), loss.item()
    if scaler.is_enabled() and math.isfinite(loss_value) and not math.isfinite(grad_norm):
        scaler.update()
        opt.zero_grad(set_to_none=True)
        hist["events"].append({"step": step, "kind": "fp16_skip", "scale": scaler.get_scale()})
        if scaler.get_scale() >= FP16_MIN_SCALE:
            return grad_norm, loss_value, "skipped"
    elif step % cfg.log_every == 0:
        hist["grad_ffn"].append({"step": step, **grad_stats(setup.ffns)})
    if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
        hist["events"].append({"step": step, "kind": "nonfinite", "loss": str(loss_value), "grad_norm": str(grad_norm)})
        opt.zero_grad(set_to_none=True)
        return grad_norm, loss_value, "nonfinite"
    nn.utils.clip_grads_with_norm_(params, cfg.grad_clip, total_norm)  # clip_grad_norm_'s two halves
    scaler.step(opt)  # opt.step() without fp16
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return grad_norm, loss_value, "stepped"


def start_qat(setup: Setup) -> None:
    """Quantisation-aware training from here on (cfg.qat_from): every linear layer fake-quantised to int8
    (ffnlab.tools.quantize.prepare_qat, torchao), its parameters and the optimizer's state kept, and the step
    function rebuilt (compiled again with cfg.compile). A resumed run past qat_from starts it at its first step."""
    from ffnlab.tools.quantize import prepare_qat

    prepare_qat(setup.model)
    setup.step_fn = parallel_step(setup.model, setup.cfg, setup.device, setup.ranks)
    setup.qat = True


def finish(
    setup: Setup,
    status: Outcome,
    step: int,
    train_seconds: float,
    weights_path: str | os.PathLike[str] | None = None,
    pretrained_path: str | os.PathLike[str] | None = None,
) -> RunResult:
    """Wrap a run up: a finished run's final evaluations (it is 'diverged' if they are not finite),
    weights and save_pretrained folder, then the RunResult of everything the run measured."""
    hist = setup.hist
    evals = FinalEvaluations()
    if status is Outcome.FINISHED:
        evals = final_evaluations(setup, step, train_seconds)
        if not math.isfinite(evals.final["loss"]):
            status = Outcome.DIVERGED
            hist["events"].append({"step": step, "kind": "nonfinite", "loss": str(evals.final["loss"])})
        else:
            save_final(setup, weights_path, pretrained_path)
    diverged: dict[str, Any] = next((e for e in hist["events"] if e["kind"] in DIVERGENCE), {})
    return RunResult(
        ffn=setup.model_cfg.ffn,
        seed=setup.cfg.seed,
        status=status,
        task=setup.task,
        steps=step,
        val=Evaluation.measured(evals.final),
        test=Evaluation.measured(evals.test),
        noisy_val=Evaluation.measured(evals.noisy),
        test_mismatched=Evaluation.measured(evals.more_tests.get("test_mismatched", {})),
        costs=measured_costs(setup, step, train_seconds),
        memory=measured_memory(setup),
        monitors=monitor_summary(hist, evals.behaviour, setup.ffns, evals.mixtures),
        diverged_step=diverged.get("step"),
        diverged_kind=diverged.get("kind"),
        vocab_size=setup.vocab_size,
        device=setup.device,
        precision=setup.cfg.precision,
        threads=torch.get_num_threads(),
        history=History.from_json(hist),  # the loop's lists are the curves' JSON
        events=tuple(Event.from_json(e) for e in hist["events"]),
        config=setup.cfg.to_dict(),
    )


def save_final(
    setup: Setup, weights_path: str | os.PathLike[str] | None, pretrained_path: str | os.PathLike[str] | None
) -> None:
    """A finished run's weights (safetensors) and its Hugging Face model as a save_pretrained folder;
    a swapped model is saved with its original FFN modules, so the folder loads with from_pretrained; a LoRA run
    saves its adapter (ffnlab.tools.lora.save_adapter), which loads onto the base with peft. Called in
    every rank: rank 0 alone writes, and a sharded model is gathered whole by all of them first."""
    if weights_path is not None:
        weights = whole_weights(setup.model, setup.ranks) if setup.cfg.shard else setup.model
        if setup.ranks.main:
            save_weights(weights, Path(weights_path))
    if pretrained_path is not None and setup.ranks.main:
        from ffnlab.tools.hf import HFModel, save_unswapped
        from ffnlab.tools.lora import save_adapter

        assert isinstance(setup.model, HFModel)  # train() refuses pretrained_path for ffnlab's Transformer
        if setup.cfg.peft and setup.cfg.init_from:  # the adapter and the base it needs, not a whole model
            save_adapter(setup.model, setup.cfg.init_from, setup.cfg.init_digest, Path(pretrained_path))
        else:
            save_unswapped(setup.model.hf, Path(pretrained_path))


@dataclass
class FinalEvaluations:
    """What `final_evaluations` measured of a finished run (empty for a run that did not finish)."""

    final: dict[str, float] = field(default_factory=dict)  # `evaluate` on the final validation batches
    behaviour: dict[str, dict[str, float]] = field(default_factory=dict)  # ActivationProbe.summary
    mixtures: dict[str, dict[str, float]] = field(default_factory=dict)  # ActivationProbe.mixture_weights
    noisy: dict[str, float] = field(default_factory=dict)  # validation with noise on the embeddings
    test: dict[str, float] = field(default_factory=dict)  # empty when the test split is too small
    more_tests: dict[str, dict[str, float]] = field(default_factory=dict)  # each further test set's ('test_<name>':
    # MNLI's mismatched dev set, ffnlab.data.load.more_test_splits)


def final_evaluations(setup: Setup, step: int, train_seconds: float) -> FinalEvaluations:
    """A finished run's evaluations: the last point of the validation curve (if not there yet), then
    on final_eval_batches 'final' (val), 'noisy' (val with noise on the embeddings) and 'test'
    (empty when the test split is too small), and the FFNs' 'behaviour' (and switch_x's mean 'mixtures')
    on the curve's batches."""
    cfg, model, task, autocast, context = setup.cfg, setup.model, setup.task, setup.autocast, setup.model_cfg.context
    if not setup.hist["val"] or setup.hist["val"][-1]["step"] != step:
        val = evaluate(model, setup.val_batches, task, autocast)
        setup.hist["val"].append({"step": step, **val, "time": train_seconds})
    final_sets = {
        split: on_device(
            eval_set(setup.splits[split], task, cfg.final_eval_batches, cfg.global_batch, context), setup.device
        )
        for split in ("val", "test", *(s for s in setup.splits if s.startswith("test_")))
        if has_window(setup.splits[split], task, context)
    }
    final = evaluate(model, final_sets["val"], task, autocast, tags=setup.tags)
    probe = ActivationProbe(setup.ffns)
    evaluate(model, setup.val_batches, task, autocast)
    probe.remove()
    return FinalEvaluations(
        final=final,
        behaviour=probe.summary(),
        mixtures=probe.mixture_weights(),
        noisy=evaluate(model, final_sets["val"], task, autocast, noise_std=cfg.noise_std, tags=setup.tags),
        test=evaluate(model, final_sets["test"], task, autocast, tags=setup.tags) if "test" in final_sets else {},
        more_tests={s: evaluate(model, final_sets[s], task, autocast) for s in final_sets if s.startswith("test_")},
    )


def measured_costs(setup: Setup, step: int, train_seconds: float) -> Costs:
    """What the run cost: parameters, FLOPs per token, tokens and their rate, step and wall times."""
    model, mcfg, step_time = setup.model, setup.model_cfg, setup.hist["step_time"]
    step_times = step_time[1:] or step_time  # the first step includes warm-up
    median_step = statistics.median(step_times) if step_times else float("nan")
    own = getattr(model, "cfg", mcfg)  # a model_factory's module may have no config of its own
    d_model, n_layers = getattr(own, "d_model", mcfg.d_model), getattr(own, "n_layers", mcfg.n_layers)
    n_out = mcfg.vocab_size if setup.task == "lm" else mcfg.n_classes
    flops_per_token = model_flops_per_token(model, d_model, n_layers, mcfg.context, n_out)
    return Costs(
        params=param_count(model),
        trainable_params=sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()),
        ffn_params=sum(p.numel() for _, f in setup.ffns for p in f.parameters()),
        flops_per_token=flops_per_token,
        tokens=step * setup.tokens_per_step,
        train_flops=train_flops(flops_per_token, step * setup.tokens_per_step),
        tokens_per_s=setup.tokens_per_step / median_step if step_times else None,
        step_time_s=median_step,
        first_step_s=step_time[0] if step_time else None,
        train_seconds=train_seconds,
        wall_seconds=time.perf_counter() - setup.started,
    )


def measured_memory(setup: Setup) -> Memory:
    """A training step's memory (ffnlab.core.memory.training_memory) and, on CUDA, the allocator's peak."""
    peak = torch.cuda.max_memory_allocated() if setup.device == "cuda" else None
    return Memory(**training_memory(setup.model, setup.opt, setup.saved), cuda_peak_bytes=peak)


# ---- progress bar -------------------------------------------------------------------------------


def progress_bar(prefix: str = "", stream: TextIO | None = None) -> Progress:
    """A one-line progress display (steps, ETA, loss and lr) rewritten in place on `stream`, by default
    sys.stderr as it is when the bar is made (not as it was at import: tests and notebooks replace it)."""
    last = [0.0]
    out = stream or sys.stderr

    def show(step: int, total: int, m: dict[str, float]) -> None:
        now = time.perf_counter()
        if now - last[0] < 0.2 and step != total:
            return
        last[0] = now
        rate = step / m["elapsed"] if m["elapsed"] else 0.0
        eta = f"{(total - step) / rate:5.0f}s" if total and rate else "    ?"
        frac = f"{step}/{total}" if total else f"{step}"
        out.write(f"\r{prefix}{frac} steps  eta {eta}  loss {m['loss']:.4f}  lr {m['lr']:.2e}")
        if step == total:
            out.write("\n")
        out.flush()

    return show
