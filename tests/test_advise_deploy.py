"""advise weighs the measured deployment (deploy.json beside a store, ffnlab.study.advise.from_deployment) when
inference cost counts: the pick follows the numbers, its reasons say 'measured' and name the file and the
machine, and without deploy.json the advice is what it was, pointing at `ffnlab deploy --store`."""

import json
from statistics import mean

import pytest

from ffnlab._util.jsonio import strict_dumps
from ffnlab.study.advise import advise, format_advice
from ffnlab.study.advise.from_deployment import LOSS_BUDGET
from ffnlab.study.deployment import save_deployment
from ffnlab.tools import deploy as dp
from tests.test_advise import SEED_NOISE, fabricated_store

CPU = "Test CPU 9000"
# the training losses: gelu is significantly better than relu (the same per-seed noise on both)
TRAINED = {"gelu": 1.95, "relu": 1.97}


def deployed(ffn, target, ms, loss, jitter=(0.0, 0.0, 0.0), qat_from=None):
    """A measured row of deploy.json: `target` 'precision/runtime[/scheme]', batch-1 median `ms`, validation
    loss `loss` on each of the fabricated store's seeds (its noise, plus `jitter`)."""
    precision, runtime, *scheme = target.split("/")
    seconds = ms / 1e3
    latency = dp.Latency(1, 32, seconds, 0.95 * seconds, 1.05 * seconds, 0.9 * seconds, 1.2 * seconds, 20, 3, 2)
    throughput = dp.Latency(16, 32, 8 * seconds, 8 * seconds, 8 * seconds, 8 * seconds, 8 * seconds, 20, 3, 2)
    losses = {seed: loss + noise + extra for seed, (noise, extra) in enumerate(zip(SEED_NOISE, jitter))}
    quality = dp.Quality(
        seeds=sorted(losses),
        val_loss=mean(losses.values()),
        test_loss=None,
        val_acc=None,
        test_acc=None,
        val_loss_delta=None,
        test_loss_delta=None,
        val_acc_delta=None,
        reference="fp32 eager of the same runs",
        measured_in=runtime,
        val_losses=losses,
    )
    size = 16_000 if precision == "int8" else 64_000
    return dp.DeployRow(ffn, precision, runtime, scheme[0] if scheme else None, latency, throughput, size, None,
                        size, 0.1, None, None, quality=quality, qat_from=qat_from)  # fmt: skip


def with_deployment(store, rows, d_model=32, n_layers=1):
    """`rows` saved as deploy.json beside `store`, measured on CPU with 2 threads."""
    model = {"d_model": d_model, "n_layers": n_layers, "context": 32, "params": {"gelu": 16_000, "relu": 16_000}}
    setup = {"batch": 16, "seq": 32, "repeats": 20, "warmup": 3, "threads": 2, "device": "cpu"}
    env = {"cpu": CPU, "cpu_flags": ["avx512_vnni"], "torch": "2.0", "device": "cpu", "gpu": None}
    save_deployment(store, dp.DeployResult(f"store {store}", model, setup, env, rows))
    return store


def base_rows():
    """fp32 eager rows of both variants: gelu is the reference (1.95)."""
    return [deployed("gelu", "fp32/eager", 10.0, 1.95), deployed("relu", "fp32/eager", 9.0, 1.965)]


RELU_INT8_WINS = [deployed("gelu", "int8/eager/int8-dynamic", 6.0, 1.96),
                  deployed("relu", "int8/eager/int8-dynamic", 4.0, 1.965)]  # fmt: skip
GELU_INT8_AS_FAST_AND_BETTER = [deployed("gelu", "int8/eager/int8-dynamic", 4.1, 1.955),
                                deployed("relu", "int8/eager/int8-dynamic", 4.0, 1.965)]  # fmt: skip
RELU_INT8_LOSES_TOO_MUCH = [deployed("gelu", "int8/eager/int8-dynamic", 6.0, 1.96),
                            deployed("relu", "int8/eager/int8-dynamic", 4.0, 2.05)]  # fmt: skip


