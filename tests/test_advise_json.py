"""`advise --json` pinned for every kind of evidence and alternative: the published, pretrained, checks and measured
advice (one cell, several cells, a deployment, scaling fits, a LoRA study), compared key by key and value by value
with tests/data/advise_json.json. The reasons and rules are left out (their sentences are the rules' text, tested
in test_advise.py and test_advise_rules.py); their place among the keys is kept.

Regenerate the file after a deliberate change of the JSON with `python -m tests.test_advise_json`."""

import json
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ffnlab.study.advise import Situation, advise, from_lora
from ffnlab.study.advise.advice import Advice
from ffnlab.study.advise.from_checkpoint import advise_pretrained
from ffnlab.study.records import StudyScaling
from ffnlab.study.scaling import FitCurve, ScalingFits, VariantFit
from tests.test_advise import fabricated_store
from tests.test_advise_deploy import RELU_INT8_WINS, TRAINED, base_rows, with_deployment

PINNED = Path(__file__).parent / "data" / "advise_json.json"
LOSSES = {"relu": 2.0, "gelu": 1.95, "swiglu": 1.9, "geglu": 1.85}  # geglu diverges, swiglu is over the budget
PARAMS = {"swiglu": 20_000}


def measured(tmp_path: Path, _: pytest.MonkeyPatch) -> Advice:
    """One cell: a diverged variant and one over the parameter budget excluded, the others' numbers."""
    store = fabricated_store(tmp_path / "s.db", LOSSES, params=PARAMS, diverged=("geglu",))
    return advise(store=store, params_budget="18k")


def measured_cells(tmp_path: Path, _: pytest.MonkeyPatch) -> Advice:
    """Two cells (a depth axis), each advised on apart; the gaps across cells in the evidence."""
    store = fabricated_store(tmp_path / "s.db", {"relu": 2.0, "swiglu": 1.9})
    fabricated_store(store, {"relu": 2.1, "swiglu": 1.95}, n_layers=2)
    return advise(store=store)


def measured_deployment(tmp_path: Path, _: pytest.MonkeyPatch) -> Advice:
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), base_rows() + RELU_INT8_WINS)
    return advise(store=store, hardware="cpu")


def variant_fit(E: float, multiplier: float) -> VariantFit:
    """A power law through three points, its curve and intervals (fabricated)."""
    points = [(1e9, E + 0.4, 0), (2e9, E + 0.3, 0), (4e9, E + 0.2, 0)]
    curve = FitCurve([1e9, 4e9], [E + 0.4, E + 0.2], [E + 0.35, None], [E + 0.45, None])
    return VariantFit(E, 50.0, 0.3, True, "", [E - 0.1, E + 0.1], [0.2, 0.4], 1, 3, 0, 0, points, curve, 0.01, None,
                      multiplier, [multiplier * 0.8, None])  # fmt: skip


def measured_scaling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Advice:
    """The one summary advise reads, with compute multipliers (the fits fabricated, not fitted)."""
    import ffnlab.study.summary as summary

    fits = ScalingFits("relu", 0.95, 100, "log", [1e9, 4e9], 4e9,
                       {"relu": variant_fit(1.5, 1.0), "swiglu": variant_fit(1.4, 1.6)},
                       ["swiglu reaches relu's loss with 1/1.60 of the compute"])  # fmt: skip
    summarize = summary.summarize_study
    monkeypatch.setattr(
        summary,
        "summarize_study",
        lambda *a, **k: replace(summarize(*a, **k), scaling=StudyScaling({"width": [8, 16]}, "final_val_loss", fits)),
    )
    return advise(store=fabricated_store(tmp_path / "s.db", {"relu": 2.0, "swiglu": 1.9}))


def measured_lora(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Advice:
    """A LoRA study of the checkpoint, measured first: its evidence with the checkpoint's beside it."""
    store = fabricated_store(tmp_path / "s.db", {"gelu": 1.95, "relu": 2.0})
    monkeypatch.setattr(from_lora, "lora_folder", lambda _: "bert-folder")
    situation = Situation(stage="peft", pretrained="bert-base-uncased").resolved()
    return from_lora.advise_lora(advise_pretrained("bert-base-uncased", situation), store, situation)


CASES: dict[str, Callable[[Path, pytest.MonkeyPatch], Advice]] = {
    "published": lambda *_: advise(model_size="350M"),
    "published first attempt": lambda *_: advise(),
    # gated FFNs need about 14.6 GiB to train at 350M, dense ones 14.3 GiB: the budget rules out the former only
    "published over a budget": lambda *_: advise(model_size="350M", seq_len=2048, memory_budget="14.45GiB"),
    "published at a smaller width": lambda *_: advise(hardware="gpu-16gb", model_size="1B"),
    "pretrained": lambda *_: advise(pretrained="gpt2"),
    "pretrained for inference": lambda *_: advise(
        situation="inference", pretrained="bert-base-uncased", hardware="cpu"
    ),
    "pretrained with a deployment": lambda tmp_path, _: advise(
        situation="inference",
        pretrained="bert-base-uncased",
        deploy="edge",
        store=with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), base_rows() + RELU_INT8_WINS),
    ),
    "checks": lambda *_: advise(symptom="nan"),
    "measured": measured,
    "measured cells": measured_cells,
    "measured deployment": measured_deployment,
    "measured scaling": measured_scaling,
    "measured lora": measured_lora,
}


