import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ffnlab.core.activations import ACTIVATIONS
from ffnlab.core.ffn import FFNS
from tests.conftest import TINY_MODEL
from tests.test_files import device_node


def test_list_json_has_every_entry(run_cli):
    code, out, err = run_cli("list", "--json", "--d-model", 256)
    assert code == 0 and err == ""
    rows = json.loads(out)
    names = {(r["name"], r["kind"]) for r in rows}
    assert {(n, "activation") for n in ACTIVATIONS} <= names
    assert {(n, "ffn") for n in FFNS} <= names
    for r in rows:
        assert {"name", "kind", "gated", "aliases", "formula"} <= set(r)
    swiglu = next(r for r in rows if r["name"] == "swiglu")
    assert swiglu["gated"] and swiglu["params"] == 3 * 256 * swiglu["d_ff"]
    assert next(r for r in rows if r["name"] == "gelu_tanh")["aliases"] == [
        "gelu_accurate",
        "gelu_fast",
        "gelu_new",
        "gelu_pytorch_tanh",
    ]


def test_list_table(run_cli):
    code, out, _ = run_cli("list")
    assert code == 0
    assert "swiglu" in out and "W_down(silu(W_gate x) * W_up x)" in out and "gelu_new" in out


def test_list_counts_sizes_without_allocating_them(run_cli):
    # d_model 1e6: 8e12 parameters a row, counted on the meta device (it allocated them: an internal error)
    code, out, err = run_cli("list", "--json", "--d-model", 1_000_000)
    assert code == 0, err
    gelu = next(r for r in json.loads(out) if r["name"] == "gelu" and r["kind"] == "ffn")
    assert gelu["d_ff"] == 4_000_000 and gelu["params"] == 2 * 10**6 * 4 * 10**6 + 5 * 10**6


def test_list_sizes_a_schedule_per_layer(run_cli):
    code, out, err = run_cli("list", "--schedule", "GELU*1+gelu*1+swiglu*2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["schedule"] == "gelu*2+swiglu*2" and d["n_layers"] == 4  # the layers it names
    assert [(r["variant"], r["d_ff"], r["params"]) for r in d["layers"]] == [
        ("gelu", 2048, 2_099_712),  # the README's Variants table at d_model 512
        ("gelu", 2048, 2_099_712),
        ("swiglu", 1376, 2_113_536),
        ("swiglu", 1376, 2_113_536),
    ]
    assert d["params"] == 2 * 2_099_712 + 2 * 2_113_536 and d["dense_params"] == 4 * 2_099_712
    assert 0 < d["vs_dense"] < 0.01
    code, out, _ = run_cli("list", "--schedule", "gelu*2+swiglu*2", "--layers", 4)
    assert code == 0 and "8,426,496" in out and "dense 4x, 4 layers" in out and "(+0.33%)" in out
    notes = run_cli("list")[1].splitlines()
    assert any(line.startswith("a per-layer schedule names each layer's FFN as VARIANT*LAYERS") for line in notes)


@pytest.mark.parametrize("unbuffered", ["1", None])
def test_a_reader_that_leaves_ends_the_command_quietly(unbuffered):
    # `ffnlab list | head`: the pipe closes before ffnlab writes; like `cat`, it stops without a word, whether
    # the write fails at once (PYTHONUNBUFFERED) or only when the buffered output is flushed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | (
        {"PYTHONUNBUFFERED": unbuffered} if unbuffered else {}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ffnlab.cli", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["list", "--schedule", "gelu*2+swiglu*2", "--layers", "3"], "covers 4 layers but n_layers is 3"),
        (["list", "--schedule", "gelu*2+swiglue*2"], "did you mean 'swiglu'"),
        (["list", "--layers", "3"], "add --schedule"),
        (["train", "--ffn", "gelu*4+swiglu*2", "--layers", "4"], "covers 6 layers but n_layers is 4"),
        (["list", "--d-model", "0"], "must be positive"),
        (["list", "--d-model", "abc"], "positive integer"),
        (["list", "--d-model", "-1e3"], "positive integer"),  # a negative number, not a flag
        (["list", "--d-model", "100000000000000"], "the model's sizes overflow"),  # was an internal error
        (["train", "--lr", "-1e-3"], "lr and grad_clip must be positive"),
        (["numerics", "--range", "-inf,5"], "range must be finite"),
        (["nosuchcommand"], "invalid choice"),
        (["compare", "--preset", "", "--print-config"], "unknown preset ''; valid: smoke,"),  # ran standard
        (["compare", "--baseline", "", "--print-config"], "unknown FFN variant ''; valid:"),  # took the default
        (["compare", "--seeds", "100000000000", "--print-config"], "at most 100,000"),  # planned without end
        (["compare", "--noise-floor", "100000000", "--print-config"], "at most 100,000"),
    ],
)
def test_bad_input_one_line_exit_2(run_cli, argv, needle):
    code, out, err = run_cli(*argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--ffn", "LONG"],
        ["list", "--schedule", "gelu*2+LONG*2"],
        ["train", "--attn-act", "q=LONG"],
        ["train", "--lr", "LONG"],
        ["compare", "--preset", "LONG", "--print-config"],
        ["advise", "--situation", "LONG"],
        ["list", "LONG"],
    ],
)
def test_a_long_user_string_is_echoed_shortened(run_cli, argv):
    code, _, err = run_cli(*[a.replace("LONG", "y" * 100_000) for a in argv])
    assert code == 2 and err.count("\n") == 1 and len(err) < 1000 and "… (100,000 characters)" in err, err[:300]


