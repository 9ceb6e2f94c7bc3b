"""The comparison report: one self-contained HTML page, a Markdown summary and the figures as PNG.

Everything comes from the run store. A study is reconstructed from it when none is given: the
finished runs whose configs agree on everything but the FFN, the seed and the study axes (depth,
width, ...) form one study, and the most recently finished study is reported. The page holds the
ranking with confidence intervals, the settings, loss curves with bands over seeds, costs,
stability, the activation functions, attention maps of each variant's trained model (read from
the weights the sweep saves beside the store) and, when present, the numerics results.

The HTML opens offline: images are inline base64 PNG, the CSS is inline, there is no script,
and every piece of text that comes from the user or the store is escaped.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import math
import os
import statistics
from dataclasses import replace
from pathlib import Path

from ffnlab._util.files import write_atomic
from ffnlab._util.text import human, num
from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.run.train import TrainConfig
from ffnlab.study import plots
from ffnlab.study.execute import weights_path
from ffnlab.study.plan import AXES, Study, group_key, plan, run_id
from ffnlab.study.protocol import STAGE_TITLES, load_protocol
from ffnlab.study.stats import mean_ci
from ffnlab.study.store import Store
from ffnlab.study.summary import literature_text, p_label, summarize_study

REPORT_HTML = "report.html"
SUMMARY_MD = "summary.md"
FIGURES_DIR = "figures"
NUMERICS_JSON = "numerics.json"  # beside the store, written by `ffnlab report --numerics`


# ---- the study, from the store ----------------------------------------------------------------


def axis_value(config: dict, axis: str):
    """The value of a study axis ('depth' -> config['model']['n_layers']) in a config dict."""
    obj = config
    for part in AXES[axis].split("."):
        obj = obj[part]
    return obj


LEGACY_AXES = ("depth", "width", "placement", "norm", "task", "data")  # the axes before studies were recorded


def study_key(config: dict) -> str:
    """What runs of one study share: the config minus FFN, seed, checkpoint folder and axis values."""
    d = json.loads(json.dumps(config))
    d.pop("seed", None)
    d.pop("checkpoint_dir", None)
    d["model"].pop("ffn", None)
    for axis in LEGACY_AXES:
        *parents, last = AXES[axis].split(".")
        obj = d
        for part in parents:
            obj = obj[part]
        obj.pop(last, None)
    return json.dumps(d, sort_keys=True)


def load_study(store_path, baseline: str | None = None) -> tuple[Study, list[TrainConfig], int]:
    """The most recently run study in a store with a finished run: (study, its runs' configs, number
    of other studies). `baseline` replaces the study's own.

    Studies are recorded by `run_study`; for stores written before that, `rebuild_study` infers one.
    """
    with Store(store_path, create=False) as store:
        recorded = store.studies()
        for rec in recorded:
            study = Study.from_dict(rec["study"])
            runs = plan(study)
            if any((store.get(run_id(c)) or {}).get("status") in ("finished", "diverged") for c in runs):
                break
        else:
            return rebuild_study(store_path, baseline)
    if baseline is not None:
        if get_ffn_spec(baseline).name not in study.variants:
            raise ValueError(f"baseline '{baseline}' was not run in this study; valid: {', '.join(study.variants)}")
        study = replace(study, baseline=get_ffn_spec(baseline).name)
    return study, runs, len(recorded) - 1


def rebuild_study(store_path, baseline: str | None = None) -> tuple[Study, list[TrainConfig], int]:
    """For a store without study records: the most recently finished group of runs that agree on
    everything but the FFN, the seed and the axes an older ffnlab had (LEGACY_AXES).

    variants = the distinct FFNs, seeds = seeds per variant, axes = the axis fields that vary,
    baseline = `baseline`, else relu if present, else the first variant. Seeds of the baseline
    beyond the others' count are its noise-floor runs.
    """
    with Store(store_path, create=False) as store:
        records = [r for r in store.runs() if r["status"] in ("finished", "diverged")]
    if not records:
        raise ValueError(f"run store {store_path} holds no finished runs; run `ffnlab compare` first")
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(study_key(r["config"]), []).append(r)
    latest = max(groups.values(), key=lambda rs: max(r["finished_at"] or 0.0 for r in rs))
    configs = [TrainConfig.from_dict(r["config"]) for r in latest]
    stale = sum(run_id(c) != r["id"] for c, r in zip(configs, latest))
    if stale:  # a config field was added since: the ids that summaries look up no longer match
        raise ValueError(
            f"{stale} runs in {store_path} were stored by an ffnlab whose run configs differ from "
            "this version's; run the study again into a new store"
        )
    variants = list(dict.fromkeys(c.model.ffn for c in configs))
    axes = {}
    for axis in LEGACY_AXES:
        values = list(dict.fromkeys(axis_value(r["config"], axis) for r in latest))
        if len(values) > 1:
            axes[axis] = values
    if baseline is None:
        baseline = "relu" if "relu" in variants else variants[0]
    elif get_ffn_spec(baseline).name not in variants:
        raise ValueError(f"baseline '{baseline}' was not run in this study; valid: {', '.join(variants)}")
    baseline = get_ffn_spec(baseline).name
    n_seeds = {v: len({c.seed for c in configs if c.model.ffn == v}) for v in variants}
    others = [n for v, n in n_seeds.items() if v != baseline]
    seeds = max(others) if others else n_seeds[baseline]
    study = Study(
        variants=variants,
        seeds=seeds,
        base=configs[0],
        axes=axes,
        baseline=baseline,
        noise_floor=max(0, n_seeds[baseline] - seeds),
    )
    return study, configs, len(groups) - 1


# ---- numbers behind the figures -----------------------------------------------------------------


def seed_band(series: list[dict[float, float]], level: float = 0.95) -> dict:
    """Mean and t-interval over seeds at each x where a seed has a finite value.

    series: one {x: value} per seed. Returns {"x", "mean", "low", "high", "n"}; where only one
    seed has a value the band collapses to the mean."""
    xs = sorted({x for s in series for x in s})
    out = {"x": [], "mean": [], "low": [], "high": [], "n": len(series)}
    for x in xs:
        values = [s[x] for s in series if x in s and math.isfinite(s[x])]
        if not values:
            continue
        m = mean_ci(values, level)
        out["x"].append(x)
        out["mean"].append(m["mean"])
        out["low"].append(m["ci_low"] if m["ci_low"] is not None else m["mean"])
        out["high"].append(m["ci_high"] if m["ci_high"] is not None else m["mean"])
    return out


def time_band(losses: list[dict[int, float]], times: list[dict[int, float]], level: float = 0.95) -> dict:
    """Loss against wall-clock time: at each evaluation step, the seeds' mean time (x) and the
    mean and t-interval of their loss."""
    band = seed_band(losses, level)
    band["x"] = [statistics.mean(t[step] for t in times if step in t) for step in band["x"]]
    return band


def mean_or_none(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.mean(values) if values else None


def fixed_input(cfg: TrainConfig):
    """The first `context` tokens of the validation split, its text, and the model config the
    trained weights need (vocabulary and classes from the data)."""
    from ffnlab.run.train import crop_or_repeat, load_data

    corpus, tok, splits = load_data(
        cfg.data, cfg.model.task, cfg.tokenizer, cfg.bpe_vocab, cfg.text_field, cfg.label_field
    )
    T = cfg.model.context
    ids = splits["val"][:T] if cfg.model.task == "lm" else crop_or_repeat(splits["val"][0][0], T)
    mcfg = replace(
        cfg.model,
        vocab_size=tok.vocab_size,
        n_classes=len(corpus.classes) if cfg.model.task == "cls" else cfg.model.n_classes,
    )
    return ids, tok.decode(ids.tolist()), mcfg


def attention_data(store_path: Path, runs: dict[str, list[tuple]], layer: int | None) -> dict:
    """Attention maps (n_heads, T, T) of each variant's lowest-seed finished model at one layer,
    on the same fixed input; {"note"} when the weights or the data are not at hand."""
    import torch
    from safetensors.torch import load_model

    from ffnlab.core.model import Transformer

    if not any(rec["status"] == "finished" for items in runs.values() for _, rec in items):
        return {"note": "no run finished (all diverged or failed): there is no trained model to draw"}
    picks = {}
    for variant, items in runs.items():
        done = sorted(
            (c.seed, c, rec)
            for c, rec in items
            if rec["status"] == "finished" and weights_path(store_path, rec["id"]).exists()
        )
        if done:
            picks[variant] = done[0][1:]
    hf = next((c.hf_config for c, _ in picks.values() if getattr(c, "hf_config", None)), None)
    if hf:
        return {
            "note": "attention maps are drawn for ffnlab's own Transformer; this study trained a Hugging Face "
            f"architecture ({hf.get('model_type', 'unknown model_type')})"
        }
    if not picks:
        return {
            "note": f"no saved weights under {Path(store_path).parent / 'weights'}: the runs were trained "
            "by an ffnlab that did not save them; run the study again into a new store"
        }
    cfg = next(iter(picks.values()))[0]
    n_layers = cfg.model.n_layers
    layer = n_layers - 1 if layer is None else layer
    if not 0 <= layer < n_layers:
        raise ValueError(
            f"attention layer {layer} is out of range; the models have {n_layers} layers (0-{n_layers - 1})"
        )
    try:
        ids, text, _ = fixed_input(cfg)
    except Exception as e:  # the data may be gone or need a network; the rest of the report stands
        return {"note": f"attention maps skipped: cannot load the data '{cfg.data}' ({type(e).__name__}: {e})"}
    maps = {}
    for variant, (c, rec) in picks.items():
        _, _, mcfg = fixed_input(c)  # the data is cached: this only sets the variant's FFN
        model = Transformer(mcfg, c.seed)
        try:
            load_model(model, str(weights_path(store_path, rec["id"])))
        except Exception as e:  # a damaged or foreign file: the rest of the report stands
            return {
                "note": f"attention maps skipped: cannot read {weights_path(store_path, rec['id'])} "
                f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else '-'})"
            }
        model.eval()
        with torch.no_grad():
            maps[variant] = model.attention_maps(ids[None], layer)[0].float().numpy()  # (n_heads, T, T)
    return {
        "layer": layer,
        "maps": maps,
        "seeds": {v: c.seed for v, (c, _) in picks.items()},
        "text": text,
        "tokens": len(ids),
    }


def cell_data(
    store: Store,
    study: Study,
    items: list[tuple],
    summary_cell: dict,
    store_path: Path,
    layer: int | None,
    attention: bool,
) -> dict:
    """One cell of the study for the report: its summary rows (`ffnlab.study.summary`, the numbers every
    output shares) and, for the figures, curves, gradient traces and per-layer behaviour."""
    by_variant: dict[str, list[tuple]] = {v: [] for v in study.variants}
    for cfg, rec in items:
        if rec is not None and rec["status"] in ("finished", "diverged") and cfg.seed < study.seeds:
            by_variant[cfg.model.ffn].append((cfg, rec))
    curves, time_curves, traces, behaviour = {}, {}, {}, {}
    for v, runs in by_variant.items():
        losses, times, traces[v] = [], [], []
        layers: dict[str, list[dict]] = {}
        for _cfg, rec in runs:
            series = {}
            for step, name, value in store.metrics(rec["id"]):
                series.setdefault(name, {})[step] = value
            events = store.events(rec["id"])
            grad = series.get("grad_norm", {})
            traces[v].append(
                {
                    "x": list(grad),
                    "y": list(grad.values()),
                    "diverged": next((e["step"] for e in events if e["kind"] == "nonfinite"), None),
                    "spikes": [(e["step"] + 1, e["value"]) for e in events if e["kind"] == "grad_spike"],
                }
            )
            if rec["status"] != "finished":
                continue
            losses.append(series.get("val_loss", {}))
            times.append(series.get("val_time", {}))
            for name, b in (rec["result"].get("behaviour") or {}).items():
                layers.setdefault(name, []).append(b)
        curves[v] = seed_band(losses)
        time_curves[v] = time_band(losses, times)
        behaviour[v] = {
            name: {k: mean_or_none([b.get(k) for b in bs]) for k in ("dead_frac", "zero_frac", "inactive_frac")}
            for name, bs in layers.items()
        }
    rows = [dict(r) for r in summary_cell["variants"]]
    base = next((r for r in rows if r["ffn"] == study.baseline), None)
    for r in rows:
        r["step_time_ratio"] = (
            r["step_time_s"] / base["step_time_s"] if base and base["step_time_s"] and r["step_time_s"] else None
        )
    out = {
        **{k: v for k, v in summary_cell.items() if k != "variants"},
        "rows": rows,
        "level": summary_cell.get("level", 0.95),
        "alpha": summary_cell.get("alpha", 0.05),
        "curves": curves,
        "time_curves": time_curves,
        "traces": traces,
        "behaviour": behaviour,
        "noise_floor": summary_cell.get("noise_floor"),
    }
    if attention:
        out["attention"] = attention_data(store_path, by_variant, layer)
    return out


def load_numerics(store_path: Path, variants, run: bool) -> dict | None:
    """numerics.json beside the store (computed first when `run`), or None when there is none."""
    path = Path(store_path).parent / NUMERICS_JSON
    if run:
        from ffnlab.tools.numerics import run_numerics, to_json

        acts = list(dict.fromkeys(a for v in variants for a in get_ffn_spec(v).acts))
        text = to_json(run_numerics(names=acts, points=20_001, claims=False))
        write_atomic(path, text)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"error": f"cannot read {path}: {e}"}


def report_data(
    store_path,
    study: Study | None = None,
    runs: list[TrainConfig] | None = None,
    baseline: str | None = None,
    layer: int | None = None,
    numerics: bool = False,
    attention: bool = True,
) -> dict:
    """Everything the report shows, as plain data: the summary, settings, environment and per cell
    of the study its rows, curves, traces, behaviour and attention maps."""
    store_path = Path(store_path)
    others = 0
    if study is None:
        study, runs, others = load_study(store_path, baseline)
    runs = plan(study) if runs is None else runs
    summary = summarize_study(study, store_path, runs)
    cells: dict[tuple, list] = {}
    with Store(store_path, create=False) as store:
        records = {}
        for cfg in runs:
            records[run_id(cfg)] = store.get(run_id(cfg))
            cells.setdefault(group_key(cfg, study), []).append((cfg, records[run_id(cfg)]))
        done = [r for r in records.values() if r and r["status"] in ("finished", "diverged")]
        if not done:
            raise ValueError(f"run store {store_path} holds no finished runs of this study; run `ffnlab compare` first")
        env = max(done, key=lambda r: r["finished_at"] or 0.0).get("env") or {}
        out_cells = [
            cell_data(store, study, cells[key], sc, store_path, layer, attention)
            for key, sc in zip(cells, summary["cells"])
        ]
    hf = getattr(study.base, "hf_config", None)
    return {
        "store": str(store_path),
        "baseline": study.baseline,
        "variants": study.variants,
        "architecture": f"Hugging Face {hf.get('model_type', '?')} (FFN swapped per variant)" if hf else None,
        "settings": summary["settings"],
        "env": env,
        "cells": out_cells,
        "tuned": summary.get("tuned", []),
        "other_studies": others,
        "activations": plots.activation_labels(study.variants),
        "numerics": load_numerics(store_path, study.variants, numerics),
        "protocol": load_protocol(store_path),
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
    }


# ---- figures ------------------------------------------------------------------------------------


def metric_label(metric: str) -> str:
    return "validation loss (nats/token)" if metric == "final_val_loss" else "validation accuracy"


class PngDict(dict):
    """name -> PNG bytes; assigning a matplotlib figure stores its bytes and closes it, so a study with
    many cells never holds dozens of open figures."""

    def __setitem__(self, name, fig):
        super().__setitem__(name, plots.png_bytes(fig))


def render_figures(data: dict) -> dict[str, bytes]:
    """File name -> PNG bytes of every figure; cells of a study with axes get a numbered suffix."""
    styles = plots.variant_styles(data["variants"])
    figs = PngDict()  # each figure becomes PNG bytes (and is closed) as soon as it is drawn
    for i, cell in enumerate(data["cells"]):
        sfx = f"_{i + 1}" if len(data["cells"]) > 1 else ""
        where = cell_label(cell)
        title = f" ({where})" if where else ""
        figs[f"val_loss{sfx}.png"] = plots.band_figure(
            cell["curves"],
            styles,
            f"validation loss, mean and {round(cell['level'] * 100)}% CI over seeds{title}",
            "training step",
            "validation loss (nats/token)",
        )
        figs[f"final{sfx}.png"] = plots.final_figure(
            [
                {
                    "ffn": r["ffn"],
                    "mean": r["mean"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "values": list(r["values"].values()),
                }
                for r in cell["rows"]
            ],
            styles,
            data["baseline"],
            metric_label(cell["metric"]),
            cell["level"],
        )
        figs[f"loss_vs_time{sfx}.png"] = plots.band_figure(
            cell["time_curves"],
            styles,
            f"validation loss against wall-clock training time{title}",
            "training time (s)",
            "validation loss (nats/token)",
        )
        figs[f"grad_norm{sfx}.png"] = plots.traces_figure(
            cell["traces"],
            styles,
            f"gradient norm before clipping, one line per seed{title}",
            "training step",
            "global gradient norm",
        )
        if any(cell["behaviour"].values()):
            figs[f"behaviour{sfx}.png"] = plots.layers_figure(
                cell["behaviour"],
                styles,
                {"dead_frac": "dead units (fraction never > 0)", "zero_frac": "sparsity (fraction of exact zeros)"},
            )
        att = cell.get("attention") or {}
        if att.get("maps"):
            figs[f"attention{sfx}.png"] = plots.attention_figure(att["maps"], att["layer"])
    acts = data["activations"]
    figs["activations.png"] = plots.activations_figure(list(acts), labels=acts)
    return dict(figs)


# ---- formatting ---------------------------------------------------------------------------------


def cell_label(cell: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cell["axes"].items())


def delta_text(r: dict, baseline: str) -> str:
    if r["ffn"] == baseline:
        return "baseline"
    if r["delta"] is None:
        return "-"
    ci = f" [{num(r['delta_ci_low'])}, {num(r['delta_ci_high'])}]" if r["delta_ci_low"] is not None else ""
    return f"{r['delta']:+.4f}{ci}{' *' if r['significant'] else ''}"


def ranking_rows(cell: dict, baseline: str) -> tuple[list[str], list[list[str]]]:
    """Header and plain-text rows of the ranking table (shared by HTML and Markdown)."""
    pct = round(cell["level"] * 100)
    metric = "val loss" if cell["metric"] == "final_val_loss" else "val acc"
    head = [
        "rank",
        "ffn",
        f"{metric} mean [{pct}% CI]",
        f"Δ vs {baseline} [{pct}% CI]",
        "p (Holm)",
        "seeds",
        "diverged",
    ]
    rows = [
        [
            str(r["rank"]),
            r["ffn"],
            f"{num(r['mean'])} [{num(r['ci_low'])}, {num(r['ci_high'])}]",
            delta_text(r, baseline),
            p_label(r, baseline),
            str(r["n_seeds"]),
            str(r["diverged"]),
        ]
        for r in cell["rows"]
    ]
    return head, rows


def tuned_rows(cell: dict, baseline: str) -> tuple[list[str], list[list[str]]]:
    """The tuned comparison: each variant's lr chosen on validation, its test metric compared."""
    metric = "test loss" if cell["metric"] == "final_test_loss" else "test acc"
    head = [
        "rank",
        "ffn",
        "chosen setting",
        "val mean at it",
        f"{metric} mean [95% CI]",
        f"Δ vs {baseline} [95% CI]",
        "p (Holm)",
        "seeds",
    ]
    rows = [
        [
            str(r["rank"]),
            r["ffn"],
            ", ".join(f"{a} {r.get(a)}" for a in cell.get("tuned_axes", ["lr"])),
            num(r.get("val_mean")),
            f"{num(r['mean'])} [{num(r['ci_low'])}, {num(r['ci_high'])}]",
            delta_text(r, baseline),
            p_label(r, baseline),
            str(r["n_seeds"]),
        ]
        for r in cell["variants"]
    ]
    return head, rows


