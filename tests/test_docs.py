"""The documentation site (mkdocs.yml, docs/): it builds under --strict, its generated reference names what the
code has, the README stays a front page whose links resolve, and the tutorial's shell blocks run."""

import argparse
import csv
import functools
import importlib.util
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
# the pages as written, README first, then docs/ in path order (the generated parts are markers here)
PAGES = {"README.md": README} | {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))}
TUTORIAL = PAGES["docs/tutorial.md"]
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


# ---- the tutorial: every shell block runs, at smoke size ------------------------------------------------------

# appended to each command the tutorial shows, so it runs in seconds: the smoke preset (1 layer, d_model 32, 30
# steps) and 2 seeds in this process; the flags the tutorial gives stay as the reader types them
SMOKE = {
    "compare": ["--preset", "smoke", "--seeds", "2", "--jobs", "1"],
    "train": ["--preset", "smoke"],
    "finetune": ["--preset", "smoke"],
}
WORDS = ["the", "a", "of", "to", "and", "in", "that", "it", "is", "was", "for", "on", "with", "as", "his", "her", "they",
         "we", "be", "at", "by", "this", "had", "not", "but", "from"]  # fmt: skip
MOOD = {
    "pos": ["delight", "superb", "moving", "charming", "lands"],
    "neg": ["dull", "tedious", "clumsy", "boring", "back"],
}


def shell_lines(markdown: str) -> list[str]:
    """The commands of a page's bash blocks, one a line: continued lines joined, a here-document kept whole."""
    lines: list[str] = []
    for block in (b for lang, b in FENCED.findall(markdown) if lang == "bash"):
        rows = block.replace("\\\n", " ").splitlines()
        while rows:
            line = rows.pop(0)
            if heredoc := re.search(r"<<-?\s*'?(\w+)'?", line):
                end = rows.index(heredoc.group(1))
                line, rows = "\n".join([line, *rows[: end + 1]]), rows[end + 1 :]
            if line.strip():
                lines.append(line)
    return lines


def write_my_data(folder, header: list[str]) -> dict[str, str]:
    """The files the tutorial tells the reader to have: a text file, and a CSV of labelled rows with the columns
    the tutorial shows (`header`). {name: what it is}."""
    rng = random.Random(0)
    lines = (" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(1500))
    (folder / "my_corpus.txt").write_text("\n".join(lines) + "\n")
    with open(folder / "reviews.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for _ in range(300):
            label = rng.choice(sorted(MOOD))
            writer.writerow([" ".join(rng.choice(WORDS + MOOD[label]) for _ in range(10)), label])
    return {"my_corpus.txt": "text", "reviews.csv": "labelled rows"}


def test_every_shell_block_of_the_tutorial_runs_at_smoke_size(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    shown_csv = next(b for lang, b in FENCED.findall(TUTORIAL) if lang == "text")  # the CSV the reader has
    written = write_my_data(tmp_path, shown_csv.splitlines()[0].split(","))
    lines = shell_lines(TUTORIAL)
    data = {a.split()[1] for line in lines for a in re.findall(r"--data \S+", line)}
    assert data == set(written), "the tutorial's own data files are the ones this test writes"
    ran = []
    for line in lines:
        argv = shlex.split(line)
        if argv[0] != "ffnlab":
            subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True, timeout=60)
            continue
        code, out, err = run_cli(*argv[1:], *SMOKE.get(argv[1], []))
        assert code == 0, f"{line}: {err}"
        ran.append(argv[1])
    assert ran.count("compare") >= 3 and {"train", "advise"} <= set(ran)
    # the reports the tutorial tells the reader to open, each beside its store
    for folder in ("ffnlab-runs", "my-text", "my-reviews"):
        assert (tmp_path / folder / "report" / "report.html").is_file(), folder
