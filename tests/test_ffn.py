import math

import pytest
import torch
import torch.nn.functional as F

from ffnlab.core.ffn import (
    DEFAULT_INIT,
    FFNS,
    GATED,
    DenseFFN,
    GatedFFN,
    MixFFN,
    build_ffn,
    ffn_flops_per_token,
    ffn_hidden_dim,
    ffn_param_count,
    ffn_stats,
    get_ffn_spec,
    glu_norm_param_count,
    init_ffn,
    init_scheme,
    init_std,
    layer_sizes,
    layer_variants,
)
from ffnlab.study.plan import DEFAULT_VARIANTS
from tests.conftest import assert_close


def n_params(m):
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(
    "d_model,multiple_of,ffn_dim_multiplier,expected",
    [
        (4096, 256, None, 11008),  # LLaMA-7B
        (5120, 256, None, 13824),  # LLaMA-13B
        (8192, 4096, 1.3, 28672),  # LLaMA-2-70B
        (4096, 1024, 1.3, 14336),  # LLaMA-3-8B
        (768, 64, None, 2048),  # 8/3 * 768 = 2048 exactly
    ],
)
def test_ffn_hidden_dim_reproduces_llama_sizes(d_model, multiple_of, ffn_dim_multiplier, expected):
    assert ffn_hidden_dim(d_model, True, multiple_of=multiple_of, ffn_dim_multiplier=ffn_dim_multiplier) == expected


def test_ffn_hidden_dim_dense_and_default_rounding():
    assert ffn_hidden_dim(512, gated=False) == 2048
    assert ffn_hidden_dim(100, gated=True) == 320  # 266 rounded up to a multiple of 64
    with pytest.raises(ValueError):
        ffn_hidden_dim(0, True)


@pytest.mark.parametrize("name", list(GATED) + ["mix:gelu+silu"])
@pytest.mark.parametrize("d_model", [64, 256, 1024])
def test_params_match_dense_4x_within_one_percent(name, d_model):
    for bias in (False, True):
        dense = n_params(build_ffn("relu", d_model, bias=bias))
        other = n_params(build_ffn(name, d_model, bias=bias, match="params"))
        assert abs(other - dense) / dense <= 0.01, (name, bias, other, dense)


@pytest.mark.parametrize("name", list(GATED))
def test_flops_match_dense_same_activation(name):
    spec = get_ffn_spec(name)
    ffn = build_ffn(name, 256, match="flops")
    dense = build_ffn(spec.acts[0], 256, bias=False)
    a = ffn_flops_per_token(spec, 256, ffn.d_ff, False)
    b = ffn_flops_per_token(dense.spec, 256, dense.d_ff, False)
    assert abs(a - b) / b <= 0.01


def test_match_none_uses_conventional_width():
    assert build_ffn("swiglu", 4096, match="none").d_ff == 11008 - 64  # multiple_of 64: 10944
    assert build_ffn("gelu", 128, match="none").d_ff == 512
    with pytest.raises(ValueError, match="valid: params, flops, none"):
        build_ffn("swiglu", 64, match="both")


def test_param_count_formula_agrees_with_modules():
    for name, spec in list(FFNS.items())[:6] + list(GATED.items()):
        for bias in (False, True):
            m = build_ffn(name, 48, d_ff=96, bias=bias)
            assert n_params(m) - sum(p.numel() for n, p in m.named_parameters() if "act" in n) == ffn_param_count(
                spec.kind, 48, 96, bias
            )


@pytest.mark.parametrize("name", list(GATED))
def test_gated_forward_is_down_of_act_gate_times_up(name):
    ffn = build_ffn(name, 32).double()
    x = torch.randn(3, 7, 32, dtype=torch.float64)
    act = ffn.act
    expected = ffn.w_down(act(x @ ffn.w_gate.weight.T) * (x @ ffn.w_up.weight.T))
    assert_close(ffn(x), expected)
    assert ffn.w_gate.bias is None  # bias off by default


