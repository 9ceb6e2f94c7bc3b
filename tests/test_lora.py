"""LoRA through peft on a pretrained folder (ffnlab.tools.lora): tiny BERT, GPT-2 and LLaMA folders built here."""

import csv
import json
import random
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.run.train import default_factory, prepare, resolve_init, resolve_lora, train
from ffnlab.study.plan import Study, plan, run_id
from ffnlab.tools.hf import build_hf_model, save_unswapped
from ffnlab.tools.lora import load_adapter
from ffnlab.tools.pretrained import load_pretrained
from tests.conftest import assert_close
from tests.test_pretrained import GPT2, LLAMA  # the same tiny shapes

BERT = dict(model_type="bert", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
FAMILIES = {"bert": (BERT, "gelu", "silu"), "gpt2": (GPT2, "gelu_new", "relu"), "llama": (LLAMA, "swiglu", "geglu")}
VOCAB, CONTEXT = 256, 32  # the byte tokenizer's vocabulary
SMALL = dict(batch_size=4, eval_every=100, eval_batches=1, final_eval_batches=1, precision="fp32", warmup_steps=1)
FLAGS = ["--steps", 3, "--batch-size", 4, "--eval-batches", 1, "--final-eval-batches", 1, "--precision", "fp32",
         "--tokenizer", "byte"]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{family: save_pretrained folder} of tiny random models (vocabulary 256: the byte tokenizer's), and a
    two-class CSV under 'data'."""
    root = tmp_path_factory.mktemp("lora")
    out = {}
    for name, (config, own, _) in FAMILIES.items():
        out[name] = root / name
        save_unswapped(build_hf_model(config, own, vocab_size=VOCAB, context=CONTEXT, seed=1).hf, out[name])
    saved = json.loads((out["bert"] / "config.json").read_text())  # a BERT as published: not ffnlab's causal LM
    (out["bert"] / "config.json").write_text(json.dumps({**saved, "is_decoder": False}))
    rng = random.Random(0)
    out["data"] = root / "cls.csv"
    with open(out["data"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(200):
            label = rng.randrange(2)
            writer.writerow([("good fine " if label else "bad poor ") + str(rng.randrange(1000)), label])
    return out


def config(folders, family: str, ffn: str, task: str = "lm", **kw) -> TrainConfig:
    data = {"data": str(folders["data"])} if task == "cls" else {}
    return TrainConfig(
        model=ModelConfig(ffn=ffn, task=task, context=CONTEXT),
        init_from=str(folders[family]),
        tokenizer="byte",
        peft="lora",
        max_steps=3,
        **{**SMALL, **data, **kw},
    )


def trained(cfg: TrainConfig, **kw):
    """(the model a run trained, its parameters as built, the RunResult)."""
    from ffnlab.data.checkpoint_tokenizer import read_checkpoint_tokenizer

    own = read_checkpoint_tokenizer(cfg.init_from) if cfg.tokenizer == "pretrained" else None  # as prepare reads it
    factory, built, start = default_factory(resolve_init(cfg), own), [], {}

    def capture(mcfg, seed):
        built.append(factory(mcfg, seed))
        start.update({name: p.detach().clone() for name, p in built[-1].named_parameters()})
        return built[-1]

    result = train(cfg, model_factory=capture, **kw)
    return built[-1], start, result


def base_name(name: str) -> str:
    """A parameter's name in the Hugging Face model without peft's wrapping (LoRA keeps the original under
    base_layer)."""
    return name.removeprefix("hf.base_model.model.").replace(".base_layer.", ".")


@pytest.mark.parametrize(("family", "task"), [("bert", "cls"), ("gpt2", "cls"), ("llama", "lm")])
def test_only_the_adapters_and_the_head_train_and_every_frozen_weight_stays_the_folders(folders, family, task):
    _, own, swap = FAMILIES[family]
    model, start, result = trained(config(folders, family, swap, task))
    assert result.status == "finished"
    folder = load_file(folders[family] / "model.safetensors")
    n_classes = 2 if task == "cls" else None
    fresh = load_pretrained(folders[family], swap, task, n_classes or 2, VOCAB).state_dict()  # the FFN swapped too
    trainable, frozen = 0, 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert "lora_" in name or ".modules_to_save." in name, name
            assert not torch.equal(p, start[name]), f"{name} did not train"
            trainable += p.numel()
        elif ".original_module." not in name:  # peft's copy of a new head (random, unused): not the folder's
            plain = base_name(name)
            assert torch.equal(p, start[name]) and torch.equal(p, fresh[f"hf.{plain}"]), f"{name} changed"
            if plain in folder:  # the same name in the folder (every weight but a swapped FFN's)
                assert torch.equal(p, folder[plain]), name
            frozen += p.numel()
    assert result.costs.trainable_params == trainable and frozen > 5 * trainable
    assert any(".lora_B." in name for name in start)
    ffn_grads = [k for row in result.history.grad_ffn for k in row.stats]
    assert ffn_grads == [] and result.monitors.ffn_grad_mean is None  # the frozen FFN has no gradients to summarise


def test_the_optimiser_gets_only_the_trainable_parameters(folders):
    setup = prepare(config(folders, "bert", "gelu", "cls"))
    in_optimiser = [p for group in setup.opt.param_groups for p in group["params"]]
    trainable = [p for p in setup.model.parameters() if p.requires_grad]
    assert {id(p) for p in in_optimiser} == {id(p) for p in trainable}
    assert 0 < sum(p.numel() for p in trainable) < sum(p.numel() for p in setup.model.parameters()) / 5
    decayed = {id(p) for p in setup.opt.param_groups[0]["params"]}  # weight decay on the adapters' matrices
    assert all(id(p) in decayed for n, p in setup.model.named_parameters() if ".lora_A." in n)


@pytest.mark.parametrize(("family", "task"), [("bert", "cls"), ("gpt2", "cls"), ("llama", "lm")])
def test_the_saved_adapter_loads_back_with_peft_and_gives_the_same_logits(folders, family, task, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    _, own, swap = FAMILIES[family]
    idx = torch.randint(VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    for ffn in (own, swap):
        adapter = tmp_path / f"adapter-{ffn}"
        model, _, _ = trained(config(folders, family, ffn, task), pretrained_path=adapter)
        with torch.no_grad():
            logits = model.eval()(idx)[0]
        assert {"adapter_config.json", "adapter_model.safetensors", "ffnlab_adapter.json"} <= {
            p.name for p in adapter.iterdir()
        }
        note = json.loads((adapter / "ffnlab_adapter.json").read_text())
        assert (note["ffn"], note["pretrained_ffn"], note["task"]) == (ffn, own, task)
        with torch.no_grad():
            assert_close(load_adapter(folders[family], adapter)(idx)[0], logits)  # ffnlab's one function
            base = load_pretrained(folders[family], ffn, task, 2, VOCAB)  # the base, swapped as the run did
            loaded = PeftModel.from_pretrained(base.hf, adapter).eval()
            assert_close(loaded(input_ids=idx).logits, logits)
            if ffn == own:  # kept: the folder as transformers loads it takes the adapter as it is
                auto = AutoModelForCausalLM if task == "lm" else AutoModelForSequenceClassification
                pad = {"pad_token_id": -1} if family == "gpt2" else {}  # as load_pretrained sets it: the last token
                plain = auto.from_pretrained(folders[family], num_labels=2, **pad)
                assert_close(PeftModel.from_pretrained(plain, adapter).eval()(input_ids=idx).logits, logits)
    changed = tmp_path / "changed"
    shutil.copytree(folders[family], changed)
    (changed / "config.json").write_text(json.dumps({**json.loads((changed / "config.json").read_text()), "x": 1}))
    with pytest.raises(ValueError, match="was trained on a base with digest") as e:
        load_adapter(changed, tmp_path / f"adapter-{swap}")
    assert "\n" not in str(e.value)


def test_each_family_gets_peft_s_default_targets_and_a_given_one_is_checked(folders):
    expected = {"bert": "query,value", "gpt2": "c_attn", "llama": "q_proj,v_proj"}  # peft's table
    for family, targets in expected.items():
        assert resolve_lora(resolve_init(config(folders, family, FAMILIES[family][1]))).lora_targets == targets
    given = config(folders, "llama", "swiglu", lora_targets=" q_proj, k_proj ,o_proj")
    assert resolve_lora(given).lora_targets == "q_proj,k_proj,o_proj"
    refused = {
        ("bert", "dense"): "the FFN stays frozen under LoRA",  # output.dense is the FFN: attention.output.dense is not
        ("llama", "gate_proj"): "matches no linear layer outside the FFN",  # swapped, the FFN has no gate_proj
        ("gpt2", "w_in"): "matches no linear layer outside the FFN",
        ("bert", "classifier"): "the new head trains whole",
    }
    for (family, target), message in refused.items():
        task = "cls" if target == "classifier" else "lm"
        with pytest.raises(ValueError, match=message) as e:
            resolve_lora(config(folders, family, FAMILIES[family][1], task, lora_targets=target))
        assert "\n" not in str(e.value) and "valid" in str(e.value)
    with pytest.raises(ValueError, match=r"valid: query, key, value, attention\.output\.dense"):
        resolve_lora(config(folders, "bert", "gelu", lora_targets="nope"))


def test_cli_finetune_keep_and_swap_under_lora(folders, run_cli, tmp_path):
    for ffn in ("swiglu", "geglu"):
        code, out, err = run_cli(
            "finetune", "--from", folders["llama"], "--ffn", ffn, "--peft", "lora", "--lora-r", 4, "--lora-alpha", 8,
            "--quiet", "--save-pretrained", tmp_path / ffn, *FLAGS,
        )  # fmt: skip
        assert code == 0, err
        assert out.startswith(f"{ffn}: finished after 3 steps")
        # q_proj 4 x (32 + 32), v_proj 4 x (32 + 16): two key-value heads of 8
        trained = "trained: LoRA r=4 alpha=8 on q_proj,v_proj (448 parameters"
        assert trained in out and "frozen: every pretrained weight, the FFN's included" in out
        assert "FFN frozen (no gradients)" in out
        assert (tmp_path / ffn / "adapter_model.safetensors").is_file()
    code, out, err = run_cli("finetune", "--from", folders["llama"], "--quiet", *FLAGS)  # a full fine-tune says so
    assert code == 0 and "trained: every parameter (" in out and "FFN gradient mean" in out, err


def compare_argv(folders, store) -> list:
    """compare --peft lora: BERT's gelu kept against silu (`keep,silu`, as the issue asked), on the CSV, 2 seeds."""
    return ["compare", "--from", folders["bert"], "--peft", "lora", "--variants", "keep,silu", "--task", "cls", "--data",
            folders["data"], "--seeds", 2, "--jobs", 1, "--store", store, "--no-report", *FLAGS]  # fmt: skip


@pytest.fixture(scope="module")
def lora_store(folders, tmp_path_factory):
    """The store of a LoRA study (`compare_argv`), its runs done."""
    from ffnlab.cli import main

    store = tmp_path_factory.mktemp("store") / "s.db"
    assert main([str(a) for a in [*compare_argv(folders, store), "--quiet"]]) == 0
    return store


def test_cli_compare_keep_against_swap_under_lora_says_what_trained(folders, lora_store, run_cli):
    code, out, err = run_cli(*compare_argv(folders, lora_store))
    assert code == 0, err
    # query and value: 2 x 8 x (32 + 32); the head: 32 x 2 + 2; the pooler the folder lacks: 32 x 32 + 32
    statement = "LoRA r=8 alpha=16 on query,value and the new classification head (2,146 parameters"
    assert f"trained parameters: {statement}" in out and "the FFN weights frozen" in out
    code, out, err = run_cli(*compare_argv(folders, lora_store), "--json")
    settings = json.loads(out)["settings"]
    assert code == 0 and settings["trained"].startswith(statement) and settings["variants"] == ["gelu", "silu"]


def test_bad_lora_flags_exit_2_in_one_line(folders, run_cli):
    llama = ["finetune", "--from", folders["llama"], "--quiet", *FLAGS]
    cases = {
        ("--peft", "lora", "--lora-targets", "q_proj,nope"): "--lora-targets nope matches no linear layer",
        ("--peft", "lora", "--lora-r", 0): "lora_r and lora_alpha must be positive",
        ("--peft", "lora", "--lora-alpha", "x"): "argument --lora-alpha: invalid int value",
        ("--peft", "qlora"): "argument --peft: invalid choice: 'qlora'",
        ("--lora-r", 4): "set LoRA's adapters: add --peft lora",
        ("--peft", "lora", "--qat-from", 0.5): "which --qat-from would fake-quantise",
        ("--peft", "lora", "--shard", "--nproc", 2): "--shard cannot train LoRA adapters",
    }
    for flags, message in cases.items():
        code, out, err = run_cli(*llama, *flags)
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, (flags, err)
    code, _, err = run_cli("train", "--peft", "lora", "--quiet", *FLAGS)
    assert code == 2 and err.count("\n") == 1 and "add --from FOLDER" in err
    code, _, err = run_cli(
        "compare", "--from", folders["bert"], "--peft", "lora", "--lora-targets", "dense", "--variants", "silu",
        "--seeds", 2, "--no-report", *FLAGS,
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "the FFN stays frozen" in err  # when planned, not as failed runs


def test_a_lora_run_is_another_run_than_a_full_fine_tune(folders):
    full = replace(config(folders, "bert", "gelu"), peft=None)
    ids = {
        name: run_id(plan(Study(variants=["gelu"], seeds=1, base=resolve_init(cfg), baseline="gelu"))[0])
        for name, cfg in {
            "full": full,
            "lora": config(folders, "bert", "gelu"),
            "lora, targets given": config(folders, "bert", "gelu", lora_targets="query,value"),
            "lora r 4": config(folders, "bert", "gelu", lora_r=4),
            "lora alpha 8": config(folders, "bert", "gelu", lora_alpha=8),
        }.items()
    }
    assert ids["lora"] == ids["lora, targets given"]  # the default resolved is what the targets say
    assert len({ids[k] for k in ("full", "lora", "lora r 4", "lora alpha 8")}) == 4


def test_advise_peft_says_a_lora_study_of_the_checkpoint_first(folders, lora_store, run_cli, monkeypatch):
    from ffnlab.study.advise import Situation, advice_for, from_lora

    code, out, err = run_cli("advise", "--situation", "peft", "--store", lora_store, "--json")  # the study's folder
    assert code == 0, err
    advice = json.loads(out)
    assert advice["branch"] == "peft/measured" and advice["recommendation"] in ("gelu", "silu")
    reasons = advice["reasons"]
    assert reasons[0].startswith(f"Measured under LoRA in {lora_store}: fine-tuned from {folders['bert']}")
    rule = next(i for i, line in enumerate(reasons) if line.startswith("[rule of thumb]"))
    measured = next(i for i, line in enumerate(reasons) if "paired seed" in line)
    assert measured < rule  # measured first
    other = advice_for(Situation(stage="peft", pretrained=str(folders["llama"])), lora_store)  # not its checkpoint
    assert other.basis == "pretrained" and other.recommendation == "swiglu"
    silu = replace(from_lora.advise_measured(lora_store, Situation(stage="peft", pretrained=str(folders["bert"]))),
                   recommendation="silu")  # fmt: skip
    monkeypatch.setattr(from_lora, "advise_measured", lambda store, situation: silu)  # as if silu had won
    swapped = advice_for(Situation(stage="peft", pretrained=str(folders["bert"])), lora_store)
    assert swapped.recommendation == "silu"
    assert any("disagrees with the rule of thumb below (keep gelu): said first" in line for line in swapped.reasons)


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory):
    """Tiny GPT-2 and BERT folders with their own tokenizers (byte-level BPE, WordPiece: tests.test_finetune_tasks),
    and tagged sentences in CoNLL's layout."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    from tests.test_finetune_tasks import byte_level_bpe, corpus_lines, save_folder, tagged, wordpiece

    root, lines = tmp_path_factory.mktemp("own"), corpus_lines()
    gpt2, bert = byte_level_bpe(lines), wordpiece(lines)
    gpt2_config = GPT2Config(vocab_size=len(gpt2), n_positions=CONTEXT, n_embd=32, n_layer=1, n_head=2,
                             bos_token_id=gpt2.eos_token_id, eos_token_id=gpt2.eos_token_id)  # fmt: skip
    bert_config = BertConfig(vocab_size=len(bert), max_position_embeddings=CONTEXT, **BERT | {"model_type": None})
    out = {
        "gpt2": save_folder(root / "gpt2", GPT2LMHeadModel, gpt2_config, gpt2),
        "bert": save_folder(root / "bert", BertForMaskedLM, bert_config, bert),
        "conll": root / "conll",
    }
    rng = random.Random(2)
    out["conll"].mkdir()
    for name, n in (("train.txt", 60), ("valid.txt", 20), ("test.txt", 20)):
        sentences = ["\n".join(f"{word} {tag}" for word, tag in tagged(rng)) for _ in range(n)]
        (out["conll"] / name).write_text("\n\n".join(sentences) + "\n")
    return out


@pytest.mark.parametrize(("family", "ffn", "task"), [("gpt2", "relu", "cls"), ("bert", "silu", "tokens")])
def test_a_lora_run_on_the_folders_own_tokenizer_loads_back_with_its_padding(
    folders, tokenizer_folders, family, ffn, task, tmp_path
):
    from ffnlab.data.checkpoint_tokenizer import read_checkpoint_tokenizer

    folder = tokenizer_folders[family]
    data = folders["data"] if task == "cls" else tokenizer_folders["conll"]
    cfg = TrainConfig(model=ModelConfig(ffn=ffn, task=task, context=CONTEXT), init_from=str(folder), data=str(data),
                      tokenizer="pretrained", peft="lora", max_steps=3, **SMALL)  # fmt: skip
    model, start, result = trained(cfg, pretrained_path=tmp_path / "adapter")
    assert result.status == "finished" and 0 < result.costs.trainable_params < result.costs.params / 5
    assert all(".lora_" in n or ".modules_to_save." in n for n, p in model.named_parameters() if p.requires_grad)
    tokenizer = read_checkpoint_tokenizer(str(folder))
    pad = tokenizer.pad_id
    assert pad is not None and json.loads((tmp_path / "adapter" / "ffnlab_adapter.json").read_text())["pad_id"] == pad
    idx = torch.randint(pad + 1, tokenizer.vocab_size, (3, CONTEXT), generator=torch.Generator().manual_seed(0))
    idx[:, -6:] = pad  # padded examples, as the run read them: masked, a last-token classifier reads the last word
    with torch.no_grad():
        assert_close(load_adapter(folder, tmp_path / "adapter")(idx)[0], model.eval()(idx)[0])


def test_the_statement_of_what_trained_names_the_head_of_each_task():
    from ffnlab.tools.lora import trained_text

    lora = {"init_from": "folder", "peft": "lora", "lora_r": 4, "lora_alpha": 8, "lora_targets": "q_proj,v_proj"}
    heads = {"lm": "q_proj,v_proj (10 parameters", "cls": "the new classification head (10", "reg": "regression head"}
    for task, words in heads.items():
        assert words in trained_text({**lora, "model": {"task": task}}, 10, 1000)
    assert "1% of 1,000" in trained_text({**lora, "model": {"task": "lm"}}, 10, 1000)
    assert trained_text({"init_from": "folder", "model": {"task": "cls"}}, 1000, 1000).startswith("every parameter")
    assert trained_text({"init_from": None, "model": {"task": "lm"}}, 1000, 1000) is None  # trained from scratch
