"""The advisor: which FFN variant to use in a stated situation, and why, with numbers.

Three sources of evidence, in this order:
1. fine-tuning a pretrained model: keep the activation it was trained with (its weights assume
   it); the activation is read from a Hugging Face config.json or a table of model families;
2. measurements in a run store: the variants' paired differences over seeds, under the user's
   parameter, memory and latency constraints;
3. published results (ffnlab.study.published), said to be such, with the `ffnlab compare` command that
   would measure the question on the user's own data.

The result is a dict {"recommendation", "basis", "reasons", "evidence", "alternatives", "command"}
that `format_advice` prints and `--json` dumps.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from ffnlab._util.names import closest
from ffnlab._util.text import human, human_bytes, key_values, sci, shorten
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.ffn import GATED, get_ffn_spec
from ffnlab.core.kernels.fused import FUSED_ACTS
from ffnlab.study.flow import (
    DEFAULT_SEQ_LEN,
    DEPLOY_HARDWARE,
    HARDWARE_MEMORY,
    LONG_CONTEXT_SHARE,
    STAGES,
    apply_rule,
    budget_exclusions,
    check_choice,
    deploy_of,
    ffn_flop_share,
    memory_rule,
    mobile_friendly,
    model_shape,
    resolve_hardware,
    rule_line,
    size_text,
    size_tier,
)
from ffnlab.study.metrics import shown_in
from ffnlab.study.published import (
    ACT_FIELDS,
    GATED_AT_SCALE,
    GATED_MODEL_TYPES,
    MODEL_FAMILIES,
    SHAZEER_2020_65K,
    SHAZEER_2020_524K,
    PublishedTable,
)
from ffnlab.study.records import Cell, VariantRow
from ffnlab.study.scaling import LOF_ALPHA
from ffnlab.study.stats import holm, paired_diff

DEPLOYS = tuple(DEPLOY_HARDWARE)
ALPHA = 0.05
# Step-time difference below which two variants count as equally fast: CPU timings of small
# models on a shared machine jitter by several percent.
SPEED_TOLERANCE = 0.05


@dataclass(frozen=True)
class Situation:
    """What the user says about their use, which every source of evidence weighs."""

    params_budget: float | None = None  # parameters
    memory_budget: float | None = None  # bytes of training memory
    latency_sensitive: bool = False
    deploy: str | None = None  # one of DEPLOYS, derived from the hardware
    depth: int | None = None  # the number of layers planned
    stage: str = "pretrain"  # one of flow.STAGES
    hardware: str | None = None  # one of flow.HARDWARE
    seq_len: int | None = None  # tokens per sequence
    model_size: float | None = None  # parameters of the planned model

    @property
    def d_model(self) -> int:
        """The width the FLOP shares are computed at: of the published shape nearest the model size,
        else T5-base's 768 (the published comparison's)."""
        return model_shape(self.model_size).d_model if self.model_size else 768

    @property
    def long_context(self) -> bool:
        """The context dominates a layer's FLOPs (the FFN's share is below LONG_CONTEXT_SHARE)."""
        return self.seq_len is not None and ffn_flop_share(self.d_model, self.seq_len) < LONG_CONTEXT_SHARE

    @property
    def cost_sensitive(self) -> bool:
        """Speed decides between tied variants: latency matters or the model runs on a CPU or at the edge."""
        return self.latency_sensitive or self.deploy in ("cpu", "edge")


# ---- parsing ------------------------------------------------------------------------------------

COUNT_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}
BYTE_SUFFIX = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
# NOTE: the most a size may be: a thousand times the largest published models (about 1e12 parameters)
# and a million TB. Beyond them a size is a typo, and '1e400' reads as inf ('A infB model')
MOST_PARAMS = 1e15
MOST_BYTES = 1e18


def parse_quantity(text: str, units: dict[str, float], what: str, example: str, most: float) -> float:
    """'1.5M' -> 1.5e6 with the given suffix table; ValueError naming the valid suffixes, or the
    range (0, most] when the value is outside it."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in units:
        valid = ", ".join(u for u in units if u)
        raise ValueError(
            f"cannot read {what} '{shorten(text)}'; give a number with an optional suffix ({valid}), e.g. {example}"
        )
    value = float(match.group(1)) * units[match.group(2).lower()]
    if not 0 < value <= most:
        raise ValueError(f"{what} must be positive and at most {sci(most)}, got '{shorten(text)}'")
    return value


def parse_params(text: str) -> int:
    """A parameter count: '125M', '7B', '1.5e6'."""
    return int(parse_quantity(text, COUNT_SUFFIX, "parameter budget", "125M", MOST_PARAMS))


def parse_bytes(text: str) -> int:
    """A memory size: '16GB' (powers of 1000), '2GiB' or '2G' (powers of 1024), plain bytes."""
    return int(parse_quantity(text, BYTE_SUFFIX, "memory budget", "16GiB", MOST_BYTES))


# ---- pretrained models --------------------------------------------------------------------------


def ffn_for(hf_act: str, gated: bool) -> str | None:
    """The ffnlab variant computing a Hugging Face activation, dense or as a GLU gate; None if
    ffnlab has no such activation."""
    act = hf_act.lower().replace("-", "_")
    if act not in ACTIVATIONS:
        return None
    if not gated:
        return get_ffn_spec(act).name
    canon = ACTIVATIONS[act].same_as or act
    return next((name for name, spec in GATED.items() if spec.acts[0] == canon), None)


