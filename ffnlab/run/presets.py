"""Named setups: one typed function per preset, each returning a `TrainConfig`, and one table (`PRESETS`) of them
with what `compare` runs each with unless told otherwise (its FFN variants, its compute axes).

`standard` is the default study's (docs/explanation/default-study.md). `paper` keeps the shape of Shazeer
2020's setup (pre-norm, no dropout, gated widths matched to 4x dense in parameters, equal steps,
6 layers) at the largest size one CPU trains in hours, not weeks. `gpt2-small` and `shazeer` are the
literature's own shapes, for a GPU and a corpus of hundreds of millions of tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ffnlab._util.names import closest
from ffnlab._util.text import shorten
from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig


def smoke() -> TrainConfig:
    """Seconds per run: for tests and trying the commands."""
    model = ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32)
    return run(model, batch_size=8, max_steps=30, every=10, eval_batches=2, final_eval_batches=2, warmup_steps=5)


def quick() -> TrainConfig:
    """About ten seconds per run on 2 cores."""
    model = ModelConfig(n_layers=2, n_heads=2, d_model=64, context=64)
    return run(model, batch_size=16, max_steps=150, every=50, eval_batches=4, final_eval_batches=8, warmup_steps=10)


def standard() -> TrainConfig:
    """The default study's runs: 480 steps of 16 x 64 tokens, 32 final evaluation batches."""
    model = ModelConfig(n_layers=2, n_heads=4, d_model=128, context=64)
    return run(model, batch_size=16, max_steps=480, every=100, eval_batches=8, final_eval_batches=32, warmup_steps=20)


def paper() -> TrainConfig:
    """Shazeer 2020's shape (6 layers, pre-norm, no dropout) at a CPU-sized width and budget."""
    model = ModelConfig(n_layers=6, n_heads=8, d_model=256, context=256)
    return run(model, batch_size=32, max_steps=5000, every=250, eval_batches=16, final_eval_batches=64,
               warmup_steps=200, lr=1e-3)  # fmt: skip


def scaling() -> TrainConfig:
    """The base of `compare --preset scaling`: the standard run, whose width the study scales (its entry's
    `scale` in PRESETS), so one fit spans about two decades of compute."""
    return standard()


# NOTE: GPT-2's 50,257 tokens are 256 bytes, 50,000 merges and <|endoftext|>; ffnlab's byte-level BPE has no
# special token, so 50,257 is 256 bytes and 50,001 merges, trained on the user's corpus: the embedding (38.6M
# of GPT-2 small's 124M parameters) and the output head are GPT-2's size. A corpus with fewer distinct merges
# gives fewer (the tokenizer's NOTE), as a corpus of a few MB does.
GPT2_VOCAB = 50_257


def gpt2_small() -> TrainConfig:
    """GPT-2 small (Radford et al. 2019; 124M parameters): 12 layers x d_model 768, 12 heads, context 1024, BPE,
    for 50,000 steps: the experiment that compares ReLU, GELU, Swish and GEGLU at this shape.

    The rest as nanoGPT's GPT-2 reproduction (karpathy/nanoGPT, config/train_gpt2.py): pre-norm LayerNorm,
    learned positions, tied embeddings, no dropout, AdamW lr 6e-4 -> 6e-5 (cosine) after 2,000 warm-up steps,
    beta2 0.95, weight decay 0.1, clip 1.0. The batch is 16 x 1024 tokens, one GPU's without accumulation
    (nanoGPT's micro-batch is 12 on 40 GB): 50,000 steps are 819M tokens, about one pass over a million news
    articles. Evaluated every 1,000 steps on 32 batches (0.5M tokens), at the end on 256 (4.2M).
    """
    model = ModelConfig(n_layers=12, n_heads=12, d_model=768, context=1024, ffn="gelu")
    return run(model, tokenizer="bpe", bpe_vocab=GPT2_VOCAB, batch_size=16, max_steps=50_000, every=1000,
               eval_batches=32, final_eval_batches=256, warmup_steps=2000, lr=6e-4, min_lr=6e-5, beta2=0.95,
               device="auto")  # fmt: skip


