import contextlib
import io
import json
import math
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ffnlab._util import machine
from ffnlab.core.model import ModelConfig, attend
from ffnlab.run.monitors import BlowupWatch, spike
from ffnlab.run.train import TrainConfig, lr_at, resolve_precision, train
from ffnlab.study.plan import Study, plan
from tests.conftest import TINY_MODEL
from tests.test_pretrained import LLAMA as PRETRAINED_LLAMA

TINY = ModelConfig(n_layers=1, n_heads=2, d_model=32, context=32)


def tiny(**kw) -> TrainConfig:
    base = dict(model=TINY, batch_size=8, max_steps=20, eval_every=10, eval_batches=2, warmup_steps=4)
    return TrainConfig(**{**base, **kw})


def test_same_seed_gives_bitwise_identical_losses():
    a = train(tiny(seed=1, model=replace(TINY, ffn="swiglu"), precision="fp32"))
    b = train(tiny(seed=1, model=replace(TINY, ffn="swiglu"), precision="fp32"))
    c = train(tiny(seed=2, model=replace(TINY, ffn="swiglu"), precision="fp32"))
    assert a.history.train_loss == b.history.train_loss
    assert a.val.loss == b.val.loss
    assert a.history.train_loss != c.history.train_loss


def test_result_records_curves_costs_and_behaviour():
    r = train(tiny(model=replace(TINY, ffn="reglu")))
    assert r.status == "finished" and r.steps == 20
    assert [v.step for v in r.history.val] == [0, 10, 20]
    assert r.val.ppl == pytest.approx(math.exp(r.val.loss))
    assert (
        r.costs.tokens_per_s > 0 and r.memory.train_mem_bytes > 0 and r.costs.params > 0 and r.costs.flops_per_token > 0
    )
    layer = r.monitors.behaviour["blocks.0.ffn"]
    assert 0 <= layer["dead_frac"] <= 1 and 0 < layer["zero_frac"] < 1  # relu gate: some exact zeros
    assert layer["std_pre"] > 0 and layer["max_abs_hidden"] > 0
    assert any(k.startswith("grad_norm/blocks.0.ffn") for k in r.history.grad_ffn[0].stats)
    assert r.noisy_val.loss is not None and r.noisy_val.loss != r.val.loss
    assert r.test.loss is not None and r.test.loss != r.val.loss  # held-out plays, not val
    assert r.monitors.ffn_grad_std > 0 and r.monitors.ffn_grad_mean is not None
    assert r.monitors.learned == {}  # relu gates learn no activation parameters
    json.dumps(r.to_dict())  # serialisable


def test_memory_figures_do_not_depend_on_run_order():
    short = dict(max_steps=2, eval_every=2)
    small = tiny(**short)
    large = tiny(**short, model=replace(TINY, d_model=128, n_layers=3, n_heads=4))
    big, after_big = train(large), train(small)
    assert after_big.memory.train_mem_bytes < big.memory.train_mem_bytes
    assert train(small).memory == after_big.memory  # the same figure in any order
    # the parts: fp32 params and grads, AdamW's two moments, activations of one B x T forward
    assert after_big.memory.param_bytes == after_big.memory.grad_bytes == 4 * after_big.costs.params
    assert (
        2 * after_big.memory.param_bytes <= after_big.memory.optimizer_bytes < 2 * after_big.memory.param_bytes + 1024
    )
    assert after_big.memory.saved_bytes > 8 * 32 * 32 * 4  # at least one (B, T, d_model) fp32 tensor
    assert after_big.memory.cuda_peak_bytes is None  # CPU run: no allocator peak to report


def test_learned_activation_parameters_are_reported():
    r = train(tiny(model=replace(TINY, ffn="swish_beta"), max_steps=10))
    beta = r.monitors.learned["blocks.0.ffn"]["beta"]
    assert isinstance(beta, float) and beta != 1.0  # trained away from its init
    r = train(tiny(model=replace(TINY, ffn="switch"), max_steps=10))
    weights = r.monitors.learned["blocks.0.ffn"]["weights"]
    assert set(weights) == {"relu", "gelu", "silu"} and sum(weights.values()) == pytest.approx(1.0)


def test_absurd_learning_rate_diverges_without_raising():
    r = train(tiny(lr=1e6, min_lr=1e5, warmup_steps=0, grad_clip=1e9, max_steps=50))
    assert r.status == "diverged"
    assert r.diverged_step is not None and r.diverged_step < 50
    assert r.val.loss is None
    assert any(e.kind == "nonfinite" for e in r.events) and r.diverged_kind == "nonfinite"


