import errno
import html
import json
import math
import os
import shutil
import tempfile
from dataclasses import astuple, replace
from pathlib import Path

import numpy as np
import pytest

from ffnlab.run.presets import preset_config
from ffnlab.run.train import TrainConfig
from ffnlab.study.deployment import save_deployment
from ffnlab.study.execute import run_study, weights_path
from ffnlab.study.load import load_study
from ffnlab.study.plan import Study, run_id
from ffnlab.study.records import StudyScaling
from ffnlab.study.render import deploy_table, md_escape, render_html, render_markdown
from ffnlab.study.report import (
    AttentionMaps,
    NumericsFile,
    attention_stats,
    report_data,
    seed_band,
    write_report,
)
from ffnlab.study.stats import SeedNoise
from ffnlab.study.store import Store
from ffnlab.study.summary import summarize_study
from ffnlab.tools import deploy as dp
from tests.conftest import run_result

VARIANTS = ["relu", "swiglu"]
EVIL = "<script>alert(1)</script>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory):
    """One short smoke sweep (2 variants x 2 seeds, about 10 s) shared by every report test."""
    path = tmp_path_factory.mktemp("sweep") / "ffnlab.db"
    base = replace(preset_config("smoke"), max_steps=15, eval_every=5)
    run_study(Study(variants=VARIANTS, seeds=2, base=base), path, quiet=True)
    return path


