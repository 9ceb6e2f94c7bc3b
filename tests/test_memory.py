import torch

from ffnlab.core.memory import optimizer_bytes, saved_bytes, tensor_bytes, training_memory


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