def read_hf_config(path: Path) -> dict:
    """{"model", "model_type", "field", "hf_act", "gated", "ffn", "source"} from a config.json."""
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the model config {file}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a Hugging Face config (expected a JSON object)")
    field = next((f for f in ACT_FIELDS if isinstance(config.get(f), str)), None)
    if field is None:
        raise ValueError(f"{file} names no FFN activation; looked for {', '.join(ACT_FIELDS)}")
    value, model_type = config[field], str(config.get("model_type", "unknown"))
    gated = model_type in GATED_MODEL_TYPES or (field == "feed_forward_proj" and value.startswith("gated-"))
    act = value.removeprefix("gated-") if field == "feed_forward_proj" else value
    if field == "feed_forward_proj" and value == "gated-gelu":
        act = "gelu_new"  # NOTE: T5's config maps 'gated-gelu' to the tanh approximation, gelu_new
    name = config.get("_name_or_path") or (config.get("architectures") or [model_type])[0]
    return {
        "model": str(name),
        "model_type": model_type,
        "field": field,
        "hf_act": value,
        "act": act,
        "gated": gated,
        "ffn": ffn_for(act, gated),
        "source": f"{file} ({field}: {value!r})",
    }


def lookup_family(name: str) -> dict:
    """The same facts for a known model id or family name, from ffnlab.study.published.MODEL_FAMILIES."""
    key = name.strip().lower()
    last = key.rsplit("/", 1)[-1]
    matches = [f for f in MODEL_FAMILIES if key == f.example.lower() or last.startswith(f.family)]
    if not matches:
        known = sorted({f.example for f in MODEL_FAMILIES})
        hint = closest(last, [f.family for f in MODEL_FAMILIES])
        raise ValueError(
            f"unknown pretrained model '{shorten(name)}'{hint}; give the path to its config.json, "
            f"or one of: {', '.join(known)}"
        )
    f = max(matches, key=lambda f: (key == f.example.lower(), len(f.family)))
    act = "gelu_new" if f.hf_act == "gated-gelu" else f.hf_act
    return {
        "model": name,
        "model_type": f.model_type,
        "field": f.field,
        "hf_act": f.hf_act,
        "act": act,
        "gated": get_ffn_spec(f.ffn).gated,
        "ffn": f.ffn,
        "source": f"ffnlab's table of model families: {f.family} ({f.example}) sets {f.field}={f.hf_act!r} "
        "in its Hugging Face config.json",
    }


def resolve_pretrained(name_or_config: str) -> dict:
    """Facts about a pretrained model from a config.json path (or its folder) or a known name."""
    path = Path(name_or_config)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"no model config at {path}")
        return read_hf_config(path)
    return lookup_family(name_or_config)


# what changing the activation would do, per situation that starts from a checkpoint
CHANGE_COSTS = {
    "finetune": "Fine-tuning with a different activation feeds those weights a function they were never trained "
    "with: the pre-trained behaviour is lost and must be relearned, which defeats the point of starting from it.",
    "peft": "Parameter-efficient fine-tuning keeps those weights frozen, so they could not even adapt to "
    "a different activation: the model would simply compute something else.",
    "inference": "For inference the checkpoint fixes it: any other activation computes a different function "
    "with the same weights.",
}
STAGE_RULES = {"finetune": "keep-pretrained", "peft": "peft-frozen", "inference": "inference-fixed"}


def advise_pretrained(pretrained: str, stage: str = "finetune", hardware: str | None = None) -> dict:
    """Keep the activation a checkpoint was trained with (fine-tuning, PEFT or inference)."""
    model = resolve_pretrained(pretrained)
    shape = "as the gate of a gated (GLU) FFN" if model["gated"] else "in a dense FFN"
    ffn = model["ffn"] or model["act"]
    reasons = [
        f"{model['model']} (model_type {model['model_type']}) was pre-trained with {model['act']} {shape}; "
        f"its FFN weights were learned for that nonlinearity.",
        CHANGE_COSTS[stage],
        f"So keep {ffn}"
        + (f" (ffnlab name; Hugging Face calls it '{model['hf_act']}')" if model["hf_act"] != ffn else "")
        + ".",
    ]
    if model["ffn"] is None:
        reasons.append(f"ffnlab has no entry for '{model['act']}', so it cannot measure this model's FFN itself.")
    alternatives = [
        {
            "ffn": "any other",
            "why_not": "invalidates the pre-trained FFN weights; compare activations only when training from scratch",
        }
    ]
    rules = [apply_rule(STAGE_RULES[stage], act=model["act"])]
    advice = {
        "recommendation": ffn,
        "basis": "pretrained",
        "reasons": reasons,
        "evidence": {"kind": "pretrained", **model},
        "alternatives": alternatives,
        "command": None,
        "rules": rules,
    }
    if stage == "inference":
        advice["implementation"], more = implementation(model, hardware)
        advice["rules"] = rules + more
    reasons += [rule_line(r) for r in advice["rules"]]
    return advice


def implementation(model: dict, hardware: str | None = None) -> tuple[str, list[dict]]:
    """The fastest exact way to run a checkpoint's FFN on `hardware`, and the rules behind it."""
    act, ffn = model["act"], model["ffn"] or model["act"]
    canon = ACTIVATIONS[act].same_as or act if act in ACTIVATIONS else act
    rules = []
    if canon in ("gelu", "gelu_tanh"):
        forms = ("exact (erf)", "tanh-approximation")
        form, other = forms if canon == "gelu" else forms[::-1]
        rules.append(apply_rule("inference-gelu-exact", act=act, form=form, other=other))
    if model["gated"] and canon in FUSED_ACTS:
        rules.append(apply_rule("inference-fused", ffn=ffn, act=act))
        how = f"fused act(gate) * up: ffnlab.core.kernels.fused.gated_act(gate, up, act='{canon}')"
    else:
        rules.append(apply_rule("inference-dense", ffn=ffn, act=canon))
        how = f"the framework's built-in {canon}, fused into the matmul by torch.compile"
    if hardware in ("cpu", "mobile"):
        rules.append(apply_rule("inference-export", hardware=hardware, ffn=ffn, act=act))
        how += f"; on {hardware}, ONNX Runtime (ffnlab export --ffn {ffn})"
    return how, rules