@pytest.fixture(scope="session")
def report(smoke_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return write_report(smoke_store, out)


@pytest.fixture(scope="session")
def evil_store(smoke_store, tmp_path_factory):
    """A copy of the sweep whose data path is markup: every run re-stored (Store API) under the new config."""
    path = tmp_path_factory.mktemp("evil") / "ffnlab.db"
    with Store(smoke_store, create=False) as src, Store(path) as dst:
        for r in src.runs():
            config = {**r.config, "data": f"corpus/{EVIL}.txt"}
            rid = run_id(TrainConfig.from_dict(config))
            dst.claim(rid, config)
            dst.add_metrics(rid, src.metrics(r.id))
            dst.add_events(rid, src.events(r.id))
            dst.finish(rid, r.result)
    return path


def test_seed_band_is_mean_and_t_interval():
    band = seed_band([{1: 1.0, 2: 2.0}, {1: 3.0, 2: 4.0, 3: 5.0}])
    assert band.x == [1, 2, 3] and band.mean == [2.0, 3.0, 5.0] and band.n == 2
    half = 12.706204736174707 * math.sqrt(2) / math.sqrt(2)  # t_{0.975,1} * std / sqrt(n)
    assert band.low[0] == pytest.approx(2.0 - half) and band.high[1] == pytest.approx(3.0 + half)
    assert band.low[2] == band.high[2] == 5.0  # one seed: no band


def test_load_study_reconstructs_the_sweep(smoke_store):
    study, configs, others = load_study(smoke_store)
    assert study.variants == VARIANTS and study.seeds == 2 and study.baseline == "relu" and study.axes == {}
    assert others == 0 and len(configs) == 4
    assert load_study(smoke_store, baseline="swiglu")[0].baseline == "swiglu"
    with pytest.raises(ValueError, match="baseline 'gelu' was not run in this study; valid: relu, swiglu"):
        load_study(smoke_store, baseline="gelu")


def test_sweep_saves_final_weights(smoke_store):
    with Store(smoke_store, create=False) as s:
        ids = [r.id for r in s.runs(status="finished")]
    assert len(ids) == 4 and all(weights_path(smoke_store, rid).stat().st_size > 0 for rid in ids)


def test_report_files(report, smoke_store):
    page = report.html.read_text()
    names = sorted(p.name for p in report.figures)
    assert names == sorted(
        [
            "val_loss.png",
            "final.png",
            "loss_vs_time.png",
            "grad_norm.png",
            "behaviour.png",
            "attention.png",
            "activations.png",
        ]
    )
    for p in report.figures:
        assert p.read_bytes().startswith(PNG_MAGIC)
    # self-contained: every image inline, nothing fetched, no script
    assert page.count('src="data:image/png;base64,') == len(names)
    for needle in ('src="http', 'href="http', "<script", "@import", "url("):
        assert needle not in page
    md = report.markdown.read_text()
    assert all(f"| {v} |" in md for v in VARIANTS) and "figures/val_loss.png" in md
    assert "entropy (nats)" in page and "weights &lt; 0.01" in page  # the attention numbers beside the maps
    study, runs, _ = load_study(smoke_store)  # the verdict shown is the store's own summary
    assert html.escape(summarize_study(study, smoke_store, runs).cells[0].verdict) in page


def test_the_report_shows_the_summary_it_is_given_and_summarises_nothing_again(smoke_store, tmp_path, monkeypatch):
    """compare hands its summary to the report, which then summarises the store no second time."""
    from ffnlab.study import compare as compare_module
    from ffnlab.study import report as report_module
    from ffnlab.study.compare import compare

    study, runs, _ = load_study(smoke_store)
    summary = summarize_study(study, smoke_store, runs)
    summary.cells[0].verdict = "the verdict compare computed"
    monkeypatch.setattr(report_module, "summarize", lambda *a, **k: pytest.fail("the report summarised again"))
    data = report_data(smoke_store, study, runs, attention=False, summary=summary)
    assert data.cells[0].cell.verdict == "the verdict compare computed"
    handed = {}
    monkeypatch.setattr(compare_module, "run_study", lambda *a, **k: summary)
    monkeypatch.setattr(compare_module, "write_report", lambda store, **k: handed.update(k))
    assert compare(study, tmp_path / "s.db").summary is summary and handed["summary"] is summary


def test_report_data_rows_match_the_store(smoke_store):
    data = report_data(smoke_store, attention=False)
    view = data.cells[0]
    with Store(smoke_store, create=False) as s:
        finals = {}
        for r in s.runs(status="finished"):
            finals.setdefault(r.result.ffn, []).append(r.result.val.loss)
    for row in view.cell.variants:
        assert row.mean == pytest.approx(sum(finals[row.ffn]) / 2)
        assert sorted(row.values.values()) == sorted(finals[row.ffn])
        assert view.curves[row.ffn].mean[-1] == pytest.approx(row.mean)  # last eval is the final one
    assert data.settings.model["d_model"] == 32


def test_escapes_a_variant_name_in_a_rendered_summary(smoke_store):
    data = report_data(smoke_store, attention=False)
    data.variants = [EVIL if v == "swiglu" else v for v in data.variants]
    for view in data.cells:
        for row in view.cell.variants:
            row.ffn = EVIL if row.ffn == "swiglu" else row.ffn
    page = render_html(data, {})
    assert "<script" not in page and html.escape(EVIL) in page
    md = render_markdown(data, [])
    assert "<script" not in md and html.escape(EVIL, quote=False) in md


def test_every_branch_of_the_page_renders_and_escapes_what_the_store_holds(smoke_store):
    """The parts of the page no study of the suite reaches (a noise floor, other studies in the store, a
    scaling study without a fit yet, attention without its statistics, a numerics.json with an error or
    no results) render, and the store's text in them is escaped, in the page and in the summary."""
    data = report_data(smoke_store, attention=False)
    data.store = f"runs/{EVIL}.db"
    data.other_studies = 2
    data.scaling = StudyScaling(scale={"width": [8, 16]}, metric="final_val_loss", fits=None, error=EVIL)
    data.numerics = NumericsFile(error=EVIL)
    view = data.cells[0]
    view.cell.verdict = EVIL
    view.cell.noise_floor = SeedNoise(n=3, mean=3.3, std=0.01, range=0.02, min=3.29, max=3.31, diverged=0)
    view.attention = AttentionMaps(
        layer=0, maps={"relu": np.zeros((1, 8, 8))}, stats={}, seeds={"relu": 0}, input=EVIL, text=EVIL
    )
    page = render_html(data, {"attention.png": PNG_MAGIC})
    assert "<script" not in page and page.count(html.escape(EVIL)) >= 6
    for text in (
        "Noise floor: relu over 3 seeds has std 0.0100 and range 0.0200.",
        "The store holds 2 other studies",
        f"No fit yet: {html.escape(EVIL)}",
        "Attention weights at layer 0 of each variant's trained model (relu seed 0)",
        f"<pre>{html.escape(EVIL)}</pre>",
        f'<p class="note">{html.escape(EVIL)}</p>',  # the numerics error
        f"<code>ffnlab report --store runs/{html.escape(EVIL)}.db</code>",
    ):
        assert text in page
    assert "entropy (nats)" not in page  # maps without statistics: no table
    data.numerics = NumericsFile({"results": []})
    assert "numerics.json holds no results." in render_html(data, {})
    md = render_markdown(data, [])
    assert "<script" not in md and f"**Verdict:** {html.escape(EVIL, quote=False)}" in md


def test_a_name_a_template_misspells_is_an_error_not_an_empty_string(smoke_store):
    from jinja2 import UndefinedError

    from ffnlab.study.render import HTML_TEMPLATES, MARKDOWN_TEMPLATES

    data = report_data(smoke_store, attention=False)
    for templates in (HTML_TEMPLATES, MARKDOWN_TEMPLATES):
        with pytest.raises(UndefinedError, match="verdit"):
            templates.from_string("{{ data.cells[0].cell.verdit }}").render(data=data)


def test_the_templates_ship_with_the_package():
    """Every template is package data in pyproject.toml, so an installed ffnlab can render its report."""
    import fnmatch
    import tomllib

    from ffnlab.study import render

    root = Path(render.__file__).parents[2]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    study = Path(render.__file__).parent
    templates = [p.relative_to(study).as_posix() for p in (study / "templates").iterdir()]
    assert {"templates/report.html.j2", "templates/summary.md.j2"} <= set(templates)
    for name in templates:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in package_data["ffnlab.study"]), name


