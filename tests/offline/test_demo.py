"""`gazeguard demo` end to end: simulated headset, service, embedded broker, live view, PNG."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gazeguard.cli import ExitCode
from gazeguard.config import Settings
from gazeguard.offline.demo import DEMO_DEFAULTS, Trace, caption, demo_changes, plot
from tests.cli.test_cli import Proc


@pytest.mark.slow
@pytest.mark.network
def test_demo_shows_chunks_arriving_and_writes_the_plot(tmp_path: Path) -> None:
    png = tmp_path / "demo.png"
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "demo", "--duration", "12", "--window-s", "2",
         "--step-s", "0.05", "--out", str(png)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr  # issue 35.4: the end of the run ended in one
    assert "live view" not in out.stderr  # (the view lost the broker the run took with it)
    chunk_lines = re.findall(r"^chunk +(\d+) ε=96 ", out.stdout, flags=re.MULTILINE)
    assert len(chunk_lines) >= 3, out.stdout
    assert chunk_lines == [str(i) for i in range(len(chunk_lines))]
    summary = re.search(r"(\d+) chunks privatized and charged, (\d+) received", out.stdout)
    assert summary is not None, out.stdout
    assert summary.group(1) == summary.group(2) == str(len(chunk_lines))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    assert "status: stopped" in out.stdout
    # The banner says what differs from `gazeguard run` and why (the flags given here included).
    assert "This is `gazeguard run` with these changes" in out.stdout
    assert re.search(r"features\.window_s +2 s \(your flag\) \(run: 30 s\)", out.stdout)
    assert re.search(
        r"mechanism\.epsilon +24 per feature per chunk \(run: noise calibrated to ε 10 per hour "
        r"of gaze\) — .* per hour of gaze",
        out.stdout,
    )
    assert re.search(r"ledger\.budget_per_hour +none \(run: 10\)", out.stdout)
    assert re.search(r"mechanism\.features +4 features \(run: all 48\)", out.stdout)
    assert re.search(r"ingest\.source +simulated \(run: auto\)", out.stdout)


@pytest.mark.slow
@pytest.mark.network
def test_ctrl_c_in_the_demo_still_writes_the_plot(tmp_path: Path) -> None:
    """Issue 35.4: Ctrl-C in `demo` ended in a traceback and wrote no PNG. Now: one line, the
    PNG of the chunks shown so far, exit status 130."""
    png = tmp_path / "demo.png"
    demo = Proc(
        "demo", "--duration", "120", "--window-s", "2", "--step-s", "0.05", "--out", str(png),
        cwd=tmp_path,
    )  # fmt: skip
    demo.wait_for(r"^chunk +1 ε=96 ")
    code, text = demo.finish(signal.SIGINT)
    assert code == ExitCode.INTERRUPTED, text
    assert "Traceback" not in text
    assert "gazeguard demo: interrupted (Ctrl-C)\n" in text
    summary = re.search(r"(\d+) chunks privatized and charged, (\d+) received", text)
    assert summary is not None, text
    assert int(summary.group(1)) >= 2
    assert f"plot written to {png}" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def demo_settings(**flags: object) -> Settings:
    """The demo's settings as `gazeguard demo` builds them (no flags: its own defaults)."""
    values = {**DEMO_DEFAULTS, **flags, "ledger.path": "/tmp/demo.sqlite"}
    nested: dict[str, Any] = {}
    for name, value in values.items():
        *sections, key = name.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return Settings(**nested)


def test_demo_names_every_change_from_run_with_its_reason() -> None:
    changes = {c.setting: c for c in demo_changes(demo_settings())}
    assert set(changes) == {
        "ingest.source",
        "features.window_s",
        "features.step_s",
        "mechanism.features",
        "mechanism.epsilon",
        "ledger.budget_per_hour",
        "ledger.path",
        "broker.port",
        "ingest.late_after_s",
    }
    w, s, e = changes["features.window_s"], changes["features.step_s"], changes["mechanism.epsilon"]
    assert (w.value, w.run_value) == ("10 s", "30 s")
    assert "first chunk after 13.2 s of gaze instead of 46 s" in w.why
    assert (s.value, s.run_value) == ("0.1 s × 32 steps", "0.5 s × 32 steps")
    assert "every 3.2 s instead of every 16 s" in s.why
    assert (e.value, e.run_value) == (
        "24 per feature per chunk",
        "noise calibrated to ε 10 per hour of gaze",
    )
    assert "A chunk costs pure ε 96, 1.08e+05 per hour of gaze" in e.why
    assert changes["mechanism.features"].run_value == "all 48"
    assert all(c.by == "demo" for c in changes.values())
    flagged = demo_changes(demo_settings(**{"features.window_s": 2.0}), flags=frozenset(
        {"features.window_s"}
    ))  # fmt: skip
    assert {c.setting: c.by for c in flagged}["features.window_s"] == "flag"
    text = caption(list(changes.values()))
    for c in changes.values():
        assert f"{c.setting} {c.value} (run: {c.run_value})" in text


def test_the_png_carries_the_caption(tmp_path: Path) -> None:
    n = 32
    trace = Trace(
        names=["fixation_rate"],
        units=["1/s"],
        t=[np.arange(n) * 0.1],
        raw=[np.full((1, n), 2.0)],
        released=[np.full((1, n), 2.5)],
        epsilon=24.0,
        mechanism="dcfpa/dft",
    )
    bare = plot(trace, tmp_path / "bare.png")
    noted = plot(trace, tmp_path / "noted.png", caption(demo_changes(demo_settings())))
    height = [int.from_bytes(p.read_bytes()[20:24], "big") for p in (bare, noted)]
    assert height[1] > height[0]  # the caption adds lines below the plots


def test_the_caption_says_only_each_ramps_end_carries_information() -> None:
    """The PNG drew DCFPA's chunks as red ramps beside flat raw lines and never said that only
    a ramp's end is released information; its caption now says so first."""
    from gazeguard.offline.demo import how_to_read  # noqa: PLC0415
    from gazeguard.privacy.mechanisms.registry import mechanism_kind  # noqa: PLC0415

    dcfpa = Trace(mechanism="dcfpa/dft", carries=mechanism_kind("dcfpa").carries("dft", 1, 32))
    text = how_to_read(dcfpa)
    assert "each red ramp is one chunk" in text
    assert "only the ramp's end carries information" in text
    assert "never published" in text
    lpa = Trace(mechanism="lpa/dft", carries=mechanism_kind("lpa").carries("dft", 1, 32))
    assert "ramp" not in how_to_read(lpa)
    assert "32 values per feature per chunk" in how_to_read(lpa)
