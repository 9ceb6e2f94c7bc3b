"""What the README and the documentation (docs/**/*.md) show a user: the examples run, the tables match the
code, the commands parse and resolve, and every flag shown is a flag of its command."""

import functools
import re

from ffnlab.core.ffn import build_ffn
from tests.test_docs import FENCED, PAGES, README, ROOT, docs_hooks

WRITTEN = "\n\n".join(PAGES.values())  # every page as written: the generated parts are markers here


@functools.cache
def built() -> str:
    """Every page as the site shows it: the generated parts filled in."""
    return "\n\n".join(docs_hooks().expand(text) for text in PAGES.values())


def fenced(text: str, language: str) -> list[str]:
    return [block for lang, block in FENCED.findall(text) if lang == language]


def test_readme_python_example_runs():
    code = fenced(README, "python")[0]
    assert len(code.strip().splitlines()) <= 6
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["loss"].ndim == 0 and scope["model"].blocks[0].ffn.spec.name == "swiglu"


def test_every_python_example_of_the_docs_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example may save a model
    ran = 0
    for name, text in PAGES.items():
        for code in fenced(text, "python"):
            exec(compile(code, name, "exec"), {})
            ran += 1
    assert ran >= 3


def test_the_variant_table_matches_the_code():
    rows = re.findall(r"^\| (\w+) \| yes \| [^|]+ \| (\d+) \| ([\d,]+) \|$", WRITTEN, re.M)
    assert len(rows) == 6
    for name, d_ff, params in rows:
        ffn = build_ffn(name, 512)
        assert ffn.d_ff == int(d_ff) and sum(p.numel() for p in ffn.parameters()) == int(params.replace(",", ""))


def test_readme_names_the_two_commands():
    assert "./run.sh" in README and "./test.sh" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash test.sh" in ci


# ---- what the pages show a user: commands, flags, names and JSON keys -----------------------------------

COMMAND = re.compile(r"(?:\bffnlab|\./run\.sh) ([a-z]+)\b.*")
PLACEHOLDER = re.compile(r"^\[|\.\.\.|(^|:)[A-Z]{2,}(\.\w+)?$")  # [--json], ..., FOLDER, CONFIG.json, glue:DIR
# `ray start --head`, `ruff format --check`, `torchrun --nproc-per-node`, benchmarks/presets_cost.py's
# `--measure`, `mkdocs build --strict`
FOREIGN_FLAGS = {"--head", "--check", "--nproc-per-node", "--measure", "--strict"}
# flags the pages show that are being added to their command: let through while the command lacks them, and
# checked as any other flag once it has them
COMING: set[tuple[str, str]] = set()  # none now: --glue-tasks has landed


@functools.cache
def subcommands() -> dict:
    from ffnlab.cli import build_parser

    return next(a for a in build_parser()._actions if a.dest == "command").choices


def shown_commands() -> list[tuple[str, str]]:
    """(subcommand, command line) for every `ffnlab CMD ...` (or `./run.sh CMD ...`) in a bash block, an
    indented block or an inline code span, and for a span that starts with a subcommand and a flag
    (`train --n-layers 6 --ffn ...`: the line starts with the subcommand then, not with ffnlab)."""
    prose = FENCED.sub("", WRITTEN)
    lines = [line for block in fenced(WRITTEN, "bash") for line in block.replace("\\\n", " ").splitlines()]
    lines += re.findall(r"^ {4}(\S.*)$", prose, re.M)
    spans = [s.replace("\n", " ") for s in re.findall(r"`([^`]+)`", prose) if "\n\n" not in s]
    found = []
    for text in lines + spans:
        text = re.sub(r"\s+#.*", "", text)  # a shell comment
        if re.match(rf"({'|'.join(subcommands())}) -", text):
            found.append((text.split()[0], text))
            continue
        for part in re.split(r"(?=\bffnlab [a-z])|(?=\./run\.sh [a-z])", text):
            m = COMMAND.match(part.strip())
            if m:
                found.append((m.group(1), m.group(0).strip()))
    return found


def flags_in(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


@functools.cache
def options(command: str) -> set[str]:
    """The flags of a command, and of its own subcommands (`data prepare`)."""
    parser = subcommands()[command]
    nested = [p for a in parser._actions if isinstance(a.choices, dict) for p in a.choices.values()]
    return {o for p in (parser, *nested) for a in p._actions for o in a.option_strings}


def coming(command: str) -> set[str]:
    """The flags of COMING that `command` does not have yet."""
    return {flag for c, flag in COMING if c == command} - options(command)


def test_every_flag_the_docs_show_is_a_flag_of_its_command():
    shown = shown_commands()
    shown += re.findall(r"^\| `ffnlab ([a-z]+)(.*)$", WRITTEN, re.M)  # the Commands table: a row per command
    assert len(shown) > 30 and {c for c, _ in shown} == set(subcommands())
    wrong = [f"{c}: {f}" for c, text in shown for f in sorted(flags_in(text) - options(c) - coming(c))]
    assert wrong == []
    everywhere = set().union(*(options(c) | coming(c) for c in subcommands()))
    assert flags_in(WRITTEN) - everywhere == FOREIGN_FLAGS  # prose names flags without their command too


def test_every_command_the_docs_show_parses_and_resolves(run_cli):
    """Each complete command line parses; train, finetune and compare resolve their configuration
    (--print-config: every name, schedule and size checked, nothing trained); list runs."""
    import shlex

    from ffnlab.cli import build_parser

    parser, resolved = build_parser(), 0
    for command, line in shown_commands():
        argv = shlex.split(line)
        argv = argv[: argv.index(">")] if ">" in argv else argv
        argv = argv[1:] if argv[0] in ("ffnlab", "./run.sh") else argv
        fragment = not line.startswith(("ffnlab", "./run.sh"))
        if fragment and (command not in ("train", "compare") or sum(a.startswith("-") for a in argv[1:]) < 2):
            continue  # `compare --from`, `compare --peft lora`, `export --model ffn`: a flag named, not a command line
        if not argv[1:] or any(PLACEHOLDER.search(a) for a in argv) or "--help" in argv:
            continue  # a command named, not a command line; or one with placeholders
        parser.parse_args(argv)
        needs_files = {"--from", "--hf-config", "--config"} & set(argv)
        if command in ("train", "finetune", "compare") and not needs_files:
            code, _, err = run_cli(*argv, "--print-config")
            assert code == 0, f"{line}: {err}"
            resolved += 1
        elif command == "list":
            code, _, err = run_cli(*argv)
            assert code == 0, f"{line}: {err}"
    assert resolved >= 10


def readme_keys(start: str, end: str) -> set[str]:
    """The `names` the documentation writes between the phrases `start` and `end` (each found once), read as
    the site shows it: a generated list counts."""
    text = " ".join(built().split())
    assert text.count(start) == 1 and text.count(end) >= 1, (start, end)
    between = text.split(start, 1)[1].split(end, 1)[0]
    return set(re.findall(r"`(\w+)`", between))


def test_the_docs_name_every_activation_and_only_those():
    from ffnlab.core.activations import ACTIVATIONS

    named = readme_keys("Activations: ", "`ffnlab list` prints them all") - {"ACT2FN"}  # Hugging Face's table
    assert named == set(ACTIVATIONS)
