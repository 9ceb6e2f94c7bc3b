import html
import math
import shutil
import tempfile
from dataclasses import replace

import pytest

from ffnlab.report import load_study, render_html, render_markdown, report_data, seed_band, write_report
from ffnlab.store import Store
from ffnlab.sweep import Study, preset_config, run_id, run_study, summarize, weights_path
from ffnlab.train import TrainConfig

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
            config = {**r["config"], "data": f"corpus/{EVIL}.txt"}
            rid = run_id(TrainConfig.from_dict(config))
            dst.claim(rid, config)
            dst.add_metrics(rid, src.metrics(r["id"]))
            dst.add_events(rid, src.events(r["id"]))
            dst.finish(rid, r["status"], r["result"])
    return path


def test_seed_band_is_mean_and_t_interval():
    band = seed_band([{1: 1.0, 2: 2.0}, {1: 3.0, 2: 4.0, 3: 5.0}])
    assert band["x"] == [1, 2, 3] and band["mean"] == [2.0, 3.0, 5.0] and band["n"] == 2
    half = 12.706204736174707 * math.sqrt(2) / math.sqrt(2)  # t_{0.975,1} * std / sqrt(n)
    assert band["low"][0] == pytest.approx(2.0 - half) and band["high"][1] == pytest.approx(3.0 + half)
    assert band["low"][2] == band["high"][2] == 5.0  # one seed: no band


def test_load_study_reconstructs_the_sweep(smoke_store):
    study, configs, others = load_study(smoke_store)
    assert study.variants == VARIANTS and study.seeds == 2 and study.baseline == "relu" and study.axes == {}
    assert others == 0 and len(configs) == 4
    assert load_study(smoke_store, baseline="swiglu")[0].baseline == "swiglu"
    with pytest.raises(ValueError, match="baseline 'gelu' was not run in this study; valid: relu, swiglu"):
        load_study(smoke_store, baseline="gelu")


def test_sweep_saves_final_weights(smoke_store):
    with Store(smoke_store, create=False) as s:
        ids = [r["id"] for r in s.runs(status="finished")]
    assert len(ids) == 4 and all(weights_path(smoke_store, rid).stat().st_size > 0 for rid in ids)


def test_report_files(report, smoke_store):
    page = report["html"].read_text()
    names = sorted(p.name for p in report["figures"])
    assert names == sorted(["val_loss.png", "final.png", "loss_vs_time.png", "grad_norm.png", "behaviour.png",
                            "attention.png", "activations.png"])
    for p in report["figures"]:
        assert p.read_bytes().startswith(PNG_MAGIC)
    # self-contained: every image inline, nothing fetched, no script
    assert page.count('src="data:image/png;base64,') == len(names)
    for needle in ('src="http', "href=\"http", "<script", "@import", "url("):
        assert needle not in page
    md = report["markdown"].read_text()
    assert all(f"| {v} |" in md for v in VARIANTS) and "figures/val_loss.png" in md
    study, runs, _ = load_study(smoke_store)  # the verdict shown is the store's own summary
    assert html.escape(summarize(study, smoke_store, runs)["verdict"]) in page


def test_report_data_rows_match_the_store(smoke_store):
    data = report_data(smoke_store, attention=False)
    cell = data["cells"][0]
    with Store(smoke_store, create=False) as s:
        finals = {}
        for r in s.runs(status="finished"):
            finals.setdefault(r["result"]["ffn"], []).append(r["result"]["final_val_loss"])
    for row in cell["rows"]:
        assert row["mean"] == pytest.approx(sum(finals[row["ffn"]]) / 2)
        assert sorted(row["values"]) == sorted(finals[row["ffn"]])
        assert cell["curves"][row["ffn"]]["mean"][-1] == pytest.approx(row["mean"])  # last eval is the final one
    assert data["settings"]["model"]["d_model"] == 32


def test_escapes_a_variant_name_in_a_rendered_summary(smoke_store):
    data = report_data(smoke_store, attention=False)
    data["variants"] = [EVIL if v == "swiglu" else v for v in data["variants"]]
    for cell in data["cells"]:
        for row in cell["rows"]:
            row["ffn"] = EVIL if row["ffn"] == "swiglu" else row["ffn"]
    page = render_html(data, {})
    assert "<script" not in page and html.escape(EVIL) in page
    md = render_markdown(data, [])
    assert "<script" not in md and html.escape(EVIL, quote=False) in md


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
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={tempfile.mkdtemp()}",
                "--window-size=1200,900"):
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
        driver.get(report["html"].as_uri())
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        images = driver.execute_script("return Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        assert len(images) == len(report["figures"]) and all(done and width > 0 for done, width in images)
        ranked = driver.find_elements(By.XPATH, "//h2[@id='ranking']/following-sibling::table[1]/tbody/tr/td[2]")
        assert sorted(td.text for td in ranked) == sorted(VARIANTS)

        driver.get(evil["html"].as_uri())
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
    cases = [(["--store", tmp_path / "missing.db"], "no run store at"),
             (["--store", tmp_path / "pending.db"], "holds no finished runs"),
             (["--store", smoke_store, "--out", tmp_path / "file" / "report"], "cannot write the report to"),
             (["--store", smoke_store, "--out", tmp_path / "x", "--layer", 5], "attention layer 5 is out of range")]
    for argv, needle in cases:
        code, out, err = run_cli("report", *argv)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "x" / "report.html").exists()


@pytest.mark.slow
def test_compare_writes_the_report_unless_no_report(run_cli, tmp_path):
    argv = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", 2, "--steps", 5, "--eval-every", 5,
            "--store", tmp_path / "runs" / "s.db"]
    code, out, err = run_cli(*argv, "--no-report")
    assert code == 0, err
    assert not (tmp_path / "runs" / "report" / "report.html").exists()
    code, out, err = run_cli(*argv)  # every run already finished: only the report is new
    assert code == 0, err
    assert (tmp_path / "runs" / "report" / "report.html").exists()
    assert (tmp_path / "runs" / "report" / "summary.md").exists()
    assert f"report: {tmp_path / 'runs' / 'report' / 'report.html'}" in out
