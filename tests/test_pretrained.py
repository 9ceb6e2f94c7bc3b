"""Fine-tuning from a save_pretrained folder: a tiny LLaMA pretrained here by ffnlab, kept or swapped."""

import json
import logging
import os
import re
import shutil
from dataclasses import replace

import pytest
import torch

from ffnlab.core.ffn import activation_name
from ffnlab.core.model import ModelConfig
from ffnlab.run.config import TrainConfig
from ffnlab.run.train import evaluate, prepare, resolve_init, train
from ffnlab.study.advise import advise
from ffnlab.study.plan import Study, plan, run_id
from ffnlab.tools.hf import build_hf_model, ffn_modules, save_unswapped
from ffnlab.tools.pretrained import check_folder, folder_digest, load_pretrained, pretrained_ffn
from tests.conftest import assert_close, not_a_file, run_cli_bounded, within

LLAMA = dict(
    model_type="llama",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
)
GPT2 = dict(model_type="gpt2", n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
BERT = dict(model_type="bert", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
SMALL = dict(batch_size=4, eval_every=100, eval_batches=2, final_eval_batches=1, precision="fp32", warmup_steps=2)


def tiny(ffn: str, **kw) -> TrainConfig:
    return TrainConfig(model=ModelConfig(ffn=ffn, context=16), **{**SMALL, **kw})


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(folder, result): a tiny LLaMA trained 15 steps on the bundled corpus, saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("pretrained") / "llama"
    result = train(tiny("swiglu", hf_config=LLAMA, max_steps=15, lr=1e-2), pretrained_path=folder)
    return folder, result


def test_keep_starts_at_the_pretrained_loss(pretrained):
    folder, before = pretrained
    setup = prepare(tiny("swiglu", init_from=str(folder)))
    start = evaluate(setup.model, setup.val_batches, "lm", setup.autocast)["loss"]
    assert start == pytest.approx(before.history.val[-1].loss, abs=1e-5)  # the same weights, same batches
    assert start < before.history.val[0].loss - 0.3  # far below a random init's loss
    assert setup.cfg.init_digest == folder_digest(folder)


def test_swap_puts_the_new_activation_in_place_and_keeps_the_weights(pretrained):
    folder, _ = pretrained
    keep, swap = (prepare(tiny(ffn, init_from=str(folder))) for ffn in ("swiglu", "reglu"))
    kept, swapped = ffn_modules(keep.model.hf), ffn_modules(swap.model.hf)
    assert [f.spec.name for f in swapped] == ["reglu"] and activation_name(swapped[0].act) == "relu"
    assert activation_name(kept[0].act) == "silu"
    assert_close(swapped[0].w_gate.weight, kept[0].w_gate.weight)  # weights carried over, not re-initialised
    losses = [evaluate(s.model, s.val_batches, "lm", s.autocast)["loss"] for s in (keep, swap)]
    assert abs(losses[0] - losses[1]) > 1e-4


def test_swap_to_the_other_kind_is_refused(pretrained):
    folder, _ = pretrained
    with pytest.raises(ValueError, match="'gelu' is a dense FFN but the model's are gated") as e:
        prepare(tiny("gelu", init_from=str(folder)))
    assert "\n" not in str(e.value) and "swiglu" in str(e.value)  # names the valid choices


def test_bad_folders_give_one_line_errors(pretrained, tmp_path):
    folder, _ = pretrained
    (tmp_path / "empty").mkdir()
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5"}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    remote = tmp_path / "remote"
    shutil.copytree(folder, remote)
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "modeling.M"}}))
    cases = {
        tmp_path / "missing": "does not exist",
        remote: "remote code is refused",
        tmp_path / "empty": "has no config.json",
        t5: "does not support the t5 family",
        other: "unsupported architecture 'whisper'",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError, match=message) as e:
            check_folder(path)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="vocabulary of .* tokens, the tokenizer gives 256"):
        prepare(tiny("swiglu", init_from=str(folder), tokenizer="byte"))
    with pytest.raises(ValueError, match="exceeds the 16 positions"):
        prepare(replace(tiny("swiglu", init_from=str(folder)), model=ModelConfig(ffn="swiglu", context=64)))


