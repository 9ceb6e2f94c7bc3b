"""The package's layers: each imports only from the layers below it (docs/explanation/architecture.md)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ffnlab"
# bottom to top; a module may import from its own layer and the ones before it (so data/ only core/ and _util/)
LAYERS = ("_util", "core", "data", "tools", "run", "study", "cli")
BOTTOM = {"_compat": "_util"}  # the package's own plumbing


def layer_of(module: str) -> str:
    """'ffnlab.core.ffn' -> 'core'; the package itself and ffnlab/cli.py are the top."""
    parts = module.split(".")
    if len(parts) < 2:
        return "cli"
    return BOTTOM.get(parts[1], parts[1] if parts[1] in LAYERS else "cli")


def imported(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) for every ffnlab import in a file, those inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == package:
            found += [(node.lineno, f"{node.module}.{a.name}" if node.module == package else node.module)
                      for a in node.names]  # fmt: skip
    return found


def upward_imports(root: Path) -> list[str]:
    """'file:line imports module (layer a -> layer b)' for every import of a higher layer."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        here = layer_of(".".join(rel.parts).removesuffix(".__init__"))
        for line, module in imported(path, root.name):
            there = layer_of(module)
            if LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module} ({here} -> {there})")
    return bad


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(PACKAGE) == []


def test_the_data_layer_imports_only_the_core_and_util():
    """Corpus reading, tokenising and batching need no run, study or tool: the training loop imports them."""
    found = {layer_of(module) for path in (PACKAGE / "data").rglob("*.py") for _, module in imported(path, "ffnlab")}
    assert found <= {"_util", "core", "data"}


def test_every_subpackage_is_a_known_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"cli"}


@pytest.mark.parametrize(
    "layer, source, expected",
    [
        (
            "core",
            "from ffnlab.study.store import Store",
            ["ffnlab/core/bad.py:1 imports ffnlab.study.store (core -> study)"],
        ),
        (
            "core",
            "def f():\n    import ffnlab.run.train",
            ["ffnlab/core/bad.py:2 imports ffnlab.run.train (core -> run)"],
        ),
        ("core", "from ffnlab import cli", ["ffnlab/core/bad.py:1 imports ffnlab.cli (core -> cli)"]),
        ("core", "from ffnlab._util.names import closest\nfrom ffnlab.core import ffn", []),
        (
            "core",
            "from ffnlab.data.batches import get_batch",
            ["ffnlab/core/bad.py:1 imports ffnlab.data.batches (core -> data)"],
        ),
        (
            "data",
            "from ffnlab.run.config import TrainConfig",
            ["ffnlab/data/bad.py:1 imports ffnlab.run.config (data -> run)"],
        ),
        (
            "data",
            "def f():\n    from ffnlab.tools import hf",
            ["ffnlab/data/bad.py:2 imports ffnlab.tools (data -> tools)"],
        ),
        ("data", "from ffnlab.core.model import IGNORE_INDEX\nfrom ffnlab._util.text import shorten", []),
        ("run", "from ffnlab.data.batches import get_batch", []),
    ],
)
def test_the_check_sees_upward_imports_also_inside_functions(tmp_path, layer, source, expected):
    folder = tmp_path / "ffnlab" / layer
    folder.mkdir(parents=True)
    (folder / "bad.py").write_text(source)
    assert upward_imports(tmp_path / "ffnlab") == expected


def architecture_section() -> str:
    return (PACKAGE.parent / "docs" / "explanation" / "architecture.md").read_text()


def test_the_readme_architecture_names_every_module_and_only_those():
    import re

    section = architecture_section()
    named = set(re.findall(r"`(?:[\w/]+/)?(\w+\.(?:\w+\.)?(?:py|csv|json|j2))`", section)) - {"test_layers.py"}
    suffixes = (".py", ".csv", ".json", ".j2")  # modules, the data and the templates that ship with them
    files = {p.name for p in PACKAGE.rglob("*") if p.suffix in suffixes and p.name != "__init__.py"}
    assert named - files == set(), "README names modules that do not exist"
    assert files - named == set(), "modules the README's architecture section does not name"
    diagram = set(re.findall(r"^(\w+)/ ", section, re.M))
    assert diagram == set(LAYERS) - {"cli"}
