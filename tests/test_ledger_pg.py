"""The PostgreSQL ledger backend, against a real PostgreSQL server started on a free loopback port.

The server comes from the Debian binaries (``apt-get install -y postgresql``): ``initdb`` into a
temporary directory, run as the ``postgres`` user when we are root. Without the binaries or
psycopg 3 (``pip install -e '.[fleet]'``) the tests skip, saying which is missing.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port

from gazeguard.cli import main
from gazeguard.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import DuplicateChargeError, Ledger, LedgerError

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg 3 is not installed: pip install -e '.[fleet]'"
)

EPS = {"fix_rate": 0.25, "sacc_amp": 0.25}  # 0.5 per chunk


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
def url(pg_server: str) -> Iterator[str]:
    """A fresh database on the server, for one test."""
    name = f"ledger_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield pg_server.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_same_interface_persists_and_refuses_like_sqlite(url: str) -> None:
    with Ledger(url, session_cap=1.7, w_event=4, w_event_cap=1.0) as ledger:
        assert ledger.backend.kind == "postgresql"
        for i in range(2):
            ledger.charge("s", i, EPS, "t", f"p{i}".encode())
        with pytest.raises(BudgetExhaustedError, match="under the w-event cap"):
            ledger.charge("s", 2, EPS, "t", b"x")
        ledger.withhold("s", 2, 0.5, "w-event cap")
        with pytest.raises(DuplicateChargeError, match="already withheld"):
            ledger.charge("s", 2, EPS, "t", b"x")
    with Ledger.open(url, session_cap=1.7, w_event=4, w_event_cap=1.0) as ledger:
        state = ledger.state("s")
        assert (state.spent, state.chunks, state.withheld, state.remaining) == (1.0, 2, 1, 0.7)
        assert [(p.chunk_index, p.payload) for p in ledger.pending()] == [(0, b"p0"), (1, b"p1")]
        assert ledger.mark_delivered(ledger.pending()[0].id) is True
        assert [p.chunk_index for p in ledger.pending()] == [1]
        with pytest.raises(DuplicateChargeError):
            ledger.charge("s", 1, EPS, "t", b"x")
        assert ledger.charge("s", 9, EPS, "t", b"x").state.remaining == 0.2
        with pytest.raises(BudgetExhaustedError, match="under the session cap"):
            ledger.charge("s", 20, EPS, "t", b"x")
        assert ledger.charge("s", 20, {"f": 0.2}, "t", b"x").state.remaining == 0.0
        assert ledger.verify() == []
    with (
        Ledger(url, session_cap=2.0, w_event=4, w_event_cap=1.0) as ledger,
        pytest.raises(ConfigError, match="would refill"),
    ):
        ledger.open_session("s")


def test_cli_reads_a_postgresql_ledger(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Ledger(url, session_cap=3.0) as ledger:
        ledger.charge("fleet-1", 0, EPS, "t", b"x")
    assert main(["ledger", "show", "--path", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(s["session"], s["spent"], s["remaining"]) for s in doc["sessions"]] == [
        ("fleet-1", 0.5, 2.5)
    ]


def test_failed_payload_rolls_back_the_charge(url: str) -> None:
    def broken(_: object) -> bytes:
        raise RuntimeError("mechanism failed")

    with Ledger(url, session_cap=5.0) as ledger:
        with pytest.raises(RuntimeError, match="mechanism failed"):
            ledger.charge("s", 0, EPS, "t", broken)
        assert (ledger.state("s").chunks, ledger.pending()) == (0, [])
        assert ledger.charge("s", 0, EPS, "t", b"ok").state.spent == 0.5


def test_concurrent_workers_on_one_session_never_overspend(url: str) -> None:
    """Threads with their own connections, all charging one session: the row lock serialises."""
    cap, n_workers, per_worker = 20.0, 6, 15
    accepted: list[int] = []
    lock = threading.Lock()
    Ledger(url).close()  # create the tables once

    def work(w: int) -> None:
        with Ledger(url, session_cap=cap) as ledger:
            for j in range(per_worker):
                # Workers overlap on chunk indexes too: each index may be charged only once.
                index = (w % 3) * per_worker + j
                try:
                    ledger.charge("s", index, EPS, "t", str(index).encode())
                    with lock:
                        accepted.append(index)
                except (BudgetExhaustedError, DuplicateChargeError):
                    pass

    threads = [threading.Thread(target=work, args=(w,)) for w in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == len(set(accepted)) == 40  # 20 ε / 0.5, out of 45 distinct indexes
    with Ledger(url) as ledger:
        assert ledger.state("s").spent == cap
        assert sorted(c.chunk_index for c in ledger.charges("s")) == sorted(accepted)
        assert ledger.verify() == []


WORKER = """
import json, sys
from gazeguard.cli import main
from gazeguard.errors import BudgetExhaustedError
from gazeguard.ledger import Ledger
url, start = sys.argv[1], int(sys.argv[2])
accepted = []
with Ledger(url, session_cap=60.0) as ledger:
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for i in range(start, start + 50):
        try:
            ledger.charge("s", i, {"f": 0.25, "g": 0.25}, "t", str(i).encode())
            accepted.append(i)
        except BudgetExhaustedError:
            pass
print(json.dumps(accepted))
"""


def test_worker_processes_never_overspend(url: str) -> None:
    Ledger(url).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(p * 50)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(4)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
    accepted = []
    for proc in procs:
        out, _ = proc.communicate("go\n", timeout=120)
        assert proc.returncode == 0
        accepted += json.loads(out)
    assert len(accepted) == 120
    with Ledger(url) as ledger:
        assert ledger.state("s").spent == 60.0
        assert sorted(c.chunk_index for c in ledger.charges("s")) == sorted(accepted)
        # Within a session, outbox order is charge order.
        assert [p.chunk_index for p in ledger.pending()] == [
            c.chunk_index for c in sorted(ledger.charges("s"), key=lambda c: c.created)
        ]
        assert ledger.verify() == []


def test_unreachable_server_is_a_clear_error_without_the_password() -> None:
    port = free_port()
    with pytest.raises(LedgerError, match=r"cannot connect.*:\*\*\*@127.0.0.1") as info:
        Ledger(f"postgresql://gaze:secret@127.0.0.1:{port}/none", timeout_s=2)
    assert "secret" not in str(info.value)