def test_blowup_watch_needs_the_loss_above_the_bound_for_the_stated_steps():
    watch = BlowupWatch(factor=2.0, steps=3)
    losses: list[float] = []
    for loss in [4.0] * 10 + [1.0] * 10 + [2.5, 2.5, 1.0, 2.5, 2.5]:  # best median 1.0; 2.5 twice, then reset
        losses.append(loss)
        assert not watch.update(losses)
    assert watch.best == 1.0 and watch.above == 2
    losses.append(2.5)
    assert watch.update(losses)  # the third step in a row above 2 x 1.0
    assert watch.event(25, 2.5) == {"step": 25, "kind": "blowup", "loss": 2.5, "best": 1.0, "factor": 2.0, "since": 23}
    one_lucky_batch = BlowupWatch(2.0, 3)
    lucky = [3.0] * 9 + [0.1] + [3.0] * 10  # no median of 10 is 0.1: 3.0 is not a blow-up
    assert not any(one_lucky_batch.update(lucky[: i + 1]) for i in range(len(lucky)))
    replayed = BlowupWatch(2.0, 3)
    replayed.replay(losses[:-1])  # a resumed run's watch: the state the history leaves
    assert (replayed.best, replayed.above) == (1.0, 2)


class ClimbingLoss(torch.nn.Module):
    """A model whose training loss is `losses[k]` at its k-th training forward: no NaN, a loss that climbs."""

    def __init__(self, losses: list[float]):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.losses, self.calls = losses, 0

    def forward(self, idx, targets=None):
        value = self.losses[min(self.calls, len(self.losses) - 1)] if self.training else 4.4
        self.calls += self.training
        return torch.zeros(*idx.shape, 65) + self.w, self.w.sum() * 0 + value


def test_a_loss_that_climbs_from_4_4_to_19_4_diverges_without_a_nan():
    # issue #28's run: a loss of 4.4 that climbed to 19.4 (perplexity 2.7e8) was 'finished' with 0 spikes
    losses = [4.4 - 0.01 * i for i in range(200)] + [2.4 + 0.1 * i for i in range(171)]  # to 19.4
    r = train(
        tiny(max_steps=400, diverge_factor=3.0, diverge_steps=50), model_factory=lambda cfg, seed: ClimbingLoss(losses)
    )
    assert r.status == "diverged" and r.diverged_kind == "blowup" and r.val.loss is None
    (event,) = [e for e in r.events if e.kind == "blowup"]
    assert r.diverged_step == event.step and event.detail["since"] == event.step - 49
    assert event.detail["loss"] > 3.0 * event.detail["best"] and r.steps < 400
    watch = BlowupWatch(10.0, 50)  # the same losses never stay 10x the best for 50 steps
    assert not any(watch.update(losses[: i + 1]) for i in range(len(losses)))


def test_lr_schedule_warmup_then_cosine():
    cfg = tiny(lr=1.0, min_lr=0.1, warmup_steps=4)
    assert lr_at(0.0, 0, cfg) == pytest.approx(0.25)
    assert lr_at(0.0, 4, cfg) == pytest.approx(1.0)
    assert lr_at(0.5, 10, cfg) == pytest.approx(0.55)
    assert lr_at(1.0, 20, cfg) == pytest.approx(0.1)


def test_spike_detector():
    assert not spike(100.0, [1.0] * 5, 4.0)  # too little history
    assert spike(5.0, [1.0] * 20, 4.0) and not spike(3.0, [1.0] * 20, 4.0)


def test_classification_task_reports_accuracy():
    r = train(tiny(model=replace(TINY, task="cls", ffn="gelu"), max_steps=10))
    assert r.status == "finished" and 0.0 <= r.val.acc <= 1.0
    assert r.config["model"]["task"] == "cls"


def test_a_number_of_classes_the_data_does_not_have_is_refused_not_ignored():
    """n_classes was ignored (the head takes the data's classes), yet it changed the run's identity."""
    with pytest.raises(ValueError, match=r"n_classes 7 does not match the \d+ classes of .*; leave it out"):
        train(tiny(model=replace(TINY, task="cls", n_classes=7), max_steps=2))
    with pytest.raises(ValueError, match="n_classes is for tasks cls, tokens and image; task lm predicts tokens"):
        train(tiny(model=replace(TINY, n_classes=3), max_steps=2))


def test_a_floor_above_the_learning_rate_is_refused():
    with pytest.raises(ValueError, match="min_lr 0.01 is above lr 0.001: the schedule decays from lr down to min_lr"):
        tiny(lr=1e-3, min_lr=1e-2)
    assert tiny(lr=1e-3, min_lr=1e-3).min_lr == 1e-3


