"""`gazeguard demo` end to end: simulated headset, service, embedded broker, live view, PNG."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.network
def test_demo_shows_chunks_arriving_and_writes_the_plot(tmp_path: Path) -> None:
    png = tmp_path / "demo.png"
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "demo", "--duration", "9", "--window-s", "2",
         "--step-s", "0.05", "--out", str(png)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    chunk_lines = re.findall(r"^chunk +(\d+) ε=96 ", out.stdout, flags=re.MULTILINE)
    assert len(chunk_lines) >= 3, out.stdout
    assert chunk_lines == [str(i) for i in range(len(chunk_lines))]
    summary = re.search(r"(\d+) chunks privatized and charged, (\d+) received", out.stdout)
    assert summary is not None, out.stdout
    assert summary.group(1) == summary.group(2) == str(len(chunk_lines))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    assert "status: stopped" in out.stdout
