import functools
import json
import warnings
from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

from ffnlab._util.jsonio import strict_dumps
from ffnlab.core.ffn import get_ffn_spec
from ffnlab.run.presets import preset_config
from ffnlab.study.advise import Situation, advise, format_advice
from ffnlab.study.advise.evidence import (
    ExcludedAlternative,
    MeasuredAlternative,
    MeasuredEvidence,
    PublishedAlternative,
    PublishedEvidence,
)
from ffnlab.study.advise.flow import (
    EVIDENCE,
    HARDWARE,
    RULES,
    STAGES,
    model_shape,
    training_memory_estimate,
    variant_params,
)
from ffnlab.study.advise.situation import parse_bytes, parse_params
from ffnlab.study.plan import run_id
from ffnlab.study.published import MODEL_FAMILIES, SHAZEER_2020_65K
from ffnlab.study.store import Store
from ffnlab.tools.hf import ActivationConfigWarning, model_activation
from tests.conftest import not_a_file, run_result, within

# per-seed noise shared by every variant, so paired differences are clean but means still vary
SEED_NOISE = (0.0, 0.03, -0.02)


def fabricated_store(
    path,
    losses: dict[str, float],
    step_time: dict[str, float] | None = None,
    params: dict[str, int] | None = None,
    diverged=(),
    jitter: dict[str, tuple] | None = None,
    memory: dict[str, int] | None = None,
    n_layers: int = 1,
    seeds: int = 3,
    context: int | None = None,
    task: str = "lm",
):
    """A store of finished runs with the given mean losses (span F1s for task tokens) over `seeds` paired seeds
    (fabricated inputs)."""
    base = preset_config("smoke")
    model = {"n_layers": n_layers, "task": task, **({"context": context} if context else {})}
    with Store(path) as store:
        for ffn, loss in losses.items():
            for seed, noise in enumerate(SEED_NOISE[:seeds]):
                cfg = replace(base, seed=seed, model=replace(base.model, ffn=ffn, **model))
                rid = run_id(cfg)
                store.claim(rid, cfg.to_dict())
                store.start(rid)
                value = loss + noise + (jitter or {}).get(ffn, (0, 0, 0))[seed]
                measured = {"final_val_f1": value, "final_val_acc": 0.9} if task == "tokens" else {}
                result = run_result(
                    ffn=ffn,
                    seed=seed,
                    task=task,
                    status="diverged" if ffn in diverged else "finished",
                    final_val_loss=None if ffn in diverged else value,
                    **measured,
                    params=(params or {}).get(ffn, 16_000),
                    step_time_s=(step_time or {}).get(ffn, 0.01),
                    train_mem_bytes=(memory or {}).get(ffn, 5 * 2**20),
                )
                store.add_metrics(rid, [(10, "val_loss", value), (10, "val_time", 0.5)])
                store.finish(rid, result)
    return path


def test_memory_budget_excludes_by_training_memory(tmp_path):
    store = fabricated_store(
        tmp_path / "s.db", {"relu": 2.0, "gelu": 1.98, "swiglu": 1.90}, memory={"swiglu": 12 * 2**20}
    )
    assert advise(store=store).recommendation == "swiglu"
    advice = advise(store=store, memory_budget="8MiB")
    assert advice.recommendation == "gelu"
    out = next(a for a in advice.alternatives if a.ffn == "swiglu")
    assert isinstance(out, ExcludedAlternative)
    assert "training memory 12 MiB" in out.excluded and "8 MiB" in out.excluded


@pytest.mark.parametrize("winner", ["swiglu", "gelu", "relu"])
def test_measured_recommends_the_variant_the_numbers_favour(tmp_path, winner):
    losses = {"relu": 2.00, "gelu": 1.98, "swiglu": 1.97}
    losses[winner] = 1.90
    other = next(v for v in losses if v != winner)
    store = fabricated_store(tmp_path / "s.db", losses, jitter={other: (0.002, -0.001, 0.0)})
    advice = advise(store=store)
    assert advice.recommendation == winner and advice.basis == "measured"
    assert isinstance(advice.evidence, MeasuredEvidence)
    assert advice.evidence.variants[winner].values == {s: losses[winner] + n for s, n in enumerate(SEED_NOISE)}
    text = " ".join(advice.reasons)
    assert "nats" in text and "95% CI" in text
    assert {a.ffn for a in advice.alternatives} == set(losses) - {winner}
    for a in advice.alternatives:
        assert isinstance(a, MeasuredAlternative)
        assert a.delta_vs_recommendation == pytest.approx(losses[a.ffn] - 1.90, abs=0.003)
        assert a.ci[0] > 0  # each alternative is worse than the winner beyond doubt
    assert winner in format_advice(advice).splitlines()[0]