def test_markdown_shows_a_schedule_as_written():
    assert md_escape("gelu*2+swiglu*2") == "gelu\\*2+swiglu\\*2"  # not gelu<em>2+swiglu</em>2


def chromium():
    """A headless Chromium driver, or skip when Chromium or its driver is not installed."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("Chromium or chromedriver not found (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp()}",
        "--window-size=1300,900",  # the page must fit this width: wide tables scroll inside their own box
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.mark.slow
def test_report_opens_in_chromium(report, evil_store, tmp_path):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    evil = write_report(evil_store, tmp_path / "evil")
    driver = chromium()
    try:
        driver.get(report.html.as_uri())
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        images = driver.execute_script("return Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        assert len(images) == len(report.figures) and all(done and width > 0 for done, width in images)
        ranked = driver.find_elements(By.XPATH, "//h2[@id='ranking']/following-sibling::div[1]/table/tbody/tr/td[2]")
        assert sorted(td.text for td in ranked) == sorted(VARIANTS)
        page_width = "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        scroll, client = driver.execute_script(page_width)
        assert scroll <= client, f"the page scrolls sideways: {scroll} px of content in a {client} px window"

        driver.get(evil.html.as_uri())
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert  # noqa: B018 (the property raises when no alert is open)
        assert driver.execute_script("return document.scripts.length") == 0
        assert EVIL in driver.find_element(By.TAG_NAME, "body").text  # shown as text
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()


def test_report_cli_and_bad_input(run_cli, smoke_store, tmp_path):
    code, out, err = run_cli("report", "--store", smoke_store, "--out", tmp_path / "r", "--baseline", "swiglu")
    assert code == 0, err
    assert (tmp_path / "r" / "report.html").exists() and "report:" in out
    assert "Δ vs swiglu" in (tmp_path / "r" / "report.html").read_text()

    with Store(tmp_path / "pending.db") as s:
        s.claim("x", {"model": {"ffn": "relu"}})
    (tmp_path / "file").write_text("")
    with Store(tmp_path / "stale.db") as s:  # an id that is not its config's hash: another ffnlab version
        s.claim("0123456789abcdef", preset_config("smoke").to_dict())
        s.finish("0123456789abcdef", run_result(final_val_loss=1.0))
    cases = [
        (["--store", tmp_path / "stale.db"], "stored by an ffnlab whose run configs differ"),
        (["--store", tmp_path / "missing.db"], "no run store at"),
        (["--store", tmp_path / "pending.db"], "holds no finished runs"),
        (["--store", smoke_store, "--out", tmp_path / "file" / "report"], "cannot write the report to"),
        (["--store", smoke_store, "--out", tmp_path / "x", "--layer", 5], "attention layer 5 is out of range"),
    ]
    for argv, needle in cases:
        code, out, err = run_cli("report", *argv)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "x" / "report.html").exists()


def test_devices_and_fifos_inside_the_report_folder_are_refused_not_replaced(smoke_store, tmp_path, run_cli):
    """The output-path rule was checked on the folder only: the report replaced a device at report.html, a FIFO
    at summary.md and a device at figures/val_loss.png, and exited 0."""
    import stat

    out = tmp_path / "r"
    (out / "figures").mkdir(parents=True)
    for planted in (out / "report.html", out / "figures" / "val_loss.png"):
        planted.symlink_to("/dev/null")
        code, _, err = run_cli("report", "--store", smoke_store, "--out", out)
        assert code == 2 and f"{planted} is a character device" in err and len(err.splitlines()) == 1
        planted.unlink()
    os.mkfifo(out / "summary.md")
    code, _, err = run_cli("report", "--store", smoke_store, "--out", out)
    assert code == 2 and "summary.md is a FIFO" in err
    assert stat.S_ISFIFO(os.lstat(out / "summary.md").st_mode) and sorted(os.listdir(out)) == ["figures", "summary.md"]


@pytest.mark.slow
def test_compare_writes_the_report_unless_no_report(run_cli, tmp_path):
    argv = [
        "compare",
        "--preset",
        "smoke",
        "--variants",
        "relu,gelu",
        "--seeds",
        2,
        "--steps",
        5,
        "--eval-every",
        5,
        "--store",
        tmp_path / "runs" / "s.db",
    ]
    code, out, err = run_cli(*argv, "--no-report")
    assert code == 0, err
    assert not (tmp_path / "runs" / "report" / "report.html").exists()
    code, out, err = run_cli(*argv)  # every run already finished: only the report is new
    assert code == 0, err
    assert (tmp_path / "runs" / "report" / "report.html").exists()
    assert (tmp_path / "runs" / "report" / "summary.md").exists()
    assert f"report: {tmp_path / 'runs' / 'report' / 'report.html'}" in out


def fabricated_study(path, depths=(1, 2), variants=("relu", "gelu"), seeds=2, lr=None):
    """Finished runs with made-up curves (Store API), one per depth x variant x seed."""
    base = preset_config("smoke")
    if lr:
        base = replace(base, lr=lr)
    with Store(path) as store:
        for depth in depths:
            for i, ffn in enumerate(variants):
                for seed in range(seeds):
                    cfg = replace(base, seed=seed, model=replace(base.model, ffn=ffn, n_layers=depth))
                    rid = run_id(cfg)
                    store.claim(rid, cfg.to_dict())
                    final = 3.0 - 0.1 * i - 0.05 * depth + 0.01 * seed
                    store.add_metrics(
                        rid,
                        [(s, "grad_norm", 1.0 + 0.1 * s) for s in range(1, 11)]
                        + [
                            (5, "val_loss", final + 0.5),
                            (10, "val_loss", final),
                            (5, "val_time", 0.5),
                            (10, "val_time", 1.0),
                        ],
                    )
                    store.add_events(rid, [{"step": 3, "kind": "grad_spike", "value": 9.0, "median": 1.0}])
                    behaviour = {
                        f"blocks.{b}.ffn": {
                            "dead_frac": 0.1,
                            "zero_frac": 0.5 if ffn == "relu" else 0.0,
                            "inactive_frac": 0.5,
                        }
                        for b in range(depth)
                    }
                    result = run_result(
                        ffn=ffn,
                        seed=seed,
                        final_val_loss=final,
                        train_mem_bytes=2**29,
                        n_grad_spikes=1,
                        behaviour=behaviour,
                        dead_frac=0.1,
                    )
                    store.finish(rid, result)
    return path


def test_report_reconstructs_axes_and_reads_numerics(tmp_path):
    from ffnlab.tools.numerics import run_numerics, to_json

    store = tmp_path / "s.db"
    fabricated_study(store, depths=(1,), lr=1e-3)  # an older study with other settings
    fabricated_study(store)
    study, configs, others = load_study(store)
    assert study.axes == {"depth": [1, 2]} and study.variants == ["relu", "gelu"] and others == 1
    assert len(configs) == 8
    (tmp_path / "numerics.json").write_text(to_json(run_numerics(["relu"], ("fp32",), points=1001, claims=False)))
    paths = write_report(store, tmp_path / "out")
    names = {p.name for p in paths.figures}
    assert {"val_loss_1.png", "val_loss_2.png", "grad_norm_2.png", "activations.png"} <= names
    assert not any(n.startswith("attention") for n in names)  # made-up runs have no weights
    page = paths.html.read_text()
    assert "depth=1" in page and "depth=2" in page and "1 other study" in page
    assert "no saved weights" in page and 'id="numerics"' in page
    data = report_data(store, attention=False)
    assert [v.cell.variants[0].ffn for v in data.cells] == ["gelu", "gelu"]  # lower made-up loss ranks first
    assert data.cells[1].behaviour["relu"]["blocks.1.ffn"]["zero_frac"] == 0.5
    assert sum(row.metrics["grad_spikes"] for row in data.cells[0].cell.variants) == 4


def test_a_report_on_a_full_disk_is_one_line_exit_2_and_leaves_the_folder_as_it_was(run_cli, tmp_path, monkeypatch):
    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    code, _, err = run_cli("report", "--store", store, "--out", tmp_path / "old")
    assert code == 0, err
    before = {p: p.read_bytes() for p in (tmp_path / "old").rglob("*") if p.is_file()}
    write_text = Path.write_text

    def full_disk(self, *args, **kwargs):  # figures written, then the disk is full
        if "summary.md" in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    for out in (tmp_path / "old", tmp_path / "new"):
        code, _, err = run_cli("report", "--store", store, "--out", out)
        assert code == 2 and err.startswith(f"ffnlab: error: no space left on device writing {out}")
        assert err.count("\n") == 1
    assert {p: p.read_bytes() for p in (tmp_path / "old").rglob("*") if p.is_file()} == before
    assert sorted(os.listdir(tmp_path)) == ["old", "s.db"]  # was new/figures/val_loss.png, and exit 1


def test_attention_stats_on_known_matrices():
    T = 8
    uniform = np.full((2, T, T), 1 / T)
    assert astuple(attention_stats(uniform, causal=False)) == pytest.approx((math.log(T), math.log(T), 0.0))
    one_hot = np.broadcast_to(np.eye(T), (2, T, T))
    assert astuple(attention_stats(one_hot, causal=False)) == pytest.approx((0.0, math.log(T), (T - 1) / T))
    causal_uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # query i: 1/(i+1) on keys 0..i
    stats = attention_stats(causal_uniform[None], causal=True)
    assert stats.entropy == pytest.approx(stats.uniform_entropy) and stats.sparsity == 0.0
    assert stats.entropy == pytest.approx(np.log(np.arange(1, T + 1)).mean())
    assert attention_stats(np.eye(T)[None], causal=True).sparsity == pytest.approx(28 / 36)  # 36 visible, 8 ones


# ---- the deployment section: deploy.json beside the store (ffnlab deploy --store) ----------------


def deployed(ffn, target, median_ms, val_loss, delta, qat_from=None):
    """A measured DeployRow: batch-1 quartiles 0.04 ms below and 0.08 ms above the median, a throughput batch of
    4 x 8 tokens, 1 MiB of weights, the paired delta's interval +-0.002."""
    ms = median_ms / 1e3
    latency = dp.Latency(1, 8, ms, ms - 4e-5, ms + 8e-5, ms - 5e-5, ms + 1e-4, 20, 3, 2)
    throughput = dp.Latency(4, 8, 2 * ms, 2 * ms, 2 * ms, 2 * ms, 2 * ms, 20, 3, 2)
    reference = "fp32 eager of the plain runs" if qat_from else "fp32 eager of the same runs"
    quality = dp.Quality([0, 1], val_loss, None, None, None, dp.Delta(2, delta, delta - 0.002, delta + 0.002, 0.04),
                         None, None, reference, target.runtime, val_losses={0: val_loss, 1: val_loss})  # fmt: skip
    return dp.DeployRow(ffn, target.precision, target.runtime, target.scheme, latency, throughput, 2**20, 3 * 2**20,
                        2**20, 0.1, 2**20 / 12.5e9, None, quality=quality, qat_from=qat_from)  # fmt: skip