def cost_rows(cell: dict) -> tuple[list[str], list[list[str]]]:
    head = [
        "ffn",
        "params",
        "FLOPs/token",
        "tokens/s",
        "step time (ms)",
        "seeds' range (ms)",
        "vs baseline",
        "training memory",
        "saved for backward",
        "train time (s)",
    ]
    spread = lambda r: f"{r[0] * 1e3:.1f}-{r[1] * 1e3:.1f}" if r else "-"
    rows = [
        [
            r["ffn"],
            human(r["params"]),
            human(r["flops_per_token"]),
            human(r["tokens_per_s"]),
            num(r["step_time_s"] * 1e3 if r["step_time_s"] else None, 1),
            spread(r["step_time_range"]),
            f"{(r['step_time_ratio'] - 1) * 100:+.0f}%" if r["step_time_ratio"] else "-",
            human(r["train_mem_bytes"], "B"),
            human(r["saved_bytes"], "B"),
            num(r["train_seconds"], 1),
        ]
        for r in cell["rows"]
    ]
    return head, rows


def stability_rows(cell: dict) -> tuple[list[str], list[list[str]]]:
    head = [
        "ffn",
        "gradient spikes",
        "loss spikes",
        "diverged runs",
        "max gradient norm",
        "dead units",
        "sparsity",
        "FFN grad mean",
        "FFN grad std",
    ]
    rows = [
        [
            r["ffn"],
            str(r["grad_spikes"]),
            str(r["loss_spikes"]),
            f"{r['diverged']} of {r['runs']}",
            num(r["max_grad_norm"], 3),
            num(r["dead_frac"], 3),
            num(r["sparsity"], 3),
            _fmt_num(r["ffn_grad_mean"]),
            _fmt_num(r["ffn_grad_std"]),
        ]
        for r in cell["rows"]
    ]
    return head, rows


