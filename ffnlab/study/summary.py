"""Per-cell summaries of a study: the one place where stored runs become the numbers people read.

A cell is one combination of a study's axis values (depth=6, placement=pre, ...); cells are never
merged. `compare` (its table, --json and --csv), `report` and `advise` all read the rows built
here, so the three can never disagree about a number.

A row per variant holds the paired statistics of `ffnlab.study.stats.compare` and, over the variant's
finished seeds: costs (parameters, FLOPs, throughput, memory), stability (spikes, divergence,
largest gradient norm), behaviour (dead units, sparsity), what else was measured (test metric,
metric under embedding noise, perplexity, FFN gradient statistics, learned activation parameters)
and the per-seed values the statistics came from.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from ffnlab._util.text import key_values
from ffnlab.core.model import describe_attn_act, qkv_act_spec
from ffnlab.run.config import TrainConfig
from ffnlab.run.train import train_flops
from ffnlab.study.plan import TUNED_AXES, Study, group_key, plan, plan_precision, run_id
from ffnlab.study.published import rank_agreement
from ffnlab.study.scaling import fit_scaling
from ffnlab.study.stats import MIN_PAIRS, compare, gap_heterogeneity, holm, seed_noise
from ffnlab.study.store import Store

LEVEL = 0.95
# a run's memory in bytes (ffnlab.core.memory): the total, its four parts, and the CUDA allocator's peak
MEMORY_FIELDS = ("train_mem_bytes", "param_bytes", "grad_bytes", "optimizer_bytes", "saved_bytes", "cuda_peak_bytes")
# a row's scalar fields, in the order the CSV writes them (the JSON has every field)
ROW_FIELDS = (
    "ffn",
    "rank",
    "n_seeds",
    "mean",
    "std",
    "ci_low",
    "ci_high",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "n_pairs",
    "p",
    "p_adj",
    "significant",
    "diverged",
    "ppl",
    "test_mean",
    "noisy_mean",
    "noise_delta",
    "params",
    "flops_per_token",
    "tokens_per_s",
    "step_time_s",
    "train_seconds",
    *MEMORY_FIELDS,
    "grad_spikes",
    "loss_spikes",
    "max_grad_norm",
    "dead_frac",
    "sparsity",
    "ffn_grad_mean",
    "ffn_grad_std",
)


def metric_of(task: str, split: str = "val") -> str:
    """The result field a comparison ranks by: final loss for an LM, final accuracy for a classifier."""
    return f"final_{split}_loss" if task == "lm" else f"final_{split}_acc"


def mean_of(values) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return math.fsum(values) / len(values) if values else None


def learned_mean(results: list[dict]) -> dict:
    """Learned activation parameters per layer, averaged over seeds (switch weights per activation)."""
    layers: dict[str, dict] = {}
    for r in results:
        for layer, params in (r.get("learned") or {}).items():
            for name, value in params.items():
                slot = layers.setdefault(layer, {}).setdefault(name, [])
                slot.append(value)
    out = {}
    for layer, params in layers.items():
        out[layer] = {}
        for name, values in params.items():
            if isinstance(values[0], dict):
                out[layer][name] = {k: mean_of(v[k] for v in values) for k in values[0]}
            elif isinstance(values[0], (int, float)):
                out[layer][name] = mean_of(values)
            else:  # a vector parameter: element-wise
                out[layer][name] = [mean_of(col) for col in zip(*values)]
    return out


def variant_costs(results: list[dict], runs: int, task: str) -> dict:
    """Everything but the statistics for one variant: costs, stability, behaviour, other signals."""
    step_times = [r["step_time_s"] for r in results if r.get("step_time_s") is not None]
    noisy = "noisy_val_loss" if task == "lm" else "noisy_val_acc"
    clean = metric_of(task)
    return {
        "params": results[0].get("params") if results else None,
        "flops_per_token": results[0].get("flops_per_token") if results else None,
        "tokens_per_s": mean_of(r.get("tokens_per_s") for r in results),
        "step_time_s": statistics.median(step_times) if step_times else None,
        "step_time_range": [min(step_times), max(step_times)] if step_times else None,
        "train_seconds": mean_of(r.get("train_seconds") for r in results),
        # memory is counted from tensors (ffnlab.core.memory), so seeds agree; the max guards against none
        **{k: max((r[k] for r in results if r.get(k) is not None), default=None) for k in MEMORY_FIELDS},
        "grad_spikes": sum(r.get("n_grad_spikes", 0) for r in results),
        "loss_spikes": sum(r.get("n_loss_spikes", 0) for r in results),
        "stability_events": sum(r.get("n_grad_spikes", 0) + r.get("n_loss_spikes", 0) for r in results),
        "max_grad_norm": max((r["max_grad_norm"] for r in results if r.get("max_grad_norm") is not None), default=None),
        "dead_frac": mean_of(r.get("dead_frac") for r in results),
        "sparsity": mean_of(
            mean_of(b.get("zero_frac") for b in r["behaviour"].values()) for r in results if r.get("behaviour")
        ),
        "test_mean": mean_of(r.get(metric_of(task, "test")) for r in results),
        "noisy_mean": mean_of(r.get(noisy) for r in results),
        "noise_delta": mean_of(
            r[noisy] - r[clean] for r in results if r.get(noisy) is not None and r.get(clean) is not None
        ),
        "ffn_grad_mean": mean_of(r.get("ffn_grad_mean") for r in results),
        "ffn_grad_std": mean_of(r.get("ffn_grad_std") for r in results),
        "learned": learned_mean(results),
        "runs": runs,
    }


def summarize_cell(items, variants: list[str], baseline: str, seeds: int, axes: dict) -> dict:
    """One cell's summary from its (config, store record) pairs.

    Seeds below `seeds` are the paired comparison; the baseline's seeds from `seeds` on are its
    noise-floor runs. Returns {"axes", "metric", "variants": rows best first, "verdict", ...}.
    """
    task = items[0][0].model.task
    metric = metric_of(task)
    values: dict[str, dict[int, float]] = {v: {} for v in variants}
    diverged = {v: 0 for v in variants}
    results: dict[str, list[dict]] = {v: [] for v in variants}
    runs = {v: 0 for v in variants}
    missing: dict[str, list[int]] = {}
    noise = []
    for cfg, rec in items:
        v = cfg.model.ffn
        res = (rec or {}).get("result") or {}
        done = rec is not None and (
            rec["status"] == "diverged" or (rec["status"] == "finished" and isinstance(res.get(metric), (int, float)))
        )
        if not done:  # failed, not yet run, or a finished result without its metric (a damaged row)
            missing.setdefault(v, []).append(cfg.seed)
            continue
        if cfg.seed >= seeds:
            if rec["status"] == "finished":
                noise.append(res[metric])
            continue
        runs[v] += 1
        if rec["status"] == "diverged":
            diverged[v] += 1
            values[v][cfg.seed] = float("nan")
            continue
        values[v][cfg.seed] = res[metric]
        results[v].append(res)
    stats = compare(values, baseline, higher_is_better=task == "cls", diverged=diverged, level=LEVEL)
    for row in stats["variants"]:
        v = row["ffn"]
        row["values"] = {s: x for s, x in sorted(values[v].items()) if math.isfinite(x)}
        row["test_values"] = {
            r["seed"]: r[metric_of(task, "test")]
            for r in sorted(results[v], key=lambda r: r["seed"])
            if r.get(metric_of(task, "test")) is not None
        }
        row.update(variant_costs(results[v], runs[v], task))
        row["ppl"] = math.exp(row["mean"]) if task == "lm" and row["mean"] is not None else None
    cell = {"axes": dict(axes), "metric": metric, **stats}
    if missing:  # failed, or not run yet: the statistics rest on fewer seeds than planned, and say so
        cell["missing"] = missing
        cell["verdict"] += (
            " Not finished (failed or not yet run), so left out: "
            + "; ".join(f"{v} seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))}" for v, ss in missing.items())
            + "."
        )
    if task == "lm":  # the published table is a language-modelling loss
        cell["literature"] = rank_agreement({r["ffn"]: r["mean"] for r in stats["variants"]})
    if noise:
        base = values[baseline]
        cell["noise_floor"] = seed_noise(noise + [base[s] for s in base if math.isfinite(base[s])])
    return cell


def tuned_cells(cells: list[dict], axes=("lr",)) -> list[dict]:
    """Each variant at its own best setting of `axes` (chosen on validation), compared on the test split.

    Cells that differ only in `axes` form a group; within it, a variant's setting is the cell with
    its best mean validation metric over seeds, and the comparison uses that cell's per-seed test
    metric, paired by seed. Choosing on validation and reporting on test keeps the selection from
    flattering the winner (Melis et al. 2018). Returns one cell per group, with axes[a] = "tuned"
    for each tuned axis and each row's chosen value in row[a] (and its validation mean in row["val_mean"]).
    """
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        key = tuple((k, v) for k, v in c["axes"].items() if k not in axes)
        groups.setdefault(key, []).append(c)
    out = []
    for key, group in groups.items():
        sign = -1.0 if group[0]["metric_direction"] == "higher" else 1.0
        chosen, test_values = {}, {}
        for v in [r["ffn"] for r in group[0]["variants"]]:
            rows = [(c["axes"], next(r for r in c["variants"] if r["ffn"] == v)) for c in group]
            rows = [(where, r) for where, r in rows if r["mean"] is not None]
            test_values[v] = {}
            if rows:
                where, row = min(rows, key=lambda wr: sign * wr[1]["mean"])
                chosen[v] = {**{a: where[a] for a in axes}, "val_mean": row["mean"]}
                test_values[v] = dict(row.get("test_values") or {})
        stats = compare(test_values, group[0]["baseline"], higher_is_better=sign < 0, level=LEVEL)
        for row in stats["variants"]:
            row.update({a: chosen.get(row["ffn"], {}).get(a) for a in (*axes, "val_mean")})
        out.append(
            {
                "axes": {**dict(key), **{a: "tuned" for a in axes}},
                "metric": group[0]["metric"].replace("_val_", "_test_"),
                "selected_on": group[0]["metric"],
                "tuned_axes": list(axes),
                **stats,
            }
        )
    return out


def across_cells(cells: list[dict], baseline: str, alpha: float = 0.05) -> dict | None:
    """Whether each variant's gap to the baseline changes between the cells of a study (None with one cell):
    per variant a repeated-measures F test on its per-seed gaps (`ffnlab.study.stats.gap_heterogeneity`),
    Holm-corrected over the variants, its mean gap in each cell, the best mean of each cell, and sentences.
    """
    if len(cells) < 2:
        return None
    labels = [key_values(c["axes"]) for c in cells]
    rows = [{r["ffn"]: r for r in c["variants"]} for c in cells]
    variants = {}
    for v in (r["ffn"] for r in cells[0]["variants"] if r["ffn"] != baseline):
        gaps = [
            {s: x - by[baseline]["values"][s] for s, x in by[v]["values"].items() if s in by[baseline]["values"]}
            for by in rows
        ]
        variants[v] = {**gap_heterogeneity(gaps), "gaps": [by[v]["delta"] for by in rows]}
    for row, p_adj in zip(variants.values(), holm([r["p"] for r in variants.values()])):
        row.update(p_adj=p_adj, differs=p_adj is not None and p_adj < alpha)
    best = [next((r["ffn"] for r in c["variants"] if r["mean"] is not None), None) for c in cells]
    return {
        "cells": labels,
        "variants": variants,
        "best": best,
        "alpha": alpha,
        "sentences": across_sentences(labels, variants, best, baseline),
    }


def across_sentences(labels: list[str], variants: dict, best: list, baseline: str) -> list[str]:
    """Plain words for `across_cells`: a sentence per variant, then the best mean of each cell."""
    out = []
    for v, r in variants.items():
        if r["p"] is None:
            out.append(f"{v}: no test of its gap across cells (needs ≥{MIN_PAIRS} seeds finished in every cell).")
            continue
        gaps = "; ".join(f"{g:+.4f} at {where}" for g, where in zip(r["gaps"], labels) if g is not None)
        f_text = "" if r["f"] is None else f"F({r['df'][0]}, {r['df'][1]}) = {r['f']:.2f}, "
        test = f"{f_text}p_adj = {r['p_adj']:.3g}"
        verb = "changes between cells" if r["differs"] else "shows no detectable change between cells"
        out.append(f"{v}'s gap to {baseline} {verb} ({test}): {gaps}.")
    if None not in best and len(set(best)) == 1:
        out.append(f"The best mean is {best[0]} in every cell.")
    elif None not in best:
        out.append(
            "The best mean differs between cells: " + "; ".join(f"{b} at {w}" for b, w in zip(best, labels)) + "."
        )
    return out


# ---- words for the numbers, shared by the terminal table and the report ----------------------------


def p_label(row: dict, baseline: str) -> str:
    """A row's Holm-adjusted p as shown: '-' for the baseline, 'n/a (needs ≥3 seeds)' where untested."""
    if row["ffn"] == baseline:
        return "-"
    return f"n/a (needs ≥{MIN_PAIRS} seeds)" if row["p_adj"] is None else f"{row['p_adj']:.3f}"


