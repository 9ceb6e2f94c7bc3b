from dataclasses import replace
from types import SimpleNamespace

import pytest

from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.run.presets import preset_config
from ffnlab.run.profile import format_profile, labelled, part_of, profile_training, step_shares


def event(key, total_ms, own_ms=0.0, count=1):
    """A profiler average as key_averages gives it: times in microseconds, over all profiled steps."""
    return SimpleNamespace(key=key, cpu_time_total=total_ms * 1e3, self_cpu_time_total=own_ms * 1e3, count=count)


def test_the_parts_of_a_step_add_up_and_the_activation_is_what_the_ffn_leaves():
    events = [
        event("forward", 20), event("backward", 30), event("optimizer", 10), event("attention", 6),
        event("ffn", 8), event("ffn in", 4), event("ffn out", 2), event("norms", 1),
        event("aten::mm", 0, own_ms=24, count=12), event("aten::gelu", 0, own_ms=2, count=2),
    ]  # fmt: skip
    got = step_shares(events, steps=2, top=1)
    assert got["step_ms"] == 30  # (20 + 30 + 10) ms over 2 steps
    parts = {p.name: p.ms for p in got["parts"]}
    assert parts["FFN activation (and gate product)"] == 1  # (8 - 4 - 2) / 2
    assert parts["rest of forward (embeddings, head, loss)"] == pytest.approx(2.5)  # (20 - 6 - 8 - 1) / 2
    assert sum(parts.values()) == pytest.approx(30)
    (op,) = got["operators"]  # the labels are not operators; the top one by its own time
    assert (op.name, op.ms, op.share, op.calls) == ("aten::mm", 12, 0.4, 6)


def test_modules_are_labelled_by_part_and_a_mix_once():
    model = Transformer(ModelConfig(vocab_size=16, n_layers=2, d_model=16, n_heads=2, context=8, ffn="mix:gelu+silu"))
    ffns = {n for n, m in model.named_modules() if part_of(n, m, False) == "ffn"}
    labels = {}
    for name, module in model.named_modules():
        labels[name] = part_of(name, module, any(name.startswith(f"{f}.") for f in ffns))
    assert [n for n, label in labels.items() if label == "ffn"] == ["blocks.0.ffn", "blocks.1.ffn"]
    assert {label for n, label in labels.items() if n.startswith("blocks.0.ffn.")} == {"ffn in", "ffn out", None}
    assert labels["blocks.0.attn"] == "attention" and labels["blocks.0.norm1"] == "norms"
    with labelled(model):
        assert any(m._forward_pre_hooks for m in model.modules())
    assert not any(m._forward_pre_hooks for m in model.modules())  # removed after the block


def test_profile_training_splits_a_real_step():
    cfg = preset_config("smoke")
    profile = profile_training(replace(cfg, model=replace(cfg.model, ffn="swiglu")), steps=2, warmup=1, top=5)
    parts = {p.name: p for p in profile.parts}
    assert profile.step_ms > 0 and sum(p.ms for p in profile.parts) >= profile.step_ms * (1 - 1e-9)
    assert all(p.ms >= 0 for p in profile.parts) and parts["FFN input matrices"].ms > 0 and parts["backward"].ms > 0
    assert 0 < len(profile.operators) <= 5 and [o.ms for o in profile.operators] == sorted(
        (o.ms for o in profile.operators), reverse=True
    )
    assert "ms a step" in format_profile(profile) and profile.to_json()["ffn"] == "swiglu"