def signal_rows(cell: dict) -> tuple[list[str], list[list[str]]]:
    """What else was measured per variant: test metric, robustness to embedding noise, perplexity,
    learned activation parameters."""
    lm = cell["metric"] == "final_val_loss"
    head = [
        "ffn",
        "test loss" if lm else "test acc",
        "with embedding noise",
        "noise effect",
        "perplexity",
        "learned activation parameters",
    ]
    rows = [
        [
            r["ffn"],
            num(r["test_mean"]),
            num(r["noisy_mean"]),
            f"{r['noise_delta']:+.4f}" if r["noise_delta"] is not None else "-",
            num(r["ppl"], 2),
            learned_text(r["learned"]),
        ]
        for r in cell["rows"]
    ]
    return head, rows


def learned_text(learned: dict) -> str:
    """'blocks.0.ffn: beta 1.21; blocks.1.ffn: beta 1.05' (mixture weights as relu 0.31, ...)."""
    parts = []
    for layer, params in learned.items():
        values = []
        for name, v in params.items():
            if isinstance(v, dict):
                values.append(", ".join(f"{k} {x:.2f}" for k, x in v.items()))
            elif isinstance(v, (int, float)):
                values.append(f"{name} {v:.3g}")
            else:
                values.append(f"{name} {[round(x, 3) for x in v]}")
        parts.append(f"{layer}: {'; '.join(values)}")
    return "; ".join(parts) or "-"