# ---- measured -----------------------------------------------------------------------------------


def measured_cells(store_path: str | Path, depth: int | None) -> tuple[list[Cell], dict]:
    """The cells of the store's latest study to advise on, from the one summary every output shares
    (`ffnlab.study.summary.summarize_study`): with an axis 'depth' and a stated depth, the cells at the nearest
    measured depth; otherwise every cell. Cells are never merged. Also returns facts about the study."""
    from ffnlab.study.load import load_study
    from ffnlab.study.store import Store
    from ffnlab.study.summary import summarize_study

    study, runs, _ = load_study(store_path)
    summary = summarize_study(study, store_path, runs)
    cells = summary.cells
    if study.scale:  # the multipliers are read at the largest compute: advise at that size too
        largest = {a: max(study.axes[a]) for a in study.scale}
        cells = [c for c in cells if all(c.axes[a] == v for a, v in largest.items())]
    elif "depth" in study.axes and depth is not None:
        nearest = min(study.axes["depth"], key=lambda d: (abs(d - depth), d))
        cells = [c for c in cells if c.axes["depth"] == nearest]
    with Store(store_path, create=False) as store:
        env = next((r.env for r in reversed(store.runs(status="finished"))), {})
    cfg = study.base
    facts = {
        "store": str(store_path),
        "task": cfg.model.task,
        "metric": cells[0].metric,
        "higher_is_better": cells[0].metric_direction == "higher",
        "n_layers": cfg.model.n_layers,
        "d_model": cfg.model.d_model,
        "data": cfg.data,
        "match": cfg.model.ffn_match,
        "seeds": study.seeds,
        "baseline": study.baseline,
        "device": env.get("device", "?"),
        "init": cfg.model.init,
        "scaling": summary.scaling if "variants" in (summary.scaling or {}) else None,
        "across_cells": summary.across_cells,
    }
    return cells, facts


# the statistics of the ranking metric an advice quotes for each measured variant; its metrics are the
# ones METRICS marks for the evidence
EVIDENCE_STATS = ("mean", "ci_low", "ci_high", "n_seeds", "delta", "delta_ci_low", "delta_ci_high", "p_adj",
                  "significant", "diverged", "values")  # fmt: skip


def evidence_of(row: VariantRow) -> dict:
    """What an advice quotes of a measured variant: its statistics and its 'evidence' metrics."""
    metrics = {m.name: row.metrics.get(m.name) for m in shown_in("evidence")}
    return {**{k: getattr(row, k) for k in EVIDENCE_STATS}, **metrics}


def step_time_spread(row: VariantRow) -> float | None:
    """The slowest seed's median step over the fastest's: above 1.5 the machine was busy."""
    span = row.metrics.get("step_time_range")
    return span[1] / span[0] if span and span[0] else None


def exclusion(row: VariantRow, situation: Situation) -> str | None:
    """Why a measured variant is out of the running, or None."""
    if row.diverged:
        return f"diverged in {row.diverged} of {row.diverged + len(row.values)} runs"
    if not row.values:
        return "no finished run"
    params_budget, memory_budget = situation.params_budget, situation.memory_budget
    params, memory = row.metrics.get("params"), row.metrics.get("train_mem_bytes")
    if params_budget and params and params > params_budget:
        return f"{human(params)} parameters exceed the budget of {human(params_budget)}"
    if memory_budget and memory and memory > memory_budget:
        return (
            f"training memory {human_bytes(memory)} (parameters, gradients, optimizer state, "
            f"activations kept for backward) exceeds the budget of {human_bytes(memory_budget)}"
        )
    return None


def pct(value: float | None, reference: float | None) -> str:
    """'+11%': `value` relative to `reference`; '?' when either is missing."""
    return f"{(value / reference - 1) * 100:+.0f}%" if value and reference else "?"


def advise_measured(store_path: str | Path, situation: Situation) -> dict:
    """Advice from a store's measurements: one cell's advice, or, when several cells remain (another
    axis than depth), each cell's advice and a recommendation only where they agree."""
    cells, facts = measured_cells(store_path, situation.depth)
    advices = [advise_cell(c, facts, situation) for c in cells]
    if len(advices) == 1:
        return advices[0]
    picks = {a["recommendation"] for a in advices}
    where = lambda a: key_values(a["cell"])
    agree = len(picks) == 1
    reasons = [
        f"The store's study has {len(advices)} cells here ({'; '.join(where(a) for a in advices)}); each is "
        "advised on by its own measurements, never pooled."
    ]
    reasons.append(
        f"Every cell recommends {next(iter(picks))}."
        if agree
        else "The cells disagree: "
        + "; ".join(f"{where(a)} -> {a['recommendation']}" for a in advices)
        + ". Choose by the setting you will use."
    )
    return {
        "recommendation": next(iter(picks)) if agree else "depends on the cell",
        "basis": "measured",
        "reasons": reasons,
        "evidence": {"kind": "measured", **facts, "cells": [a["evidence"] for a in advices]},
        "alternatives": [],
        "cells": advices,
        "command": advices[0]["command"],
    }