def test_a_tagger_study_words_its_differences_in_span_f1(tmp_path):
    """advise --store on a token-task study called the differences in span F1 'accuracy'."""
    store = fabricated_store(tmp_path / "s.db", {"relu": 0.60, "gelu": 0.62, "swiglu": 0.70}, task="tokens")
    advice = advise(store=store)
    assert advice.recommendation == "swiglu"  # F1 is higher-better: the largest wins
    text = " ".join(advice.reasons)
    assert "+0.080 F1 vs gelu" in text and "best mean final val F1" in text
    assert "accuracy" not in text


def test_latency_sensitive_prefers_the_faster_of_tied_variants(tmp_path):
    # swiglu and gelu are statistically tied (noisy pairs); gelu is 30% faster
    store = fabricated_store(
        tmp_path / "s.db",
        {"relu": 2.2, "gelu": 1.951, "swiglu": 1.950},
        step_time={"relu": 0.010, "gelu": 0.010, "swiglu": 0.013},
        jitter={"gelu": (0.02, -0.03, 0.015)},
    )
    assert advise(store=store).recommendation == "swiglu"
    fast = advise(store=store, latency_sensitive=True)
    assert fast.recommendation == "gelu"
    assert any("faster" in r for r in fast.reasons)


def test_constraints_exclude_variants_and_say_why(tmp_path):
    store = fabricated_store(
        tmp_path / "s.db",
        {"relu": 2.0, "gelu": 1.95, "swiglu": 1.9, "geglu": 1.85},
        params={"swiglu": 20_000, "relu": 16_000, "gelu": 16_000},
        diverged=("geglu",),
    )
    advice = advise(store=store, params_budget="18k")
    assert advice.recommendation == "gelu"
    excluded = {a.ffn: a.excluded for a in advice.alternatives if isinstance(a, ExcludedAlternative)}
    assert "exceed the budget" in excluded["swiglu"] and "diverged" in excluded["geglu"]
    with pytest.raises(ValueError, match="no measured variant can be recommended: .*exceed the budget"):
        advise(store=store, params_budget=1000)


@pytest.mark.parametrize(
    "config,ffn,act",
    [
        ({"model_type": "bert", "hidden_act": "gelu", "architectures": ["BertForMaskedLM"]}, "gelu", "gelu"),
        ({"model_type": "gpt2", "activation_function": "gelu_new"}, "gelu_new", "gelu_new"),
        ({"model_type": "llama", "hidden_act": "silu"}, "swiglu", "silu"),
        ({"model_type": "t5", "feed_forward_proj": "gated-gelu"}, "geglu_tanh", "gelu_new"),
        ({"model_type": "t5", "feed_forward_proj": "relu"}, "relu", "relu"),
        (
            {"model_type": "gemma", "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"},
            "geglu_tanh",
            "gelu_pytorch_tanh",
        ),
    ],
)
def test_pretrained_config_keeps_its_activation(tmp_path, config, ffn, act):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    advice = advise(pretrained=str(path), store=tmp_path / "ignored.db")
    assert advice.recommendation == ffn and advice.basis == "pretrained"
    assert advice.evidence.model.act == act
    get_ffn_spec(ffn)  # a variant ffnlab can build
    assert advise(pretrained=str(tmp_path)).recommendation == ffn  # the folder holding config.json
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ActivationConfigWarning)  # Gemma's two names: tests/test_hf.py
        assert model_activation(config) == act  # swap_ffn reads the config as advise does (one reader)


@pytest.mark.parametrize("kind", ["fifo", "link", "device"])
def test_a_pretrained_config_that_is_no_regular_file_is_refused_by_its_kind(run_cli, tmp_path, kind):
    path, message = not_a_file(tmp_path, kind)  # a FIFO blocked, /dev/zero was read without end
    for given in [path, path.parent] if kind != "device" else [path]:  # the file, or the folder holding it
        code, _, err = within(30, functools.partial(run_cli, "advise", "--pretrained", given))
        assert code == 2 and err == f"ffnlab: error: the model config {path} {message}\n"