@pytest.mark.parametrize("hardware", ["mobile", "cpu"])
@pytest.mark.parametrize(
    "int8_rows,ffn,pick",
    [
        (RELU_INT8_WINS, "relu", "relu int8/eager/int8-dynamic"),
        (GELU_INT8_AS_FAST_AND_BETTER, "gelu", "gelu int8/eager/int8-dynamic"),  # within 5%: the better loss
        (RELU_INT8_LOSES_TOO_MUCH, "gelu", "gelu int8/eager/int8-dynamic"),
    ],
    ids=["relu-int8-wins", "gelu-int8-as-fast-and-better", "relu-int8-loses-too-much"],
)
def test_the_measured_deployment_picks_what_its_numbers_favour(tmp_path, hardware, int8_rows, ffn, pick):
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), base_rows() + int8_rows)
    advice = advise(store=store, hardware=hardware)
    assert advice.recommendation == ffn and advice.branch == "pretrain/measured"
    assert advice.evidence.deployment.pick == pick
    assert "implementation" not in advice.to_json()  # (a store's advice names a variant; the row is in the reasons)
    (measured,) = [r for r in advice.rules if r.rule == "deploy-measured"]
    assert measured.evidence == "measured" and pick in measured.text
    assert str(tmp_path / "deploy.json") in measured.source and f"{CPU} (avx512_vnni), 2 threads" in measured.source
    assert f"[measured] {measured.text} (source: {measured.source})" in advice.reasons
    assert ("deploy-mobile-int8" in [r.rule for r in advice.rules]) == (hardware == "mobile")
    caveat = "not on a phone" if hardware == "mobile" else f"deploy.json was measured on {CPU}"
    assert any(caveat in r for r in advice.reasons)


def test_the_loss_budget_and_the_noise_decide_which_rows_compete(tmp_path):
    store = fabricated_store(tmp_path / "s.db", TRAINED)
    gap = LOSS_BUDGET + 0.01  # beyond the budget...
    with_deployment(store, base_rows() + [deployed("relu", "int8/eager/int8-dynamic", 4.0, 1.95 + gap)])
    advice = advise(store=store, hardware="cpu")
    assert advice.evidence.deployment.pick == "relu fp32/eager"  # the fastest row left
    assert any(r.startswith("The fastest row, relu int8/eager/int8-dynamic (4 ms), is out") for r in advice.reasons)
    rows = {w.label: w for w in advice.evidence.deployment.choice.rows}
    assert rows["relu int8/eager/int8-dynamic"].acceptable is False
    assert rows["relu int8/eager/int8-dynamic"].gap == pytest.approx(gap)
    # ...but within the noise: its 95% CI paired over seeds reaches 0
    noisy = deployed("relu", "int8/eager/int8-dynamic", 4.0, 1.95 + gap, jitter=(0.06, -0.07, 0.01))
    with_deployment(store, base_rows() + [noisy])
    advice = advise(store=store, hardware="cpu")
    assert advice.evidence.deployment.pick == "relu int8/eager/int8-dynamic"
    (row,) = [w for w in advice.evidence.deployment.choice.rows if w.label == "relu int8/eager/int8-dynamic"]
    assert row.acceptable and row.ci[0] <= 0 < row.gap


def test_on_mobile_the_int8_rows_weigh_most(tmp_path):
    # relu in fp32 on ONNX Runtime is the fastest row; gelu's int8 row the fastest int8 one
    rows = base_rows() + [
        deployed("relu", "fp32/onnxruntime", 3.0, 1.965),
        deployed("gelu", "int8/eager/int8-dynamic", 4.0, 1.955),
        deployed("relu", "int8/eager/int8-dynamic", 5.0, 1.965),
    ]
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), rows)
    cpu, mobile = advise(store=store, hardware="cpu"), advise(store=store, deploy="edge")
    assert (cpu.recommendation, cpu.evidence.deployment.pick) == ("relu", "relu fp32/onnxruntime")
    assert (mobile.recommendation, mobile.evidence.deployment.pick) == ("gelu", "gelu int8/eager/int8-dynamic")
    assert mobile.evidence.deployment.choice.int8_only and not cpu.evidence.deployment.choice.int8_only
    (rule,) = [r for r in mobile.rules if r.rule == "deploy-mobile-int8"]
    assert "int8 rows weigh most" in rule.text and rule.evidence == "rule of thumb"
    assert any(r.startswith("gelu has the best mean") for r in cpu.reasons)  # the training numbers, still quoted
    # where no int8 row keeps the quality, a float row is picked, and the advice says why
    rows[3:] = [
        deployed("gelu", "int8/eager/int8-dynamic", 4.0, 2.1),
        deployed("relu", "int8/eager/int8-dynamic", 5.0, 2.2),
    ]
    with_deployment(store, rows)
    mobile = advise(store=store, hardware="mobile")
    assert mobile.evidence.deployment.pick == "relu fp32/onnxruntime"
    assert any(r.startswith("No int8 row keeps the quality (the nearest, gelu int8") for r in mobile.reasons)


