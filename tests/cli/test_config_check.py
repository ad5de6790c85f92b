"""`gazeguard config check` checks what `gazeguard run` checks, lists every problem with its
source and a "did you mean", keeps stdout machine-readable, and leaves the ledger untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gazeguard.cli import ExitCode, main
from gazeguard.config import IngestSettings, Settings, load_settings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.runtime.preflight import (
    check_settings,
    require_valid,
    simulated_source_id,
    validate_settings,
)

REPO = Path(__file__).resolve().parents[2]

BAD = """\
[mechanism]
features = ["fixation_rat", "pupil_mean"]
epsilom = 2.0
name = "dcfp"
[features]
window_s = 5.0
step_s = 10.0
[ingest]
preset = "tobi"
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("GAZEGUARD_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str, name: str = "gazeguard.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_misspelt_feature_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    """`features = ["fixation_rat"]` used to pass `config check` and fail `run` later."""
    path = write(tmp_path, '[mechanism]\nfeatures = ["fixation_rat"]\n')
    load_settings(path)  # the schema alone accepts it …
    settings, problems = check_settings(path)
    assert settings is not None
    (problem,) = problems  # … the check does not
    assert (problem.field, problem.value, problem.suggestion) == (
        "mechanism.features",
        "fixation_rat",
        "fixation_rate",
    )
    assert problem.source == f"file {path}"
    assert "did you mean 'fixation_rate'?" in str(problem)


def test_every_problem_is_listed_schema_and_semantic_alike(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    settings, problems = check_settings(path)
    assert settings is None
    found = {p.field: p for p in problems}
    assert set(found) == {
        "ingest.preset",
        "mechanism.name",
        "mechanism.epsilom",
        "mechanism.features",
        "features.step_s",
    }
    assert found["ingest.preset"].suggestion == "tobii"
    assert found["mechanism.name"].suggestion == "dcfpa"
    assert found["mechanism.epsilom"].suggestion == "epsilon"
    assert found["mechanism.features"].suggestion == "fixation_rate"
    assert "window_s=5.0" in found["features.step_s"].reason
    assert all(p.source == f"file {path}" for p in problems)


def test_the_source_of_each_problem_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, '[mechanism]\nfeatures = ["blink_rat"]\n')
    monkeypatch.setenv("GAZEGUARD_MECHANISM__EPSILON_PER_FEATURE", '{"saccade_rat": 2.0}')
    _, problems = check_settings(path, ingest={"preset": "eyelink", "source": "lsl"})
    sources = {p.field: p.source for p in problems}
    assert sources == {
        "mechanism.features": f"file {path}",
        "mechanism.epsilon_per_feature": "environment variable "
        "GAZEGUARD_MECHANISM__EPSILON_PER_FEATURE",
        "ingest.screen_resolution_px": "defaults",
    }


def test_cli_stdout_is_json_only_and_every_problem_goes_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BAD)
    assert main(["config", "check", str(path)]) == ExitCode.ERROR
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 6  # five problems and a count
    assert lines[-1] == f"{path}: 5 problems: `gazeguard run` would refuse this configuration"
    assert sum("did you mean" in line for line in lines) == 4

    assert main(["config", "check", str(path), "--json"]) == ExitCode.ERROR
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert report["settings"] is None
    assert len(report["problems"]) == 5
    assert {"field", "value", "reason", "source", "suggestion", "message"} <= set(
        report["problems"][0]
    )

    good = write(tmp_path, "[mechanism]\nepsilon = 2.0\n", "good.toml")
    assert main(["config", "check", str(good)]) == ExitCode.OK
    out, err = capsys.readouterr()
    assert json.loads(out)["mechanism"]["epsilon"] == 2.0  # nothing but JSON on stdout
    assert err.strip().splitlines()[-1] == f"{good}: OK"
    assert err.startswith("release plan:")  # the plan it would run, before the verdict
    assert main(["config", "check", str(good), "--json"]) == ExitCode.OK
    report = json.loads(capsys.readouterr().out)
    assert (report["valid"], report["problems"]) == (True, [])
    assert report["plan"]["releases"]["chunks"]["per_hour"] == 230


