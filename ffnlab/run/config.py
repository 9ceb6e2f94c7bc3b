"""What defines one run (`TrainConfig`, whose JSON is stored beside every result); what it measured is
`ffnlab.run.result.RunResult`."""

from __future__ import annotations

import math
from dataclasses import Field, asdict, dataclass, field, fields, replace
from typing import Any, Literal, get_args

from ffnlab._util.machine import check_threads
from ffnlab.core.model import ModelConfig
from ffnlab.data.glue import glue_fields
from ffnlab.data.pairs import check_pair_context, check_pair_task, is_pair, text_fields
from ffnlab.data.tokenizer import check_tokenizer_name, check_word_vocab
from ffnlab.run.result import RunResult as RunResult  # moved to ffnlab.run.result; imported here for code before 0.3

Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS = get_args(Precision)
PEFT_METHODS = ("lora",)  # TrainConfig.peft's choices (ffnlab.tools.lora)
DIVERGENCE = ("nonfinite", "blowup")  # the kinds of divergence, the event kinds that end a run
DEVICES = ("cpu", "cuda", "auto")


def threads_flag(text: str) -> int:
    """--threads as the flag reads it: a thread count this machine can run (`check_threads`), refused before any
    work (torch.set_num_threads(100000) ends the process in the OpenMP runtime)."""
    try:
        threads = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number of threads, got '{text}'") from None
    return check_threads(threads)


