"""The decision flow of `ffnlab advise`: the inputs a recommendation branches on, and the rules each
branch applies, kept as data in advice_rules.csv (rule, branch, evidence, source, tier, picks, quote_kind,
quote, text), and the checks a troubleshooting answer runs in order, in advice_checks.csv.

    situation   pretrain | finetune | peft | inference    what is being done with the model
    hardware    cpu | mobile | gpu | gpu-8gb ... gpu-80gb  where it trains or runs (--deploy maps onto it)
    seq_len     tokens per sequence                        long context: the FFN's share of the cost shrinks
    model_size  parameters                                 small, mid (the published scale) or large
    budgets     parameters, training memory                a variant over a budget is out of the running
    depth       layers                                     the tiers < 6, 6-12, > 12
    priority    research | industrial | maintenance        what matters most beyond quality
    task_type   nlp | cv                                   seed 000's two tables
    symptom     nan | slow | mismatch                      troubleshooting: checks in order, no pick

Every rule states its evidence: "published" (a paper's table or a published model), "rule of thumb"
(an estimate, a practice or an article's advice, with where it comes from); measured evidence comes from
a run store. A rule that rests on an article quotes the statement (its `quotes`: 'seed 002: "..."'), marked
by its `quote_kind`: "paraphrase" where the statement is in the words of the issue that reported it, the
article's full text not being in this repository; its text says what an article says only for what it
quotes, and calls the rest ffnlab's reading. A rule may prefer some variants (its `picks`); a tiered rule
holds for a range of its input (its `tier`, as the source writes it: '<6', '6-12', '>12'). Where several
rules prefer variants, they narrow the candidates in this order, each only where it leaves one
(ffnlab.study.advise.rules):

    budgets > hardware (mobile, VRAM tier) > priority > model size (published) > long text > depth tier
    (a first attempt, with nothing stated, has only seed 002's first-attempt rule)

and among what is left the evidence (published or measured) picks. With a store, a measurement outranks a
rule of thumb wherever the store measured that situation (the same depth tier, a long context); the advice
says which rule, not which measurement, decided, and where a measurement disagrees with an article it says
both, the measurement first.
"""

from __future__ import annotations

import csv
import io
import math
import re
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ffnlab._util.names import closest
from ffnlab._util.text import human, human_bytes
from ffnlab.core.ffn import ffn_param_count, get_ffn_spec, matched_hidden_dim
from ffnlab.study.published import MODEL_SHAPES, ModelShape

Stage = Literal["pretrain", "finetune", "peft", "inference"]
STAGES: tuple[Stage, ...] = typing.get_args(Stage)
Hardware = Literal["cpu", "mobile", "gpu", "gpu-8gb", "gpu-12gb", "gpu-16gb", "gpu-24gb", "gpu-32gb", "gpu-40gb",
                   "gpu-80gb"]  # fmt: skip
HARDWARE: tuple[Hardware, ...] = typing.get_args(Hardware)
# training memory of each hardware tier; None: no memory tier (a CPU, a phone, an unstated GPU)
HARDWARE_MEMORY: dict[Hardware, int | None] = {
    "cpu": None,
    "mobile": None,
    "gpu": None,
    "gpu-8gb": 8 * 2**30,
    "gpu-12gb": 12 * 2**30,
    "gpu-16gb": 16 * 2**30,
    "gpu-24gb": 24 * 2**30,
    "gpu-32gb": 32 * 2**30,
    "gpu-40gb": 40 * 2**30,
    "gpu-80gb": 80 * 2**30,
}
Deploy = Literal["cpu", "gpu", "edge"]  # the older --deploy choices
Priority = Literal["research", "industrial", "maintenance"]
PRIORITIES: tuple[Priority, ...] = typing.get_args(Priority)
TaskType = Literal["nlp", "cv"]
TASK_TYPES: tuple[TaskType, ...] = typing.get_args(TaskType)
Symptom = Literal["nan", "slow", "mismatch"]
SYMPTOMS: tuple[Symptom, ...] = typing.get_args(Symptom)
# what each list of checks (advice_checks.csv) is for: a symptom, or the first-attempt rule's gradient trouble
SYMPTOM_NAMES: dict[str, str] = {"nan": "NaN loss", "slow": "slower training",
                                 "mismatch": "outputs that differ between frameworks",
                                 "gradient": "gradient trouble"}  # fmt: skip