@dataclass
class CellChoice:
    """One cell's variants weighed for advice: which are eligible, the best, and the one recommended."""

    variants: dict[str, VariantRow]  # the cell's rows by variant
    excluded: dict[str, str]  # variant -> why it is out of the running
    mean: dict[str, float]  # of each eligible variant, in the cell's order
    best: str
    diffs: dict[str, dict]  # each other eligible variant against the best: paired over seeds, Holm-corrected
    choice: str  # the best, or a faster variant tied with it when cost counts
    runner_up: str | None  # the best eligible variant but the choice
    unit: str  # of a paired difference: ' nats' or ' accuracy'
    rule: dict | None = None  # the flow's rule that moved the choice away from the best, if one did

    @property
    def eligible(self) -> list[str]:
        return list(self.mean)

    @property
    def tied(self) -> list[str]:
        """The eligible variants not significantly different from the best."""
        return [n for n in self.diffs if not self.diffs[n]["significant"]]

    def versus(self, name: str, ref: str) -> str:
        """'-0.060 nats vs gelu, 95% CI [-0.080, -0.040], p=0.003, 3 paired seeds'."""
        d = paired_diff(self.variants[name].values, self.variants[ref].values)
        if d["delta"] is None:
            return f"no seed in common with {ref}"
        ci = f", 95% CI [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if d["ci_low"] is not None else ""
        p = f", p={d['p']:.2g}" if d["p"] is not None else ""
        return f"{d['delta']:+.3f}{self.unit} vs {ref}{ci}{p}, {d['n']} paired seeds"

    def costs(self, name: str, ref: str) -> str:
        """'step time -12%, params +0%, training memory +8%': `name` relative to `ref`."""
        v, r = self.variants[name].metrics, self.variants[ref].metrics
        return (
            f"step time {pct(v['step_time_s'], r['step_time_s'])}, params {pct(v['params'], r['params'])}, "
            f"training memory {pct(v['train_mem_bytes'], r['train_mem_bytes'])}"
        )

    def step_time(self, name: str) -> float | None:
        return self.variants[name].metrics.get("step_time_s")


def choose_in_cell(cell: Cell, facts: dict, situation: Situation) -> CellChoice:
    """The best eligible variant of a cell, or, when cost counts, a tied one that is clearly faster;
    ValueError saying why when no variant is eligible."""
    variants = {r.ffn: r for r in cell.variants}
    sign = -1.0 if facts["higher_is_better"] else 1.0  # sign * value: lower is better
    excluded = {name: why for name, v in variants.items() if (why := exclusion(v, situation))}
    eligible = [n for n in variants if n not in excluded]
    if not eligible:
        raise ValueError(
            "no measured variant can be recommended: " + "; ".join(f"{n}: {why}" for n, why in excluded.items())
        )
    mean = {n: variants[n].mean for n in eligible}
    best = min(eligible, key=lambda n: sign * mean[n])
    # every other eligible variant against the best, paired over seeds, Holm-corrected
    diffs = {n: paired_diff(variants[n].values, variants[best].values) for n in eligible if n != best}
    for n, p_adj in zip(diffs, holm([d["p"] for d in diffs.values()])):
        diffs[n]["p_adj"] = p_adj
        diffs[n]["significant"] = p_adj is not None and p_adj < ALPHA
    tied = [n for n in diffs if not diffs[n]["significant"]]
    choice, rule = best, None
    friendly = [n for n in [best] + tied if mobile_friendly(n)]
    if situation.hardware == "mobile" and friendly and best not in friendly:
        choice = min(friendly, key=lambda n: sign * mean[n])
        rule = apply_rule("mobile-measured", ffn=choice)
    elif situation.cost_sensitive and tied:
        step = lambda n: variants[n].metrics.get("step_time_s") or math.inf
        fastest = min([best] + tied, key=step)
        if step(fastest) < (1 - SPEED_TOLERANCE) * step(best):
            choice = fastest
    runner_up = min((n for n in eligible if n != choice), key=lambda n: sign * mean[n], default=None)
    unit = " nats" if facts["metric"] == "final_val_loss" else " accuracy"
    return CellChoice(variants, excluded, mean, best, diffs, choice, runner_up, unit, rule)


def advise_cell(cell: Cell, facts: dict, situation: Situation) -> dict:
    """Advice from one cell of a study: the best eligible variant, or a faster one tied with it."""
    if "depth" in cell.axes:
        facts = {**facts, "n_layers": cell.axes["depth"]}
    if "width" in cell.axes:
        facts = {**facts, "d_model": cell.axes["width"]}
    weighed = choose_in_cell(cell, facts, situation)
    reasons = choice_reasons(weighed, cell, facts, situation) + caveat_reasons(weighed, facts, situation)
    rules = [weighed.rule] if weighed.rule else []
    reasons += [rule_line(r) for r in rules]
    reasons += scaling_reasons(weighed.choice, facts["scaling"])
    reasons += across_reasons(weighed.choice, facts["across_cells"])
    evidence = {
        "kind": "measured",
        **facts,
        "axes": cell.axes,
        "variants": {n: evidence_of(row) for n, row in weighed.variants.items()},
    }
    if facts["scaling"]:
        evidence["scaling"] = {
            n: {k: r[k] for k in ("multiplier", "multiplier_ci", "E", "alpha")}
            for n, r in facts["scaling"]["variants"].items()
        }
    variants = list(weighed.variants)
    return {
        "recommendation": weighed.choice,
        "basis": "measured",
        "reasons": reasons,
        "evidence": evidence,
        "alternatives": measured_alternatives(weighed),
        "command": compare_command(
            variants, facts["data"], situation.depth or facts["n_layers"], seeds=max(5, facts["seeds"])
        ),
        "cell": cell.axes,
        "rules": rules,
    }


