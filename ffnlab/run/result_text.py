"""A finished run (`RunResult`) as text: the few lines `ffnlab train` prints."""

from __future__ import annotations

import json

from ffnlab.run.result import RunResult


def decimals(value: float | None, digits: int = 4) -> str:
    """`value` to `digits` decimals; '-' for None, a quantity not measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def span_f1_text(f1: float | None, acc: float | None) -> str:
    """A span F1 as `decimals`; 'undefined' where the split was evaluated (it has a token accuracy) but its
    sentences hold no entity span (span_f1: 0/0)."""
    return "undefined" if f1 is None and acc is not None else decimals(f1)


def format_run(r: RunResult) -> str:
    """A finished run in a few lines: loss, what it cost, and what the monitors saw."""
    f = decimals
    first = r.history.val[0] if r.history.val else None
    lines = [
        f"{r.ffn}: {r.status} after {r.steps} steps, val loss {f(r.val.loss)}"
        + (f" (step {first.step}: {f(first.loss)})" if first else "")
        + f", {r.costs.params:,} params, {r.costs.tokens_per_s or 0:,.0f} tokens/s in {r.precision}, "
        + f"{r.costs.train_seconds:.1f} s"
    ]
    if r.config.get("nproc", 1) * r.config.get("grad_accum", 1) > 1:
        c = r.config
        lines.append(
            f"  global batch {c['batch_size'] * c['nproc'] * c['grad_accum']}: {c['batch_size']} per forward pass x "
            f"{c['nproc']} process{'es' if c['nproc'] > 1 else ''} x {c['grad_accum']} passes accumulated"
        )
    if r.task == "lm":
        unit = " per word" if r.config.get("tokenizer") == "word" else ""  # a loss per token is per word then
        lines.append(
            f"  perplexity{unit} {f(r.val.ppl, 2)}, test loss {f(r.test.loss)}, "
            f"with embedding noise {f(r.noisy_val.loss)}"
        )
    elif r.task == "tokens":
        val, test, noisy = (
            span_f1_text(r.val.f1, r.val.acc),
            span_f1_text(r.test.f1, r.test.acc),
            span_f1_text(r.noisy_val.f1, r.noisy_val.acc),
        )
        lines.append(
            f"  span F1 {val}, test {test}, with embedding noise {noisy}; "
            f"token accuracy {f(r.val.acc)}, test {f(r.test.acc)}"
        )
        if "undefined" in (val, test, noisy):
            lines.append("  span F1 is undefined where the sentences evaluated hold no entity span: 0/0, not 0")
    elif r.task == "reg":  # its loss is the mean squared error; a correlation with a constant prediction is 0/0
        lines.append(
            f"  Pearson {f(r.val.pearson)}, test {f(r.test.pearson)}, with embedding noise "
            f"{f(r.noisy_val.pearson)}; Spearman {f(r.val.spearman)}, test {f(r.test.spearman)}; "
            f"MSE {f(r.val.loss)}, test {f(r.test.loss)}"
        )
    else:
        lines.append(
            f"  accuracy {f(r.val.acc)}, test {f(r.test.acc)}, with embedding noise {f(r.noisy_val.acc)}; "
            f"macro-F1 {f(r.val.macro_f1)}, test {f(r.test.macro_f1)}"
            + (f"; Matthews {f(r.val.mcc)}, test {f(r.test.mcc)}" if r.val.mcc is not None else "")
            + (f"; F1 {f(r.val.binary_f1)}, test {f(r.test.binary_f1)}" if r.val.binary_f1 is not None else "")
        )  # Matthews and F1 of class 1 (two classes) where measured: GLUE's metrics for CoLA, MRPC and QQP
    lines.append(
        f"  memory {r.memory.train_mem_bytes / 2**20:.1f} MiB (params {r.memory.param_bytes / 2**20:.1f}, grads "
        f"{r.memory.grad_bytes / 2**20:.1f}, optimizer {r.memory.optimizer_bytes / 2**20:.1f}, saved for backward "
        f"{r.memory.saved_bytes / 2**20:.1f}{checkpointing_text(r)})"
        + (f", CUDA peak {r.memory.cuda_peak_bytes / 2**20:.1f} MiB" if r.memory.cuda_peak_bytes is not None else "")
    )
    skips = [e for e in r.events if e.kind == "fp16_skip"]
    if skips:
        lines.append(
            f"  fp16: the gradient scaler skipped {len(skips)} update(s) whose gradients overflowed, each trained "
            "again on the next batch (not divergence)"
        )
    from ffnlab.tools.lora import trained_text

    # a fine-tune: what trained, what not
    if trained := trained_text(r.config, r.costs.trainable_params, r.costs.params):
        lines.append(f"  trained: {trained}")
    grads = f"FFN gradient mean {f(r.monitors.ffn_grad_mean, 6)} std {f(r.monitors.ffn_grad_std, 6)}"
    if r.config.get("peft"):  # LoRA: the FFN is frozen, its gradient monitors saw none
        grads = "FFN frozen (no gradients)"
    lines.append(
        f"  {grads}, spikes {r.monitors.n_grad_spikes} gradient / {r.monitors.n_loss_spikes} loss, "
        f"dead units {f(r.monitors.dead_frac, 3)}"
    )
    for layer, values in r.monitors.learned.items():
        lines.append(f"  learned {layer}: {json.dumps(values)}")
    return "\n".join(lines)


def checkpointing_text(r: RunResult) -> str:
    """', with block checkpointing' where the run recomputed activations in backward, else ''."""
    kind = r.config.get("model", {}).get("activation_checkpointing", "none")
    return "" if kind == "none" else f", with {kind} checkpointing"