def test_damaged_weights_are_one_line_errors_not_a_random_init(pretrained, tmp_path, run_cli):
    from safetensors.torch import load_file, save_file

    folder, _ = pretrained
    weights = load_file(folder / "model.safetensors")
    down = "model.layers.0.mlp.down_proj.weight"

    def link_to_unreadable(path):  # a file that cannot be mapped, even by root
        path.unlink()
        path.symlink_to("/proc/self/mem")

    damaged = {
        "truncated": lambda path: path.write_bytes(path.read_bytes()[:-500]),
        "no_head": lambda path: save_file({k: v for k, v in weights.items() if k != "lm_head.weight"}, path),
        "resized": lambda path: save_file({**weights, "model.norm.weight": torch.zeros(3)}, path),
        "int64": lambda path: save_file({**weights, down: weights[down].mul(100).long()}, path),
        "link": link_to_unreadable,
    }
    messages = {
        "truncated": "model.safetensors is not a readable safetensors file",  # was an internal error
        "no_head": "lm_head.weight is missing",  # was trained on from a random lm_head
        "resized": r"model.norm.weight is \[3\] there, \[32\] in the model",  # was an internal error
        "int64": f"{down} in .* is I64, not floating point",  # was cast to float and trained
        "link": "model.safetensors is not a readable safetensors file",  # was an internal error
    }
    if not os.path.exists("/proc/self/mem"):
        del damaged["link"]
    for name, damage in damaged.items():
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        damage(copy / "model.safetensors")
        with pytest.raises(ValueError, match=messages[name]) as e:
            prepare(tiny("swiglu", init_from=str(copy)))
        assert "\n" not in str(e.value)
    code, _, err = run_cli("finetune", "--from", tmp_path / "truncated", "--steps", 1, "--quiet")
    assert code == 2 and err.count("\n") == 1 and "not a readable safetensors file" in err


def test_a_damaged_tokenizer_or_oversized_config_is_one_line_not_an_internal_error(pretrained, tmp_path, run_cli):
    folder, _ = pretrained
    config = json.loads((folder / "config.json").read_text())
    damaged = {
        "garbage": (lambda copy: (copy / "tokenizer.json").write_text("garbage{"), "cannot read the tokenizer"),
        "huge": (  # 10**12-wide FFNs: 384 TB in fp32, counted on the meta device, not allocated
            lambda copy: (copy / "config.json").write_text(json.dumps({**config, "intermediate_size": 10**12})),
            r"\(96,000,000,\d{3},\d{3} parameters\) need at least .* GiB, more than the .* GiB here",
        ),
        "overflow": (
            lambda copy: (copy / "config.json").write_text(json.dumps({**config, "intermediate_size": 10**30})),
            "the model's sizes overflow",
        ),
    }
    if os.path.exists("/proc/self/mem"):  # a link to a file whose every read fails (EIO), even for root
        damaged["link"] = (lambda copy: (copy / "tokenizer.json").symlink_to("/proc/self/mem"), "cannot read")
    for name, (damage, message) in damaged.items():
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        damage(copy)
        code, _, err = run_cli("finetune", "--from", copy, "--steps", 1, "--context", 16, "--quiet")
        assert code == 2 and err.count("\n") == 1 and re.search(message, err), (name, err)


