"""A real PostgreSQL server for ledger tests: started on a free loopback port, one per module.

The server comes from the Debian binaries (``apt-get install -y postgresql``): ``initdb`` into a
temporary directory, run as the ``postgres`` user when we are root. Without the binaries or
psycopg 3 (``pip install -e '.[fleet]'``) the tests skip, saying which is missing. Import the
fixtures into a test module: ``from _postgres import pg_server, pg_url``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port


def _pg_bindir() -> Path | None:
    found = shutil.which("initdb")
    candidates = [found] if found else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(os.path.realpath(candidates[0])).parent if candidates else None


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1:<free port>; yields the admin URL."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb) not found: apt-get install -y postgresql")
    prefix: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="gazeguard-pg-"))
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to run the PostgreSQL server as")
        os.chown(workdir, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data, log, port = workdir / "data", workdir / "server.log", free_port()
    init = [*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
    subprocess.run([*init, "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
    options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={workdir}"
    ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(data)]
    started = subprocess.run([*ctl, "-o", options, "-l", str(log), "-w", "start"], check=False)
    if started.returncode != 0:
        pytest.fail(f"PostgreSQL did not start on port {port}: {log.read_text()}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "-w", "stop"], check=False, capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh database on the server, for one test."""
    psycopg = pytest.importorskip(
        "psycopg", reason="psycopg 3 is not installed: pip install -e '.[fleet]'"
    )
    name = f"ledger_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield pg_server.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
