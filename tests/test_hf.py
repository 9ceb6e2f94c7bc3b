import json
import os
import pty
import select
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    BertConfig,
    Gemma2Config,
    GemmaConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    MT5Config,
    Qwen2Config,
    Qwen3Config,
    RobertaConfig,
    T5Config,
)
from transformers.activations import ACT2FN  # noqa: E402

from ffnlab.core.activations import get_activation  # noqa: E402
from ffnlab.core.ffn import FFNS, GATED, DenseFFN, GatedFFN, get_ffn_spec  # noqa: E402
from ffnlab.core.model import param_count  # noqa: E402
from ffnlab.tools.hf import (  # noqa: E402
    FAMILIES,
    GATED_MODEL_TYPES,
    HF_ACTS,
    QKV_NAMES,
    SUB_CONFIGS,
    ActivationConfigWarning,
    PretrainedWeightsWarning,
    UnsupportedModelError,
    build_hf_model,
    canonical,
    config_activation,
    ffn_modules,
    ffnlab_to_hf,
    hf_to_ffnlab,
    load_swapped,
    local_config,
    model_activation,
    model_family,
    restore_ffn,
    save_unswapped,
    swap_attn_act,
    swap_ffn,
    swap_width,
)
from tests.conftest import not_a_file, within  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
V = 100
DECODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=V,
)
ENCODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=V)
T5 = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, vocab_size=V)

# name -> (config factory, the model's own FFN as an ffnlab variant)
CONFIGS = {
    "llama": (lambda: LlamaConfig(**DECODER), "swiglu"),
    "mistral": (lambda: MistralConfig(**DECODER), "swiglu"),
    "qwen2": (lambda: Qwen2Config(**DECODER), "swiglu"),
    "qwen3": (lambda: Qwen3Config(**DECODER, head_dim=8), "swiglu"),
    "gemma": (lambda: GemmaConfig(**DECODER, head_dim=8), "geglu_tanh"),
    "gemma2": (lambda: Gemma2Config(**DECODER, head_dim=8), "geglu_tanh"),
    "gpt2": (
        lambda: GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=V, bos_token_id=0, eos_token_id=0),
        "gelu_new",
    ),
    "bert": (lambda: BertConfig(**ENCODER), "gelu"),
    "roberta": (lambda: RobertaConfig(**ENCODER, pad_token_id=1, bos_token_id=0, eos_token_id=2), "gelu"),
    "t5": (lambda: T5Config(**T5, feed_forward_proj="relu"), "relu"),
    "t5-gated-gelu": (lambda: T5Config(**T5, feed_forward_proj="gated-gelu"), "geglu_tanh"),
    "mt5": (lambda: MT5Config(**T5), "geglu_tanh"),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny models: a second thread only adds sync overhead, badly so on a shared, loaded machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name, seed=0, dropout=None):
    """Tiny randomly initialised model with an LM (or MLM, or seq2seq) head."""
    config = CONFIGS[name][0]()
    if dropout is not None:
        config.dropout_rate = dropout
    torch.manual_seed(seed)
    if config.model_type in ("t5", "mt5"):
        return AutoModelForSeq2SeqLM.from_config(config)
    if config.model_type in ("bert", "roberta"):
        return AutoModelForMaskedLM.from_config(config)
    return AutoModelForCausalLM.from_config(config)