def pinned(out: dict[str, Any]) -> dict[str, Any]:
    """What the file pins of an advice's JSON: every key in order, every value but the reasons' and rules'."""
    kept = {k: v for k, v in out.items() if k not in ("reasons", "rules")}
    if out.get("cells") is not None:
        kept["cells"] = [pinned(cell) for cell in out["cells"]]
    return {"keys": list(out), **kept}


def pinned_json(advice: Advice, tmp_path: Path) -> Any:
    """`pinned` as JSON reads it back, the test's folder written TMP."""
    return json.loads(json.dumps(pinned(advice.to_json())).replace(str(tmp_path), "TMP"))


def differences(actual: Any, expected: Any, where: str = "") -> list[str]:
    """Where `actual` differs from `expected`: keys in another order, other values; floats equal to 1e-9 (their
    last digits may differ between machines' numerical libraries)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        if list(actual) != list(expected):
            return [f"{where or '/'}: keys {list(actual)} != {list(expected)}"]
        return [d for k in expected for d in differences(actual[k], expected[k], f"{where}/{k}")]
    if isinstance(expected, list) and isinstance(actual, list) and len(actual) == len(expected):
        return [d for i, (a, e) in enumerate(zip(actual, expected)) for d in differences(a, e, f"{where}/{i}")]
    numbers = all(isinstance(x, float | int) and not isinstance(x, bool) for x in (actual, expected))
    if numbers and type(actual) is type(expected) and math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15):
        return []
    return [] if actual == expected and type(actual) is type(expected) else [f"{where}: {actual!r} != {expected!r}"]


@pytest.mark.parametrize("case", CASES)
def test_advise_json_is_the_pinned_json(case, tmp_path, monkeypatch):
    expected = json.loads(PINNED.read_text())[case]
    assert differences(pinned_json(CASES[case](tmp_path, monkeypatch), tmp_path), expected) == []


def test_a_difference_from_the_pin_is_found_and_where():
    pin = {"a": [1.0, {"b": "x"}], "c": None}
    assert differences(json.loads(json.dumps(pin)), pin) == []
    assert differences({"a": [1.0 + 1e-12, {"b": "x"}], "c": None}, pin) == []  # a last digit
    assert differences({"a": [1.1, {"b": "y"}], "c": None}, pin) == ["/a/0: 1.1 != 1.0", "/a/1/b: 'y' != 'x'"]
    assert differences({"c": None, "a": [1.0, {"b": "x"}]}, pin) == ["/: keys ['c', 'a'] != ['a', 'c']"]
    assert differences({"a": [1, {"b": "x"}], "c": 0}, pin) == ["/a/0: 1 != 1.0", "/c: 0 != None"]


def test_the_pinned_file_holds_every_case_and_every_kind():
    pins = json.loads(PINNED.read_text())
    assert list(pins) == list(CASES)
    kinds = {pin["evidence"].get("kind") for pin in pins.values()}
    assert kinds == {"published", "pretrained", "checks", "measured"}
    shapes = {tuple(sorted(a)) for pin in pins.values() for a in pin["alternatives"]}
    assert {s for s in shapes if "excluded" in s and "published" not in s} == {("excluded", "ffn")}
    assert (
        {("ffn", "why_not")} <= shapes and any("summary" in s for s in shapes) and any("published" in s for s in shapes)
    )


def regenerate() -> None:
    """Write tests/data/advise_json.json from what advise prints now."""
    pins = {}
    for case, make in CASES.items():
        with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as monkeypatch:
            pins[case] = pinned_json(make(Path(folder), monkeypatch), Path(folder))
    PINNED.write_text(json.dumps(pins, indent=1) + "\n")


if __name__ == "__main__":
    regenerate()
    sys.exit(0)
