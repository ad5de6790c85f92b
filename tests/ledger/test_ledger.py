"""The SQLite ε ledger and its outbox, on real files, with real threads, processes and SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import replace
from pathlib import Path

import pytest

from gazeguard.cli import main
from gazeguard.config import LedgerSettings, MechanismSettings
from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import (
    Caps,
    DuplicateChargeError,
    Ledger,
    LedgerError,
    StaleStateError,
    pure_cost,
    stored_caps,
)
from gazeguard.plan import ReleasePlan
from gazeguard.privacy.accounting import PrivacyLoss
from gazeguard.runtime.service import open_ledger
from tests._postgres import pg_server, pg_url  # noqa: F401 - fixtures of the parametrised race test

FIXED = MechanismSettings(epsilon=1.0)  # a fixed ε per chunk: a plan without a budget

EPS = {"fix_rate": 0.25, "sacc_amp": 0.25}  # 0.5 per chunk
TOPIC = "gazeguard/v1/dev/s/chunks"


def integrity(path: Path) -> str:
    with closing(sqlite3.connect(path)) as db:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])


def body(i: int) -> bytes:
    return f'{{"chunk": {i}}}'.encode()


def test_charges_and_outbox_persist_across_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path, session_cap=10.0, composition="sequential") as ledger:
        for i in range(3):
            charge = ledger.charge("s", i, pure_cost(EPS), TOPIC, body(i))
            assert charge.total == 0.5
            assert charge.state.spent == pytest.approx(0.5 * (i + 1))
    with Ledger(path, session_cap=10.0, composition="sequential") as ledger:
        state = ledger.state("s")
        assert (state.spent, state.chunks, state.remaining, state.last_chunk) == (1.5, 3, 8.5, 2)
        assert [(p.chunk_index, p.payload, p.topic) for p in ledger.pending()] == [
            (i, body(i), TOPIC) for i in range(3)
        ]
        with pytest.raises(DuplicateChargeError, match="chunk_index=2 of session 's'"):
            ledger.charge("s", 2, pure_cost(EPS), TOPIC, body(2))
        assert ledger.charge("s", 3, pure_cost(EPS), TOPIC, body(3)).state.spent == 2.0
        assert ledger.sessions() == ["s"]
        assert [c.epsilon for c in ledger.charges("s")] == [EPS] * 4
        assert ledger.verify() == []
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_session_cap_refuses_writes_nothing_and_withhold_leaves_no_outbox_row(
    tmp_path: Path,
) -> None:
    with Ledger(tmp_path / "l.sqlite", session_cap=1.2, composition="sequential") as ledger:
        ledger.charge("s", 0, pure_cost(EPS), TOPIC, body(0))
        ledger.charge("s", 1, pure_cost(EPS), TOPIC, body(1))
        with pytest.raises(
            BudgetExhaustedError, match=r"requested epsilon=0.5 but only 0.2 remains under the "
        ) as info:
            ledger.preview("s", pure_cost(EPS))  # refused before any payload is built
        with pytest.raises(BudgetExhaustedError):
            ledger.charge("s", 2, pure_cost(EPS), TOPIC, b"x")
        assert (info.value.cap, info.value.requested) == ("session", 0.5)
        assert ledger.state("s").chunks == 2
        assert len(ledger.pending()) == 2
        state = ledger.withhold("s", 2, info.value.requested, str(info.value))
        state = ledger.withhold("s", 2, info.value.requested, "again")  # counted once
        assert (state.withheld, state.chunks, state.pending, state.spent) == (1, 2, 2, 1.0)
        assert [p.chunk_index for p in ledger.pending()] == [0, 1]
        assert ledger.withheld("s") == [(2, 0.5, str(info.value))]
        with pytest.raises(DuplicateChargeError, match="already withheld"):
            ledger.charge("s", 2, pure_cost({"x": 0.1}), TOPIC, b"x")
        with pytest.raises(DuplicateChargeError, match="already charged"):
            ledger.withhold("s", 1, 0.5, "too late")
        # A smaller chunk still fits the remaining 0.2.
        assert (
            ledger.charge("s", 3, pure_cost({"fix_rate": 0.2}), TOPIC, b"x").state.remaining == 0.0
        )
        assert ledger.verify() == []


def test_integer_accounting_lets_no_tiny_charge_creep_over_the_cap(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite", session_cap=1.0, composition="sequential") as ledger:
        for i in range(10):  # in floats, 0.1 summed ten times is 0.9999999999999999
            ledger.charge("tenths", i, pure_cost({"f": 0.1}), TOPIC, b"x")
        assert ledger.state("tenths").remaining == 0.0
        with pytest.raises(BudgetExhaustedError):
            ledger.charge("tenths", 10, pure_cost({"f": 0.1}), TOPIC, b"x")
    # 1.0 + 1e-17 == 1.0 in floats, so a float ledger would accept these forever; each costs a
    # whole micro-ε here, so a cap of 1.00001 admits exactly ten of them after the first 1.0.
    with Ledger(tmp_path / "m.sqlite", session_cap=1.00001, composition="sequential") as ledger:
        ledger.charge("tiny", 0, pure_cost({"f": 1.0}), TOPIC, b"x")
        accepted = 0
        for i in range(1, 30):
            try:
                ledger.charge("tiny", i, pure_cost({"f": 1e-17}), TOPIC, b"x")
                accepted += 1
            except BudgetExhaustedError:
                pass
        assert accepted == 10
        assert ledger.state("tiny").spent == pytest.approx(1.00001, abs=0)


def at(t: float) -> tuple[float, float]:
    """A chunk's gaze span ending at Unix time ``T0 + t``."""
    return T0 + t - 0.5, T0 + t