def batch(seed=1):
    return torch.randint(3, V, (2, 8), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    if model.config.model_type in ("t5", "mt5"):
        return model(input_ids=x, decoder_input_ids=x).logits
    return model(input_ids=x).logits


def ffn_params(model):
    return sum(p.numel() for m in ffn_modules(model) for p in m.parameters())


# ---- swapping ---------------------------------------------------------------------------------


def test_every_family_is_tested():
    tested = {CONFIGS[n][0]().model_type for n in CONFIGS}
    assert tested == {t for f in FAMILIES.values() for t in f.model_types}


@pytest.mark.parametrize("name", CONFIGS)
def test_swap_to_own_ffn_keeps_logits_bit_identical(name, monkeypatch):
    monkeypatch.delenv("FFNLAB_EAGER", raising=False)  # the default path, fused kernels allowed
    model = build(name).eval()
    x = batch()
    with torch.no_grad():
        before = logits(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PretrainedWeightsWarning)  # no warning: nothing was re-initialised
        replaced = swap_ffn(model, CONFIGS[name][1])
    assert len(ffn_modules(model)) == (4 if "t5" in name else 2)
    assert replaced and all(isinstance(m, nn.Module) for m in replaced.values())
    with torch.no_grad():
        after = logits(model, x)
    assert torch.equal(before, after)
    restore_ffn(model, replaced)
    assert not ffn_modules(model)
    with torch.no_grad():
        assert torch.equal(logits(model, x), before)


def other_ffn(name):
    return "gelu" if CONFIGS[name][1] in GATED else "swiglu"


@pytest.mark.parametrize("name", CONFIGS)
def test_swap_to_other_activation_warns_and_matches_params(name):
    model = build(name)
    old_params = param_count(model)
    with pytest.warns(PretrainedWeightsWarning, match="needs \\(continued\\) training"):
        replaced = swap_ffn(model, other_ffn(name))
    assert all(f.spec.name == other_ffn(name) for f in ffn_modules(model))
    assert len(replaced) == len(ffn_modules(model)) * (2 if "bert" in name or "roberta" in name else 1)
    # the nearest whole width; at d_model=32 one hidden unit is already ~1% of an FFN
    assert abs(param_count(model) - old_params) <= 0.02 * ffn_params(model)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5"])  # one per family
def test_swapped_model_trains(name):
    torch.manual_seed(0)
    model = build(name)
    with pytest.warns(PretrainedWeightsWarning):
        swap_ffn(model, other_ffn(name))
    ffn = ffn_modules(model)[0]
    x = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.eval()  # no dropout: a fixed batch should then fit steadily
    losses = []
    for _ in range(10):
        loss = model(input_ids=x, labels=x, **({"decoder_input_ids": x} if "t5" in name else {})).loss
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ffn.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5"])
def test_swap_changes_only_that_instance(name):
    a, b = build(name, seed=3).eval(), build(name, seed=3).eval()
    x = batch()
    with torch.no_grad():
        expected = logits(b, x)
    unit_types = {type(m) for m in b.modules()}
    forwards = {cls: cls.forward for cls in unit_types}
    with pytest.warns(PretrainedWeightsWarning):
        swap_ffn(a, "reglu" if name != "llama" else "gelu")
    with torch.no_grad():
        assert not torch.equal(logits(a, x), expected)
        assert torch.equal(logits(b, x), expected)
        assert torch.equal(logits(build(name, seed=3).eval(), x), expected)  # a new instance too
    assert not ffn_modules(b) and {type(m) for m in b.modules()} == unit_types
    assert all(cls.forward is f for cls, f in forwards.items())


def test_gate_and_up_order_and_conv1d_transpose():
    llama = build("llama")
    mlp = llama.model.layers[0].mlp
    swap_ffn(llama, "swiglu")
    ffn = llama.model.layers[0].mlp
    assert isinstance(ffn, GatedFFN)  # LLaMA: down(act(gate(x)) * up(x))
    assert torch.equal(ffn.w_gate.weight, mlp.gate_proj.weight) and torch.equal(ffn.w_up.weight, mlp.up_proj.weight)
    x = torch.randn(3, 32)
    assert torch.equal(ffn(x), mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)))

    t5 = build("t5-gated-gelu")
    ff = t5.encoder.block[0].layer[-1].DenseReluDense
    swap_ffn(t5, "geglu_tanh")
    new = t5.encoder.block[0].layer[-1].DenseReluDense
    assert torch.equal(new.w_gate.weight, ff.wi_0.weight) and torch.equal(new.w_up.weight, ff.wi_1.weight)
    assert "gelu_new" in repr(new.act)  # T5's exact expression is kept, not F.gelu(tanh)

    gpt2 = build("gpt2")
    mlp = gpt2.transformer.h[0].mlp
    swap_ffn(gpt2, "gelu_new")
    new = gpt2.transformer.h[0].mlp[0]
    assert isinstance(new, DenseFFN)
    assert torch.equal(new.w_in.weight, mlp.c_fc.weight.t()) and torch.equal(new.w_out.bias, mlp.c_proj.bias)


def test_dropout_kept_where_the_original_had_it():
    gpt2 = build("gpt2")
    swap_ffn(gpt2, "gelu_new")
    assert isinstance(gpt2.transformer.h[0].mlp[1], nn.Dropout)  # after c_proj, as GPT2MLP
    assert gpt2.transformer.h[0].mlp[1].p == gpt2.config.resid_pdrop

    t5 = build("t5", dropout=0.5)
    with pytest.warns(PretrainedWeightsWarning):
        swap_ffn(t5, "swiglu")
    ffn = t5.decoder.block[1].layer[-1].DenseReluDense
    assert [m.p for m in ffn.act.modules() if isinstance(m, nn.Dropout)] == [0.5]  # on the hidden units
    x = torch.randn(4, 32)
    ffn.train()
    assert not torch.equal(ffn(x), ffn(x))
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))

    bert = build("bert")
    norm, drop = bert.bert.encoder.layer[0].output.LayerNorm, bert.bert.encoder.layer[0].output.dropout
    swap_ffn(bert, "gelu")
    layer = bert.bert.encoder.layer[0]
    assert isinstance(layer.intermediate, nn.Identity) and isinstance(layer.output.dense, DenseFFN)
    assert layer.output.LayerNorm is norm and layer.output.dropout is drop  # residual + LayerNorm untouched