@pytest.mark.parametrize("module", ["ffnlab.cli", "ffnlab"])  # python -m ffnlab runs the same main
def test_console_script_exit_code(module):
    proc = subprocess.run([sys.executable, "-m", module, "list", "--d-model", "-3"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("ffnlab: error:")


TINY_TRAIN = ["train", *TINY_MODEL, "--steps", 2, "--eval-every", 2, "--quiet"]
TINY_COMPARE = [
    "compare",
    "--preset",
    "smoke",
    "--variants",
    "relu,gelu",
    "--seeds",
    3,
    "--steps",
    2,
    "--eval-every",
    2,
    "--jobs",
    1,
    "--quiet",
]


def one_line(code, err, want=2):
    return code == want and err.count("\n") == 1 and "Traceback" not in err


def test_outputs_that_name_a_folder_fail_before_the_work(run_cli, tmp_path):
    code, _, err = run_cli(*TINY_TRAIN, "--out", tmp_path)
    assert one_line(code, err) and "is a folder" in err
    code, _, err = run_cli(*TINY_TRAIN, "--out", tmp_path / "no" / "r.json")
    assert one_line(code, err) and "does not exist" in err
    code, _, err = run_cli(*TINY_COMPARE, "--csv", tmp_path, "--store", tmp_path / "s.db")
    assert one_line(code, err) and "is a folder" in err and not (tmp_path / "s.db").exists()
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    "argv",
    [
        [*TINY_COMPARE, "--no-report", "--csv"],
        [*TINY_TRAIN, "--out"],
        ["export", "--ffn", "gelu", "--d-model", 8, "--out"],
    ],
    ids=["compare --csv", "train --out", "export --out"],
)
def test_an_output_on_a_device_is_refused_before_the_work_and_the_device_stays(run_cli, tmp_path, argv):
    node = device_node(tmp_path / "null")  # a /dev/null of the test's own: /dev/full became a 725-byte CSV
    code, _, err = run_cli(*argv, node, "--store", tmp_path / "s.db") if "compare" in argv else run_cli(*argv, node)
    assert one_line(code, err) and f"cannot write {node}: it is a character device" in err, err
    assert stat.S_ISCHR(os.stat(node).st_mode) and os.listdir(tmp_path) == ["null"]  # no store: nothing trained


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux's /proc")
@pytest.mark.parametrize("argv", [[*TINY_COMPARE, "--no-report", "--csv"], [*TINY_TRAIN, "--out"]])
def test_an_output_where_no_file_can_be_made_is_named_before_the_work(run_cli, tmp_path, argv):
    code, _, err = run_cli(*argv, "/proc/version", *(["--store", tmp_path / "s.db"] if "compare" in argv else []))
    assert one_line(code, err) and "cannot write /proc/version: no file can be created in /proc" in err, err
    assert os.listdir(tmp_path) == []  # it trained first, then named '/proc/.version.PID.tmp'


@pytest.mark.parametrize("store", ["folder", "/proc/ffnlab/s.db", "garbage"])
def test_unusable_stores_are_one_line_errors(run_cli, tmp_path, store):
    if store == "folder":
        path = tmp_path
    elif store == "garbage":
        path = tmp_path / "g.db"
        path.write_bytes(b"this is not sqlite" * 100)
    else:
        path = store
    code, _, err = run_cli(*TINY_COMPARE, "--no-report", "--store", path)
    assert one_line(code, err), err
    code, _, err = run_cli("report", "--store", path)
    assert one_line(code, err), err


def test_a_bug_is_one_line_exit_1_with_the_trace_in_a_file(run_cli, monkeypatch):
    import ffnlab.cli as cli

    def broken(args):
        return 1 / 0

    monkeypatch.setattr(cli, "cmd_list", broken)
    code, _, err = run_cli("list")
    assert one_line(code, err, want=1) and "internal error: ZeroDivisionError" in err
    trace = err.split("full trace in ")[1].rstrip(")\n")
    assert "ZeroDivisionError" in Path(trace).read_text()


def test_report_survives_a_damaged_row_and_a_foreign_weights_file(run_cli, tmp_path):
    import sqlite3

    store = tmp_path / "s.db"
    code, _, err = run_cli(*TINY_COMPARE, "--no-report", "--store", store)
    assert code == 0, err
    with sqlite3.connect(store) as db:
        rid, result = db.execute("select id, result from runs where status='finished' limit 1").fetchone()
        damaged = {k: v for k, v in json.loads(result).items() if k != "final_val_loss"}
        db.execute("update runs set result=? where id=?", (json.dumps(damaged), rid))
    for weights in (tmp_path / "weights").glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    code, out, err = run_cli("report", "--store", store)
    assert code == 0, err
    page = (tmp_path / "report" / "report.html").read_text()
    assert "attention maps skipped: cannot read" in page and "Not finished" in page


@pytest.mark.parametrize(
    "argv,needle",
    [
        ([*TINY_TRAIN, "--max-seconds", "nan"], "max_seconds must be a finite number"),
        ([*TINY_TRAIN, "--lr", "inf"], "lr must be a finite number"),
        ([*TINY_COMPARE, "--address", "ray://x:1"], "--address ray://x:1 is for --backend ray"),
    ],
)
def test_values_that_used_to_pass_silently(run_cli, tmp_path, argv, needle):
    code, _, err = run_cli(
        *argv,
        "--checkpoint-dir" if argv[0] == "train" else "--store",
        tmp_path / ("ck" if argv[0] == "train" else "s.db"),
    )
    assert one_line(code, err) and needle in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_number_where_text_belongs_is_named(run_cli, tmp_path):
    rows = tmp_path / "d.jsonl"
    rows.write_text("\n".join(json.dumps({"text": i, "label": i % 2}) for i in range(40)))
    code, _, err = run_cli(*TINY_TRAIN, "--data", rows)
    assert one_line(code, err) and "field 'text' is int" in err and "--text-field" in err


def test_a_line_break_in_a_path_stays_in_its_markdown_cell():
    from ffnlab.study.render import md_table
    from ffnlab.study.table import Table

    table = md_table(Table(["setting", "value"], [["store", "runs/a\nb|c.db"]]))
    assert table.splitlines()[-1] == "| store | runs/a b\\|c.db |"


def test_damaged_store_contents_name_the_store(tmp_path):
    import sqlite3

    from ffnlab.study.store import Store

    path = tmp_path / "s.db"
    with Store(path) as s:
        s.claim("r1", {"x": 1})
    with sqlite3.connect(path) as db:
        db.execute("update runs set result='{not json' where id='r1'")
    with (
        Store(path, create=False) as s,
        pytest.raises(ValueError, match=f"run store {path}: run r1's result is not JSON"),
    ):
        s.runs()
    with sqlite3.connect(path) as db:
        db.execute("update meta set value='abc' where key='schema_version'")
    with Store(path, create=False) as s, pytest.raises(ValueError, match=f"run store {path} has a damaged schema"):
        s.runs()


# ---- the CLI's promise, for every numeric and choice flag -------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROMISED = ("train", "compare", "export", "report", "advise", "deploy")
# one fp32 eager call of a one-layer model: a bad value wrongly accepted fails fast
TINY_DEPLOY = ["--ffn", "gelu", "--n-layers", 1, "--n-heads", 2, "--d-model", 32, "--context", 16, "--repeats", 1,
               "--warmup", 0, "--precisions", "fp32", "--runtimes", "eager", "--no-roofline"]  # fmt: skip
FLOAT_TYPES = ("float", "positive_float", "float_list")
INT_TYPES = ("int", "positive_int", "int_list", "jobs_arg")


def flags_of(command: str) -> list[tuple[str, object]]:
    """(flag, how it is checked) for each numeric or choice flag of a command, read off the parser."""
    from ffnlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    out = []
    for action in sub._actions:
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag is None or action.nargs == 0:
            continue
        kind = getattr(action.type, "__name__", None)
        if action.choices is not None:
            out.append((flag, tuple(action.choices)))
        elif kind in FLOAT_TYPES + INT_TYPES:
            out.append((flag, kind))
    return out


def bad_values(how) -> st.SearchStrategy[str]:
    """Values a flag must refuse: outside its choices, not a number, or out of range for its kind."""
    if isinstance(how, tuple):
        return st.text(min_size=1, max_size=12).filter(lambda t: t not in how and not t.startswith("-"))
    words = st.sampled_from(["abc", "1x", "", "--", "one", "1;2"])
    if how == "int":
        return st.one_of(words, st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)).map(str))
    if how in ("positive_int", "int_list", "jobs_arg"):
        return st.one_of(words, st.integers(max_value=0).map(str), st.just("1.5"))
    return st.one_of(words, st.sampled_from(["nan", "inf", "-inf"]), st.floats(max_value=-1e-6).map(str))