def test_a_dangling_pretrained_config_is_refused_as_such(run_cli, tmp_path):
    (tmp_path / "config.json").symlink_to(tmp_path / "gone.json")
    code, _, err = run_cli("advise", "--pretrained", tmp_path / "config.json")  # was "no model config at"
    assert code == 2 and err.endswith(
        f"is a symbolic link to {tmp_path / 'gone.json'}, which does not exist; give a regular file\n"
    )


def test_pretrained_bert_says_why(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_act": "gelu"}))
    advice = advise(pretrained=str(path))
    text = " ".join(advice.reasons)
    assert advice.recommendation == "gelu"
    assert "pre-trained with gelu" in text and "weights" in text and "keep gelu" in text.lower()


@pytest.mark.parametrize("family", MODEL_FAMILIES, ids=lambda f: f.family)
def test_known_model_names(family):
    advice = advise(pretrained=family.example)
    assert advice.recommendation == family.ffn
    assert family.hf_act in advice.evidence.model.source


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(ValueError, match="unknown pretrained model 'frobnicator-7b'.*bert-base-uncased"):
        advise(pretrained="frobnicator-7b")


def test_without_store_cites_the_published_source():
    # a size at the published scale prefers nothing (with nothing stated, the first-attempt rule would pick)
    advice = advise(model_size="350M")
    table = SHAZEER_2020_65K
    assert advice.basis == "published" and isinstance(advice.evidence, PublishedEvidence)
    assert advice.recommendation == min(table.values, key=table.values.get)
    assert advice.evidence.tables[0].arxiv == "2002.05202" and "Shazeer 2020" in advice.evidence.tables[0].source
    assert "published results" in advice.reasons[0] and "Table 1" in advice.reasons[0]
    assert advice.command.startswith("ffnlab compare --variants ")
    for a in advice.alternatives:
        assert isinstance(a, PublishedAlternative) and a.published == table.values[a.ffn]


def test_published_cost_sensitive_picks_the_cheapest_tied_variant():
    from ffnlab.core.activations import ACTIVATIONS

    table = SHAZEER_2020_65K
    best = min(table.values, key=table.values.get)
    advice = advise(deploy="cpu")
    choice = advice.recommendation
    assert choice != best
    assert table.values[choice] - table.values[best] <= max(table.spread[choice], table.spread[best])
    flops = lambda n: ACTIVATIONS[get_ffn_spec(n).acts[0]].flops
    assert flops(choice) <= flops(best)


def test_published_numbers_name_table_columns():
    assert set(SHAZEER_2020_65K.values) == set(SHAZEER_2020_65K.spread) == set(SHAZEER_2020_65K.names)
    assert "65,536" in SHAZEER_2020_65K.table
    for name in SHAZEER_2020_65K.values:
        get_ffn_spec(name)


@pytest.mark.parametrize(
    "text,value", [("125M", 125_000_000), ("7B", 7_000_000_000), ("1.5e6", 1_500_000), ("18k", 18_000)]
)
def test_parse_params(text, value):
    assert parse_params(text) == value


@pytest.mark.parametrize(
    "text,value", [("16GB", 16_000_000_000), ("2GiB", 2 * 2**30), ("512M", 512 * 2**20), ("100", 100)]
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_advise_cli_json(run_cli, tmp_path):
    store = fabricated_store(tmp_path / "s.db", {"relu": 2.0, "swiglu": 1.9})
    code, out, err = run_cli("advise", "--store", store, "--json")
    assert code == 0, err
    advice = json.loads(out)
    assert {"recommendation", "reasons", "evidence", "alternatives"} <= set(advice)
    assert advice["recommendation"] == "swiglu"
    assert advice == json.loads(strict_dumps(advise(store=store).to_json()))  # the library's advice, as JSON
    code, out, _ = run_cli("advise")
    assert code == 0 and "Shazeer 2020" in out and "ffnlab compare" in out
    assert out.strip() == format_advice(advise())


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--store", "{tmp}/missing.db"], "no run store at"),
        (["--store", "{tmp}/empty.db"], "holds no finished runs"),
        (["--params-budget", "lots"], "cannot read parameter budget 'lots'"),
        (["--pretrained", "{tmp}/nope/config.json"], "no model config at"),
        (["--deploy", "tpu"], "invalid choice"),
        (["--hardware", "tpu"], "invalid choice"),
        (["--situation", "pretraining"], "invalid choice"),
        (["--situation", "peft"], "give --pretrained"),
        (["--situation", "pretrain", "--pretrained", "gpt2"], "give one of them"),
        (["--deploy", "cpu", "--hardware", "mobile"], "contradicts --hardware mobile"),
        (["--model-size", "huge"], "cannot read model size 'huge'"),
        (["--model-size", "1e400"], "model size must be positive and at most 1e15, got '1e400'"),  # was 'infB'
        (["--model-size", "2e15"], "at most 1e15"),
        (["--params-budget", "1e400"], "parameter budget must be positive and at most 1e15, got '1e400'"),
        (["--memory-budget", "1e400GiB"], "memory budget must be positive and at most 1e18, got '1e400GiB'"),
        (["--memory-budget", "0GiB"], "memory budget must be positive"),
        (["--seq-len", "0"], "--seq-len"),
        (["--model-size", "1B", "--hardware", "gpu-8gb", "--seq-len", "1000000"], "no published variant fits"),
        (["--model-size", "7B", "--params-budget", "1B"], "no published variant fits the budgets at 7B"),
        (["--priority", "speed"], "invalid choice"),
    ],
)
def test_advise_cli_bad_input(run_cli, tmp_path, argv, needle):
    with Store(tmp_path / "empty.db") as s:  # a store with only a pending run
        s.claim("x", {"model": {"ffn": "relu"}})
    code, out, err = run_cli("advise", *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and out == ""


def test_advise_cli_json_is_strict_json(run_cli, monkeypatch):
    import ffnlab.study.advise

    advice = SimpleNamespace(to_json=lambda: {"size": float("inf"), "gap": float("nan")})
    monkeypatch.setattr(ffnlab.study.advise, "advice_for", lambda *a, **kw: advice)
    code, out, err = run_cli("advise", "--json")
    assert code == 0, err
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON")) == {"size": "inf", "gap": "nan"}


# ---- the decision flow: one row per branch ----------------------------------------------------------

SHAPE_350M = model_shape(350e6)
DENSE_350M, GATED_350M = (training_memory_estimate(f, 350e6, SHAPE_350M, 2048) for f in ("gelu", "swiglu"))
PARAMS_DENSE_7B, PARAMS_GATED_7B = (variant_params(f, 7e9, model_shape(7e9)) for f in ("gelu", "swiglu"))

FLOW = [
    # (inputs, recommendation, branch, rules applied, words the reasons must hold)
    ({}, "gelu", "pretrain/published", ["first-attempt"], ["Shazeer 2020", "seed 002 says GELU first"]),
    ({"hardware": "mobile"}, "silu", "pretrain/published", ["mobile-swish"], ["Swish or HardSwish", "FP16 and INT8"]),
    ({"deploy": "edge"}, "silu", "pretrain/published", ["mobile-swish"], ["seed 002"]),
    ({"hardware": "cpu"}, "swiglu", "pretrain/published", ["cpu-cheap"], ["cheaper of the tied"]),
    ({"latency_sensitive": True}, "swiglu", "pretrain/published", ["cpu-cheap"], ["latency-sensitive"]),
    ({"hardware": "cpu", "seq_len": 512}, "swiglu", "pretrain/published", ["cpu-cheap", "short-context"], ["63%"]),
    (
        {"hardware": "cpu", "seq_len": 32768},
        "geglu",
        "pretrain/published",
        ["long-text", "long-context"],
        ["15%", "quality"],
    ),
    ({"model_size": "50M"}, "geglu", "pretrain/published", ["small-model"], ["below the scale", "measure"]),
    ({"model_size": "350M"}, "geglu", "pretrain/published", ["mid-model"], ["Narang"]),
    ({"model_size": "7B"}, "swiglu", "pretrain/published", ["large-model"], ["LLaMA", "PaLM", "7B model"]),
    (
        {"model_size": "350M", "hardware": "gpu-80gb"},
        "geglu",
        "pretrain/published",
        ["mid-model", "gpu-memory"],
        ["gpu-80gb", "80 GiB", "keeps gate, up"],
    ),
    (  # a memory budget between the dense and the gated estimate rules out every gated variant
        {"model_size": "350M", "memory_budget": (DENSE_350M + GATED_350M) / 2},
        "gelu",
        "pretrain/published",
        ["budget-exclusion"] * 5 + ["mid-model"],
        ["Budgets rule out", "training memory"],
    ),
    (  # so does a parameter budget, even for a large model (the budget beats the large-model rule)
        {"model_size": "7B", "params_budget": (PARAMS_DENSE_7B + PARAMS_GATED_7B) / 2},
        "gelu",
        "pretrain/published",
        ["budget-exclusion"] * 5 + ["large-model"],
        ["exceed the budget"],
    ),
    (
        {"pretrained": "bert-base-uncased"},
        "gelu",
        "finetune/pretrained",
        ["keep-pretrained", "finetune-swap"],
        ["costs accuracy", "0.5x the learning rate"],
    ),
    (
        {"situation": "peft", "pretrained": "meta-llama/Llama-2-7b-hf"},
        "swiglu",
        "peft/pretrained",
        ["peft-frozen"],
        ["frozen", "LoRA"],
    ),
    (
        {"situation": "inference", "pretrained": "gpt2"},
        "gelu_new",
        "inference/pretrained",
        ["inference-fixed", "inference-gelu-exact", "inference-dense"],
        ["tanh-approximation", "not an exact substitute"],
    ),
    (
        {"situation": "inference", "pretrained": "google/gemma-7b"},
        "geglu_tanh",
        "inference/pretrained",
        ["inference-fixed", "inference-gelu-exact", "inference-fused"],
        ["fused kernel", "ffnlab bench"],
    ),
    (
        {"situation": "inference", "pretrained": "meta-llama/Llama-2-7b-hf", "hardware": "gpu-24gb"},
        "swiglu",
        "inference/pretrained",
        ["inference-fixed", "inference-fused"],
        ["exact up to rounding"],
    ),
    (
        {"situation": "inference", "pretrained": "bert-base-uncased", "deploy": "edge"},
        "gelu",
        "inference/pretrained",
        ["inference-fixed", "inference-gelu-exact", "inference-dense", "inference-export"],
        ["exact (erf)", "ffnlab export --ffn gelu", "onnxruntime"],
    ),
    # the published rules as data (tests/test_advise_rules.py has every tier)
    ({"depth": 4}, "relu", "pretrain/published", ["depth-shallow"], ["ffnlab's reading", "fewer than 6"]),
    ({"depth": 8}, "gelu", "pretrain/published", ["depth-mid"], ["ffnlab's reading", "from 6 to 12"]),
    ({"depth": 24}, "gelu", "pretrain/published", ["depth-deep"], ["seed 002 says GELU", "more than 12"]),
    ({"hardware": "gpu-8gb"}, "gelu", "pretrain/published", ["vram-small"], ["less than 16 GB"]),
    ({"hardware": "gpu-24gb"}, "gelu", "pretrain/published", ["vram-mid"], ["from 16 to 32 GB"]),
    ({"hardware": "gpu-80gb"}, "geglu", "pretrain/published", ["vram-large"], ["more than 32 GB"]),
    (
        {"hardware": "gpu-16gb", "model_size": "1B"},
        "gelu",
        "pretrain/published",
        ["budget-exclusion"] * 8 + ["memory-fit", "large-model", "gpu-memory"],
        ["smaller width", "d_model 1216 at 24 layers"],
    ),
    (
        {"depth": 8, "seq_len": 16384},
        "geglu",
        "pretrain/published",
        ["long-text", "depth-mid", "long-context"],
        ["GEGLU"],
    ),
    (
        {"priority": "research", "hardware": "cpu"},
        "geglu",
        "pretrain/published",
        ["priority-research"],
        ["5 or more seeds"],
    ),
    ({"priority": "industrial"}, "gelu", "pretrain/published", ["priority-industrial"], ["GELU by default", "GEGLU"]),
    ({"priority": "maintenance"}, "gelu", "pretrain/published", ["priority-maintenance"], ["widely supported"]),
    # seed 000's tables (their cells unknown: no pick), seed 002's troubleshooting (checks, no pick)
    ({"task_type": "nlp"}, "geglu", "pretrain/published", ["task-nlp"], ["table for NLP", "not quoted"]),
    ({"task_type": "cv"}, "geglu", "pretrain/published", ["task-cv"], ["table for CV", "not quoted"]),
    (
        {"symptom": "nan"},
        "no variant: check the init, then the learning rate, then the training precision, then the activation's "
        "numerics, then the activation",
        "pretrain/checks",
        ["symptom-nan"],
        ["NaN loss", "init and lr before the activation"],
    ),
    ({"symptom": "slow"}, None, "pretrain/checks", ["symptom-slow"], ["Slower training"]),
    ({"symptom": "mismatch"}, None, "pretrain/checks", ["symptom-mismatch"], ["differ between frameworks"]),
]


@pytest.mark.parametrize("inputs,recommendation,branch,rules,words", FLOW, ids=lambda v: None)
def test_the_flow_branches_with_a_reason_and_its_evidence(inputs, recommendation, branch, rules, words):
    advice = advise(**inputs)
    assert advice.recommendation == recommendation or (recommendation is None and advice.basis == "checks")
    assert advice.branch == branch
    assert [r.rule for r in advice.rules] == rules
    text = " ".join(advice.reasons)
    for word in words:
        assert word in text, word
    for applied in advice.rules:
        assert applied.evidence in EVIDENCE and applied.source
        assert f"[{applied.evidence}] {applied.text}" in text  # marked as such in the output


def test_every_rule_has_a_branch_in_the_flow_table():
    hit = {rule for _, _, _, rules, _ in FLOW for rule in rules}
    # measured on mobile: its own test below; a measured deployment: tests/test_advise_deploy.py
    assert hit | {"mobile-measured", "deploy-measured", "deploy-mobile-int8"} == set(RULES)
    for rule in RULES.values():
        assert rule.evidence in EVIDENCE and rule.source


def test_a_budget_that_rules_out_the_best_variant_changes_the_published_pick():
    free = advise(model_size="350M", seq_len=2048)
    tight = advise(model_size="350M", seq_len=2048, memory_budget=(DENSE_350M + GATED_350M) / 2)
    assert free.recommendation == "geglu" and tight.recommendation == "gelu"
    excluded = {a.ffn: a.excluded for a in tight.alternatives if isinstance(a, PublishedAlternative) and a.excluded}
    assert set(excluded) == {"geglu", "swiglu", "reglu", "bilinear", "glu"}
    assert "exceeds the budget" in excluded["geglu"]
    # without a model size nothing can be estimated: the pick stays, and the advice says what is missing
    unsized = advise(memory_budget="1GiB")
    assert unsized.recommendation == "geglu"
    assert any("give --model-size" in r for r in unsized.reasons)


def test_the_published_advice_ends_with_measuring_it_and_a_checkpoint_says_what_it_ignored():
    assert advise(model_size="7B", seq_len=4096).reasons[-1].startswith("Measure it on your own data")
    reasons = advise(situation="finetune", pretrained="gpt2", model_size="7B", seq_len=4096).reasons
    assert (
        reasons[-1]
        == "The model size, the sequence length did not change this: the checkpoint fixes the activation (finetune)."
    )
    reasons = advise(pretrained="gpt2", task_type="nlp").reasons
    assert reasons[-1] == "The task type did not change this: the checkpoint fixes the activation (finetune)."


def test_a_gpu_tier_is_a_memory_budget():
    advice = advise(hardware="gpu-24gb", memory_budget="40GiB")
    assert advice.situation.memory_budget == 24 * 2**30 and advice.situation.deploy == "gpu"
    assert advise(hardware="gpu-24gb", memory_budget="8GiB").situation.memory_budget == 8 * 2**30
    # a 7B model does not fit 80 GiB by the estimate: GELU at a width that does, not an error
    advice = advise(hardware="gpu-80gb", model_size="7B")
    assert advice.recommendation == "gelu" and advice.decided_by == ["memory-fit"]


def test_on_mobile_the_measurements_pick_a_tied_variant_seed_002_names(tmp_path):
    # swiglu and silu are statistically tied (noisy pairs), equally fast; gelu is clearly worse
    store = fabricated_store(
        tmp_path / "s.db", {"gelu": 2.2, "silu": 1.951, "swiglu": 1.950}, jitter={"silu": (0.02, -0.03, 0.015)}
    )
    assert advise(store=store, hardware="cpu").recommendation == "swiglu"
    advice = advise(store=store, hardware="mobile")
    assert advice.recommendation == "silu" and [r.rule for r in advice.rules] == ["mobile-measured"]
    assert any(r.startswith("[rule of thumb] On mobile") and "Swish or HardSwish" in r for r in advice.reasons)
    assert any("suits the hardware" in r for r in advice.reasons)
    assert f"ffnlab deploy --store {store} --precisions fp32,fp16,int8" in " ".join(advice.reasons)
    # a variant the measurements separate from the best is not picked: both are said, the measurement first
    store = fabricated_store(tmp_path / "t.db", {"gelu": 2.2, "silu": 2.05, "swiglu": 1.950})
    advice = advise(store=store, deploy="edge")
    assert advice.recommendation == "swiglu" and [r.rule for r in advice.rules] == ["mobile-swish"]
    line = next(r for r in advice.reasons if "Swish or HardSwish" in r)
    assert line.startswith(f"ffnlab measurement ({store}): silu +0.100 nats vs swiglu")
    assert line.index("ffnlab measurement") < line.index("seed 002")


def test_a_gpu_tier_excludes_measured_variants_by_training_memory(tmp_path):
    store = fabricated_store(
        tmp_path / "s.db", {"relu": 2.0, "gelu": 1.98, "swiglu": 1.90}, memory={"swiglu": 17 * 2**30}
    )
    assert advise(store=store, hardware="gpu-24gb").recommendation == "swiglu"
    advice = advise(store=store, hardware="gpu-16gb")
    assert advice.recommendation == "gelu" and advice.branch == "pretrain/measured"


def test_memory_estimate_grows_with_gating_and_context():
    shape = model_shape(125e6)
    assert shape.d_model == 768 and shape.n_layers == 12
    dense, gated = (training_memory_estimate(f, 125e6, shape, 1024) for f in ("relu", "reglu"))
    # the gated FFN keeps 16/3 more bytes per token and unit of d_model in every layer
    assert gated - dense == pytest.approx(
        12 * 1024 * 768 * 16 / 3 + 16 * (variant_params("reglu", 125e6, shape) - 125e6)
    )
    assert training_memory_estimate("relu", 125e6, shape, 2048) > 2 * dense - 16 * 125e6


def test_advise_help_lists_every_input_of_the_flow(capsys):
    from ffnlab.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["advise", "--help"])
    assert exit.value.code == 0
    flat = " ".join(capsys.readouterr().out.split())
    for flag in ("--situation", "--pretrained", "--store", "--hardware", "--deploy", "--seq-len", "--model-size"):
        assert flag in flat
    for flag in ("--params-budget", "--memory-budget", "--latency-sensitive", "--depth"):
        assert flag in flat
    for choice in (*STAGES, *HARDWARE):
        assert choice in flat


