import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ffnlab.core.model import (
    ModelConfig,
    Transformer,
    layered_param_count,
    model_param_count,
    param_count,
    parse_attn_act,
)
from tests.conftest import assert_close

SMALL = dict(vocab_size=50, context=16, n_layers=2, n_heads=2, d_model=32)


@pytest.mark.parametrize(
    "opts",
    [
        dict(ffn="swiglu", pos="rope", norm="rmsnorm"),
        dict(ffn="gelu", placement="post"),
        dict(ffn="mix:gelu+silu", attn_proj_act="silu"),
        dict(ffn="relu", tie_embeddings=False, dropout=0.1),
    ],
)
def test_causal_masking(opts):
    model = Transformer(ModelConfig(**SMALL, **opts)).eval()
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 7) % 50  # change only future tokens
    a, _ = model(x)
    b, _ = model(y)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.equal(a[:, 10:], b[:, 10:])


def test_same_seed_gives_bitwise_identical_initial_loss():
    x = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = [Transformer(ModelConfig(**SMALL, ffn="swiglu"), seed=3)(x, x)[1] for _ in range(2)]
    assert torch.equal(losses[0], losses[1])
    other = Transformer(ModelConfig(**SMALL, ffn="swiglu"), seed=4)(x, x)[1]
    assert not torch.equal(losses[0], other)


def test_same_seed_shares_non_ffn_weights_across_variants():
    a = Transformer(ModelConfig(**SMALL, ffn="relu"), seed=5)
    b = Transformer(ModelConfig(**SMALL, ffn="swiglu"), seed=5)
    assert torch.equal(a.tok_emb.weight, b.tok_emb.weight)
    assert torch.equal(a.blocks[1].attn.qkv.weight, b.blocks[1].attn.qkv.weight)


def test_classifier_head_and_pooling():
    for pool in ("mean", "cls"):
        model = Transformer(ModelConfig(**SMALL, task="cls", n_classes=3, pool=pool))
        x = torch.randint(0, 50, (4, 16))
        logits, loss = model(x, torch.tensor([0, 1, 2, 0]))
        assert logits.shape == (4, 3) and loss.ndim == 0
        loss.backward()


def test_tied_embeddings_counted_once():
    tied = Transformer(ModelConfig(**SMALL, tie_embeddings=True))
    untied = Transformer(ModelConfig(**SMALL, tie_embeddings=False))
    assert param_count(untied) - param_count(tied) == 50 * 32
    assert tied.head.weight is tied.tok_emb.weight


def test_attention_maps_are_causal_distributions():
    model = Transformer(ModelConfig(**SMALL, pos="rope"))
    att = model.attention_maps(torch.randint(0, 50, (1, 8)), layer=1)
    assert att.shape == (1, 2, 8, 8)
    torch.testing.assert_close(att.sum(-1), torch.ones(1, 2, 8))
    assert torch.equal(att.triu(1), torch.zeros_like(att))


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(n_layers=0), "n_layers must be positive"),
        (dict(ffn="swiglue"), "did you mean 'swiglu'"),
        (dict(ffn="gelu*1+swiglu*2"), "covers 3 layers but n_layers is 2"),
        (dict(norm="batchnorm"), "valid: layernorm, rmsnorm"),
        (dict(d_ff=-1), "d_ff must be positive"),
        (dict(dropout=1.5), "dropout"),
        (dict(glu_norm="mid"), "unknown glu_norm 'mid'; valid: none, pre, post, both"),
        (dict(act_position="ffn_out"), "unknown act_position 'ffn_out'; valid: ffn, before_norm, after_residual"),
        (dict(act_position="before_norm", placement="post"), "placement 'post' has no norm before it"),
        (dict(act_position="after_residual", ffn="swiglu"), "'swiglu' is gated: use a dense variant"),
        (dict(act_position="before_norm", ffn="gelu*1+swiglu*1"), "'swiglu' is gated"),
        (dict(init="he_relu"), "unknown init 'he_relu'.*valid: lecun, he, he_gelu"),
    ],
)
def test_bad_config(bad, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**SMALL, **bad})