def test_swap_to_own_ffn_is_bit_identical_in_bf16(monkeypatch):
    monkeypatch.delenv("FFNLAB_EAGER", raising=False)
    model = build("llama").to(torch.bfloat16).eval()
    x = batch()
    with torch.no_grad():
        before = logits(model, x)
        swap_ffn(model, "swiglu")
        assert all(p.dtype == torch.bfloat16 for f in ffn_modules(model) for p in f.parameters())
        assert torch.equal(logits(model, x), before)


def test_build_hf_model_lets_gated_ffns_use_the_fused_default():
    model = build_hf_model(LlamaConfig(**DECODER), "swiglu")
    assert all(f.fused is None for f in model.ffn_modules())


def test_swap_keeps_dtype_and_train_mode():
    model = build("llama").to(torch.float64).eval()
    with pytest.warns(PretrainedWeightsWarning):
        swap_ffn(model, "mix:gelu+silu")
    ffn = model.model.layers[1].mlp
    assert {p.dtype for p in ffn.parameters()} == {torch.float64}
    assert not any(m.training for m in ffn.modules())
    model(input_ids=batch())  # runs in float64 throughout


def test_swap_to_switch_x_builds_its_gate_and_runs():
    model = build("llama")
    before = param_count(model)
    with pytest.warns(PretrainedWeightsWarning):
        swap_ffn(model, "switch_x:gelu+silu")
    assert model.model.layers[1].mlp.act.names == ("gelu", "silu")
    assert abs(param_count(model) - before) <= 0.01 * before  # the gate counted in the width
    model(input_ids=batch())


def test_swap_width_matches_params_and_flops():
    swiglu, gelu = get_ffn_spec("swiglu"), get_ffn_spec("gelu")
    assert swap_width(gelu, swiglu, 32, 64, bias=False) == 96  # 3*32*64 = 2*32*96
    # GPT-2 4x dense with biases -> gated with biases: 98h + 32 = 8352 -> h = 85 (84 is 1.05% off)
    assert swap_width(swiglu, gelu, 32, 128, bias=True) == 85
    assert swap_width(swiglu, swiglu, 32, 77, bias=False, match="flops") == 77
    assert swap_width(gelu, swiglu, 32, 64, bias=False, match="none") == 64
    with pytest.raises(ValueError, match="valid: params"):
        swap_width(gelu, swiglu, 32, 64, False, match="param")


def test_unsupported_architecture_names_the_supported_ones():
    from transformers import OPTConfig, OPTForCausalLM

    model = OPTForCausalLM(
        OPTConfig(
            hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=V, word_embed_proj_dim=16
        )
    )
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'opt'.*llama.*gpt2.*bert.*t5") as e:
        swap_ffn(model, "swiglu")
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(UnsupportedModelError, match="not a Hugging Face model"):
        swap_ffn(nn.Linear(2, 2), "swiglu")


def test_model_without_its_mlps_is_a_clear_error():
    model = build("llama")
    for layer in model.model.layers:
        layer.mlp = nn.Identity()
    with pytest.raises(UnsupportedModelError, match="gate_proj/up_proj/down_proj"):
        swap_ffn(model, "gelu")
    for name in ("gpt2", "bert", "t5"):
        model = build(name)
        swap_ffn(model, CONFIGS[name][1])
        with pytest.raises(UnsupportedModelError, match="swapped already"):
            swap_ffn(model, "swiglu")


def test_failed_swap_leaves_the_model_untouched():
    model = build("llama")
    mlps = [layer.mlp for layer in model.model.layers]
    model.model.layers[1].mlp.up_proj = nn.Linear(32, 48, bias=False)  # breaks the last FFN's weight shapes
    with pytest.raises(RuntimeError, match="size mismatch"):
        swap_ffn(model, "swiglu")
    assert [layer.mlp for layer in model.model.layers] == mlps and not ffn_modules(model)
    with pytest.raises(ValueError, match="unknown match"):
        swap_ffn(model, "gelu", match="param")


def test_unknown_ffn_name_is_a_value_error():
    with pytest.raises(ValueError, match="did you mean 'swiglu'"):
        swap_ffn(build("llama"), "swigl")


# ---- name mapping -----------------------------------------------------------------------------


@pytest.mark.parametrize("hf_name", HF_ACTS)
def test_hf_activation_maps_to_the_same_expression(hf_name):
    x = torch.linspace(-12, 12, 2001, dtype=torch.float32)
    expected = ACT2FN[hf_name](x)
    actual = get_activation(hf_to_ffnlab(hf_name))(x)
    if hf_name == "gelu_python_tanh":  # same function, different order of operations
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(actual, expected)
    back = ffnlab_to_hf(hf_to_ffnlab(hf_name))
    assert canonical(hf_to_ffnlab(back)) == canonical(hf_to_ffnlab(hf_name))


