"""The composition cache on disk: a restart computes nothing and imports no SciPy (pyFFTW's SciPy
drop-ins are not loaded); no plan of Laplace releases imports dp-accounting or scipy.signal, even
when it computes (a device's first start); a kept ratio is checked; and a tampered cache (entries
lowered, moved to another key, or written under another key) changes neither the noise, nor the
plan's figures, nor what a ledger charges: its entries are refused, named in a warning, and
computed anew, exactly as in an empty cache. Real files throughout."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gazeguard.core.errors import BudgetExhaustedError
from gazeguard.ledger import Ledger
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
print(json.dumps({
    "text": plan.text(), "heavy": heavy, "computed": computed, "fftw": fftw,
    "noise": plan.mechanism.noise_multiplier.tolist(), "figures": plan.figures(),
}))
"""


def build_plan(cache_dir: Path | str, key: Path | None = None) -> dict[str, object]:
    """The default plan built in a new process on ``cache_dir`` (``key``: the key file, by default
    ``key`` beside the directory); ``log`` is what it logged."""
    where = Path(cache_dir).parent if key is None and cache_dir != "off" else Path(".")
    env = {**os.environ, disk.ENV: str(cache_dir), disk.KEY_ENV: str(key or where / "key")}
    out = subprocess.run(
        [sys.executable, "-c", PLAN],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout)
    result["log"] = out.stderr
    return result


def tamper(path: Path, *, divide: float = 10.0, secret: bytes | None = None) -> int:
    """Lower every kept ε and ratio ``divide``-fold, and copy each composition that holds a kept
    ratio to the key of that ratio lowered, with the honest ratio's ε: the lowered ratio then
    passes the calibration's check (how the audit cut the noise multiplier from 56.76 to 5.68).
    With ``secret``, every entry gets a valid code under that other key; without, the codes stay
    as they were. Returns how many entries the file then holds."""
    data = json.loads(path.read_text())
    entries: dict[str, list[object]] = data["entries"]
    out = {k: [float(v[0]) / divide, *v[1:]] for k, v in entries.items()}  # type: ignore[arg-type]
    for k, v in entries.items():
        if k.startswith("ratio:"):
            kept = float(v[0])  # type: ignore[arg-type]
            for k2, v2 in entries.items():
                if not k2.startswith("ratio:") and repr(kept) in k2:
                    out[k2.replace(repr(kept), repr(kept / divide))] = v2
    if secret is not None:
        out = {k: [*v[:-1], disk._code(secret, k, v[:-1])] for k, v in out.items()}
    data["entries"] = out
    path.write_text(json.dumps(data))
    return len(out)