@pytest.mark.parametrize(
    "layers,message",
    [
        (
            100_000,
            r"num_hidden_layers in .*config.json is 100,000, more than the 10,000 layers .*; use 1 to 10,000 layers",
        ),
        (9_000, r"the fp32 weights of the model in .* \(\d[\d,]* parameters\) need at least .* GiB"),
    ],
)
def test_an_absurd_depth_in_config_json_is_refused_before_its_layers_are_built(
    pretrained, tmp_path, run_cli, layers, message, monkeypatch
):
    from transformers.models.llama import modeling_llama

    built = []  # LLaMA layers built (minutes for 100,000 of them, even on the meta device)
    real = modeling_llama.LlamaDecoderLayer.__init__
    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "__init__", lambda *a, **k: built.append(1) or real(*a, **k))
    folder, _ = pretrained
    config = json.loads((folder / "config.json").read_text())
    deep = tmp_path / "deep"
    shutil.copytree(folder, deep)
    wide = {"hidden_size": 8192, "intermediate_size": 32768, "num_attention_heads": 64, "num_key_value_heads": 64}
    (deep / "config.json").write_text(json.dumps({**config, **wide, "num_hidden_layers": layers}))
    code, _, err = run_cli("finetune", "--from", deep, "--steps", 1, "--context", 16, "--quiet")
    assert code == 2 and err.count("\n") == 1 and re.search(message, err), err
    assert len(built) <= 3  # counted from a one- and a two-layer model: not every layer built first


@pytest.fixture
def transformers_warnings():
    """The messages transformers logs during the test, its warn-once memory cleared first."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("transformers")  # propagate=False: caplog never sees it
    if hasattr(logging.Logger, "warning_once"):  # transformers' lru_cache'd addition to Logger
        logging.Logger.warning_once.cache_clear()
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_own_folders_load_without_special_token_warnings(tmp_path, transformers_warnings):
    # what train --hf-config --save-pretrained, then finetune --from do: build, save_unswapped, load_pretrained
    gpt2 = build_hf_model({"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2}, "gelu_new", vocab_size=50)
    assert gpt2.hf.config.bos_token_id is None  # GPT-2's 50256, past the vocabulary: no token
    save_unswapped(gpt2.hf, tmp_path / "gpt2")
    load_pretrained(tmp_path / "gpt2", "gelu_new", vocab_size=50)
    # a classifier's pad id -1 (build_hf_model's stand-in) is not saved: loaded, it warned too
    classifier = build_hf_model(LLAMA, "swiglu", vocab_size=50, context=16, task="cls", n_classes=3)
    save_unswapped(classifier.hf, tmp_path / "cls")
    loaded = load_pretrained(tmp_path / "cls", "swiglu", task="cls", n_classes=3, vocab_size=50)
    assert loaded.hf.model.embed_tokens.padding_idx is None  # was the last token's row, which training never updates
    assert loaded.hf.config.pad_token_id == -1  # the stand-in again, set after construction
    assert not [message for message in transformers_warnings if "token_id" in message], transformers_warnings


def test_a_changed_folder_is_another_run(pretrained, tmp_path):
    folder, _ = pretrained
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    study = Study(variants=["swiglu"], seeds=1, base=tiny("swiglu", init_from=str(copy)), baseline="swiglu")
    before = run_id(plan(study)[0])
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert run_id(plan(study)[0]) != before
    with pytest.raises(ValueError, match="changed since the run was planned"):
        resolve_init(replace(study.base, init_digest="0" * 16))


@pytest.mark.parametrize(
    ("hf_config", "own", "swap", "act"),
    [(LLAMA, "swiglu", "geglu", "gelu"), (GPT2, "gelu_new", "relu", "relu"), (BERT, "gelu", "silu", "silu")],
)
def test_saved_folder_loads_back_and_swaps_keeping_the_weights(hf_config, own, swap, act, tmp_path):
    model = build_hf_model(hf_config, own, vocab_size=50, context=16, seed=1).eval()
    save_unswapped(model.hf, tmp_path)
    assert pretrained_ffn(tmp_path) == own == advise(pretrained=str(tmp_path)).recommendation  # one reader
    loaded = load_pretrained(tmp_path, own, vocab_size=50, context=16).eval()
    idx = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(0))
    assert_close(loaded(idx)[0], model(idx)[0])
    swapped = load_pretrained(tmp_path, swap, vocab_size=50, context=16).eval()
    ffn, own_ffn = ffn_modules(swapped.hf)[0], ffn_modules(model.hf)[0]
    assert activation_name(ffn.act) == act
    assert all(torch.equal(a, b) for a, b in zip(ffn.state_dict().values(), own_ffn.state_dict().values()))
    assert not torch.allclose(swapped(idx)[0], model(idx)[0])
    head = load_pretrained(tmp_path, own, task="cls", n_classes=3)  # a new head on the pretrained body
    assert head(idx)[0].shape == (2, 3)
    scalar = load_pretrained(tmp_path, own, task="reg")  # one number: transformers' regression head
    assert scalar(idx)[0].shape == (2, 1) and scalar.hf.config.problem_type == "regression"


def test_cli_finetune(pretrained, run_cli):
    folder, _ = pretrained
    flags = ["--steps", 2, "--context", 16, "--batch-size", 4, "--eval-batches", 1, "--final-eval-batches", 1]
    code, out, err = run_cli("finetune", "--from", folder, "--ffn", "reglu", "--quiet", *flags)
    assert code == 0, err
    assert out.startswith("reglu: finished after 2 steps")
    code, _, err = run_cli("finetune", "--from", folder.parent / "nope", "--quiet", *flags)
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli("train", "--save-pretrained", folder.parent / "x", "--quiet", *flags)
    assert code == 2 and "needs a Hugging Face model" in err


def test_the_context_defaults_to_the_folders_own_and_cannot_exceed_it(pretrained, run_cli):
    """finetune --from trained at 128 tokens, the default, although the folder's model has 16 positions."""
    folder, _ = pretrained
    for command in (["finetune"], ["compare", "--variants", "reglu"]):
        code, out, err = run_cli(*command, "--from", folder, "--print-config")
        assert code == 0 and "\ncontext = 16\n" in out, err
        code, out, err = run_cli(*command, "--from", folder, "--context", 8, "--print-config")
        assert code == 0 and "\ncontext = 8\n" in out, err  # shorter is the user's choice
        code, out, err = run_cli(*command, "--from", folder, "--context", 17, "--print-config")
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "--context 17 exceeds the 16 positions of the model" in err and "valid: 1 to 16" in err


