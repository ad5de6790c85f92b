"""The command line: explicit command table, common flags anywhere, exit codes, JSON logs, extras.

Through real subprocesses (``python -m gazeguard …``) where the process matters (exit status,
stderr format, what gets imported), through :func:`gazeguard.cli.main` otherwise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port

from gazeguard.cli import COMMANDS, ExitCode, build_parser, main
from gazeguard.cli._common import find_command
from gazeguard.dataset import FeatureTable
from gazeguard.ledger import Ledger

REPO = Path(__file__).resolve().parent.parent
FAST = ["--source", "simulated", "--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32"]


def gazeguard(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """``python -m gazeguard ARGS`` with this checkout first on the path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    path = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "gazeguard", *args],
        capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False,
        env={**base, "PYTHONPATH": path, **(env or {})},
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


def test_domain_modules_no_longer_carry_command_line_code() -> None:
    for module in ("service", "config", "message", "simulate", "forward", "demo"):
        text = (REPO / "gazeguard" / f"{module}.py").read_text()
        assert "import argparse" not in text, module
        assert "def configure_" not in text, module
    assert not (REPO / "gazeguard" / "cli.py").exists()
    assert not (REPO / "gazeguard" / "ledger" / "_cli.py").exists()
    import gazeguard.ledger  # noqa: PLC0415

    assert not hasattr(gazeguard.ledger, "run_ledger")
    assert not hasattr(gazeguard.ledger, "configure_ledger")
    prior = (REPO / "gazeguard" / "mechanisms" / "prior.py").read_text()
    assert "argparse" not in prior


def test_module_entry_points_still_work(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = str(REPO)
    shown = subprocess.run(
        [sys.executable, "-m", "gazeguard.mechanisms", "show"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "dcfpa dct  128" in shown.stdout
    schemas = subprocess.run(
        [sys.executable, "-m", "gazeguard.message", "--write-schemas", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert schemas.returncode == 0, schemas.stderr
    assert sorted(p.name for p in tmp_path.glob("*.schema.json")) == [
        "chunk.schema.json",
        "status.schema.json",
    ]


def test_prior_refitting_never_overwrites_the_installed_prior_by_default(tmp_path: Path) -> None:
    from gazeguard.mechanisms.prior import DEFAULT_PATH  # noqa: PLC0415

    before = DEFAULT_PATH.read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = str(REPO)

    def mechanisms(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gazeguard.mechanisms", *args],
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


@pytest.mark.network
def test_budget_run_exits_3_with_json_logs_and_verbose_after_the_command(
    tmp_path: Path, unique_id: str
) -> None:
    out = gazeguard(
        "run", *FAST, "--source-id", unique_id, "--duration", "7", "--ledger", "l.sqlite",
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
    assert "chunks still in the outbox" in out.stderr


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


@pytest.mark.network
def test_run_works_without_the_eval_and_parquet_extras(tmp_path: Path, unique_id: str) -> None:
    """Every import on `gazeguard run`'s path is a core dependency."""
    env = without(tmp_path, "sklearn", "matplotlib", "pyarrow")
    out = gazeguard(
        "run", *FAST, "--source-id", unique_id, "--duration", "5", "--ledger", "l.sqlite",
        "--features", "fixation_rate",
        cwd=tmp_path, env={**env, "GAZEGUARD_BROKER__PORT": "0"},
    )  # fmt: skip
    assert out.returncode == ExitCode.OK, out.stderr
    assert re.search(r"^chunk +0 charged", out.stderr, re.M), out.stderr


def test_eval_without_its_extra_says_which_in_one_line(tmp_path: Path) -> None:
    out = gazeguard("eval", "--quick", cwd=tmp_path, env=without(tmp_path, "sklearn"))
    assert out.returncode == ExitCode.ERROR
    assert out.stderr == "gazeguard eval needs the 'eval' extra: pip install 'gazeguard[eval]'\n"
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
        "pip install 'gazeguard[parquet]'"
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
    assert "pip install 'gazeguard[fleet]'" in lines[0]
    assert not (tmp_path / "l.sqlite").exists()
    out = gazeguard("forward", "--device", "hmd", "--duration", "1", cwd=tmp_path, env=env)
    assert out.returncode == ExitCode.ERROR
    assert out.stderr == (
        "gazeguard forward needs the 'fleet' extra: pip install 'gazeguard[fleet]'\n"
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
