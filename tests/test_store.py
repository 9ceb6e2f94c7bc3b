import importlib.metadata
import math
import os
import pathlib
import pickle
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ffnlab._util import machine
from ffnlab.run.result import History
from ffnlab.study.records import RunStatus
from ffnlab.study.store import SCHEMA_VERSION, Store, environment
from tests.conftest import run_result

NAN, INF = float("nan"), float("inf")
ROOT = pathlib.Path(__file__).resolve().parents[1]

# A writer process: waits for the go file, then claims, starts, logs and finishes runs, printing each
# id only after its finish has committed.
WRITER = """
import os, sys, time
from ffnlab.study.store import Store
from tests.conftest import run_result
path, prefix, n, go, n_metrics = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
while not os.path.exists(go):
    time.sleep(0.005)
store = Store(path)
for i in range(n):
    run_id = f"{prefix}-{i}"
    store.claim(run_id, {"prefix": prefix, "i": i}, sweep=prefix)
    store.start(run_id)
    store.add_metrics(run_id, [(step, "loss", 1.0 / (step + 1)) for step in range(n_metrics)])
    store.add_events(run_id, [{"step": 3, "kind": "spike", "ratio": 4.0}])
    store.finish(run_id, run_result(final_val_loss=i / 1000, ffn=prefix))
    print(run_id, flush=True)
    time.sleep(0.002)  # "training": without a gap, SQLite's sleeping busy handler lets one writer hog the lock
"""


def writer(path, prefix, n, go, n_metrics=10):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), prefix, str(n), str(go), str(n_metrics)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def raw(path, sql):
    conn = sqlite3.connect(path)
    try:
        with conn:  # commits
            return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "runs" / "ffnlab.db") as s:
        yield s