def shazeer() -> TrainConfig:
    """The decoder-only equivalent of Shazeer 2020's setup (GLU Variants Improve Transformer, arXiv:2002.05202):
    T5-base's layer shape for 65,536 steps of 128 x 512 tokens.

    T5-base is an encoder-decoder of 12 + 12 layers, d_model 768, 12 heads, d_ff 3072 (gated 2048: ffnlab's
    params match gives both). Its decoder-only equivalent here keeps the per-layer shape and the number of
    FFNs, 24 layers of 768, not the parameter count: the FFNs are what is compared, and they are T5-base's
    exactly (24 x 4.7M weights). What has no decoder-only counterpart, the decoder's 12 cross-attentions
    (28M weights), is left out rather than turned into 4 more layers, which would add FFNs. So 170M weights
    in the layers against T5-base's 198M, plus a 32,000-token embedding (T5's vocabulary size; a byte-level BPE
    on the user's corpus, not T5's SentencePiece), tied to the output as T5's.

    As T5: pre-norm RMSNorm (T5's layer norm has no mean and no bias), no biases (the paper's FFN_ReLU is
    max(xW1, 0)W2), no dropout (the paper's departure from T5), context 512, batch 128: 65,536 tokens a step,
    4.3B in all. Relative positions become RoPE, ffnlab's relative scheme. A decoder-only model predicts
    every one of the 512 tokens, where T5's decoder predicted 114 per example. ffnlab has no Adafactor:
    AdamW at GPT-3's lr for its nearest size (Brown et al. 2020, Table 2.1: 125M, 6e-4), cosine to a tenth
    after 2,000 warm-up steps, beta2 0.95.
    """
    model = ModelConfig(n_layers=24, n_heads=12, d_model=768, context=512, ffn="relu", ffn_bias=False,
                        norm="rmsnorm", pos="rope")  # fmt: skip
    return run(model, tokenizer="bpe", bpe_vocab=32_000, batch_size=128, max_steps=65_536, every=2048,
               eval_batches=8, final_eval_batches=64, warmup_steps=2000, lr=6e-4, beta2=0.95,
               device="auto")  # fmt: skip


def run(model: ModelConfig, every: int, **fields: Any) -> TrainConfig:
    """A preset's TrainConfig: evaluated and checkpointed `every` steps."""
    return TrainConfig(model=model, eval_every=every, checkpoint_every=every, **fields)


@dataclass(frozen=True)
class Preset:
    """A named setup: its run's config, and what `compare` runs it with where the study does not say."""

    config: Callable[[], TrainConfig]
    variants: tuple[str, ...] | None = None  # compare's FFN variants; None: the default study's
    # (ffnlab.study.plan.DEFAULT_VARIANTS)
    scale: dict[str, list[int]] = field(default_factory=dict)  # compute axes and their values (ffnlab.study.scaling)


PRESETS: dict[str, Preset] = {
    "smoke": Preset(smoke),
    "quick": Preset(quick),
    "standard": Preset(standard),
    "paper": Preset(paper),
    # sizes chosen from measurements (docs/explanation/scaling.md)
    "scaling": Preset(scaling, scale={"width": [24, 48, 96, 192]}),
    "gpt2-small": Preset(gpt2_small, variants=("relu", "gelu", "silu", "geglu")),  # the experiment's four
    # Shazeer 2020's eight, Table 1
    "shazeer": Preset(shazeer, variants=("relu", "gelu", "silu", "glu", "bilinear", "reglu", "geglu", "swiglu")),
}
DEFAULT_PRESET = "standard"  # what `compare` starts from without --preset


def preset_config(name: str, model: dict[str, Any] | None = None, **overrides: Any) -> TrainConfig:
    """The preset's TrainConfig with `model=` fields and other fields overridden (validated by the dataclasses)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{shorten(name)}'{closest(name, PRESETS)}; valid: {', '.join(PRESETS)}")
    cfg = PRESETS[name].config()
    return replace(cfg, model=replace(cfg.model, **(model or {})), **overrides)