def test_too_long_sequence():
    model = Transformer(ModelConfig(**SMALL))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---- Q/K/V activations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, dict(q=None, k=None, v=None)),
        ("none", dict(q=None, k=None, v=None)),
        ("GELU", dict(q="gelu", k="gelu", v="gelu")),
        ("q=gelu,k=gelu,v=identity", dict(q="gelu", k="gelu", v=None)),
        ("v = silu", dict(q=None, k=None, v="silu")),
    ],
)
def test_parse_attn_act(text, expected):
    assert parse_attn_act(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("gelux", "unknown activation 'gelux'"),
        ("x=gelu", "unknown projection 'x'; valid: q, k, v"),
        ("q=gelu,q=relu", "'q' given twice"),
        ("gelu,k=relu", "key=activation pairs, got 'gelu'"),
        ("q=", "key=activation pairs"),
    ],
)
def test_parse_attn_act_bad_input(text, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**SMALL, attn_act=text)


@pytest.mark.parametrize(
    "canonical, spellings",
    [
        ("none", ["identity", "NONE", "q=none", "q=identity,k=none,v=identity"]),
        ("gelu", ["GELU", "q=gelu,k=gelu,v=gelu", "v=gelu,k=gelu,q=gelu"]),
        ("q=gelu,k=gelu", ["k=gelu,q=gelu", "q=gelu,k=gelu,v=identity", " q = GELU , k=gelu, v=none"]),
        ("q=gelu,v=silu", ["v=silu,q=gelu", "q=gelu,k=identity,v=silu"]),
    ],
)
def test_spellings_of_one_attn_act_are_one_run(canonical, spellings):
    """Each setting has one spelling, so an axis cannot train it twice as two cells; the spellings
    stores already hold (the README's, the presets') are that one, so their configs and ids stay."""
    from ffnlab.run.config import TrainConfig
    from ffnlab.study.plan import run_id

    def config(spec):
        return TrainConfig(model=ModelConfig(**SMALL, attn_act=spec))

    assert config(canonical).to_dict()["model"]["attn_act"] == canonical  # the JSON a run's id hashes
    for spec in spellings:
        assert config(spec).model.attn_act == canonical and run_id(config(spec)) == run_id(config(canonical))
    assert ModelConfig(**SMALL).attn_act is None  # the default stays off the config JSON


def test_attn_act_and_its_old_name_not_both():
    with pytest.raises(ValueError, match="not both"):
        ModelConfig(**SMALL, attn_act="gelu", attn_proj_act="gelu")


def projected_heads(attn_act=None, **kw):
    model = Transformer(ModelConfig(**SMALL, attn_act=attn_act, **kw), seed=0).eval()
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.blocks[0].attn.project_heads(x), model(torch.arange(16)[None])[0]


@pytest.mark.parametrize("key", ["q", "k", "v"])
def test_each_projection_activation_changes_only_its_projection(key):
    (plain, plain_out), (act, act_out) = projected_heads(), projected_heads(f"{key}=gelu")
    for i, name in enumerate("qkv"):
        assert torch.equal(plain[i], act[i]) != (name == key), name
    index = "qkv".index(key)
    assert torch.equal(act[index], torch.nn.functional.gelu(plain[index]))
    assert not torch.allclose(plain_out, act_out)


def test_one_name_and_the_old_field_mean_all_three():
    (plain, _), (act, out) = projected_heads(), projected_heads("relu")
    for i in range(3):
        assert torch.equal(act[i], plain[i].relu())
    (_, old_out) = projected_heads(attn_proj_act="relu")
    assert torch.equal(out, old_out)


def test_agelu_reads_its_blocks_attention_output_and_learns_beta():
    from ffnlab.core.activations import attention_context

    model = Transformer(ModelConfig(vocab_size=11, context=8, n_layers=1, n_heads=2, d_model=16, ffn="agelu"))
    block, seen = model.blocks[0], {}
    block.attn.register_forward_hook(lambda m, args, out: seen.update(attn=out))
    first_call = lambda m, args, out: None if "ffn" in seen else seen.update(ffn=(args[0], out))
    block.ffn.register_forward_hook(first_call)  # the model's own call, not the test's below
    idx = torch.randint(0, 11, (2, 8))
    _, loss = model(idx, idx)
    loss.backward()
    beta = block.ffn.act.beta
    assert beta.grad is not None and beta.grad.abs().item() > 0  # beta trains
    ffn_in, ffn_out = seen["ffn"]
    with torch.no_grad():
        bare = block.ffn(ffn_in)  # a = 1
        with attention_context(block.ffn, seen["attn"]):
            fed = block.ffn(ffn_in)
        with attention_context(block.ffn, 10 * seen["attn"]):  # another attention output
            other = block.ffn(ffn_in)
    torch.testing.assert_close(ffn_out, fed)  # the block fed its attention output
    assert not torch.allclose(ffn_out, bare) and not torch.allclose(fed, other)