QUOTE_KINDS = ("paraphrase",)  # a quote's kind: in the words of the issue that reported the statement
DEPLOY_HARDWARE: dict[Deploy, Hardware] = {"cpu": "cpu", "gpu": "gpu", "edge": "mobile"}
EVIDENCE = ("measured", "published", "rule of thumb")
SMALL_MODEL = 100e6  # below the published comparison's scale (T5-base, about 220M parameters)
LARGE_MODEL = 1e9  # from here on, gated FFNs are the published default (PaLM, LLaMA, Gemma)
LONG_CONTEXT_SHARE = 1 / 3  # FFN share of a layer's forward FLOPs below which the context dominates
DEFAULT_SEQ_LEN = 2048  # GPT-3's context, assumed for memory estimates when --seq-len is not given
BYTES_PER_PARAM = 16  # mixed-precision AdamW: 16-bit weights and grads, fp32 master weights and two moments
# NOTE: Korthikanti et al. 2022 count 19 s*b*h bytes for a dense 4h MLP; a gated one of width 8h/3
# keeps its input (2), gate, up, act(gate) and product (4 x 16/3) and a dropout mask (1): 16/3 more.
DENSE_LAYER_BYTES = 34  # per s*b*h, attention's 5*a*s/h term added separately
GATED_EXTRA_BYTES = 16 / 3

RULES_CSV = Path(__file__).with_name("advice_rules.csv")
CHECKS_CSV = Path(__file__).with_name("advice_checks.csv")


@dataclass(frozen=True)
class Quote:
    """An article's statement a rule rests on: who says it ('seed 002', 'articles of issue #28') and what."""

    source: str
    statement: str

    def __str__(self) -> str:
        return f'{self.source}: "{self.statement}"'


def read_quotes(cell: str) -> tuple[Quote, ...]:
    """The quotes of a rule: '|'-separated entries 'SOURCE: "STATEMENT"'; ValueError naming a malformed one."""
    quotes = []
    for entry in filter(None, (e.strip() for e in cell.split("|"))):
        match = re.fullmatch(r'([^:"]+): "([^"]+)"', entry)
        if not match:
            raise ValueError(f'{RULES_CSV.name}: a quote must read SOURCE: "STATEMENT", got {entry!r}')
        quotes.append(Quote(match.group(1), match.group(2)))
    return tuple(quotes)


@dataclass(frozen=True)
class Rule:
    """One branch's rule: what it says, on what evidence, from which source, and the variants it prefers.
    RULES holds them as written; `apply_rule` fills in a situation's numbers, and an advice lists the rules
    it applied."""

    rule: str
    branch: str
    evidence: str  # one of EVIDENCE
    source: str  # a format string until applied, like the text
    tier: str  # the range of the branch's input it holds for, as its source writes it ('<6', '6-12', '>12'); '' all
    picks: tuple[str, ...]  # the variants it prefers: names or 'gated' (any GLU variant); () none
    text: str  # a format string filled in with the situation's numbers
    quotes: tuple[Quote, ...] = ()  # the articles' statements it rests on; () where it rests on none
    quote_kind: str = ""  # one of QUOTE_KINDS where it quotes

    def prefers(self, ffn: str) -> bool:
        """Whether `ffn` is among the variants this rule prefers."""
        spec = get_ffn_spec(ffn)
        return any(spec.gated if pick == "gated" else spec.name == pick for pick in self.picks)

    def covers(self, value: float) -> bool:
        """Whether `value` lies in this rule's tier: '<6' below 6, '6-12' from 6 to 12, '>12' above 12."""
        low, dash, high = self.tier.partition("-")
        if self.tier.startswith("<"):
            return value < float(self.tier[1:])
        if self.tier.startswith(">"):
            return value > float(self.tier[1:])
        return bool(dash) and float(low) <= value <= float(high)


def read_rule(row: dict[str, str]) -> Rule:
    """A row of advice_rules.csv as a Rule: its picks and quotes '|'-separated."""
    picks = tuple(pick for pick in row["picks"].split("|") if pick)
    quotes = read_quotes(row["quote"])
    if bool(quotes) != bool(row["quote_kind"]) or (quotes and row["quote_kind"] not in QUOTE_KINDS):
        raise ValueError(
            f"{RULES_CSV.name}: rule {row['rule']} needs a quote_kind ({', '.join(QUOTE_KINDS)}) with a quote"
        )
    return Rule(
        row["rule"],
        row["branch"],
        row["evidence"],
        row["source"],
        row["tier"],
        picks,
        row["text"],
        quotes,
        row["quote_kind"],
    )


