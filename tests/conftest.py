import os

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