@pytest.mark.parametrize("name", FFNS)
def test_ffnlab_to_hf_round_trips_or_says_none_exists(name):
    act = FFNS[name].acts[0]
    try:
        hf = ffnlab_to_hf(name)
    except ValueError as e:
        assert "no Hugging Face activation computes" in str(e)
        assert all(canonical(a) != canonical(act) for a in HF_ACTS.values())
        return
    assert canonical(hf_to_ffnlab(hf)) == canonical(act)
    if FFNS[name].kind == "dense":
        assert ffnlab_to_hf(name, "feed_forward_proj") == hf


@pytest.mark.parametrize("name", GATED)
def test_t5_feed_forward_proj_both_ways(name):
    proj = ffnlab_to_hf(name, "feed_forward_proj")
    assert proj.startswith("gated-") and hf_to_ffnlab(proj) == name
    config = T5Config(**T5, feed_forward_proj=proj)  # a string T5 accepts, running the same function
    assert canonical(model_activation(config)) == canonical(GATED[name].acts[0])


def test_t5_and_named_mappings():
    assert hf_to_ffnlab("relu") == "relu" and hf_to_ffnlab("gated-gelu") == "geglu_tanh"
    assert hf_to_ffnlab("gated-silu") == "swiglu" and hf_to_ffnlab("linear") == "identity"
    assert model_activation(T5Config(**T5, feed_forward_proj="gated-gelu")) == "gelu_new"
    assert model_activation(T5Config(**T5, feed_forward_proj="relu")) == "relu"
    assert model_activation({"model_type": "t5", "feed_forward_proj": "gated-silu"}) == "silu"
    assert model_activation(GPT2Config()) == "gelu_new" and model_activation(LlamaConfig()) == "silu"
    assert ffnlab_to_hf("swiglu") == "silu" and ffnlab_to_hf("geglu_tanh", "feed_forward_proj") == "gated-gelu"
    assert ffnlab_to_hf("gelu_tanh") == "gelu_pytorch_tanh" and ffnlab_to_hf("gelu_new") == "gelu_new"
    with pytest.raises(ValueError, match="did you mean 'gelu_new'"):
        hf_to_ffnlab("gelu_neww")
    with pytest.raises(ValueError, match="no gated ffnlab variant uses 'mish'"):
        hf_to_ffnlab("gated-mish")
    with pytest.raises(ValueError, match="mixes 2 activations"):
        ffnlab_to_hf("mix:gelu+silu")
    with pytest.raises(ValueError, match="mixes 3 activations"):
        ffnlab_to_hf("switch_x:gelu+silu+relu")
    with pytest.raises(ValueError, match="unknown config key"):
        ffnlab_to_hf("gelu", "act")


@pytest.mark.parametrize("name", CONFIGS)
def test_one_reader_of_a_configs_activation_agrees_with_every_caller(name, tmp_path):
    from ffnlab.study.advise import advise

    config, own = CONFIGS[name][0](), CONFIGS[name][1]
    found = config_activation(config)
    assert found.variant() == own and found.gated == get_ffn_spec(own).gated
    assert canonical(model_activation(config)) == canonical(get_ffn_spec(own).acts[0])  # what swap_ffn keeps
    assert config_activation(config.to_dict()) == found  # the same from what config.json holds
    (tmp_path / "config.json").write_text(config.to_json_string())
    advice = advise(pretrained=str(tmp_path))  # `ffnlab advise --pretrained FOLDER`
    assert advice.recommendation == own and advice.evidence.model.act == model_activation(config)