def test_without_deploy_json_the_advice_is_unchanged_and_points_at_ffnlab_deploy(tmp_path, monkeypatch):
    import ffnlab.study.advise.from_store as from_store

    store = fabricated_store(tmp_path / "s.db", TRAINED)
    advice = advise(store=store, hardware="mobile")
    pointer = [r for r in advice.reasons if f"`ffnlab deploy --store {store}`" in r]
    assert len(pointer) == 1 and advice.evidence.deployment is None
    monkeypatch.setattr(from_store, "deployment_advice", lambda *a, **kw: None)  # the advice before deploy.json
    before = advise(store=store, hardware="mobile")
    assert advice.to_json() == {**before.to_json(), "reasons": before.reasons + pointer}
    assert advice.recommendation == "gelu"  # relu is significantly worse in training: no mobile rule moves it
    # where inference cost is not the question, nothing is said of it
    monkeypatch.undo()
    assert not any("ffnlab deploy" in r for r in advise(store=store).reasons)


def test_a_deployment_that_does_not_apply_is_not_used_and_says_why(tmp_path):
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), base_rows() + RELU_INT8_WINS, d_model=64)
    advice = advise(store=store, hardware="mobile")
    assert advice.recommendation == "gelu" and advice.evidence.deployment is None
    assert any("was not used: it measured a model of d_model 64" in r for r in advice.reasons)
    with_deployment(store, base_rows() + RELU_INT8_WINS)
    gpu = advise(store=store, hardware="gpu", latency_sensitive=True)
    assert any("its latencies say nothing of a GPU" in r for r in gpu.reasons)
    assert "deploy-measured" not in [r.rule for r in gpu.rules]
    with_deployment(store, [deployed("gelu", "int8/eager/int8-dynamic", 4.0, 1.95)])  # no fp32 eager reference
    assert any("no fp32 eager row with a validation loss" in r for r in advise(store=store, hardware="cpu").reasons)


def test_latency_sensitive_uses_the_deployment_too(tmp_path):
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), base_rows() + RELU_INT8_WINS)
    assert advise(store=store).recommendation == "gelu"  # nothing says inference cost counts
    assert advise(store=store, latency_sensitive=True).recommendation == "relu"


def test_a_budget_keeps_an_excluded_variant_out_of_the_deployment(tmp_path):
    store = fabricated_store(tmp_path / "s.db", TRAINED, params={"relu": 20_000, "gelu": 16_000})
    with_deployment(store, base_rows() + RELU_INT8_WINS)
    advice = advise(store=store, hardware="mobile", params_budget="18k")
    assert advice.recommendation == "gelu" and advice.evidence.deployment.pick == "gelu int8/eager/int8-dynamic"
    assert {w.row.ffn for w in advice.evidence.deployment.choice.rows} == {"gelu"}


