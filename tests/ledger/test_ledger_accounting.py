"""The ledger on the user-level accountant: caps in ε at δ over stored events, calibration to a
budget per hour, restart and backend independence (real SQLite files and PostgreSQL)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.config import FeatureSettings, MechanismSettings
from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import Ledger, LedgerError, event_key
from gazeguard.ledger._compose import LedgerComposer, report_count
from gazeguard.plan import ReleasePlan, chunks_per_hour
from gazeguard.plan.chunks import noise_multiplier_for
from gazeguard.privacy.accounting import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PrivacyLoss,
    PureEvent,
    RandomizedResponseEvent,
    capacity,
    compose,
)
from gazeguard.runtime.pipeline import Pipeline
from gazeguard.runtime.simulate import simulate_gaze
from tests._postgres import pg_server, pg_url  # noqa: F401 - fixtures

DELTA = 1e-6
T0 = 1.75e9


def chunk_events(ratio: float, features: int) -> dict[str, Event]:
    return {f"f{i}": LaplaceEvent(ratio) for i in range(features)}


def gaze(i: int, chunk_s: float = 16.0) -> tuple[float, float]:
    return T0 + i * chunk_s, T0 + (i + 1) * chunk_s - 0.5


def test_a_window_cap_admits_exactly_what_the_accountant_says(tmp_path: Path) -> None:
    # 48 features, one chunk every 16 s: noise for ε 10 per hour of gaze at δ 1e-6.
    ratio = noise_multiplier_for(
        "laplace", features=48, chunks=225, budget=10.0, delta=DELTA, max_m=0
    )
    assert 50 < ratio < 60  # the "about 56" (pure sequential would need ~1080)
    events = chunk_events(ratio, 48)
    expected = capacity({LaplaceEvent(ratio): 48}, PrivacyLoss.approx(10.0, DELTA))
    assert expected == 225
    # At the declared pace (16 s) the window slides as fast as it fills: every chunk fits.
    with Ledger(tmp_path / "paced.sqlite", window_cap=10.0) as ledger:
        for i in range(240):
            ledger.charge("s", i, events, "t", b"x", gaze=gaze(i))
        assert ledger.state("s").epsilon_window <= 10.0
    # A stream faster than declared (a chunk every 15 s) is cut off at the cap.
    refused = []
    with Ledger(tmp_path / "l.sqlite", window_cap=10.0) as ledger:
        for i in range(240):
            try:
                ledger.charge("s", i, events, "t", b"x", gaze=gaze(i, 15.0))
            except BudgetExhaustedError as exc:
                refused.append(exc.cap)
                ledger.withhold("s", i, events, str(exc))
        state = ledger.state("s")
    assert state.chunks == expected
    assert refused == ["per-3600-s-of-gaze"] * (240 - expected)
    assert state.epsilon_window <= 10.0
    exact = compose({LaplaceEvent(ratio): 48 * 225}, DELTA).epsilon
    rounded = compose({LaplaceEvent(ratio): report_count(48 * 225)}, DELTA).epsilon
    assert exact <= state.epsilon <= rounded < exact * 1.01  # reports round counts up ≤ 1/64
    assert state.spent == pytest.approx(48 * 225 / ratio, rel=1e-4)  # pure: ~20× more
    # A chunk an hour of gaze later fits again: the window slides over gaze time.
    with Ledger(tmp_path / "l.sqlite", window_cap=10.0) as ledger:
        ledger.charge("s", 500, events, "t", b"x", gaze=gaze(500, 15.0))


def test_the_figures_are_recomputed_from_stored_events_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    laplace, gauss = LaplaceEvent(20.0, 1e-9), GaussianEvent(8.0)
    with Ledger(path, session_cap=50.0) as ledger:
        for i in range(30):
            ledger.charge("a", i, dict.fromkeys("abc", laplace), "t", b"x")
            ledger.charge("b", i, dict.fromkeys("fg", gauss), "t", b"y")
        a, b = ledger.state("a"), ledger.state("b")
    with Ledger(path, session_cap=50.0) as ledger:
        assert ledger.state("a").epsilon == a.epsilon
        assert ledger.state("b").epsilon == b.epsilon
    assert a.epsilon == pytest.approx(compose({laplace: 90}, DELTA).epsilon, rel=1e-3)
    assert a.epsilon <= a.spent  # never above pure sequential
    assert b.spent == float("inf")  # Gaussian noise has no pure ε
    assert b.epsilon == pytest.approx(compose({gauss: 60}, DELTA).epsilon, rel=1e-3)
    with closing(sqlite3.connect(path)) as db:
        keys = {json.loads(k)["kind"] for (k,) in db.execute("SELECT key FROM events")}
    assert keys == {"laplace", "gaussian"}


def test_postgresql_gives_the_same_figures(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    events: dict[str, Event] = {
        **{f"f{i}": LaplaceEvent(12.0) for i in range(4)},
        "label": RandomizedResponseEvent(0.2, 6),
    }
    states = []
    for location in (tmp_path / "l.sqlite", pg_url):
        with Ledger(location, session_cap=30.0) as ledger:
            for i in range(25):
                ledger.charge("s", i, events, "t", b"x")
            states.append(ledger.state("s"))
    assert states[0].epsilon == states[1].epsilon
    assert states[0].chunks == states[1].chunks


def test_a_session_opened_sequential_refuses_pld_as_looser(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path, session_cap=5.0, composition="sequential") as ledger:
        ledger.open_session("s")
    with Ledger(path, session_cap=5.0) as ledger, pytest.raises(ConfigError, match="refill"):
        ledger.open_session("s")


def test_an_unreadable_event_key_is_a_ledger_error(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path, session_cap=5.0) as ledger:
        ledger.charge("s", 0, {"f": LaplaceEvent(10.0)}, "t", b"x")
    with closing(sqlite3.connect(path)) as db, db:  # where each copy of the key is read from
        key = json.dumps({'{"kind": "quantum"}': 1})
        db.execute("UPDATE sessions SET counts = ?, gaze_counts = ?, wall_counts = ?", (key,) * 3)
        db.execute('UPDATE events SET key = \'{"kind": "quantum"}\'')
    with Ledger(path, session_cap=5.0) as ledger, pytest.raises(LedgerError, match="quantum"):
        ledger.state("s")


@given(st.integers(0, 10**9))
def test_report_counts_round_up_by_at_most_one_64th(n: int) -> None:
    r = report_count(n)
    assert n <= r <= n + n / 64
    assert report_count(r) == r  # on the grid
    assert report_count(n + 1) >= r  # monotone


# A fleet session's history: chunks (48 Laplace events each) and cohort buckets (a Gaussian).
CHUNK, BUCKET = LaplaceEvent(68.6), GaussianEvent(7.78)


@settings(max_examples=25, deadline=None)
@given(
    chunks=st.integers(0, 300),
    buckets=st.integers(0, 60),
    cost=st.sampled_from([{CHUNK: 48}, {BUCKET: 1}, {CHUNK: 48, BUCKET: 1}]),
    cap=st.sampled_from([2.0, 6.0, 9.0, 10.0]),
)
def test_admission_answers_as_the_exact_capacity_search(
    chunks: int, buckets: int, cost: dict[Any, int], cap: float
) -> None:
    # The composer admits on the report-grid figure when that is within the cap, and asks the
    # capacity search only near it: the answer is the search's on exact counts, either way.
    before = {CHUNK: 48 * chunks, BUCKET: buckets}
    exact = capacity(cost, PrivacyLoss.approx(cap, DELTA), before) >= 1
    keys = {event_key(e): n for e, n in before.items()}
    step = {event_key(e): n for e, n in cost.items()}
    assert LedgerComposer().fits(keys, step, cap, DELTA) is exact


def test_pipeline_calibrates_noise_to_the_budget_and_charges_what_it_reports(
    tmp_path: Path,
) -> None:
    """The in-process API: noise from the ledger's per-hour cap (the plan built from it);
    every message's figures are the ledger's and the plan's; the hour counts every chunk an
    hour of gaze can change (W, s, n, the hold limit and the detector's event reach)."""
    features = FeatureSettings(window_s=2.0, step_s=0.05)
    names = ["fixation_rate", "saccade_rate", "pupil_mean"]
    got = []
    plan = ReleasePlan.build(
        features=features, mechanism=MechanismSettings(features=names), budget=10.0, delta=DELTA
    )
    with Ledger(tmp_path / "l.sqlite", caps=plan.ledger_caps()) as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=120.0, features=features,
            mechanism=MechanismSettings(features=names), on_release=got.append,
        )  # fmt: skip
        chunks = chunks_per_hour(features, 32)
        assert chunks == pipe.plan.chunks.per_hour > 3600 / (32 * 0.05)
        ratio = noise_multiplier_for(
            "laplace", features=3, chunks=chunks, budget=10.0, delta=DELTA,
            slack=float(pipe.mechanism.sampler_slack.max()),
        )  # fmt: skip
        np.testing.assert_allclose(pipe.mechanism.noise_multiplier, ratio)
        assert pipe.plan.per_hour <= 10.0
        g = simulate_gaze(12.0, 120.0, seed=5)
        for start in range(0, len(g), 60):
            pipe.push(g.slice(start, start + 60))
        state = ledger.state("s")
    assert len(got) >= 3
    last = got[-1].message.ledger
    assert last.epsilon == pytest.approx(state.epsilon)
    assert last.window_cap == 10.0
    assert last.window_s == plan.window_s
    assert last.chunks_reached == pipe.plan.chunks.per_sample
    assert last.raw_event_epsilon == pytest.approx(pipe.plan.per_sample)
    assert got[-1].message.mechanism.noise_multiplier == pytest.approx([ratio] * 3)