def test_advise_cli_json_keeps_its_keys_and_adds_the_flow(run_cli):
    code, out, err = run_cli("advise", "--situation", "inference", "--pretrained", "gpt2", "--json")
    assert code == 0, err
    advice = json.loads(out)
    assert {"recommendation", "basis", "reasons", "evidence", "alternatives", "command"} <= set(advice)
    assert advice["situation"]["stage"] == "inference" and advice["branch"] == "inference/pretrained"
    assert advice["implementation"] and all(r["evidence"] in EVIDENCE for r in advice["rules"])
    code, out, err = run_cli("advise", "--hardware", "mobile", "--model-size", "125M", "--seq-len", "1024", "--json")
    advice = json.loads(out)
    assert code == 0 and advice["recommendation"] == "silu"
    assert advice["situation"]["hardware"] == "mobile" and advice["situation"]["seq_len"] == 1024
    assert advice["situation"]["model_size"] == 125e6


def test_the_suggested_command_quotes_a_schedule():
    from ffnlab.study.advise.command import compare_command

    assert compare_command(["gelu", "swiglu"], "shakespeare", None).startswith("ffnlab compare --variants gelu,swiglu ")
    command = compare_command(["gelu", "gelu*2+swiglu*2"], "shakespeare", 4)
    assert "--variants 'gelu,gelu*2+swiglu*2' " in command and command.endswith("--layers 4")