T0 = 1.7e9


def test_window_cap_bounds_every_window_of_gaze_time_even_out_of_order(tmp_path: Path) -> None:
    with Ledger(
        tmp_path / "l.sqlite", window_cap=1.0, window_s=4.0, composition="sequential"
    ) as ledger:
        released = {}
        caps = []
        for i in range(12):
            try:
                ledger.charge("s", i, pure_cost({"f": 0.3}), TOPIC, b"x", gaze=at(i))
                released[i] = 0.3
            except BudgetExhaustedError as exc:
                caps.append(exc.cap)
                ledger.withhold("s", i, exc.requested, str(exc))
        # 0.3 x 3 = 0.9 fits; a 4th in the same window would make 1.2: every 4th is withheld.
        assert sorted(released) == [0, 1, 2, 4, 5, 6, 8, 9, 10]
        assert caps == ["per-4-s-of-gaze"] * 3
        state = ledger.state("s")
        assert (state.epsilon_window, state.window_remaining) == (pytest.approx(0.9), 0.1)
        assert ledger.state("s").withheld == 3
        # Out of order: gaze at 20 s spends 0.9; gaze at 17 s would share (16, 20] with it.
        ledger.charge("s", 20, pure_cost({"f": 0.9}), TOPIC, b"x", gaze=at(20))
        with pytest.raises(BudgetExhaustedError, match="per-4-s-of-gaze cap"):
            ledger.charge("s", 17, pure_cost({"f": 0.2}), TOPIC, b"x", gaze=at(17))
        ledger.charge(
            "s", 16, pure_cost({"f": 0.2}), TOPIC, b"x", gaze=at(16)
        )  # (12, 16]: only itself
        ledger.charge(
            "s", 23, pure_cost({"f": 0.1}), TOPIC, b"x", gaze=at(23)
        )  # (19, 23] = 1.0 exactly
        with pytest.raises(BudgetExhaustedError):
            ledger.charge("s", 22, pure_cost({"f": 0.1}), TOPIC, b"x", gaze=at(22))
        # Counted in gaze time, not in chunk indexes: far-apart gaze never shares a window.
        ledger.charge("s", 24, pure_cost({"f": 0.9}), TOPIC, b"x", gaze=at(100))
        ledger.charge("s", 25, pure_cost({"f": 0.9}), TOPIC, b"x", gaze=at(104.5))
        assert ledger.verify() == []


def test_a_preview_is_the_post_charge_state_and_a_stale_one_charges_nothing(
    tmp_path: Path,
) -> None:
    with Ledger(tmp_path / "l.sqlite", session_cap=2.0, composition="sequential") as ledger:
        preview = ledger.preview("s", pure_cost(EPS), gaze=at(0))
        body0 = json.dumps(preview.state.as_dict()).encode()
        charge = ledger.charge(
            "s", 0, pure_cost(EPS), TOPIC, body0, gaze=at(0), version=preview.version
        )
        assert charge.state == replace(preview.state, last_chunk=0)
        assert (charge.state.spent, charge.state.chunks, charge.state.pending) == (0.5, 1, 1)
        assert json.loads(ledger.pending()[0].payload)["remaining"] == 1.5

        stale = ledger.preview("s", pure_cost(EPS), gaze=at(1))
        ledger.charge("t", 0, pure_cost(EPS), TOPIC, b"other session: s is unchanged")
        with ledger_at("s", ledger) as other:  # another writer charges s in between
            other.charge("s", 1, pure_cost(EPS), TOPIC, b"x", gaze=at(1))
        with pytest.raises(StaleStateError, match="preview again"):
            ledger.charge("s", 2, pure_cost(EPS), TOPIC, b"y", gaze=at(2), version=stale.version)
        with pytest.raises(TypeError, match="payload must be bytes, got str"):
            ledger.charge("s", 2, pure_cost(EPS), TOPIC, "text")  # type: ignore[arg-type]
        assert (ledger.state("s").chunks, len(ledger.pending(session="s"))) == (2, 2)
        fresh = ledger.preview("s", pure_cost(EPS), gaze=at(2))
        ledger.charge(
            "s", 2, pure_cost(EPS), TOPIC, b"z", gaze=at(2), version=fresh.version
        )  # not consumed
        assert ledger.verify() == []