@pytest.mark.parametrize(("hf_config", "own"), [(LLAMA, "swiglu"), (GPT2, "gelu_new"), (BERT, "gelu")])
def test_the_folders_positions_are_read_for_every_family(hf_config, own, tmp_path):
    from ffnlab.tools.pretrained import pretrained_context

    save_unswapped(build_hf_model(hf_config, own, vocab_size=50, context=24).hf, tmp_path)  # n_positions for GPT-2
    assert pretrained_context(tmp_path) == 24 and pretrained_context(tmp_path, 12) == 12
    with pytest.raises(ValueError, match="--context 25 exceeds the 24 positions"):
        pretrained_context(tmp_path, 25)


@pytest.mark.slow
def test_cli_compare_keep_against_swap_with_an_lr_axis(pretrained, run_cli, tmp_path):
    folder, _ = pretrained
    code, out, err = run_cli(
        "compare", "--from", folder, "--variants", "reglu", "--seeds", 2, "--lr-axis", "1e-3,3e-4",
        "--steps", 3, "--context", 16, "--batch-size", 4, "--eval-batches", 1, "--final-eval-batches", 1,
        "--precision", "fp32", "--jobs", 1, "--store", tmp_path / "runs.db", "--no-report", "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    settings = summary["settings"]
    assert settings["variants"] == ["swiglu", "reglu"]
    held = dict(map(tuple, settings["held_equal"]))
    assert folder_digest(folder) in held["pretrained weights"] and "warm-up" in held
    assert "swiglu kept" in dict(map(tuple, settings["not_equal"]))["FFN activation"]
    # the folder's shape at the run's context, not ffnlab's own model (as compare --hf-config reported it before)
    shape = {"n_layers": LLAMA["num_hidden_layers"], "n_heads": LLAMA["num_attention_heads"]}
    assert settings["model"] == {**shape, "d_model": LLAMA["hidden_size"], "context": 16}


def test_the_folders_own_tokenizer(tmp_path, run_cli):
    from ffnlab.data.tokenizer import train_bpe

    text = "".join(f"Line {i}: to be, or not to be, that is the question.\n" for i in range(400))
    (tmp_path / "corpus.txt").write_text(text)  # small, so the BPE encodes it in no time
    tokenizer_json = train_bpe([text], 300)
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    model = build_hf_model(LLAMA, "swiglu", vocab_size=len(vocab), context=16)
    folder = tmp_path / "model"
    save_unswapped(model.hf, folder)
    digest = folder_digest(folder)
    (folder / "tokenizer.json").write_text(tokenizer_json)
    assert folder_digest(folder) != digest  # the tokenizer is part of the start
    setup = prepare(tiny("swiglu", init_from=str(folder), tokenizer="pretrained", data=str(tmp_path / "corpus.txt")))
    assert setup.vocab_size == len(vocab)
    with pytest.raises(ValueError, match="tokenizer 'pretrained' is the init_from folder's"):
        tiny("swiglu", tokenizer="pretrained")
    code, out, err = run_cli("finetune", "--from", folder, "--print-config")  # picked when the folder has one
    assert code == 0 and 'tokenizer = "pretrained"' in out


def test_a_failed_save_leaves_no_half_written_folder(tmp_path, monkeypatch):
    """save_pretrained wrote config.json and then the weights straight into the folder: a full disk left a folder
    whose config says it is a model, without its weights."""
    import errno

    from transformers import PreTrainedModel

    model = build_hf_model(LLAMA, "swiglu", vocab_size=50, context=16)
    real = PreTrainedModel.save_pretrained

    def full_disk(self, folder, **kw):
        real(self, folder, **kw)  # every file written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_unswapped(model.hf, tmp_path / "saved")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary one
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real)
    save_unswapped(model.hf, tmp_path / "saved")
    assert pretrained_ffn(tmp_path / "saved") == "swiglu"