def test_validation_loss_falls_on_bundled_corpus():
    r = train(tiny(max_steps=60, lr=3e-3, eval_every=20))
    losses = [v.loss for v in r.history.val]
    assert losses[0] > 4.0 and losses[-1] < losses[0] - 0.5, losses  # from ln(vocab) to well below


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])  # fp16 was attended in fp16: 2.7x slower
def test_half_precision_attention_runs_in_fp32_on_cpu(half):
    q, k, v = (torch.randn(2, 2, 16, 8, dtype=half, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=half):
        out = attend(q, k, v, causal=True)
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == half and torch.equal(out, exact.to(half))  # fp32 math, one rounding at the end
    out.float().sum().backward()
    assert q.grad.dtype == half and q.grad.abs().sum() > 0
    q32, k32, v32 = (t.detach().float() for t in (q, k, v))
    assert torch.equal(
        attend(q32, k32, v32, causal=True), F.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
    )


def test_cpu_half_attention_enters_no_autocast_off_block(monkeypatch):
    """attend turned autocast off around the fp32 attention, which torch.compile's AOTAutograd cache cannot store:
    every --compile run traced the model again (3.6 s against 2.5 s to start the quick preset with warm caches)."""
    q, k, v = (torch.randn(2, 2, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        monkeypatch.setattr(torch, "autocast", lambda *a, **kw: pytest.fail("attend entered an autocast block"))
        out = attend(q, k, v, causal=True)
        monkeypatch.undo()
    assert torch.equal(out, F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).bfloat16())


def test_bf16_training_is_deterministic_and_learns():
    a = train(tiny(precision="bf16", max_steps=60, lr=3e-3, eval_every=20))
    b = train(tiny(precision="bf16", max_steps=60, lr=3e-3, eval_every=20))
    fp32 = train(tiny(precision="fp32", max_steps=60, lr=3e-3, eval_every=20))
    assert a.history.train_loss == b.history.train_loss
    losses = [v.loss for v in a.history.val]
    assert losses[-1] < losses[0] - 0.5, losses
    assert abs(a.val.loss - fp32.val.loss) < 0.1  # mixed precision, not a different run
    assert a.costs.first_step_s > 0 and a.costs.tokens_per_s > 0


@pytest.mark.parametrize(
    "flags,want",
    [
        ({"amx_bf16", "avx512f"}, "bf16"),
        ({"avx512_bf16", "avx512f"}, "bf16"),
        ({"avx2", "avx512f"}, "fp32"),
        ({"avx2"}, "fp32"),
        (set(), "fp32"),
    ],
)
def test_auto_precision_is_bf16_only_where_the_cpu_runs_it_in_hardware(monkeypatch, flags, want):
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset(flags))
    assert resolve_precision("auto", "cpu") == want
    assert resolve_precision("fp32", "cpu") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
    if not torch.cuda.is_available():
        assert resolve_precision("auto", "cuda") == "auto"  # the machine that runs it decides
    # a study stores (and hashes) the resolved precision; a run's result says what it trained in
    assert {cfg.precision for cfg in plan(Study(variants=["relu", "gelu"], seeds=2))} == {want}
    r = train(tiny(max_steps=2, eval_every=2))
    assert r.precision == r.config["precision"] == want


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="unknown precision 'fp8'; valid: auto, fp32, bf16, fp16"):
        tiny(precision="fp8")


def test_threads_option_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        r = train(tiny(threads=1, max_steps=2, eval_every=2))
        assert torch.get_num_threads() == 1 and r.config["threads"] == 1 and r.status == "finished"
        assert r.threads == 1
        torch.set_num_threads(2)
        assert train(tiny(max_steps=2, eval_every=2)).threads == 2  # the process's count when none is asked
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads must be positive"):
        tiny(threads=0)


def test_a_seed_torch_cannot_take_is_refused_before_the_run():
    with pytest.raises(ValueError, match=r"seed must be between -2\*\*63 and 2\*\*64 - 1, got 18446744073709551616"):
        tiny(seed=2**64)  # torch.manual_seed said 'Overflow when unpacking long long' after the data loaded
    assert tiny(seed=2**64 - 1).seed == 2**64 - 1


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "ffnlab.cli", *map(str, args)], capture_output=True, text=True, **kw)


TRAIN_ARGS = [
    "train",
    "--ffn",
    "swiglu",
    "--layers",
    1,
    "--heads",
    2,
    "--d-model",
    32,
    "--context",
    32,
    "--batch-size",
    8,
    "--steps",
    150,
    "--eval-every",
    50,
    "--checkpoint-every",
    20,
    "--quiet",
]


@pytest.mark.slow
def test_kill_and_resume_ends_with_the_same_metrics(tmp_path):
    full = cli(*TRAIN_ARGS, "--out", tmp_path / "full.json")
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ffnlab.cli",
            *map(str, TRAIN_ARGS),
            "--checkpoint-dir",
            ckpt,
            "--out",
            tmp_path / "resumed.json",
        ],
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while not (ckpt / "latest.json").exists() or json.loads((ckpt / "latest.json").read_text())["step"] < 60:
        assert proc.poll() is None and time.time() < deadline, "no checkpoint written"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "resumed.json").exists()
    again = cli(*TRAIN_ARGS, "--checkpoint-dir", ckpt, "--out", tmp_path / "resumed.json")
    assert again.returncode == 0, again.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("full.json", "resumed.json"))
    assert a["final_val_loss"] == b["final_val_loss"]
    assert a["history"]["train_loss"] == b["history"]["train_loss"]
    assert a["history"]["val"][-1]["loss"] == b["history"]["val"][-1]["loss"]


