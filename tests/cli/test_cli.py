"""The command line: explicit command table, common flags anywhere, exit codes, JSON logs, extras.

Through real subprocesses (``python -m gazeguard …``) where the process matters (exit status,
stderr format, what gets imported), through :func:`gazeguard.cli.main` otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import IO

import numpy as np
import pytest

from gazeguard.cli import COMMANDS, ExitCode, build_parser, main
from gazeguard.cli._common import find_command
from gazeguard.ledger import Ledger
from gazeguard.signal.dataset import FeatureTable
from tests._postgres import pg_server, pg_url  # noqa: F401 - fixtures
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
FAST = ["--source", "simulated", "--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32"]
# Windows of 2 s: pulls every 0.25 s and releases 0.5 s after a window ends (the defaults, 1 s
# and 3 s, are for 30 s windows), so that a run of a few seconds releases its chunks.
QUICK_CLOCK = {"GAZEGUARD_INGEST__PULL_EVERY_S": "0.25", "GAZEGUARD_INGEST__LATE_AFTER_S": "0.5"}


def gazeguard(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """``python -m gazeguard ARGS`` with this checkout first on the path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    path = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "gazeguard", *args],
        capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False,
        env={**base, "PYTHONPATH": path, **(QUICK_CLOCK if "--window-s" in args else {}),
             **(env or {})},
    )  # fmt: skip