def test_without_a_budget_or_an_epsilon_the_pipeline_says_what_to_set(tmp_path: Path) -> None:
    with (
        Ledger(tmp_path / "l.sqlite") as ledger,
        pytest.raises(ConfigError, match=r"set ledger\.budget_per_hour"),
    ):
        Pipeline(ledger, session="s", device="d", rate_hz=120.0, mechanism=MechanismSettings())


def test_the_next_release_finds_its_composition_and_capacity_prefetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a charge the ledger composes, in the background, what the session's next identical
    release will report and the capacity search its admission will need: that release then
    composes nothing on its own thread, and every figure equals a ledger's that does not
    prefetch."""
    import functools  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from gazeguard.privacy.accounting import accountant  # noqa: PLC0415

    ratio = noise_multiplier_for(
        "laplace", features=48, chunks=225, budget=10.0, delta=DELTA, max_m=0
    )
    events = chunk_events(ratio, 48)
    on_this_thread: list[str] = []  # what the test's own thread (the release path) computed

    def spied(name: str, fn):  # type: ignore[no-untyped-def]
        def run(*args):  # type: ignore[no-untyped-def]
            if threading.current_thread() is threading.main_thread():
                on_this_thread.append(name)
            return fn(*args)

        return functools.lru_cache(maxsize=8192)(run)

    for name in ("_compose", "_capacity_from"):  # cache misses of both land in `run`
        monkeypatch.setattr(accountant, name, spied(name, getattr(accountant, name).__wrapped__))
    with (
        Ledger(tmp_path / "p.sqlite", window_cap=10.0) as ledger,
        Ledger(tmp_path / "n.sqlite", window_cap=10.0, prefetch=False) as plain,
    ):
        for i in range(120):  # the pure sum passes the cap near chunk 4: admission composes
            prefetch = ledger._prefetch
            assert prefetch is not None
            assert prefetch.wait(60.0)
            on_this_thread.clear()
            ledger.preview("s", events, gaze=gaze(i))
            got = ledger.charge("s", i, events, "t", b"x", gaze=gaze(i))
            if i:  # (the first release's figures cannot be guessed before it)
                assert on_this_thread == [], i
            want = plain.charge("s", i, events, "t", b"x", gaze=gaze(i))
            assert got.state == want.state


@pytest.mark.slow
def test_one_prefetch_thread_serves_a_stream_of_charges_and_ends_when_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A steady stream of charges keeps one prefetch thread (not one started per charge); it
    ends by itself once no request came for ``IDLE_S``, and a later charge starts a new one."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from gazeguard.ledger._prefetch import Prefetch  # noqa: PLC0415

    monkeypatch.setattr(Prefetch, "IDLE_S", 3.0)  # far above a charge, even on a busy machine
    events = chunk_events(40.0, 48)
    with Ledger(tmp_path / "l.sqlite", window_cap=10.0) as ledger:
        prefetch = ledger._prefetch
        assert prefetch is not None
        seen = set()
        for i in range(12):
            ledger.charge("s", i, events, "t", b"x", gaze=gaze(i))
            assert prefetch.wait(60.0)
            seen.add(prefetch._thread)
        assert len(seen - {None}) == 1
        named = [t for t in threading.enumerate() if t.name == "gazeguard-ledger-prefetch"]
        assert len(named) <= 1
        deadline = time.monotonic() + 10 * prefetch.IDLE_S + 5
        while prefetch._thread is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert prefetch._thread is None  # ended by itself
        ledger.charge("s", 12, events, "t", b"x", gaze=gaze(12))
        assert prefetch.wait(60.0)
    assert not [t for t in threading.enumerate() if t.name == "gazeguard-ledger-prefetch"]


@pytest.mark.slow
@pytest.mark.parametrize("closed", [True, False])
def test_a_process_that_exits_while_the_ledger_prefetches_exits_cleanly(
    tmp_path: Path, closed: bool
) -> None:
    """The prefetch thread may be inside the FFT's C++ code when the process ends; a daemon
    thread killed there aborted the process (rc 134, "terminate called without an active
    exception"), 4 runs in 5. Closed or not, the ledger lets the process exit with 0."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    script = f"""
from gazeguard.privacy.accounting import LaplaceEvent
from gazeguard.ledger import Ledger
events = {{f"f{{i}}": LaplaceEvent(40.0) for i in range(48)}}
ledger = Ledger({str(tmp_path / "l.sqlite")!r}, window_cap=10.0)
for i in range(2):
    t = 1.75e9 + 16 * i
    ledger.charge("s", i, events, "t", b"x", gaze=(t, t + 15))
if {closed!r}:
    ledger.close()
"""
    for _ in range(3):
        (tmp_path / "l.sqlite").unlink(missing_ok=True)
        done = subprocess.run(
            [sys.executable, "-c", script],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stderr) == (0, "")


def test_a_fixed_epsilon_under_sequential_caps_is_released_with_its_slack_counted(
    tmp_path: Path,
) -> None:
    """ε fixed per feature, pure sequential caps: the samplers' slack (and the discrete
    Laplace's) is paid within the stated ε — the noise is calibrated to what is left — so the
    ledger charges exactly the sum of the per-feature ε, never a hair above it (float rounding
    of 1/r + slack included), and the chunk message (whose ε may not exceed its pure spend) is
    released, not dropped."""
    gaze = simulate_gaze(2.0 + 0.32 * 5, 120.0, 7)
    with Ledger(tmp_path / "l.sqlite", composition="sequential") as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=120.0,
            features=FeatureSettings(window_s=2.0, step_s=0.01),
            mechanism=MechanismSettings(epsilon=0.01),
        )  # fmt: skip
        released = [pipe.release(chunk) for chunk in pipe.feed(gaze)[:3]]
        assert all(out is not None for out in released), pipe.stats.last_reason
        state = ledger.state("s")
    nominal = 3 * 0.01 * len(pipe.feature_names)
    assert nominal * (1 - 1e-9) < state.spent == state.epsilon <= nominal


