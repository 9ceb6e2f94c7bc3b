"""The registries as typed rows (ffnlab.core.catalog): what `ffnlab list` and `list --schedule` print."""

from dataclasses import asdict

import pytest

from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.catalog import ActivationRow, FFNRow, format_list, format_schedule, list_rows, schedule_sizes
from ffnlab.core.ffn import FFNS, build_ffn

ROWS = list_rows(64)


def test_every_registry_entry_is_one_typed_row_in_registry_order():
    assert [r.name for r in ROWS if isinstance(r, ActivationRow)] == list(ACTIVATIONS)
    assert [r.name for r in ROWS if isinstance(r, FFNRow)] == list(FFNS)
    assert len(ROWS) == len(ACTIVATIONS) + len(FFNS)


def test_list_json_keeps_its_documented_keys_in_order():
    activation = next(r for r in ROWS if isinstance(r, ActivationRow))
    ffn = next(r for r in ROWS if isinstance(r, FFNRow))
    assert list(asdict(activation)) == ["name", "kind", "gated", "aliases", "same_as", "formula", "paper",
                                        "flops_per_element", "learnable", "family", "experimental",
                                        "scope"]  # fmt: skip
    assert list(asdict(ffn)) == ["name", "kind", "gated", "aliases", "formula", "paper", "d_model", "d_ff",
                                 "params", "flops_per_token"]  # fmt: skip
    assert asdict(activation)["kind"] == "activation" and asdict(ffn)["kind"] == "ffn"


@pytest.mark.parametrize("name", list(FFNS))
def test_an_ffn_row_counts_the_ffn_it_names(name):
    row = next(r for r in ROWS if isinstance(r, FFNRow) and r.name == name)
    ffn = build_ffn(name, 64)
    assert (row.d_model, row.d_ff, row.gated) == (64, ffn.d_ff, ffn.spec.gated)
    assert row.params == sum(p.numel() for p in ffn.parameters())


def test_an_alias_row_names_its_canonical_entry_in_the_table():
    aliased = next(r for r in ROWS if isinstance(r, ActivationRow) and r.same_as)
    line = next(line for line in format_list(ROWS, 64).splitlines() if line.startswith(aliased.name + " "))
    assert f"(= {aliased.same_as}, Hugging Face name)" in line


def test_experimental_activations_are_marked_in_the_table_and_the_json():
    rows = {r.name: r for r in ROWS if isinstance(r, ActivationRow)}
    assert {n for n, r in rows.items() if r.experimental} == {n for n, s in ACTIVATIONS.items() if s.experimental}
    assert {"quantile", "energy_gated", "split_gelu_tanh", "exponential"} <= {
        n for n, r in rows.items() if r.experimental
    }
    assert (rows["quantile"].scope, rows["split_gelu_tanh"].scope, rows["gelu"].scope) == (
        "batch",
        "channel",
        "element",
    )
    lines = format_list(ROWS, 64).splitlines()
    assert lines[0].split()[:4] == ["activation", "learnable", "experimental", "formula"]
    cells = {line.split()[0]: line.split()[1:3] for line in lines[1 : len(rows) + 1]}
    assert cells["quantile"] == ["no", "yes"] and cells["gelu"] == ["no", "no"] and cells["agelu"] == ["yes", "yes"]
    assert next(line for line in lines if line.startswith("quantile ")).endswith("(reads the batch)")


def test_a_schedule_is_sized_layer_by_layer():
    sizes = schedule_sizes("GELU*1+swiglu*1", 512)
    assert sizes.schedule == "gelu*1+swiglu*1" and sizes.n_layers == 2  # as many layers as it names
    assert [(layer.layer, layer.variant, layer.d_ff, layer.params) for layer in sizes.layers] == [
        (1, "gelu", 2048, 2_099_712),  # the README's Variants table at d_model 512
        (2, "swiglu", 1376, 2_113_536),
    ]
    assert sizes.params == 2_099_712 + 2_113_536 and sizes.dense_params == 2 * 2_099_712
    assert sizes.vs_dense == pytest.approx(sizes.params / sizes.dense_params - 1)
    assert format_schedule(sizes).splitlines()[-1].startswith("dense 4x, 2 layers")
    assert schedule_sizes("gelu", 512, n_layers=3).n_layers == 3
