"""A small configurable Transformer whose every FFN comes from the registry by name.

Decoder-only causal LM (task="lm"), encoder classifier (task="cls", mean-pooled or CLS head), encoder
regressor (task="reg": the same pooling, one scalar out, MSE loss), encoder tagger (task="tokens", a class per position; targets IGNORE_INDEX at padding) or a small ViT on image
patches (task="image", `PatchEmbed` in place of the token embedding); LayerNorm or RMSNorm, pre- or
post-norm, learned or rotary positions, tied embeddings, activation checkpointing per block or per FFN.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ffnlab._util.text import shorten
from ffnlab.core.activations import attention_context, get_activation, resolve
from ffnlab.core.ffn import (
    DEFAULT_INIT,
    GLU_NORMS,
    MATCHES,
    NORMS,
    DenseFFN,
    build_ffn,
    check_init,
    get_ffn_spec,
    init_ffn,
    layer_variants,
    norm_layer,
)
from ffnlab.core.memory import build_on_meta

Rope = tuple[torch.Tensor, torch.Tensor]  # cos and sin tables, (context, head_dim / 2) each
ACT_POSITIONS = ("ffn", "before_norm", "after_residual")  # ModelConfig.act_position (Block)
IGNORE_INDEX = -100  # a target that counts in no loss: padding of task "tokens" (F.cross_entropy's default)


@dataclass
class ModelConfig:
    """Shape and options of the Transformer; serialised with `asdict` beside every result."""

    vocab_size: int = 96
    context: int = 128  # maximum sequence length (learned positions and RoPE tables)
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    ffn: str = "gelu"  # any name `ffnlab list` shows, mix:ACT1+ACT2, or a per-layer schedule gelu*2+swiglu*2
    d_ff: int | None = None  # None: chosen by ffn_match
    ffn_match: Literal["params", "flops", "none"] = "params"  # equal to the dense 4x FFN
    ffn_bias: bool | None = None  # None: variant's convention (dense on, gated off)
    init: Literal["lecun", "he", "he_gelu", "normal", "lecun_uniform", "family"] = DEFAULT_INIT  # FFN init, one
    # for all variants (family: the literature's per-activation table, a different experiment; he_gelu:
    # He x sqrt(2/pi), the GELU articles' advice for large models)
    dropout: float = 0.0
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    placement: Literal["pre", "post"] = "pre"
    glu_norm: Literal["none", "pre", "post", "both"] = "none"  # a norm around gated FFNs' gate, of the kind
    # --norm sets: on the gate and up projections' input (pre), on act(gate) * up before the down projection
    # (post), or both; dense layers have no gate and ignore it. Its weights are left out of the parameter match
    act_position: Literal["ffn", "before_norm", "after_residual"] = "ffn"  # where a dense FFN's activation
    # runs: inside it, or moved out (the FFN then two linear maps) onto the residual stream's copy entering the
    # FFN's norm (before_norm) or onto the block's output after the residual add (after_residual); pre-norm only
    pos: Literal["learned", "rope"] = "learned"
    tie_embeddings: bool = True
    task: Literal["lm", "cls", "image", "tokens", "reg"] = "lm"  # lm: the next token; cls: a text's label; image:
    # an image's label (a ViT: PatchEmbed's patches as tokens); tokens: a class (tag) per position, as in NER; reg:
    # a number per text (STS-B's similarity), one output (n_classes 1) and mean squared error
    n_classes: int = 2
    pool: Literal["mean", "cls"] = "mean"  # classifier head input: mean of tokens or the first token (for
    # task image a learned class token put first)
    attn_act: str | None = None  # activations on Q, K, V: one name for all three or e.g. "q=gelu,k=gelu"
    # (a missing projection gets none; "none": no activation anywhere); off in standard Transformers.
    # Kept in one spelling (`canonical_attn_act`), so one setting is one run id
    attn_proj_act: str | None = None  # older name: means the same as attn_act; kept so stored configs keep their ids
    image_size: int | None = None  # task image: side in pixels every image is resized to (NxN); None: the data's
    # own size, which all its images must share
    patch_size: int = 2  # task image: side of the square patches that are its tokens; divides image_size
    channels: int | None = None  # task image: 1 (grey) or 3 (RGB) channels; None: the data's own
    activation_checkpointing: Literal["none", "block", "ffn"] = "none"  # recompute in backward instead of keeping
    # for it: each block's activations, or each FFN's (the d_ff-wide ones); less memory, more time, the same numbers

    def __post_init__(self) -> None:
        check_config(self)
        self.attn_act = canonical_attn_act(self.attn_act)


CHOICES = {
    "norm": NORMS,
    "placement": ("pre", "post"),
    "glu_norm": GLU_NORMS,
    "act_position": ACT_POSITIONS,
    "pos": ("learned", "rope"),
    "task": ("lm", "cls", "image", "tokens", "reg"),
    "pool": ("mean", "cls"),
    "ffn_match": MATCHES,
    "activation_checkpointing": ("none", "block", "ffn"),
}


def check_config(cfg: ModelConfig) -> None:
    """Raise ValueError naming the first invalid field and its valid choices."""
    for name in ("vocab_size", "context", "n_layers", "n_heads", "d_model", "n_classes"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.d_ff is not None and cfg.d_ff <= 0:
        raise ValueError(f"d_ff must be positive, got {cfg.d_ff}")
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
    if cfg.pos == "rope" and (cfg.d_model // cfg.n_heads) % 2:
        raise ValueError(f"rope needs an even head size, got d_model/n_heads = {cfg.d_model // cfg.n_heads}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {cfg.dropout}")
    for name, valid in CHOICES.items():
        if getattr(cfg, name) not in valid:
            raise ValueError(f"unknown {name} '{shorten(getattr(cfg, name))}'; valid: {', '.join(valid)}")
    check_act_position(cfg, layer_variants(cfg.ffn, cfg.n_layers))
    check_init(cfg.init)
    check_image(cfg)
    if cfg.attn_act is not None and cfg.attn_proj_act is not None:
        raise ValueError(
            f"set attn_act or its older name attn_proj_act, not both: {cfg.attn_act!r}, {cfg.attn_proj_act!r}"
        )
    parse_attn_act(qkv_act_spec(cfg))


def check_act_position(cfg: ModelConfig, variants: list[str]) -> None:
    """ValueError unless the activation can be moved where act_position says: a pre-norm block (a post-norm
    block has no norm before its FFN) whose FFN is dense (one activation between two linear maps)."""
    if cfg.act_position == "ffn":
        return
    if cfg.placement != "pre":
        raise ValueError(
            f"act_position '{cfg.act_position}' moves the activation around a pre-norm block's FFN; "
            f"placement '{cfg.placement}' has no norm before it: use placement pre, or act_position ffn"
        )
    for variant in dict.fromkeys(variants):
        if get_ffn_spec(variant).kind != "dense":
            raise ValueError(
                f"act_position '{cfg.act_position}' moves a dense FFN's one activation; '{variant}' is "
                f"{get_ffn_spec(variant).kind}: use a dense variant (gelu, relu, ...), or act_position ffn"
            )


CHANNELS = (1, 3)
# NOTE: the 64x64 grid of SAM's ViT (1024-pixel images, 16-pixel patches); attention's cost grows with its square,
# and --image-size 1024 in 2-pixel patches (262,144 of them) ran for minutes where nothing could stop it
MAX_PATCHES = 64 * 64


def check_image(cfg: ModelConfig) -> None:
    """Raise ValueError for image fields that cannot make patches (checked for every task: they are inert
    but for task image)."""
    if cfg.patch_size <= 0:
        raise ValueError(f"patch_size must be positive, got {cfg.patch_size}")
    if cfg.image_size is not None and (cfg.image_size <= 0 or cfg.image_size % cfg.patch_size):
        raise ValueError(
            f"image_size must be a positive multiple of patch_size ({cfg.patch_size}), got {cfg.image_size}"
        )
    if cfg.image_size is not None and (cfg.image_size // cfg.patch_size) ** 2 > MAX_PATCHES:
        side = math.isqrt(MAX_PATCHES)
        raise ValueError(
            f"image_size {cfg.image_size} in patches of {cfg.patch_size} makes {(cfg.image_size // cfg.patch_size) ** 2:,} "
            f"patches an image, more than {MAX_PATCHES:,} ({side}x{side}); use image_size {cfg.patch_size} to "
            f"{side * cfg.patch_size} in steps of {cfg.patch_size}, or a larger patch_size"
        )
    if cfg.channels is not None and cfg.channels not in CHANNELS:
        raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {cfg.channels}")


PROJECTIONS = ("q", "k", "v")
NO_ACTIVATION = ("none", "identity")


def qkv_act_spec(cfg: ModelConfig) -> str | None:
    """The Q/K/V activation spec a model runs: attn_act, or the older attn_proj_act."""
    return cfg.attn_act if cfg.attn_act is not None else cfg.attn_proj_act


def parse_attn_act(text: str | None) -> dict[str, str | None]:
    """{"q": act, "k": act, "v": act} from an attn_act spec; None for no activation.

    One name ("gelu") puts that activation on all three; "q=gelu,k=gelu,v=identity" names each,
    and a projection left out gets none; None, "none" and "identity" mean none. Names are the
    registry's canonical keys. ValueError naming the problem and the valid keys or names.
    """
    if text is None or not text.strip():
        return dict.fromkeys(PROJECTIONS)
    items = [item.strip() for item in text.split(",")]
    shown = shorten(text)  # as the errors echo it
    if len(items) == 1 and "=" not in items[0]:
        names = dict.fromkeys(PROJECTIONS, items[0])
    else:
        names = {}
        for item in items:
            key, sep, name = (part.strip() for part in item.partition("="))
            if not sep or not name:
                raise ValueError(
                    f"attn_act '{shown}': expected one activation or key=activation pairs, got '{shorten(item)}'"
                )
            if key not in PROJECTIONS:
                raise ValueError(
                    f"attn_act '{shown}': unknown projection '{shorten(key)}'; valid: {', '.join(PROJECTIONS)}"
                )
            if key in names:
                raise ValueError(f"attn_act '{shown}': projection '{key}' given twice")
            names[key] = name
    return {
        key: None if names.get(key) is None or names[key].lower() in NO_ACTIVATION else resolve(names[key])
        for key in PROJECTIONS
    }


def canonical_attn_act(text: str | None) -> str | None:
    """The one spelling of an attn_act spec: "none" where no projection has an activation, the name
    alone where all three have one ("gelu"), else key=name for each projection that has one, in q,
    k, v order ("k=gelu,q=gelu,v=identity" -> "q=gelu,k=gelu"); None, the default, stays None.

    NOTE: a run's id hashes its config, so these are the spellings stores already hold (the docs'
    "none", "gelu", "q=gelu,k=gelu"); only the other spellings of a setting map onto them.
    """
    if text is None:
        return None
    acts = parse_attn_act(text)
    if len(set(acts.values())) == 1:
        return acts["q"] or "none"
    return ",".join(f"{key}={act}" for key, act in acts.items() if act)


def describe_attn_act(text: str | None) -> str:
    """An attn_act spec in words for reports: "none", "gelu on Q, K and V" or "Q gelu, K gelu, V none"."""
    acts = parse_attn_act(text)
    if len(set(acts.values())) == 1:
        return "none" if acts["q"] is None else f"{acts['q']} on Q, K and V"
    return ", ".join(f"{key.upper()} {act or 'none'}" for key, act in acts.items())


def rope_tables(context: int, head_dim: int, base: float = 10000.0) -> Rope:
    """cos and sin tables (context, head_dim/2) for rotary embeddings (Su et al. 2021, RoFormer)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(context, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # x: (B, nh, T, hs)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    T = x.shape[-2]
    cos, sin = cos[:T], sin[:T]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout: float = 0.0) -> torch.Tensor:
    """scaled_dot_product_attention over (B, nh, T, hs); bf16 and fp16 inputs on the CPU are attended in fp32.

    NOTE: the CPU flash-attention kernel's bf16 backward measured slower than its fp32 one
    (benchmarks/train_speed.md), and its fp16 one 2.7x slower than fp16 inputs attended in fp32 (5.35
    against 1.98 ms, batch 16 x 4 heads x 64 x 32, AMX Xeon), so under CPU autocast the scores, softmax and
    weighted sum run in fp32 (also the more accurate choice) and only the result is cast back.
    """
    if q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cpu":
        q32, k32, v32 = q.float(), k.float(), v.float()
        y: torch.Tensor
        if CPU_FLASH is not None and not dropout:
            y = CPU_FLASH(q32, k32, v32, 0.0, causal)[0]
        else:
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal, dropout_p=dropout)
        return y.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout)


