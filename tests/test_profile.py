import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.run.presets import preset_config
from ffnlab.run.profile import (
    KINDS,
    OTHER,
    Share,
    StepProfile,
    format_profile,
    labelled,
    part_of,
    profile_training,
    step_shares,
)


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
    kinds = {k.name: k.ms for k in got["kinds"]}  # own time by kind of work: what a speed ratio is made of
    assert kinds["matmul (mm, addmm, bmm)"] == 12 and kinds["activations"] == 1 and kinds[OTHER] == 0
    assert list(kinds) == [name for name, _ in KINDS] + [OTHER]
    events.append(event("aten::empty", 0, own_ms=3))  # not of a named kind: dispatch and the like
    assert {k.name: k.ms for k in step_shares(events, steps=2, top=1)["kinds"]}[OTHER] == 1.5


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


def test_the_profiled_step_is_the_trained_one_fp16_scaler_included():
    """The profile stepped with a plain backward and optimizer: under fp16 it left out the gradient scaler."""
    cfg = replace(preset_config("smoke"), precision="fp16")
    names = {o.name for o in profile_training(cfg, steps=1, warmup=1, top=1000).operators}
    assert "aten::_amp_foreach_non_finite_check_and_unscale_" in names and "aten::_amp_update_scale_" in names


def test_train_profile_prints_where_a_step_goes_before_training(run_cli):
    from tests.conftest import TINY_MODEL

    code, out, err = run_cli("train", *TINY_MODEL, "--steps", 2, "--quiet", "--profile")
    assert code == 0, err
    assert out.index("ms a step") < out.index("after 2 steps")  # the profile, then the run
    code, out, err = run_cli("train", *TINY_MODEL, "--steps", 2, "--json", "--profile")
    assert code == 0, err
    profile = StepProfile.from_json(json.loads(out)["profile"])
    assert profile.ffn == "gelu" and [p.name for p in profile.parts][-2:] == [
        "backward",
        "optimizer (clip, AdamW, zero)",
    ]


def test_compare_profile_shows_each_variant_in_the_terminal_the_json_and_the_report(run_cli, tmp_path):
    argv = ("compare", "--preset", "smoke", "--variants", "relu,swiglu", "--seeds", 2, "--steps", 2, "--profile")
    code, out, err = run_cli(*argv, "--store", tmp_path / "s.db")
    assert code == 0, err
    assert out.count("ms a step") == 2 and "profile of relu" in out and "profile of swiglu" in out
    saved = json.loads((tmp_path / "profiles.json").read_text())
    assert set(saved) == {"relu", "swiglu"} and all(p["threads"] == 1 for p in saved.values())  # as a sweep runs
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Where a training step's time goes" in page and "FFN activation (and gate product)" in page
    code, out, err = run_cli(*argv, "--store", tmp_path / "s.db", "--json", "--no-report")
    assert code == 0 and set(json.loads(out)["profiles"]) == {"relu", "swiglu"}, err


def test_the_report_table_has_a_column_per_variant():
    from ffnlab.study.render import profile_table

    def profile(ffn, ms):
        parts = [Share("attention", ms, 0.5), Share("backward", ms, 0.5)]
        return StepProfile(ffn, "fp32", 1, 3, 2 * ms, parts, [Share("aten::mm", ms, 0.5, 4)])

    table = profile_table({"relu": profile("relu", 1.0), "gelu": profile("gelu", 2.0)})
    assert table.head == ["part of a step", "relu", "gelu"]
    assert table.rows[0] == ["attention", "1.00 (50%)", "2.00 (50%)"] and table.rows[2] == ["step (ms)", "2.00", "4.00"]
    assert table.rows[3] == ["top operators", "aten::mm 50%", "aten::mm 50%"]
    assert StepProfile.from_json(profile("relu", 1.0).to_json()) == profile("relu", 1.0)
    older = profile("relu", 1.0).to_json()
    del older["kinds"]  # profiles.json written before the kinds of work
    assert StepProfile.from_json(older) == profile("relu", 1.0)