def deployment_result():
    """Five measured rows (three on the front, one a QAT model, one of a variant the study did not run) and one with
    its reason (named as markup), the QAT summary, the settings and the machine."""
    rows = [
        deployed("relu", dp.Target("fp32", "eager"), 2.15, 3.2, 0.0),
        deployed("relu", dp.Target("int8", "eager", "int8-dynamic"), 1.25, 3.205, 0.005),
        deployed("relu", dp.Target("int8", "onnxruntime", "ort-int8-static"), 3.05, 3.21, 0.01),
        deployed("swiglu", dp.Target("fp32", "eager"), 4.55, 3.1, 0.0),  # a variant the study does not hold
        deployed("gelu", dp.Target("int8", "eager", "int8-dynamic"), 1.35, 3.15, 0.003, qat_from=0.5),
        dp.unmeasured("relu", dp.Target("bf16", "eager"), f"no native bf16 on {EVIL}"),
    ]
    dp.mark_front(rows)
    assert [r.on_front for r in rows] == [False, True, False, True, True, None]
    rows[4].quality.vs_ptq = dp.Delta(2, -0.027, -0.03, -0.024, 0.01)
    rows[2].peak_mem_bytes, rows[2].notes = None, ["peak memory: ONNX Runtime reports none"]
    qat = dp.QatSummary("gelu", 0.5, dp.Delta(2, 0.03, 0.028, 0.032, 0.01), dp.Delta(2, 0.003, 0.001, 0.005, 0.04),
                        0.9, "qat_from 0.5: QAT recovers 90% of PTQ's increase")  # fmt: skip
    setup = {"batch": 4, "seq": 8, "repeats": 20, "warmup": 3, "threads": 2, "device": "cpu", "copy_gbs": 12.5,
             "seeds": [0, 1], "quality_batches": 2, "quality_batch_size": 8}  # fmt: skip
    env = {"cpu": "Test CPU 9000", "cpu_flags": ["avx512_vnni"], "torch": "2.9", "torchao": "0.18",
           "onnxruntime": "1.32", "onnx": "1.19", "python": "3.11"}  # fmt: skip
    model = {"d_model": 32, "n_layers": 1, "context": 8, "ffn": ["relu", "gelu", "swiglu"]}
    return dp.DeployResult("store s.db", model, setup, env, rows, [qat])