def test_cli_json_output(run_cli):
    code, out, err = run_cli("train", "--ffn", "relu", *TINY_MODEL, "--steps", 5, "--eval-every", 5, "--json")
    assert code == 0, err
    r = json.loads(out)
    for key in ("ffn", "seed", "status", "final_val_loss", "params", "tokens_per_s", "steps"):
        assert key in r
    assert r["ffn"] == "relu" and r["steps"] == 5
    code, out, err = run_cli(
        "train", "--ffn", "relu", *TINY_MODEL, "--steps", 5, "--eval-every", 5, "--precision", "fp32"
    )
    assert code == 0 and "relu: finished after 5 steps" in out and "tokens/s in fp32" in out, err
    for needle in (
        "perplexity",
        "test loss",
        "with embedding noise",
        "memory",
        "saved for backward",
        "FFN gradient mean",
    ):
        assert needle in out, needle
    code, out, err = run_cli(
        "train", "--ffn", "swish_beta", *TINY_MODEL, "--steps", 5, "--eval-every", 5, "--init", "he"
    )
    assert code == 0 and 'learned blocks.0.ffn: {"beta": ' in out, err


def test_cli_threads_and_eval_batches_reach_the_config(run_cli, tmp_path):
    before = torch.get_num_threads()
    try:
        code, _, err = run_cli(
            "train",
            *TINY_MODEL,
            "--steps",
            2,
            "--eval-every",
            2,
            "--threads",
            1,
            "--eval-batches",
            3,
            "--quiet",
            "--out",
            tmp_path / "r.json",
        )
    finally:
        torch.set_num_threads(before)
    assert code == 0, err
    config = json.loads((tmp_path / "r.json").read_text())["config"]
    assert config["threads"] == 1 and config["eval_batches"] == 3
    code, _, err = run_cli("train", "--threads", 0)
    assert code == 2 and "threads must be between 1 and" in err


@pytest.mark.parametrize(
    "setup,args,needle",
    [
        (None, ["--data", "{tmp}/missing.txt"], "missing.txt"),
        ("empty", ["--data", "{tmp}/empty.txt"], "empty"),
        ("latin1", ["--data", "{tmp}/latin1.txt"], "UTF-8"),
        ("short", ["--data", "{tmp}/short.txt"], "context"),
        (None, ["--data", "no_such_dataset_xyz"], "no_such_dataset_xyz"),
        ("jsonl", ["--data", "{tmp}/d.jsonl", "--task", "cls", "--label-field", "genre"], "genre"),
        (None, ["--ffn", "swiglue"], "did you mean 'swiglu'"),
        (None, ["--d-model", "30", "--heads", "4"], "divisible"),
        (None, ["--steps", "0"], "positive"),
    ],
)
def test_bad_input_exit_2_one_line_nothing_written(run_cli, tmp_path, setup, args, needle):
    if setup == "empty":
        (tmp_path / "empty.txt").write_text("")
    elif setup == "latin1":
        (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me ".encode("latin-1") * 100)
    elif setup == "short":
        (tmp_path / "short.txt").write_text("To be, or\n" * 200)  # val: ~100 chars, under one window
    elif setup == "jsonl":
        (tmp_path / "d.jsonl").write_text(
            "\n".join(json.dumps({"text": f"line {i}", "label": i % 2}) for i in range(30))
        )
    out = tmp_path / "result.json"
    argv = [
        "train",
        *[a.format(tmp=tmp_path) for a in args],
        "--steps" if "--steps" not in args else "--seed",
        "3" if "--steps" not in args else "0",
        "--out",
        out,
        "--checkpoint-dir",
        tmp_path / "ck",
    ]
    code, _, err = run_cli(*argv)
    assert code == 2, err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "ck").exists()


class _Stop(Exception):
    pass


def killed_at(cfg: TrainConfig, folder, step: int) -> None:
    """Train `cfg` checkpointing into `folder`, stopped as a kill would stop it once it reaches `step`."""

    def stop(at, total, metrics):
        if at == step:
            raise _Stop

    with pytest.raises(_Stop):
        train(replace(cfg, checkpoint_dir=str(folder)), progress=stop)


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize(
    "damage", ["truncated weights", "malicious state", "another model's weights", "garbage latest"]
)
def test_a_damaged_checkpoint_is_discarded_and_the_run_ends_as_uninterrupted(tmp_path, damage):
    import pickle

    from safetensors.torch import save_model

    from ffnlab.core.model import Transformer
    from ffnlab.run.checkpoint import CheckpointWarning

    cfg = tiny(max_steps=20, checkpoint_every=5, eval_every=10, precision="fp32")
    full = train(cfg)
    ckpt = tmp_path / "ck"
    killed_at(cfg, ckpt, 12)
    assert json.loads((ckpt / "latest.json").read_text())["step"] == 10
    if damage == "truncated weights":
        weights = ckpt / "model-10.safetensors"
        weights.write_bytes(weights.read_bytes()[:200])
    elif damage == "malicious state":
        (ckpt / "state-10.pt").write_bytes(pickle.dumps(_Evil(tmp_path / "pwned")))
    elif damage == "another model's weights":
        other = Transformer(replace(TINY, d_model=64, vocab_size=96))
        save_model(other, str(ckpt / "model-10.safetensors"))
    else:
        (ckpt / "latest.json").write_text("{not json")
    with pytest.warns(CheckpointWarning, match=f"discarding the unreadable checkpoint in {ckpt}"):
        r = train(replace(cfg, checkpoint_dir=str(ckpt)))
    assert not (tmp_path / "pwned").exists()
    assert r.status == "finished" and r.history.train_loss == full.history.train_loss
    assert r.val.loss == full.val.loss