# The CPU flash-attention kernel that F.scaled_dot_product_attention runs for fp32 inputs without dropout, called
# directly: autocast leaves it alone, so `attend` needs no autocast-off block there, which torch.compile's
# AOTAutograd cache cannot store ("Unsupported call_function target _enter_autocast": every --compile run traced
# the model again; with warm caches on the AMX Xeon a bf16 run of the quick preset started in 3.6 s, now 2.5 s).
# None where a torch build lacks it.
CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


class Attention(nn.Module):
    """Multi-head self-attention with scaled_dot_product_attention; causal for the LM."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.causal = cfg.n_heads, cfg.task == "lm"
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        # one module per projection: a learnable activation learns its own parameters for each
        acts = parse_attn_act(qkv_act_spec(cfg))
        self.qkv_acts = nn.ModuleDict({key: get_activation(name) for key, name in acts.items() if name})
        self.dropout = cfg.dropout

    def project_heads(
        self, x: torch.Tensor, rope: Rope | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, nh, T, hs), with the optional per-projection activations and RoPE applied."""
        B, T, C = x.shape
        projected = dict(zip(PROJECTIONS, self.qkv(x).split(C, dim=2)))  # (B, T, C) each
        for key, act in self.qkv_acts.items():
            projected[key] = act(projected[key])
        q, k, v = (projected[key].view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for key in PROJECTIONS)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        q, k, v = self.project_heads(x, rope)
        y = attend(q, k, v, self.causal, self.dropout if self.training else 0.0)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(B, T, C))
        return out

    def attention_probs(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """Attention probabilities (B, nh, T, T), for plots; same math as forward."""
        q, k, _ = self.project_heads(x, rope)
        att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            T = x.shape[1]
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return att.softmax(dim=-1)


def make_norm(cfg: ModelConfig) -> nn.Module:
    return norm_layer(cfg.norm, cfg.d_model)


class Block(nn.Module):
    """Attention and FFN sub-layers with residuals; norm before (pre) or after (post) each.

    `cfg.act_position` places a dense FFN's activation (pre-norm blocks only), with h = x + attn(norm1(x)):

        ffn             h + W_out act(W_in norm2(h))   the Transformer's FFN (the default)
        before_norm     h + W_out W_in norm2(act(h))   the activation on the residual stream's copy that
                                                       enters the FFN's norm; the stream itself stays linear
        after_residual  act(h + W_out W_in norm2(h))   the activation on the block's output, the stream

    W_out W_in z is the FFN's two linear maps, biases included, and a moved activation runs on d_model
    channels instead of d_ff. The two moved forms are the misplaced setups of articles on GELU ("GELU
    before LayerNorm" and "after the residual", where "training failed completely"; issue #28, measured
    in ffnlab/tools/claims.json). The FFN keeps its variant's weights, sizes and initialisation, so a
    seed's runs start from the same weights at every position.
    """

    def __init__(self, cfg: ModelConfig, ffn: str | None = None) -> None:  # ffn: this layer's variant
        super().__init__()
        self.pre = cfg.placement == "pre"
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.attn = Attention(cfg)
        variant = ffn or cfg.ffn
        # the norm around the gate: gated layers only (a schedule's dense layers have no gate)
        glu_norm = cfg.glu_norm if get_ffn_spec(variant).gated else "none"
        # init=None: the Transformer's init_weights initialises it, from the model's per-parameter generators
        self.ffn = build_ffn(variant, cfg.d_model, cfg.d_ff, cfg.ffn_bias, cfg.ffn_match, init=None,
                             glu_norm=glu_norm, norm=cfg.norm)  # fmt: skip
        self.drop = nn.Dropout(cfg.dropout)
        # act_position: the FFN's activation moved out of it, to where misplaced_ffn applies it
        self.act_position = cfg.act_position
        self.moved_act: nn.Module | None = None if cfg.act_position == "ffn" else take_activation(self.ffn)
        self.checkpointing = cfg.activation_checkpointing

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        if self.pre:
            attn = self.attn(self.norm1(x), rope)
            x = x + self.drop(attn)
            if self.moved_act is not None:
                return self.misplaced_ffn(x, attn)
            out: torch.Tensor = x + self.drop(self.run_ffn(self.norm2(x), attn))
            return out
        attn = self.attn(x, rope)
        x = self.norm1(x + self.drop(attn))
        out = self.norm2(x + self.drop(self.run_ffn(x, attn)))
        return out

    def run_ffn(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The FFN on h, its attention-aware activations (agelu) reading this block's attention output `attn`;
        with 'ffn' checkpointing run again in backward (with the same dropout draws), keeping only h for it."""
        if self.checkpointing == "ffn" and torch.is_grad_enabled():
            out: torch.Tensor = checkpoint(self.ffn_reading, h, attn, use_reentrant=False)
            return out
        return self.ffn_reading(h, attn)

    def ffn_reading(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        # NOTE: the attention context is entered inside what a checkpoint recomputes, or agelu would recompute without it
        with attention_context(self.ffn, attn):
            out: torch.Tensor = self.ffn(h)
        return out

    def misplaced_ffn(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        """The pre-norm FFN sub-layer with its activation moved to `act_position` (see the class)."""
        assert self.moved_act is not None
        out: torch.Tensor
        if self.act_position == "before_norm":
            out = h + self.drop(self.run_ffn(self.norm2(self.moved_act(h)), attn))
        else:  # after_residual
            out = self.moved_act(h + self.drop(self.run_ffn(self.norm2(h), attn)))
        return out


def take_activation(ffn: nn.Module) -> nn.Module:
    """A dense FFN's activation module, taken out of it: the FFN is left W_out(W_in x + b_in) + b_out,
    its spec (so its sizes and initialisation) the variant's. TypeError for any other FFN."""
    if not isinstance(ffn, DenseFFN):
        raise TypeError(f"only a dense FFN's activation can be moved, got {type(ffn).__name__}")
    act, ffn.act = ffn.act, get_activation("identity")
    return act


class PatchEmbed(nn.Module):
    """Images (B, channels, H, W) -> one token per patch (B, T, d_model), ViT's patch embedding (Dosovitskiy
    et al. 2021): each patch_size x patch_size patch flattened and projected by one linear map, which is a
    Conv2d with kernel = stride = patch_size; with pool "cls" a learned class token is put first."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.image_size is None or cfg.channels is None:
            raise ValueError("task image needs image_size and channels (the run sets them from its data)")
        self.patch = cfg.patch_size
        self.proj = nn.Linear(cfg.channels * cfg.patch_size**2, cfg.d_model)
        # NOTE: zeros, as the original ViT; a vector (not 3-d) so AdamW does not decay it, like a bias
        self.cls_token = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.pool == "cls" else None

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, ch, H, W) -> (B, T, C)
        B, ch, H, W = images.shape
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)  # (B, ch, H/p, W/p, p, p)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(B, (H // p) * (W // p), ch * p * p)  # row by row
        x: torch.Tensor = self.proj(patches)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, 1, -1).to(x.dtype), x], dim=1)
        return x


def image_tokens(cfg: ModelConfig) -> int:
    """The sequence length of task image: (image_size / patch_size)^2 patches, one more with a class token."""
    assert cfg.image_size is not None  # set from the data before a model is built
    return (cfg.image_size // cfg.patch_size) ** 2 + (cfg.pool == "cls")


class Transformer(nn.Module):
    """Token embeddings, n_layers blocks, final norm, and an LM, classification, regression or tagging head."""

    rope_cos: torch.Tensor  # buffers, registered when cfg.pos is "rope"
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = PatchEmbed(cfg) if cfg.task == "image" else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model) if cfg.pos == "learned" else None
        if cfg.pos == "rope":
            cos, sin = rope_tables(cfg.context, cfg.d_model // cfg.n_heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        # each layer its own variant: all one for a plain name, a schedule's runs in order otherwise
        self.blocks = nn.ModuleList(Block(cfg, ffn) for ffn in layer_variants(cfg.ffn, cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.placement == "pre" else nn.Identity()
        if cfg.task == "lm":
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                assert isinstance(self.tok_emb, nn.Embedding)  # a PatchEmbed only for task image
                self.head.weight = self.tok_emb.weight
        else:
            self.head = nn.Linear(cfg.d_model, 1 if cfg.task == "reg" else cfg.n_classes)  # reg: one scalar
        init_weights(self, seed)

    def rope(self) -> Rope | None:
        return (self.rope_cos, self.rope_sin) if self.cfg.pos == "rope" else None

    def embed(self, idx: torch.Tensor) -> torch.Tensor:  # idx: (B, T), or images (B, ch, H, W) -> (B, T, C)
        x = self.tok_emb(idx)
        T = x.shape[1]
        if self.cfg.context < T:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.cfg.context}")
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        out: torch.Tensor = self.drop(x)
        return out

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids or images (B, ch, H, W) -> logits (B, T, vocab) for the LM, (B, n_classes) for
        cls and image, (B, 1) for reg, or (B, T, n_classes) for tokens, and the loss: cross-entropy (targets
        IGNORE_INDEX count in none), for reg the mean squared error of the scalar against float targets (B,)."""
        x = self.embed(idx)
        rope = self.rope()
        recompute = self.cfg.activation_checkpointing == "block" and torch.is_grad_enabled()
        for block in self.blocks:  # 'block' checkpointing keeps each block's input only, and runs it again in backward
            x = checkpoint(block, x, rope, use_reentrant=False) if recompute else block(x, rope)
        x = self.norm(x)
        if self.cfg.task in ("cls", "image", "reg"):
            x = x.mean(dim=1) if self.cfg.pool == "mean" else x[:, 0]
        logits = self.head(x) if self.cfg.task != "reg" else scalar_head(self.head, x)
        if targets is None:
            return logits, None
        if self.cfg.task == "reg":
            return logits, F.mse_loss(logits.squeeze(-1).float(), targets.float())
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX
        )
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """Attention probabilities (B, nh, T, T) at one layer for a fixed input."""
        x, rope = self.embed(idx), self.rope()
        for block in self.blocks[:layer]:
            x = block(x, rope)
        block = self.blocks[layer]
        assert isinstance(block, Block)  # an nn.ModuleList's items are typed nn.Module
        return block.attn.attention_probs(block.norm1(x) if block.pre else x, rope)


def scalar_head(head: nn.Linear, x: torch.Tensor) -> torch.Tensor:  # (B, C) -> (B, 1)
    """A regressor's one output in fp32, head(x) as an elementwise product and sum, which autocast leaves alone.

    NOTE: under bf16 autocast a Linear's output keeps 8 bits: a barely trained regressor's nearby predictions were
    rounded to one value, and their correlation with the truth came out 0/0 where fp32 measured it."""
    return (x.float() * head.weight.float()).sum(dim=-1, keepdim=True) + head.bias.float()


def param_seed(seed: int, name: str, shape: Sequence[int]) -> int:
    """The seed of one parameter's generator: equal for equal (seed, name, shape) in any model."""
    digest = hashlib.sha256(f"{seed}/{name}/{tuple(shape)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def param_generator(seed: int, prefix: str, name: str, shape: Sequence[int]) -> torch.Generator:
    """The random stream of parameter `name` of the module at `prefix` ("blocks.0.ffn."), seeded by
    `param_seed`; `functools.partial(param_generator, seed, prefix)` is an FFN's `init_ffn` generator_for."""
    return torch.Generator().manual_seed(param_seed(seed, prefix + name, shape))


@torch.no_grad()
def init_weights(model: Transformer, seed: int = 0) -> None:
    """Initialise each parameter from its own generator, seeded by (seed, name, shape): the model's
    one initialisation (its FFNs are built uninitialised, `build_ffn(init=None)`).

    Same-named, same-shaped parameters therefore start identical whatever the FFN variant: with
    one seed, relu and swiglu models share embeddings and attention weights, so a seed pairs runs.
    Non-FFN weights: normal(0, 0.02) (GPT-2); residual output projections scaled by
    1/sqrt(2*n_layers) (GPT-2); FFN weights by the FFN's scheme (`init_ffn`); biases zero.
    """
    cfg = model.cfg
    for name, module in model.named_modules():
        if name.endswith(".ffn"):
            init_ffn(module, cfg.init, functools.partial(param_generator, seed, f"{name}."))
        elif isinstance(module, (nn.Linear, nn.Embedding)) and ".ffn." not in name:
            if module is model.head and cfg.task == "lm" and cfg.tie_embeddings:
                continue
            std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith("attn.proj") else 0.02
            module.weight.normal_(0.0, std, generator=param_generator(seed, f"{name}.", "weight", module.weight.shape))
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()


def param_count(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def model_param_count(cfg: ModelConfig, advice: str = "use a smaller --d-model, --layers or --context") -> int:
    """`param_count(Transformer(cfg))` without building its layers: a one-layer model and one block of each
    variant, on the meta device, and each block's count times its layers. So the size of a model of any depth
    is known at once (building 10^8 layers on the meta device took minutes). ValueError ending in `advice` for
    sizes that overflow (`build_on_meta`)."""
    spec = get_ffn_spec(cfg.ffn)
    runs = spec.runs if spec.kind == "schedule" else ((spec.name, cfg.n_layers),)
    one_layer = build_on_meta(lambda: Transformer(replace(cfg, n_layers=1, ffn=runs[0][0])), advice)
    outside = param_count(one_layer) - param_count(one_layer.blocks[0])
    per_block = {v: param_count(build_on_meta(functools.partial(Block, cfg, v), advice)) for v, _ in runs}
    return outside + sum(n * per_block[v] for v, n in runs)


def layered_param_count(build: Callable[[int], nn.Module], n_layers: int, advice: str) -> int:
    """The parameters of `build(n_layers)`, a model of n_layers alike layers (a Hugging Face decoder), from
    build(1) and build(2) on the meta device: all but the layers, plus n_layers times one layer. Exact where
    every layer is like the second; for layers that differ (MoE every other layer) an estimate, to refuse an
    absurd depth before it is built."""
    one, two = (param_count(build_on_meta(functools.partial(build, n), advice)) for n in (1, 2))
    return one + (n_layers - 1) * (two - one)