def literature_text(lit: dict) -> str:
    """The rank agreement of a cell with the published table, and each pair ordered differently."""
    pairs = "; ".join(
        f"{a} vs {b}: measured {m[0]:.4f} vs {m[1]:.4f}, published {p[0]:.3f} vs {p[1]:.3f}"
        for (a, b), m, p in ((d["pair"], d["measured"], d["published"]) for d in lit["disagree"])
    )
    return f"Rank agreement with {lit['source']} over {lit['n']} shared variants: Kendall τ = {lit['tau']:.2f}. " + (
        f"Pairs ordered differently: {pairs}." if pairs else "Every pair is ordered the same way."
    )


# ---- a whole study ----------------------------------------------------------------------------------


def summarize_study(
    study: Study,
    store_path: str | os.PathLike,
    runs: list[TrainConfig] | None = None,
    extrapolate_to: float | None = None,
) -> dict:
    """The study's summary: one `ffnlab.study.summary.summarize_cell` per cell of its axes (never merged),
    plus, with an lr axis, the tuned comparison (`tuned_cells`), and with --scale axes the loss-vs-compute
    fits (`scaling_of`; `extrapolate_to` FLOPs adds a multiplier there, marked as an extrapolation)."""
    runs = plan(study) if runs is None else runs
    cells: dict[tuple, list] = {}
    with Store(Path(store_path), create=False) as store:
        for cfg in runs:
            cells.setdefault(group_key(cfg, study), []).append((cfg, store.get(run_id(cfg))))
    out_cells = [
        summarize_cell(items, study.variants, study.baseline, study.seeds, dict(key)) for key, items in cells.items()
    ]
    summary = {
        "store": str(store_path),
        "baseline": study.baseline,
        "seeds": study.seeds,
        "settings": settings_of(study),
        "cells": out_cells,
    }
    across = across_cells(out_cells, study.baseline, out_cells[0]["alpha"])
    if across:
        summary["across_cells"] = across
    tuned = [a for a in TUNED_AXES if a in study.axes]
    if tuned:
        summary["tuned"] = tuned_cells(out_cells, tuned)
    if study.scale:
        summary["scaling"] = scaling_of(study, [item for items in cells.values() for item in items], extrapolate_to)
    if len(out_cells) == 1:  # the common case: no extra axes
        summary.update({k: out_cells[0][k] for k in ("variants", "verdict", "metric")})
        if "noise_floor" in out_cells[0]:
            summary["noise_floor"] = out_cells[0]["noise_floor"]
    return summary