@pytest.mark.slow
def test_a_restart_computes_nothing_and_a_laplace_plan_imports_no_dp_accounting(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    first = build_plan(cache)
    assert first["computed"] > 0
    # Laplace PMFs and their convolutions are NumPy's; SciPy (special) only for the Gaussian
    # starting point of the Laplace calibration
    assert first["heavy"] == ["scipy"]
    assert len(list(cache.glob("compositions-*.json"))) == 1
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o600
    second = build_plan(cache)
    assert second["computed"] == 0
    assert second["heavy"] == []
    assert second["fftw"]
    assert second["text"] == first["text"]  # the same plan, figure for figure
    off = build_plan("off")  # no disk cache: computed again, the same figures
    assert off["text"] == first["text"]
    assert off["computed"] == first["computed"]


@pytest.mark.slow
def test_a_tampered_cache_gives_the_plan_of_an_empty_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    honest = build_plan(cache)
    (path,) = cache.glob("compositions-*.json")
    tamper(path)
    tampered = build_plan(cache)
    # the same noise multiplier, the same figures, the same banner as an empty cache
    assert tampered["noise"] == honest["noise"]
    assert tampered["figures"] == honest["figures"]
    assert tampered["text"] == honest["text"]
    assert tampered["computed"] == honest["computed"]  # everything refused: computed anew
    log = str(tampered["log"])
    assert f"composition cache {path}: " in log
    assert "entries REFUSED: their authentication code does not match" in log
    # what was computed anew replaced what was refused: the next start computes nothing
    again = build_plan(cache)
    assert again["computed"] == 0
    assert again["text"] == honest["text"]
    assert "REFUSED" not in str(again["log"])
    # the whole file as another key's process would have written it: refused too
    tamper(path, secret=os.urandom(disk.KEY_BYTES))
    other = build_plan(cache)
    assert other["noise"] == honest["noise"]
    assert other["figures"] == honest["figures"]
    assert other["computed"] == honest["computed"]
    assert "REFUSED" in str(other["log"])


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(disk.ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(disk.KEY_ENV, str(tmp_path / "key"))
    cache_clear()
    yield tmp_path / "cache"
    cache_clear()


# A chunk of 48 features at noise multiplier 57 (about the default plan's), one every 16 s of
# gaze, against a session cap of ε 3 at δ 1e-6: 28 chunks fit.
RATIO = 57.0
COST = {f"f{i}": LaplaceEvent(RATIO) for i in range(48)}


def charge_until_refused(path: Path, chunks: int = 40) -> tuple[int, float, float]:
    """Charge chunks on a new ledger until its cap refuses one: how many were charged, and the
    session's ε and ε per hour as the ledger then states them."""
    charged = 0
    with Ledger(path, session_cap=3.0) as ledger:
        for i in range(chunks):
            gaze = (1.75e9 + 16.0 * i, 1.75e9 + 16.0 * i + 15.5)
            try:
                ledger.charge("s", i, COST, "t", b"x", gaze=gaze)
            except BudgetExhaustedError:
                break
            charged += 1
        state = ledger.state("s")
    return charged, state.epsilon, state.epsilon_window


def reopened(path: Path) -> tuple[float, float]:
    """A ledger's session ε and ε per hour as a new process reopening it states them."""
    cache_clear(disk_too=False)
    with Ledger(path, session_cap=3.0) as ledger:
        state = ledger.state("s")
    return state.epsilon, state.epsilon_window


def test_a_tampered_cache_changes_no_charge_and_no_spent_epsilon(
    own_cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gazeguard.privacy.accounting")
    # an empty cache: what the ledger charges and states
    honest = charge_until_refused(tmp_path / "honest.sqlite")
    assert 10 < honest[0] < 40
    spent = reopened(tmp_path / "honest.sqlite")
    assert spent == honest[1:]
    disk.flush()
    (path,) = own_cache.glob("compositions-*.json")
    # every kept ε divided by 10 (the audit: a reopened ledger stated 0.298 where 2.978 was spent)
    assert tamper(path) > 0
    assert reopened(tmp_path / "honest.sqlite") == spent
    assert f"composition cache {path}: " in caplog.text
    assert "entries REFUSED" in caplog.text
    # a new ledger on the tampered cache admits and states exactly what an empty one does
    disk.flush()
    tamper(path)
    cache_clear(disk_too=False)
    assert charge_until_refused(tmp_path / "tampered.sqlite") == honest
    # and so on entries written under another key
    disk.flush()
    tamper(path, secret=os.urandom(disk.KEY_BYTES))
    assert reopened(tmp_path / "honest.sqlite") == spent
    cache_clear(disk_too=False)
    assert charge_until_refused(tmp_path / "other-key.sqlite") == honest
    # the same, computed again from nothing
    cache_clear()
    assert charge_until_refused(tmp_path / "empty.sqlite") == honest


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


def test_a_changed_ratio_is_refused_and_a_malformed_file_is_ignored(
    own_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kept noise ratio changed in the file fails its authentication (and would fail the
    calibration's own check against the budget): it is computed anew."""
    budget = PrivacyLoss.approx(10.0, 1e-6)
    honest = calibrate("laplace", 11_040, budget)
    disk.flush()
    (path,) = own_cache.glob("compositions-*.json")
    data = json.loads(path.read_text())
    ratios = [k for k in data["entries"] if k.startswith("ratio:")]
    assert len(ratios) == 1
    data["entries"][ratios[0]][0] = honest / 2.0  # less noise than the budget allows
    composition = next(k for k in data["entries"] if not k.startswith("ratio:"))
    data["entries"][composition][-1] = "é" * 64  # a code that is not even ASCII
    data["entries"]["[nonsense"] = [-1.0, "pld", None, "00"]  # ε < 0: dropped on load
    path.write_text(json.dumps(data))
    cache_clear(disk_too=False)
    with caplog.at_level(logging.WARNING, logger="gazeguard.privacy.accounting"):
        assert calibrate("laplace", 11_040, budget) == honest
    assert f"composition cache {path}: 2 of " in caplog.text
    assert f"composition cache {path}: 1 malformed entries ignored" in caplog.text
    path.write_text("{not json")
    cache_clear(disk_too=False)
    assert calibrate("laplace", 11_040, budget) == honest


def test_entries_of_another_key_are_refused(
    own_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cache file written by a process with another key (another user, another machine, a
    copied cache directory) is refused whole, then replaced by entries under this key."""
    counts = {LaplaceEvent(57.0): 11_040}
    honest = compose(counts, 1e-6).epsilon
    disk.flush()
    (path,) = own_cache.glob("compositions-*.json")
    monkeypatch.setenv(disk.KEY_ENV, str(tmp_path / "another-key"))
    cache_clear(disk_too=False)
    with caplog.at_level(logging.WARNING, logger="gazeguard.privacy.accounting"):
        assert compose(counts, 1e-6).epsilon == honest
    assert f"composition cache {path}: 1 of 1 entries REFUSED" in caplog.text
    assert str(tmp_path / "another-key") in caplog.text
    disk.flush()
    cache_clear(disk_too=False)
    caplog.clear()
    assert compose(counts, 1e-6).epsilon == honest  # now read, under the other key
    assert "REFUSED" not in caplog.text


@pytest.mark.parametrize("how", ["readable by others", "a symlink", "not a key"])
def test_an_untrustworthy_key_file_means_no_disk_cache(
    own_cache: Path, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = tmp_path / "key"
    if how == "readable by others":
        key.write_text(os.urandom(disk.KEY_BYTES).hex() + "\n")
        key.chmod(0o644)
    elif how == "a symlink":
        target = tmp_path / "known"
        target.write_text(os.urandom(disk.KEY_BYTES).hex() + "\n")
        target.chmod(0o600)
        key.symlink_to(target)
    else:
        key.write_text("not hex\n")
        key.chmod(0o600)
    counts = {LaplaceEvent(40.0): 500}
    with caplog.at_level(logging.WARNING, logger="gazeguard.privacy.accounting"):
        eps = compose(counts, 1e-6).epsilon
        disk.flush()
    assert eps > 0
    assert f"composition cache not used: its key file {key} cannot be" in caplog.text
    assert not list(own_cache.glob("compositions-*.json"))  # nothing kept, nothing read


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
