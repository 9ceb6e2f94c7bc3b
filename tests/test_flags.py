"""Flags derived from the config dataclasses (ffnlab.flags), the config files they share their fields with
(ffnlab.run.config_file), and the one merge of preset, file and flags (`Study.from_sources`)."""

import argparse
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

import pytest

from ffnlab.cli import build_parser
from ffnlab.core.model import ModelConfig
from ffnlab.flags import NOT_FLAGS, add_config_flags, field_comments, int_list, study_flags
from ffnlab.run.config import TrainConfig
from ffnlab.run.presets import preset_config
from ffnlab.study.plan import Study


def study_of(*argv) -> Study:
    """The study `compare` would run for these flags, built as the command does."""
    args = build_parser().parse_args(["compare", *map(str, argv)])
    return Study.from_sources(args.preset, args.config, study_flags(args))


def subparser(command: str):
    return next(a for a in build_parser()._actions if a.dest == "command").choices[command]


@pytest.mark.parametrize("cls", [TrainConfig, ModelConfig])
def test_every_config_field_is_a_train_flag_with_its_choices(cls):
    actions = {a.dest: a for a in subparser("train")._actions}
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in NOT_FLAGS:
            continue
        action = actions[f.name]
        assert "--" + f.name.replace("_", "-") in action.option_strings
        if typing.get_origin(hints[f.name]) is typing.Literal:
            assert tuple(action.choices) == typing.get_args(hints[f.name])


@dataclass
class Toy:
    widths: list[int] = field(default_factory=lambda: [64, 128])  # widths to try
    mode: Literal["fast", "exact"] = "fast"
    table: dict[str, int] = field(default_factory=dict)  # a table: no flag sets it


def test_a_dataclass_field_becomes_a_flag_typed_by_its_hint():
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Toy, default_note="default")
    actions = {a.dest: a for a in parser._actions}
    assert actions["widths"].type is int_list and actions["widths"].help == "widths to try (default: 64,128)"
    assert actions["mode"].choices == ("fast", "exact") and "table" not in actions
    assert vars(parser.parse_args(["--widths", "32,48"])) == {"widths": [32, 48], "mode": None}  # None: not given


def test_every_plain_study_field_is_a_compare_flag():
    actions = {a.dest: a for a in subparser("compare")._actions}
    for f in fields(Study):
        if f.name in ("base", "axes", "per_variant", "scale"):
            continue  # the run's flags, the --NAME-axis flags, --opt and --scale AXIS=VALUES set these
        assert "--" + f.name.replace("_", "-") in actions[f.name].option_strings
    assert actions["variants"].type.__name__ == "csv_list" and actions["per_variant"].option_strings == ["--opt"]


def test_a_study_takes_the_preset_then_the_file_then_the_flags(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        'lr = 1e-3\n[model]\nn_layers = 3\n[study]\npreset = "smoke"\nseeds = 3\nvariants = ["relu", "gelu"]\n'
        "[study.axes]\ncontext = [16, 32]\nwarmup = [1, 2]"
    )
    flags = {"lr": 2e-3, "study": {"seeds": 5, "axes": {"context": [8, 16]}, "per_variant": [("GELU", {"lr": 1e-4})]}}
    study = Study.from_sources(None, path, flags)
    assert study.base.max_steps == preset_config("smoke").max_steps  # the preset the file names
    assert study.base.model.n_layers == 3 and study.base.lr == 2e-3  # the file's, and a flag over it
    assert study.seeds == 5 and study.variants == ["relu", "gelu"]
    assert study.axes == {"context": [8, 16], "warmup": [1, 2]} and study.per_variant == {"gelu": {"lr": 1e-4}}
    assert Study.from_sources("quick", path, {}).base.max_steps == preset_config("quick").max_steps
    assert Study.from_sources(None, None, {}).base == preset_config("standard")  # no file, no flags


def test_help_comes_from_the_comment_beside_the_field():
    docs = field_comments(TrainConfig)
    assert docs["min_lr"] == "end of the cosine decay; None: lr / 10"
    assert "the schedule follows the larger of step and time progress" in docs["max_seconds"]  # a continuation
    helps = {a.dest: a.help for a in subparser("train")._actions}
    assert helps["min_lr"].startswith("end of the cosine decay; None: lr / 10")


