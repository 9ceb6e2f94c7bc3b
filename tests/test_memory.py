import pytest
import torch

from ffnlab.core.memory import (
    MAX_LAYERS,
    check_layer_count,
    optimizer_bytes,
    saved_bytes,
    tensor_bytes,
    training_memory,
)


def test_saved_bytes_counts_each_tensor_once_without_weights():
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    # x @ w keeps x and w; tanh keeps its output; the product with x keeps x again and tanh's output
    n = saved_bytes(lambda: torch.tanh(x @ w) * x, exclude=[w])
    assert n == 4 * 8 * 4 * 2  # x and tanh(x @ w), once each
    assert saved_bytes(lambda: torch.tanh(x @ w) * x) == n + w.numel() * 4


def test_tied_weights_and_optimizer_state_are_counted_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    assert tensor_bytes([emb.weight, head.weight]) == 10 * 4 * 4
    opt = torch.optim.AdamW(model.parameters())
    assert optimizer_bytes(opt) == 0  # no state before the first step
    model["head"](model["emb"](torch.tensor([1, 2]))).sum().backward()
    opt.step()
    # AdamW: exp_avg and exp_avg_sq of the parameter's size, plus a scalar step
    assert optimizer_bytes(opt) == 2 * 10 * 4 * 4 + opt.state[emb.weight]["step"].element_size()
    mem = training_memory(model, opt, saved=100)
    assert mem["param_bytes"] == mem["grad_bytes"] == 160
    assert mem["train_mem_bytes"] == 160 + 160 + optimizer_bytes(opt) + 100


# ---- absurd depths: refused by arithmetic, before a layer is built ---------------------------------


@pytest.fixture
def blocks_built(monkeypatch):
    """The Transformer blocks built while a test runs (each construction counted), to tell sizing by arithmetic
    from building every layer on the meta device, which took minutes for 10^8 layers."""
    from ffnlab.core import model

    built = []
    real = model.Block.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(model.Block, "__init__", counted)
    return built


DEEP = "100000000"


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--n-layers", DEEP],
        ["compare", "--preset", "smoke", "--n-layers", DEEP],
        ["compare", "--preset", "smoke", "--depth-axis", f"2,{DEEP}"],
        ["export", "--ffn", "gelu", "--model", "small", "--n-layers", DEEP, "--out", "{tmp}/x.onnx"],
        ["deploy", "--ffn", "gelu", "--n-layers", DEEP],
        ["list", "--schedule", "gelu", "--layers", DEEP],
        ["list", "--schedule", f"gelu*{DEEP}"],
    ],
)
def test_an_absurd_depth_is_refused_at_once_in_one_line(run_cli, tmp_path, argv, blocks_built):
    code, out, err = run_cli(*[a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "100,000,000, more than the 10,000 layers" in err and "use 1 to 10,000 layers" in err, err
    assert blocks_built == []  # refused by its number, before any layer is built
    assert list(tmp_path.iterdir()) == []


def test_a_deep_model_under_the_cap_is_sized_by_arithmetic_before_it_is_built(run_cli, blocks_built):
    # 9,000 layers of d_model 1024: about 10^11 parameters, 1.6 PB to train
    code, _, err = run_cli("train", "--n-layers", 9000, "--d-model", 1024, "--heads", 8, "--steps", 1)
    assert code == 2 and err.count("\n") == 1 and "9000 layers of d_model 1024" in err and "need at least" in err, err
    assert 0 < len(blocks_built) <= 2  # one block of each variant counts the rest: not 9,000 built


def test_check_layer_count_names_the_range():
    check_layer_count(MAX_LAYERS)
    with pytest.raises(
        ValueError, match=r"^--layers is 10,001, more than the 10,000 layers .*; use 1 to 10,000 layers$"
    ):
        check_layer_count(MAX_LAYERS + 1, "--layers")
    with pytest.raises(ValueError, match="n_layers must be positive, got 0"):
        check_layer_count(0)