RULES: dict[str, Rule] = {
    row["rule"]: read_rule(row) for row in csv.DictReader(io.StringIO(RULES_CSV.read_text(encoding="utf-8")))
}


def apply_rule(rule: str, **fields: object) -> Rule:
    """The rule named `rule`, its source and text filled in with `fields`."""
    r = RULES[rule]
    return replace(r, source=r.source.format(**fields), text=r.text.format(**fields))


def tier_rule(branch: str, value: float) -> str:
    """The name of the rule of a tiered `branch` (depth, vram) whose tier holds `value`."""
    return next(r.rule for r in RULES.values() if r.branch == branch and r.tier and r.covers(value))


def rule_line(applied: Rule) -> str:
    """An applied rule as a reason, marked with its evidence, with its source and the statements it quotes:
    '[rule of thumb] ... (source: ...; quoted, a paraphrase: seed 002: "...")'."""
    quoted = f"; quoted, a {applied.quote_kind}: " + "; ".join(map(str, applied.quotes)) if applied.quotes else ""
    return f"[{applied.evidence}] {applied.text} (source: {applied.source}{quoted})"


@dataclass(frozen=True)
class Check:
    """One step of a troubleshooting answer (advice_checks.csv): what to check, why, the ffnlab command that
    measures it, and the source of its place in the order (a seed's statement, or ffnlab's own)."""

    symptom: str  # one of SYMPTOMS, or 'gradient': the first-attempt rule's gradient trouble
    check: str
    source: str
    why: str
    command: str  # placeholders: YOUR_VARIANT, YOUR_ACTIVATION, YOUR_DATA, YOUR_CONFIG.json


def read_checks() -> dict[str, tuple[Check, ...]]:
    """advice_checks.csv by symptom, each symptom's checks in the order they are run (the rows' order)."""
    checks: dict[str, list[Check]] = {}
    for row in csv.DictReader(io.StringIO(CHECKS_CSV.read_text(encoding="utf-8"))):
        checks.setdefault(row["symptom"], []).append(Check(**row))
    return {symptom: tuple(steps) for symptom, steps in checks.items()}


CHECKS = read_checks()


def check_choice(value: str | None, valid: tuple[str, ...], what: str) -> str | None:
    """`value` if it is one of `valid` (or None); ValueError naming the valid ones otherwise."""
    if value is not None and value not in valid:
        raise ValueError(f"unknown {what} '{value}'{closest(value, valid)}; valid: {', '.join(valid)}")
    return value


def resolve_hardware(hardware: str | None, deploy: str | None) -> str | None:
    """The hardware tier from --hardware or the older --deploy (cpu, gpu, edge -> mobile)."""
    check_choice(hardware, HARDWARE, "hardware")
    check_choice(deploy, tuple(DEPLOY_HARDWARE), "deployment")
    mapped = next((tier for name, tier in DEPLOY_HARDWARE.items() if name == deploy), None)
    if hardware and mapped and deploy_of(hardware) != deploy:
        raise ValueError(f"--deploy {deploy} contradicts --hardware {hardware}; give one of them")
    return hardware or mapped


def deploy_of(hardware: str | None) -> str | None:
    """The --deploy name of a hardware tier: cpu, gpu or edge."""
    if hardware is None:
        return None
    return "edge" if hardware == "mobile" else hardware.split("-")[0]


def size_text(params: float) -> str:
    """A model size as people write it: 7e9 -> '7B', 1.25e8 -> '125M'."""
    return human(params).replace("G", "B")


def model_shape(params: float) -> ModelShape:
    """The published model shape nearest in parameters (on a log scale)."""
    return min(MODEL_SHAPES, key=lambda s: abs(math.log(s.params / params)))


def size_tier(params: float) -> str:
    """'small', 'mid' or 'large': below, at, or above the scale of the published comparison."""
    return "small" if params < SMALL_MODEL else "large" if params >= LARGE_MODEL else "mid"


def ffn_flop_share(d_model: int, seq_len: int) -> float:
    """The FFN's share of a layer's forward FLOPs per token (Kaplan et al. 2020, Table 1):

    FFN 2 * 8 d^2, attention projections 2 * 4 d^2, attention over the context 2 * n_ctx * d,
    so share = 8 d / (12 d + n_ctx)."""
    return 8 * d_model / (12 * d_model + seq_len)


