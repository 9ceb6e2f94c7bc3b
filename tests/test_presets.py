"""Named setups (ffnlab.run.presets): each builds its config, names variants the registry has, and reaches the
run `train --preset` trains and the study `compare --preset` plans, the literature's shapes at smoke size."""

import json
import random

import pytest

from ffnlab.core.ffn import get_ffn_spec, matched_hidden_dim
from ffnlab.run.config import TrainConfig
from ffnlab.run.presets import PRESETS, preset_config
from ffnlab.study.plan import DEFAULT_VARIANTS, Study
from ffnlab.study.published import SHAZEER_NAMES

# the literature's shapes shrunk to seconds of training: the flags, and the fields they set
SMOKE_FLAGS = ["--layers", 1, "--heads", 2, "--d-model", 32, "--context", 32, "--batch-size", 2, "--steps", 2,
               "--eval-batches", 1, "--final-eval-batches", 1, "--bpe-vocab", 300]  # fmt: skip
SMOKE_MODEL = {"n_layers": 1, "n_heads": 2, "d_model": 32, "context": 32}
WORDS = ["the", "a", "of", "news", "model", "layer", "token", "step", "loss", "gate", "width", "paper", "shape"]
SMOKE_FIELDS = {"batch_size": 2, "max_steps": 2, "eval_batches": 1, "final_eval_batches": 1, "bpe_vocab": 300}


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_and_names_variants_the_registry_has(name):
    assert isinstance(preset_config(name), TrainConfig)
    for variant in PRESETS[name].variants or ():
        assert get_ffn_spec(variant).name == variant  # ffnlab's own spelling, as the study stores it


def test_gpt2_small_is_gpt2_smalls_shape_with_the_experiments_four_variants():
    cfg = preset_config("gpt2-small")
    shape = (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.model.context)
    assert shape == (12, 768, 12, 1024) and cfg.max_steps == 50_000
    assert (cfg.tokenizer, cfg.bpe_vocab) == ("bpe", 50_257)
    assert PRESETS["gpt2-small"].variants == ("relu", "gelu", "silu", "geglu")


def test_shazeer_keeps_t5_bases_layer_shape_and_widths_and_runs_the_papers_eight():
    cfg = preset_config("shazeer")
    model = cfg.model
    assert (model.n_layers, model.d_model, model.n_heads, model.context) == (24, 768, 12, 512)  # 12 + 12 layers
    assert (cfg.max_steps, cfg.batch_size) == (65_536, 128) and cfg.bpe_vocab == 32_000
    assert (model.norm, model.ffn_bias, model.dropout) == ("rmsnorm", False, 0.0)
    # the paper's d_ff: 3072 dense, 2048 gated (parameters matched), as ffnlab's params match sizes them
    widths = {v: matched_hidden_dim(get_ffn_spec(v), model.d_model, model.ffn_match) for v in ("relu", "swiglu")}
    assert widths == {"relu": 3072, "swiglu": 2048}
    # all eight of Table 1, so the report's rank agreement with it (ffnlab.study.published) covers each
    assert sorted(PRESETS["shazeer"].variants or ()) == sorted(SHAZEER_NAMES)


@pytest.mark.parametrize("name", PRESETS)
def test_compare_runs_a_presets_own_variants_unless_told_others(name, tmp_path):
    expected = list(PRESETS[name].variants or DEFAULT_VARIANTS)
    assert Study.from_sources(name, None, {}).variants == expected
    assert Study.from_sources(name, None, {"study": {"variants": ["relu", "swiglu"]}}).variants == ["relu", "swiglu"]
    path = tmp_path / "study.toml"
    path.write_text(f'[study]\npreset = "{name}"\n')
    assert Study.from_sources(None, path, {}).variants == expected  # the preset a config file names


def test_compare_print_config_lists_the_presets_variants(run_cli):
    code, out, _ = run_cli("compare", "--preset", "gpt2-small", "--print-config")
    assert code == 0 and 'variants = ["relu", "gelu", "silu", "geglu"]' in out


@pytest.mark.parametrize("name", ["gpt2-small", "shazeer"])
def test_train_preset_trains_the_literatures_setup_at_smoke_size(name, run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FFNLAB_CACHE", str(tmp_path))  # the BPE it trains stays in the test's folder
    rng = random.Random(0)
    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(" ".join(rng.choices(WORDS, k=12)) for _ in range(2000)))
    out = tmp_path / "result.json"
    code, _, err = run_cli("train", "--preset", name, *SMOKE_FLAGS, "--data", data, "--quiet", "--out", out)
    assert code == 0, err
    result = json.loads(out.read_text())
    expected = preset_config(name, model=SMOKE_MODEL, data=str(data), **SMOKE_FIELDS).to_dict()
    assert result["config"] == {**expected, "precision": result["config"]["precision"]}  # but what 'auto' chose
    assert result["vocab_size"] == 300 and result["steps"] == 2


def test_an_unknown_preset_is_one_line_naming_the_valid_ones(run_cli):
    code, _, err = run_cli("train", "--preset", "gpt2", "--print-config")
    assert code == 2 and "did you mean 'gpt2-small'" in err and "shazeer" in err and len(err.strip().splitlines()) == 1


def test_train_without_a_preset_keeps_the_configs_own_defaults(run_cli):
    code, out, _ = run_cli("train", "--print-config")
    assert code == 0 and f"max_steps = {TrainConfig().max_steps}" in out
    code, out, _ = run_cli("train", "--preset", "smoke", "--print-config")
    assert code == 0 and f"max_steps = {preset_config('smoke').max_steps}" in out
