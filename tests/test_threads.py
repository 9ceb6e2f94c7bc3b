"""--threads beyond what the machine can run (ffnlab._util.machine.check_threads): one line and exit 2 before any
work, in every command that takes it, where torch.set_num_threads(100000) ended the process in the OpenMP runtime."""

import os

import pytest
import torch

from ffnlab._util.machine import check_threads


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail(f"{n} threads set"))


def test_the_bound_is_the_machines_logical_cpus(two_cpus):
    assert check_threads(1) == 1 and check_threads(2) == 2
    for threads in (0, 3, 100_000):
        with pytest.raises(
            ValueError, match=f"threads must be between 1 and 2, the logical CPUs of this machine, got {threads}"
        ):
            check_threads(threads)


@pytest.mark.parametrize("command", [["train"], ["compare", "--variants", "gelu,relu"], ["deploy", "--ffn", "gelu"]])
@pytest.mark.parametrize("threads, needle", [(3, "threads must be between 1 and 2"), ("x", "expected ")])
def test_every_command_refuses_threads_it_cannot_run_in_one_line(run_cli, two_cpus, tmp_path, monkeypatch, command,
                                                                  threads, needle):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*command, "--threads", threads)
    assert code == 2 and err.count("\n") == 1 and err.startswith("ffnlab: error: ") and needle in err, err
    assert os.listdir(tmp_path) == []


def test_threads_from_a_config_file_are_checked_where_training_sets_them(run_cli, two_cpus, tmp_path):
    """Only the flag was checked: `threads = 100000` in a TOML config still reached torch.set_num_threads."""
    config = tmp_path / "run.toml"
    config.write_text("threads = 100000\nmax_steps = 1\n")
    code, _, err = run_cli("train", "--config", config, "--checkpoint-dir", tmp_path / "ck")
    assert code == 2 and "threads must be between 1 and 2" in err and err.count("\n") == 1, err
