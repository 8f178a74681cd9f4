"""Where the nights are kept: an SQLite file, or a PostgreSQL database for a team.

    store = open_store("history.sqlite")            # or "sqlite:///abs/path", "postgresql://host/db"
    added = store.add(read_night("reports/nightly-123"))   # False: that folder is already there
    store.series("vision", machine, ("resnet", "torch", "native", "bf16"), "samples_per_s")

**Why SQLite by default.** It is in Python's standard library (no dependency,
no server), keeps a store in one file that CI can cache or commit, and each
add is one transaction: a failed or interrupted add leaves the store as it
was. The history is small (a few thousand rows a year per suite) and read as
whole series, so DuckDB's columnar engine would buy nothing for its ~40 MB
wheel. A team shares one PostgreSQL database instead (``postgresql://...``,
``pip install 'ampcert[history-postgres]'``: psycopg 3); the SQL is the same,
only the parameter style differs.

**Schema versions.** ``ampcert_meta.schema_version`` says which schema a store
has. A store of an older version is migrated in place (in one transaction) by
the steps in :data:`MIGRATIONS`; one written by a newer ampcert, or a
database that is not an ampcert store, is refused with one line. So is a file
that is not an SQLite database at all, and a server that cannot be reached.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ampcert.envinfo import software_stack
from ampcert.errors import UserError
from ampcert.history.records import Night
from ampcert.vocabulary import Subject

SCHEMA_VERSION = 1
STORE_ENV = "AMPCERT_HISTORY"
DEFAULT_STORE = "ampcert-history.sqlite"
CONNECT_TIMEOUT_S = 5

_TABLES = [
    """CREATE TABLE ampcert_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE nights (
        digest TEXT PRIMARY KEY, suite TEXT NOT NULL, suite_sha256 TEXT, created_at TEXT NOT NULL,
        added_at TEXT NOT NULL, machine TEXT NOT NULL, source TEXT NOT NULL, tool TEXT NOT NULL,
        certificate TEXT, fingerprint TEXT NOT NULL)""",
    """CREATE TABLE points (
        digest TEXT NOT NULL REFERENCES nights(digest), workload TEXT NOT NULL, backend TEXT NOT NULL,
        amp TEXT NOT NULL, precision TEXT NOT NULL, metric TEXT NOT NULL, value DOUBLE PRECISION NOT NULL,
        samples TEXT NOT NULL, higher_is_better INTEGER NOT NULL,
        PRIMARY KEY (digest, workload, backend, amp, precision, metric))""",
    """CREATE TABLE verdicts (
        digest TEXT NOT NULL REFERENCES nights(digest), workload TEXT NOT NULL, backend TEXT NOT NULL,
        amp TEXT NOT NULL, precision TEXT NOT NULL, rule TEXT NOT NULL, status TEXT NOT NULL,
        PRIMARY KEY (digest, workload, backend, amp, precision, rule))""",
    """CREATE INDEX nights_by_suite ON nights (suite, machine, created_at)""",
]
# version -> the statements that bring a store of that version to the next one.
MIGRATIONS: dict[int, list[str]] = {}


def default_store_url() -> str:
    """``$AMPCERT_HISTORY``, else ``ampcert-history.sqlite`` in the working folder."""
    return os.environ.get(STORE_ENV) or DEFAULT_STORE


@dataclass(frozen=True)
class NightRow:
    digest: str
    suite: str
    created_at: str
    machine: str
    certificate: str | None
    source: str


@dataclass(frozen=True)
class SeriesPoint:
    digest: str
    created_at: str
    value: float
    samples: list[float]
    higher_is_better: bool


class Store:
    """One history store; every method is one transaction."""

    def __init__(self, url: str, connect: Callable[[], Any], placeholder: str, errors: tuple[type[BaseException], ...],
                 create: bool = True):
        self.url = url
        self._connect = connect
        self._placeholder = placeholder
        self._errors = errors
        with self._transaction() as cur:
            self._check_schema(cur, create)

    # -- plumbing ---------------------------------------------------------------------------

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self._placeholder)

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        try:
            conn = self._connect()
        except self._errors as exc:
            raise UserError(f"history store {self.url}: cannot open it: {_first_line(exc)}") from None
        try:
            cur = conn.cursor()
            yield cur
            conn.commit()
        except self._errors as exc:
            conn.rollback()
            raise UserError(f"history store {self.url}: {_first_line(exc)}") from None
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def _execute(self, cur: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(statement), tuple(params))
        return cur

    def _tables(self, cur: Any) -> set[str]:
        if self._placeholder == "?":
            rows = cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        else:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
            rows = cur.fetchall()
        return {r[0] for r in rows}

    def _check_schema(self, cur: Any, create: bool) -> None:
        tables = self._tables(cur)
        if not tables and not create:
            raise UserError(f"history store {self.url}: holds no ampcert history yet "
                            "(`ampcert history add DIR` creates it)")
        if not tables:
            for statement in _TABLES:
                self._execute(cur, statement)
            self._execute(cur, "INSERT INTO ampcert_meta (key, value) VALUES (?, ?)",
                          ("schema_version", str(SCHEMA_VERSION)))
            return
        if "ampcert_meta" not in tables:
            raise UserError(f"history store {self.url}: not an ampcert history store "
                            f"(it has tables {', '.join(sorted(tables)[:5])}, no ampcert_meta)")
        row = self._execute(cur, "SELECT value FROM ampcert_meta WHERE key = ?", ("schema_version",)).fetchone()
        version = int(row[0]) if row and str(row[0]).isdigit() else None
        if version is None:
            raise UserError(f"history store {self.url}: no readable schema_version in ampcert_meta")
        if version > SCHEMA_VERSION:
            raise UserError(f"history store {self.url}: written by a newer ampcert (schema {version}; this one "
                            f"reads up to {SCHEMA_VERSION}): upgrade ampcert")
        if version < SCHEMA_VERSION and any(v not in MIGRATIONS for v in range(version, SCHEMA_VERSION)):
            raise UserError(f"history store {self.url}: schema {version} is older than any ampcert store this "
                            f"version can migrate (it reads {SCHEMA_VERSION}); start a new store")
        while version < SCHEMA_VERSION:
            for statement in MIGRATIONS[version]:
                self._execute(cur, statement)
            version += 1
            self._execute(cur, "UPDATE ampcert_meta SET value = ? WHERE key = ?", (str(version), "schema_version"))

    # -- writing ----------------------------------------------------------------------------

    def add(self, night: Night) -> bool:
        """Record ``night``; False when that folder (its plan.json) is already in the store."""
        added_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._transaction() as cur:
            if self._execute(cur, "SELECT 1 FROM nights WHERE digest = ?", (night.digest,)).fetchone():
                return False
            self._execute(cur, "INSERT INTO nights (digest, suite, suite_sha256, created_at, added_at, machine, "
                               "source, tool, certificate, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          (night.digest, night.suite, night.suite_sha256, night.created_at, added_at, night.machine,
                           night.source, night.tool, night.certificate.value if night.certificate else None,
                           json.dumps(night.fingerprint, sort_keys=True)))
            for p in night.points:
                self._execute(cur, "INSERT INTO points (digest, workload, backend, amp, precision, metric, value, "
                                   "samples, higher_is_better) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (night.digest, *p.subject, p.metric, p.value,
                               json.dumps(p.samples), int(p.higher_is_better)))
            for v in night.verdicts:
                self._execute(cur, "INSERT INTO verdicts (digest, workload, backend, amp, precision, rule, status) "
                                   "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                              (night.digest, *v.subject, v.rule, v.status.value))
        return True

    # -- reading ----------------------------------------------------------------------------

    def nights(self, suite: str | None = None, machine: str | None = None) -> list[NightRow]:
        query = "SELECT digest, suite, created_at, machine, certificate, source FROM nights"
        where, params = [], []
        if suite is not None:
            where.append("suite = ?")
            params.append(suite)
        if machine is not None:
            where.append("machine = ?")
            params.append(machine)
        if where:
            query += " WHERE " + " AND ".join(where)
        with self._transaction() as cur:
            rows = self._execute(cur, query + " ORDER BY created_at, digest", params).fetchall()
        return [NightRow(*row) for row in rows]

    def stack(self, digest: str) -> dict[str, str]:
        """The software the night ``digest`` ran on (envinfo.software_stack), {} if unknown."""
        with self._transaction() as cur:
            row = self._execute(cur, "SELECT tool, fingerprint FROM nights WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            return {}
        try:
            fingerprint = json.loads(row[1])
        except ValueError:
            return {}
        return software_stack(fingerprint if isinstance(fingerprint, dict) else {}, str(row[0] or ""))

    def series(self, suite: str, machine: str, subject: Subject, metric: str) -> list[SeriesPoint]:
        """One metric of one subject, night by night (oldest first)."""
        with self._transaction() as cur:
            rows = self._execute(
                cur, "SELECT n.digest, n.created_at, p.value, p.samples, p.higher_is_better FROM points p "
                     "JOIN nights n ON n.digest = p.digest WHERE n.suite = ? AND n.machine = ? AND p.workload = ? "
                     "AND p.backend = ? AND p.amp = ? AND p.precision = ? AND p.metric = ? "
                     "ORDER BY n.created_at, n.digest",
                (suite, machine, *subject, metric)).fetchall()
        return [SeriesPoint(d, c, float(v), [float(x) for x in json.loads(s)], bool(h)) for d, c, v, s, h in rows]

    def subjects(self, suite: str, machine: str) -> list[tuple[Subject, str]]:
        """Every (subject, metric) with points for this suite on this machine."""
        with self._transaction() as cur:
            rows = self._execute(
                cur, "SELECT DISTINCT p.workload, p.backend, p.amp, p.precision, p.metric FROM points p "
                     "JOIN nights n ON n.digest = p.digest WHERE n.suite = ? AND n.machine = ? "
                     "ORDER BY p.workload, p.backend, p.amp, p.precision, p.metric", (suite, machine)).fetchall()
        return [(Subject(w, b, a, p), m) for w, b, a, p, m in rows]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlite(url: str, create: bool) -> Store:
    path = Path(url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url.removeprefix("sqlite:"))
    if path.is_dir():
        raise UserError(f"history store {url}: is a folder; give a file (e.g. {path / DEFAULT_STORE})")
    if path.exists():
        # sqlite3 would open any file and fail at the first statement; a corrupt or foreign
        # file is named here, before anything is written.
        with open(path, "rb") as fh:
            if fh.read(16) not in (b"SQLite format 3\x00", b""):
                raise UserError(f"history store {url}: not an SQLite database (corrupt, or another kind of file)")
    elif not create:
        # Reading never leaves a file behind: a mistyped --store names the mistake instead.
        raise UserError(f"history store {url}: no such file (`ampcert history add DIR` creates it)")
    elif not path.parent.is_dir():
        raise UserError(f"history store {url}: folder {path.parent} does not exist")

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    return Store(str(path), connect, "?", (sqlite3.Error,), create)


def _postgres(url: str, create: bool) -> Store:
    try:
        import psycopg
    except ImportError:
        raise UserError(f"history store {url}: PostgreSQL stores need psycopg: "
                        "pip install 'ampcert[history-postgres]'") from None
    shown = url.split("@")[-1]  # never print a password

    def connect() -> Any:
        return psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S)

    return Store(f"postgresql://...@{shown}" if "@" in url else url, connect, "%s", (psycopg.Error,), create)


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    """The store at ``url`` (default: :func:`default_store_url`). A new one is created
    when ``create``; commands that only read pass False, and a store that is not there
    is then one line, with no file or tables left behind."""
    url = url or default_store_url()
    if url.startswith(("postgresql://", "postgres://")):
        return _postgres(url, create)
    if "://" in url and not url.startswith("sqlite:///"):
        raise UserError(f"history store {url}: expected a file path, sqlite:///PATH or postgresql://...")
    return _sqlite(url, create)