def test_the_deployment_section_shows_every_row_the_front_the_reasons_and_the_figure(tmp_path):
    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    save_deployment(store, deployment_result())
    paths = write_report(store, tmp_path / "out")
    page, md = paths.html.read_text(), paths.markdown.read_text()
    assert 'id="deployment"' in page and 'href="#deployment"' in page and "### Deployment" in md
    for latency, delta in [
        ("2.15 [2.11-2.23]", "+0.0000 [-0.0020, +0.0020]"),
        ("1.25 [1.21-1.33]", "+0.0050 [+0.0030, +0.0070]"),
        ("3.05 [3.01-3.13]", "+0.0100 [+0.0080, +0.0120]"),
        ("4.55 [4.51-4.63]", "+0.0000 [-0.0020, +0.0020]"),
        ("1.35 [1.31-1.43]", "+0.0030 [+0.0010, +0.0050]"),
    ]:
        assert f"<td>{latency}</td>" in page and f"<td>{delta}</td>" in page
        assert f"| {latency} |" in md and f"| {delta} |" in md
    assert page.count('<td class="better">yes</td>') == 3 and page.count("<td>no</td>") == 2
    assert f"not measured: no native bf16 on {html.escape(EVIL)}" in page
    assert f"not measured: no native bf16 on {html.escape(EVIL, quote=False)}" in md
    assert "gelu QAT 0.5" in page and "QAT gelu: qat_from 0.5: QAT recovers 90% of PTQ&#39;s increase" in page
    assert "vs their int8-dynamic PTQ -0.0270 [-0.0300, -0.0240]" in page
    assert "<td>1 / - / 1</td>" in page and (
        "Left unmeasured: peak memory: ONNX Runtime reports none (int8/onnxruntime/ort-int8-static)." in page
    )
    fastest = "relu: int8/eager/int8-dynamic at 1.25 ms (14.9x its roofline of 0.0839 ms)"  # 1 MiB at 12.5 GB/s
    assert fastest in page and "gelu QAT 0.5: int8/eager/int8-dynamic at 1.35 ms" in page and fastest in md
    for text in ("seeds 0, 1", "2 of 8 sequences", "2 threads", "batch 4, 8 tokens", "Test CPU 9000", "avx512_vnni",
                 "torchao 0.18", "onnxruntime 1.32", "copy bandwidth 12.5 GB/s"):  # fmt: skip
        assert text in page and text in md
    assert "<script" not in page and "<script" not in md
    assert html.escape(EVIL) in page and html.escape(EVIL, quote=False) in md
    figure = tmp_path / "out" / "figures" / "deployment.png"
    assert figure in paths.figures and figure.read_bytes().startswith(PNG_MAGIC)
    assert page.count('src="data:image/png;base64,') == len(paths.figures) and "figures/deployment.png" in md