def test_mix_is_mean_of_two_half_width_dense():
    ffn = build_ffn("mix:gelu+silu", 32).double()
    x = torch.randn(5, 32, dtype=torch.float64)
    a, b = ffn.branches
    assert a.w_in.out_features == ffn.d_ff // 2 and a.act.name == "gelu" and b.act.name == "silu"
    assert_close(ffn(x), (a(x) + b(x)) / 2)


def test_unknown_ffn_names():
    with pytest.raises(ValueError, match="did you mean 'swiglu'"):
        get_ffn_spec("swiglue")
    with pytest.raises(ValueError, match="mix:ACT1\\+ACT2"):
        get_ffn_spec("mix:gelu")
    with pytest.raises(ValueError, match="two dense"):
        get_ffn_spec("mix:gelu+swiglu")
    with pytest.raises(ValueError, match="positive"):
        build_ffn("gelu", 0)


def test_stats_measures_saved_bytes():
    d, h, tokens = 64, 128, 8
    dense = ffn_stats(build_ffn("gelu", d, d_ff=h), tokens)
    assert dense.saved_bytes_per_token == 4 * (d + 2 * h)  # input, pre-activation, post-activation
    eager = ffn_stats(build_ffn("swiglu", d, d_ff=h, fused=False), tokens)
    assert eager.saved_bytes_per_token == 4 * (d + 4 * h)  # input, gate, act(gate), up, product
    gated = ffn_stats(build_ffn("swiglu", d, d_ff=h, fused=True), tokens)
    assert gated.saved_bytes_per_token == 4 * (d + 2 * h)  # fused: input, gate, up
    assert gated.params_per_weight == {"w_gate.weight": d * h, "w_up.weight": d * h, "w_down.weight": d * h}
    assert gated.flops_per_token == 2 * 3 * d * h + (4 + 1) * h  # matmuls, silu, product


@pytest.mark.parametrize("name", DEFAULT_VARIANTS)
def test_default_init_is_one_scheme_for_every_variant(name):
    assert init_scheme(get_ffn_spec(name)) == DEFAULT_INIT


def test_family_init_is_the_literature_table():
    assert init_scheme(get_ffn_spec("relu"), "family") == "he"
    assert init_scheme(get_ffn_spec("gelu"), "family") == "normal"
    assert init_scheme(get_ffn_spec("swiglu"), "family") == "lecun_uniform"  # Swish: LeCun uniform
    assert init_scheme(get_ffn_spec("silu"), "auto") == "lecun_uniform"  # old stores' name for the table


def test_init_schemes():
    torch.manual_seed(0)
    w = build_ffn("relu", 256, d_ff=4096, init="he").w_in.weight
    assert abs(w.std().item() - (2 / 256) ** 0.5) < 0.01
    w = build_ffn("relu", 256, d_ff=4096, init="normal").w_in.weight
    assert abs(w.std().item() - 0.02) < 0.002
    w = build_ffn("relu", 256, d_ff=4096, init="lecun").w_in.weight
    assert abs(w.std().item() - (1 / 256) ** 0.5) < 0.005
    w = build_ffn("swiglu", 256, d_ff=4096, init="lecun_uniform").w_gate.weight
    bound = (3 / 256) ** 0.5
    assert abs(w.std().item() - (1 / 256) ** 0.5) < 0.005 and w.abs().max().item() <= bound
    assert w.abs().max().item() > 0.99 * bound  # uniform: the bound is reached, a normal would overshoot it
    with pytest.raises(ValueError, match="unknown init 'xavier'.*valid: lecun, he"):
        build_ffn("relu", 64, init="xavier")