def scaling_of(study: Study, items: list, extrapolate_to: float | None = None) -> dict | None:
    """`ffnlab.study.scaling.fit_scaling` over the study's paired seeds: each run's training compute
    (`train_flops`) against its final metric; None while fewer than 3 computes have finished."""
    task = items[0][0].model.task
    metric = metric_of(task)
    runs = []
    for cfg, rec in items:
        res = (rec or {}).get("result") or {}
        if cfg.seed >= study.seeds or not rec or rec["status"] not in ("finished", "diverged"):
            continue  # noise-floor seeds are unpaired; unfinished runs have no point yet
        compute = res.get("train_flops") or train_flops(res["flops_per_token"], res["tokens"])  # older stores
        loss = res.get(metric) if rec["status"] == "finished" else None
        runs.append({"variant": cfg.model.ffn, "seed": cfg.seed, "compute": compute, "loss": loss or math.nan})
    try:
        fits = fit_scaling(runs, study.baseline, level=LEVEL, extrapolate_to=extrapolate_to)
    except ValueError as e:  # too few finished sizes yet (a study still running, or many diverged)
        return {"error": str(e), "scale": {a: study.axes[a] for a in study.scale}}
    return {"scale": {a: study.axes[a] for a in study.scale}, "metric": metric, **fits}