# ---- the advice as a record, its JSON, and the flags of its situation ---------------------------------------

ALWAYS = ["recommendation", "basis", "reasons", "evidence", "alternatives"]


def test_advise_json_keeps_its_keys_in_order_for_every_basis(tmp_path):
    def keys(advice):
        return list(advice.to_json())

    tail = ["situation", "branch"]
    assert keys(advise(model_size="350M")) == ALWAYS + ["command", "rules"] + tail
    assert keys(advise()) == ALWAYS + ["command", "rules"] + tail + ["decided_by", "checks"]  # a first attempt
    assert keys(advise(symptom="nan")) == ALWAYS + ["command", "rules"] + tail + ["checks"]
    assert (
        keys(advise(situation="inference", pretrained="gpt2")) == ALWAYS + ["command", "rules", "implementation"] + tail
    )
    store = fabricated_store(tmp_path / "s.db", {"relu": 2.0, "swiglu": 1.9})
    assert keys(advise(store=store)) == ALWAYS + ["command", "cell", "rules"] + tail
    fabricated_store(store, {"relu": 2.1, "swiglu": 1.95}, n_layers=2)  # a depth axis: two cells, advised apart
    two = advise(store=store)
    assert keys(two) == ALWAYS + ["cells", "command", "rules"] + tail
    assert [keys(cell) for cell in two.cells] == [ALWAYS + ["command", "cell", "rules"]] * 2
    assert [cell.cell for cell in two.cells] == [{"depth": 1}, {"depth": 2}]
    assert list(two.to_json()["situation"]) == ["params_budget", "memory_budget", "latency_sensitive", "deploy",
                                                "depth", "stage", "hardware", "seq_len", "model_size",
                                                "priority", "task_type", "symptom"]  # fmt: skip
    assert keys(advise(depth=4)) == ALWAYS + ["command", "rules"] + tail + ["decided_by"]  # a rule decided
    assert two.to_json()["cells"][0] == two.cells[0].to_json()
    text = format_advice(two)
    assert "cell depth=1:" in text and "cell depth=2:" in text and text.count("measure it on your data") == 1