def test_the_reader_says_where_the_activation_is_named_and_whether_it_gates():
    t5 = config_activation({"model_type": "t5", "feed_forward_proj": "Gated-GELU"})
    assert (t5.field, t5.value, t5.hf_act, t5.act, t5.gated, t5.variant()) == (
        "feed_forward_proj", "Gated-GELU", "gelu_new", "gelu_new", True, "geglu_tanh")  # fmt: skip
    distilbert = config_activation({"model_type": "distilbert", "activation": "gelu"})
    assert (distilbert.field, distilbert.variant()) == ("activation", "gelu")
    gemma = config_activation({"model_type": "gemma", "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"})
    assert (gemma.field, gemma.overridden, gemma.variant()) == ("hidden_activation", "gelu", "geglu_tanh")
    unknown = config_activation({"model_type": "llama", "hidden_act": "GELU_NEWW"})
    assert unknown.act is None and unknown.gated
    with pytest.raises(ValueError, match=r"unsupported Hugging Face activation 'gelu_neww' \(did you mean 'gelu_new'"):
        unknown.variant()
    with pytest.raises(ValueError, match="no gated ffnlab variant uses 'mish'"):
        config_activation({"model_type": "mistral", "hidden_act": "mish"}).variant()
    # a field the file leaves out runs with transformers' default for the family: silu for Llama, gelu_new for GPT-2
    assert config_activation({"model_type": "llama"}).variant() == "swiglu"
    assert config_activation({"model_type": "gpt2"}).hf_act == "gelu_new"
    with pytest.raises(ValueError, match="x.json names no activation; looked for feed_forward_proj, hidden_activation"):
        config_activation({"model_type": "no_such_family"}, where="x.json")
    with pytest.raises(ValueError, match="config's activation is 3, not a name"):
        config_activation({"hidden_act": 3})
    for family, spec in FAMILIES.items():  # the families swap_ffn supports are gated exactly where their MLP is
        assert all((t in GATED_MODEL_TYPES) == (family == "llama") for t in spec.model_types), family


def test_gemma_disagreement_warns_and_hidden_activation_wins():
    config = {"model_type": "gemma", "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}
    with pytest.warns(ActivationConfigWarning, match="hidden_act='gelu'.*hidden_activation='gelu_pytorch_tanh'"):
        assert model_activation(config) == "gelu_pytorch_tanh"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ActivationConfigWarning)
        assert model_activation({**config, "hidden_act": "gelu_pytorch_tanh"}) == "gelu_pytorch_tanh"
    with pytest.raises(ValueError, match="names no activation"):
        model_activation({"model_type": "llama", "hidden_act": None})


# ---- build_hf_model ---------------------------------------------------------------------------


def llama_json(tmp_path, **kw):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", **DECODER, "max_position_embeddings": 32, **kw}))
    return path


def test_build_hf_model_from_json(tmp_path):
    rng = torch.get_rng_state()
    model = build_hf_model(llama_json(tmp_path), "gelu", seed=1, vocab_size=50, context=16)
    assert torch.equal(torch.get_rng_state(), rng)  # seeding leaves the global RNG alone
    assert (model.cfg.context, model.cfg.vocab_size, model.cfg.task, model.cfg.ffn) == (16, 50, "lm", "gelu")
    assert model.cfg.d_ff == 96 and model.cfg.n_layers == 2
    ffns = model.ffn_modules()
    assert len(ffns) == 2 and all(isinstance(f, DenseFFN) for f in ffns)
    idx = torch.randint(0, 50, (2, 16))
    targets = torch.randint(0, 50, (2, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 50)
    assert torch.equal(loss, F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1)))  # not shifted again
    assert model(idx)[1] is None
    with pytest.raises(ValueError, match="exceeds the model's context 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_build_hf_model_is_seeded_and_pairs_variants(tmp_path):
    path = llama_json(tmp_path)
    idx = batch()
    a, b = build_hf_model(path, "swiglu", seed=2), build_hf_model(path, "swiglu", seed=2)
    assert torch.equal(a(idx, idx)[1], b(idx, idx)[1])
    assert not torch.equal(a(idx, idx)[1], build_hf_model(path, "swiglu", seed=3)(idx, idx)[1])
    c = build_hf_model(path, "relu", seed=2)
    assert torch.equal(a.hf.model.embed_tokens.weight, c.hf.model.embed_tokens.weight)
    assert torch.equal(a.hf.model.layers[1].self_attn.q_proj.weight, c.hf.model.layers[1].self_attn.q_proj.weight)


def test_build_hf_model_bert_lm_is_causal_and_cls_heads_work():
    bert = build_hf_model(BertConfig(**ENCODER), "swiglu").eval()
    x = batch()
    y = x.clone()
    y[:, 5:] = (y[:, 5:] + 1) % V
    with torch.no_grad():
        assert torch.equal(bert(x)[0][:, :5], bert(y)[0][:, :5])
    for config in (
        LlamaConfig(**DECODER),
        GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=V, bos_token_id=0, eos_token_id=0),
        BertConfig(**ENCODER),
    ):
        model = build_hf_model(config, "geglu", task="cls", n_classes=3)
        logits, loss = model(torch.randint(0, V, (3, 8)), torch.tensor([0, 1, 2]))
        assert logits.shape == (3, 3) and loss.ndim == 0
        assert model.cfg.task == "cls" and len(model.ffn_modules()) == 2