def settings_of(study: Study) -> dict:
    """The run settings a reader needs to judge a comparison, with what it held equal and what not."""
    b = study.base
    return {
        "data": b.data,
        "task": b.model.task,
        "tokenizer": b.tokenizer,
        "model": {
            k: getattr(b.model, k)
            for k in ("n_layers", "n_heads", "d_model", "context", "norm", "placement", "pos", "dropout")
        },
        "match": b.model.ffn_match,
        "init": b.model.init,
        "attn_act": qkv_act_spec(b.model),  # activations on Q, K, V (ModelConfig.attn_act)
        "batch_size": b.batch_size,
        "budget": (
            {"max_seconds": b.max_seconds}
            if b.max_seconds
            else {"max_tokens": b.max_tokens}
            if b.max_tokens
            else {"max_steps": b.max_steps}
        ),
        "tokens_per_run": (b.max_tokens or b.max_steps * b.batch_size * b.model.context) if not b.max_seconds else None,
        "lr": b.lr,
        "min_lr": b.lr / 10 if b.min_lr is None else b.min_lr,
        "warmup_steps": b.warmup_steps,
        "weight_decay": b.weight_decay,
        "beta2": b.beta2,
        "grad_clip": b.grad_clip,
        "precision": plan_precision(b),
        "seeds": study.seeds,
        "variants": study.variants,
        "axes": study.axes,
        "per_variant": study.per_variant,
        "pretrained": {"from": b.init_from, "digest": b.init_digest} if b.init_from else None,
        **held_equal(study),
    }


