"""INT8 with torchao and ONNX Runtime (ffnlab.tools.quantize): every scheme on a tiny Transformer, QAT's prepare and
convert."""

import copy

import pytest
import torch
import torch.nn.functional as F

from ffnlab.core.ffn import GatedFFN
from ffnlab.core.model import ModelConfig, Transformer
from ffnlab.tools import quantize as qz

pytest.importorskip("torchao")

VOCAB, CONTEXT = 64, 16
# |loss(int8) - loss(fp32)| of the tiny untrained models below, in nats: measured at most 3.6e-4 over gelu, swiglu
# and relu and every scheme (torchao 0.18, onnxruntime 1.32); the bound leaves a factor of 5
LOSS_BOUND = 2e-3


def tiny(ffn: str) -> Transformer:
    return Transformer(
        ModelConfig(ffn=ffn, d_model=32, n_layers=1, n_heads=2, context=CONTEXT, vocab_size=VOCAB)
    ).eval()


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (8, CONTEXT), generator=gen), torch.randint(0, VOCAB, (8, CONTEXT), generator=gen)


@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
@pytest.mark.parametrize("scheme", [s for s, spec in qz.SCHEMES.items() if spec.backend == "torch"])
def test_torch_schemes_keep_the_loss_within_the_bound(ffn, scheme):
    model, (x, y) = tiny(ffn), batch()
    quantized = qz.quantize_model(model, scheme)
    with torch.no_grad():
        base, loss = model(x, y)[1].item(), quantized(x, y)[1].item()
    assert abs(loss - base) < LOSS_BOUND
    assert type(model.blocks[0].attn.qkv.weight) is torch.nn.Parameter  # the original is untouched
    assert type(quantized.blocks[0].attn.qkv.weight).__name__ == "Int8Tensor"
    if ffn == "swiglu":
        assert quantized.blocks[0].ffn.fused is False and isinstance(quantized.blocks[0].ffn, GatedFFN)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny gelu model and its fp32 ONNX file (exported once: the exporter takes seconds)."""
    from ffnlab.tools.export import export_onnx

    model, path = tiny("gelu"), tmp_path_factory.mktemp("onnx") / "m.onnx"
    export_onnx(model, batch()[0], path, atol=1e-4, rtol=1e-4)
    return model, path


@pytest.mark.slow  # the first exports the model (seconds)
@pytest.mark.parametrize("scheme", [s for s, spec in qz.SCHEMES.items() if spec.backend == "onnx"])
def test_onnx_schemes_keep_the_loss_within_the_bound(tmp_path, exported, scheme):
    import onnxruntime as ort

    (model, source), (x, y) = exported, batch()
    qz.quantize_onnx(source, tmp_path / "q.onnx", scheme, [batch(s)[0] for s in (1, 2)])
    assert [p.name for p in tmp_path.iterdir()] == ["q.onnx"]  # no temporary file left
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    logits = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    with torch.no_grad():
        base = model(x, y)[1].item()
    assert abs(F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).item() - base) < LOSS_BOUND


def test_static_quantisation_without_calibration_writes_nothing(tmp_path, exported):
    with pytest.raises(ValueError, match="calibration"):
        qz.quantize_onnx(exported[1], tmp_path / "q.onnx", "ort-int8-static")
    assert list(tmp_path.iterdir()) == []


def test_schemes_by_name_and_backend():
    assert qz.get_scheme("INT8_dynamic").name == "int8-dynamic"
    with pytest.raises(ValueError, match="did you mean 'int8-weight'.*valid: int8-dynamic, int8-weight, ort-int8"):
        qz.get_scheme("int8-weigth")
    with pytest.raises(ValueError, match="quantises ONNX files"):
        qz.quantize_model(tiny("relu"), "ort-int8-dynamic")
    with pytest.raises(ValueError, match="quantises PyTorch modules"):
        qz.quantize_onnx("a.onnx", "b.onnx", "int8-weight")


def test_qat_fake_quantises_in_place_and_converts_to_the_ptq_model():
    model, (x, y) = tiny("swiglu"), batch()
    params, keys = list(model.parameters()), list(model.state_dict())
    qz.prepare_qat(model)
    assert qz.is_fake_quantized(model) and model.blocks[0].ffn.fused is False
    assert list(model.parameters()) == params and list(model.state_dict()) == keys  # an optimizer and checkpoints go on
    model.train()
    _, loss = model(x, y)
    loss.backward()
    assert model.blocks[0].ffn.w_gate.weight.grad.abs().sum() > 0  # gradients pass the rounding
    model.eval()
    with torch.no_grad():
        fake = model(x, y)[0]
        plain = Transformer(model.cfg).eval()
        plain.load_state_dict(model.state_dict())
        ptq = qz.quantize_model(plain, "int8-dynamic")(x, y)[0]
        converted = qz.convert_qat(model)(x, y)[0]
    assert not qz.is_fake_quantized(model)
    torch.testing.assert_close(converted, ptq, rtol=0, atol=0)  # weights saved from a QAT run convert the same
    torch.testing.assert_close(converted, fake, rtol=1e-4, atol=1e-4)  # what QAT trained is what runs


def test_a_missing_torchao_is_named(monkeypatch):
    monkeypatch.setattr(qz, "torchao_version", lambda: None)
    with pytest.raises(ValueError, match=r"pip install 'ffnlab\[deploy\]'"):
        qz.quantize_model(tiny("relu"), "int8-weight")


def test_qat_on_a_model_with_conv1d_layers_is_refused_before_training(tmp_path):
    """GPT-2's attention (Conv1D, not nn.Linear) stayed in float under qat_from while the run said QAT."""
    import json

    from ffnlab.run.config import TrainConfig
    from ffnlab.run.train import prepare
    from ffnlab.tools.hf import build_hf_model

    gpt2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2}
    with pytest.raises(ValueError, match=r"Conv1D hf\.transformer\.h\.0\.attn\.c_attn and 3 more would train"):
        qz.check_qat_model(build_hf_model(gpt2, "gelu_new", vocab_size=50))
    qz.check_qat_model(Transformer(ModelConfig(vocab_size=50, context=16, n_layers=1, n_heads=2, d_model=32)))
    (tmp_path / "gpt2.json").write_text(json.dumps(gpt2))
    with pytest.raises(ValueError, match="qat_from fake-quantises nn.Linear layers"):
        prepare(TrainConfig(model=ModelConfig(ffn="gelu_new", context=16), hf_config=str(tmp_path / "gpt2.json"),
                            max_steps=2, batch_size=4, qat_from=0.5))  # fmt: skip


