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


@pytest.mark.parametrize(
    "old, new",
    [
        ("ffnlab.train", "ffnlab.run.train"),  # the flat names before 0.2
        ("ffnlab.tokenizer", "ffnlab.data.tokenizer"),
        ("ffnlab.run.data", "ffnlab.data.corpus"),  # the data modules that left run/ for data/
        ("ffnlab.run.tokenizer", "ffnlab.data.tokenizer"),
        ("ffnlab.run.pairs", "ffnlab.data.pairs"),
        ("ffnlab.run.tagging", "ffnlab.data.tagging"),
        ("ffnlab.run.images", "ffnlab.data.images"),
    ],
)
def test_old_module_names_import_with_a_deprecation_warning(old, new):
    import importlib
    import sys

    module = importlib.import_module(new)
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        assert importlib.import_module(old) is module  # one module, so one TrainConfig class


def test_the_old_flat_data_module_is_the_data_package_whose_old_names_still_resolve():
    import ffnlab.data
    from ffnlab.data import corpus

    with pytest.warns(DeprecationWarning, match="ffnlab.data.load_corpus moved to ffnlab.data.corpus.load_corpus"):
        assert ffnlab.data.load_corpus is corpus.load_corpus
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = ffnlab.data.no_such_name


def locked_versions() -> dict[str, str]:
    """test.lock's pins that apply to this interpreter and platform, by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "test.lock").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"test.lock pins exact versions: {line}"
        if req.marker is None or req.marker.evaluate():
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def ranged_requirements():
    """pyproject.toml's requirements: the core ones and every extra's."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *(r for rs in extras.values() for r in rs)]]


def test_pyprojects_ranges_admit_every_locked_version():
    """Users install from the ranges, CI from the lock: a lock outside the ranges would test versions no
    user can get."""
    from packaging.utils import canonicalize_name

    pins = locked_versions()
    outside = [
        f"{req} (locked {pins[name]})"
        for req in ranged_requirements()
        if (name := canonicalize_name(req.name)) in pins and not req.specifier.contains(pins[name], prereleases=True)
    ]
    assert outside == []


def test_the_lock_pins_every_test_requirement_but_torch():
    """torch is left out on purpose: scripts/setup.sh installs it (or keeps the user's own)."""
    from packaging.utils import canonicalize_name

    pins = locked_versions()
    missing = [
        str(req)
        for req in ranged_requirements()
        if (req.marker is None or req.marker.evaluate({"extra": "test"}))
        and (name := canonicalize_name(req.name)) != "torch"
        and name not in pins
    ]
    assert missing == []
    assert "torch" not in pins


def site_packages() -> list[str]:
    import site
    import sysconfig

    return list(dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()]))


def test_the_installed_packages_are_the_locked_ones():
    """scripts/setup.sh installs at the lock's versions, so this suite runs on the versions CI checked."""
    from importlib import metadata

    from packaging.utils import canonicalize_name
    from packaging.version import Version

    # the environment's own packages: not a library's vendored copies (setuptools/_vendor), which some
    # imports put on sys.path; where a venv sees the system's packages (set-up keeps a Python's own torch), the
    # venv's copy of a package comes first on the path, and it is the one imported
    installed: dict[str, str] = {}
    for d in metadata.distributions(path=site_packages()):
        installed.setdefault(canonicalize_name(d.metadata["Name"]), d.version)
    pins = locked_versions()
    differ = [
        f"{name} {installed[name]} (locked {pin})"
        for name, pin in pins.items()
        if Version(installed.get(name, pin)) != Version(pin)
    ]
    assert differ == []