def advise_flags() -> dict[str, object]:
    """{dest: action} of the advise command's flags, read off the parser."""
    from ffnlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["advise"]
    return {a.dest: a for a in sub._actions if a.option_strings}


def test_every_field_of_the_situation_is_a_flag_with_its_comment_as_help():
    flags = advise_flags()
    assert set(flags) == {f.name for f in fields(Situation)} | {"help", "store", "json"}
    assert flags["stage"].option_strings == ["--situation"] and tuple(flags["stage"].choices) == STAGES
    assert tuple(flags["hardware"].choices) == HARDWARE and "also a memory budget" in flags["hardware"].help
    assert all(flags[f.name].help for f in fields(Situation))


def test_the_flags_give_the_situation_the_library_takes():
    from ffnlab.cli import build_parser
    from ffnlab.flags import given

    argv = ["advise", "--situation", "peft", "--pretrained", "gpt2", "--model-size", "7B", "--memory-budget", "2GiB",
            "--seq-len", "512", "--latency-sensitive"]  # fmt: skip
    situation = Situation(**given(build_parser().parse_args(argv), Situation))
    assert situation == Situation(
        stage="peft", pretrained="gpt2", model_size=7e9, memory_budget=2 * 2**30, seq_len=512, latency_sensitive=True
    )
    assert given(build_parser().parse_args(["advise"]), Situation) == {}  # nothing given: the library's defaults