def scaling_reasons(choice: str, scaling: dict | None) -> list[str]:
    """What the store's compute multipliers say about the choice: its own sentence, and the variant with
    the largest multiplier whose interval is above 1 when that is another one."""
    if not scaling:
        return []
    rows, baseline = scaling["variants"], scaling["baseline"]
    lines = [s for s in scaling["sentences"] if s.startswith(f"{choice} ")]
    if choice == baseline:
        lines.append(f"{choice} is the baseline of the scaling fits (multiplier 1 by definition).")
    worth = {n: r["multiplier"] for n, r in rows.items() if n != baseline and (r["multiplier_ci"][0] or 0) > 1}
    top = max(worth, key=worth.get, default=None)
    if top is not None and top != choice:
        misfit = any((rows[n]["lack_of_fit_p"] or 1) < LOF_ALPHA for n in (top, baseline))
        lines.append(
            f"By the scaling fits {top} is worth {worth[top]:.2f}x {baseline}'s compute (interval above 1), more "
            f"than {choice}: where the compute budget matters more than the constraints above, consider {top}"
            + (
                " (though the power law misses the measured points: a summary of this range, not a law)."
                if misfit
                else "."
            )
        )
    where = f"{sci(scaling['compute_range'][0])}-{sci(scaling['compute_range'][1])} FLOPs"
    return [f"Scaling study ({where}, advice at the largest size): " + " ".join(lines)] if lines else []


def across_reasons(choice: str, across: dict | None) -> list[str]:
    """Whether the choice's gap to the baseline, and the best mean, hold in the study's other cells."""
    if not across:
        return []
    lines = [s for s in across["sentences"] if s.startswith(f"{choice}'s gap") or s.startswith("The best mean")]
    return [f"Across the study's {len(across['cells'])} cells: " + " ".join(lines)] if lines else []


def choice_reasons(weighed: CellChoice, cell: Cell, facts: dict, situation: Situation) -> list[str]:
    """Where it was measured, why the choice, and how it compares with the runner-up and the baseline."""
    best, choice, mean, eligible, tied = weighed.best, weighed.choice, weighed.mean, weighed.eligible, weighed.tied
    layers = f"{facts['n_layers']} layer{'s' if facts['n_layers'] != 1 else ''}"
    where = (
        f"{facts['store']}: {layers}, d_model {facts['d_model']}, data {facts['data']}, {facts['seeds']} seeds, "
        f"FFNs matched in {facts['match']}, FFN init {facts['init']} for all, timed on {facts['device']}"
    )
    cell_where = key_values(cell.axes)
    reasons = [f"Measured in {where}" + (f", cell {cell_where}" if cell_where else "") + "."]
    if choice == best:
        reasons.append(
            f"{best} has the best mean final {facts['metric'].removeprefix('final_').replace('_', ' ')} "
            f"({mean[best]:.4f}) among the {len(eligible)} variants that meet the constraints."
        )
    elif weighed.rule:
        reasons.append(
            f"{best} has the best mean ({mean[best]:.4f}), but {choice} is not significantly worse "
            f"({weighed.versus(choice, best)}) and suits the hardware (rule below)."
        )
    else:
        reasons.append(
            f"{best} has the best mean ({mean[best]:.4f}), but {choice} is not significantly worse "
            f"({weighed.versus(choice, best)}) and is faster ({weighed.costs(choice, best)}); with "
            f"{'latency in mind' if situation.latency_sensitive else f'a {situation.deploy} deployment'} the "
            "faster one wins."
        )
    for ref in dict.fromkeys([weighed.runner_up, facts["baseline"]]):
        if ref is None or ref == choice or ref not in eligible or (choice != best and ref == best):
            continue  # (the best was already quoted when the choice is a faster tied one)
        reasons.append(f"{choice}: {weighed.versus(choice, ref)}; {weighed.costs(choice, ref)}.")
    significant_losers = [n for n in weighed.diffs if weighed.diffs[n]["significant"]]
    if significant_losers:
        reasons.append(
            f"{best} is significantly better than {', '.join(significant_losers)} (paired t-tests, Holm-corrected)."
        )
    if tied and choice == best:
        reasons.append(
            f"Not significantly different from {best} (paired t-tests, Holm-corrected): "
            f"{', '.join(tied)}; with these seeds they are tied, and more seeds would separate them "
            "(command below)."
        )
    return reasons


def caveat_reasons(weighed: CellChoice, facts: dict, situation: Situation) -> list[str]:
    """What limits the advice: busy-machine timings, another device or depth, and the excluded variants."""
    deploy, depth = situation.deploy, situation.depth
    reasons = []
    spread = max((s for n in weighed.eligible if (s := step_time_spread(weighed.variants[n]))), default=None)
    if spread and spread > 1.5:
        reasons.append(
            f"Step times of one variant vary up to {spread:.1f}x between its seeds: the machine was busy "
            "while they ran, so the speed differences quoted here are unreliable."
        )
    if deploy and facts["device"] not in ("?", "cuda" if deploy == "gpu" else "cpu"):
        reasons.append(f"Timings come from {facts['device']}; on a {deploy} deployment the speed ordering may differ.")
    if depth is not None and depth != facts["n_layers"]:
        reasons.append(
            f"You plan {depth} layers but the measurement has {facts['n_layers']}: gaps between FFNs "
            f"can change with depth; measure at your depth (command below)."
        )
    for n, why in weighed.excluded.items():
        reasons.append(f"{n} excluded: {why}.")
    return reasons


