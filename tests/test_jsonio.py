import json
import math

import numpy as np
import pytest

from ffnlab._util.jsonio import json_safe


def test_non_finite_floats_become_strings():
    assert json_safe([math.inf, -math.inf, math.nan, 1.5]) == ["inf", "-inf", "nan", 1.5]


def test_numpy_scalars_become_python_values():
    out = json_safe({"f": np.float32(1.5), "i": np.int64(3), "b": np.bool_(True), "nan": np.float64("nan")})
    assert out == {"f": 1.5, "i": 3, "b": True, "nan": "nan"}
    assert [type(v) for v in out.values()] == [float, int, bool, str]


def test_tuples_become_lists_so_a_round_trip_compares_equal():
    obj = {"a": (1, (2.0, math.inf)), "b": [{"c": -math.inf}], "d": None, "e": "x"}
    safe = json_safe(obj)
    assert safe == {"a": [1, [2.0, "inf"]], "b": [{"c": "-inf"}], "d": None, "e": "x"}
    text = json.dumps(safe, allow_nan=False)
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"literal {c}")) == safe


def test_input_is_not_modified():
    obj = {"a": [math.nan]}
    json_safe(obj)
    assert math.isnan(obj["a"][0])


def test_field_problem_names_the_first_field_of_the_wrong_kind():
    from dataclasses import dataclass
    from typing import Literal

    from ffnlab._util.jsonio import field_problem

    @dataclass
    class Record:
        status: Literal["finished", "diverged"]
        loss: float | None
        steps: int
        learned: dict

    assert field_problem({"status": "finished", "loss": 1, "steps": 2.0, "learned": {}, "other": "x"}, Record) is None
    assert field_problem({"loss": None, "learned": None}, Record) is None  # null and missing: an older record
    assert field_problem({"steps": "3"}, Record) == "'steps' is a string, not a number"
    assert field_problem({"learned": "oops"}, Record) == "'learned' is a string, not an object"
    assert field_problem({"status": ["finished"]}, Record) == "'status' is an array, not a string"


def test_strict_dumps_writes_no_literal_that_other_parsers_reject():
    from ffnlab._util.jsonio import strict_dumps

    assert strict_dumps({"x": math.inf, "y": [math.nan, 1.0]}, indent=None) == '{"x": "inf", "y": ["nan", 1.0]}'


def test_json_problem_descends_into_records_lists_and_dicts():
    from dataclasses import dataclass, field

    from ffnlab._util.jsonio import json_problem

    @dataclass
    class Inner:
        seconds: float
        count: int
        note: str | None = None

    @dataclass
    class Outer:
        inner: Inner | None
        items: list[Inner]
        by_seed: dict[int, float] = field(default_factory=dict)

    good = {"inner": None, "items": [{"seconds": "nan", "count": 2}], "by_seed": {"0": 1.5}, "extra": [1]}
    assert json_problem(good, Outer) is None  # null where allowed, json_safe's 'nan', a key it does not declare
    for value, problem in [
        ([], "it is an array, not an object"),
        ({"items": []}, "it has no 'inner'"),
        ({"inner": {"seconds": "fast", "count": 1}, "items": []}, "inner.seconds is a string, not a number"),
        ({"inner": None, "items": [{"seconds": 1, "count": 1.5}]}, "items[0].count is a number, not an integer"),
        ({"inner": None, "items": [{"seconds": 1, "count": True}]}, "items[0].count is a boolean, not an integer"),
        ({"inner": None, "items": ["x"]}, "items[0] is a string, not an object"),
        ({"inner": None, "items": [{"seconds": None, "count": 1}]}, "items[0].seconds is null, not a number"),
        ({"inner": None, "items": [], "by_seed": {"a": 1.0}}, "by_seed has the key 'a', not an integer"),
        ({"inner": None, "items": [], "by_seed": {"1": []}}, "by_seed['1'] is an array, not a number"),
    ]:
        assert json_problem(value, Outer) == problem, value