def held_equal(study: Study) -> dict[str, list[list[str]]]:
    """{"held_equal": [[what, how]], "not_equal": [[what, why]]}: the comparison's controls, in words.

    Everything but the FFN is held equal by construction (same seed -> same data order and the same
    non-FFN weights); what cannot be, or was chosen not to be, is named rather than left implicit.
    An axis of the study is varied on purpose and compared only within its cells."""
    b = study.base
    lr = "an lr axis: " + ", ".join(map(str, study.axes["lr"])) if "lr" in study.axes else f"peak {b.lr:g}"
    min_lr = "lr/10" if b.min_lr is None else f"{b.min_lr:g}"
    equal = [
        ["data order", "seed s of every variant trains on the same batches in the same order"],
        ["evaluation", "the same fixed validation (and test) batches for every variant and seed"],
        ["non-FFN weights", "identical at the start for one seed: each parameter drawn from its own generator, "
                            "seeded by seed, name and shape"],
        ["learning rate and schedule", f"AdamW, {lr}, {b.warmup_steps} warm-up steps, cosine to {min_lr}, "
                                       f"beta2 {b.beta2}, gradient clip {b.grad_clip}"],
        ["weight-decay groups",
         f"{b.weight_decay} on every matrix; none on biases, norms or learnable activation parameters"],
        ["precision", plan_precision(b)],
        attn_act_row(study),
    ]  # fmt: skip
    unequal = []
    if any(study.per_variant.values()):
        equal = [row for row in equal if row[0] != "learning rate and schedule"]
        unequal.append(per_variant_row(study))
    if b.init_from:  # fine-tuning: the folder's weights, widths and biases for every variant
        equal = [row for row in equal if row[0] != "non-FFN weights"]
        sources = (pretrained_rows(study), budget_rows(study))
    else:
        sources = (parameter_rows(study), init_rows(study), budget_rows(study), bias_rows(study))
    for rows in sources:
        equal += rows["equal"]
        unequal += rows["unequal"]
    if study.base.model.dropout:
        equal.append(["dropout masks", "the same random stream for every variant with one seed"])
    if study.axes:
        equal.append(
            [
                "study axes",
                f"{', '.join(sorted(study.axes))}: varied on purpose, compared within each cell; each gap tested across cells",
            ]
        )
    return {"held_equal": equal, "not_equal": unequal}


def attn_act_row(study: Study) -> list[str]:
    """The held-equal row of the Q/K/V activations: one setting for every variant, or the attn_act axis."""
    if "attn_act" in study.axes:
        values = "; ".join(map(str, study.axes["attn_act"]))
        return ["Q/K/V activations", f"the attn_act axis ({values}): the same for every variant within a cell"]
    return ["Q/K/V activations", f"{describe_attn_act(qkv_act_spec(study.base.model))} for every variant"]