CASES = [
    (command, flag, how)
    for command in PROMISED
    for flag, how in flags_of(command)
    if not (command == "report" and flag == "--layer")
]  # any int is a layer; the range needs a store


def test_the_flag_table_is_read_off_the_parser():
    flags = {(c, f) for c, f, _ in CASES}
    assert {
        ("train", "--lr"),
        ("train", "--init"),
        ("compare", "--jobs"),
        ("compare", "--lr-axis"),
        ("export", "--opset"),
        ("advise", "--deploy"),
        ("compare", "--seeds"),
    } <= flags


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_bad_flag_value_is_one_line_exit_2_and_writes_nothing(capsys, data):
    import tempfile

    from ffnlab.cli import main

    command, flag, how = data.draw(st.sampled_from(CASES))
    value = data.draw(bad_values(how))
    with tempfile.TemporaryDirectory() as folder:
        # tiny sizes first (the flag under test comes last and wins): a value wrongly accepted fails fast
        where = {
            "train": ["--checkpoint-dir", f"{folder}/ck", "--out", f"{folder}/r.json", *TINY_TRAIN[1:]],
            "compare": ["--store", f"{folder}/s.db", *TINY_COMPARE[1:]],
            "export": ["--ffn", "gelu", "--d-model", "8", "--out", f"{folder}/x.onnx"],
            "report": ["--store", f"{folder}/s.db"],
            "advise": [],
            "deploy": [*TINY_DEPLOY, "--out", f"{folder}/d.json"],
        }[command]
        cwd = os.getcwd()
        os.chdir(folder)  # anything written relative to the cwd shows up here
        try:
            code = main([command, *map(str, where), f"{flag}={value}"])
        finally:
            os.chdir(cwd)
        err = capsys.readouterr().err
        assert code == 2, (command, flag, value, err)
        assert err.count("\n") == 1 and err.startswith("ffnlab: error: ") and "Traceback" not in err, err
        assert os.listdir(folder) == [], (command, flag, value)