def _ledger_with_session(path: Path) -> None:
    with Ledger(path, session_cap=10.0, window_cap=5.0) as ledger:
        ledger.open_session("s1")


def test_caps_looser_than_the_stored_session_are_refused_read_only(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    _ledger_with_session(ledger)
    before = ledger.read_bytes()
    stricter = write(
        tmp_path,
        f'session = "s1"\n[ledger]\npath = "{ledger}"\nsession_cap = 8.0\nbudget_per_hour = 4.0\n',
        "strict.toml",
    )
    assert check_settings(stricter)[1] == []
    looser = write(
        tmp_path, f'session = "s1"\n[ledger]\npath = "{ledger}"\nsession_cap = 20.0\n', "l.toml"
    )
    _, problems = check_settings(looser)
    assert {p.field for p in problems} == {"ledger.session_cap", "ledger.budget_per_hour"}
    assert all("session 's1' in" in p.reason for p in problems)
    assert all("was opened with session cap ε 10" in p.reason for p in problems)
    other = write(
        tmp_path, f'session = "s2"\n[ledger]\npath = "{ledger}"\nsession_cap = 20.0\n', "o.toml"
    )
    assert check_settings(other)[1] == []  # a new session may start with any cap
    assert ledger.read_bytes() == before


def test_the_simulated_headsets_session_is_known_before_the_stream(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    with Ledger(ledger, session_cap=10.0) as led:  # this process's simulated person 7
        led.open_session(simulated_source_id(IngestSettings(simulated_seed=7)))
    cfg = write(
        tmp_path,
        f'[ingest]\nsource = "simulated"\nsimulated_seed = 7\n[ledger]\npath = "{ledger}"\n',
    )
    _, problems = check_settings(cfg)
    assert [p.field for p in problems] == ["ledger.session_cap"]  # no cap would refill


def test_run_refuses_the_same_things_at_startup(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "run", "--config", str(path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == ExitCode.ERROR
    _, problems = check_settings(path)
    assert out.stderr.splitlines() == [f"gazeguard run: error: {p}" for p in problems]
    assert not (tmp_path / "gazeguard-ledger.sqlite").exists()  # refused before anything opened


def test_serve_checks_the_settings_before_opening_anything(tmp_path: Path) -> None:
    settings = Settings(
        mechanism={"features": ["fixation_rat", "saccade_rat"]},
        ledger={"path": tmp_path / "l.sqlite"},
    )
    assert len(validate_settings(settings)) == 2
    with pytest.raises(ConfigError, match=r"fixation_rat.*fixation_rate.*and 1 more"):
        require_valid(settings)
    assert not (tmp_path / "l.sqlite").exists()


SHIPPED = sorted((REPO / "deploy" / "config").glob("*.toml"))
STATE_DIR = Path("/var/lib/gazeguard")  # every shipped config's ledger; systemd's StateDirectory=


def test_defaults_and_every_shipped_example_are_clean(tmp_path: Path) -> None:
    """Each shipped config passes, or (where its ledger directory does not exist or is not
    writable, as on a host without the systemd unit) says only which directory to create."""
    assert validate_settings(Settings()) == []
    ready = os.access(STATE_DIR, os.W_OK | os.X_OK)
    for path in SHIPPED:
        settings, problems = check_settings(path)
        assert settings is not None
        assert settings.ledger.path == STATE_DIR / "ledger.sqlite"
        if ready:
            assert problems == [], path
        else:
            (problem,) = problems
            assert problem.field == "ledger.path"
            assert f"directory {STATE_DIR} " in problem.reason
        moved = {"ledger": {"path": tmp_path / "l.sqlite"}}
        assert check_settings(path, **moved)[1] == [], path  # nothing else


def _check_and_run(
    config: Path, cwd: Path, prefix: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = str(REPO)
    check, run = (
        subprocess.run(
            [*prefix, sys.executable, "-m", "gazeguard", *args, str(config)],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=60,
            check=False,
            env=env,
        )
        for args in (["config", "check"], ["run", "--duration", "1", "--config"])
    )
    return check, run


def _agree(check: subprocess.CompletedProcess[str], run: subprocess.CompletedProcess[str]) -> str:
    """Both refuse, with the same problems; the problems' text."""
    assert check.returncode == ExitCode.ERROR, check.stderr
    assert run.returncode == ExitCode.ERROR, run.stderr
    said = [ln.split(": ", 1)[1] for ln in check.stderr.splitlines() if "invalid value" in ln]
    assert said, check.stderr
    refused = run.stderr.splitlines()
    assert refused[0].startswith("gazeguard run: error: "), run.stderr
    assert refused[0].removeprefix("gazeguard run: error: ").split(" (and ")[0] == said[0]
    return "\n".join(said)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_config_check_and_run_agree_on_every_shipped_config(path: Path, tmp_path: Path) -> None:
    """Found 2: `config check deploy/config/simulated.toml` said OK, then `run` with it failed:
    "cannot open ledger '/var/lib/gazeguard/ledger.sqlite': directory … does not exist"."""
    if os.access(STATE_DIR, os.W_OK | os.X_OK):
        pytest.skip(f"{STATE_DIR} exists and is writable here: both accept (test_deploy runs it)")
    check, run = _check_and_run(path, tmp_path)
    said = _agree(check, run)
    assert f"directory {STATE_DIR} does not exist: create it" in said
    assert "Traceback" not in run.stderr


def test_config_check_and_run_agree_on_a_missing_ledger_directory(tmp_path: Path) -> None:
    config = write(tmp_path, f'[ledger]\npath = "{tmp_path / "absent" / "l.sqlite"}"\n')
    check, run = _check_and_run(config, tmp_path)
    said = _agree(check, run)
    assert f"directory {tmp_path / 'absent'} does not exist: create it" in said
    assert not (tmp_path / "absent").exists()


def test_config_check_and_run_agree_on_an_unwritable_ledger_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    config = write(tmp_path, f'[ledger]\npath = "{locked / "l.sqlite"}"\n')
    locked.chmod(0o500)
    # root writes anything: check and run as root without capabilities (no CAP_DAC_OVERRIDE)
    no_caps = ("setpriv", "--bounding-set=-all", "--inh-caps=-all", "--")
    prefix = no_caps if os.geteuid() == 0 else ()
    try:
        check, run = _check_and_run(config, tmp_path, prefix)
    finally:
        locked.chmod(0o755)
    said = _agree(check, run)
    assert f"directory {locked} is not writable by user" in said
    assert not (locked / "l.sqlite").exists()


def test_mechanism_parameters_are_checked_as_the_pipeline_builds_them() -> None:
    settings = Settings(mechanism={"k": 17, "chunk_steps": 32, "transform": "dft"})
    (problem,) = validate_settings(settings)
    assert problem.field == "mechanism.k"
    assert problem.value == 17


def test_feature_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "features", "--json"]) == ExitCode.OK
    names = [f["name"] for f in json.loads(capsys.readouterr().out)]
    assert len(names) == 48
    assert "fixation_rate" in names


@pytest.mark.parametrize("name", ["ab\x01cd", "x\x85y", "\ufffe", "a\udcffb", "a/b", "x" * 10_000])
def test_names_that_brokers_refuse_in_topics_are_refused_at_startup(name: str) -> None:
    """Issue 15.1: such a session once charged 34 chunks that no broker would take."""
    _, problems = check_settings(None, session=name)
    assert [p.field for p in problems] == ["session"]
    assert len(str(problems[0])) < 400  # a 10 kB name does not bury the reason


def test_a_file_that_is_not_a_ledger_is_a_problem_named_by_its_path(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    ledger.write_bytes(b"not a database, " * 64)
    config = write(tmp_path, f'session = "s1"\n[ledger]\npath = "{ledger}"\n', "c.toml")
    _, problems = check_settings(config)
    assert [p.field for p in problems] == ["ledger.path"]
    assert f"cannot read the ledger {ledger}" in problems[0].reason
