import math
import os
import pathlib

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-6, 1e-6),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}


# the smallest model a CLI training run takes: flags shared by the train and CLI tests
TINY_MODEL = ["--layers", 1, "--heads", 2, "--d-model", 32, "--context", 32, "--batch-size", 4]


def assert_close(actual, expected, dtype=None, **kw):
    """torch.testing.assert_close with (rtol, atol) chosen per dtype."""
    rtol, atol = TOL[dtype or expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=kw.get("rtol", rtol), atol=kw.get("atol", atol))


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from ffnlab.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


# the CLI in a child with at most 3 GiB of address space: a read without bound fails there instead of exhausting
# the machine
BOUNDED_CLI = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
    "from ffnlab.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run_cli_bounded(*argv, timeout: float = 60) -> tuple[int, str, str]:
    """Run the CLI in a child process, bounded in memory (BOUNDED_CLI) and time: a read that blocks (a FIFO) or
    never ends (/dev/zero) fails the test instead of hanging the suite. (exit code, stdout, stderr)."""
    import subprocess
    import sys

    args = [sys.executable, "-c", BOUNDED_CLI, *map(str, argv)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr


def within(seconds: float, call):
    """call()'s result, run in a daemon thread: a test of a FIFO fails if it has not returned after `seconds`
    (blocked opening the FIFO) instead of hanging the suite. Only for code that releases the GIL while it
    waits (Python's open); a library that blocks holding it (safetensors) needs `run_cli_bounded`."""
    import threading

    outcome: list = []

    def run():
        try:
            outcome.append((True, call()))
        except BaseException as e:  # raised again in the test's thread
            outcome.append((False, e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s: blocked on a FIFO?"
    returned, value = outcome[0]
    if not returned:
        raise value
    return value


def not_a_file(folder, kind: str, name: str = "config.json"):
    """A path that is no regular file, and what check_readable says of it: `name` in `folder` made a FIFO (kind
    'fifo') or a link to /dev/zero ('link'), or /dev/zero itself ('device')."""
    path = folder / name
    if kind == "fifo":
        os.mkfifo(path)  # blocked for ever
        return path, "is a FIFO (a named pipe), which may block for ever; give a regular file"
    if kind == "link":
        path.symlink_to("/dev/zero")  # read without end, 0.8 GB/s
        return path, "is a character device, which may never end (a link to /dev/zero); give a regular file"
    return pathlib.Path("/dev/zero"), "is a character device, which may never end; give a regular file"


def run_result(**fields):
    """A `RunResult` with plausible values in every field, `fields` (keys of its flat JSON, `RunResult.to_dict`)
    replacing some: test fixtures are built by the real type's reader, so a misspelt or stale key fails instead
    of passing unread."""
    from ffnlab.run.result import RunResult

    loss = fields.get("final_val_loss", 2.0)
    values = dict(
        ffn="gelu", seed=0, status="finished", task="lm", steps=10, final_val_loss=loss,
        final_val_ppl=None if loss is None else math.exp(loss), final_val_acc=None, final_test_loss=loss,
        final_test_acc=None, noisy_val_loss=None, noisy_val_acc=None, diverged_step=None, diverged_kind=None, params=16_000,
        ffn_params=8_000, flops_per_token=34_000, tokens=10_240, train_flops=3 * 34_000 * 10_240,
        tokens_per_s=25_600.0, step_time_s=0.01, first_step_s=0.05, train_seconds=1.0, wall_seconds=1.2,
        param_bytes=64_000, grad_bytes=64_000, optimizer_bytes=128_000, saved_bytes=1 << 20,
        train_mem_bytes=64_000 + 64_000 + 128_000 + (1 << 20), cuda_peak_bytes=None, n_grad_spikes=0,
        n_loss_spikes=0, max_grad_norm=1.0, ffn_grad_mean=0.0, ffn_grad_std=1e-3, behaviour={}, dead_frac=None,
        learned={}, vocab_size=65, device="cpu", precision="fp32", threads=1, history={}, events=[], config={},
    )  # fmt: skip
    return RunResult.from_dict({**values, **fields})


def variant_row(ffn, **fields):
    """A `VariantRow` of a variant with empty statistics, `fields` replacing some."""
    from ffnlab.study.records import VariantRow

    stats = dict(rank=1, n_seeds=0, mean=None, std=None, ci_low=None, ci_high=None, delta=None, delta_ci_low=None,
                 delta_ci_high=None, n_pairs=0, p=None, p_adj=None, significant=False, diverged=0)  # fmt: skip
    return VariantRow(ffn=ffn, **{**stats, **fields})