@pytest.mark.parametrize("name, weight", [("gelu", "w_in"), ("geglu", "w_gate"), ("geglu", "w_down")])
def test_he_gelu_init_is_he_times_sqrt_2_over_pi(name, weight):
    torch.manual_seed(0)
    fan_in = 512 if weight != "w_down" else 4096
    ffn = build_ffn(name, 512, d_ff=4096, init="he_gelu")
    w = getattr(ffn, weight).weight  # 2M draws: the sample std is within 0.1% of the scheme's
    expected = math.sqrt(2 / fan_in) * math.sqrt(2 / math.pi)
    assert init_std("he_gelu", fan_in) == pytest.approx(expected, rel=1e-15)
    assert w.std().item() == pytest.approx(expected, rel=0.005)
    assert abs(w.mean().item()) < 0.01 * expected
    assert init_std("he_gelu", fan_in) == pytest.approx(0.7979 * init_std("he", fan_in), rel=1e-4)


# ---- norms around the gate (glu_norm) --------------------------------------------------------------


def gated_parts(ffn, x):
    """act(W_gate x) * W_up x written out, the product GatedFFN's formula feeds W_down."""
    return ffn.act(ffn.w_gate(x)) * ffn.w_up(x)


def test_default_gated_ffn_is_the_formula_bit_for_bit():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32)
    ffn = build_ffn("swiglu", 32, fused=False)
    explicit = build_ffn("swiglu", 32, fused=False, glu_norm="none", norm="layernorm")
    explicit.load_state_dict(ffn.state_dict())
    assert ffn.norm_in is None and ffn.norm_hidden is None
    assert set(ffn.state_dict()) == {"w_gate.weight", "w_up.weight", "w_down.weight"}
    assert torch.equal(ffn(x), ffn.w_down(gated_parts(ffn, x)))
    assert torch.equal(explicit(x), ffn(x))
    assert repr(ffn) == repr(explicit) and "glu_norm" not in repr(ffn)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("glu_norm", ["pre", "post", "both"])
