"""A run's configuration from its sources (ffnlab.run.config_file): a preset, a --config TOML file and flags.
The CLI's side of it (flags, one-line errors naming the file) is tested in tests/test_flags.py."""

import tempfile
from pathlib import Path

from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.run.config_file import RUN_TABLES, config_from_sources, file_fields, read_toml, to_toml
from ffnlab.run.presets import preset_config


def read_toml_text(text: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.toml"
        path.write_text(text)
        return read_toml(path, RUN_TABLES)


def test_toml_writer_and_reader_agree():
    cfg = TrainConfig(model=ModelConfig(n_layers=3, d_ff=100), lr=3e-4, max_tokens=1000, compile=True)
    data = read_toml_text(to_toml(file_fields(cfg)))
    assert TrainConfig(**data) == cfg  # None fields are left out and come back as their default
    assert read_toml_text("lr = 1")["lr"] == 1.0 and isinstance(read_toml_text("lr = 1")["lr"], float)


def test_a_flag_overrides_the_file_which_overrides_the_base():
    base = preset_config("smoke")
    file = read_toml_text("lr = 1e-3\nbatch_size = 4\n[model]\nn_layers = 3\nd_model = 64")
    cfg = config_from_sources(base, file, {"lr": 2e-3, "model": {"d_model": 96}})
    assert (cfg.lr, cfg.batch_size, cfg.model.n_layers, cfg.model.d_model) == (2e-3, 4, 3, 96)
    assert cfg.max_steps == base.max_steps and cfg.model.context == base.model.context  # the rest: the base's
    assert config_from_sources(base, {"study": {"seeds": 3}}, {}) == base  # a table that is not the run's
    assert config_from_sources(base, {"hf_config": {}}, {}).hf_config is None  # an empty table: no HF config


def test_a_time_budget_alone_lifts_the_step_limit():
    base = preset_config("smoke")
    assert config_from_sources(base, {}, {"max_seconds": 5.0}).max_steps == 10**9  # time is the only limit
    assert config_from_sources(base, {"max_steps": 7}, {"max_seconds": 5.0}).max_steps == 7
    assert config_from_sources(base, {}, {"max_seconds": 5.0, "max_tokens": 1000}).max_steps == base.max_steps
