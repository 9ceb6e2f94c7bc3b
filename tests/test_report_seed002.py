"""The report's section of seed 002's four columns (perplexity, stability events, peak memory, step time),
as ffnlab measured them."""

import html
import re

import pytest

from ffnlab.study.load import load_study
from ffnlab.study.metrics import metric
from ffnlab.study.render import render_html
from ffnlab.study.report import report_data
from ffnlab.study.summary import summarize_study
from ffnlab.study.table import seed002_table
from tests.test_report import EVIL, fabricated_study

SEED002 = ("relu", "gelu", "silu", "geglu")  # its four variants, as gpt2-small's preset names them
# in the metrics' declared order; peak memory on the CPU is the training memory counted from the tensors
COLUMNS = ("ppl", "step_time_s", "train_mem_bytes", "stability_events")


def section(page: str) -> str:
    """The page's seed 002 section: from its heading to the next."""
    return re.search(r'<h2 id="seed002">.*?(?=<h2 )', page, re.S).group(0)


def cells(text: str) -> list[list[str]]:
    """The rows of the first table in `text`, its header first, each cell's text unescaped."""
    rows = re.findall(r"<tr>(.*?)</tr>", text.split("</table>")[0], re.S)
    return [[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)] for row in rows]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fabricated_study(tmp_path_factory.mktemp("seed002") / "s.db", depths=(1,), variants=SEED002)


def test_the_report_shows_seed_002s_four_columns_as_the_summary_holds_them(store):
    data = report_data(store, attention=False)
    page = section(render_html(data, {}))
    head, *rows = cells(page)
    assert head == ["ffn", *(metric(name).heading("lm") for name in COLUMNS)]
    study, runs, _ = load_study(store)
    variants = {r["ffn"]: r for r in summarize_study(study, store, runs).to_json()["variants"]}  # compare --json
    assert sorted(row[0] for row in rows) == sorted(SEED002)
    for ffn, *values in rows:
        assert values == [metric(name).format(variants[ffn][name]) for name in COLUMNS], ffn
    assert variants["relu"]["stability_events"] == 2  # a gradient spike in each of its two seeds
    assert "Seed 002" in page and "50,000 steps" in page and "ffnlab/study/published.py" in page


def test_on_a_gpu_the_peak_memory_column_is_the_cuda_allocators_and_says_so(store):
    cell = report_data(store, attention=False).cells[0].cell
    for i, row in enumerate(cell.variants):
        row.metrics["cuda_peak_bytes"] = (i + 1) * 2**30
    table = seed002_table(cell)
    assert table.head[3] == "CUDA peak" and "training memory" not in table.head
    assert [row[3] for row in table.rows] == [metric("cuda_peak_bytes").format((i + 1) * 2**30) for i in range(4)]


def test_the_section_escapes_what_the_store_holds_and_is_left_out_of_other_tasks(store):
    data = report_data(store, attention=False)
    data.cells[0].cell.variants[0].ffn = EVIL
    page = render_html(data, {})
    assert "<script" not in page and html.escape(EVIL) in section(page)
    data.settings = type(data.settings)(**{**data.settings.to_json(), "task": "cls"})
    assert 'id="seed002"' not in render_html(data, {})