def test_switch_x_reports_its_mean_gate_weights_per_layer():
    r = train(tiny(model=replace(TINY, ffn="switch_x:gelu+silu+relu"), max_steps=4, eval_every=4))
    weights = r.monitors.learned["blocks.0.ffn"]["weights"]
    assert set(weights) == {"gelu", "silu", "relu"} and sum(weights.values()) == pytest.approx(1.0)
    assert weights != pytest.approx({"gelu": 1 / 3, "silu": 1 / 3, "relu": 1 / 3}, abs=1e-6)  # the gate trained


# a mixed FFN's two branches are dense FFNs inside it: counted in the mix, not a second time
@pytest.mark.parametrize("schedule", ["gelu*1+swiglu*1", "gelu*1+mix:gelu+silu*1"])
def test_schedule_flops_per_token_sum_its_layers(schedule):
    from ffnlab.core.ffn import layer_sizes
    from ffnlab.core.model import Transformer
    from ffnlab.run.train import model_flops_per_token

    def ffn_flops(ffn):  # n_layers=0 and n_out=0 leave out attention and the head: the FFNs alone
        return model_flops_per_token(Transformer(replace(TINY, n_layers=2, ffn=ffn)), 32, 0, 32, 0)

    expected = sum(row["flops_per_token"] for row in layer_sizes(schedule, 2, 32))
    assert ffn_flops(schedule) == expected != ffn_flops("gelu")


@pytest.mark.slow
def test_schedule_run_reports_ffn_params_summed_over_its_layers():
    from ffnlab.core.ffn import layer_sizes

    r = train(tiny(model=replace(TINY, n_layers=2, ffn="gelu*1+swiglu*1"), max_steps=2, eval_every=2, eval_batches=1))
    assert r.costs.ffn_params == sum(row["params"] for row in layer_sizes("gelu*1+swiglu*1", 2, 32))


# ---- quantisation-aware training (qat_from) --------------------------------------------------------


def test_a_qat_run_converts_and_evaluates_to_its_own_final_loss(tmp_path):
    """The weights a QAT run saves, loaded into a plain model and converted to int8, give the loss the run
    measured under fake quantisation: what it trained for is what deploys."""
    pytest.importorskip("torchao")
    from safetensors.torch import load_model

    from ffnlab.core.model import Transformer
    from ffnlab.data.batches import eval_set
    from ffnlab.data.load import load_data
    from ffnlab.run.train import data_args, evaluate
    from ffnlab.tools.quantize import quantize_model

    cfg = tiny(precision="fp32", qat_from=0.5, max_steps=8, eval_every=4, final_eval_batches=2)
    r = train(cfg, weights_path=tmp_path / "w.safetensors")
    assert r.status == "finished" and r.config["qat_from"] == 0.5
    model = Transformer(replace(TINY, vocab_size=r.vocab_size))
    load_model(model, str(tmp_path / "w.safetensors"))
    _, _, splits = load_data(*data_args(cfg))
    batches = eval_set(splits["val"], "lm", cfg.final_eval_batches, cfg.batch_size, TINY.context)
    fp32 = lambda: torch.autocast("cpu", enabled=False)
    int8 = evaluate(quantize_model(model, "int8-dynamic"), batches, "lm", fp32)
    assert int8["loss"] == pytest.approx(r.val.loss, abs=1e-4)
    assert evaluate(model, batches, "lm", fp32)["loss"] != r.val.loss  # the float model is another one


def test_a_qat_run_resumed_past_its_start_ends_as_uninterrupted(tmp_path):
    pytest.importorskip("torchao")
    cfg = tiny(
        precision="fp32", qat_from=0.5, model=replace(TINY, dropout=0.1), checkpoint_every=6, final_eval_batches=2
    )
    cfg = replace(cfg, max_steps=8, eval_every=4, checkpoint_dir=str(tmp_path))
    full = train(cfg)  # leaves its step-6 checkpoint, past QAT's start at step 4
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 6
    resumed = train(cfg)
    assert resumed.history.train_loss == full.history.train_loss
    assert resumed.val.loss == full.val.loss


def test_qat_from_is_a_fraction_and_part_of_the_run_id():
    from ffnlab.study.plan import run_id

    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match="qat_from must be a fraction of training in"):
            tiny(qat_from=bad)
    assert run_id(tiny(qat_from=None)) != run_id(tiny(qat_from=0.8)) != run_id(tiny(qat_from=0.9))


def test_a_tagger_learns_conll_names_and_ends_with_span_f1(tmp_path):
    from tests.test_tagging import write_conll

    write_conll(tmp_path / "ner")
    cfg = tiny(model=replace(TINY, task="tokens", context=16), data=str(tmp_path / "ner"), max_steps=30, eval_every=15)
    r = train(cfg)
    assert r.status == "finished" and r.task == "tokens" and r.config["tokenizer"] == "word"  # 'char' read as 'word'
    assert r.val.f1 > 0.8 and r.test.f1 > 0.8 and r.val.acc > 0.9 and r.noisy_val.f1 is not None
    assert r.history.val[0].acc < 0.8 < r.history.val[-1].acc  # accuracy per word, padding left out
    assert r.val.loss == pytest.approx(r.history.val[-1].loss, rel=0.5)


