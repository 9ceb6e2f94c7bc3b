"""The documentation site (mkdocs.yml, docs/): it builds under --strict, its generated reference names what the
code has, and the README stays a front page whose links resolve."""

import argparse
import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
# the pages as written, README first, then docs/ in path order (the generated parts are markers here)
PAGES = {"README.md": README} | {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))}
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)  # a fenced block: (its language, its text)


@functools.cache
def docs_hooks():
    """scripts/docs_hooks.py, the MkDocs hook that fills in the generated parts of the reference pages."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_under_strict(tmp_path):
    """Every page, link and anchor resolves, the API reference renders from the docstrings, and the generated
    parts replace their markers."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about a future MkDocs
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "generated:" not in cli and 'id="ffnlab-data-prepare"' in cli
    api = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="ffnlab.core.ffn.build_ffn"' in api and 'id="ffnlab.study.stats.paired_diff"' in api
    assert not (ROOT / "site").exists()


def commands(parser: argparse.ArgumentParser, path: str = "ffnlab"):
    """(path, parser) of every command under `parser`, subcommands of subcommands too."""
    for action in parser._actions:
        if isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub
                yield from commands(sub, f"{path} {name}")


def sections(markdown: str) -> dict[str, str]:
    """A page's `## heading` sections by heading."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_cli_reference_names_every_flag_of_every_command():
    from ffnlab.cli import build_parser

    page = sections(docs_hooks().expand(PAGES["docs/reference/cli.md"]))
    found = dict(commands(build_parser()))
    assert set(page) == set(found) and "ffnlab data prepare" in page
    missing = []
    for path, parser in found.items():
        for action in parser._actions:
            names = action.option_strings or ([] if isinstance(action.choices, dict) else [action.dest])
            missing += [f"{path} {n}" for n in names if n not in ("-h", "--help") and f"`{n}`" not in page[path]]
    assert missing == []


def test_the_json_reference_names_every_metric_of_the_table():
    from ffnlab.study.metrics import METRICS, row_metrics
    from ffnlab.study.records import STAT_FIELDS

    page = docs_hooks().expand(PAGES["docs/reference/json.md"])
    assert "generated:" not in page
    table = sections(page)["The metric table"]
    assert [m.name for m in METRICS] == re.findall(r"^\| `(\w+)` \|", table, re.M)  # one row each, in order
    row = page.split("a row per FFN with", 1)[1].split("Without", 1)[0]
    assert re.findall(r"`(\w+)`", row) == [
        *STAT_FIELDS,
        "values",
        "test_values",
        "runs",
        *(m.name for m in row_metrics()),
    ]


def test_an_unknown_marker_fails_the_build():
    with pytest.raises(ValueError, match="unknown marker 'generated: nope'; valid: cli, row-keys"):
        docs_hooks().expand("text <!-- generated: nope --> text")


def test_the_readme_is_a_front_page_whose_links_resolve():
    assert len(README.splitlines()) <= 200
    for title in ("Two commands", "Fine-tuning and LoRA", "GLUE", "Development"):
        assert f"\n## {title}\n" in README
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)  # relative links, anchors cut
    assert len(links) > 20
    assert [link for link in links if not (ROOT / link).exists()] == []
