"""Run store: one embedded SQLite file holding every run's config, status, metrics, events and environment.

    runs     id (the caller's hash of the config), sweep, config, status, result, env, attempts, timestamps
    metrics  (run_id, step, name) -> value          the loss/lr/grad-norm series
    events   (run_id, step, kind) -> detail         stability events (spikes, NaN, clipping, ...)
    studies  id (hash of the study), study, timestamps   what was compared, so a report rebuilds exactly it
    meta     schema_version

A run moves pending -> running -> finished | diverged | failed, or back to pending when its sweep is stopped
(`release`). A finished run is never overwritten: claim, start and finish leave it as it is, so a resumed sweep
cannot clobber a result. Diverged and failed runs may be started again (attempts counts the starts).

Durability: WAL journal, every write one BEGIN IMMEDIATE transaction, synchronous=FULL. WAL alone
already makes a kill -9 harmless (a commit is in the WAL file before COMMIT returns; a half-written
transaction is never seen). FULL also fsyncs the WAL at each commit, so a committed finished run
survives a power cut or OS crash as well; at about a millisecond per commit and a handful of commits
per training run, that cost is invisible next to the minutes of compute a lost result would waste.
Several processes may write at once: SQLite serialises writers, and busy_timeout makes them wait
instead of failing. Readers (the report, advise) open the file read-only (`Store(read_only=True)`), so a
store on a read-only file system, or a read-only or immutable file, can be read.

JSON columns are json.dumps(sort_keys=True) text. NOTE: NaN and +-inf are written as the bare tokens
NaN/Infinity/-Infinity (allow_nan), which Python's json reads back as floats but SQLite's json1
functions reject. Metric values are REAL, and SQLite stores NaN as NULL; we read NULL back as NaN.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import pathlib
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

from ffnlab._util.jsonio import field_problem, json_kind, json_safe
from ffnlab._util.machine import environment
from ffnlab._util.text import shorten
from ffnlab.run.result import RunResult, result_problem
from ffnlab.study.plan import Study
from ffnlab.study.records import RunRecord, RunStatus

SCHEMA_VERSION = 1
DEFAULT_PATH = pathlib.Path("ffnlab-runs") / "ffnlab.db"
STATUSES = tuple(str(s) for s in RunStatus)
BUSY_TIMEOUT_S = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    sweep TEXT,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    env TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS runs_sweep ON runs (sweep, created_at);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step INTEGER NOT NULL,
    name TEXT NOT NULL,
    value REAL,  -- NULL is NaN: SQLite cannot store NaN in a REAL
    PRIMARY KEY (run_id, step, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS studies (
    id TEXT PRIMARY KEY,
    study TEXT NOT NULL,
    created_at REAL NOT NULL,
    run_at REAL NOT NULL  -- the last time it was run (a rerun makes it the latest again)
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    step INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (run_id, step, kind)
) WITHOUT ROWID;
"""


def _json_default(obj: object) -> object:
    """Make numpy/torch scalars and arrays, paths and sets JSON-serialisable."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot store a {type(obj).__name__} as JSON")


def dumps(obj: object) -> str:
    """Canonical JSON text for a column: sorted keys, NaN/inf kept as NaN/Infinity tokens."""
    return json.dumps(obj, sort_keys=True, allow_nan=True, default=_json_default)


def loads(text: str | None) -> Any:
    """A column's JSON value (None for SQL NULL)."""
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class StudyRecord:
    """One recorded study (`Store.add_study`, `Store.studies`): what was compared, and when."""

    id: str  # the hash of the study (ffnlab.study.plan.study_id)
    study: dict[str, Any]  # the Study's JSON as stored (Study.to_dict); Study.from_dict builds it back
    created_at: float
    run_at: float  # the last time it was run