def test_a_situation_is_checked_when_made_and_resolved_once():
    with pytest.raises(ValueError, match="unknown hardware 'tpu'"):
        Situation(hardware="tpu")
    with pytest.raises(ValueError, match="--depth must be between 1 and 10,000, got 0"):
        Situation(depth=0)
    with pytest.raises(ValueError, match="--depth must be between 1 and 10,000, got 1,000,000,000,000"):
        Situation(depth=10**12)  # was 'You plan 1000000000000 layers'
    with pytest.raises(ValueError, match="--seq-len must be between 1 and 1,000,000,000, got 100,000,000,000"):
        Situation(seq_len=10**11)
    with pytest.raises(ValueError, match="give --pretrained"):
        Situation(stage="inference")
    stated = Situation(deploy="edge", memory_budget=64 * 2**30)
    resolved = stated.resolved()
    assert (resolved.stage, resolved.hardware, resolved.deploy, resolved.memory_budget) == (
        "pretrain", "mobile", "edge", 64 * 2**30)  # fmt: skip
    assert resolved.resolved() == resolved
    tier = Situation(hardware="gpu-16gb", pretrained="gpt2").resolved()
    assert (tier.stage, tier.deploy, tier.memory_budget) == ("finetune", "gpu", 16 * 2**30)