def damaged_deploy_json(folder, form):
    """deploy.json in `folder` written damaged in one of DAMAGED's forms."""
    path = folder / "deploy.json"
    if form == "a folder":
        path.mkdir()
        return
    edits = {
        "a latency that is text": lambda d: d["rows"][0]["latency"].update(median_s="fast"),
        "a negative latency": lambda d: d["rows"][0]["latency"].update(median_s=-1),
        "a null environment": lambda d: d.update(environment=None),
        "a row that is a string": lambda d: d["rows"].__setitem__(0, "x"),
        "precision fp64": lambda d: d["rows"][0].update(precision="fp64"),
        "an unknown variant": lambda d: d["rows"][0].update(ffn="nosuch"),
        "an unknown int8 scheme": lambda d: d["rows"][1].update(scheme="int4-magic"),
        "cpu flags that are a number": lambda d: d["environment"].update(cpu_flags=7),
    }
    texts = {"garbage": b"garbage", "an array": b"[]", "not UTF-8": b'{"a": "\xff"}', "empty": b"",
             "100k nested arrays": b"[" * 100_000}  # fmt: skip
    if form in texts:
        path.write_bytes(texts[form])
        return
    d = deployment_result().to_json()
    edits[form](d)
    path.write_text(json.dumps(d))