def test_old_short_names_set_the_same_fields(run_cli):
    new = run_cli("train", "--n-layers", 3, "--n-heads", 2, "--max-steps", 7, "--warmup-steps", 2, "--print-config")
    old = run_cli("train", "--layers", 3, "--heads", 2, "--steps", 7, "--warmup", 2, "--print-config")
    assert new[0] == old[0] == 0 and new[1] == old[1]
    assert "n_layers = 3" in new[1] and "max_steps = 7" in new[1]
    new = run_cli("compare", "--preset", "smoke", "--depth-axis", "1,2", "--print-config")
    old = run_cli("compare", "--preset", "smoke", "--depth", "1,2", "--print-config")
    assert new[1] == old[1] and "depth = [1, 2]" in new[1]


def test_a_config_file_then_flags_and_print_config_round_trips(run_cli, tmp_path):
    first = tmp_path / "a.toml"
    code, out, _ = run_cli("compare", "--preset", "quick", "--variants", "relu,swiglu", "--lr", "1e-3",
                           "--context-axis", "32,64", "--print-config")  # fmt: skip
    assert code == 0
    first.write_text(out)
    code, again, _ = run_cli("compare", "--config", first, "--print-config")
    assert code == 0 and again == out  # what it prints is what it reads
    code, changed, _ = run_cli("compare", "--config", first, "--lr", "3e-3", "--n-layers", 3, "--print-config")
    assert "lr = 0.003" in changed and "n_layers = 3" in changed and 'variants = ["relu", "swiglu"]' in changed
    assert "context = [32, 64]" in changed and "max_steps = 150" in changed  # the file's preset and axes stay


@pytest.mark.parametrize(
    "text, needle",
    [
        ("bogus = 1", "unknown key 'bogus'"),
        ("[model]\nn_layer = 3", "unknown key [model] 'n_layer' (did you mean 'n_layers'?)"),
        ("model = 3", "'model' must be a table"),
        ("lr = ", "not valid TOML"),
        ("lr = -1.0", "lr and grad_clip must be positive"),
        ("seed = 1.5", "'seed' must be a whole number, got 1.5"),  # these were internal errors in the run
        ('batch_size = "4"', "'batch_size' must be a whole number, got '4'"),
        ('compile = "yes"', "'compile' must be true or false, got 'yes'"),  # was taken as true
        ("[model]\nd_model = true", "[model] 'd_model' must be a whole number, got True"),
        ('tokenizer = "BPE"', "unknown tokenizer 'BPE'; valid: char, byte, bpe, word, pretrained"),
        ("[model]\nvocab_size = 3", "[model] 'vocab_size' is set from the tokenizer, not read from a file"),  # passed
        ('init_digest = "0"', "'init_digest' is computed from the --from folder, not read from a file"),  # passed
    ],
)
def test_a_bad_config_file_is_one_line_exit_2(run_cli, tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    code, _, err = run_cli("train", "--config", path, "--max-steps", 1)
    assert code == 2 and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["--preset", "smoke", "--seeds", 1, "--no-stats"],  # no_stats was left out: the file did not load
        ["--preset", "smoke", "--variants", "relu,gelu", "--lr-axis", "1e-3,2e-3", "--noise-floor", 2,
         "--opt", "gelu:lr=1e-4,warmup_steps=3"],
        ["--preset", "scaling", "--variants", "gelu,SwiGLU"],
        ["--preset", "smoke", "--scale", "tokens=1000,2000,4000", "--seeds", 3],
        ["--preset", "quick", "--variants", "gelu*1+swiglu*1,relu", "--baseline", "relu", "--max-seconds", 5],
    ],
)  # fmt: skip
def test_print_config_loads_back_to_the_same_study(run_cli, tmp_path, argv):
    from ffnlab.study.plan import study_id

    path = tmp_path / "c.toml"
    code, out, err = run_cli("compare", *argv, "--print-config")
    assert code == 0, err
    path.write_text(out)
    assert run_cli("compare", "--config", path, "--print-config") == (0, out, "")
    assert study_id(study_of("--config", path)) == study_id(study_of(*argv))