def literature_rows(cell: dict) -> tuple[list[str], list[list[str]]] | None:
    """The measured ranking beside Shazeer 2020 Table 1 for the variants both have."""
    lit = cell.get("literature")
    if not lit or lit["n"] < 2:
        return None
    mean, published = lit["measured"], lit["published"]
    sign = -1.0 if cell.get("metric_direction") == "higher" else 1.0
    ours = sorted(lit["variants"], key=lambda v: sign * mean[v])
    theirs = sorted(lit["variants"], key=lambda v: published[v])
    head = ["ffn", "measured mean", "measured rank", "published", "published rank"]
    rows = [[v, num(mean[v]), str(ours.index(v) + 1), f"{published[v]:.3f}", str(theirs.index(v) + 1)] for v in ours]
    return head, rows


def settings_rows(data: dict) -> list[tuple[str, str]]:
    s, env = data["settings"], data["env"]
    m = dict(s["model"])
    axes = s.get("axes") or {}
    for axis, key in (("depth", "n_layers"), ("width", "d_model"), ("context", "context")):  # an axis overrides
        if axis in axes:
            m[key] = "/".join(map(str, axes[axis]))
    budget = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s["budget"].items())
    rows = [("data", f"{s['data']} ({s['task']}, {s['tokenizer']} tokenizer)")]
    if data.get("architecture"):
        rows.append(("architecture", data["architecture"]))
    rows += [
        (
            "model",
            f"{m['n_layers']} layer{'s' if m['n_layers'] != 1 else ''}, {m['n_heads']} heads, "
            f"d_model {m['d_model']}, context {m['context']}, {m['norm']} ({m['placement']}-norm), "
            f"{m['pos']} positions, dropout {m['dropout']}",
        ),
        (
            "FFN matching",
            f"{s['match']} (hidden width chosen so every variant matches the dense 4x FFN's {s['match']})"
            if s["match"] != "none"
            else "none (each variant at its own width)",
        ),
        (
            "budget",
            f"{budget}, batch {s['batch_size']}, {human(s['tokens_per_run'])} tokens per run"
            if s.get("tokens_per_run")
            else budget,
        ),
        ("FFN initialisation", "/".join(map(str, axes["init"])) + " (an axis)" if "init" in axes else s["init"]),
        (
            "optimiser",
            f"AdamW, peak lr {'/'.join(map(str, axes['lr'])) + ' (an axis)' if 'lr' in axes else s['lr']}"
            f", cosine to {s.get('min_lr', '-')}, warm-up {s.get('warmup_steps', '-')} steps, weight decay "
            f"{s.get('weight_decay', '-')}, beta2 {s.get('beta2', '-')}, clip {s.get('grad_clip', '-')}",
        ),
        ("precision", s["precision"]),
        ("seeds", f"{s['seeds']} per variant (paired: seed s of every variant sees the same data order)"),
        ("variants", ", ".join(s["variants"]) + f" (baseline {data['baseline']})"),
    ]
    if s.get("axes"):
        rows.append(("axes", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in s["axes"].items())))
    if env:
        where = env.get("gpu") or env.get("cpu") or "-"
        rows.append(
            (
                "machine",
                f"{env.get('device', '-')} ({where}), torch {env.get('torch', '-')}, Python {env.get('python', '-')}",
            )
        )
    if env.get("ffnlab") or env.get("git_rev"):
        rev = (
            f", git {env['git_rev'][:12]}{' (uncommitted changes)' if env.get('git_dirty') else ''}"
            if env.get("git_rev")
            else ""
        )
        rows.append(
            ("code", f"ffnlab {env.get('ffnlab') or '?'}{rev} (its own checkout, never the working directory's)")
        )
    rows.append(("store", data["store"]))
    return rows