# each damaged form, and what the one line says of it
DAMAGED = {
    "garbage": "is not JSON",
    "an array": "it is an array, not an object",
    "not UTF-8": "is not UTF-8 text",
    "empty": "is empty",
    "a folder": "is a folder",
    "100k nested arrays": "nests deeper than JSON's parser goes",
    "a row that is a string": "rows[0] is a string, not an object",
    "a latency that is text": "rows[0].latency.median_s is a string, not a number",
    "a negative latency": "rows[0].latency.median_s is -1, not above 0",
    "a null environment": "environment is null, not an object",
    "precision fp64": "rows[0].precision is 'fp64', which ffnlab does not deploy; valid: fp32, bf16, fp16, int8",
    "an unknown variant": "rows[0].ffn: unknown FFN variant 'nosuch'",
    "an unknown int8 scheme": 'rows[1].scheme is "int4-magic", not a scheme of int8 on eager; valid: int8-dynamic',
    "cpu flags that are a number": "environment.cpu_flags is a number, not an array",
}


def test_no_deploy_json_leaves_the_section_out(tmp_path):
    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    data = report_data(store, attention=False)
    assert data.deployment is None and data.deployment_error is None  # none measured
    paths = write_report(store, tmp_path / "out")
    assert 'id="deployment"' not in paths.html.read_text() and "Deployment" not in paths.markdown.read_text()


@pytest.mark.parametrize("form", DAMAGED)
def test_a_damaged_deploy_json_is_said_to_be_damaged_where_its_section_was(tmp_path, form):
    """A damaged deploy.json read as none left the section out silently, or failed the report (100k nested
    arrays); now the section says what is wrong with the file, and the rest stands."""
    import markupsafe

    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    damaged_deploy_json(tmp_path, form)
    data = report_data(store, attention=False)
    assert data.deployment is None
    assert data.deployment_error.startswith(f"the deployment file {tmp_path / 'deploy.json'}")
    assert DAMAGED[form] in data.deployment_error and "damaged" in data.deployment_error
    assert "\n" not in data.deployment_error
    paths = write_report(store, tmp_path / "out")
    page, md = paths.html.read_text(), paths.markdown.read_text()
    assert 'id="deployment"' in page and 'href="#deployment"' in page and "### Deployment" in md
    assert str(markupsafe.escape(data.deployment_error)) in page and "the file is damaged" in md
    assert "Ranking" in md or "ranking" in page  # the rest of the report stands
    assert not any(p.name == "deployment.png" for p in paths.figures)


def test_the_report_command_says_on_the_terminal_which_file_it_could_not_show(tmp_path, run_cli):
    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    damaged_deploy_json(tmp_path, next(iter(DAMAGED)))
    code, out, err = run_cli("report", "--store", store)
    assert code == 0 and "report:" in out
    (line,) = err.splitlines()
    assert line.startswith(f"ffnlab: warning: the deployment file {tmp_path / 'deploy.json'}") and "damaged" in line


def test_a_deploy_json_that_the_section_cannot_show_is_said_to_be_damaged(tmp_path, monkeypatch):
    """What the checks let through but the section cannot build is the same one line, not a failed report."""
    from ffnlab.study import report as report_module

    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    save_deployment(store, deployment_result())
    monkeypatch.setattr(report_module, "deploy_machine", lambda result: f"{'copy_gbs':.3g}")  # a ValueError
    _, error = report_module.shown_deployment(store)
    assert error.startswith(f"the deployment file {tmp_path / 'deploy.json'} cannot be shown (ValueError: ")
    monkeypatch.setattr(report_module, "deploy_machine", lambda result: 1 / 0)
    _, error = report_module.shown_deployment(store)
    assert error == (
        f"the deployment file {tmp_path / 'deploy.json'} cannot be shown (ZeroDivisionError: division by zero); "
        f"the file is damaged: measure it again with `ffnlab deploy --store {store}`, or remove it"
    )