@contextmanager
def ledger_at(session: str, ledger: Ledger) -> Iterator[Ledger]:
    """A second connection to the same ledger file (another writer)."""
    del session
    other = Ledger(ledger.backend.location, session_cap=2.0, composition="sequential")
    try:
        yield other
    finally:
        other.close()


def test_outbox_keeps_order_and_delivery_drops_items(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        order = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]
        ids = [
            ledger.charge(s, i, pure_cost(EPS), f"t/{s}", f"{s}{i}".encode()).outbox_id
            for s, i in order
        ]
        assert ids == sorted(ids)
        pending = ledger.pending()
        assert [(p.session, p.chunk_index, p.payload) for p in pending] == [
            (s, i, f"{s}{i}".encode()) for s, i in order
        ]
        assert [p.id for p in ledger.pending(limit=2)] == ids[:2]
        assert [p.chunk_index for p in ledger.pending(session="a")] == [0, 1, 2]
        assert ledger.mark_delivered(ids[0]) is True
        assert ledger.mark_delivered(ids[0]) is False
        assert ledger.mark_delivered(10_000) is False
        assert [p.id for p in ledger.pending()] == ids[1:]
        assert (ledger.state("a").pending, ledger.state("a").chunks) == (2, 3)
        assert ledger.verify() == []


def test_a_ledger_written_before_the_pending_index_opens_with_it_and_the_same_figures(
    tmp_path: Path,
) -> None:
    """A ledger file from before the per-session pending index (the same tables) gets it on
    open, and reports the same states, pending items and charges as before; the next charges
    are admitted and refused as on a copy that never lost it."""
    path, copy = tmp_path / "old.sqlite", tmp_path / "copy.sqlite"
    caps = {"window_cap": 1.2, "window_s": 50.0, "composition": "sequential", "prefetch": False}
    with Ledger(path, **caps) as ledger:  # type: ignore[arg-type]
        for i in range(8):
            for s in ("a", "b"):
                t = 1.7e9 + 10 * i
                with suppress(BudgetExhaustedError):  # 2 of every 5 chunks fit a window
                    ledger.charge(s, i, pure_cost(EPS), TOPIC, body(i), gaze=(t, t + 9))
        for item in ledger.pending()[:3]:
            ledger.mark_delivered(item.id)
        before = {s: ledger.state(s) for s in ("a", "b")}
        assert 0 < before["a"].chunks < 8
        pending = ledger.pending()
    with closing(sqlite3.connect(path)) as db:
        db.execute("DROP INDEX outbox_session_pending")
        db.commit()
        db.execute("VACUUM INTO ?", (str(copy),))
    with closing(sqlite3.connect(copy)) as db:
        db.execute("CREATE INDEX outbox_session_pending ON outbox(session) WHERE state = 'pending'")
        db.commit()
    with Ledger(path, **caps) as ledger, Ledger(copy, **caps) as kept:  # type: ignore[arg-type]
        assert {s: ledger.state(s) for s in ("a", "b")} == before
        assert ledger.pending() == pending
        assert ledger.verify() == []
        for i in range(8, 14):
            t = 1.7e9 + 10 * i
            got: list[object] = []
            want: list[object] = []
            for led, out in ((ledger, got), (kept, want)):
                try:
                    out.append(
                        led.charge("a", i, pure_cost(EPS), TOPIC, body(i), gaze=(t, t + 9)).state
                    )
                except BudgetExhaustedError as exc:
                    out.append(exc.cap)
            assert got == want
        assert ledger.state("a") == kept.state("a")
    with closing(sqlite3.connect(path)) as db:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "outbox_session_pending" in names