def test_schema_created_lazily_in_a_new_directory(tmp_path):
    path = tmp_path / "dir" / "ffnlab.db"
    s = Store(path)
    assert s.path == path and not path.parent.exists()  # nothing written before the first use
    s.claim("a", {})
    s.close()
    tables = {name for (name,) in raw(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"meta", "runs", "metrics", "events"} <= tables
    assert raw(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    assert raw(path, "PRAGMA journal_mode") == [("wal",)]


def test_a_store_whose_folder_has_no_parent_is_refused(tmp_path):
    """The store's own folder is made (ffnlab-runs/ of the default path), as mkdir makes one; a path whose folder's
    parent is missing is a typo, refused in one line before anything is made (folders were made from / down)."""
    path = tmp_path / "missing" / "dir" / "s.db"
    with pytest.raises(ValueError, match=f"there is no folder {tmp_path / 'missing'}; create it first"):
        Store(path)
    assert os.listdir(tmp_path) == []
    file = tmp_path / "file"
    file.touch()
    with pytest.raises(ValueError, match="there is no folder"):
        Store(file / "dir" / "s.db")


def test_open_missing_or_foreign_file(tmp_path):
    missing = tmp_path / "nope.db"
    with pytest.raises(ValueError, match="no run store at"):
        Store(missing, create=False)
    assert not missing.exists()
    other = tmp_path / "other.db"
    raw(other, "CREATE TABLE t (x)")
    with pytest.raises(ValueError, match="not an ffnlab run store"):
        Store(other, create=False).runs()
    assert raw(other, "PRAGMA journal_mode") == [("delete",)]  # left untouched
    with pytest.raises(ValueError, match="not an ffnlab run store .no meta table; its tables: t"):
        Store(other).claim("a", {})  # a sweep's store: it used to add its tables to the foreign database
    assert raw(other, "SELECT name FROM sqlite_master WHERE type = 'table'") == [("t",)]
    empty = tmp_path / "empty.db"
    empty.touch()
    with Store(empty) as s:  # an empty file is an empty SQLite database: a new store
        s.claim("a", {})
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ValueError, match="cannot open run store"):
        Store(garbage).runs()


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.db"
    with Store(path) as s:
        s.claim("a", {})
    raw(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ValueError, match="schema version 99"):
        Store(path, create=False).get("a")


def test_lifecycle_claim_start_finish(store):
    config = {"ffn": "swiglu", "seed": 0, "lr": 3e-4}
    assert store.claim("r1", config, sweep="s1") == "pending"
    assert store.claim("r1", {"something": "else"}) == "pending"  # an existing run is left as it is
    run = store.get("r1")
    assert run.config == config and run.sweep == "s1" and run.attempts == 0 and run.started_at is None
    assert run.status is RunStatus.PENDING and run.result is None and not run.done
    store.start("r1")
    run = store.get("r1")
    assert run.status is RunStatus.RUNNING and run.attempts == 1 and run.started_at >= run.created_at
    assert run.env["python"] and "torch" in run.env and "git_rev" in run.env
    result = run_result(
        final_val_loss=3.21, history={"val": [{"step": 1, "loss": 3.3}]}, events=[{"step": 1, "kind": "loss_spike"}]
    )
    store.finish("r1", result)
    run = store.get("r1")
    assert run.status is RunStatus.FINISHED and run.done and run.finished_at >= run.started_at
    # the result comes back whole, but for the curves and events, which live in tables of their own
    assert run.result == replace(result, history=History(), events=())
    assert store.get("missing") is None


def test_finished_run_is_never_overwritten(store):
    store.claim("r1", {"a": 1})
    store.start("r1")
    store.finish("r1", run_result(final_val_loss=1.0))
    before = store.get("r1")
    assert store.claim("r1", {"a": 2}) == "finished"
    store.start("r1")
    store.fail("r1", "late duplicate")
    assert store.get("r1") == before


def test_diverged_or_failed_run_can_be_started_again(store):
    store.claim("r1", {})
    store.start("r1")
    store.finish("r1", run_result(status="diverged", final_val_loss=None, diverged_step=3))
    assert store.get("r1").result.diverged_step == 3
    store.start("r1")
    run = store.get("r1")
    assert run.status == "running" and run.attempts == 2 and run.finished_at is None and run.result is None
    store.fail("r1", "ValueError: boom")
    assert store.get("r1").error == "ValueError: boom" and store.get("r1").result is None
    store.start("r1")
    assert store.get("r1").status is RunStatus.RUNNING


def test_bad_arguments_raise_value_error(store):
    with pytest.raises(ValueError, match="claim it first"):
        store.start("ghost")
    with pytest.raises(ValueError, match="claim it first"):
        store.add_metrics("ghost", [(0, "loss", 1.0)])
    store.claim("r1", {})
    with pytest.raises(ValueError, match="ends finished, diverged or failed"):
        store._end("r1", RunStatus.RUNNING, {}, None)
    with pytest.raises(ValueError, match="valid: pending, running"):
        store.runs(status="done")
    with pytest.raises(ValueError, match="'step' and 'kind'"):
        store.add_events("r1", [{"step": 1}])
    assert store.get("r1").status == "pending"


def test_runs_filters_and_order(store):
    for run_id, sweep in [("b", "s1"), ("a", "s1"), ("c", "s2")]:
        store.claim(run_id, {"id": run_id}, sweep=sweep)
    store.fail("c", "boom")
    assert [r.id for r in store.runs()] == ["b", "a", "c"]  # created_at order, not id order
    assert [r.id for r in store.runs(sweep="s1")] == ["b", "a"]
    assert [r.id for r in store.runs(status="failed")] == ["c"] == [r.id for r in store.runs(RunStatus.FAILED)]
    assert store.runs(status="failed", sweep="s1") == []
    raw(store.path, "UPDATE runs SET created_at = 0")  # equal timestamps fall back to id order
    assert [r.id for r in store.runs()] == ["a", "b", "c"]


def test_studies_are_records_most_recently_run_first(store):
    store.add_study("s1", {"seeds": 3})
    store.add_study("s2", {"seeds": 2})
    raw(store.path, "UPDATE studies SET created_at = 1, run_at = 1")
    store.add_study("s1", {"seeds": 3})  # run again: only its run_at moves
    first, second = store.studies()
    assert (first.id, first.study, first.created_at, second.id, second.run_at) == ("s1", {"seeds": 3}, 1, "s2", 1)
    assert first.run_at > 1


def test_metrics_and_events_are_idempotent(store):
    store.claim("r1", {})
    rows = [(2, "loss", 2.5), (0, "loss", 3.0), (1, "loss", 2.8), (0, "lr", 1e-4)]
    store.add_metrics("r1", rows)
    store.add_metrics("r1", rows[:2])  # a resumed run re-logs steps it had logged
    assert store.metrics("r1") == [(0, "loss", 3.0), (0, "lr", 1e-4), (1, "loss", 2.8), (2, "loss", 2.5)]
    store.add_metrics("r1", [(2, "loss", 2.4)])
    assert store.metrics("r1", "loss") == [(0, "loss", 3.0), (1, "loss", 2.8), (2, "loss", 2.4)]
    events = [{"step": 5, "kind": "spike", "ratio": 6.0}, {"step": 2, "kind": "clip", "norm": 9.5}]
    store.add_events("r1", events)
    store.add_events("r1", events)
    assert store.events("r1") == [events[1], events[0]]
    store.add_events("r1", [{"step": 5, "kind": "spike", "ratio": 7.0}])
    assert store.events("r1")[1]["ratio"] == 7.0 and len(store.events("r1")) == 2


def test_nan_and_inf_round_trip(store):
    store.claim("r1", {"x": NAN, "y": [INF, -INF]})
    store.add_metrics("r1", [(0, "loss", NAN), (1, "loss", INF), (2, "loss", -INF)])
    store.add_events("r1", [{"step": 1, "kind": "nan", "value": NAN}])
    store.finish("r1", run_result(status="diverged", final_val_loss=NAN, max_grad_norm=INF))
    run = store.get("r1")
    assert math.isnan(run.config["x"]) and run.config["y"] == [INF, -INF]
    assert math.isnan(run.result.val.loss) and run.result.monitors.max_grad_norm == INF
    values = [v for _, _, v in store.metrics("r1")]
    assert math.isnan(values[0]) and values[1:] == [INF, -INF]
    assert math.isnan(store.events("r1")[0]["value"])


def test_snapshot_compares_stores_regardless_of_order_and_time(tmp_path):
    def fill(path, order, wall):
        with Store(path) as s:
            for run_id in order:
                s.claim(run_id, {"id": run_id, "nan": NAN}, sweep="sw")
                s.start(run_id)
                s.add_metrics(run_id, [(0, "loss", 1.0), (0, "tokens_per_s", wall)])
                s.finish(run_id, run_result(final_val_loss=NAN if run_id == "b" else 0.5, wall_seconds=wall))
            return s.snapshot(ignore=("wall_seconds", "tokens_per_s")), s.snapshot()

    (a, a_full), (b, b_full) = fill(tmp_path / "a.db", ["a", "b"], 1.0), fill(tmp_path / "b.db", ["b", "a"], 2.0)
    assert a == b and a_full != b_full
    assert a["runs"]["b"]["result"]["final_val_loss"] == "nan" and "wall_seconds" not in a["runs"]["b"]["result"]
    with Store(tmp_path / "b.db") as s:
        s.add_metrics("a", [(1, "loss", 0.9)])
        assert s.snapshot(ignore=("wall_seconds", "tokens_per_s")) != a


def test_environment_and_git_revision(tmp_path, monkeypatch):
    machine._environment.cache_clear()
    try:
        env = environment()
        root = Path(machine.__file__).resolve().parents[2]
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root)
        assert env["git_rev"] == (head.stdout.strip() if head.returncode == 0 else None)
        assert env["python"] == sys.version.split()[0] and env["device"] in ("cpu", "cuda")
        assert env["ffnlab"] == importlib.metadata.version("ffnlab")
        env["torch"] = "mutated"
        assert environment()["torch"] != "mutated"  # callers get a copy of the cached value
    finally:
        machine._environment.cache_clear()