def pretrained_rows(study: Study) -> dict[str, list[list[str]]]:
    """Fine-tuning from a pretrained folder: every weight is the folder's, only the activation changes."""
    b, own = study.base, study.baseline  # the CLI makes the folder's own activation the baseline
    equal = [
        ["pretrained weights", f"every variant and seed starts from {b.init_from} (digest {b.init_digest or '-'}): "
                               "attention, embeddings, norms and the FFN matrices carried over"],
        ["parameters", "the pretrained FFN widths and matrices: a swap changes the activation only"],
        ["warm-up", f"a fresh warm-up of {b.warmup_steps} steps from the pretrained weights for every variant"],
    ]  # fmt: skip
    swaps = [v for v in study.variants if v != own]
    unequal = [["FFN activation", f"{own} kept (the pretrained one) vs swapped to {', '.join(swaps) or '-'}, "
                                  "the FFN weights unchanged"]]  # fmt: skip
    if b.model.task == "cls":
        unequal.append(["classification head", "newly initialised (the folder has none); the same for every "
                                               "variant with one seed"])  # fmt: skip
    return {"equal": equal, "unequal": unequal}


def per_variant_row(study: Study) -> list[str]:
    """The not-equal row of settings tuned per variant (the protocol's lr, warm-up)."""
    tuned = sorted({path for overrides in study.per_variant.values() for path in overrides})
    values = "; ".join(f"{v}: " + ", ".join(f"{k} {x:g}" for k, x in o.items()) for v, o in study.per_variant.items())
    return ["per-variant settings",
            f"{', '.join(tuned)} set per variant ({values}), each tuned on validation; the rest of the schedule "
            "as in the base"]  # fmt: skip


def parameter_rows(study: Study) -> dict[str, list[list[str]]]:
    """Parameters and FLOPs: which of the two the widths match, and so which follows."""
    m = study.base.model
    if m.d_ff is not None:
        why = f"one hidden width (d_ff {m.d_ff}) for every variant: a gated FFN has 1.5x the weights of a dense one"
        return {"equal": [], "unequal": [["parameters", why]]}
    if m.ffn_match == "none":
        return {
            "equal": [],
            "unequal": [["parameters", "not matched (--match none): each variant at its conventional width"]],
        }
    matched, other = ("parameters", "FLOPs per token") if m.ffn_match == "params" else ("FLOPs per token", "parameters")
    return {
        "equal": [[matched, f"every FFN within 1% of the dense 4x FFN's {m.ffn_match} (gated widths 2/3 as wide)"]],
        "unequal": [[other, f"follow from the width that matches {m.ffn_match}; shown per variant"]],
    }


def init_rows(study: Study) -> dict[str, list[list[str]]]:
    """FFN initialisation: one scheme for all, per family (a confound), or an axis."""
    init = study.base.model.init
    if "init" in study.axes:  # varied on purpose: an axis
        return {"equal": [], "unequal": []}
    if init == "family":
        why = ("init 'family': each activation family its own scheme (relu he, gelu normal 0.02, swish "
               "lecun_uniform), so init is confounded with the activation")  # fmt: skip
        return {"equal": [], "unequal": [["FFN initialisation", why]]}
    return {"equal": [["FFN initialisation", f"{init} for every variant's FFN weights"]], "unequal": []}


def budget_rows(study: Study) -> dict[str, list[list[str]]]:
    """The training budget: equal tokens, or equal wall-clock time (then tokens differ)."""
    b = study.base
    if b.max_seconds:
        why = f"an equal wall-clock budget ({b.max_seconds:g} s): faster variants train on more tokens"
        return {"equal": [], "unequal": [["tokens seen", why]]}
    budget = (
        f"{b.max_tokens:,} tokens"
        if b.max_tokens
        else f"{b.max_steps:,} steps of {b.batch_size} x {b.model.context} tokens"
    )
    return {"equal": [["budget", budget]], "unequal": []}


def bias_rows(study: Study) -> dict[str, list[list[str]]]:
    """FFN biases: each variant's convention, or one setting for all."""
    bias = study.base.model.ffn_bias
    if bias is None:
        why = ("each variant's convention: dense FFNs have biases, gated ones none (Shazeer 2020); "
               "ModelConfig.ffn_bias sets one for all")  # fmt: skip
        return {"equal": [], "unequal": [["biases", why]]}
    return {"equal": [["biases", "on in every FFN" if bias else "off in every FFN"]], "unequal": []}