@dataclass
class TrainConfig:
    """Everything that defines a run; `asdict` of it is stored beside the result."""

    model: ModelConfig = field(default_factory=ModelConfig)  # vocab_size is set from the tokenizer
    hf_config: dict[str, Any] | None = None  # a Hugging Face config: train that architecture instead (FFN swapped)
    init_from: str | None = None  # a save_pretrained folder to fine-tune from (its architecture and weights);
    # model.ffn is then the activation it runs after a weight-keeping swap (ffnlab.tools.pretrained)
    init_digest: str | None = None  # sha256 of that folder's config and weights, set when planned or run
    data: str = "shakespeare"  # bundled corpus, a local path, or a Hugging Face dataset name; glue:DIR:TASK one of
    # GLUE's tasks, which sets the task and its columns (ffnlab.data.glue); compare takes glue:DIR, all of them
    tokenizer: str = field(default="char", metadata={"parse": check_tokenizer_name})  # char, byte, bpe, word,
    # pretrained or FILE.json: characters, UTF-8 bytes, BPE trained on the corpus, words (split on whitespace and
    # punctuation; perplexity per word, as in WikiText's published numbers), the init_from folder's own (read as
    # transformers reads it: tokenizer.json, vocab.txt, or vocab.json and merges.txt; the default with --from where
    # the folder has one), or a tokenizer saved by `tokenizers` (GPT-2's or LLaMA's tokenizer.json); task tokens reads
    # each word of a sentence as one position, its tokenizer 'word' ('char', the default, becomes 'word' there; with
    # --from 'pretrained', each word's first sub-token tagged); a prepared folder (ffnlab data prepare) brings its
    # own, which another given here must match
    bpe_vocab: int = 512  # vocabulary size of a BPE tokenizer trained on the corpus
    word_vocab: int | None = None  # vocabulary size of a word tokenizer, <unk> included: the most frequent words
    # of the train split, the others <unk>; None: every word it has (WikiText's files already have <unk>)
    ids_vocab: int | None = None  # vocabulary size of tokens prepared elsewhere, whose tokenizer is unknown: llm.c's
    # shards (None: 50257, GPT-2's), nanoGPT's train.bin (needed)
    text_field: str = "text"  # the text column of a dataset with columns (CSV, JSON lines, Hugging Face); two,
    # comma-separated (premise,hypothesis), make a sentence pair for task cls, joined by a separator id; task
    # tokens: the column of words, 'tokens' unless set
    label_field: str = "label"  # the label column, for task cls; task tokens: the column of tags, 'ner_tags' unless set
    special_tokens: bool = False  # set from tokenizer and task: examples carry the special tokens of the init_from
    # folder's own tokenizer (its template: [CLS] a [SEP] b [SEP]) and are padded under an attention mask, as
    # transformers' examples fine-tune (tokenizer 'pretrained', every task but lm); else cropped or repeated
    seed: int = 0  # data order, weights, dropout; a variant's seed s shares all but its FFN with the others'
    batch_size: int = 16  # sequences per forward pass of each process; an optimizer step's global batch is
    # batch_size x nproc x grad_accum
    grad_accum: int = 1  # forward passes whose gradients add up before each optimizer step: a larger global batch
    # in the memory of one
    nproc: int = 1  # processes the run trains in, each on its share of every global batch, gradients averaged
    # over them (DDP: gloo on the CPU, NCCL on GPUs); torchrun's processes when it started the run
    max_steps: int = 200  # optimizer steps
    max_tokens: int | None = None  # overrides max_steps: steps = ceil(tokens / (batch * context))
    max_seconds: float | None = None  # wall-clock budget: stops at whichever budget ends first, and
    # the schedule follows the larger of step and time progress
    lr: float = 2e-3  # peak learning rate (AdamW)
    min_lr: float | None = None  # end of the cosine decay; None: lr / 10
    warmup_steps: int = 20  # linear warm-up from 0 to lr, then cosine decay to min_lr
    weight_decay: float = 0.1  # on matrices only, not on biases, norms or learnable activations
    beta2: float = 0.99  # AdamW's beta2, the decay of its running mean of squared gradients
    grad_clip: float = 1.0  # global gradient-norm clip
    eval_every: int = 50  # steps between validation evaluations (the curves)
    eval_batches: int = 8  # fixed validation batches at each evaluation during training (the curves)
    final_eval_batches: int = 32  # at the end, on val and test: the metric a comparison ranks by, measured on
    # more tokens, so less evaluation noise in paired differences (docs/explanation/default-study.md)
    log_every: int = 10  # FFN gradient statistics every this many steps
    spike_factor: float = 4.0  # a spike is a value above this times the running median
    diverge_factor: float = 3.0  # a run diverges when its training loss stays above this times its best so far
    # (the lowest median of 10 consecutive steps) for diverge_steps steps in a row, as it does when non-finite
    diverge_steps: int = 50  # steps in a row above diverge_factor x the best loss that make a run diverged
    noise_std: float = 0.1  # Gaussian noise on the embeddings for the robustness probe
    precision: Precision = "auto"  # auto: bf16 autocast where it pays (resolve_precision); fp16: fp16 autocast
    # with a gradient scaler, whose skipped steps (gradients that overflowed fp16) are not divergence
    device: Literal["cpu", "cuda", "auto"] = "cpu"  # auto: cuda where available
    compile: bool = False  # torch.compile the model
    threads: int | None = field(default=None, metadata={"parse": threads_flag})  # torch.set_num_threads for the
    # run; None keeps the process's setting
    checkpoint_dir: str | None = None  # None: no checkpoints
    checkpoint_every: int = 100  # steps between checkpoints (with checkpoint_dir)
    shard: bool = False  # with nproc > 1, shard parameters, gradients and optimizer state over the processes
    # (FSDP2's fully_shard, block by block) instead of a copy in each: for a model that does not fit one device;
    # checkpoints and weights gathered whole into an unsharded run's files; no QAT or save_pretrained yet
    qat_from: float | None = None  # quantisation-aware training: from this fraction of training on (0 to 1, by
    # the schedule's progress), every linear layer is fake-quantised to int8 (torchao; ffnlab.tools.quantize)
    peft: Literal["lora"] | None = None  # parameter-efficient fine-tuning of the init_from folder's model: 'lora'
    # trains low-rank adapters (peft's LoRA) on lora_targets and a classifier's new head, every pretrained weight
    # frozen, the FFN's included (ffnlab.tools.lora)
    lora_r: int = 8  # rank of each LoRA adapter
    lora_alpha: int = 16  # LoRA's scale: an adapter's update is multiplied by lora_alpha / lora_r
    lora_targets: str | None = None  # comma-separated names of the modules LoRA adapts (query,value); None: peft's
    # default for the model's family (BERT query,value; GPT-2 c_attn; LLaMA q_proj,v_proj), set when the run starts

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)
        if glue := glue_fields(self.data):  # one GLUE task trains as GLUE has it: its task type and columns
            task, self.text_field, self.label_field = glue
            self.model = replace(self.model, task=task)
        if self.model.task == "tokens":
            self.tokenizer = tagger_tokenizer(self)  # so the stored config says what ran
        if self.model.task == "image" and (self.hf_config or self.init_from):
            raise ValueError("task image trains ffnlab's own ViT; --hf-config and --from take text models")
        for name in (
            "batch_size",
            "max_steps",
            "eval_every",
            "eval_batches",
            "final_eval_batches",
            "log_every",
            "checkpoint_every",
            "diverge_steps",
            "grad_accum",
            "nproc",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed takes
            raise ValueError(f"seed must be between -2**63 and 2**64 - 1, got {self.seed}")
        for name in ("max_tokens", "max_seconds", "threads"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("lr", "min_lr", "max_seconds", "weight_decay", "beta2", "grad_clip", "noise_std", "spike_factor",
                     "diverge_factor"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if not self.lr > 0 or (self.min_lr or 0) < 0 or self.warmup_steps < 0 or self.grad_clip <= 0:
            raise ValueError("lr and grad_clip must be positive, min_lr and warmup_steps non-negative")
        if self.min_lr is not None and self.min_lr > self.lr:
            raise ValueError(
                f"min_lr {self.min_lr:g} is above lr {self.lr:g}: the schedule decays from lr down to min_lr"
            )
        if self.weight_decay < 0 or self.noise_std < 0 or not 0 <= self.beta2 < 1 or not self.spike_factor > 1:
            raise ValueError(
                f"need weight_decay >= 0, noise_std >= 0, 0 <= beta2 < 1 and spike_factor > 1, got "
                f"{self.weight_decay}, {self.noise_std}, {self.beta2}, {self.spike_factor}"
            )
        if not self.diverge_factor > 1:
            raise ValueError(f"diverge_factor must be above 1 (a multiple of the best loss), got {self.diverge_factor}")
        if self.tokenizer == "pretrained" and not self.init_from:
            raise ValueError(
                "tokenizer 'pretrained' is the init_from folder's (--from); valid without it: char, byte, bpe, word"
            )
        check_tokenizer_name(self.tokenizer)
        self.special_tokens = self.tokenizer == "pretrained" and self.model.task != "lm"
        if self.word_vocab is not None:
            check_word_vocab(self.word_vocab)
        if self.ids_vocab is not None and self.ids_vocab <= 0:
            raise ValueError(f"ids_vocab must be positive, got {self.ids_vocab}")
        self.text_field = ",".join(text_fields(self.text_field))  # one spelling, one run id: 'a, b' is 'a,b'
        check_text_field(self)
        if self.init_from and self.hf_config:
            raise ValueError("give a pretrained folder (init_from, --from) or a Hugging Face config, not both")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision '{self.precision}'; valid: {', '.join(PRECISIONS)}")
        if self.model.activation_checkpointing == "ffn" and (self.hf_config or self.init_from):
            raise ValueError(
                "activation_checkpointing 'ffn' needs ffnlab's Transformer (a Hugging Face model checkpoints whole "
                "layers); valid with --hf-config or --from: none, block"
            )
        if self.qat_from is not None and not 0.0 <= self.qat_from < 1.0:
            raise ValueError(f"qat_from must be a fraction of training in [0, 1), got {self.qat_from}")
        if self.device not in DEVICES:
            raise ValueError(f"unknown device '{self.device}'; valid: {', '.join(DEVICES)}")
        check_peft(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: batch_size in each process, nproc processes, grad_accum passes each."""
        return self.batch_size * self.nproc * self.grad_accum

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**d)


def tagger_tokenizer(cfg: TrainConfig) -> str:
    """The tokenizer of a task tokens config, which the default 'char' becomes: 'word' for ffnlab's Transformer (one
    word per position), 'pretrained' for a fine-tune (--from: the folder's own, its words' first sub-tokens tagged).
    ValueError, one line, for any other, or a Hugging Face config trained from scratch."""
    if cfg.hf_config:
        raise ValueError(
            "task 'tokens' trains ffnlab's Transformer or fine-tunes a pretrained folder (--from); --hf-config takes "
            "task lm or cls"
        )
    own = "pretrained" if cfg.init_from else "word"
    if cfg.tokenizer not in ("char", own):
        how = (
            "with the folder's own tokenizer, a word's first sub-token"
            if cfg.init_from
            else "whole words, one position each"
        )
        raise ValueError(
            f"task 'tokens' tags {how}: its tokenizer is '{own}' (what the default 'char' becomes for it), not "
            f"'{cfg.tokenizer}'"
        )
    return own


def check_peft(cfg: TrainConfig) -> None:
    """ValueError, one line, unless the LoRA fields make a run ffnlab can train: adapters on a pretrained folder
    (init_from), a positive rank and scale, no LoRA setting without --peft, and no flag that cannot work with it.
    The targets are checked against the folder's model when the run is planned (ffnlab.run.train.resolve_lora)."""
    if cfg.peft not in (None, *PEFT_METHODS):
        raise ValueError(f"unknown peft method '{cfg.peft}'; valid: {', '.join(PEFT_METHODS)}")
    if cfg.lora_r <= 0 or cfg.lora_alpha <= 0:
        raise ValueError(f"lora_r and lora_alpha must be positive whole numbers, got {cfg.lora_r} and {cfg.lora_alpha}")
    if cfg.lora_targets is not None:
        cfg.lora_targets = ",".join(t.strip() for t in cfg.lora_targets.split(",") if t.strip()) or None
    if cfg.peft is None:
        if (cfg.lora_r, cfg.lora_alpha, cfg.lora_targets) != (TrainConfig.lora_r, TrainConfig.lora_alpha, None):
            raise ValueError("--lora-r, --lora-alpha and --lora-targets set LoRA's adapters: add --peft lora")
        return
    if not cfg.init_from:
        raise ValueError(f"--peft {cfg.peft} trains adapters on a pretrained model: add --from FOLDER")
    if cfg.qat_from is not None:
        raise ValueError("--peft keeps the pretrained weights frozen, which --qat-from would fake-quantise: drop one")
    if cfg.shard:
        raise ValueError("--shard cannot train LoRA adapters yet (their optimiser state is small): drop --shard")


def flag_of(f: Field[Any]) -> str:
    """The command-line flag that sets a config field (TrainConfig's or ModelConfig's): the one its metadata
    names, else --the-field-name; ffnlab.flags builds the flags by it, advise's suggested commands spell them by it."""
    flag: str = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
    return flag


def check_text_field(cfg: TrainConfig) -> None:
    """ValueError unless text_field names one column, or two (a sentence pair, ffnlab.data.pairs) for a classifier
    whose context holds a pair: trained from scratch, or fine-tuned with the folder's own tokenizer, whose template
    joins the pair (ffnlab.data.checkpoint_tokenizer)."""
    check_pair_task(cfg.text_field, cfg.model.task)
    if is_pair(cfg.text_field):
        check_pair_context(cfg.model.context)
    if is_pair(cfg.text_field) and cfg.init_from and cfg.tokenizer != "pretrained":
        raise ValueError(
            f"a sentence pair fine-tuned from a folder (--from) is joined by the template of the folder's own "
            f"tokenizer (--tokenizer pretrained); '{cfg.tokenizer}' would add a separator id, which the vocabulary of "
            "the pretrained model does not have"
        )


# What makes a run's identity (ffnlab.study.plan.run_id, the hash a store finds a run by), listed by the
# version of ffnlab's configs that added each field ("model." for ModelConfig). Version 1's fields are
# hashed whenever they are not None (how every store so far was written); a field of a later version is
# hashed only when it is not at its default, so adding a field never changes the id of a run already
# stored and needs no legacy special case. A new field joins the next version (tests/test_sweep.py fails
# for a field in no version), or NOT_IDENTITY when it does not change what a run computes.
IDENTITY_FIELDS: dict[int, tuple[str, ...]] = {
    1: (
        "hf_config", "init_from", "init_digest", "data", "tokenizer", "bpe_vocab", "text_field", "label_field",
        "seed", "batch_size", "max_steps", "max_tokens", "max_seconds", "lr", "min_lr", "warmup_steps",
        "weight_decay", "beta2", "grad_clip", "eval_every", "eval_batches", "final_eval_batches", "log_every",
        "spike_factor", "noise_std", "precision", "device", "compile", "threads", "checkpoint_every",
        "model.vocab_size", "model.context", "model.n_layers", "model.n_heads", "model.d_model", "model.ffn",
        "model.d_ff", "model.ffn_match", "model.ffn_bias", "model.init", "model.dropout", "model.norm",
        "model.placement", "model.pos", "model.tie_embeddings", "model.task", "model.n_classes", "model.pool",
        "model.attn_act", "model.attn_proj_act",
    ),
    2: ("qat_from",),
    3: ("diverge_factor", "diverge_steps", "word_vocab", "model.image_size", "model.patch_size", "model.channels",
        "model.activation_checkpointing",  # checkpointing: the same numbers, other costs (memory, time)
        "model.glu_norm", "model.act_position"),
    4: ("grad_accum", "nproc", "shard"),  # the global batch, and how its gradients are reduced
    5: ("ids_vocab",),  # tokens prepared elsewhere
    6: ("peft", "lora_r", "lora_alpha", "lora_targets",  # LoRA: what trains, and how
        "special_tokens"),  # a folder's own tokenizer, its template and padding (cls had been cropped or repeated)
}  # fmt: skip
NOT_IDENTITY = ("checkpoint_dir",)  # where a run keeps its checkpoints is not what it computes


def identity(cfg: TrainConfig) -> dict[str, Any]:
    """The part of a run's config its id hashes (IDENTITY_FIELDS), nested as the config is."""
    config, defaults = cfg.to_dict(), TrainConfig().to_dict()
    out: dict[str, Any] = {"model": {}}
    for version, names in IDENTITY_FIELDS.items():
        for name in names:
            table, _, key = name.rpartition(".")
            mine, default = (config[table] if table else config), (defaults[table] if table else defaults)
            if mine[key] is not None and (version == 1 or mine[key] != default[key]):
                (out[table] if table else out)[key] = mine[key]
    return out