def test_contexts_past_the_folders_positions_are_refused_or_left_out(pretrained, run_cli, tmp_path):
    """compare --from --protocol tried 2x the folder's 16 positions in stage 3: a third of its runs failed after the
    first two stages had run; --context-axis past them failed the same way, run by run."""
    from ffnlab.study.protocol import protocol_grid

    folder, _ = pretrained
    study = Study(variants=["swiglu", "reglu"], seeds=2, base=tiny("swiglu", init_from=str(folder)), baseline="swiglu")
    assert protocol_grid(study)["context"] == [8, 16]  # 32 left out of the defaults
    assert protocol_grid(replace(study, base=tiny("swiglu")))["context"] == [8, 16, 32]  # a fresh model has no limit
    with pytest.raises(ValueError, match="context axis value 32 exceeds the 16 positions of the model in"):
        protocol_grid(study, contexts=[8, 32])
    store = tmp_path / "s.db"
    code, out, err = run_cli("compare", "--from", folder, "--variants", "reglu", "--context-axis", "8,24,32",
                             "--seeds", 2, "--steps", 2, "--store", store)  # fmt: skip
    assert (
        code == 2
        and out == ""
        and err
        == (
            f"ffnlab: error: context axis values 24, 32 exceed the 16 positions of the model in {folder}; valid: 1 to 16\n"
        )
    )
    assert not store.exists()


# ---- files of the folder that are no regular files -------------------------------------------------


def test_a_weights_file_that_is_a_fifo_is_refused_within_seconds(pretrained, tmp_path):
    copy = tmp_path / "fifo"
    shutil.copytree(pretrained[0], copy)
    os.mkfifo(copy / "extra.safetensors")  # safe_open blocked for ever, holding the GIL: a child process
    code, _, err = run_cli_bounded("finetune", "--from", copy, "--steps", 1, "--quiet")
    assert code == 2 and err == (
        f"ffnlab: error: the weights file {copy}/extra.safetensors is a FIFO (a named pipe), which may block for "
        "ever; give a regular file\n"
    )