def measured_alternatives(weighed: CellChoice) -> list[dict]:
    """Every variant but the recommended one: why excluded, or its numbers against the recommendation."""
    variants, choice = weighed.variants, weighed.choice
    alternatives = []
    for n in variants:
        if n == choice:
            continue
        if n in weighed.excluded:
            alternatives.append({"ffn": n, "excluded": weighed.excluded[n]})
            continue
        d = paired_diff(variants[n].values, variants[choice].values)
        alternatives.append(
            {
                "ffn": n,
                "mean": weighed.mean[n],
                "delta_vs_recommendation": d["delta"],
                "ci": [d["ci_low"], d["ci_high"]],
                "p": d["p"],
                "p_adj_vs_best": weighed.diffs.get(n, {}).get("p_adj"),
                "step_time_ratio": (
                    weighed.step_time(n) / weighed.step_time(choice)
                    if weighed.step_time(n) and weighed.step_time(choice)
                    else None
                ),
                "params": variants[n].metrics.get("params"),
                "summary": f"{weighed.versus(n, choice)}; {weighed.costs(n, choice)}",
            }
        )
    return alternatives


# ---- published ----------------------------------------------------------------------------------


def compare_command(variants: list[str], data: str | None, depth: int | None, seeds: int = 3) -> str:
    """The `ffnlab compare` command that measures these variants (on YOUR_DATA when no data is known)."""
    parts = [
        "ffnlab compare",
        f"--variants {shlex.quote(','.join(variants))}",  # quoted where a schedule's '*' would glob
        f"--seeds {seeds}",
        f"--data {data}" if data else "--data YOUR_DATA",
    ]
    if depth:
        parts.append(f"--layers {depth}")
    return " ".join(parts)


@dataclass
class PublishedChoice:
    """The published variants weighed for a situation: which are out, the best, the tied and the pick."""

    excluded: dict[str, str]  # variant -> why a budget rules it out
    best: str  # of the eligible variants
    tied: list[str]  # eligible variants within the reported spread of the best
    choice: str
    rule: dict | None  # the flow's rule that moved the choice away from the best, if one did


def published_exclusions(situation: Situation) -> dict[str, str]:
    """Variant -> why a budget rules it out, estimated at the stated model size (none without one)."""
    if not situation.model_size or not (situation.params_budget or situation.memory_budget):
        return {}
    return budget_exclusions(
        list(SHAZEER_2020_65K.values),
        situation.model_size,
        situation.seq_len or DEFAULT_SEQ_LEN,
        situation.params_budget,
        situation.memory_budget,
    )


def choose_published(situation: Situation) -> PublishedChoice:
    """The best published variant within the budgets, moved by the flow's rules: the ReLU family on
    mobile hardware, SwiGLU for a large model, the cheapest tied activation when cost counts."""
    values, spread = SHAZEER_2020_65K.values, SHAZEER_2020_65K.spread
    excluded = published_exclusions(situation)
    eligible = [n for n in values if n not in excluded]
    if not eligible:
        smallest, why = next(iter(excluded.items()))  # the table starts with the dense relu
        raise ValueError(
            f"no published variant fits the budgets at {size_text(situation.model_size)} parameters, "
            f"not even {smallest}: {why}; raise a budget, shorten --seq-len or give a smaller --model-size"
        )
    best = min(eligible, key=values.get)
    # tied: the gap is within the larger of the two reported inter-run standard deviations
    tied = [n for n in eligible if n != best and values[n] - values[best] <= max(spread[n], spread[best])]
    relu_family = [n for n in eligible if mobile_friendly(n)]
    if situation.hardware == "mobile" and relu_family:
        choice = min(relu_family, key=values.get)
        return PublishedChoice(
            excluded, best, tied, choice, apply_rule("mobile-relu", ffn=choice, gap=values[choice] - values[best])
        )
    if situation.model_size and size_tier(situation.model_size) == "large" and "swiglu" in (best, *tied):
        return PublishedChoice(excluded, best, tied, "swiglu", None)  # the large-model rule says why
    if situation.cost_sensitive and tied and not situation.long_context:
        flops = {n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops for n in values}
        choice = min([best] + tied, key=lambda n: (flops[n], values[n]))
        return PublishedChoice(excluded, best, tied, choice, apply_rule("cpu-cheap") if choice != best else None)
    return PublishedChoice(excluded, best, tied, best, None)