def test_build_hf_model_reg_is_transformers_regression_head_with_the_mse_loss():
    for config in (LlamaConfig(**DECODER), BertConfig(**ENCODER)):
        model = build_hf_model(config, "geglu", task="reg")
        y = torch.tensor([0.5, 3.0, 4.5])
        logits, loss = model(torch.randint(0, V, (3, 8)), y)
        assert logits.shape == (3, 1) and torch.equal(loss, F.mse_loss(logits.squeeze(-1), y))
        assert (model.hf.config.num_labels, model.hf.config.problem_type) == (1, "regression")


@pytest.mark.parametrize("kind", ["fifo", "link", "device"])
def test_an_hf_config_that_is_no_regular_file_is_refused_by_its_kind(run_cli, tmp_path, kind):
    path, message = not_a_file(tmp_path, kind)
    code, _, err = within(30, lambda: run_cli("train", "--hf-config", path, "--print-config"))
    assert code == 2 and err == f"ffnlab: error: the Hugging Face config {path} {message}\n"


@pytest.mark.parametrize("key", SUB_CONFIGS)
def test_a_composite_models_text_part_in_a_single_models_config_is_refused(tmp_path, key):
    text_part = {"model_type": "llama", **DECODER}
    with pytest.raises(ValueError, match=f"config.json holds '{key}', the text part of a composite model's config, but "
                       "model_type 'llama' is a single model; remove") as e:  # fmt: skip
        build_hf_model(llama_json(tmp_path, **{key: text_part}), "swiglu")  # was AttributeError: 'dict' ... 'to_dict'
    assert "\n" not in str(e.value)
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'llava'"):  # a composite: not ours
        build_hf_model({"model_type": "llava", "text_config": text_part}, "swiglu")


def test_build_hf_model_bad_input(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"model_type": "llama", ')
    with pytest.raises(ValueError, match="cannot parse Hugging Face config .*broken.json") as e:
        build_hf_model(bad, "gelu")
    assert "\n" not in str(e.value)
    (tmp_path / "no_type.json").write_text("{}")
    with pytest.raises(ValueError, match="no_type.json has no model_type"):
        build_hf_model(tmp_path / "no_type.json", "gelu")
    with pytest.raises(UnsupportedModelError, match="supported: llama"):
        build_hf_model({"model_type": "opt"}, "gelu")
    with pytest.raises(UnsupportedModelError, match="no task 'lm' for t5"):
        build_hf_model(T5Config(**T5), "gelu")
    with pytest.raises(ValueError, match="unknown FFN variant"):
        build_hf_model(llama_json(tmp_path), "gelux")


# ---- saving and loading a swapped model --------------------------------------------------------


@pytest.mark.parametrize(
    "name,ffn", [("llama", "gelu"), ("llama", "swiglu"), ("gpt2", "reglu"), ("bert", "geglu"), ("t5", "swiglu")]
)
def test_swapped_model_saves_and_loads_back(tmp_path, name, ffn):
    model = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainedWeightsWarning)
        swap_ffn(model, ffn)
    model.eval()
    x = batch()
    want = logits(model, x)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["ffnlab_ffn"] == {"ffn": ffn, "match": "params"}
    loaded = load_swapped(tmp_path)
    assert [f.spec.name for f in ffn_modules(loaded)] == [f.spec.name for f in ffn_modules(model)]
    assert torch.equal(logits(loaded, x), want)  # every weight, tied ones included, came back


def test_load_swapped_refuses_what_it_cannot_rebuild(tmp_path):
    model = build("llama")
    replaced = swap_ffn(model, "swiglu")
    restore_ffn(model, replaced)
    assert not hasattr(model.config, "ffnlab_ffn")  # the original FFNs are back: nothing to record
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="no 'ffnlab_ffn'.*load it with from_pretrained"):
        load_swapped(tmp_path / "plain")
    swap_ffn(model, "swiglu")
    model.save_pretrained(tmp_path / "swapped")
    cfg = json.loads((tmp_path / "swapped" / "config.json").read_text())
    (tmp_path / "swapped" / "config.json").write_text(json.dumps({**cfg, "ffnlab_ffn": {"ffn": "gelu"}}))
    with pytest.raises(ValueError, match="is not the FFN the weights were saved with"):
        load_swapped(tmp_path / "swapped")


def saved_swapped(tmp_path, ffn="geglu"):
    model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainedWeightsWarning)
        swap_ffn(model, ffn)
    model.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def test_load_swapped_refuses_a_relabelled_ffn_of_the_same_shape(tmp_path):
    cfg = saved_swapped(tmp_path, "geglu")  # swiglu has the same weight shapes: only the digest can tell
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "ffnlab_ffn": {"ffn": "swiglu", "match": "params"}}))
    with pytest.raises(ValueError, match="is not the FFN the weights were saved with"):
        load_swapped(tmp_path)