def without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """Environment in which importing ``modules`` fails as if they were not installed."""
    blocked = tmp_path / "blocked"
    blocked.mkdir(exist_ok=True)
    for name in modules:
        (blocked / f"{name}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    return {"PYTHONPATH": os.pathsep.join([str(blocked), str(REPO)])}


# ---------------------------------------------------------------------------------- the table


def test_every_command_has_explicit_importable_entry_points() -> None:
    for name, cmd in COMMANDS.items():
        parser = build_parser(name)  # imports only this command's module, declares its args
        assert parser.prog == "gazeguard"
        for spec in (cmd.configure, cmd.run):
            module, _, function = spec.partition(":")
            assert module, f"{name}: {spec!r} is not 'module:function'"
            assert function, f"{name}: {spec!r} is not 'module:function'"
            __import__(module)
            assert callable(getattr(sys.modules[module], function)), spec


def test_the_command_is_found_after_common_flags_with_values() -> None:
    assert find_command(["--log-format", "json", "-v", "run", "-v"]) == "run"
    assert find_command(["--log-level", "debug", "config", "check", "x"]) == "config"
    assert find_command(["-q"]) is None


def test_only_the_cli_layer_parses_command_lines() -> None:
    """Command-line code (argparse, ``configure`` functions, ``__main__`` blocks) lives in
    gazeguard/cli only; the domain layers are called, never run as scripts."""
    offenders = []
    for path in sorted((REPO / "gazeguard").rglob("*.py")):
        rel = path.relative_to(REPO / "gazeguard")
        if rel.parts[0] == "cli" or (rel.name == "__main__.py" and len(rel.parts) == 1):
            continue
        text = path.read_text()
        if "import argparse" in text or 'if __name__ == "__main__"' in text:
            offenders.append(str(rel))
    assert offenders == []
    assert not list((REPO / "gazeguard").rglob("*/__main__.py"))


@pytest.mark.slow
def test_schemas_and_mechanisms_are_commands(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = str(REPO)
    shown = subprocess.run(
        [sys.executable, "-m", "gazeguard", "mechanisms", "show"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "dcfpa dct  128" in shown.stdout
    schemas = subprocess.run(
        [sys.executable, "-m", "gazeguard", "schemas", "--write", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert schemas.returncode == 0, schemas.stderr
    assert sorted(p.name for p in tmp_path.glob("*.schema.json")) == [
        "attention.schema.json",
        "chunk.schema.json",
        "cohort-receipt.schema.json",
        "cohort.schema.json",
        "label.schema.json",
        "mode.schema.json",
        "status.schema.json",
    ]
    check = subprocess.run(
        [sys.executable, "-m", "gazeguard", "schemas", "--check"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr


def test_prior_refitting_never_overwrites_the_installed_prior_by_default(tmp_path: Path) -> None:
    from gazeguard.privacy.mechanisms.prior import DEFAULT_PATH  # noqa: PLC0415

    before = DEFAULT_PATH.read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = str(REPO)

    def mechanisms(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gazeguard", "mechanisms", *args],
            capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False, env=env,
        )  # fmt: skip

    model = mechanisms("model")
    assert model.returncode == 0, model.stderr
    assert (tmp_path / DEFAULT_PATH.name).is_file()  # written where the user is
    assert "show --prior" in model.stdout
    refused = mechanisms("model", "--out", str(DEFAULT_PATH))
    assert refused.returncode != 0
    assert "--replace-installed" in refused.stderr
    assert DEFAULT_PATH.read_bytes() == before


# ------------------------------------------------------------------------ flags and exit codes


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for code in ExitCode:
        assert re.search(rf"^\s+{int(code)}\s+{code.name}\s", text, re.M), code


def test_the_readme_documents_the_exit_codes() -> None:
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\d+)` \| `(\w+)` \|", readme, re.M))
    assert rows == {str(int(code)): code.name for code in ExitCode}


def test_unknown_flag_is_a_usage_error(tmp_path: Path) -> None:
    out = gazeguard("run", "--no-such-flag", cwd=tmp_path)
    assert out.returncode == ExitCode.USAGE == 2
    assert "unrecognized arguments: --no-such-flag" in out.stderr


def test_common_flags_after_the_command_and_json_errors(tmp_path: Path) -> None:
    """`gazeguard run -v` used to be refused; every stderr line is JSON with --log-format json."""
    out = gazeguard(
        "run", "-v", "--log-format", "json", "--chunk-steps", "48", "--epsilon", "-1",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == ExitCode.ERROR, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    errors = {d["field"]: d for d in lines if d.get("event") == "error"}
    assert set(errors) == {"mechanism.chunk_steps", "mechanism.epsilon"}
    assert errors["mechanism.chunk_steps"]["source"] == "command-line argument"
    assert "power of two" in errors["mechanism.chunk_steps"]["message"]
    assert all(d["level"] == "ERROR" for d in errors.values())


@pytest.mark.slow
@pytest.mark.network
def test_budget_run_exits_3_with_json_logs_and_verbose_after_the_command(
    tmp_path: Path, unique_id: str
) -> None:
    out = gazeguard(
        # chunks of 0.64 s (step 0.02 s): the third, refused by the cap, completes ~4 s in
        "run", *FAST, "--step-s", "0.02", "--source-id", unique_id, "--duration", "7",
        "--ledger", "l.sqlite",
        "--features", "fixation_rate,saccade_rate", "--epsilon", "1", "--session-cap", "4",
        "-v", "--log-format", "json",
        cwd=tmp_path, env={"GAZEGUARD_BROKER__PORT": "0"},
    )  # fmt: skip
    assert out.returncode == ExitCode.BUDGET, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]  # every line is one object
    assert all({"time", "level", "logger", "message"} <= set(d) for d in lines)
    assert any(d["level"] == "INFO" and d["logger"].startswith("gazeguard.") for d in lines), (
        "-v after the command raised the level to INFO"
    )
    chunks = [d for d in lines if d.get("event") == "chunk"]
    assert [d["chunk_index"] for d in chunks] == [0, 1]  # 2 × 2 ≤ 4 < 3 × 2
    (summary,) = [d for d in lines if d.get("event") == "summary"]
    assert summary["withheld"] >= 1
    assert summary["exit_status"] == ExitCode.BUDGET


@pytest.mark.slow
@pytest.mark.network
def test_unreachable_broker_exits_4(tmp_path: Path, unique_id: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    out = gazeguard(
        "run", *FAST, "--source-id", unique_id, "--duration", "5", "--ledger", "l.sqlite",
        "--features", "fixation_rate", "--broker", dead,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == ExitCode.UNDELIVERED, out.stderr
    assert f"broker {dead} never reached" in out.stderr
    assert re.search(r"; \d+ chunks? still in the outbox", out.stderr), out.stderr
    # one sentence, one full stop: "is the broker running on that host and port?" ends there
    assert "host and port?." not in out.stderr
    assert "host and port? Charged chunks wait in the outbox" in out.stderr


# ------------------------------------------------------------------------- lean install, extras


def test_core_dependencies_are_what_a_headset_needs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=;\[ ]", d)[0].lower() for d in project["dependencies"]}
    assert not core & {"scikit-learn", "matplotlib", "pyarrow"}
    # the user-level accountant: dp-accounting's PLD (which needs scipy) on the sidecar's path
    assert core >= {"dp-accounting", "scipy"}
    extras = project["optional-dependencies"]
    assert {re.split(r"[<>=; ]", d)[0] for d in extras["eval"]} >= {
        "scikit-learn",
        "scipy",
        "matplotlib",
    }
    assert any(d.startswith("pyarrow") for d in extras["parquet"])
    assert "ledger_pg" not in (REPO / "pyproject.toml").read_text()
    assert project["license"] == "MIT"
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    assert project["authors"] == [{"name": "gazeguard developers"}]


@pytest.mark.slow
@pytest.mark.network
def test_run_works_without_the_eval_and_parquet_extras(tmp_path: Path, unique_id: str) -> None:
    """Every import on `gazeguard run`'s path is a core dependency."""
    env = without(tmp_path, "sklearn", "matplotlib", "pyarrow")
    out = gazeguard(
        "run", *FAST, "--source-id", unique_id, "--duration", "8", "--ledger", "l.sqlite",
        "--features", "fixation_rate",
        cwd=tmp_path, env={**env, "GAZEGUARD_BROKER__PORT": "0"},
    )  # fmt: skip
    assert out.returncode == ExitCode.OK, out.stderr
    assert re.search(r"^chunk +0 charged", out.stderr, re.M), out.stderr


def test_eval_without_its_extra_says_which_in_one_line(tmp_path: Path) -> None:
    out = gazeguard("eval", "--quick", cwd=tmp_path, env=without(tmp_path, "sklearn"))
    assert out.returncode == ExitCode.ERROR
    assert (
        out.stderr == "gazeguard eval needs the 'eval' extra: "
        "pip install -e '.[eval]' (in the gazeguard checkout)\n"
    )
    assert not (tmp_path / "gazeguard-eval").exists()


def test_parquet_without_its_extra_says_which_in_one_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 24
    FeatureTable(
        rng.uniform(size=(n, 2)),
        np.arange(n) * 0.5,
        np.repeat(["a", "b", "c", "d"], n // 4),
        np.array(["t"] * n),
        np.repeat(["ra", "rb", "rc", "rd"], n // 4),
        ("f0", "f1"),
    ).save(tmp_path / "in.csv")
    out = gazeguard(
        "release", "ksame", "in.csv", "-o", "out.parquet", "--k", "2",
        cwd=tmp_path, env=without(tmp_path, "pyarrow"),
    )  # fmt: skip
    assert out.returncode == ExitCode.ERROR
    assert out.stderr.strip().splitlines() == [
        "gazeguard release with Parquet files needs the 'parquet' extra: "
        "pip install -e '.[parquet]' (in the gazeguard checkout)"
    ]
    assert not (tmp_path / "out.parquet").exists()


def test_jetstream_without_the_fleet_extra_says_which_in_one_line(tmp_path: Path) -> None:
    """nats-py is the 'fleet' extra: a JetStream worker or `gazeguard forward` without it fails
    at startup in one line naming the extra, not with an ImportError traceback."""
    env = without(tmp_path, "nats")
    out = gazeguard(
        "run", "--fleet", "--source", "jetstream", "--ledger", "l.sqlite", "--duration", "3",
        "--broker", "127.0.0.1:1", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert out.returncode == ExitCode.ERROR, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "'ingest.source'" in lines[0]
    assert "NATS JetStream needs nats-py" in lines[0]
    assert "pip install -e '.[fleet]' (in the gazeguard checkout)" in lines[0]
    assert not (tmp_path / "l.sqlite").exists()
    out = gazeguard("forward", "--device", "hmd", "--duration", "1", cwd=tmp_path, env=env)
    assert out.returncode == ExitCode.ERROR
    assert out.stderr == (
        "gazeguard forward needs the 'fleet' extra: "
        "pip install -e '.[fleet]' (in the gazeguard checkout)\n"
    )


def _refused_in_one_line(tmp_path: Path, field: str, *args: str) -> str:
    """``gazeguard run ARGS`` exits 1 at startup, without a traceback, with one line naming
    ``field``; that line."""
    out = gazeguard("run", *FAST, "--ledger", "l.sqlite", "--duration", "3", *args, cwd=tmp_path)
    assert out.returncode == ExitCode.ERROR, out.stderr
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if field in ln]
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.mark.slow
def test_a_looser_cap_on_restart_is_refused_at_startup_in_one_line(tmp_path: Path) -> None:
    """Issue 15.3: restarting a session with --session-cap 480 after it was opened with 240 used
    to print "session cap 480" and log a traceback per chunk with exit status 0."""
    with Ledger(tmp_path / "l.sqlite", session_cap=240.0, window_cap=10.0) as ledger:
        ledger.open_session("s1")
    line = _refused_in_one_line(
        tmp_path, "ledger.session_cap", "--session", "s1", "--session-cap", "480"
    )
    assert "session cap ε 240" in line
    assert "480" in line
    assert "would refill" in line
    # the wall-clock hour cap is part of the caps: switching it off on restart is looser too
    with Ledger(tmp_path / "l.sqlite", window_cap=10.0, wall_clock=True) as ledger:
        ledger.open_session("s2")
    (tmp_path / "off.toml").write_text("[ledger]\nwall_clock = false\n")
    line = _refused_in_one_line(
        tmp_path, "ledger.wall_clock", "--config", "off.toml", "--session", "s2"
    )
    assert "and of wall-clock time" in line


# ------------------------------------------------------------- the consumer path (issue 35)


class Proc:
    """``python -m gazeguard ARGS`` (with ``prefix`` before it), its output read line by line
    as it comes, so a test can act on a line (send Ctrl-C) instead of after a guessed time."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
        path = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gazeguard", *args], cwd=cwd, text=True,
            env={**base, "PYTHONPATH": path, **(QUICK_CLOCK if "--window-s" in args else {}),
             **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[str] = []
        self._new = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(pipe,), daemon=True)
            for pipe in (self.proc.stdout, self.proc.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: IO[str] | None) -> None:
        assert pipe is not None
        for line in pipe:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()

    @property
    def text(self) -> str:
        with self._new:
            return "".join(self.lines)

    def wait_for(self, pattern: str, within_s: float = 60) -> None:
        """Until a line matching ``pattern`` came; fails (killing the process) after
        ``within_s`` seconds."""
        with self._new:
            found = self._new.wait_for(
                lambda: any(re.search(pattern, ln) for ln in self.lines), within_s
            )
        if not found:
            self.proc.kill()
            pytest.fail(f"no {pattern!r} within {within_s} s:\n{self.finish()[1]}")

    def finish(self, sig: int | None = None) -> tuple[int, str]:
        """Send ``sig`` (if any), wait; the exit status and everything written."""
        if sig is not None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        for reader in self._readers:
            reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return code, self.text


@pytest.mark.slow
@pytest.mark.network
def test_ctrl_c_exits_130_in_one_line_and_sigterm_is_a_normal_stop(
    tmp_path: Path, unique_id: str
) -> None:
    """Issue 35.5: Ctrl-C gave 0 for `run` and 130 for `demo`/`simulate`; now 130 everywhere,
    with one line and no traceback. SIGTERM (systemd, Docker) stays `run`'s normal stop."""
    args = [*FAST, "--features", "fixation_rate", "--ledger", "l.sqlite", "--duration", "60"]
    env = {"GAZEGUARD_BROKER__PORT": "0"}
    for sig, status in ((signal.SIGINT, ExitCode.INTERRUPTED), (signal.SIGTERM, ExitCode.OK)):
        run = Proc("run", *args, "--source-id", f"{unique_id}-{sig}", cwd=tmp_path, env=env)
        run.wait_for(r"^chunk +0 charged")
        code, text = run.finish(sig)
        assert code == status, text
        assert "Traceback" not in text
        assert re.search(rf"\(exit status {int(status)}[:)]", text), text
    sim = Proc("simulate", "--source-id", f"{unique_id}-sim", cwd=tmp_path)
    sim.wait_for("^streaming simulated person")
    code, text = sim.finish(signal.SIGINT)
    assert code == ExitCode.INTERRUPTED, text
    assert "gazeguard simulate: interrupted (Ctrl-C)\n" in text
    assert re.search(r"^sent \d+ samples$", text, re.M), text
    assert "Traceback" not in text


@pytest.mark.slow
@pytest.mark.network
def test_forward_waits_for_nats_in_one_line_and_stops_on_ctrl_c(
    tmp_path: Path, unique_id: str
) -> None:
    """Issue 35.4: with no NATS server up, `forward` waited in silence and ignored Ctrl-C."""
    pytest.importorskip("nats", reason="nats-py is the 'fleet' extra")
    from gazeguard.runtime.simulate import SimulatedHeadset  # noqa: PLC0415

    with SimulatedHeadset(120.0, source_id=f"{unique_id}-fwd"):
        fwd = Proc(
            "forward", "--nats", f"nats://127.0.0.1:{free_port()}", "--device", "hmd",
            "--source-id", f"{unique_id}-fwd", cwd=tmp_path,
        )  # fmt: skip
        fwd.wait_for("no NATS server answers at")
        code, text = fwd.finish(signal.SIGINT)
    assert code == ExitCode.INTERRUPTED, text
    assert "gazeguard forward: interrupted (Ctrl-C)" in text
    assert len(re.findall("no NATS server answers", text)) == 1, text
    assert "Traceback" not in text


@pytest.mark.slow
@pytest.mark.network
def test_run_takes_a_postgresql_url_as_its_ledger(
    tmp_path: Path,
    unique_id: str,
    pg_url: str,  # noqa: F811 - the fixture
) -> None:
    """Issue 35.1: `--ledger postgresql://…` was taken for an SQLite path ("unable to open
    database file" on 'postgresql:/…'); only GAZEGUARD_LEDGER__URL worked."""
    out = gazeguard(
        "run", *FAST, "--source-id", unique_id, "--session", unique_id, "--duration", "9",
        "--features", "fixation_rate", "--ledger", pg_url,
        cwd=tmp_path, env={"GAZEGUARD_BROKER__PORT": "0"},
    )  # fmt: skip
    assert out.returncode == ExitCode.OK, out.stderr
    with Ledger(pg_url, create=False) as ledger:
        charged = [c.chunk_index for c in ledger.charges(unique_id)]
    assert charged, out.stderr
    assert charged == list(range(len(charged)))
    assert list(tmp_path.iterdir()) == []  # no SQLite file made of the URL
    shown = gazeguard("ledger", "show", "--path", pg_url, "--json", cwd=tmp_path)
    assert shown.returncode == ExitCode.OK, shown.stderr
    assert [s["session"] for s in json.loads(shown.stdout)["sessions"]] == [unique_id]


def as_this_user() -> list[str]:
    """A command prefix under which file permissions bind this process's user: root ignores
    them unless its DAC capabilities are dropped (``setpriv``)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, and no setpriv to drop the capabilities that ignore modes")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.mark.slow
def test_a_read_only_ledger_names_the_cause_and_ledger_show_reads_it(tmp_path: Path) -> None:
    """Issue 35.7: a ledger in a directory the user may not write said "unable to open database
    file"; `ledger show` called a valid ledger there "not a usable gazeguard ledger"."""
    store = tmp_path / "store"
    store.mkdir()
    with Ledger(store / "l.sqlite") as ledger:
        ledger.open_session("s1")
    base = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env = {**base, "PYTHONPATH": os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])}

    def gazeguard_here(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_this_user(), sys.executable, "-m", "gazeguard", *args],
            capture_output=True, text=True, cwd=tmp_path, timeout=90, check=False, env=env,
        )  # fmt: skip

    store.chmod(0o555)
    try:
        for ledger_file in ("l.sqlite", "new.sqlite"):  # a ledger there, and a new one
            out = gazeguard_here(
                "run", *FAST, "--ledger", str(store / ledger_file), "--duration", "3",
                "--broker", f"127.0.0.1:{free_port()}",
            )  # fmt: skip
            assert out.returncode == ExitCode.ERROR, out.stderr
            (line,) = out.stderr.splitlines()
            assert f"directory {store} is not writable by user" in line, line
            assert "make it writable" in line
            assert "or point ledger.path (--ledger) at a directory" in line
        shown = gazeguard_here("ledger", "show", "--path", str(store / "l.sqlite"), "--json")
        assert shown.returncode == ExitCode.OK, shown.stderr
        assert [s["session"] for s in json.loads(shown.stdout)["sessions"]] == ["s1"]
        assert sorted(p.name for p in store.iterdir()) == ["l.sqlite"]  # nothing written
    finally:
        store.chmod(0o755)
    (store / "l.sqlite").chmod(0o444)  # the file itself read-only, in a writable directory
    out = gazeguard_here("run", *FAST, "--ledger", str(store / "l.sqlite"), "--duration", "3")
    assert out.returncode == ExitCode.ERROR, out.stderr
    assert f"file {store / 'l.sqlite'} is not readable and writable by user" in out.stderr
    assert "Traceback" not in out.stderr