def test_restart_never_refills_a_cap(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(
        path, session_cap=2.0, window_cap=1.5, window_s=4.0, composition="sequential"
    ) as ledger:
        ledger.charge("s", 0, pure_cost(EPS), TOPIC, b"x")
    with Ledger(
        path, session_cap=3.0, window_cap=1.5, window_s=4.0, composition="sequential"
    ) as ledger:
        with pytest.raises(ConfigError, match=r"'ledger.session_cap'.*would refill"):
            ledger.open_session("s")  # refused at session start, before any work
        with pytest.raises(ConfigError, match=r"'ledger.session_cap'.*would refill") as info:
            ledger.charge("s", 1, pure_cost(EPS), TOPIC, b"x")
        assert "session cap ε 2, window cap ε 1.5 per 4 s of gaze" in str(info.value)
        assert ledger.open_session("new").session_cap == 3.0  # a new session takes new caps
    with (
        Ledger(
            path, session_cap=None, window_cap=1.5, window_s=4.0, composition="sequential"
        ) as ledger,
        pytest.raises(ConfigError, match="session_cap"),
    ):
        ledger.charge("s", 1, pure_cost(EPS), TOPIC, b"x")
    with Ledger(
        path, session_cap=1.0, window_cap=1.0, window_s=8.0, composition="sequential"
    ) as ledger:  # stricter
        assert ledger.charge("s", 1, pure_cost(EPS), TOPIC, b"x").state.session_cap == 1.0
    looser: list[tuple[dict[str, float], str]] = [  # (caps, the setting named)
        ({"session_cap": 2.0, "window_s": 8.0}, "session_cap"),  # the lower cap was recorded
        ({"session_cap": 1.0, "window_s": 2.0}, "window_s"),  # a shorter window is looser
        ({"session_cap": 1.0, "window_s": 8.0, "delta": 1e-5}, r"ledger\.delta"),  # larger δ
    ]
    for caps, setting in looser:
        with (
            Ledger(path, window_cap=1.0, composition="sequential", **caps) as ledger,  # type: ignore[arg-type]
            pytest.raises(ConfigError, match=setting),
        ):
            ledger.charge("s", 2, pure_cost(EPS), TOPIC, b"x")
    with Ledger(path, session_cap=5.0, allow_cap_increase=True, composition="sequential") as ledger:
        charge = ledger.charge("s", 2, pure_cost({"f": 0.1}), TOPIC, b"x")
        assert (charge.state.session_cap, charge.state.window_cap) == (5.0, None)
        assert charge.state.spent == pytest.approx(1.1)  # raised deliberately, never reset


def test_a_wall_clock_cap_binds_hours_of_gaze_charged_in_one_go(location: str) -> None:
    """Issue 15.5: a backlog stamped in the past (or a replay) covers hours of gaze but is
    charged within seconds. The per-hour cap in gaze time lets each gaze hour spend its budget;
    with ``wall_clock`` no real hour can spend more than the cap, whatever the stamps say."""
    one = {"f": 1.0}
    hours = [(h * 3700.0, h * 3700.0 + 1.0) for h in range(4)]  # never two in one gaze hour
    with Ledger(location, window_cap=2.0, composition="sequential") as ledger:
        for i, span in enumerate(hours):  # gaze time only: every hour fits
            ledger.charge("gaze-only", i, pure_cost(one), TOPIC, b"x", gaze=span)
        assert ledger.state("gaze-only").spent == 4.0
    with Ledger(location, window_cap=2.0, composition="sequential", wall_clock=True) as ledger:
        for i, span in enumerate(hours[:2]):
            ledger.charge("paced", i, pure_cost(one), TOPIC, b"x", gaze=span)
        with pytest.raises(BudgetExhaustedError, match="wall-clock"):
            ledger.preview("paced", pure_cost(one), gaze=hours[2])
        with pytest.raises(BudgetExhaustedError, match="wall-clock"):
            ledger.charge("paced", 2, pure_cost(one), TOPIC, b"x", gaze=hours[2])
        assert ledger.state("paced").spent == 2.0
        assert ledger.verify() == []
    # turning the wall-clock cap off for a session opened with it would refill it: refused
    with (
        Ledger(location, window_cap=2.0, composition="sequential") as ledger,
        pytest.raises(ConfigError, match=r"ledger\.wall_clock.*and of wall-clock time"),
    ):
        ledger.charge("paced", 2, pure_cost(one), TOPIC, b"x", gaze=hours[2])


def test_the_sidecars_ledger_caps_wall_clock_hours_by_default(tmp_path: Path) -> None:
    settings = LedgerSettings(path=tmp_path / "l.sqlite", composition="sequential")
    assert settings.wall_clock
    with open_ledger(settings, ReleasePlan.build(budget=10.0, delta=1e-6)) as ledger:
        ledger.charge("s", 0, pure_cost({"f": 6.0}), TOPIC, b"x", gaze=(0.0, 1.0))
        with pytest.raises(BudgetExhaustedError, match=r"per-3679-s-of-wall-clock"):
            ledger.charge("s", 1, pure_cost({"f": 6.0}), TOPIC, b"x", gaze=(7200.0, 7201.0))


def test_caps_are_built_from_typed_losses_and_the_plan_states_its_caps_so(tmp_path: Path) -> None:
    caps = Caps.of(
        session=PrivacyLoss.approx(5.0, 1e-6), window=PrivacyLoss.approx(2.0, 1e-6), window_s=60.0
    )
    assert caps == Caps(5.0, 2.0, 60.0, 1e-6)
    with pytest.raises(ConfigError, match=r"ledger\.window_cap"):
        Caps.of(window=PrivacyLoss.approx(2.0, 1e-5))  # another δ than the caps'
    with pytest.raises(ConfigError, match=r"ledger\.session_cap"):
        Caps.of(session=PrivacyLoss.pure(2.0))
    with pytest.raises(ConfigError, match="not both"):
        Ledger(tmp_path / "l.sqlite", session_cap=1.0, caps=caps)
    with Ledger(tmp_path / "l.sqlite", caps=caps) as ledger:
        assert ledger.caps == caps
    settings = LedgerSettings(composition="sequential")
    plan = ReleasePlan.build(budget=10.0, delta=1e-6, session_cap=40.0)
    assert plan.ledger_caps(settings) == Caps(
        40.0, 10.0, plan.window_s, 1e-6, "sequential", settings.wall_clock
    )


def test_bad_arguments_are_refused_with_the_field_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'ledger.window_s'.*-4"):
        Ledger(tmp_path / "a.sqlite", window_cap=1.0, window_s=-4, composition="sequential")
    with pytest.raises(ConfigError, match=r"'ledger.delta'.*1.5"):
        Ledger(tmp_path / "a.sqlite", delta=1.5)
    with pytest.raises(ConfigError, match=r"'ledger.session_cap'.*-1"):
        Ledger(tmp_path / "a.sqlite", session_cap=-1, composition="sequential")
    with pytest.raises(ConfigError, match=r"'ledger.synchronous'.*'OFF'"):
        Ledger(tmp_path / "a.sqlite", synchronous="OFF")  # type: ignore[arg-type]
    with Ledger(tmp_path / "a.sqlite") as ledger:
        with pytest.raises(ConfigError, match=r"epsilon\['f'\].*nan"):
            ledger.charge("s", 0, pure_cost({"f": float("nan")}), TOPIC, b"x")
        with pytest.raises(ConfigError, match=r"epsilon\['f'\].*0.0"):
            ledger.charge("s", 0, pure_cost({"f": 0.0}), TOPIC, b"x")
        with pytest.raises(ConfigError, match="at least one feature"):
            ledger.charge("s", 0, pure_cost({}), TOPIC, b"x")
        with pytest.raises(ConfigError, match=r"'chunk_index'.*-1"):
            ledger.charge("s", -1, pure_cost(EPS), TOPIC, b"x")
        with pytest.raises(ConfigError, match="'session'"):
            ledger.charge("", 0, pure_cost(EPS), TOPIC, b"x")
        assert ledger.sessions() == []
        # Caps and a withheld chunk's request may exceed one feature's limit of 1e4 ε.
        many = {f"f{k}": 1e4 for k in range(52)}
        assert ledger.withhold("s", 0, pure_cost(many), "too expensive").withheld == 1
    with Ledger(tmp_path / "b.sqlite", session_cap=6e5, composition="sequential") as ledger:
        assert ledger.charge("s", 0, pure_cost(many), TOPIC, b"x").state.remaining == pytest.approx(
            8e4
        )
        with pytest.raises(ConfigError, match=r"epsilon\['f'\].*must be a finite number in"):
            ledger.charge("s", 1, pure_cost({"f": 2e4}), TOPIC, b"x")


def test_files_that_are_not_ledgers_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database at all " * 100)
    with pytest.raises(LedgerError, match="not a usable gazeguard ledger"):
        Ledger(text)
    foreign = tmp_path / "other.sqlite"
    with closing(sqlite3.connect(foreign)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    with pytest.raises(LedgerError, match="not a gazeguard ledger"):
        Ledger(foreign, create=False)
    with pytest.raises(ConfigError, match="ledger file not found"):
        Ledger(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


def test_from_settings_opens_the_configured_ledger(tmp_path: Path) -> None:
    settings = LedgerSettings(path=tmp_path / "cfg.sqlite", session_cap=0.6)
    plan = ReleasePlan.build(budget=None, delta=1e-6, session_cap=0.6, mechanism=FIXED)
    with open_ledger(settings, plan) as ledger:
        ledger.charge("s", 0, pure_cost(EPS), TOPIC, b"x")
        with pytest.raises(BudgetExhaustedError):
            ledger.charge("s", 1, pure_cost(EPS), TOPIC, b"x")
    assert (tmp_path / "cfg.sqlite").is_file()


def test_threads_sharing_and_not_sharing_a_ledger_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    cap, per_thread, n_threads = 30.0, 25, 8
    accepted: list[int] = []
    refused: list[int] = []
    lock = threading.Lock()
    shared = Ledger(path, session_cap=cap, composition="sequential")

    def work(t: int) -> None:
        own = Ledger(path, session_cap=cap, composition="sequential") if t % 2 else None
        ledger = own or shared
        for j in range(per_thread):
            index = t * per_thread + j
            try:
                ledger.charge("s", index, pure_cost(EPS), TOPIC, body(index))
                with lock:
                    accepted.append(index)
            except BudgetExhaustedError:
                with lock:
                    refused.append(index)
        if own is not None:
            own.close()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    assert len(accepted) == 60  # cap / 0.5: the cap is filled exactly, never exceeded
    assert len(refused) == n_threads * per_thread - 60
    with Ledger(path) as ledger:
        assert ledger.state("s").spent == cap
        assert sorted(c.chunk_index for c in ledger.charges("s")) == sorted(accepted)
        assert sorted(p.chunk_index for p in ledger.pending()) == sorted(accepted)
        assert ledger.verify() == []


WORKER = """
import json, sys
from gazeguard.core.errors import BudgetExhaustedError
from gazeguard.ledger import Ledger, pure_cost
location, session, start, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
accepted = []
with Ledger(location, session_cap=float(sys.argv[5]), composition="sequential") as ledger:
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for i in range(start, start + count):
        try:
            ledger.charge(session, i, pure_cost({"f": 0.25, "g": 0.25}), "t", str(i).encode())
            accepted.append(i)
        except BudgetExhaustedError:
            pass
print(json.dumps(accepted))
"""


def _ready_processes(
    argvs: list[list[str]], stderr: int | None = None
) -> list[subprocess.Popen[str]]:
    """One ``python -c`` process per list of arguments (a script above and its ``sys.argv``),
    stdin and stdout piped as text; returned once each has printed ``ready``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        for argv in argvs
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
    return procs


def test_processes_never_overspend_and_never_lose_a_committed_charge(location: str) -> None:
    Ledger(location).close()  # create the tables (and WAL mode) once
    procs = _ready_processes([[WORKER, location, "s", str(p * 50), "50", "60"] for p in range(4)])
    accepted = []
    for proc in procs:
        out, _ = proc.communicate("go\n", timeout=120)
        assert proc.returncode == 0
        accepted += json.loads(out)
    assert len(accepted) == 120  # 60 ε / 0.5 per chunk, out of 200 attempts
    with Ledger(location) as ledger:
        assert ledger.state("s").spent == 60.0
        assert sorted(c.chunk_index for c in ledger.charges("s")) == sorted(accepted)
        # Within a session, outbox order is charge order.
        assert [p.chunk_index for p in ledger.pending()] == [
            c.chunk_index for c in sorted(ledger.charges("s"), key=lambda c: c.created)
        ]
        assert ledger.verify() == []


OPENER = """
import sys
from gazeguard.ledger import Ledger
print("ready", flush=True)
sys.stdin.readline()  # start together
for _ in range(int(sys.argv[2])):
    Ledger(sys.argv[1]).close()
"""


@pytest.mark.slow
def test_processes_opening_one_new_file_together_all_get_the_ledger(tmp_path: Path) -> None:
    """Workers of a fleet start together on one new file: the switch to WAL answers 'database
    is locked' at once to all but one (SQLite calls no busy handler for it); each open retries
    within its timeout instead of failing. Several fresh files, four processes each: before the
    retry about one file in three failed here."""
    for trial in range(6):
        path = tmp_path / f"new-{trial}.sqlite"
        procs = _ready_processes([[OPENER, str(path), "10"]] * 4, stderr=subprocess.PIPE)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        with Ledger(path, create=False) as ledger:
            assert ledger.verify() == []


KILLED = """
import sys, time
from gazeguard.ledger import Ledger, _store, pure_cost
path = sys.argv[1]
enqueue = _store.Store.enqueue
def stall(self, session, stream, idx, **kw):
    outbox_id = enqueue(self, session, stream, idx, **kw)
    if idx == 5:  # charge row, events and outbox row written, COMMIT not yet reached
        print("inside", idx, flush=True)
        time.sleep(60)  # the parent SIGKILLs us here, inside the open transaction
    return outbox_id
_store.Store.enqueue = stall
with Ledger(path, session_cap=100.0, composition="sequential") as ledger:
    for i in range(6):
        ledger.charge("s", i, pure_cost({"f": 1.0}), "t", str(i).encode())
"""

LOOP = """
import sys
from gazeguard.ledger import Ledger, pure_cost
with Ledger(sys.argv[1]) as ledger:
    print("ready", flush=True)
    for i in range(int(sys.argv[2]), 10**6):
        ledger.charge("s", i, pure_cost({"f": 0.001}), "t", bytes(2000))
        if i % 3 == 0:
            ledger.mark_delivered(ledger.pending(1)[0].id)
"""


def test_sigkill_inside_a_charge_leaves_a_consistent_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == [b"inside", b"5"]
        os.kill(proc.pid, signal.SIGKILL)
    with Ledger(path, session_cap=100.0, composition="sequential") as ledger:
        state = ledger.state("s")
        assert (state.chunks, state.spent, state.pending) == (5, 5.0, 5)
        assert [p.payload for p in ledger.pending()] == [str(i).encode() for i in range(5)]
        assert ledger.verify() == []
        assert (
            ledger.charge("s", 5, pure_cost({"f": 1.0}), "t", b"5").state.spent == 6.0
        )  # not refilled
    assert integrity(path) == "ok"


def test_sigkill_at_random_moments_never_breaks_charge_outbox_atomicity(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    start = 0
    for delay in (0.05, 0.13, 0.31):
        with subprocess.Popen(
            [sys.executable, "-c", LOOP, str(path), str(start)], stdout=subprocess.PIPE
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
            threading.Event().wait(delay)
            os.kill(proc.pid, signal.SIGKILL)
        with Ledger(path) as ledger:
            assert ledger.verify() == []
            state = ledger.state("s") if ledger.sessions() else None
            start = 0 if state is None or state.last_chunk is None else state.last_chunk + 1
            if state is not None:
                assert state.chunks == start  # no gap, no loss: every committed charge is there
                assert state.spent == pytest.approx(0.001 * start)
    assert integrity(path) == "ok"


def test_cli_show_prints_both_views_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path, session_cap=1.2, window_cap=1.0, composition="sequential") as ledger:
        ledger.charge("sess-a", 0, pure_cost(EPS), TOPIC, b"payload")
        ledger.charge("sess-a", 1, pure_cost(EPS), TOPIC, b"payload")
        ledger.mark_delivered(ledger.pending()[0].id)
        ledger.withhold("sess-a", 2, 0.5, "session cap reached")
        ledger.charge("sess-b", 0, pure_cost({"f": 0.1}), "t/b", b"b")
    assert main(["ledger", "show", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    for shown in (
        "2 session(s), 2 outbox item(s) pending",
        "session sess-a",
        "chunks released      2   withheld 1   refused 0   pending delivery 1",
        "user-level ε         1 at δ 1e-06   (composition of every release",
        "per hour of gaze    1 at δ 1e-06",
        "pure sequential ε    1   (the conservative view",
        "session cap          1.2   remaining 0.2",
        "per-chunk ε          0.5 per chunk, 0.25 per feature",
        "window cap           1 over any hour of gaze:",
        "withheld chunk 2: requested ε 0.5: session cap reached",
        f"chunk 1 -> {TOPIC} (7 bytes)",
    ):
        assert shown in out

    assert main(["ledger", "show", "--path", str(path), "--session", "sess-a", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (a,) = doc["sessions"]
    assert (a["session"], a["spent"], a["remaining"], a["chunks"]) == ("sess-a", 1.0, 0.2, 2)
    assert (a["max_chunk_eps"], a["max_feature_eps"], a["withheld"]) == (0.5, 0.25, 1)
    assert [p["chunk_index"] for p in doc["pending"]] == [1]

    assert main(["ledger", "show", "--path", str(path), "--session", "sess-b", "--chunks"]) == 0
    assert "chunk      0  ε 0.1  (f=0.1)" in capsys.readouterr().out

    assert main(["ledger", "show", "--path", str(path), "--session", "nope"]) == 1
    assert "'nope': not in ledger" in capsys.readouterr().err
    assert main(["ledger", "show", "--path", str(tmp_path / "none.sqlite")]) == 1
    err = capsys.readouterr().err
    assert "none.sqlite" in err
    assert "ledger file not found" in err


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    session TEXT PRIMARY KEY, session_cap INTEGER, w_event INTEGER, w_event_cap INTEGER,
    spent INTEGER NOT NULL DEFAULT 0, chunks INTEGER NOT NULL DEFAULT 0,
    withheld INTEGER NOT NULL DEFAULT 0, max_chunk INTEGER NOT NULL DEFAULT 0,
    last_chunk INTEGER, created REAL NOT NULL);
CREATE TABLE charges (
    session TEXT NOT NULL REFERENCES sessions(session), chunk_index INTEGER NOT NULL,
    total INTEGER NOT NULL, epsilon TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (session, chunk_index));
CREATE TABLE withheld (
    session TEXT NOT NULL REFERENCES sessions(session), chunk_index INTEGER NOT NULL,
    requested INTEGER NOT NULL, reason TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (session, chunk_index));
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL, chunk_index INTEGER NOT NULL,
    topic TEXT NOT NULL, payload BLOB, created REAL NOT NULL, delivered REAL,
    UNIQUE (session, chunk_index),
    FOREIGN KEY (session, chunk_index) REFERENCES charges(session, chunk_index));
CREATE INDEX outbox_pending ON outbox(id) WHERE delivered IS NULL;
INSERT INTO meta VALUES ('schema', '1');
INSERT INTO sessions VALUES ('old', 3000000, 4, 1000000, 1500000, 3, 1, 500000, 3, 1.0);
INSERT INTO charges VALUES ('old', 0, 500000, '{"a": 0.25, "b": 0.25}', 10.0);
INSERT INTO charges VALUES ('old', 1, 500000, '{"a": 0.25, "b": 0.25}', 20.0);
INSERT INTO charges VALUES ('old', 3, 500000, '{"a": 0.25, "b": 0.25}', 30.0);
INSERT INTO withheld VALUES ('old', 2, 500000, 'cap', 25.0);
INSERT INTO outbox VALUES (7, 'old', 0, 't', NULL, 10.0, 11.0);
INSERT INTO outbox VALUES (8, 'old', 1, 't', x'31', 20.0, NULL);
INSERT INTO outbox VALUES (9, 'old', 3, 't', x'33', 30.0, NULL);
"""


def test_a_ledger_of_another_schema_is_refused_naming_the_file_and_untouched(
    tmp_path: Path,
) -> None:
    """Ledgers are never upgraded in place: a schema-1 file (and one of an unknown version) is
    refused by the ledger and by the read-only caps lookup, saying which file and what to do."""
    path = tmp_path / "v1.sqlite"
    with closing(sqlite3.connect(path)) as db:
        db.executescript(V1_SCHEMA)
    with closing(sqlite3.connect(path)) as db:
        before = list(db.iterdump())
    with pytest.raises(LedgerError, match="schema version 1") as info:
        Ledger(path, session_cap=3.0)
    assert str(path) in str(info.value)
    assert "start a new ledger" in str(info.value)
    with pytest.raises(LedgerError, match="start a new ledger"):
        stored_caps(path, "old")
    with closing(sqlite3.connect(path)) as db:
        assert list(db.iterdump()) == before  # nothing was written (only the journal mode)
    assert integrity(path) == "ok"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    with pytest.raises(LedgerError, match=r"schema version 99.*newer gazeguard release"):
        Ledger(path)


def test_a_refused_item_is_moved_aside_kept_and_counted(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        ids = [ledger.charge("s", i, pure_cost(EPS), TOPIC, body(i)).outbox_id for i in range(3)]
        assert ledger.mark_refused(ids[0], "MQTT reason 0x87 Not authorized") is True
        assert ledger.mark_refused(ids[0], "again") is False
        assert ledger.mark_delivered(ids[0]) is False  # refused items are never retried
        assert [p.id for p in ledger.pending()] == ids[1:]
        (item,) = ledger.refused("s")
        assert (item.id, item.chunk_index, item.reason) == (
            ids[0],
            0,
            "MQTT reason 0x87 Not authorized",
        )
        state = ledger.state("s")
        assert (state.refused, state.chunks, state.pending, state.spent) == (1, 3, 2, 1.5)
        assert ledger.verify() == []