def test_glu_norm_computes_its_formula(glu_norm, norm):
    torch.manual_seed(1)
    d_model, d_ff = 32, 48
    x = torch.randn(4, d_model)
    ffn = build_ffn("geglu", d_model, d_ff=d_ff, glu_norm=glu_norm, norm=norm, fused=False)
    for module in (ffn.norm_in, ffn.norm_hidden):  # learned scale and shift, so a wrong order shows
        if module is not None:
            torch.nn.init.normal_(module.weight, 1.0, 0.3)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.normal_(module.bias, 0.0, 0.3)

    def normed(z, module):
        if norm == "layernorm":
            return F.layer_norm(z, z.shape[-1:], module.weight, module.bias)
        return F.rms_norm(z, z.shape[-1:], module.weight, eps=1e-6)

    n = normed(x, ffn.norm_in) if glu_norm in ("pre", "both") else x
    hidden = F.gelu(n @ ffn.w_gate.weight.T) * (n @ ffn.w_up.weight.T)
    if glu_norm in ("post", "both"):
        hidden = normed(hidden, ffn.norm_hidden)
    assert_close(ffn(x), hidden @ ffn.w_down.weight.T)
    plain = build_ffn("geglu", d_model, d_ff=d_ff, fused=False)
    plain.load_state_dict(ffn.state_dict(), strict=False)
    assert not torch.allclose(plain(x), ffn(x))
    extra = sum(p.numel() for p in ffn.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == glu_norm_param_count(glu_norm, norm, d_model, d_ff)


def test_glu_norm_pre_keeps_the_fused_path_and_post_refuses_it():
    torch.manual_seed(2)
    x = torch.randn(6, 32)
    fused = build_ffn("swiglu", 32, glu_norm="pre", fused=True)
    eager = build_ffn("swiglu", 32, glu_norm="pre", fused=False)
    eager.load_state_dict(fused.state_dict())
    assert fused.use_fused(x) and not eager.use_fused(x)
    assert_close(fused(x), eager(x))
    assert build_ffn("swiglu", 32, glu_norm="post").use_fused(x) is False  # auto: eager, the norm sits in between
    with pytest.raises(ValueError, match="glu_norm 'both' puts a norm between them"):
        build_ffn("swiglu", 32, glu_norm="both", fused=True)


def test_glu_norm_params_and_widths():
    spec = get_ffn_spec("swiglu")
    assert glu_norm_param_count("none", "layernorm", 128, 344) == 0
    assert glu_norm_param_count("pre", "layernorm", 128, 344) == 256
    assert glu_norm_param_count("post", "rmsnorm", 128, 344) == 344
    assert glu_norm_param_count("both", "layernorm", 128, 344) == 2 * (128 + 344)
    # the match leaves the norms out: one width with and without them
    assert build_ffn("swiglu", 128, glu_norm="both").d_ff == build_ffn("swiglu", 128).d_ff
    assert ffn_stats(build_ffn("swiglu", 64, glu_norm="pre"), 2).d_model == 64
    assert ffn_stats(build_ffn("swiglu", 64, glu_norm="pre"), 2).flops_per_token == ffn_flops_per_token(
        spec, 64, build_ffn("swiglu", 64).d_ff, False
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="gelu", glu_norm="pre"), "glu_norm 'pre' is a norm around a gate; 'gelu' has none"),
        (dict(name="swiglu", glu_norm="mid"), "unknown glu_norm 'mid'; valid: none, pre, post, both"),
        (dict(name="swiglu", glu_norm="pre", norm="batchnorm"), "unknown norm 'batchnorm'; valid: layernorm, rmsnorm"),
    ],
)
def test_bad_glu_norm(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_ffn(d_model=32, **kwargs)


@pytest.mark.parametrize(
    "ffn,name",
    [
        (lambda: DenseFFN(64, 256, "gelu"), "gelu"),
        (lambda: GatedFFN(64, 256, "silu"), "swiglu"),
        (lambda: GatedFFN(64, 256, "tanh"), "gated tanh"),  # no table entry: a spec of its own
        (lambda: MixFFN(64, 256, ("gelu", "silu")), "mix:gelu+silu"),
        (lambda: DenseFFN(64, 256, "switch"), "switch"),  # a learnable activation module
    ],
)
def test_directly_built_ffn_has_spec_and_d_ff(ffn, name):
    torch.manual_seed(0)
    ffn = ffn()
    assert ffn.spec.name == name and ffn.d_ff == 256
    init_ffn(ffn, "he")
    lin = next(m for m in ffn.modules() if isinstance(m, torch.nn.Linear))
    assert abs(lin.weight.std().item() - (2 / 64) ** 0.5) < 0.01
    stats = ffn_stats(ffn, tokens=2)
    assert stats.ffn == name and stats.d_ff == 256 and stats.d_model == 64
    if name in FFNS or name.startswith("mix:"):  # the same numbers as the registry's build
        assert stats.flops_per_token == ffn_stats(build_ffn(name, 64, d_ff=256), 2).flops_per_token


def test_ffn_outside_the_registry_needs_a_spec():
    ffn = DenseFFN(16, 32, torch.nn.Sequential(torch.nn.GELU(), torch.nn.Dropout(0.1)))
    assert ffn.spec is None and ffn.d_ff == 32
    with pytest.raises(ValueError, match="pass spec="):
        init_ffn(ffn)
    named = DenseFFN(16, 32, torch.nn.GELU(), spec=get_ffn_spec("gelu"))
    assert ffn_stats(named).ffn == "gelu"


def test_hidden_dim_for_target_known_values():
    from ffnlab.core.ffn import hidden_dim_for_target

    swiglu = get_ffn_spec("swiglu")
    # LLaMA-7B's width before its round-up to 256: 3 * 4096 * h = 2 * 4096 * 16384 -> h = 10922.7 -> 171 * 64
    assert hidden_dim_for_target(swiglu, 4096, 2 * 4096 * 16384) == 10944
    # GPT-2-style 4x dense with biases at d_model 32 (8352 params) -> gated: 98h + 32 -> 85 (84 is 1.05% off)
    assert hidden_dim_for_target(swiglu, 32, 8352, bias=True) == 85
    assert hidden_dim_for_target(get_ffn_spec("gelu"), 32, 3 * 32 * 64) == 96
    with pytest.raises(ValueError, match="valid: params, flops"):
        hidden_dim_for_target(swiglu, 32, 1000, match="none")


@pytest.mark.parametrize("name", ["swiglu", "geglu", "reglu", "gelu", "relu", "mix:gelu+relu"])
@pytest.mark.parametrize("match", ["params", "flops"])
def test_matched_hidden_dim_is_hidden_dim_for_the_dense_4x_target(name, match):
    from ffnlab.core.ffn import FFNSpec, hidden_dim_for_target, matched_hidden_dim

    spec = get_ffn_spec(name)
    for d_model, bias in ((32, False), (96, True), (768, False)):
        dense = FFNSpec("dense", "dense", spec.acts[:1], "", "")
        target = (
            ffn_param_count("dense", d_model, 4 * d_model, bias)
            if match == "params"
            else ffn_flops_per_token(dense, d_model, 4 * d_model, bias)
        )
        assert hidden_dim_for_target(spec, d_model, target, match, bias) == matched_hidden_dim(
            spec, d_model, match, bias
        )


SWITCH_X = "switch_x:gelu+silu+relu"


def test_switch_x_gate_learns_per_token_weights_and_is_parameter_matched():
    ffn = build_ffn(SWITCH_X, 16)
    gate = ffn.act
    h = torch.randn(2, 5, ffn.d_ff)
    assert_close(gate.weights(h), torch.full((2, 5, 3), 1 / 3))  # zero-initialised gate: equal weights
    ffn(torch.randn(4, 16)).square().sum().backward()
    assert gate.gate_weight.grad.abs().sum() > 0 and gate.gate_bias.grad.abs().sum() > 0
    torch.optim.SGD(ffn.parameters(), lr=0.1).step()
    w1, w2 = gate.weights(torch.randn(ffn.d_ff)), gate.weights(torch.randn(ffn.d_ff))
    assert_close(w1.sum(), torch.tensor(1.0))
    assert not torch.allclose(w1, w2)  # the mixture depends on the token
    dense = ffn_stats(build_ffn("gelu", 64)).params
    assert abs(ffn_stats(build_ffn(SWITCH_X, 64)).params - dense) <= 0.01 * dense  # the gate counted


@pytest.mark.parametrize(
    "name,needle",
    [
        ("switch_x:gelu", "two or more activations"),
        ("switch_x:gelu+nope", "'nope' in 'switch_x:gelu\\+nope' is not an activation; valid: relu, leaky_relu"),
        ("switch_x:gelu+swiglu", "not gated FFNs: 'swiglu'.*valid: relu"),
        ("switch_x:gelu+swish_beta", "has learned parameters; valid: relu"),
        ("switch_x:gelu+gelu", "repeated"),
    ],
)
def test_switch_x_bad_names_are_one_line_errors(name, needle):
    with pytest.raises(ValueError, match=needle) as err:
        get_ffn_spec(name)
    assert "\n" not in str(err.value)


# ---- per-layer schedules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule,n_layers,expected",
    [
        ("gelu*2+swiglu*2", 4, ["gelu", "gelu", "swiglu", "swiglu"]),
        ("gelu*4+swiglu*2", 6, ["gelu"] * 4 + ["swiglu"] * 2),
        ("SwiGLU*1+gelu*1+geglu-tanh*1", 3, ["swiglu", "gelu", "geglu_tanh"]),
        ("mix:gelu+silu*1+relu*1", 2, ["mix:gelu+silu", "relu"]),
        ("geglu", 3, ["geglu"] * 3),  # a plain name: one variant everywhere
    ],
)
def test_layer_variants_known_values(schedule, n_layers, expected):
    assert layer_variants(schedule, n_layers) == expected