def test_a_checkpoint_for_inference_learns_how_to_run_its_variant(tmp_path):
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), base_rows() + RELU_INT8_WINS)
    advice = advise(situation="inference", pretrained="bert-base-uncased", deploy="edge", store=store)
    assert advice.recommendation == "gelu" and advice.branch == "inference/pretrained"  # the checkpoint's, always
    assert advice.evidence.deployment.pick == "gelu int8/eager/int8-dynamic"
    assert advice.implementation.endswith(
        "measured fastest within the quality budget: gelu int8/eager/int8-dynamic (deploy.json)"
    )
    assert [r.rule for r in advice.rules][-2:] == ["deploy-mobile-int8", "deploy-measured"]
    assert any("not of the checkpoint" in r for r in advice.reasons)
    assert any(r.startswith("The training measurements in") for r in advice.reasons)
    plain = advise(
        situation="inference", pretrained="bert-base-uncased", deploy="edge", store=tmp_path / "other" / "s.db"
    )
    assert any("`ffnlab deploy --store" in r for r in plain.reasons) and plain.evidence.deployment is None


def test_advise_json_carries_the_measured_deployment_as_strict_json(run_cli, tmp_path):
    rows = base_rows() + RELU_INT8_WINS + [deployed("gelu", "bf16/eager", 8.0, float("nan"))]  # a row without a loss
    store = with_deployment(fabricated_store(tmp_path / "s.db", TRAINED), rows)
    code, out, err = run_cli("advise", "--store", store, "--hardware", "mobile", "--json")
    assert code == 0, err
    advice = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert advice == json.loads(strict_dumps(advise(store=store, hardware="mobile").to_json()))
    deployment = advice["evidence"]["deployment"]
    assert deployment["pick"] == "relu int8/eager/int8-dynamic" and deployment["machine"]["threads"] == 2
    assert deployment["file"] == str(tmp_path / "deploy.json") and CPU in deployment["measured_on"]
    assert "gelu bf16/eager" not in {r["row"] for r in deployment["rows"]}  # unscored rows do not compete
    assert {r["rule"]: r["evidence"] for r in advice["rules"]}["deploy-measured"] == "measured"
    code, text, _ = run_cli("advise", "--store", store, "--hardware", "mobile")
    assert text.strip() == format_advice(advise(store=store, hardware="mobile"))
    assert text.startswith("recommendation: relu") and "[measured] Measured deployment" in text


def test_a_store_of_several_settings_is_not_pointed_at_a_deploy_that_refuses_it(tmp_path, run_cli):
    """advise on a store of two contexts suggested `ffnlab deploy --store S`, which refuses a store of two settings."""
    store = fabricated_store(tmp_path / "s.db", TRAINED)
    fabricated_store(store, TRAINED, context=16)  # a second cell in the same store
    (pointer,) = [r for r in advise(store=store, hardware="mobile").reasons if r.startswith("No deployment")]
    assert (
        f"`ffnlab deploy --store` measures one setting and {store} holds 2 (run the cell to deploy into a " in pointer
    )
    assert f"`ffnlab deploy --store {store}`" not in pointer
    code, _, err = run_cli("deploy", "--store", store, "--ffn", "gelu")
    assert code == 2 and "settings besides FFN and seed; deploy measures one: run the cell to deploy into" in err


@pytest.mark.parametrize("form", ["garbage", "a folder", "a latency that is text", "a null environment",
                                  "precision fp64", "an unknown variant", "100k nested arrays"])  # fmt: skip
def test_a_damaged_deploy_json_is_said_to_be_damaged_and_the_advice_stands_without_it(tmp_path, run_cli, form):
    """advise read a damaged deploy.json as none ("No deployment was measured"), or failed with exit 1 (a latency
    that is text, a null environment, 100k nested arrays), or picked among rows of a precision it never deploys."""
    from tests.test_report import DAMAGED, damaged_deploy_json

    store = fabricated_store(tmp_path / "s.db", TRAINED)
    damaged_deploy_json(tmp_path, form)
    advice = advise(store=store, hardware="mobile")
    (line,) = [r for r in advice.reasons if "deploy.json" in r]
    assert line.startswith(f"The deployment beside {store} was not used: the deployment file {tmp_path}/deploy.json")
    assert DAMAGED[form] in line and "the file is damaged: measure it again" in line
    assert advice.recommendation == "gelu" and advice.evidence.deployment is None  # as without deploy.json
    code, out, err = run_cli("advise", "--store", store, "--hardware", "mobile")
    assert code == 0 and err == "" and "the file is damaged" in out
