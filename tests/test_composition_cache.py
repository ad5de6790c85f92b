"""The composition cache on disk: a restart computes nothing and imports no SciPy (pyFFTW's SciPy
drop-ins are not loaded); no plan of Laplace releases imports dp-accounting or scipy.signal, even
when it computes (a device's first start); a kept ratio is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gazeguard.privacy.accounting import LaplaceEvent, PrivacyLoss, cache_clear, calibrate, compose
from gazeguard.privacy.accounting import cache as disk

# The default plan, its banner text, how many PLD curves building it computed and which heavy
# modules it imported.
PLAN = """
import hashlib, json, sys
from gazeguard.config import Settings
from gazeguard.plan import ReleasePlan
from gazeguard.privacy.accounting import accountant
plan = ReleasePlan.from_settings(Settings())
import gazeguard.runtime.service  # everything a sidecar imports before its plan
heavy = [m for m in ("dp_accounting", "scipy.signal", "scipy") if m in sys.modules]
computed = accountant._curve.cache_info().misses
fftw = "pyfftw" in sys.modules
import scipy.fftpack  # hidden from pyFFTW only while it imported
print(json.dumps({"text": plan.text(), "heavy": heavy, "computed": computed, "fftw": fftw}))
"""


def build_plan(cache_dir: Path | str) -> dict[str, object]:
    env = {**os.environ, disk.ENV: str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", PLAN],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.slow
def test_a_restart_computes_nothing_and_a_laplace_plan_imports_no_dp_accounting(
    tmp_path: Path,
) -> None:
    first = build_plan(tmp_path)
    assert first["computed"] > 0
    # Laplace PMFs and their convolutions are NumPy's; SciPy (special) only for the Gaussian
    # starting point of the Laplace calibration
    assert first["heavy"] == ["scipy"]
    assert len(list(tmp_path.glob("compositions-*.json"))) == 1
    second = build_plan(tmp_path)
    assert second["computed"] == 0
    assert second["heavy"] == []
    assert second["fftw"]
    assert second["text"] == first["text"]  # the same plan, figure for figure
    off = build_plan("off")  # no disk cache: computed again, the same figures
    assert off["text"] == first["text"]
    assert off["computed"] == first["computed"]


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(disk.ENV, str(tmp_path))
    cache_clear()
    yield tmp_path
    cache_clear()


def test_a_kept_composition_is_the_computed_one(own_cache: Path) -> None:
    counts = {LaplaceEvent(57.0): 11_040}
    computed = compose(counts, 1e-6)
    disk.flush()
    (path,) = own_cache.glob("compositions-*.json")
    cache_clear(disk_too=False)  # a new process's view: the in-memory caches empty, the file kept
    kept = compose(counts, 1e-6)
    assert kept is not computed
    assert (kept.epsilon, kept.method, kept.interval) == (
        computed.epsilon,
        computed.method,
        computed.interval,
    )
    assert kept.epsilon_at(1e-5) == computed.epsilon_at(1e-5)  # its curve, computed on demand
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_kept_ratio_is_used_only_if_it_fits_and_a_malformed_file_is_ignored(
    own_cache: Path,
) -> None:
    """The file is trusted for compositions (like the ledger file, it lives with the service
    user), but a kept noise ratio is checked against the budget before it is used."""
    budget = PrivacyLoss.approx(10.0, 1e-6)
    honest = calibrate("laplace", 11_040, budget)
    disk.flush()
    (path,) = own_cache.glob("compositions-*.json")
    data = json.loads(path.read_text())
    ratios = [k for k in data["entries"] if k.startswith("ratio:")]
    assert len(ratios) == 1
    data["entries"][ratios[0]][0] = honest / 2.0  # less noise than the budget allows
    data["entries"]["[nonsense"] = [-1.0, "pld", None]  # ε < 0: dropped on load
    path.write_text(json.dumps(data))
    cache_clear(disk_too=False)
    assert calibrate("laplace", 11_040, budget) == honest
    path.write_text("{not json")
    cache_clear(disk_too=False)
    assert calibrate("laplace", 11_040, budget) == honest


def test_an_unwritable_directory_only_means_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(disk.ENV, str(blocker / "cache"))  # a directory below a file: never made
    cache_clear()
    try:
        eps = compose({LaplaceEvent(40.0): 500}, 1e-6).epsilon
        disk.flush()
        assert eps > 0
        assert not (blocker / "cache").exists()
    finally:
        monkeypatch.delenv(disk.ENV)
        cache_clear()
