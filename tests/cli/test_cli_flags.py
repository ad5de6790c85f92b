"""The settings flags of ``run``, ``demo`` and ``plan``, generated from the settings schema.

Every flag the CLI had keeps its name, short alias and meaning (the nested settings it sets are
pinned below); ``--help`` shows each flag's setting, default, unit and choices, grouped by
section; a setting added to :data:`gazeguard.cli.flags.FLAGS` needs no other CLI edit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from gazeguard.cli import ExitCode, build_parser, main
from gazeguard.cli import flags as flags_module
from gazeguard.cli.flags import FLAGS, SHORTCUTS, Flag, settings_overrides
from gazeguard.config import LabelSettings, Settings

#: The flags `run`, `demo` and `plan` took before they were generated (their names are in the
#: docs, the tests and people's scripts).
SETTINGS_FLAGS = {
    "--config", "--device", "--session", "--source", "--stream-type", "--stream-name",
    "--source-id", "--stream-host", "--stream-rate", "--mechanism", "--transform",
    "--chunk-steps", "-k", "--k", "--epsilon", "--features", "--profile", "--labels",
    "--label-release", "--decision-s", "--label-epsilon", "--label-share",
    "--cohort", "--bucket-s", "--cohort-share", "--cohort-model", "--cohort-release",
    "--attention-aois", "--window-s", "--step-s", "--ledger", "--budget-per-hour",
    "--session-cap", "--broker", "--metrics-port", "--fleet",
}  # fmt: skip


def overrides(*argv: str, command: str = "run") -> dict[str, Any]:
    """The nested settings ``gazeguard COMMAND ARGV`` sets."""
    return settings_overrides(build_parser(command).parse_args([command, *argv]))


@pytest.mark.parametrize("command", ["run", "demo", "plan"])
def test_every_flag_keeps_its_name(command: str) -> None:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = {o for a in sub.choices[command]._actions for o in a.option_strings}
    assert names >= SETTINGS_FLAGS


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {}),
        (
            ["--device", "d1", "--session", "s1", "--source", "lsl", "--stream-type", "EEG",
             "--stream-name", "N", "--source-id", "lab-*", "--stream-host", "h*",
             "--stream-rate", "250"],
            {"device": "d1", "session": "s1", "ingest": {
                "source": "lsl", "stream_type": "EEG", "stream_name": "N", "source_id": "lab-*",
                "stream_host": "h*", "rate_hz": 250.0}},
        ),
        (
            ["--mechanism", "lpa", "--transform", "dct", "--chunk-steps", "64", "-k", "5",
             "--epsilon", "0.5", "--features", "a, b,,c", "--profile", "activity"],
            {"mechanism": {"name": "lpa", "transform": "dct", "chunk_steps": 64, "k": "5",
                           "epsilon": 0.5, "features": ["a", "b", "c"], "profile": "activity"}},
        ),
        (["--k", "auto", "--features", ""], {"mechanism": {"k": "auto"}}),
        (["--labels"], {"labels": {"enabled": True, "model": LabelSettings().model}}),
        (
            ["--labels", "m.json", "--label-release", "clock", "--decision-s", "60",
             "--label-epsilon", "2", "--label-share", "0.3"],
            {"labels": {"enabled": True, "model": "m.json", "release": "clock",
                        "decision_s": 60.0, "epsilon": 2.0, "budget_share": 0.3}},
        ),
        (  # retired: passed on so that the settings refuse it with the reason
            ["--label-release", "change"],
            {"labels": {"release": "change"}},
        ),
        (
            ["--cohort", "lab", "--bucket-s", "10", "--cohort-share", "0.4", "--cohort-model",
             "activity", "--cohort-release", "mode, means", "--attention-aois", "a.json"],
            {"cohort": {"enabled": True, "name": "lab", "bucket_s": 10.0, "budget_share": 0.4,
                        "model": "activity", "release": ["mode", "means"],
                        "attention_aois": "a.json"}},
        ),
        (["--cohort", "", "--cohort-release", ""], {}),
        (
            ["--window-s", "2", "--step-s", "0.25", "--ledger", "l.sqlite", "--budget-per-hour",
             "none", "--session-cap", "4"],
            {"features": {"window_s": 2.0, "step_s": 0.25}, "ledger": {
                "path": "l.sqlite", "url": None, "budget_per_hour": None, "session_cap": 4.0}},
        ),
        (
            ["--ledger", "postgresql://u@h/db", "--budget-per-hour", "3"],
            {"ledger": {"url": "postgresql://u@h/db", "budget_per_hour": 3.0}},
        ),
        (
            ["--budget-per-hour", "OFF", "--broker", "example.org:1884", "--metrics-port", "0",
             "--fleet"],
            {"ledger": {"budget_per_hour": None}, "broker": {"host": "example.org",
             "port": "1884"}, "metrics": {"port": 0}, "fleet": {"enabled": True}},
        ),
        (["--broker", "example.org", "--config", "x.toml"], {"broker": {"host": "example.org"}}),
    ],
)  # fmt: skip
def test_flags_set_the_settings_they_always_set(argv: list[str], expected: dict[str, Any]) -> None:
    for command in ("run", "demo", "plan"):
        assert overrides(*argv, command=command) == expected


def test_the_settings_take_what_the_flags_set() -> None:
    set_ = overrides(
        "--stream-rate", "90", "--window-s", "4", "--chunk-steps", "16", "-k", "3",
        "--budget-per-hour", "none", "--labels", "--decision-s", "30", "--cohort-release",
        "means,mode", "--fleet", "--metrics-port", "9100",
    )  # fmt: skip
    s = Settings(**set_)
    assert (s.ingest.rate_hz, s.features.window_s, s.mechanism.chunk_steps) == (90.0, 4.0, 16)
    assert (s.mechanism.k, s.ledger.budget_per_hour, s.labels.enabled) == (3, None, True)
    assert (s.labels.decision_s, s.cohort.release) == (30.0, ["means", "mode"])
    assert (s.fleet.enabled, s.metrics.port) == (True, 9100)


def test_bad_values_are_usage_errors_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--budget-per-hour", "lots"], ["--window-s", "x"], ["--source", "usb"],
                 ["--mechanism", "fpa"], ["--label-release", "sometimes"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            overrides(*argv)
        assert exit_.value.code == 2
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_help_shows_setting_default_unit_and_choices_by_section(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # one line per flag: no words broken at a hyphen
    with pytest.raises(SystemExit):
        build_parser("run").parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "--window-s SECONDS window length W, s [features.window_s; default 30 s]" in text
    assert "--budget-per-hour EPS|none user-level ε" in text
    assert "[ledger.budget_per_hour; 'none': unset; default 10]" in text
    assert "--source {auto,lsl,simulated,jetstream}" in text
    assert "--mechanism {lpa,cfpa,dcfpa,auto}" in text
    assert "--stream-rate HZ" in text
    assert "[cohort.release; comma-separated: means, shares, attention, aois, mode]" in text
    assert "-k K|auto, --k K|auto" in text
    for section in ("ingest", "features", "mechanism", "ledger", "broker", "fleet", "labels",
                    "cohort", "metrics"):  # fmt: skip
        assert f"[{section}] " in text
    for flag in FLAGS:  # each generated flag names its setting
        assert f"[{flag.setting}" in text


def test_every_flag_names_a_setting_with_a_flag_form() -> None:
    for flag in FLAGS:
        assert flags_module._argument(flag)["help"]
    assert len({f.setting for f in FLAGS}) == len(FLAGS)
    names = [n for f in FLAGS for n in f.names] + [s.name for s in SHORTCUTS]
    assert len(set(names)) == len(names)
    with pytest.raises(TypeError, match="no flag form"):
        flags_module._argument(Flag("ingest.field_of_view_deg", ("--fov",)))
    with pytest.raises(KeyError):
        flags_module._argument(Flag("ingest.no_such_setting", ("--nope",)))


def test_a_new_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag added to the table parses, converts, shows its choices and reaches the settings,
    with no other CLI edit."""
    added = (
        Flag("ingest.simulated_rate_hz", ("--sim-rate",)),
        Flag("ingest.preset", ("--preset",)),
        Flag("ingest.dejitter", ("--dejitter",)),
        Flag("ledger.composition", ("--composition",)),
    )
    monkeypatch.setattr(flags_module, "FLAGS", (*FLAGS, *added))
    argv = ["--sim-rate", "60", "--preset", "tobii", "--dejitter", "--composition", "sequential"]
    got = overrides(*argv)
    assert got == {
        "ingest": {"simulated_rate_hz": 60.0, "preset": "tobii", "dejitter": True},
        "ledger": {"composition": "sequential"},
    }
    s = Settings(**got)
    assert (s.ingest.preset, s.ledger.composition) == ("tobii", "sequential")
    with pytest.raises(SystemExit):
        overrides("--preset", "nope")


def test_retired_values_are_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--label-release change` reaches the settings, which say why."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--label-release", "change"]) == ExitCode.ERROR
    assert "'change' was retired" in capsys.readouterr().err
    assert main(["plan", "--json", "--budget-per-hour", "4", "--chunk-steps", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_per_hour"] == 4.0