class Store:
    """The run store: one SQLite file, one connection per Store object (opened on first use)."""

    def __init__(
        self, path: str | os.PathLike[str] = DEFAULT_PATH, create: bool = True, read_only: bool = False
    ) -> None:
        self.path = pathlib.Path(path)
        self.create = create and not read_only
        self.read_only = read_only  # reads only, from a store that may not be writable (`_open_read_only`)
        if not self.create and not self.path.is_file():
            raise ValueError(f"no run store at {self.path}")
        if self.path.exists() and not self.path.is_file():  # a folder, /dev/null, a pipe: SQLite would write beside it
            raise ValueError(f"run store {self.path} is not a regular file; give a path ending in .db")
        folder = self.path.absolute().parent
        if self.create and not folder.is_dir() and not folder.parent.is_dir():
            # the store's own folder is made on first use (ffnlab-runs/), as mkdir makes one; not a path from /
            raise ValueError(
                f"cannot create run store {self.path}: there is no folder {folder.parent}; create it first"
            )
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()  # one transaction at a time on the shared connection

    # ---- connection and transactions ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # NOTE: a connection must not cross a fork; a child process opens its own and leaves the
        # parent's alone (closing it here could disturb the parent's locks).
        conn = self._open_read_only() if self.read_only else self._open()
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            # checked before anything is written, so a foreign file is left untouched: a new store
            # starts from an empty file, never inside another program's database
            tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            if "meta" not in tables and (tables or not self.create):
                raise ValueError(
                    f"{self.path} is not an ffnlab run store (no meta table"
                    + (f"; its tables: {', '.join(sorted(tables)[:5])}" if tables else "")
                    + "); give a new path or an ffnlab store"
                )
            if self.read_only:
                for statement in SCHEMA_TABLES:  # a table added since an older store was written reads as empty
                    if _table_name(statement) not in tables:
                        conn.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
                conn.execute("PRAGMA query_only = ON")  # no statement writes, on a connection that may be read-write
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                stored: Any = None if row is None else row[0]
            else:
                _set_wal(conn)
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute("PRAGMA foreign_keys = ON")
                with _transaction(conn):  # several processes may open a new store at once: create inside the lock
                    for statement in SCHEMA.split(";"):  # not executescript, which would COMMIT first
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(
                        "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                    stored = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
            try:
                version = int(stored)
            except (TypeError, ValueError):
                raise ValueError(
                    f"run store {self.path} has a damaged schema version ({stored!r}); it is not a store "
                    "this ffnlab wrote, or it was edited"
                ) from None
            if version > SCHEMA_VERSION:
                raise ValueError(
                    f"run store {self.path} has schema version {version}; this ffnlab reads up to "
                    f"{SCHEMA_VERSION}: upgrade ffnlab"
                )
        except sqlite3.DatabaseError as e:
            conn.close()
            raise self._disk_full(e) or ValueError(f"cannot open run store {self.path}: {e}") from None
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        """A read-write connection; the store's folder made if it is missing (its parent exists: `__init__`)."""
        self.path.parent.mkdir(exist_ok=True)
        return sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)

    def _open_read_only(self) -> sqlite3.Connection:
        """A connection for reading (`_connect` makes it query_only), opened as the file allows: read-write where
        it can be (its close then checkpoints and removes the WAL's -wal and -shm files, as a writer's does; a
        mode=ro connection leaves them beside the store); mode=ro where SQLite cannot open it so; immutable=1
        where even that fails (a read-only folder or file system, where SQLite cannot create the -shm file).
        Immutable reads the file alone, so a -wal file that holds changes is refused rather than missed."""
        uri = self.path.absolute().as_uri()
        try:
            for mode in ("mode=rw", "mode=ro"):
                try:
                    return _opened(f"{uri}?{mode}")
                except sqlite3.OperationalError as e:  # CANTOPEN on a read-only file system, READONLY_DIRECTORY
                    if e.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
                        raise
            wal = self.path.with_name(self.path.name + "-wal")
            if wal.is_file() and wal.stat().st_size > 0:
                raise ValueError(
                    f"cannot read run store {self.path}: its write-ahead log {wal.name} holds changes, which SQLite "
                    "reads only where it can create files beside it; copy the store's folder somewhere writable"
                )
            return _opened(f"{uri}?immutable=1")
        except sqlite3.DatabaseError as e:
            raise ValueError(f"cannot open run store {self.path}: {e}") from None

    def _disk_full(self, e: sqlite3.Error) -> OSError | None:
        """ENOSPC naming the store where SQLite's error is a full disk (`ffnlab: error: no space left on device
        writing ...`), not SQLite's "disk I/O error": SQLITE_FULL, or an I/O error (growing the WAL's -shm
        file) on a file system with no space left."""
        code = getattr(e, "sqlite_errorcode", 0) & 0xFF
        if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and _no_space(self.path.absolute().parent)):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        return None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction: takes the write lock up front so it never deadlocks midway."""
        if self.read_only:
            raise RuntimeError(f"run store {self.path} was opened read-only")
        with self._lock, self._errors():
            conn = self._connect()
            with _transaction(conn):
                yield conn

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._errors():
            return self._connect().execute(sql, args).fetchall()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's error for a full disk as `_disk_full`'s OSError; others as they are."""
        try:
            yield
        except sqlite3.Error as e:
            full = self._disk_full(e)
            if full is None:
                raise
            raise full from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[type[Self], tuple[pathlib.Path, bool, bool]]:
        """Picklable for multiprocessing and Ray: the copy is a new Store that opens its own connection."""
        return type(self), (self.path, self.create, self.read_only)

    def __repr__(self) -> str:
        return f"Store('{self.path}')"

    # ---- writes -------------------------------------------------------------------------------

    def claim(self, run_id: str, config: dict[str, Any], sweep: str | None = None) -> str:
        """Register a run as 'pending' unless it exists; return its current status. Never modifies an existing run."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO runs (id, sweep, config, status, created_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, sweep, dumps(config), "pending", time.time()),
            )
            status: str = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
            return status

    def start(self, run_id: str) -> None:
        """Mark a run 'running': started_at now, environment recorded, attempts + 1. No-op on a finished run."""
        env = dumps(environment())  # outside the transaction: it may run git
        with self._write() as conn:
            _require(conn, run_id)
            conn.execute(
                "UPDATE runs SET status = 'running', started_at = ?, finished_at = NULL, env = ?, "
                "attempts = attempts + 1 WHERE id = ? AND status != 'finished'",
                (time.time(), env, run_id),
            )

    def release(self, run_id: str) -> None:
        """Mark a 'running' run 'pending' again: its sweep was stopped (Ctrl-C, SIGTERM) before it ended, which is
        no failure; it resumes from its checkpoint. No-op on a run in any other state."""
        with self._write() as conn:
            conn.execute("UPDATE runs SET status = 'pending' WHERE id = ? AND status = 'running'", (run_id,))

    def add_metrics(self, run_id: str, rows: list[tuple[int, str, float]]) -> None:
        """Store (step, name, value) rows; a row already there for (run, step, name) is replaced."""
        stored = [(run_id, int(step), str(name), float(value)) for step, name, value in rows]
        with self._write() as conn:
            _require(conn, run_id)
            conn.executemany("INSERT OR REPLACE INTO metrics (run_id, step, name, value) VALUES (?, ?, ?, ?)", stored)

    def add_events(self, run_id: str, events: list[dict[str, Any]]) -> None:
        """Store events {"step", "kind", ...detail}; one already there for (run, step, kind) is replaced."""
        rows = []
        for event in events:
            if "step" not in event or "kind" not in event:
                raise ValueError(f"an event needs 'step' and 'kind', got keys {sorted(event)}")
            detail = {k: v for k, v in event.items() if k not in ("step", "kind")}
            rows.append((run_id, int(event["step"]), str(event["kind"]), dumps(detail)))
        with self._write() as conn:
            _require(conn, run_id)
            conn.executemany("INSERT OR REPLACE INTO events (run_id, step, kind, detail) VALUES (?, ?, ?, ?)", rows)

    def finish(self, run_id: str, result: RunResult, env: dict[str, Any] | None = None) -> None:
        """Record a run's result (its status, finished or diverged, is the result's) in one transaction of its
        own; the result's curves and events belong in `add_metrics` and `add_events`, not here. No-op on a run
        already finished. `env`: the environment of the machine that trained it, when that is not the one
        that started it (Ray)."""
        stored = {k: v for k, v in result.to_dict().items() if k not in ("history", "events")}
        self._end(run_id, RunStatus(result.status), stored, env)

    def fail(self, run_id: str, error: str, env: dict[str, Any] | None = None) -> None:
        """Record that a run failed with `error` (it may be started again). No-op on a run already finished."""
        self._end(run_id, RunStatus.FAILED, {"error": error}, env)

    def _end(self, run_id: str, status: RunStatus, result: dict[str, Any], env: dict[str, Any] | None) -> None:
        if not status.final:
            raise ValueError(f"a run ends finished, diverged or failed, not '{status}'")
        with self._write() as conn:
            _require(conn, run_id)
            conn.execute(
                "UPDATE runs SET status = ?, result = ?, finished_at = ?, env = COALESCE(?, env) "
                "WHERE id = ? AND status != 'finished'",
                (str(status), dumps(result), time.time(), None if env is None else dumps(env), run_id),
            )

    def add_study(self, study_id: str, study: dict[str, Any]) -> None:
        """Record a study (variants, seeds, base config, axes, ...) as run now; an existing one is touched."""
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO studies (id, study, created_at, run_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET run_at = excluded.run_at",
                (study_id, dumps(study), now, now),
            )

    # ---- reads --------------------------------------------------------------------------------

    def studies(self) -> list[StudyRecord]:
        """Recorded studies, the most recently run first."""
        rows = self._read("SELECT id, study, created_at, run_at FROM studies ORDER BY run_at DESC, id")
        return [
            StudyRecord(study_id, self._object(study, f"study {study_id}'s record", Study), created_at, run_at)
            for study_id, study, created_at, run_at in rows
        ]

    def get(self, run_id: str) -> RunRecord | None:
        """One run, or None if the store has no such id."""
        rows = self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return self._record(rows[0]) if rows else None

    def _object(self, text: str | None, what: str, record: type | None = None) -> dict[str, Any]:
        """The JSON object a column holds, its fields of the kinds the dataclass `record` declares; `what`
        names the column ("run r1's result").

        Checked here, where records are read, so that a store edited or damaged by hand is one error
        naming it, not a failure deep inside a summary or a report.
        """
        return self._checked_object(self._json(text, what), what, record)

    def _object_or_none(self, text: str | None, what: str, record: type | None = None) -> dict[str, Any] | None:
        """`_object`, or None where the column holds null."""
        value = self._json(text, what)
        return None if value is None else self._checked_object(value, what, record)

    def _json(self, text: str | None, what: str) -> Any:
        try:
            return loads(text)
        except ValueError as e:
            raise self._damaged(f"{what} is not JSON ({e})") from None

    def _checked_object(self, value: Any, what: str, record: type | None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self._damaged(f"{what} is {json_kind(value)}, not an object")
        problem = field_problem(value, record) if record else None
        if problem:
            raise self._damaged(f"{what}: {problem}")
        return value

    def _damaged(self, problem: str) -> ValueError:
        return ValueError(f"run store {self.path}: {problem}; the store was edited or damaged")

    def _number(self, value: Any, what: str, kind: type = float) -> Any:
        """A numeric column's value, checked: SQLite keeps text or bytes in any column (`what` names it, "run
        r1's attempts"); `kind` int for an INTEGER column. None (NaN in a metric, a time not yet reached) passes."""
        allowed = (int,) if kind is int else (int, float)
        if value is None or (isinstance(value, allowed) and not isinstance(value, bool)):
            return value
        found = f"text {shorten(repr(value))}" if isinstance(value, str) else f"{type(value).__name__} {shorten(value)}"
        raise self._damaged(f"{what} is {found}, not {'an integer' if kind is int else 'a number'}")

    def runs(self, status: RunStatus | str | None = None, sweep: str | None = None) -> list[RunRecord]:
        """Runs oldest first (created_at, then id), optionally only one status and/or one sweep."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown run status '{status}'; valid: {', '.join(STATUSES)}")
        # NULL matches every value of a filter that was not given
        sql = (
            f"SELECT {RUN_COLUMNS} FROM runs WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR sweep = ?2) "
            "ORDER BY created_at, id"
        )
        return [self._record(row) for row in self._read(sql, (None if status is None else str(status), sweep))]

    def _record(self, row: tuple[Any, ...]) -> RunRecord:
        """A `runs` row as a RunRecord; ValueError naming the store and the run when a column was damaged."""
        rid, config_text, status_text, result_text, env_text, sweep, attempts, created_at, started_at, finished_at = row
        config = self._object(config_text, f"run {rid}'s config")
        stored = self._object_or_none(result_text, f"run {rid}'s result")
        if stored is not None and (problem := result_problem(stored)):
            raise self._damaged(f"run {rid}'s result: {problem}")
        env = self._object_or_none(env_text, f"run {rid}'s environment")
        try:
            status = RunStatus(status_text)
            error = stored.get("error") if status is RunStatus.FAILED and stored else None
            result = RunResult.from_dict(stored) if status.done and stored is not None else None
        except ValueError as e:
            raise self._damaged(f"run {rid}: {e}") from None
        attempts = self._number(attempts, f"run {rid}'s attempts", int)
        created_at, started_at, finished_at = (
            self._number(value, f"run {rid}'s {name}")
            for name, value in (("created_at", created_at), ("started_at", started_at), ("finished_at", finished_at))
        )
        return RunRecord(
            rid, config, status, result, error, env or {}, sweep, attempts, created_at, started_at, finished_at
        )

    def metrics(self, run_id: str, name: str | None = None) -> list[tuple[int, str, float]]:
        """The run's (step, name, value) rows ordered by step then name, optionally one metric only."""
        if name is None:
            rows = self._read("SELECT step, name, value FROM metrics WHERE run_id = ? ORDER BY step, name", (run_id,))
        else:
            rows = self._read(
                "SELECT step, name, value FROM metrics WHERE run_id = ? AND name = ? ORDER BY step", (run_id, name)
            )
        return [
            (
                self._number(step, f"run {run_id}'s metric {metric} (its step)", int),
                metric,
                math.nan if value is None else self._number(value, f"run {run_id}'s metric {metric} at step {step}"),
            )
            for step, metric, value in rows
        ]

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events as {"step", "kind", ...detail}, ordered by step then kind."""
        rows = self._read("SELECT step, kind, detail FROM events WHERE run_id = ? ORDER BY step, kind", (run_id,))
        return [
            {
                "step": self._number(step, f"run {run_id}'s event {kind} (its step)", int),
                "kind": kind,
                **self._object(detail, f"run {run_id}'s event detail"),
            }
            for step, kind, detail in rows
        ]

    def snapshot(self, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
        """Everything but timestamps, attempts and environment, as plain data that compares with ==.

        For checking that two stores hold the same results (an interrupted and resumed sweep against
        an uninterrupted one). `ignore` names result keys and metric names to leave out (wall-clock
        timings differ between runs). NOTE: NaN != NaN, so non-finite floats appear as the strings
        'nan', 'inf', '-inf'.
        """
        runs = {}
        for rid, config, status, result_text, sweep in self._read("SELECT id, config, status, result, sweep FROM runs"):
            result = loads(result_text)
            if isinstance(result, dict):
                result = {k: v for k, v in result.items() if k not in ignore}
            runs[rid] = {"config": loads(config), "status": status, "sweep": sweep, "result": result}
        metrics: dict[str, list[tuple[int, str, float]]] = {run_id: [] for run_id in runs}
        for run_id, step, name, value in self._read(
            "SELECT run_id, step, name, value FROM metrics ORDER BY run_id, step, name"
        ):
            if name not in ignore:
                metrics[run_id].append((step, name, math.nan if value is None else value))
        events = {run_id: self.events(run_id) for run_id in runs}
        snapshot: dict[str, Any] = json_safe(
            {"schema_version": SCHEMA_VERSION, "runs": runs, "metrics": metrics, "events": events}
        )
        return snapshot

    def integrity_check(self) -> str:
        """SQLite's own consistency check: 'ok' when the file is sound."""
        verdict: str = self._read("PRAGMA integrity_check")[0][0]
        return verdict