@pytest.mark.parametrize(
    "name,canonical",
    [
        ("GELU*2+gelu*2", "gelu*4"),
        (" SwiGLU*1 + swiglu*2+gelu*1", "swiglu*3+gelu*1"),
        ("mix:GELU+silu*2", "mix:gelu+silu*2"),
        ("gelu*1+relu*1+gelu*1", "gelu*1+relu*1+gelu*1"),  # only neighbouring runs merge
    ],
)
def test_schedule_canonical_name(name, canonical):
    spec = get_ffn_spec(name)
    assert spec.kind == "schedule" and spec.name == canonical
    assert get_ffn_spec(spec.name) == spec


@pytest.mark.parametrize(
    "schedule,n_layers,match",
    [
        ("gelu*2+swiglue*2", 4, "bad schedule 'gelu\\*2\\+swiglue\\*2': unknown .*did you mean 'swiglu'"),
        ("gelu*2+swiglu*1", 4, "'gelu\\*2\\+swiglu\\*1' covers 3 layers but n_layers is 4"),
        ("gelu*4+swiglu*2", 4, "covers 6 layers but n_layers is 4"),
        ("gelu*0+swiglu*4", 4, "'gelu\\*0' needs a whole number of layers, at least 1"),
        ("gelu*-1+swiglu*5", 4, "'gelu\\*-1' needs a whole number of layers"),  # as written, not 'gelu*_1'
        ("GELU * -1", 4, "bad schedule 'GELU \\* -1': 'GELU\\*-1' needs"),
        ("gelu+swiglu*2", 4, "VARIANT\\*LAYERS joined by '\\+'"),
        ("gelu*2+", 2, "VARIANT\\*LAYERS"),
        ("gelu*2+swiglu*2", 0, "n_layers must be positive"),
    ],
)
def test_bad_schedules(schedule, n_layers, match):
    with pytest.raises(ValueError, match=match):
        layer_variants(schedule, n_layers)