def test_threads_asking_for_one_new_composition_compose_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prefetch thread and a release's preview asking for the same new figure at once: the
    second waits for the first's composition (then a cache lookup) instead of composing beside
    it on a shared core; both get the same figure."""
    import threading  # noqa: PLC0415

    from gazeguard.ledger import LedgerComposer  # noqa: PLC0415
    from gazeguard.ledger import _compose as compose_module  # noqa: PLC0415

    real = compose_module.compose
    calls: list[tuple[str, str]] = []
    inside, release = threading.Event(), threading.Event()

    def watched(events: Any, delta: float) -> Any:
        calls.append(("enter", threading.current_thread().name))
        if len(calls) == 1:
            inside.set()
            release.wait(10)
        out = real(events, delta)
        calls.append(("leave", threading.current_thread().name))
        return out

    monkeypatch.setattr(compose_module, "compose", watched)
    composer = LedgerComposer()
    counts = {event_key(PureEvent(0.0123)): 4321}
    got: dict[str, float] = {}

    def ask(name: str) -> None:
        got[name] = composer.epsilon(counts, 1e-6)

    first = threading.Thread(target=ask, args=("first",), name="first")
    second = threading.Thread(target=ask, args=("second",), name="second")
    first.start()
    assert inside.wait(10)
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first's composition, not composing
    assert calls == [("enter", "first")]
    release.set()
    first.join(10)
    second.join(10)
    assert calls == [
        ("enter", "first"),
        ("leave", "first"),
        ("enter", "second"),
        ("leave", "second"),
    ]
    assert got["first"] == got["second"]
