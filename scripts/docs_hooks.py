"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages' generated parts, built from the code at build time so
they cannot drift from it.

A page holds a marker, the HTML comment `<!-- generated: NAME -->` on a line of its own (or inside a sentence),
which `expand` replaces with:

    cli        every command of `ffnlab.cli.build_parser()`, its subcommands too: what it does and a table of
               its flags (each flag's spellings, value, default and help, as `--help` gives them)
    row-keys   the keys of a variant's row in `compare --json`, as an inline list: the statistics of the ranking
               metric (`VariantStats`' fields), the per-seed values, then every row metric of `METRICS`
    metrics    the metric table (`ffnlab.study.metrics.METRICS`) as a table: key, label, unit, better, tasks,
               where it is shown
    claims     the claims `ffnlab numerics` checks (`ffnlab/tools/claims.json`): each claim, its source and
               what measures it

An unknown marker fails the build. `expand` is what the tests call too, to read a page as the site shows it.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

MARKER = re.compile(r"<!-- generated: ([\w-]+) -->")
# a row's keys beside the statistics and the metrics (ffnlab.study.records.VariantRow.to_json)
ROW_VALUES = ("values", "test_values", "runs")


def escape(text: str) -> str:
    """Text for a Markdown table cell: HTML's specials escaped, and what Markdown would read as emphasis,
    links, code or a cell's end (`gelu*2+swiglu*2`, `|`) backslashed."""
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", html.escape(" ".join(text.split()), quote=False))


def code(text: str) -> str:
    """`text` as inline code in a table cell (a `|` in it still ends the cell unless backslashed)."""
    return "`" + text.replace("|", "\\|") + "`"


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(help, name, parser) of each subcommand of `parser`, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield helps.get(name, ""), name, sub


def value_of(action: argparse.Action) -> str:
    """What a flag takes: its choices, its metavar, or nothing for a switch."""
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(code(str(c)) for c in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    return code(metavar + (" ..." if action.nargs in ("+", "*") else ""))


def default_of(action: argparse.Action) -> str:
    """A flag's default where argparse holds one; most are None: the config's default, which the help names."""
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, [], ""):
        return ""
    return code(str(action.default))


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A command's own arguments, positional ones first as --help lists them: not --help, not its subcommands,
    none whose help argparse suppresses."""
    own = [
        a
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS
    ]
    return sorted(own, key=lambda a: bool(a.option_strings))


def flag_table(parser: argparse.ArgumentParser) -> list[str]:
    """The arguments of one command as a Markdown table: spellings, value, default, help."""
    formatter = parser._get_formatter()
    rows = ["| argument | value | default | what it does |", "|---|---|---|---|"]
    for action in arguments(parser):
        names = ", ".join(code(o) for o in action.option_strings) or code(str(action.metavar or action.dest))
        value = "" if not action.option_strings else value_of(action)
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {names} | {value} | {default_of(action)} | {escape(help_text)} |")
    return rows


def command_sections(parser: argparse.ArgumentParser, path: str, what: str) -> Iterator[str]:
    """The reference of the command `path` (`ffnlab data prepare`) and of its subcommands, in turn."""
    lines = [f"## {path}", "", escape(what), ""]
    if parser.description:
        lines += [escape(parser.description), ""]
    nested = list(subcommands(parser))
    if nested:
        lines += ["Its commands: " + ", ".join(f"[{path} {name}](#{slug(f'{path} {name}')})" for _, name, _ in nested)]
        lines.append("")
    if arguments(parser):
        lines += flag_table(parser) + [""]
    yield "\n".join(lines)
    for help_text, name, sub in nested:
        yield from command_sections(sub, f"{path} {name}", help_text)


def slug(heading: str) -> str:
    """The anchor MkDocs' table of contents gives a heading of words and spaces."""
    return re.sub(r"\s+", "-", heading.strip().lower())


def cli_reference() -> str:
    """Every command of the `ffnlab` CLI, with its flags, from the parser itself."""
    from ffnlab.cli import build_parser

    parser = build_parser()
    sections = [
        part
        for help_text, name, sub in subcommands(parser)
        for part in command_sections(sub, f"ffnlab {name}", help_text)
    ]
    return "\n".join(sections)


def row_keys() -> str:
    """The keys of a variant's row in `compare --json`, as inline code joined by commas."""
    from ffnlab.study.metrics import row_metrics
    from ffnlab.study.records import STAT_FIELDS

    names = [*STAT_FIELDS, *ROW_VALUES, *(m.name for m in row_metrics())]
    return ", ".join(f"`{name}`" for name in names)


def metric_table() -> str:
    """The metric table as Markdown: one row per entry of METRICS, in declaration order."""
    from ffnlab.study.metrics import METRICS

    rows = ["| key | label | unit | better | tasks | shown in |", "|---|---|---|---|---|---|"]
    for m in METRICS:
        if m.ranks:  # not a key of the row: the row's statistics are of it
            shown = f"ranks {', '.join(m.ranks)}: a cell's `metric`, the row's statistics"
        else:
            shown = (", ".join(m.tables) or "JSON only") + ("" if m.csv else " (not in the CSV)")
        rows.append(
            f"| {code(m.name)} | {escape(m.label)} | {escape(m.unit) or '-'} | {m.better or '-'} "
            f"| {', '.join(m.tasks)} | {shown} |"
        )
    return "\n".join(rows)


def claims_table() -> str:
    """The claims table of `ffnlab numerics` as Markdown: one row per claim, in the file's order."""
    import ffnlab.tools

    claims = json.loads((Path(ffnlab.tools.__file__).parent / "claims.json").read_text())["claims"]
    rows = ["| # | claim | source | measured by |", "|---|---|---|---|"]
    for claim in claims:
        measure = code(f"measure_{claim['measure']}")
        rows.append(f"| {claim['id']} | {escape(claim['claim'])} | {escape(claim['source'])} | {measure} |")
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "row-keys": row_keys,
    "metrics": metric_table,
    "claims": claims_table,
}


def expand(markdown: str) -> str:
    """`markdown` with each marker replaced by what it names; ValueError naming an unknown one."""

    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown marker 'generated: {name}'; valid: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)


def on_page_markdown(markdown: str, **_: object) -> str:
    """MkDocs' hook: a page's Markdown before it is rendered."""
    return expand(markdown)