@pytest.mark.parametrize("scheme", [s for s, spec in qz.SCHEMES.items() if spec.backend == "torch"])
def test_gpt2s_conv1d_matrices_are_quantised_too(scheme):
    """torchao quantises nn.Linear: a GPT-2 model's int8 copy kept its attention (Conv1D) in float, so deploy's
    int8 rows of it measured a model mostly in fp32."""
    from ffnlab.tools.hf import build_hf_model

    gpt2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2}
    model, (x, y) = build_hf_model(gpt2, "gelu_new", vocab_size=VOCAB, context=CONTEXT).eval(), batch()
    quantized = qz.quantize_model(model, scheme)
    assert not [n for n, m in quantized.named_modules() if type(m).__name__ == "Conv1D"]
    attn = quantized.hf.transformer.h[0].attn
    assert type(attn.c_attn.weight).__name__ == type(attn.c_proj.weight).__name__ == "Int8Tensor"
    assert type(model.hf.transformer.h[0].attn.c_attn).__name__ == "Conv1D"  # the original is untouched
    with torch.no_grad():
        plain = qz.conv1d_as_linear(copy.deepcopy(model))  # the same function before quantising
        # the same product through another GEMM layout (x W^T^T against addmm(x, W)): equal up to fp32 rounding
        torch.testing.assert_close(plain(x, y)[0], model(x, y)[0], rtol=1e-4, atol=1e-5)
        assert abs(quantized(x, y)[1].item() - model(x, y)[1].item()) < LOSS_BOUND