def test_compare_help_names_the_default_study():
    from ffnlab.cli import build_parser
    from ffnlab.study.plan import DEFAULT_SEEDS, DEFAULT_VARIANTS

    compare = next(a for a in build_parser()._actions if a.dest == "command").choices["compare"]
    helps = {a.dest: a.help for a in compare._actions}
    assert f"(default: {','.join(DEFAULT_VARIANTS)})" in helps["variants"]
    assert f"(default: {DEFAULT_SEEDS})" in helps["seeds"] and "standard (default)" in helps["preset"]


NEW_ACTIVATIONS = ["quantile", "energy_gated", "split_gelu_tanh", "exponential"]  # issue #27 item 6


def test_the_attention_articles_activations_go_through_list_numerics_and_compare(run_cli, tmp_path):
    code, out, err = run_cli("list", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out) if r["kind"] == "activation"}
    assert all(rows[name]["experimental"] for name in NEW_ACTIVATIONS)  # no paper defines them exactly
    code, out, err = run_cli("numerics", ",".join(NEW_ACTIVATIONS), "--dtypes", "bf16", "--points", 201, "--no-claims",
                             "--json")  # fmt: skip
    assert code == 0, err
    measured = json.loads(out)["results"]
    assert {(r["name"], r["pass"]) for r in measured} == {
        (n, p) for n in NEW_ACTIVATIONS for p in ("forward", "backward")
    }
    code, out, err = run_cli("compare", "--variants", ",".join(NEW_ACTIVATIONS), "--seeds", 1, "--no-stats", *TINY_MODEL,
                             "--steps", 2, "--eval-every", 2, "--eval-batches", 1, "--final-eval-batches", 1, "--jobs", 1,
                             "--store", tmp_path / "s.db", "--no-report", "--json")  # fmt: skip
    assert code == 0, err
    ranked = json.loads(out)["variants"]
    assert sorted(r["ffn"] for r in ranked) == sorted(NEW_ACTIVATIONS)
    assert all(r["n_seeds"] == 1 and r["diverged"] == 0 and r["mean"] > 0 for r in ranked)
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4] and [r["mean"] for r in ranked] == sorted(
        r["mean"] for r in ranked
    )