@pytest.mark.parametrize(
    "text, needle",
    [  # were internal errors (exit 1), passed, or did not name the file
        ('[study.axes]\nlr = "x"', "[study.axes] 'lr' must be a list ([...]), got 'x'"),
        ('[study.axes]\nlr = [1e-3, "x"]', "[study.axes] 'lr' (item 2) must be a number, got 'x'"),
        ('[study.axes]\nplacement = ["side"]', "[study.axes] 'placement' (item 1) is 'side'; valid: pre, post"),
        ("[study.axes]\nwidht = [64]", "unknown key [study.axes] 'widht' (did you mean 'width'?)"),
        ("[study]\nper_variant = {gelu = {bogus = 1}}", "unknown key [study.per_variant.gelu] 'bogus'; valid: beta2,"),
        ('[study]\nper_variant = "x"', "[study] 'per_variant' must be a table ([study.per_variant]), got 'x'"),
        ("[study.per_variant]\ngelu = 1", "[study.per_variant] 'gelu' must be a table ([study.per_variant.gelu])"),
        ("[study.per_variant.gelu]\nwarmup_steps = 1.5", "[study.per_variant.gelu] 'warmup_steps' must be a whole"),
        ("[study]\nnoise_floor = nan", "[study] 'noise_floor' must be a whole number, got nan"),  # passed
        ("[study]\npreset = 3", "[study] 'preset' must be a string, got 3"),
        ('[study]\nseeds = "3"', "[study] 'seeds' must be a whole number, got '3'"),
        ('[study]\nvariants = "relu,gelu"', "[study] 'variants' must be a list ([...]), got 'relu,gelu'"),  # 'r'
        ("[study]\naxes = 3", "[study] 'axes' must be a table ([study.axes]), got 3"),
    ],
)
def test_a_bad_study_table_is_one_line_exit_2(run_cli, tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    code, _, err = run_cli("compare", "--variants", "relu,gelu", "--config", path, "--print-config")
    assert code == 2 and err.count("\n") == 1 and f"config file {path}: {needle}" in err, err


def test_a_study_table_reads_as_its_flags(run_cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[study.axes]\nlr = [1, 2e-3]\n[study.per_variant.gelu]\nlr = 1\nwarmup_steps = 3")
    by_file = run_cli("compare", "--variants", "relu,gelu", "--config", path, "--print-config")
    by_flags = run_cli("compare", "--variants", "relu,gelu", "--lr-axis", "1,2e-3", "--opt", "gelu:lr=1,warmup_steps=3",
                       "--print-config")  # fmt: skip
    assert by_file == by_flags and "lr = [1.0, 0.002]" in by_file[1]  # an int where a float belongs: a float


def symlink_loop(folder):
    path = folder / "loop.toml"
    path.symlink_to(path)
    return path


def file_of(content: bytes):
    def make(folder):
        path = folder / "c.toml"
        path.write_bytes(content)
        return path

    return make


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda folder: Path("/dev/zero"), "is a character device, which may never end"),  # read without end, GBs
        (lambda folder: folder, "is a folder; give a regular file"),
        (symlink_loop, "cannot be read (Too many levels of symbolic links)"),  # was an internal error
        (file_of(b"a = " + b"[" * 100_000), "nested too deeply"),  # tomllib's RecursionError, an internal error
        (file_of(bytes(range(128, 256))), "is not UTF-8 text (byte 0"),  # did not name the file
        (file_of(b"# a comment\n" * 100_000), "is larger than 1 MiB"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_named_in_one_line(run_cli, tmp_path, make, needle):
    path = make(tmp_path)
    code, _, err = run_cli("compare", "--config", path, "--print-config")
    assert code == 2 and err.count("\n") == 1 and f"config file {path} " in err and needle in err, err


def test_train_print_config_loads_back_to_the_same_config(run_cli, tmp_path):
    path = tmp_path / "c.toml"
    code, out, _ = run_cli("train", "--lr", "1e-3", "--ffn", "swiglu", "--print-config")
    path.write_text(out)
    assert code == 0 and "vocab_size" not in out  # computed: a file that holds it is refused
    assert run_cli("train", "--config", path, "--print-config") == (0, out, "")


def test_opt_sets_per_variant_optimiser_settings_in_the_runs_and_the_output(run_cli, tmp_path):
    from ffnlab.study.plan import plan, run_id
    from ffnlab.study.summary import held_equal

    argv = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", "2",
            "--opt", "gelu:lr=1e-4,beta2=0.98", "--opt", "GELU:warmup_steps=3"]  # fmt: skip
    study = study_of(*argv[1:])
    assert study.per_variant == {"gelu": {"lr": 1e-4, "beta2": 0.98, "warmup_steps": 3}}
    runs = {(c.model.ffn, c.seed): c for c in plan(study)}
    assert runs["gelu", 0].lr == 1e-4 and runs["gelu", 0].beta2 == 0.98 and runs["gelu", 0].warmup_steps == 3
    assert runs["relu", 0].lr == study.base.lr and runs["relu", 0].beta2 == study.base.beta2
    plain = study_of(*argv[1:7])
    assert run_id(runs["gelu", 0]) not in {run_id(c) for c in plan(plain)}  # the setting is part of the identity
    from ffnlab.study.render import settings_rows
    from ffnlab.study.summary import settings_of

    settings = settings_of(study)
    assert settings.to_json()["per_variant"] == study.per_variant  # compare --json
    rows = dict(settings_rows(settings, {}, "relu", "s.db"))  # the report
    assert rows["per-variant settings"] == "gelu: lr 0.0001, beta2 0.98, warmup_steps 3"
    not_equal = dict(held_equal(study).not_equal)
    assert "gelu: lr 0.0001, beta2 0.98, warmup_steps 3" in not_equal["per-variant settings"]
    code, out, _ = run_cli(*argv, "--print-config")
    path = tmp_path / "s.toml"
    path.write_text(out)
    assert run_cli("compare", "--config", path, "--print-config")[1] == out  # round trip


@pytest.mark.parametrize(
    "opt, needle",
    [
        ("gelu", "expected VARIANT:KEY=VALUE"),
        ("gelu:depth=2", "KEY one of lr, min_lr"),
        ("gelu:lr=fast", "lr needs a number"),
        ("silu:lr=1e-3", "not among the variants"),
        ("gelu:lr=-1", "must be positive"),
        ("gelu:lr=1e-3,lr=2e-3", "--opt gelu:lr=1e-3,lr=2e-3 sets lr twice"),  # the last one held
        (["gelu:lr=1e-3", "GELU:lr=2e-3"], "--opt sets gelu's lr twice (0.001 and 0.002)"),  # the same, in two flags
    ],
)
def test_bad_opt_is_one_line_exit_2(run_cli, opt, needle):
    opts = [f for o in ([opt] if isinstance(opt, str) else opt) for f in ("--opt", o)]
    code, _, err = run_cli("compare", "--preset", "smoke", "--variants", "relu,gelu", *opts, "--print-config")
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_a_setting_per_variant_given_twice_in_the_config_file_is_refused_and_opt_overrides_it(run_cli, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[study.per_variant]\ngelu = {lr = 1e-3}\nGELU = {lr = 2e-3}")  # one variant, two spellings
    code, _, err = run_cli("compare", "--variants", "relu,gelu", "--config", path, "--print-config")
    assert code == 2 and f"config file {path} sets gelu's lr twice" in err
    path.write_text("[study.per_variant]\nGELU = {lr = 1e-3, beta2 = 0.9}")
    code, out, _ = run_cli(
        "compare", "--variants", "relu,gelu", "--config", path, "--opt", "gelu:lr=2e-3", "--print-config"
    )
    assert code == 0 and out.endswith(
        "[study.per_variant.gelu]\nlr = 0.002\nbeta2 = 0.9\n"
    )  # a flag overrides the file


def test_the_readme_names_every_key_of_the_study_table():
    from ffnlab.study.plan import STUDY_KEYS
    from tests.test_readme import readme_keys

    named = readme_keys("for `compare` a `[study]` table with", "flags override it")
    assert named | {"axes"} == set(STUDY_KEYS)  # axes: the [study.axes] table
