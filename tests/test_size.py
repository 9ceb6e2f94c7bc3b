"""Sizes that keep the package readable: no function over 80 lines, and the CLI module, which only parses
arguments and dispatches, at most 400 lines."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ffnlab"
# a function's lines run from its `def` line (its decorators not counted) to its last line; a nested function
# counts within its parent and again on its own
MAX_FUNCTION_LINES = 80
MAX_CLI_LINES = 400


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'file:line name (N lines)' for every function under `root` longer than `limit` lines."""
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    long.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return long


def test_no_function_in_the_package_is_longer_than_80_lines():
    assert long_functions(PACKAGE) == []


def test_the_cli_module_is_at_most_400_lines():
    lines = len((PACKAGE / "cli.py").read_text().splitlines())
    assert lines <= MAX_CLI_LINES, f"ffnlab/cli.py has {lines} lines; what is not argument parsing goes elsewhere"


def test_a_function_counts_from_def_to_its_last_line_nested_functions_within_it(tmp_path):
    def function(name: str, lines: int, indent: str = "") -> str:  # `lines` lines in all, the def among them
        return f"{indent}def {name}():\n" + f"{indent}    x = 1\n" * (lines - 1)

    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "a.py").write_text(
        function("fits", 80)
        + "@decorated\n@twice\n"
        + function("decorators_not_counted", 80)
        + "async "
        + function("one_over", 81)
        + "class C:\n"
        + function("method_over", 81, indent="    ")
        + "def parent():\n"
        + function("nested_fits", 79, indent="    ")  # 80 lines with its parent's def
    )
    assert long_functions(tmp_path / "pkg") == [
        "pkg/a.py:163 one_over (81 lines)",
        "pkg/a.py:245 method_over (81 lines)",
    ]
    (folder / "b.py").write_text("def parent():\n" + function("nested", 80, indent="    "))
    assert long_functions(tmp_path / "pkg")[2:] == ["pkg/b.py:1 parent (81 lines)"]