def test_cli_tagger_prints_span_f1_and_a_line_without_a_tag_exits_2(run_cli, tmp_path):
    from tests.test_tagging import write_conll

    write_conll(tmp_path / "ner", sizes=(40, 8, 8))
    code, out, err = run_cli("train", "--task", "tokens", "--data", tmp_path / "ner", *TINY_MODEL, "--steps", 3)
    assert code == 0 and "span F1" in out and "token accuracy" in out, err
    bad = write_conll(tmp_path / "bad", sizes=(40, 8, 8))
    with open(bad / "valid.txt", "a") as f:
        f.write("\nOops\n")
    line = (bad / "valid.txt").read_text().count("\n")
    code, _, err = run_cli("train", "--task", "tokens", "--data", bad, "--steps", 3, "--out", tmp_path / "r.json")
    assert code == 2 and f"valid.txt line {line}: 'Oops' has a word but no tag" in err and err.count("\n") == 1
    assert not (tmp_path / "r.json").exists()
    code, _, err = run_cli("train", "--task", "tokens", "--tokenizer", "bpe", "--steps", 3)
    assert code == 2 and "task 'tokens' tags whole words" in err


# ---- memory and precision knobs: activation checkpointing, fp16 with a gradient scaler ------------------


@pytest.mark.parametrize("kind", ["block", "ffn"])
def test_checkpointing_keeps_less_for_backward_and_the_same_losses(kind):
    cfg = tiny(precision="fp32", max_steps=6, eval_every=6, model=replace(TINY, ffn="swiglu", dropout=0.1))
    plain = train(cfg)
    ck = train(replace(cfg, model=replace(cfg.model, activation_checkpointing=kind)))
    assert ck.history.train_loss == pytest.approx(plain.history.train_loss, rel=1e-6, abs=1e-6)
    assert ck.val.loss == pytest.approx(plain.val.loss, rel=1e-6, abs=1e-6)
    # what is recomputed is not kept: the training memory drops by exactly the saved-for-backward difference
    assert ck.memory.saved_bytes < plain.memory.saved_bytes
    assert plain.memory.train_mem_bytes - ck.memory.train_mem_bytes == plain.memory.saved_bytes - ck.memory.saved_bytes
    assert ck.config["model"]["activation_checkpointing"] == kind


@pytest.mark.slow  # two compiles: seconds each with a warm cache, ~10 s cold
@pytest.mark.parametrize("kind", ["none", "block"])
def test_compiled_runs_train_as_eager_does_checkpointed_or_not(kind):
    """--compile calls its kernels from C++ on the CPU (cpp_wrapper), which cannot compile the RNG state that
    activation checkpointing saves: such a run failed at its first step. It compiles with the Python wrapper."""
    cfg = tiny(precision="fp32", max_steps=4, eval_every=4, model=replace(TINY, activation_checkpointing=kind))
    eager, compiled = train(cfg), train(replace(cfg, compile=True))
    assert compiled.status == "finished" and compiled.config["compile"]
    assert compiled.history.train_loss == pytest.approx(eager.history.train_loss, rel=1e-4, abs=1e-5)


def test_compile_uses_the_cpp_wrapper_on_the_cpu_unless_checkpointing(monkeypatch):
    from ffnlab.run import train as train_module

    seen = []
    monkeypatch.setattr(train_module.torch, "compile", lambda model, **kw: seen.append(kw) or model)
    model = torch.nn.Linear(2, 2)
    assert train_module.step_function(model, tiny(), "cpu") is model and not seen  # no --compile: the model
    for kind in ("none", "block", "ffn"):
        train_module.step_function(model, tiny(compile=True, model=replace(TINY, activation_checkpointing=kind)), "cpu")
    train_module.step_function(model, tiny(compile=True), "cuda")
    assert [kw["options"] for kw in seen] == [{"cpp_wrapper": True}, None, None, None]
    assert all(kw["dynamic"] is False for kw in seen)


def test_vector_isa_probes_are_skipped_once_they_all_passed_on_this_machine(monkeypatch, tmp_path):
    """Inductor probes each vector ISA in child Pythons in every process (~1 s of a --compile start on AMX)."""
    from torch._inductor import config, cpp_builder, cpu_vec_isa
    from torch._inductor.exc import InvalidCxxCompiler

    from ffnlab.run import device

    class Isa:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return self.name

    isas = [Isa("amx_tile"), Isa("avx512"), Isa("avx2"), Isa("asimd")]  # the last one not on this CPU
    monkeypatch.setattr(device.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list", isas)
    monkeypatch.setattr(cpu_vec_isa, "x86_isa_checker", lambda: ["avx2", "avx512", "amx_tile"])

    def process(cache, probes):  # a new process: Inductor's config unset, its probes as given
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / cache))
        monkeypatch.setattr(config.cpp, "vec_isa_ok", None)
        monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", probes)
        device.skip_known_vec_isa_probes()
        return config.cpp.vec_isa_ok, len(list((tmp_path / cache).glob("ffnlab-vec-isa-*")))

    def unprobed():
        raise AssertionError("probed again")

    assert process("a", lambda: isas[:3]) == (True, 1)  # all passed: trusted from now on
    assert process("a", unprobed) == (True, 1)  # the next process does not probe
    assert process("b", lambda: isas[1:3]) == (None, 0)  # AMX failed its probe: every process probes
    assert process("b", lambda: isas[1:3]) == (None, 0)
    monkeypatch.setattr(device, "cpu_flags", lambda: frozenset({"other"}))
    assert process("a", lambda: isas[1:3]) == (None, 1)  # another CPU (or torch, or compiler): probed again
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: (_ for _ in ()).throw(InvalidCxxCompiler()))
    assert process("c", unprobed) == (None, 0)  # no C++ compiler: left to torch.compile to say so
    monkeypatch.setattr(config.cpp, "vec_isa_ok", False)  # TORCHINDUCTOR_VEC_ISA_OK=0: the user's word
    device.skip_known_vec_isa_probes()
    assert config.cpp.vec_isa_ok is False


