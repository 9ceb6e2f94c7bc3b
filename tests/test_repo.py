"""Rules for the repository itself: tests that hold on every machine."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = ROOT / name
        try:
            yield name, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue


def test_no_test_times_the_code_it_tests():
    """Timings go to benchmarks/ (shared, noisy machines): a test may wait with a deadline, never
    assert how fast something ran."""
    offenders = [
        f.name
        for f in (ROOT / "tests").glob("test_*.py")
        if f.name != "test_repo.py" and re.search(r"perf_counter|process_time|monotonic\(\)", f.read_text())
    ]
    assert offenders == []


def test_nothing_names_this_machines_paths():
    offenders = [name for name, text in tracked_text_files() if name != "tests/test_repo.py" and "/work/" in text]
    assert offenders == []


def test_old_flat_module_names_import_with_a_deprecation_warning():
    import importlib
    import sys

    import ffnlab.run.train

    sys.modules.pop("ffnlab.train", None)
    with pytest.warns(DeprecationWarning, match="ffnlab.train moved to ffnlab.run.train"):
        old = importlib.import_module("ffnlab.train")
    assert old is ffnlab.run.train  # one module, so one TrainConfig class
