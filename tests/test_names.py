from dataclasses import dataclass

import pytest

from ffnlab._util.names import by_name, chosen, closest, normalize


@dataclass(frozen=True)
class Spec:
    name: str
    value: int = 0


def test_a_registry_keeps_its_order_and_refuses_a_name_twice():
    table = by_name([Spec("b"), Spec("a")])
    assert list(table) == ["b", "a"] and table["a"] == Spec("a")
    with pytest.raises(ValueError, match="'a' is registered twice"):
        by_name([Spec("a"), Spec("b"), Spec("a", 1)])


def test_chosen_names_are_checked_against_the_valid_ones():
    assert chosen(" FP32, bf16,fp32 ", ("fp32", "bf16"), "dtype") == ["fp32", "bf16"]
    assert chosen(["bf16"], ("fp32", "bf16"), "dtype") == ["bf16"]
    with pytest.raises(ValueError, match=r"unknown dtype 'fp31' \(did you mean 'fp32'\?\); valid: fp32, bf16"):
        chosen("fp31", ("fp32", "bf16"), "dtype")
    with pytest.raises(ValueError, match="no dtype given; valid: fp32, bf16"):
        chosen(" , ", ("fp32", "bf16"), "dtype")


def test_normal_form_and_did_you_mean():
    assert normalize("  Swi-GLU ") == "swi_glu"
    assert closest("swiglue", ["swiglu", "gelu"]) == " (did you mean 'swiglu'?)" and closest("zzz", ["gelu"]) == ""