HEAP_PROBE = """
import ctypes, resource, sys
from ffnlab.run.device import hold_freed_heap
held = hold_freed_heap() if sys.argv[1] == "hold" else False
libc, n = ctypes.CDLL(None), 20 << 20
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
faults = []
for _ in range(3):  # a step's block: allocated, written, freed; the page faults of writing it each time
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    libc.free(p)
print(held, *faults)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap thresholds: nothing is set elsewhere")
def test_freed_heap_is_kept_for_the_next_step_not_faulted_in_again():
    """A fresh process without hold_freed_heap faults a freed 20 MiB block in again (glibc gave it back); with it not."""
    from ffnlab.run.device import HEAP_ENV

    env = {k: v for k, v in os.environ.items() if k not in (*HEAP_ENV, "GLIBC_TUNABLES")}  # glibc's own defaults

    def run(mode):
        out = subprocess.run(
            [sys.executable, "-c", HEAP_PROBE, mode], capture_output=True, text=True, check=True, env=env
        )
        held, *faults = out.stdout.split()
        return held, [int(f) for f in faults]

    pages = (20 << 20) // resource.getpagesize()
    held, faults = run("hold")
    assert held == "True" and faults[0] >= pages // 2 and max(faults[1:]) < pages // 10  # written once, then reused
    held, faults = run("default")
    assert held == "False" and faults[1] >= pages // 2  # given back, and faulted in again


def test_the_users_heap_settings_win_and_prepare_holds_the_heap_on_the_cpu(monkeypatch):
    from ffnlab.run import device
    from ffnlab.run import train as train_module

    seen = []
    with monkeypatch.context() as m:
        m.setattr(train_module, "hold_freed_heap", lambda: seen.append(1))
        train_module.prepare(tiny(max_steps=1))
    assert seen == [1]
    monkeypatch.setattr(device.ctypes, "CDLL", lambda _: pytest.fail("mallopt called over the user's setting"))
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert device.hold_freed_heap() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert device.hold_freed_heap() is False


def test_checkpointing_is_a_run_of_its_own_and_ffn_needs_ffnlabs_transformer():
    from ffnlab.study.plan import run_id

    ids = {run_id(tiny(model=replace(TINY, activation_checkpointing=k))) for k in ("none", "block", "ffn")}
    assert len(ids) == 3 and run_id(tiny()) in ids  # 'none', the default, keeps the ids stored before it
    with pytest.raises(ValueError, match="'ffn' needs ffnlab's Transformer .* valid with --hf-config or --from: none"):
        tiny(hf_config=LLAMA, model=replace(TINY, activation_checkpointing="ffn"))


LLAMA = {**PRETRAINED_LLAMA, "num_hidden_layers": 2}  # two layers: block checkpointing has blocks to keep apart


def test_a_hugging_face_model_checkpoints_its_layers():
    cfg = tiny(precision="fp32", hf_config=LLAMA, max_steps=3, eval_every=3, final_eval_batches=2)
    plain = train(cfg)
    ck = train(replace(cfg, model=replace(TINY, activation_checkpointing="block")))
    assert ck.history.train_loss == pytest.approx(plain.history.train_loss, rel=1e-6, abs=1e-6)
    assert ck.memory.saved_bytes < plain.memory.saved_bytes


def test_fp16_trains_with_a_gradient_scaler():
    r = train(tiny(precision="fp16", max_steps=10, eval_every=10))
    fp32 = train(tiny(precision="fp32", max_steps=10, eval_every=10))
    assert r.status == "finished" and r.steps == 10 and r.precision == r.config["precision"] == "fp16"
    assert r.history.train_loss != fp32.history.train_loss  # it ran in fp16 ...
    assert r.val.loss == pytest.approx(fp32.val.loss, abs=0.05)  # ... and learned as fp32 did
    assert r.memory.saved_bytes < fp32.memory.saved_bytes  # half-width activations kept for backward


def big_first_scale(monkeypatch, init_scale: float) -> None:
    """Gradient scalers that start at `init_scale`: high enough, the first steps' gradients overflow fp16."""
    import functools

    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=init_scale))