def test_schedule_builds_each_layer_with_its_variant():
    model = Transformer(ModelConfig(**{**SMALL, "n_layers": 4}, ffn="GELU*1+gelu*1+swiglu*2"))
    assert [b.ffn.spec.name for b in model.blocks] == ["gelu", "gelu", "swiglu", "swiglu"]
    assert [type(b.ffn).__name__ for b in model.blocks] == ["DenseFFN", "DenseFFN", "GatedFFN", "GatedFFN"]
    assert [b.ffn.act.name for b in model.blocks] == ["gelu", "gelu", "silu", "silu"]


def test_schedule_is_parameter_matched_and_shares_non_ffn_weights():
    cfg = {**SMALL, "n_layers": 4}
    uniform = Transformer(ModelConfig(**cfg, ffn="gelu"), seed=7)
    scheduled = Transformer(ModelConfig(**cfg, ffn="swiglu*2+gelu*2"), seed=7)
    ffn_params = [sum(p.numel() for b in m.blocks for p in b.ffn.parameters()) for m in (uniform, scheduled)]
    assert abs(ffn_params[1] - ffn_params[0]) <= 0.01 * ffn_params[0]
    assert param_count(scheduled) - ffn_params[1] == param_count(uniform) - ffn_params[0]
    weights = dict(uniform.named_parameters())
    for name, p in scheduled.named_parameters():
        if ".ffn." not in name:
            assert torch.equal(p, weights[name]), name
    # the gelu layers (2, 3) start as the uniform gelu model's; the swiglu layers are new weights
    assert torch.equal(scheduled.blocks[3].ffn.w_in.weight, uniform.blocks[3].ffn.w_in.weight)


# ---- placements: the norm around the gate and where the activation sits -----------------------------


def pre_norm_block(block, h, ffn_sublayer):
    """A pre-norm block written out, its FFN sub-layer given: ffn_sublayer(h) with h after attention."""
    return ffn_sublayer(h + block.attn(block.norm1(h)))


@pytest.mark.parametrize("ffn", ["gelu", "swiglu", "gelu*1+swiglu*1"])
def test_default_placements_are_the_model_as_it_was(ffn):
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    implicit = Transformer(ModelConfig(**SMALL, ffn=ffn), seed=2)
    explicit = Transformer(ModelConfig(**SMALL, ffn=ffn, glu_norm="none", act_position="ffn"), seed=2)
    assert list(implicit.state_dict()) == list(explicit.state_dict())
    assert not any(k for k in implicit.state_dict() if "norm_in" in k or "norm_hidden" in k or "moved_act" in k)
    assert torch.equal(implicit(x, x)[1], explicit(x, x)[1])
    block = implicit.blocks[0]
    h = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))
    expected = pre_norm_block(block, h, lambda a: a + block.ffn(block.norm2(a)))  # the block before act_position
    assert torch.equal(block(h), expected)


@pytest.mark.parametrize("position", ["before_norm", "after_residual"])
def test_act_position_moves_the_activation(position):
    model = Transformer(ModelConfig(**SMALL, ffn="gelu", act_position=position), seed=3)
    inside = Transformer(ModelConfig(**SMALL, ffn="gelu"), seed=3)
    for (name, p), (_, q) in zip(model.named_parameters(), inside.named_parameters(), strict=True):
        assert torch.equal(p, q), name  # the same weights: a seed's runs are paired across positions
    block = model.blocks[0]
    ffn = block.ffn
    linear = lambda z: ffn.w_out(ffn.w_in(z))  # the FFN without its activation
    h = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))
    if position == "before_norm":
        expected = pre_norm_block(block, h, lambda a: a + linear(block.norm2(F.gelu(a))))
    else:
        expected = pre_norm_block(block, h, lambda a: F.gelu(a + linear(block.norm2(a))))
    assert_close(block(h), expected)
    assert not torch.allclose(block(h), inside.blocks[0](h))
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    model(x, x)[1].backward()
    assert all(p.grad is not None for p in model.parameters())


