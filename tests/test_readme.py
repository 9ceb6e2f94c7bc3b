import re
from pathlib import Path

from ffnlab.core.ffn import build_ffn

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_python_example_runs():
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    assert len(code.strip().splitlines()) <= 6
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["loss"].ndim == 0 and scope["model"].blocks[0].ffn.spec.name == "swiglu"


def test_readme_variant_table_matches_the_code():
    rows = re.findall(r"^\| (\w+) \| yes \| [^|]+ \| (\d+) \| ([\d,]+) \|$", README, re.M)
    assert len(rows) == 6
    for name, d_ff, params in rows:
        ffn = build_ffn(name, 512)
        assert ffn.d_ff == int(d_ff) and sum(p.numel() for p in ffn.parameters()) == int(params.replace(",", ""))


def test_readme_names_the_two_commands():
    assert "./run.sh" in README and "./test.sh" in README
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "bash test.sh" in ci