# ---- HTML ---------------------------------------------------------------------------------------


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def html_table(head: list[str], rows: list[list[str]], text_cols=(0,), marks: dict | None = None) -> str:
    """A table whose every cell is escaped text. Columns in `text_cols` are left-aligned (numbers
    right); `marks` maps (row, col) to a CSS class."""
    marks = marks or {}

    def cls(i, j):
        names = (["t"] if j in text_cols else []) + ([marks[(i, j)]] if (i, j) in marks else [])
        return f' class="{" ".join(names)}"' if names else ""

    out = [
        "<table><thead><tr>"
        + "".join(f"<th{cls(-1, j)}>{esc(h)}</th>" for j, h in enumerate(head))
        + "</tr></thead><tbody>"
    ]
    for i, row in enumerate(rows):
        out.append("<tr>" + "".join(f"<td{cls(i, j)}>{esc(c)}</td>" for j, c in enumerate(row)) + "</tr>")
    return "".join(out) + "</tbody></table>"


def html_image(figures: dict[str, bytes], name: str, alt: str) -> str:
    if name not in figures:
        return ""
    data = base64.b64encode(figures[name]).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}"><figcaption>{esc(alt)}</figcaption></figure>'
    )


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1080px;padding:1.2em 1.5em 3em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
.verdict{font-size:1.1em;background:#f2f7fb;border-left:4px solid #0072B2;padding:.6em .9em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #d6d6d6;padding:.3em .6em;text-align:right;white-space:nowrap}
th{background:#f4f4f4}.t{text-align:left;white-space:normal}td.t:first-child{font-weight:600}
.better{color:#0072B2;font-weight:700}.worse{color:#D55E00;font-weight:700}
figure{margin:1em 0}img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.88em;color:#555}.note{color:#555;font-size:.92em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}
nav a{margin-right:.9em}footer{margin-top:3em;color:#777;font-size:.85em}
"""


def html_ranking(cell: dict, baseline: str) -> str:
    head, rows = ranking_rows(cell, baseline)
    lower = cell["metric"] == "final_val_loss"
    marks = {}
    for i, r in enumerate(cell["rows"]):
        if r["significant"]:
            better = (r["delta"] < 0) == lower
            marks[(i, 3)] = "better" if better else "worse"
    return html_table(head, rows, (1,), marks)


def html_protocol(protocol: dict, baseline: str) -> str:
    """The validation protocol's stages (protocol.json beside the store): each stage's ranking."""
    parts = [
        '<h2 id="protocol">Validation protocol</h2>',
        '<p class="note">1. every variant at the same settings; 2. each variant at its own learning rate and '
        "warm-up, chosen on validation and compared on test; 3. each at its tuned setting at other context "
        "lengths. Grid: "
        + esc(", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in protocol["grid"].items()))
        + ".</p>",
    ]
    for stage in protocol["stages"]:
        s = stage["summary"]
        parts.append(f"<h3>Stage {esc(STAGE_TITLES.get(stage['name'], stage['name']))}</h3>")
        for cell in s.get("tuned", []) if stage["name"] == "tune" else s["cells"]:
            where = cell_label(cell)
            rows = (
                tuned_rows(cell, baseline)
                if "tuned_axes" in cell
                else ranking_rows({**cell, "rows": cell["variants"]}, baseline)
            )
            parts.append(
                (f"<p>{esc(where)}</p>" if where else "")
                + html_table(*rows, (1,))
                + f'<p class="note">{esc(cell["verdict"])}</p>'
            )
    return "".join(parts)


def html_numerics(numerics: dict) -> str:
    """A compact view of a numerics.json: error per activation, dtype and pass; claims if any."""
    if "error" in numerics:
        return f'<p class="note">{esc(numerics["error"])}</p>'
    parts = []
    results = numerics.get("results") or []
    if results:
        head = ["activation", "dtype", "pass", "max abs error", "max ULP", "at x", "inf", "nan"]
        rows = [
            [
                r.get("name"),
                r.get("dtype"),
                r.get("pass"),
                _fmt_num(r.get("max_abs_err")),
                _fmt_num(r.get("max_ulp")),
                _fmt_num(r.get("argmax_ulp_x")),
                r.get("n_inf", "-"),
                r.get("n_nan", "-"),
            ]
            for r in results
        ]
        parts.append(html_table(head, rows, (0, 1, 2)))
    claims = numerics.get("claims") or []
    if claims:
        head = ["claim", "source", "claimed", "measured", "verdict"]
        parts.append(
            html_table(
                head,
                [
                    [c.get("claim"), c.get("source"), c.get("claimed"), c.get("measured"), c.get("verdict")]
                    for c in claims
                ],
                (0, 1, 2, 3, 4),
            )
        )
    env = numerics.get("environment") or {}
    if env:
        parts.append(
            f'<p class="note">x in {esc(numerics.get("range"))}, {esc(numerics.get("points"))} points; '
            f"torch {esc(env.get('torch'))}, {esc(env.get('machine'))}</p>"
        )
    return "".join(parts) or '<p class="note">numerics.json holds no results.</p>'


def _fmt_num(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


def render_html(data: dict, figures: dict[str, bytes]) -> str:
    """The self-contained report page."""
    variants, baseline = data["variants"], data["baseline"]
    s = data["settings"]
    title = f"ffnlab report: {', '.join(variants)} on {s['data']}"
    body = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="note">{len(variants)} FFN variants x {s["seeds"]} seeds, baseline {esc(baseline)}; '
        f"generated {esc(data['generated'])}</p>",
    ]
    for cell in data["cells"]:
        where = cell_label(cell)
        body.append(f'<p class="verdict">{esc(where + ": " if where else "")}{esc(cell["verdict"])}</p>')
    sections = [
        "ranking",
        "literature",
        *(["protocol"] if data.get("protocol") else []),
        "settings",
        "curves",
        "cost",
        "stability",
        "signals",
        "activations",
        "attention",
        *(["numerics"] if data["numerics"] else []),
    ]
    names = {"signals": "other measurements"}
    body.append("<nav>" + "".join(f'<a href="#{s}">{names.get(s, s)}</a>' for s in sections) + "</nav>")
    if data["other_studies"]:
        body.append(
            f'<p class="note">The store holds {data["other_studies"]} other stud'
            f"{'y' if data['other_studies'] == 1 else 'ies'} (other settings); this report shows the most "
            "recently finished one.</p>"
        )
    cells = data["cells"]
    sfx = lambda i: f"_{i + 1}" if len(cells) > 1 else ""
    heading = lambda cell: f"<h3>{esc(cell_label(cell))}</h3>" if cell["axes"] else ""

    body.append('<h2 id="ranking">Ranking</h2>')
    for cell in cells:
        body.append(heading(cell) + html_ranking(cell, baseline))
        if cell.get("noise_floor"):
            nf = cell["noise_floor"]
            body.append(
                f'<p class="note">Noise floor: {esc(baseline)} over {esc(nf["n"])} seeds has std '
                f"{esc(num(nf['std']))} and range {esc(num(nf['range']))}.</p>"
            )
    pct = round(cells[0]["level"] * 100)
    body.append(
        f'<p class="note">Mean over seeds with its {pct}% t-interval. Δ is the paired difference to '
        f"{esc(baseline)} over seeds (negative loss Δ = better). * = significant at α={cells[0]['alpha']:g} "
        "after Holm correction of the paired t-tests; coloured blue when better, orange when worse.</p>"
    )

    if data["tuned"]:
        body.append("<h3>Tuned: each variant at its own best setting</h3>")
        for cell in data["tuned"]:
            body.append(html_table(*tuned_rows(cell, baseline), (1,)))
            body.append(f'<p class="verdict">{esc(cell_label(cell))}: {esc(cell["verdict"])}</p>')
        body.append(
            '<p class="note">The setting of each variant is the one with the best mean validation '
            "metric over seeds; the comparison uses the test split, so the selection cannot flatter the "
            "winner (Melis et al. 2018).</p>"
        )
    if data.get("protocol"):
        body.append(html_protocol(data["protocol"], baseline))

    body.append('<h2 id="literature">Against the literature</h2>')
    for cell in cells:
        table = literature_rows(cell)
        if table is None:
            body.append(
                heading(cell) + '<p class="note">No published ranking to compare with: it needs a language '
                "model study with at least two of Shazeer (2020) Table 1's variants.</p>"
            )
            continue
        body.append(heading(cell) + html_table(*table) + f"<p>{esc(literature_text(cell['literature']))}</p>")

    body.append('<h2 id="settings">Run settings</h2>')
    body.append(html_table(["setting", "value"], [list(r) for r in settings_rows(data)], (0, 1)))
    body.append("<h3>What the comparison held equal</h3>")
    body.append(html_table(["held equal", "how"], s["held_equal"], (0, 1)))
    body.append("<h3>What it did not</h3>")
    body.append(html_table(["not equal", "why"], s["not_equal"], (0, 1)))

    body.append('<h2 id="curves">Learning curves and final loss</h2>')
    for i, cell in enumerate(cells):
        body.append(heading(cell))
        body.append(
            html_image(
                figures,
                f"val_loss{sfx(i)}.png",
                f"Validation loss during training: mean over seeds with a {pct}% confidence band.",
            )
        )
        body.append(
            html_image(
                figures,
                f"final{sfx(i)}.png",
                f"Final {metric_label(cell['metric'])} per variant: "
                f"mean with {pct}% CI error bars; dots are single seeds.",
            )
        )

    body.append('<h2 id="cost">Cost</h2>')
    for i, cell in enumerate(cells):
        body.append(heading(cell) + html_table(*cost_rows(cell)))
        body.append(
            html_image(
                figures,
                f"loss_vs_time{sfx(i)}.png",
                "Validation loss against wall-clock training time (mean over seeds, with band).",
            )
        )
    env = data["env"]
    body.append(
        f'<p class="note">tokens/s: mean over seeds of the median step; step time: median over seeds, '
        "with the range of the seeds' own medians: a wide range means the machine was busy while they "
        "ran, and only a quiet machine's timings (or <code>ffnlab bench</code>) compare speed. "
        f"Measured on {esc(env.get('device', '?'))}. Training memory is counted from the tensors: "
        "parameters, gradients, optimizer state and what one training forward pass keeps for backward "
        "(counted with saved_tensors_hooks), so it does not depend on what else ran in the process.</p>"
    )

    body.append('<h2 id="stability">Stability</h2>')
    for i, cell in enumerate(cells):
        body.append(heading(cell) + html_table(*stability_rows(cell)))
        body.append(
            html_image(
                figures,
                f"grad_norm{sfx(i)}.png",
                "Global gradient norm per step before clipping; "
                "triangles mark gradient spikes, dotted lines divergence.",
            )
        )
        body.append(
            html_image(
                figures,
                f"behaviour{sfx(i)}.png",
                "Per layer, on the validation set after training: "
                "fraction of FFN units that never activate (dead) and fraction of exact zeros "
                "after the activation (sparsity), mean over seeds.",
            )
        )

    body.append('<h2 id="signals">Other measurements</h2>')
    for cell in cells:
        body.append(heading(cell) + html_table(*signal_rows(cell), (0, 5)))
    body.append(
        '<p class="note">Test: the held-out test split (never used to choose anything here). Embedding '
        "noise: the validation metric with Gaussian noise on the token embeddings, a robustness probe; its "
        "effect is the mean change from the clean metric. Learned parameters: means over seeds at the end "
        "of training.</p>"
    )

    body.append('<h2 id="activations">The activation functions</h2>')
    body.append(
        html_table(
            ["activation", "formula", "source"],
            [[a, ACTIVATIONS[a].formula, ACTIVATIONS[a].paper] for a in data["activations"]],
            (0, 1, 2),
        )
    )
    body.append(
        html_image(
            figures, "activations.png", "Each compared activation (for gated variants, the gate's) and its derivative."
        )
    )

    body.append('<h2 id="attention">Attention patterns</h2>')
    for i, cell in enumerate(cells):
        att = cell.get("attention") or {}
        body.append(heading(cell))
        if att.get("maps"):
            seeds = ", ".join(f"{v} seed {s}" for v, s in att["seeds"].items())
            body.append(
                html_image(
                    figures,
                    f"attention{sfx(i)}.png",
                    f"Attention weights at layer {att['layer']} "
                    f"of each variant's trained model ({seeds}) on the first {att['tokens']} "
                    "validation tokens; rows are queries, columns keys.",
                )
            )
            body.append(f'<p class="note">Input:</p><pre>{esc(att["text"][:600])}</pre>')
        else:
            body.append(f'<p class="note">{esc(att.get("note", "not computed"))}</p>')

    if data["numerics"]:
        body.append('<h2 id="numerics">Numerics of the activations</h2>' + html_numerics(data["numerics"]))

    body.append(
        f"<footer>ffnlab report from {esc(data['store'])}. Reproduce: <code>ffnlab report --store "
        f"{esc(data['store'])}</code></footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request, so no 404 in the console
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n"
    )


# ---- Markdown -----------------------------------------------------------------------------------


def md_escape(text) -> str:
    """Text safe inside a Markdown table cell: HTML escaped, pipes and backslashes escaped, line
    breaks (a path may hold one) as spaces, so one cell never breaks its table row."""
    text = " ".join(str(text).splitlines())
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|")


def md_table(head, rows) -> str:
    lines = ["| " + " | ".join(md_escape(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(data: dict, figure_names) -> str:
    """A short summary for a README or a pull request: verdict, ranking, costs, settings, figures."""
    s = data["settings"]
    out = [f"## FFN comparison: {md_escape(', '.join(data['variants']))} on {md_escape(s['data'])}", ""]
    for i, cell in enumerate(data["cells"]):
        sfx = f"_{i + 1}" if len(data["cells"]) > 1 else ""
        if cell["axes"]:
            out += [f"### {md_escape(cell_label(cell))}", ""]
        out += [
            f"**Verdict:** {md_escape(cell['verdict'])}",
            "",
            md_table(*ranking_rows(cell, data["baseline"])),
            "",
            md_table(*cost_rows(cell)),
            "",
        ]
        if cell.get("literature") and cell["literature"]["tau"] is not None:
            out += [md_escape(literature_text(cell["literature"])), ""]
        for name, alt in ((f"val_loss{sfx}.png", "validation loss"), (f"final{sfx}.png", "final loss")):
            if name in figure_names:
                out.append(f"![{alt}]({FIGURES_DIR}/{name})")
        out.append("")
    for cell in data["tuned"]:
        out += [
            f"### Tuned ({md_escape(cell_label(cell))}): lr chosen on validation, compared on test",
            "",
            f"**Verdict:** {md_escape(cell['verdict'])}",
            "",
            md_table(*tuned_rows(cell, data["baseline"])),
            "",
        ]
    out.append(f"* = significant at α={data['cells'][0]['alpha']:g} after Holm correction (paired t-test over seeds).")
    out += [
        "",
        "Held equal: " + md_escape("; ".join(f"{w} ({h})" for w, h in s["held_equal"])) + ".",
        "Not equal: " + md_escape("; ".join(f"{w} ({h})" for w, h in s["not_equal"])) + ".",
        "",
        "<details><summary>Run settings</summary>",
        "",
        md_table(["setting", "value"], settings_rows(data)),
        "",
        "</details>",
        "",
        f"Full report with costs, stability, activations and attention maps: [{REPORT_HTML}]({REPORT_HTML}).",
        "",
    ]
    return "\n".join(out)


# ---- writing ------------------------------------------------------------------------------------


def default_out_dir(store_path) -> Path:
    """The report folder beside the store: ffnlab-runs/ffnlab.db -> ffnlab-runs/report."""
    return Path(store_path).parent / "report"


def check_out_dir(out_dir: Path) -> Path:
    """ValueError in one line unless `out_dir` can be created or written, without creating anything:
    the nearest existing folder on its path must be a writable folder."""
    existing = Path(out_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write the report to {out_dir}: {existing} is not a writable folder")
    return Path(out_dir)


def prepare_out_dir(out_dir: Path) -> Path:
    """Create the output folder and prove it writable, before any work; ValueError in one line if not."""
    try:
        (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"cannot write the report to {out_dir}: {e.strerror or e}") from None
    return out_dir


def write_report(
    store_path,
    out_dir=None,
    study: Study | None = None,
    runs=None,
    baseline: str | None = None,
    layer: int | None = None,
    numerics: bool = False,
) -> dict[str, Path]:
    """Render the report of a store and write report.html, summary.md and figures/*.png into
    `out_dir` (default: `report/` beside the store). Returns the written paths by kind.

    Everything is rendered in memory first, the folder is created only then, and each file is
    written through a temporary name, so a failure leaves neither a half-written file nor an empty
    folder."""
    store_path = Path(store_path)
    if not store_path.is_file():
        raise ValueError(f"no run store at {store_path}; run `ffnlab compare` first or pass --store")
    out_dir = check_out_dir(Path(out_dir) if out_dir else default_out_dir(store_path))
    data = report_data(store_path, study, runs, baseline, layer, numerics)
    figures = render_figures(data)
    page = render_html(data, figures)
    summary = render_markdown(data, figures)
    prepare_out_dir(out_dir)
    for name, png in figures.items():
        write_atomic(out_dir / FIGURES_DIR / name, png)
    write_atomic(out_dir / SUMMARY_MD, summary)
    write_atomic(out_dir / REPORT_HTML, page)
    return {
        "html": out_dir / REPORT_HTML,
        "markdown": out_dir / SUMMARY_MD,
        "figures": [out_dir / FIGURES_DIR / n for n in figures],
    }