def test_glu_norm_reaches_the_gated_layers_only():
    model = Transformer(ModelConfig(**SMALL, ffn="gelu*1+swiglu*1", glu_norm="both", norm="rmsnorm"))
    dense, gated = model.blocks[0].ffn, model.blocks[1].ffn
    assert not hasattr(dense, "norm_in")
    assert isinstance(gated.norm_in, torch.nn.RMSNorm) and gated.norm_in.normalized_shape == (32,)
    assert isinstance(gated.norm_hidden, torch.nn.RMSNorm) and gated.norm_hidden.normalized_shape == (gated.d_ff,)
    plain = Transformer(ModelConfig(**SMALL, ffn="gelu*1+swiglu*1", norm="rmsnorm"))
    assert param_count(model) - param_count(plain) == 32 + gated.d_ff


# ---- the options from the command line: flags, axes, bad values -----------------------------------------

SMOKE_COMPARE = ["compare", "--preset", "smoke", "--seeds", 1, "--no-stats", "--steps", 4, "--eval-every", 4,
                 "--jobs", 1, "--quiet", "--no-report", "--json"]  # fmt: skip


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--variants", "swiglu", "--glu-norm", "mid"], "argument --glu-norm: invalid choice: 'mid'"),
        (["--variants", "gelu", "--act-position-axis", "ffn,inside"], "unknown act_position 'inside'"),
        (["--variants", "swiglu", "--act-position", "before_norm"], "'swiglu' is gated: use a dense variant"),
        (["--variants", "gelu", "--act-position", "after_residual", "--placement", "post"], "placement 'post'"),
        (["--variants", "swiglu", "--glu-norm-axis", "none,pre,pre"], "axis 'glu_norm' repeats a setting"),
        # dense FFNs have no gate: each cell trained the same runs again
        (["--variants", "relu,gelu", "--glu-norm-axis", "none,pre"], "relu, gelu have none, so every glu_norm"),
        (["--variants", "gelu", "--glu-norm", "both"], "gelu have none, so every glu_norm setting trains the same"),
        (["--variants", "gelu", "--init-axis", "he,he_gelu,he_relu"], "unknown init 'he_relu'"),
    ],
)
def test_bad_placement_values_exit_2_before_any_run(run_cli, tmp_path, args, needle):
    code, _, err = run_cli(*SMOKE_COMPARE, *args, "--store", tmp_path / "s.db")
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow  # five smoke runs and two studies: about 7 s on a loaded 2-core machine
def test_placement_axes_and_init_reach_the_runs(run_cli, tmp_path):
    from ffnlab.study.store import Store

    store = tmp_path / "s.db"
    code, out, err = run_cli(*SMOKE_COMPARE, "--variants", "gelu,swiglu", "--glu-norm-axis", "none,both",
                             "--init", "he_gelu", "--store", store)  # fmt: skip
    assert code == 0, err
    cells = json.loads(out)["cells"]
    assert [c["axes"]["glu_norm"] for c in cells] == ["none", "both"]
    mean = {(c["axes"]["glu_norm"], v["ffn"]): v["mean"] for c in cells for v in c["variants"]}
    assert mean["none", "swiglu"] != mean["both", "swiglu"]
    assert mean["none", "gelu"] == mean["both", "gelu"]  # no gate: glu_norm leaves a dense FFN as it is
    code, out, err = run_cli(*SMOKE_COMPARE, "--variants", "gelu", "--act-position-axis",
                             "ffn,before_norm,after_residual", "--store", store)  # fmt: skip
    assert code == 0, err
    means = [c["variants"][0]["mean"] for c in json.loads(out)["cells"]]
    assert len(set(means)) == 3  # same seed and data: each position trained a different model
    with Store(store, create=False) as s:
        models = [r.config["model"] for r in s.runs()]
    assert sorted((m["ffn"], m["glu_norm"], m["act_position"], m["init"]) for m in models) == sorted(
        [(v, g, "ffn", "he_gelu") for v in ("gelu", "swiglu") for g in ("none", "both")]
        + [("gelu", "none", p, "lecun") for p in ("ffn", "before_norm", "after_residual")]
    )


