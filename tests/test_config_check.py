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

REPO = Path(__file__).resolve().parent.parent

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


def test_defaults_and_every_shipped_example_are_clean() -> None:
    assert validate_settings(Settings()) == []
    for path in sorted((REPO / "deploy" / "config").glob("*.toml")):
        settings, problems = check_settings(path)
        assert settings is not None
        assert problems == [], path


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