def advise_published(situation: Situation) -> dict:
    """Advice from Shazeer (2020) Table 1 when nothing was measured: the best variant within the
    budgets, or the one the situation's rules prefer."""
    table, long_run = SHAZEER_2020_65K, SHAZEER_2020_524K
    picked = choose_published(situation)
    choice, best, tied = picked.choice, picked.best, picked.tied
    values, spread, name = table.values, table.spread, table.names
    cite = f"{table.source} (arXiv:{table.arxiv}), {table.table.split(',')[0]}"
    reasons = [
        f"No measurements given (no --store), so this rests on published results: {cite}; {table.metric}, "
        f"{table.setup}.",
        f"{name[choice]} {values[choice]:.3f} (std {spread[choice]:.3f}) vs {name['relu']} {values['relu']:.3f} "
        f"and {name['gelu']} {values['gelu']:.3f} at 65,536 steps; at 524,288 steps {long_run.values[choice]:.3f} "
        f"vs {long_run.values['relu']:.3f} and {long_run.values['gelu']:.3f}.",
        "Every gated variant beats every dense one in that table at both lengths, at equal parameters and compute.",
    ]
    if tied:
        gaps = ", ".join(f"{name[n]} {values[n]:.3f} (std {spread[n]:.3f})" for n in tied)
        reasons.append(
            f"Within the reported run-to-run spread of {name[best]} {values[best]:.3f}: {gaps}; "
            "the paper's numbers do not separate them."
        )
    reasons += published_situation_reasons(situation, picked)
    rules = [apply_rule("budget-exclusion", ffn=n, why=why) for n, why in picked.excluded.items()]
    rules += ([picked.rule] if picked.rule else []) + situation_rules(situation)
    reasons += [rule_line(r) for r in rules]
    reasons.append(
        "Measure it on your own data before committing (command below): published gaps of "
        "0.01-0.05 nats need several seeds to confirm."
    )
    variants = list(dict.fromkeys([choice, best, *tied, "gelu", "relu"]))
    return {
        "recommendation": choice,
        "basis": "published",
        "reasons": reasons,
        "evidence": published_evidence(table, long_run),
        "alternatives": published_alternatives(table, long_run, choice, picked.excluded),
        "command": compare_command(variants, None, situation.depth),
        "rules": rules,
    }


def published_situation_reasons(situation: Situation, picked: PublishedChoice) -> list[str]:
    """What the situation changed about the published pick: cost, budgets, depth."""
    values, choice, best = SHAZEER_2020_65K.values, picked.choice, picked.best
    reasons = []
    if choice != best and picked.rule and picked.rule["rule"] == "cpu-cheap":
        flops = {n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops for n in (choice, best)}
        why = "latency-sensitive" if situation.latency_sensitive else f"{situation.deploy} deployment"
        reasons.append(
            f"Cost counts here ({why}): {choice}'s activation costs about {flops[choice]} FLOPs per element "
            f"against {flops[best]} for {best}'s (ffnlab's estimate), so the cheaper of the tied variants wins."
        )
    if picked.excluded:
        reasons.append(
            f"Budgets rule out {', '.join(picked.excluded)} at {size_text(situation.model_size)} parameters, so the "
            f"pick is among the rest ({best} {values[best]:.3f} is the best of them)."
        )
    elif situation.params_budget or situation.memory_budget:
        reasons.append(
            "The paper matches parameters and compute (gated d_ff = 2/3 of dense), as ffnlab does (--match params); "
            + (
                "every variant fits the budgets at the stated model size."
                if situation.model_size
                else "give --model-size to check each variant's parameters and training memory against the budgets."
            )
        )
    if situation.depth is not None:
        reasons.append(f"The published model has 12+12 layers; at {situation.depth} layers the gaps may differ.")
    return reasons


def published_alternatives(
    table: PublishedTable, long_run: PublishedTable, choice: str, excluded: dict[str, str] | None = None
) -> list[dict]:
    """Every other variant of the table, best first, with its published numbers and gap to the choice,
    and why a budget rules it out where one does."""
    values = table.values
    return [
        {
            "ffn": n,
            "published": values[n],
            "std": table.spread.get(n),
            "published_524k": long_run.values[n],
            "delta_vs_recommendation": round(values[n] - values[choice], 3),
            **({"excluded": excluded[n]} if n in (excluded or {}) else {}),
        }
        for n in sorted(values, key=values.get)
        if n != choice
    ]


def published_evidence(*tables: PublishedTable) -> dict:
    """The source and the numbers of the published tables the advice rests on (all from one paper)."""
    return {
        "kind": "published",
        "source": tables[0].source,
        "arxiv": tables[0].arxiv,
        "tables": [
            {
                "table": t.table,
                "metric": t.metric,
                "setup": t.setup,
                "values": t.values,
                "spread": t.spread,
                "paper_names": t.names,
            }
            for t in tables
        ],
    }


# ---- entry --------------------------------------------------------------------------------------


def make_situation(
    stage: str | None,
    pretrained: str | None,
    hardware: str | None,
    deploy: str | None,
    params_budget: float | str | None,
    memory_budget: float | str | None,
    model_size: float | str | None,
    **rest: object,
) -> Situation:
    """A Situation from the user's inputs, checked: names against their choices, sizes parsed
    ('125M', '16GiB'), a GPU tier's memory taken as a memory budget (the smaller of the two)."""
    stage = check_choice(stage, STAGES, "situation") or ("finetune" if pretrained else "pretrain")
    if stage != "pretrain" and not pretrained:
        known = ", ".join(sorted({f.example for f in MODEL_FAMILIES})[:4])
        raise ValueError(
            f"--situation {stage} starts from a checkpoint: give --pretrained (its config.json or a name such as {known})"
        )
    if stage == "pretrain" and pretrained:
        raise ValueError(
            "--pretrained names a checkpoint to start from; --situation pretrain trains from scratch: give one of them"
        )
    hardware = resolve_hardware(hardware, deploy)
    memory = parse_bytes(memory_budget) if isinstance(memory_budget, str) else memory_budget
    tier = HARDWARE_MEMORY.get(hardware) if hardware else None
    for name, value in (("sequence length", rest.get("seq_len")), ("depth", rest.get("depth"))):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return Situation(
        params_budget=parse_params(params_budget) if isinstance(params_budget, str) else params_budget,
        memory_budget=min(m for m in (memory, tier) if m) if memory or tier else None,
        deploy=deploy_of(hardware),
        stage=stage,
        hardware=hardware,
        model_size=parse_quantity(model_size, COUNT_SUFFIX, "model size", "1B", MOST_PARAMS)
        if isinstance(model_size, str)
        else model_size,
        **rest,
    )