RUN_COLUMNS = "id, config, status, result, env, sweep, attempts, created_at, started_at, finished_at"
SCHEMA_TABLES = [s.strip() for s in SCHEMA.split(";") if s.strip().startswith("CREATE TABLE")]


def _table_name(statement: str) -> str:
    """The table a `CREATE TABLE IF NOT EXISTS name (...)` statement of SCHEMA creates."""
    match = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", statement)
    assert match, statement
    return match.group(1)


def _opened(uri: str) -> sqlite3.Connection:
    """A connection to a SQLite URI, its file opened (SQLite opens it, and a WAL's -shm, on first use)."""
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except BaseException:
        conn.close()
        raise
    return conn


def _no_space(folder: pathlib.Path) -> bool:
    """Whether the file system holding `folder` has no block left that this process may use."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def _require(conn: sqlite3.Connection, run_id: str) -> None:
    if not conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
        raise ValueError(f"no run '{run_id}' in the store; claim it first")


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, ROLLBACK on any error; refuses to nest into a pending transaction."""
    if conn.in_transaction:  # every write commits on its own; something pending here is a bug
        raise RuntimeError("a transaction is already pending on this run store connection")
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite rolled back itself on some errors (a full disk): ROLLBACK would fail
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _set_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (a persistent setting of the file, so usually a no-op)."""
    # NOTE: the first switch of a new file needs an exclusive lock, and SQLite reports a concurrent
    # opener's lock as 'database is locked' without calling the busy handler; retry briefly.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if mode.lower() != "wal":
        raise ValueError(f"run store needs WAL journaling, but its file system allows only '{mode}'")