@pytest.mark.parametrize("name", ["AutoConfig", "load_tf2_weights_in_pytorch_model", "os", 7])
def test_load_swapped_calls_only_model_classes(tmp_path, name):
    cfg = saved_swapped(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": [name]}))
    with pytest.raises(ValueError, match="names no transformers model class"):
        load_swapped(tmp_path)


def test_load_swapped_edited_sizes_and_damaged_weights_are_value_errors(tmp_path):
    cfg = saved_swapped(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_size": cfg["hidden_size"] * 2}))
    with pytest.raises(ValueError, match="do not fit its config.json"):
        load_swapped(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    weights = next(tmp_path.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="cannot read the weights"):
        load_swapped(tmp_path)


# ---- local folders only: no remote code, no Hub ------------------------------------------------

# imported, it leaves a marker file: the proof that a folder's own code ran
EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PretrainedConfig
class C(PretrainedConfig):
    model_type = "evil"
"""
LOAD_SWAPPED = """
import sys
from ffnlab.tools.hf import load_swapped
try:
    load_swapped(sys.argv[1])
except ValueError as e:
    print("ValueError:", e)
"""


def evil_folder(tmp_path):
    """A folder whose config.json maps AutoConfig to cfg_evil.py beside it (auto_map), as remote-code models do."""
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "cfg_evil.C"}}))
    (folder / "cfg_evil.py").write_text(EVIL_CODE.format(marker=str(tmp_path / "ran")))
    return folder


def run_on_a_terminal(args, answer: bytes, env: dict, timeout: float = 60) -> str:
    """Run `args` with a pseudo-terminal as stdin, stdout and stderr, `answer` typed into it; all it printed."""
    main, child = pty.openpty()
    proc = subprocess.Popen(args, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    os.write(main, answer)
    output, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        if not select.select([main], [], [], 1)[0]:
            continue
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        output += data
    proc.kill()
    proc.wait()
    os.close(main)
    return output.decode(errors="replace")


@pytest.mark.slow  # a fresh interpreter imports transformers
def test_load_swapped_runs_no_folder_code_even_when_the_terminal_says_yes(tmp_path):
    folder = evil_folder(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HF_HOME": str(tmp_path / "hf"),  # where transformers would copy the folder's code to import it
        "HF_HUB_OFFLINE": "1",
    }
    # y answers transformers' "Do you wish to run the custom code? [y/N]", asked when trust_remote_code is unset
    output = run_on_a_terminal([sys.executable, "-c", LOAD_SWAPPED, str(folder)], b"y\n", env)
    assert not (tmp_path / "ran").exists(), output
    assert "ValueError:" in output and "remote code is refused" in output, output


def test_load_swapped_reads_local_folders_only(tmp_path):
    cases = {
        "gpt2": "gpt2 does not exist or is not a folder; give a local save_pretrained folder",  # not the Hub
        str(tmp_path / "missing"): "missing does not exist or is not a folder",  # was 'Repo id must be in the form'
        str(tmp_path): "has no config.json",
        str(evil_folder(tmp_path)): "remote code is refused",
    }
    for folder, message in cases.items():
        with pytest.raises(ValueError, match=message) as e:
            load_swapped(folder)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "ran").exists()


def test_load_swapped_names_an_architecture_of_another_family(tmp_path):
    cfg = saved_swapped(tmp_path)  # a LLaMA
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="BertModel is a bert model but .* is a llama config") as e:
        load_swapped(tmp_path)  # was an AttributeError from inside BertModel
    assert "\n" not in str(e.value)


def test_a_config_with_an_auto_map_builds_and_saves_without_it(tmp_path):
    remote = json.loads(llama_json(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_x.M"}).read_text())
    model = build_hf_model(remote, "swiglu", match="none", vocab_size=50)
    assert type(model.hf).__name__ == "LlamaForCausalLM"  # transformers' own class: built from model_type
    save_unswapped(model.hf, tmp_path / "saved")
    assert "auto_map" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    assert local_config(tmp_path / "saved").model_type == "llama"  # so the folder is not refused later


# ---- Q/K/V activations --------------------------------------------------------------------------

QKV_FAMILIES = ("llama", "gpt2", "bert", "t5")


def first_qkv(model, x) -> list[torch.Tensor]:
    """q, k, v as the model's first attention computes them on x (after any Q/K/V activation)."""
    family = model_family(model)[0]
    if family == "gpt2":
        names, outs = ("c_attn",), {}
    else:
        names, outs = QKV_NAMES[family], {}
    attention = next(m for m in model.modules() if all(hasattr(m, n) for n in names))
    handles = [
        getattr(attention, n).register_forward_hook(lambda m, i, o, n=n: outs.setdefault(n, o.detach())) for n in names
    ]
    with torch.no_grad():
        logits(model.eval(), x)
    for handle in handles:
        handle.remove()
    if family == "gpt2":
        return list(outs["c_attn"].split(attention.split_size, dim=-1))
    return [outs[n] for n in names]


@pytest.mark.parametrize("name", QKV_FAMILIES)
def test_q_activation_changes_q_only_and_the_output(name):
    plain, model = build(name).eval(), build(name).eval()
    replaced = swap_attn_act(model, "q=gelu")
    assert replaced and model.config.ffnlab_attn_act == "q=gelu"
    x = batch()
    (q0, k0, v0), (q1, k1, v1) = first_qkv(plain, x), first_qkv(model, x)
    assert torch.equal(q1, F.gelu(q0)) and torch.equal(k1, k0) and torch.equal(v1, v0)
    assert not torch.allclose(logits(plain, x), logits(model, x))


@pytest.mark.parametrize("name", QKV_FAMILIES)
def test_one_name_puts_it_on_q_k_and_v(name):
    plain, model = build(name).eval(), build(name).eval()
    swap_attn_act(model, "relu")
    for before, after in zip(first_qkv(plain, batch()), first_qkv(model, batch())):
        assert torch.equal(after, before.relu())


def test_attn_act_none_changes_nothing_and_a_second_swap_is_refused():
    model = build("llama").eval().to(torch.bfloat16)
    assert swap_attn_act(model, "none") == {} and not hasattr(model.config, "ffnlab_attn_act")
    swap_attn_act(model, "q=swish_beta")  # a learnable activation takes the projection's dtype and mode
    learned = model.model.layers[0].self_attn.q_proj
    assert not learned.training and all(p.dtype == torch.bfloat16 for p in learned.act.parameters())
    model = build("llama")
    swap_attn_act(model, "v=silu")
    with pytest.raises(UnsupportedModelError, match="wrapped already"):
        swap_attn_act(model, "v=silu")


def test_attn_act_bad_input_and_families_without_it():
    with pytest.raises(ValueError, match="unknown projection 'o'; valid: q, k, v"):
        swap_attn_act(build("llama"), "o=gelu")
    cross = AutoModelForCausalLM.from_config(
        GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=V, add_cross_attention=True)
    )
    with pytest.raises(UnsupportedModelError, match="cross-attention: its c_attn holds only K and V"):
        swap_attn_act(cross, "gelu")
    from transformers import OPTConfig, OPTForCausalLM

    opt = OPTForCausalLM(
        OPTConfig(hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=V)
    )
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'opt'"):
        swap_attn_act(opt, "gelu")


def test_training_config_attn_act_reaches_a_hugging_face_model(tmp_path):
    from ffnlab.core.model import ModelConfig
    from ffnlab.run.train import hf_factory

    make = hf_factory(LlamaConfig(**DECODER).to_dict())
    mcfg = ModelConfig(vocab_size=V, context=16, ffn="swiglu", attn_act="k=gelu")
    model, plain = make(mcfg, 0), make(ModelConfig(vocab_size=V, context=16, ffn="swiglu"), 0)
    assert model.cfg.attn_act == "k=gelu"
    assert [type(m).__name__ for m in model.hf.model.layers[0].self_attn.children()][:3] == [
        "Linear",
        "ProjectionAct",
        "Linear",
    ]
    x = batch()[:, :8]
    assert not torch.allclose(model(x)[0], plain(x)[0])
    model.hf.save_pretrained(tmp_path)
    assert torch.equal(load_swapped(tmp_path)(input_ids=x).logits, model.eval()(x)[0])


def test_a_hugging_face_run_prints_nothing_of_torchao_s_import(tmp_path):
    """transformers' model code imports torchao (its quantisers), which logged 'Failed to load .../_C_mxfp8...so'
    and 'register_constant() on Enum subclasses is deprecated' in every run of a sweep: noise above the table."""
    config = tmp_path / "gpt2.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2}))
    flags = ["--hf-config", config, "--ffn", "gelu_new", "--steps", 1, "--eval-batches", 1, "--final-eval-batches", 1]
    proc = subprocess.run([sys.executable, "-m", "ffnlab", "train", *map(str, flags), "--quiet"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gelu_new: finished after 1 steps")
    assert "torchao" not in proc.stderr and "register_constant" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [["train", "--steps", 1], ["export", "--ffn", "swiglu", "--out", "x.onnx"]])
def test_an_hf_config_of_absurd_depth_is_refused_before_a_layer_is_built(run_cli, tmp_path, command):
    """A config of 100,000 layers was built on the meta device layer by layer, silently, for minutes."""
    config = llama_json(tmp_path, num_hidden_layers=100_000)
    flag = "--hf-config" if command[0] == "train" else "--model"
    code, _, err = within(30, lambda: run_cli(*command, flag, config))
    assert code == 2 and "num_hidden_layers in Hugging Face config" in err and "use 1 to 10,000 layers" in err