def situation_rules(situation: Situation) -> list[dict]:
    """The rules of the model-size, sequence-length and GPU-memory branches that apply."""
    rules, size = [], situation.model_size
    if size:
        large = "; ".join(f"{g.model}: {g.source}" for g in GATED_AT_SCALE)
        names = ", ".join(f"{g.model} ({g.params}, {g.ffn})" for g in GATED_AT_SCALE)
        rules.append(
            apply_rule(f"{size_tier(size)}-model", size=size_text(size), large_models=large, large_names=names)
        )
    if situation.seq_len:
        d, n = situation.d_model, situation.seq_len
        rule = "long-context" if situation.long_context else "short-context"
        rules.append(apply_rule(rule, seq_len=n, d_model=d, share=ffn_flop_share(d, n), short=ffn_flop_share(d, 512)))
    if size and HARDWARE_MEMORY.get(situation.hardware or ""):
        rules.append(memory_rule(situation.hardware, size, situation.seq_len or DEFAULT_SEQ_LEN))
    return rules


def unused_inputs(situation: Situation) -> list[str]:
    """A reason naming the inputs a checkpoint's situation does not weigh, if any were given."""
    given = {
        "the model size": situation.model_size,
        "the sequence length": situation.seq_len,
        "the parameter budget": situation.params_budget,
        "the memory budget": situation.memory_budget,
        "the depth": situation.depth,
    }
    named = [flag for flag, value in given.items() if value]
    if situation.stage == "pretrain" or not named:
        return []
    return [
        f"{', '.join(named).capitalize()} did not change this: the checkpoint fixes the activation ({situation.stage})."
    ]


def advise(
    store: str | Path | None = None,
    params_budget: float | str | None = None,
    memory_budget: float | str | None = None,
    latency_sensitive: bool = False,
    pretrained: str | None = None,
    deploy: str | None = None,
    depth: int | None = None,
    situation: str | None = None,
    hardware: str | None = None,
    seq_len: int | None = None,
    model_size: float | str | None = None,
) -> dict:
    """Recommend an FFN variant for a situation (ffnlab.study.flow lists the inputs and their branches):
    from a checkpoint, keep its activation (fine-tuning, PEFT) or run it fastest (inference); when
    training from scratch, from measurements in `store`, else from published results.

    Budgets and the model size may be numbers or strings ('125M', '16GiB'). Besides "recommendation",
    "basis", "reasons", "evidence", "alternatives" and "command", the result holds "situation" (the
    inputs), "branch" ('pretrain/published', ...) and "rules" (each with its "evidence")."""
    context = make_situation(
        situation, pretrained, hardware, deploy, params_budget, memory_budget, model_size,
        latency_sensitive=latency_sensitive, depth=depth, seq_len=seq_len,
    )  # fmt: skip
    if pretrained:
        advice = advise_pretrained(pretrained, context.stage, context.hardware)
        if store is not None:
            advice["reasons"].append(
                f"The measurements in {store} were not used: they compare training from "
                "scratch, which starting from a checkpoint is not."
            )
    elif store is not None:
        if not Path(store).is_file():
            raise ValueError(
                f"no run store at {store}; run `ffnlab compare` first, or leave out --store to "
                "get advice from published results"
            )
        advice = advise_measured(store, context)
    else:
        advice = advise_published(context)
    # the published advice quotes the situation's rules itself, before its closing "measure it"
    extra = situation_rules(context) if advice["basis"] == "measured" else []
    advice["reasons"] += [rule_line(r) for r in extra] + unused_inputs(context)
    advice["rules"] = advice.get("rules", []) + extra
    advice["situation"] = asdict(context)
    advice["branch"] = f"{context.stage}/{advice['basis']}"
    return advice


def format_advice(advice: dict) -> str:
    """The advice as text for the terminal."""
    basis = {
        "measured": "from your measurements",
        "published": "from published results",
        "pretrained": "from the pretrained model",
    }[advice["basis"]]
    out = [f"recommendation: {advice['recommendation']}  ({basis})"]
    if advice.get("implementation"):
        out.append(f"implementation: {advice['implementation']}")
    out += ["", "why:"]
    out += [f"  - {r}" for r in advice["reasons"]]
    if advice["alternatives"]:
        out += ["", "alternatives:"]
        for a in advice["alternatives"]:
            if "excluded" in a:
                out.append(f"  - {a['ffn']}: excluded, {a['excluded']}")
            elif "summary" in a:
                out.append(f"  - {a['ffn']}: {a['summary']}")
            elif "published" in a:
                std = f" (std {a['std']:.3f})" if a.get("std") is not None else ""
                out.append(
                    f"  - {a['ffn']}: {a['published']:.3f}{std} at 65,536 steps, "
                    f"{a['delta_vs_recommendation']:+.3f} vs the recommendation"
                )
            else:
                out.append(f"  - {a['ffn']}: {a['why_not']}")
    ev = advice["evidence"]
    if ev["kind"] == "published":
        out += ["", f"source: {ev['source']}, arXiv:{ev['arxiv']}, {ev['tables'][0]['table']}"]
    elif ev["kind"] == "pretrained":
        out += ["", f"source: {ev['source']}"]
    for cell in advice.get("cells", []):
        where = key_values(cell["cell"])
        body = format_advice({**cell, "command": None}).splitlines()
        out += ["", f"cell {where}:"] + [f"  {line}" if line else "" for line in body]
    if advice["command"]:
        out += ["", f"measure it on your data: {advice['command']}"]
    return "\n".join(out)