@pytest.mark.parametrize("template", ["{}", "{}*2", "gelu*2+{}*2", "mix:gelu+{}", "switch_x:gelu+{}", "gelu*{}"])
def test_a_long_name_is_echoed_shortened(template):
    long = "y" * 100_000
    with pytest.raises(ValueError) as error:
        get_ffn_spec(template.format(long))
    assert len(str(error.value)) < 1000 and "characters)" in str(error.value)


def test_a_schedule_is_not_one_ffn():
    with pytest.raises(ValueError, match="per-layer schedule, not one FFN"):
        build_ffn("gelu*2+swiglu*2", 32)


def test_schedule_layers_each_match_the_dense_4x_ffn():
    d_model, n_layers = 128, 4
    rows = layer_sizes("gelu*1+swiglu*2+mix:gelu+silu*1", n_layers, d_model)
    assert [r["variant"] for r in rows] == ["gelu", "swiglu", "swiglu", "mix:gelu+silu"]
    assert [r["d_ff"] for r in rows] == [512, 344, 344, 512]  # each variant sized on its own
    dense = ffn_param_count("dense", d_model, 4 * d_model, bias=True)
    for r in rows:
        assert abs(r["params"] - dense) <= 0.01 * dense
        assert r["params"] == n_params(build_ffn(r["variant"], d_model))
    uniform = layer_sizes("gelu", n_layers, d_model)
    assert abs(sum(r["params"] for r in rows) - sum(r["params"] for r in uniform)) <= 0.01 * n_layers * dense
    (switch,) = layer_sizes("switch_x:gelu+relu+silu", 1, d_model)  # its gate over 3 candidates was left uncounted
    assert (
        switch["params"] == n_params(build_ffn(switch["variant"], d_model))
        and abs(switch["params"] - dense) <= 0.01 * dense
    )


@pytest.mark.parametrize("name", ["quantile", "energy_gated", "split_gelu_tanh", "exponential"])
def test_a_transformer_with_each_new_activation_trains(name):
    from ffnlab.core.model import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=50, context=16, n_layers=1, n_heads=2, d_model=32, ffn=name), seed=0)
    ffn = model.blocks[0].ffn
    assert isinstance(ffn, DenseFFN) and ffn.act.name == name and ffn.spec.name == name
    tokens = torch.randint(0, 50, (8, 17), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):  # one batch, memorised: the loss must fall
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.3, losses
    assert all(torch.isfinite(p.grad).all() for p in ffn.parameters())