def test_environment_never_runs_git_in_the_working_directory(tmp_path, monkeypatch):
    """A repository in the cwd whose core.fsmonitor runs a command: recording the environment must
    neither run it nor record that repository's commit."""
    repo, pwned = tmp_path / "g", tmp_path / "pwned"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, capture_output=True, check=True)
    git("init", "-q")
    (repo / "f").write_text("x")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "i")
    git("config", "core.fsmonitor", f"touch {pwned}; false")
    theirs = subprocess.run(
        ["git", "-c", "core.fsmonitor=", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.chdir(repo)
    machine._environment.cache_clear()
    try:
        env = environment()
    finally:
        machine._environment.cache_clear()
    assert not pwned.exists()
    assert env["git_rev"] != theirs


def test_store_pickles_and_threads_share_it(store):
    copy = pickle.loads(pickle.dumps(store))
    copy.claim("from-copy", {})
    assert store.get("from-copy").status == "pending"

    def work(k):
        for i in range(25):
            store.claim(f"t{k}-{i}", {"k": k})
            store.add_metrics(f"t{k}-{i}", [(0, "loss", float(i))])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(store.runs()) == 101 and store.integrity_check() == "ok"


@pytest.mark.slow
def test_two_processes_write_one_new_store(tmp_path):
    path, go = tmp_path / "shared" / "ffnlab.db", tmp_path / "go"
    procs = [writer(path, prefix, 200, go) for prefix in ("p", "q")]
    time.sleep(0.2)
    go.touch()  # both open the (not yet existing) store and write at the same time
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    with Store(path, create=False) as s:
        assert s.integrity_check() == "ok"
        runs = s.runs(status="finished")
        assert len(runs) == 400 and {r.id for r in runs} == {f"{x}-{i}" for x in "pq" for i in range(200)}
        assert all(len(s.metrics(r.id)) == 10 and r.result.ffn == r.sweep for r in runs)
        assert sum(len(s.events(r.id)) for r in runs) == 400
        # the two writers really interleaved: neither finished all of its runs before the other began
        span = {
            x: [
                min(r.finished_at for r in runs if r.sweep == x),
                max(r.finished_at for r in runs if r.sweep == x),
            ]
            for x in "pq"
        }
        assert span["p"][0] < span["q"][1] and span["q"][0] < span["p"][1]


def test_sigkill_mid_write_loses_no_committed_run(tmp_path):
    path, go = tmp_path / "ffnlab.db", tmp_path / "go"
    go.touch()
    proc = writer(path, "k", 100_000, go, n_metrics=400)  # big batches: the kill likely lands inside one
    done = [proc.stdout.readline() for _ in range(25)]
    time.sleep(0.037)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    reported = [line.strip() for line in done + rest.splitlines(keepends=True) if line.endswith("\n")]
    assert len(reported) >= 25
    with Store(path, create=False) as s:
        assert s.integrity_check() == "ok"
        for run_id in reported:
            run = s.get(run_id)
            assert run.status == "finished" and run.result == run_result(final_val_loss=int(run_id[2:]) / 1000, ffn="k")
            assert len(s.metrics(run_id)) == 400
        assert len(s.runs(status="finished")) in (len(reported), len(reported) + 1)  # killed before the print
        assert {len(s.metrics(r.id)) for r in s.runs()} <= {0, 400}  # a batch is all there or not at all


def test_a_store_path_that_is_not_a_regular_file_is_refused(tmp_path):
    existed = Path("/dev/null-journal").exists()
    for path in ("/dev/null", tmp_path):
        with pytest.raises(ValueError, match="is not a regular file"):
            Store(path)
    assert Path("/dev/null-journal").exists() == existed


@pytest.mark.parametrize(
    "column, text, problem",
    [
        ("runs.result", '{"learned": "oops"}', "run r1's result: 'learned' is a string, not an object"),
        ("runs.result", '{"final_val_loss": [1]}', "run r1's result: 'final_val_loss' is an array, not a number"),
        ("runs.result", '{"peak_mem_bytes": 1}', "run r1: its result has keys a run result does not: peak_mem_bytes"),
        ("runs.config", "[1, 2, 3]", "run r1's config is an array, not an object"),
        ("studies.study", "[1, 2, 3]", "study s1's record is an array, not an object"),
        ("studies.study", '{"seeds": "3"}', "study s1's record: 'seeds' is a string, not a number"),
        ("events.detail", "{not json", "run r1's event detail is not JSON"),
        ("events.detail", "null", "run r1's event detail is null, not an object"),
        # SQLite keeps text or bytes in a numeric column: a TypeError inside the report's curves
        ("metrics.value", "fast", "run r1's metric val_loss at step 5 is text 'fast', not a number"),
        ("metrics.value", b"\x00", "run r1's metric val_loss at step 5 is bytes b'\\x00', not a number"),
        ("metrics.step", "five", "run r1's metric val_loss (its step) is text 'five', not an integer"),
        ("events.step", "1.5x", "run r1's event spike (its step) is text '1.5x', not an integer"),
        ("runs.attempts", "many", "run r1's attempts is text 'many', not an integer"),
        ("runs.finished_at", "soon", "run r1's finished_at is text 'soon', not a number"),
    ],
)
def test_records_edited_into_another_shape_name_the_store(store, column, text, problem):
    """A JSON column of the wrong shape, or a numeric column holding text, is refused where it is read, naming
    the store, instead of failing later inside a summary (a string where a dict is iterated was an internal
    error, and so was text in metrics.value)."""
    store.claim("r1", {"x": 1})
    store.finish("r1", run_result(final_val_loss=1.0))
    store.add_metrics("r1", [(5, "val_loss", 2.0)])
    store.add_events("r1", [{"step": 1, "kind": "spike", "ratio": 5.0}])
    store.add_study("s1", {"seeds": 3})
    table, name = column.split(".")
    with sqlite3.connect(store.path) as db:
        db.execute(f"UPDATE {table} SET {name} = ?", (text,))
    read = {
        "runs": store.runs,
        "studies": store.studies,
        "events": lambda: store.events("r1"),
        "metrics": lambda: store.metrics("r1"),
    }[table]
    with pytest.raises(ValueError) as error:
        read()
    message = str(error.value)
    assert message.startswith(f"run store {store.path}: {problem}")
    assert message.endswith("; the store was edited or damaged")


# ---- read-only stores: the report and advise read a store they cannot write ------------------------


def cannot_open_read_only(monkeypatch):
    """mode=ro fails as on a read-only file system or folder, where SQLite cannot create the WAL's -shm file
    beside the store (SQLITE_CANTOPEN): a real error of SQLite's, from a path that cannot be opened. NOTE: tests
    may run as root, whom chmod does not stop."""
    from ffnlab.study import store as store_module

    real = store_module._opened
    tried = []

    def opened(uri):
        mode = uri.rpartition("?")[2]
        tried.append(mode)
        return real(f"file:/nonexistent/s.db?{mode}" if mode in ("mode=rw", "mode=ro") else uri)

    monkeypatch.setattr(store_module, "_opened", opened)
    return tried


def test_a_store_read_only_never_writes_and_leaves_no_files(tmp_path):
    path = tmp_path / "s.db"
    with Store(path) as s:
        s.claim("a", {"x": 1})
        s.add_metrics("a", [(1, "loss", 2.0)])
    before = path.read_bytes()
    with Store(path, read_only=True) as s:
        assert [r.id for r in s.runs()] == ["a"] and s.metrics("a") == [(1, "loss", 2.0)] and s.studies() == []
        with pytest.raises(sqlite3.OperationalError, match="readonly"):  # the connection itself cannot write
            s._connect().execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")
        with pytest.raises(RuntimeError, match="opened read-only"):
            s.claim("b", {})
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["s.db"]  # no -wal or -shm file left
    with pytest.raises(ValueError, match="no run store at"):
        Store(tmp_path / "missing.db", read_only=True)


def test_a_store_that_sqlite_cannot_open_beside_is_read_as_immutable(tmp_path, monkeypatch):
    path = tmp_path / "s.db"
    with Store(path) as s:
        s.claim("a", {"x": 1})
    tried = cannot_open_read_only(monkeypatch)
    with Store(path, read_only=True) as s:
        assert [r.id for r in s.runs()] == ["a"]
    assert tried == ["mode=rw", "mode=ro", "immutable=1"]
    # immutable reads the file alone: a -wal file holding changes would be missed, so it is refused
    (tmp_path / "s.db-wal").write_bytes(b"changes")
    with pytest.raises(ValueError, match="its write-ahead log s.db-wal holds changes.*copy the store's folder"):
        Store(path, read_only=True).runs()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only files and folders")
def test_a_store_in_a_read_only_file_and_folder_can_be_read(tmp_path):
    folder = tmp_path / "runs"
    with Store(folder / "s.db") as s:
        s.claim("a", {"x": 1})
    (folder / "s.db").chmod(0o444)
    folder.chmod(0o555)
    try:
        with Store(folder / "s.db", read_only=True) as s:
            assert [r.id for r in s.runs()] == ["a"]
    finally:
        folder.chmod(0o755)


def test_an_older_store_without_the_studies_table_reads_it_as_empty(tmp_path):
    path = tmp_path / "s.db"
    with Store(path) as s:
        s.claim("a", {"x": 1})
    raw(path, "DROP TABLE studies")
    with Store(path, read_only=True) as s:
        assert s.studies() == [] and [r.id for r in s.runs()] == ["a"]


def test_a_full_disk_is_no_space_left_naming_the_store(tmp_path):
    """SQLite says "database or disk is full" (SQLITE_FULL), or "disk I/O error" where growing its -shm file
    fails on a full file system: the user reads "no space left on device writing <store>"."""
    from ffnlab.cli import user_error

    path = tmp_path / "s.db"
    with Store(path) as s:
        s.claim("a", {})
        pages = s._connect().execute("PRAGMA page_count").fetchone()[0]
        s._connect().execute(f"PRAGMA max_page_count = {pages}")  # SQLite's SQLITE_FULL, without filling a disk
        with pytest.raises(OSError) as error:
            s.claim("b", {"text": "x" * 100_000})
    assert user_error(error.value) == f"no space left on device writing {path}"
    io_error = sqlite3.OperationalError("disk I/O error")
    io_error.sqlite_errorcode = sqlite3.SQLITE_IOERR_SHMSIZE
    store = Store(path)
    assert store._disk_full(io_error) is None  # this disk has room: another I/O error stays SQLite's
    store.path = Path("/proc/s.db")  # a file system with no block free
    assert user_error(store._disk_full(io_error)) == "no space left on device writing /proc/s.db"


def test_release_puts_a_running_run_back_to_pending_and_leaves_others(tmp_path):
    with Store(tmp_path / "s.db") as s:
        for rid in ("a", "b", "c"):
            s.claim(rid, {"seed": rid})
        s.start("a")
        s.start("b")
        s.finish("b", run_result())
        for rid in ("a", "b", "c"):
            s.release(rid)
        assert [s.get(rid).status for rid in ("a", "b", "c")] == ["pending", "finished", "pending"]
        assert s.get("a").attempts == 1  # the start is still counted