def variant_params(ffn: str, params: float, shape: ModelShape) -> float:
    """Parameters of a `params`-sized model with `ffn` in every layer, each FFN matched in parameters
    to the dense 4x one as ffnlab does (`--match params`, within 1%)."""
    spec = get_ffn_spec(ffn)
    d = shape.d_model
    dense = ffn_param_count("dense", d, 4 * d, bias=False)
    own = ffn_param_count(spec.kind, d, matched_hidden_dim(spec, d), bias=False)
    return params + shape.n_layers * (own - dense)


def training_memory_estimate(ffn: str, params: float, shape: ModelShape, seq_len: int) -> float:
    """Bytes to train a `params`-sized model of `shape` with `ffn`, one sequence of `seq_len` per step:

        16 * params + n_layers * s * h * (34 + extra + 5 * a * s / h)     (Korthikanti et al. 2022)

    where extra = 16/3 for a gated FFN (the tensors it keeps for backward beyond a dense one's)."""
    s, h, a = seq_len, shape.d_model, shape.n_heads
    extra = GATED_EXTRA_BYTES if get_ffn_spec(ffn).gated else 0.0
    per_layer = s * h * (DENSE_LAYER_BYTES + extra + 5 * a * s / h)
    return BYTES_PER_PARAM * variant_params(ffn, params, shape) + shape.n_layers * per_layer


def budget_exclusions(
    variants: list[str], params: float, seq_len: int, params_budget: float | None, memory_budget: float | None
) -> dict[str, str]:
    """Variant -> why a budget rules it out, estimated at `params` parameters and `seq_len` tokens."""
    shape = model_shape(params)
    out = {}
    for ffn in variants:
        count = variant_params(ffn, params, shape)
        memory = training_memory_estimate(ffn, params, shape, seq_len)
        if params_budget and count > params_budget:
            out[ffn] = f"{human(count)} parameters (estimated) exceed the budget of {human(params_budget)}"
        elif memory_budget and memory > memory_budget:
            out[ffn] = (
                f"training memory {human_bytes(memory)} (estimated at {seq_len} tokens, one sequence per step) "
                f"exceeds the budget of {human_bytes(memory_budget)}"
            )
    return out


def memory_rule(hardware: Hardware, params: float, seq_len: int) -> Rule:
    """The gpu-memory rule: the tier's budget and the dense and gated estimates at this size; ValueError for a
    tier without a memory budget."""
    budget = HARDWARE_MEMORY[hardware]
    if budget is None:
        tiers = ", ".join(tier for tier, memory in HARDWARE_MEMORY.items() if memory)
        raise ValueError(f"the hardware tier '{hardware}' has no memory budget; valid: {tiers}")
    shape = model_shape(params)
    return apply_rule(
        "gpu-memory",
        hardware=hardware,
        budget=human_bytes(budget),
        size=size_text(params),
        layers=shape.n_layers,
        d_model=shape.d_model,
        seq_len=seq_len,
        dense=human_bytes(training_memory_estimate("gelu", params, shape, seq_len)),
        gated=human_bytes(training_memory_estimate("swiglu", params, shape, seq_len)),
    )


def narrower_shape(shape: ModelShape, d_model: int) -> ModelShape:
    """`shape` at a smaller width: the same depth and head width, about 12 * n_layers * d_model^2 parameters
    (Kaplan et al. 2020, the count without embeddings)."""
    head_width = shape.d_model / shape.n_heads
    return replace(
        shape,
        name=f"{shape.name} narrowed to d_model {d_model}",
        params=12 * shape.n_layers * d_model**2,
        d_model=d_model,
        n_heads=max(1, round(d_model / head_width)),
    )


def widest_that_fits(ffn: str, shape: ModelShape, seq_len: int, budget: float) -> ModelShape | None:
    """The widest `narrower_shape` of `shape`, its width a multiple of 64, whose estimated training memory with
    `ffn` fits `budget`; None when not even d_model 64 does."""
    for d_model in range((shape.d_model - 1) // 64 * 64, 63, -64):
        narrower = narrower_shape(shape, d_model)
        if training_memory_estimate(ffn, narrower.params, narrower, seq_len) <= budget:
            return narrower
    return None