def no_tag(root):
    from tests.test_tagging import write_conll

    write_conll(root, sizes=(20, 4, 4))
    with open(root / "train.txt", "a", encoding="utf-8") as f:
        f.write("\nOops\n")  # a word and no tag
    return ["--task", "tokens", "--data", root]


def one_text_field(root):
    from tests.test_pairs import pair_rows, write_csv

    root.mkdir()
    rows = [{"premise": r["premise"], "label": r["label"]} for r in pair_rows(40)]
    return ["--task", "cls", "--data", write_csv(root / "nli.csv", rows, ("premise", "label")), "--text-field",
            "premise,hypothesis"]  # fmt: skip


def one_class(root):
    from tests.test_images import write_folder

    return ["--task", "image", "--data", write_folder(root, classes=("cat",))]


def not_an_image(root):
    from tests.test_images import write_folder

    write_folder(root)
    (root / "dog" / "001.png").write_bytes(b"not a png")
    return ["--task", "image", "--data", root]


def truncated_image(root):
    from tests.test_images import write_folder

    write_folder(root, sizes=[(16, 16)] * 4)
    png = (root / "cat" / "002.png").read_bytes()
    (root / "cat" / "002.png").write_bytes(png[: len(png) // 2])  # cut inside its pixel data
    return ["--task", "image", "--data", root]


@pytest.mark.parametrize(
    "make, message",
    [
        (no_tag, r"train.txt line \d+: 'Oops' has a word but no tag"),
        (one_text_field, r"nli.csv row 1 has no column 'hypothesis'; columns: premise, label"),
        (one_class, r"has one class folder with images \('cat'\); task image needs at least two classes"),
        (not_an_image, r"dog/001.png is not a readable image \(cannot identify image file"),
        (truncated_image, r"cat/002.png is not a readable image \("),
    ],
)
def test_bad_task_data_is_one_line_exit_2_before_compare_writes_anything(run_cli, tmp_path, make, message):
    import re

    data = make(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    code, printed, err = run_cli("compare", "--variants", "relu,gelu", "--seeds", 2, *TINY_MODEL, "--steps", 2, *data,
                                 "--store", out / "s.db", "--csv", out / "t.csv")  # fmt: skip
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err and printed == "", err
    assert re.search(message, err), err
    assert list(out.iterdir()) == []  # no store, table, report, checkpoints or weights


def test_a_path_too_long_for_the_file_system_is_a_user_error(tmp_path, capsys):
    """--store under a 300-character folder name ended 'internal error: OSError: [Errno 36] File name too long', exit 1."""
    from ffnlab.cli import main

    store = tmp_path / ("x" * 300) / "s.db"
    code = main(["compare", "--preset", "smoke", "--variants", "gelu,relu", "--seeds", "2", "--no-stats",
                 "--store", str(store)])  # fmt: skip
    err = capsys.readouterr().err
    assert (
        code == 2 and err.startswith("ffnlab: error: file name too long: ") and err.endswith("; use a shorter path\n")
    )
    assert len(err.splitlines()) == 1 and "characters)" in err  # the path shortened, on one line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["compare", "--seed", "-1"], "ffnlab compare has no flag --seed (did you mean '--seeds'?)"),
        (["train", "--step=5"], "ffnlab train has no flag --step (did you mean '--steps'?)"),
        (["list", "--variant", "gelu"], "ffnlab list has no flag --variant"),
    ],
)
def test_only_whole_flag_names_are_read(run_cli, argv, needle):
    """argparse's prefix matching read `--seed -1` as `--seeds -1`, a study of -1 seeds."""
    code, out, err = run_cli(*argv)
    assert one_line(code, err) and needle in err and out == ""