def test_text_in_a_stores_metric_is_one_error_naming_the_store_and_the_run(tmp_path):
    """SQLite keeps text in a REAL column: the report failed with a TypeError inside its curves."""
    import sqlite3

    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    with sqlite3.connect(store) as db:
        (rid,) = db.execute("SELECT run_id FROM metrics WHERE name = 'val_loss' LIMIT 1").fetchone()
        db.execute("UPDATE metrics SET value = 'fast' WHERE run_id = ? AND name = 'val_loss' AND step = 10", (rid,))
    with pytest.raises(ValueError, match=f"run store {store}: run {rid}'s metric val_loss at step 10 is text 'fast'"):
        write_report(store, tmp_path / "out")


def test_the_report_and_advise_read_a_store_they_cannot_write(tmp_path, monkeypatch):
    """On a read-only file system, or in a read-only or immutable file, they failed: "unable to open database file",
    "attempt to write a readonly database". Now every store they read is opened to read only (Store(read_only=True)):
    here SQLite can open it only as immutable, as on a read-only file system, and no reader opens it to write."""
    from ffnlab.study.advise import advise
    from tests.test_store import cannot_open_read_only

    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    tried = cannot_open_read_only(monkeypatch)
    monkeypatch.setattr(Store, "_open", lambda self: pytest.fail(f"{self.path} was opened to be written"))
    paths = write_report(store, tmp_path / "out")
    assert "gelu" in paths.markdown.read_text() and "immutable=1" in tried
    assert advise(store=store, hardware="cpu").recommendation == "gelu"


def test_a_classifiers_deployment_shows_its_accuracy_and_the_summary_a_short_table():
    result = deployment_result()
    quality = result.rows[0].quality
    quality.val_acc, quality.val_acc_delta = 0.8125, dp.Delta(2, -0.0125, -0.02, -0.005, 0.03)
    table = deploy_table(result)
    acc = table.head.index("val acc")
    assert table.rows[0][acc : acc + 2] == ["0.812", "-0.013 [-0.020, -0.005]"] and table.rows[1][acc] == "-"
    front = table.head.index("Pareto front")
    assert table.marks == {(i, front): "better" for i in (1, 3, 4)} and table.head[-1] == "note"  # the QAT row's
    short = deploy_table(result, short=True)
    assert not {"val acc", "weights / peak / disk MB", "note"} & set(short.head)
    assert short.rows[5][:3] == ["relu", f"bf16/eager not measured: no native bf16 on {EVIL}", "-"]


@pytest.mark.slow
def test_a_page_with_the_deployment_section_fits_the_window(tmp_path):
    store = fabricated_study(tmp_path / "s.db", depths=(1,))
    save_deployment(store, deployment_result())
    paths = write_report(store, tmp_path / "out")
    driver = chromium()
    try:
        driver.get(paths.html.as_uri())
        scroll, client = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert scroll <= client, f"the page scrolls sideways: {scroll} px of content in a {client} px window"
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()


def test_a_taggers_deployment_shows_span_f1_beside_loss(tmp_path):
    """deploy --store of a token task measured span F1 per row, which the report's table left out: the edge
    claim (relu faster, its F1 lower, a quantised gelu recovering both) is read off one table."""
    from ffnlab.study.render import deploy_table

    result = deployment_result()
    for row, (f1, delta) in zip(result.rows, [(0.81, 0.0), (0.80, -0.01), (0.79, -0.02), (0.83, 0.0), (0.82, -0.005)]):
        row.quality.val_f1, row.quality.val_f1_delta = f1, dp.Delta(2, delta, delta - 0.004, delta + 0.004, 0.2)
    for short in (False, True):
        table = deploy_table(result, short=short)
        col = table.head.index("val span F1")
        assert table.head[col + 1] == "Δ F1 [95% CI]"
        assert [row[col] for row in table.rows[:2]] == ["0.810", "0.800"] and table.rows[1][col + 1].startswith(
            "-0.010"
        )
        assert table.rows[-1][col] == "-"  # the row that was not measured
    assert "val span F1" not in deploy_table(deployment_result()).head  # a language model's: no F1 column
