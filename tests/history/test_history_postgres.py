"""The history store on a real PostgreSQL server (Debian's packages).

The server is the one ``$AMPCERT_TEST_POSTGRES`` names (``nox -s postgres``
starts one and sets it), else a throwaway one this module starts itself
where Debian's PostgreSQL binaries are installed and it runs as root (initdb
as the ``postgres`` user, trust authentication on 127.0.0.1, a free port, a
scratch data folder): a few seconds. Elsewhere the tests skip and say why.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import pytest
from test_history import history

from ampcert import session

pytestmark = pytest.mark.postgres
psycopg = pytest.importorskip("psycopg")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url():
    if os.environ.get("AMPCERT_TEST_POSTGRES"):
        yield os.environ["AMPCERT_TEST_POSTGRES"]
        return
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("no PostgreSQL: `nox -s postgres` installs and starts one (needs root)")
    bindir = os.path.dirname(bins[-1])
    data = tempfile.mkdtemp(prefix="ampcert-pg-")
    shutil.chown(data, "postgres", "postgres")
    port = _free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_postgres, f"{bindir}/initdb", "-D", f"{data}/db", "--auth=trust", "-U", "postgres"],
                   check=True, capture_output=True, timeout=120)
    server = subprocess.Popen([*as_postgres, f"{bindir}/postgres", "-D", f"{data}/db", "-p", str(port),
                               "-k", data, "-c", "listen_addresses=127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def database(server_url):
    """A fresh database on the server for each test, dropped afterwards."""
    name = f"ampcert_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield server_url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_adding_twice_records_once_and_reads_back_in_order(database, tmp_path):
    folders = history(tmp_path, [1.0, 1.0, 1.0])
    assert [a for _, a in session.history_add(folders, store=database)] == [True] * 3
    assert [a for _, a in session.history_add(folders[:1], store=database)] == [False]
    nights = session.history_show(store=database)
    assert len(nights) == 3 and [n.created_at for n in nights] == sorted(n.created_at for n in nights)
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT value FROM ampcert_meta WHERE key = 'schema_version'").fetchone()[0] == "1"


def test_a_planted_drop_is_found_through_a_postgresql_store(database, tmp_path):
    folders = history(tmp_path, [1.0] * 20 + [0.95] * 3, seed=4)
    session.history_add(folders[:-1], store=database)
    result = session.gate_history(folders[-1], store=database)
    row = next(r for r in result.rows if r.metric == "samples_per_s" and r.subject.endswith("/fp32"))
    assert row.status == "REGRESSION" and result.status == "FAIL"
    assert result.store.startswith("postgresql://...@127.0.0.1")  # no credentials in what is printed