# ---- activation checkpointing --------------------------------------------------------------------


def loss_grads_and_saved(cfg: ModelConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """One training step's loss, gradients and bytes kept for backward, from seed 7 on a fixed batch."""
    from ffnlab.core.memory import saved_bytes

    model = Transformer(cfg, seed=7).train()
    x = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)  # the dropout masks
    out: list[torch.Tensor] = []
    saved = saved_bytes(lambda: out.append(model(x, x)[1]), exclude=model.parameters())
    out[0].backward()
    return out[0].detach(), {n: p.grad for n, p in model.named_parameters()}, saved


# agelu reads its block's attention output inside the FFN: a recomputed FFN must read it too
@pytest.mark.parametrize(
    "opts",
    [
        dict(ffn="gelu", dropout=0.1),
        dict(ffn="swiglu", placement="post"),
        dict(ffn="agelu", pos="rope"),
        dict(ffn="gelu", act_position="before_norm"),
        dict(ffn="swiglu", glu_norm="both"),
    ],
)
def test_checkpointing_keeps_the_numbers_and_less_for_backward(opts):
    loss, grads, saved = loss_grads_and_saved(ModelConfig(**SMALL, **opts))
    kept = {}
    for kind in ("block", "ffn"):
        ck_loss, ck_grads, kept[kind] = loss_grads_and_saved(
            ModelConfig(**SMALL, **opts, activation_checkpointing=kind)
        )
        assert torch.equal(ck_loss, loss)  # the same forward, the same dropout draws when run again
        for name, grad in grads.items():
            torch.testing.assert_close(ck_grads[name], grad, rtol=1e-6, atol=1e-7, msg=f"{kind}: {name}")
    assert kept["block"] < kept["ffn"] < saved


def test_checkpointing_is_a_choice():
    with pytest.raises(ValueError, match="unknown activation_checkpointing 'layer'; valid: none, block, ffn"):
        ModelConfig(activation_checkpointing="layer")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(ffn="gelu*2+swiglu*1+mix:relu+gelu*2", n_layers=5, tie_embeddings=False),
        dict(ffn="switch_x:relu+gelu+silu", pos="rope", attn_act="q=swish_beta,k=gelu"),
        dict(task="image", image_size=8, channels=3, pool="cls"),
        dict(ffn="gelu", act_position="before_norm", norm="rmsnorm"),
        dict(ffn="swiglu", glu_norm="both", task="cls", n_classes=5, placement="post"),
    ],
)
def test_model_param_count_is_the_built_models_count(kw):
    cfg = ModelConfig(**kw)
    assert model_param_count(cfg) == param_count(Transformer(cfg))


def test_layered_param_count_is_exact_for_alike_layers():
    build = lambda n: nn.Sequential(nn.Embedding(10, 4), *(nn.Linear(4, 4) for _ in range(n)), nn.Linear(4, 3))
    assert layered_param_count(build, 7, "fewer layers") == param_count(build(7))


def test_a_regressor_has_one_output_and_its_loss_is_the_mean_squared_error():
    model = Transformer(ModelConfig(n_layers=1, n_heads=2, d_model=32, context=16, vocab_size=20, task="reg"))
    idx, y = torch.randint(20, (3, 16), generator=torch.Generator().manual_seed(0)), torch.tensor([0.5, 4.0, 2.5])
    logits, loss = model(idx, y)
    assert logits.shape == (3, 1) and not model.blocks[0].attn.causal  # an encoder, pooled as a classifier
    assert loss == F.mse_loss(logits.squeeze(-1), y)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the one output is not rounded to bf16
        pooled = model.norm(model.blocks[0](model.embed(idx))).mean(dim=1)
        out = model(idx)[0]
    assert out.dtype == torch.float32 and torch.allclose(
        out, F.linear(pooled.float(), model.head.weight, model.head.bias)
    )