def test_fp16_overflow_skips_the_update_without_divergence(monkeypatch):
    big_first_scale(monkeypatch, 2.0**40)
    r = train(tiny(precision="fp16", max_steps=6, eval_every=6))
    skips = [e for e in r.events if e.kind == "fp16_skip"]
    assert len(skips) >= 3 and [e.detail["scale"] for e in skips[:3]] == [2.0**39, 2.0**38, 2.0**37]
    assert r.status == "finished" and r.diverged_kind is None
    assert r.steps == 6 and len(r.history.train_loss) == 6  # a skipped update is not a step
    assert all(math.isfinite(g) for g in r.history.grad_norm)


def test_fp16_diverges_when_the_scale_collapses(monkeypatch):
    from ffnlab.run import train as train_module

    big_first_scale(monkeypatch, 2.0**40)
    monkeypatch.setattr(train_module, "FP16_MIN_SCALE", 2.0**39)  # the second overflow takes the scale under it
    r = train(tiny(precision="fp16", max_steps=6, eval_every=6))
    assert r.status == "diverged" and r.diverged_kind == "nonfinite" and r.diverged_step == 0 and r.steps == 0
    assert [e.kind for e in r.events] == ["fp16_skip", "fp16_skip", "nonfinite"]


def test_fp16_resumes_with_its_scale(monkeypatch, tmp_path):
    big_first_scale(monkeypatch, 2.0**30)  # skipped updates: a resumed run at the first scale would skip again
    cfg = tiny(precision="fp16", max_steps=8, eval_every=4, checkpoint_every=6, checkpoint_dir=str(tmp_path))
    full = train(cfg)  # leaves its step-6 checkpoint
    assert any(e.kind == "fp16_skip" for e in full.events)
    resumed = train(cfg)
    assert resumed.history.train_loss == full.history.train_loss
    assert resumed.val.loss == full.val.loss


def test_fp16_is_refused_in_one_line_where_torch_has_no_fp16_autocast(monkeypatch, run_cli, tmp_path):
    from ffnlab.run import device

    assert device.fp16_autocast("cpu")  # torch 2.13 autocasts to fp16 on the CPU
    monkeypatch.setattr(device, "fp16_autocast", lambda where: False)
    with pytest.raises(
        ValueError, match="precision 'fp16' needs fp16 autocast, .* on cpu; valid here: auto, fp32, bf16$"
    ):
        train(tiny(precision="fp16"))
    code, _, err = run_cli("train", *TINY_MODEL, "--precision", "fp16", "--steps", 2, "--out", tmp_path / "r.json")
    assert code == 2 and "valid here: auto, fp32, bf16" in err and err.count("\n") == 1, err
    assert not (tmp_path / "r.json").exists()
    code, _, err = run_cli(*SMOKE_COMPARE, "--precision-axis", "fp32,fp16", "--store", tmp_path / "s.db")
    assert code == 2 and "valid here: auto, fp32, bf16" in err and err.count("\n") == 1, err
    assert not (tmp_path / "s.db").exists()


SMOKE_COMPARE = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", 2, "--steps", 2]


def test_the_cli_trains_with_checkpointing_and_fp16(run_cli):
    knobs = ["--precision", "fp16", "--activation-checkpointing", "block"]
    code, out, err = run_cli("train", *TINY_MODEL, "--steps", 2, "--eval-every", 2, *knobs)
    assert code == 0, err
    assert "in fp16" in out and "with block checkpointing" in out


def test_the_progress_bar_writes_to_stderr_as_it_is_when_the_bar_is_made():
    from ffnlab.run.train import progress_bar

    shown = io.StringIO()
    with contextlib.redirect_stderr(shown):  # as a notebook or pytest's capsys replaces it, after the import
        show = progress_bar("relu seed 0: ")
    show(2, 2, {"loss": 1.5, "lr": 1e-3, "elapsed": 0.5})
    assert shown.getvalue() == "\rrelu seed 0: 2/2 steps  eta     0s  loss 1.5000  lr 1.00e-03\n"


def regression_csv(path, n: int = 300):
    """A learnable regression: each text 16 letters a or b, its label 5 x its share of a's (STS-B's 0 to 5)."""
    gen = torch.Generator().manual_seed(0)
    texts = ["".join("ab"[int(b)] for b in torch.randint(2, (16,), generator=gen)) for _ in range(n)]
    path.write_text("text,label\n" + "".join(f"{t},{5 * t.count('a') / 16}\n" for t in texts), encoding="utf-8")
    return path


def test_a_regressor_learns_a_number_per_text_and_reports_its_correlations(tmp_path):
    data = str(regression_csv(tmp_path / "reg.csv"))
    r = train(tiny(data=data, model=replace(TINY, task="reg"), max_steps=60, lr=1e-2, batch_size=16, precision="fp32"))
    untrained = r.history.val[0].loss  # the mean squared error of the untrained model
    assert r.task == "reg" and r.val.loss < untrained / 10
    assert r.val.pearson > 0.8 and r.val.spearman > 0.8 and r.test.pearson > 0.8
    assert r.val.acc is None and r.val.mcc is None and r.noisy_val.pearson is not None