@pytest.mark.parametrize(
    "name, kind", [("config.json", "fifo"), ("generation_config.json", "link"), ("model.safetensors", "link")]
)
def test_a_folders_file_that_is_no_regular_file_is_refused_before_it_is_opened(pretrained, tmp_path, name, kind):
    copy = tmp_path / "copy"
    shutil.copytree(pretrained[0], copy)
    (copy / name).unlink()
    path, message = not_a_file(copy, kind, name)
    with pytest.raises(ValueError, match=re.escape(f"{path} {message}")) as e:
        within(30, lambda: check_folder(copy))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["dangling", "folder", "fifo", "link"])
def test_a_folders_tokenizer_that_is_no_regular_file_is_refused_not_passed_over(pretrained, tmp_path, run_cli, kind):
    copy = tmp_path / "copy"
    shutil.copytree(pretrained[0], copy)
    tokenizer = copy / "tokenizer.json"
    if kind == "dangling":
        tokenizer.symlink_to("gone.json")
        message = "is a symbolic link to gone.json, which does not exist; give a regular file"
    elif kind == "folder":
        tokenizer.mkdir()
        message = "is a folder; give a regular file"
    else:
        _, message = not_a_file(copy, kind, "tokenizer.json")
    code, out, err = within(30, lambda: run_cli("finetune", "--from", copy, "--print-config"))  # was: tokenizer "char"
    assert code == 2 and out == "" and err == f"ffnlab: error: the tokenizer {tokenizer} {message}\n"


def test_a_config_with_a_composite_models_text_part_is_refused(pretrained, tmp_path, run_cli):
    copy = tmp_path / "text_config"
    shutil.copytree(pretrained[0], copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "text_config": {"model_type": "llama", "hidden_size": 32}}))
    code, _, err = run_cli("finetune", "--from", copy, "--steps", 1, "--quiet")  # was AttributeError, exit 1
    assert code == 2 and err.count("\n") == 1
    assert f"config {copy}/config.json holds 'text_config', the text part of a composite model's config" in err


def test_a_save_pretrained_folder_that_cannot_take_the_weights_is_refused_before_training(
    pretrained, tmp_path, run_cli, monkeypatch
):
    """--save-pretrained failed only after training: a device inside the folder (FileExistsError, or written
    over), or a disk too full for the weights (SafetensorError), exit 1 with the run's result lost."""
    import shutil

    import ffnlab.run.train as train_module

    folder, _ = pretrained
    trained = []
    monkeypatch.setattr(train_module, "apply_gradients", lambda *a: trained.append(1) or pytest.fail("trained"))
    flags = ["finetune", "--from", folder, "--steps", 2, "--context", 16, "--batch-size", 4, "--quiet"]
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "config.json").symlink_to("/dev/null")
    code, _, err = run_cli(*flags, "--save-pretrained", tmp_path / "sp")
    assert code == 2 and "config.json is a character device; an output folder holds regular files only" in err
    assert os.path.islink(tmp_path / "sp" / "config.json")
    code, _, err = run_cli(*flags, "--save-pretrained", "/dev/null")
    assert code == 2 and "it is a character device; give a folder" in err
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    code, _, err = run_cli(*flags, "--save-pretrained", tmp_path / "new")
    assert code == 2 and "needs about" in err and "MiB free" in err and not trained


def test_compare_from_reads_keep_as_the_folders_own_activation():
    from ffnlab.study.plan import finetune_variants

    assert finetune_variants("gelu", ["keep", "silu"]) == (["gelu", "silu"], "gelu")
    assert finetune_variants("gelu", ["silu", "Keep", "gelu", "relu"]) == (["gelu", "silu", "relu"], "gelu")
    for given in (["keep"], ["gelu"], None):
        with pytest.raises(ValueError, match=r"an activation to swap to, e\.g\. keep,silu \(the model runs gelu\)"):
            finetune_variants("gelu", given)
