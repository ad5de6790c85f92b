"""The in-process pipeline (the vendor API): samples in, charged privatized chunks out."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gazeguard.config import FeatureSettings, MechanismSettings
from gazeguard.core.chunking import Chunk
from gazeguard.core.errors import ConfigError, StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.ledger import Ledger
from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk, feed_many, session_phase
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.wire.message import ChunkMessage

NAMES = ["fixation_rate", "saccade_rate", "pupil_mean"]
FAST = FeatureSettings(window_s=2.0, step_s=0.05)


def mechanism(**kw: object) -> MechanismSettings:
    return MechanismSettings.model_validate({"features": NAMES, "epsilon": 0.5, **kw})


def feed(pipe: Pipeline, seconds: float = 20.0, seed: int = 3) -> list[ReleasedChunk]:
    gaze = simulate_gaze(seconds, 120.0, seed)
    out: list[ReleasedChunk] = []
    for start in range(0, len(gaze), 12):
        out += pipe.push(gaze.slice(start, start + 12))
    return out


def test_released_chunks_are_charged_first_and_report_what_was_spent(tmp_path: Path) -> None:
    seen: list[ReleasedChunk] = []
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
            mechanism=mechanism(), on_release=seen.append,
        )  # fmt: skip
        out = feed(pipe)
        assert len(out) >= 9
        assert out == seen
        charges = {c.chunk_index: c for c in ledger.charges("u1")}
        pending = {p.id: p for p in ledger.pending()}
        for i, c in enumerate(out):
            assert c.message.chunk_index == i
            assert c.message.ledger.chunk_epsilon == pytest.approx(1.5) == charges[i].total
            assert c.message.ledger.session_spent == pytest.approx(1.5 * (i + 1))
            assert pending[c.outbox_id].payload == c.payload  # the bytes that were charged
            assert ChunkMessage.from_payload(c.payload) == c.message
            assert c.completed_at <= c.charged_at
            lo = np.array([0.0, 0.0, 1.5])
            assert np.all(c.message.values_array() >= lo[:, None])
        ledger.mark_delivered(out[0].outbox_id)
        assert len(ledger.pending()) == len(out) - 1
        dropped_tail = pipe.close()
        assert 0 <= dropped_tail < 32


def test_restart_continues_the_chunk_numbering_and_the_budget(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        first = feed(Pipeline(ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
                              mechanism=mechanism()))  # fmt: skip
        again = feed(Pipeline(ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
                              mechanism=mechanism()), seed=4)  # fmt: skip
        assert again[0].message.chunk_index == len(first)
        assert ledger.state("u1").spent == pytest.approx(1.5 * (len(first) + len(again)))


def test_a_second_pipeline_on_the_same_session_cannot_release_twice(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        a = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST, mechanism=mechanism()
        )
        b = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST, mechanism=mechanism()
        )
        released_a = feed(a)
        released_b = feed(b)
        assert released_a
        assert released_b == []  # every index was charged by a: b's chunks are dropped
        assert b.stats.dropped == len(released_a)
        reason = b.status().reason or ""
        # fixed words on the status (issue 46): no error text or type, no values
        assert reason.endswith(" dropped by an error in its release (see the sidecar log)")
        assert "Error" not in reason
        assert len(ledger.pending()) == len(released_a)
        assert b.status().chunks_dropped == len(released_a)


def test_cap_withholds_and_status_says_why(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite", session_cap=4.0) as ledger:
        pipe = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST, mechanism=mechanism()
        )
        out = feed(pipe)
        assert [c.message.chunk_index for c in out] == [0, 1]
        assert pipe.stats.withheld >= 1
        status = pipe.status()
        assert status.state == "budget_exhausted"
        assert status.reason is not None
        assert "session cap" in status.reason
        assert ledger.state("u1").spent == pytest.approx(3.0)


def test_unknown_feature_in_the_profile_is_refused_with_the_known_names(tmp_path: Path) -> None:
    with (
        Ledger(tmp_path / "l.sqlite") as ledger,
        pytest.raises(
            ConfigError, match=r"'mechanism.features'.*fixaton_rate.*known: fixation_rate"
        ),
    ):
        Pipeline(ledger, session="u1", device="hmd", rate_hz=120.0,
                 mechanism=MechanismSettings(features=["fixaton_rate"]))  # fmt: skip


def chunked(pipe: Pipeline, *parts: GazeSamples) -> list[Chunk]:
    """The raw chunks ``parts`` complete, fed in blocks of 12 samples."""
    return [c for p in parts for i in range(0, len(p), 12) for c in pipe.feed(p.slice(i, i + 12))]


def test_a_pause_is_walked_on_the_public_grid(tmp_path: Path) -> None:
    """A pause in the gaze does not move the grid or stop the schedule: the steps stay on
    multiples of ``s`` from the declared open, the windows of the pause carry defaults (held
    values first), and their chunks are released on time by :meth:`Pipeline.advance` — the
    number of chunks is the grid's between the open and the close, whatever the samples."""
    gaze = simulate_gaze(20.0, 120.0, 3)
    a, b = gaze.slice(0, 1260), gaze.slice(1260, 2400)
    pause = 120.0
    later = GazeSamples(b.timestamps + pause, b.x_deg, b.y_deg, b.pupil_mm, b.valid)
    opens = float(a.timestamps[0]) - 0.3
    closes = float(later.timestamps[-1]) + 0.2
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
            mechanism=mechanism(), opens_at=opens,
        )  # fmt: skip
        assert pipe.grid_s == pytest.approx(32 * FAST.step_s)
        out = [c for i in range(0, len(a), 12) for c in pipe.push(a.slice(i, i + 12))]
        during = []
        for tick in np.arange(float(a.timestamps[-1]), float(later.timestamps[0]), 0.25):
            during += pipe.advance(float(tick))
        out += during
        out += [c for i in range(0, len(later), 12) for c in pipe.push(later.slice(i, i + 12))]
        out += pipe.advance(closes)
    assert len(during) >= pause / pipe.grid_s - 3  # released while no sample came
    assert [c.message.chunk_index for c in out] == list(range(len(out)))
    start = math.ceil(opens / pipe.grid_s) * pipe.grid_s
    steps = math.floor((closes - start - FAST.window_s) / FAST.step_s + 1e-9) + 1
    assert len(out) == steps // 32
    stamps = np.concatenate([c.message.timestamps for c in out])
    want = start + FAST.window_s + FAST.step_s * np.arange(len(stamps))
    np.testing.assert_allclose(stamps, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("phase", [0.0, 0.05, 0.851, 1.599])
def test_a_sessions_grid_starts_at_its_public_phase(tmp_path: Path, phase: float) -> None:
    """With a phase, the session's first window starts on ``phase + k · grid_s``, the first
    such point at or after the open; the steps follow one another a step apart."""
    gaze = simulate_gaze(12.0, 120.0, 4)
    opens = float(gaze.timestamps[0]) + 0.13
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
            mechanism=mechanism(), opens_at=opens, phase_s=phase,
        )  # fmt: skip
        out = [c for i in range(0, len(gaze), 12) for c in pipe.push(gaze.slice(i, i + 12))]
    assert out
    start = out[0].message.timestamps[0] - FAST.window_s
    assert opens <= start < opens + pipe.grid_s
    k = (start - phase) / pipe.grid_s
    assert k == pytest.approx(round(k), abs=1e-9)
    stamps = np.concatenate([c.message.timestamps for c in out])
    np.testing.assert_allclose(np.diff(stamps), FAST.step_s, rtol=0, atol=1e-9)


@pytest.mark.parametrize("phase", [-0.05, 1.6, 7.0])
def test_a_phase_outside_the_period_is_refused(tmp_path: Path, phase: float) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger, pytest.raises(ConfigError, match="phase_s"):
        Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
            mechanism=mechanism(), phase_s=phase,
        )  # fmt: skip


def test_session_phases_are_public_stable_and_spread_over_the_period() -> None:
    """A function of the session id alone, to the millisecond below the period, and spread
    over it: 3,200 sessions fill each 0.5 s of the period within a factor of 1.5 of the mean,
    and share few milliseconds (the chunks of sessions on one clock come due apart)."""
    phases = [session_phase(f"hmd-{i}", 16.0) for i in range(3200)]
    assert phases == [session_phase(f"hmd-{i}", 16.0) for i in range(3200)]
    assert all(0.0 <= p < 16.0 and abs(p * 1000 - round(p * 1000)) < 1e-6 for p in phases)
    assert len(set(phases)) > 2800
    counts = np.bincount((np.array(phases) / 0.5).astype(int), minlength=32)
    assert counts.min() > 100 / 1.5
    assert counts.max() < 100 * 1.5


def test_a_pause_shorter_than_a_segment_break_is_walked(tmp_path: Path) -> None:
    """Within ``pause_s`` the feature window runs on through the gap (held values, then
    defaults): the grid of steps, and so the chunks, stay continuous."""
    gaze = simulate_gaze(20.0, 120.0, 3)
    a, b = gaze.slice(0, 1200), gaze.slice(1200, 2400)
    later = GazeSamples(b.timestamps + 3.0, b.x_deg, b.y_deg, b.pupil_mm, b.valid)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST, mechanism=mechanism()
        )
        out = chunked(pipe, a, later)
    steps = np.concatenate([c.timestamps for c in out])
    np.testing.assert_allclose(np.diff(steps), FAST.step_s)


def test_feed_many_completes_the_chunks_each_session_feed_completes(tmp_path: Path) -> None:
    """:func:`feed_many` (the fleet's events and features) gives every session the
    chunks its own :meth:`Pipeline.feed` gives, bit for bit, blocks of several sizes mixed (one
    session pausing), and a block the extractor refuses (times going back) is that session's
    error alone."""
    gaze = [simulate_gaze(12.0, 120.0, seed) for seed in (11, 12, 13)]
    pause = 60.0
    with Ledger(tmp_path / "a.sqlite") as one, Ledger(tmp_path / "b.sqlite") as many:

        def pipes(ledger: Ledger) -> list[Pipeline]:
            return [
                Pipeline(
                    ledger,
                    session=f"s{i}",
                    device="hmd",
                    rate_hz=120.0,
                    features=FAST,
                    mechanism=mechanism(),
                    clock_offset_s=1.7e9,
                )
                for i in range(3)
            ]

        alone, together = pipes(one), pipes(many)
        want: list[list[Chunk]] = [[], [], []]
        got: list[list[Chunk]] = [[], [], []]
        rounds = 0
        for start in range(0, len(gaze[0]), 36):
            blocks = []
            for i, g in enumerate(gaze):
                size = (12, 36, 36)[i]  # session 0 in three blocks, the others in one
                parts = [g.slice(a, a + 12) for a in range(start, start + 36, 12)]
                block = GazeSamples.concat(parts) if size == 36 else parts[0]
                if i == 2 and start >= len(g) // 2:  # session 2 resumes after a pause
                    block = GazeSamples(block.timestamps + pause, block.x_deg, block.y_deg,
                                        block.pupil_mm, block.valid)  # fmt: skip
                blocks.append(block)
            for i, block in enumerate(blocks):
                want[i] += alone[i].feed(block)
            jobs, refused = feed_many(list(zip(together, blocks, strict=True)))
            assert refused == []
            for pipe, chunk in jobs:
                got[together.index(pipe)].append(chunk)
            rounds += 1
        assert rounds > 5
        for w, g in zip(want, got, strict=True):
            assert len(w) == len(g) > 0
            for a, b in zip(w, g, strict=True):
                assert a.index == b.index
                np.testing.assert_array_equal(a.values, b.values)
                np.testing.assert_array_equal(a.timestamps, b.timestamps)
        back = gaze[0].slice(0, 12)  # older than what session 0 has
        jobs, refused = feed_many([(together[0], back), (together[1], gaze[1].slice(0, 0))])
        assert jobs == []
        assert [(pipe, type(exc)) for pipe, exc in refused] == [(together[0], StreamError)]


def test_samples_after_their_windows_were_released_are_dropped_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream whose samples come later than the clock released their windows (a replay
    faster than real time) loses them, and the local log says so, naming the way out."""
    gaze = simulate_gaze(20.0, 120.0, 3)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(
            ledger, session="u1", device="hmd", rate_hz=120.0, features=FAST,
            mechanism=mechanism(), opens_at=0.0,
        )  # fmt: skip
        pipe.advance(10.0)  # the clock is 10 s ahead of the samples
        for start in range(0, len(gaze), 120):
            pipe.queue(gaze.slice(start, start + 120))
        assert pipe.extractor.stats.late_samples == 1200  # the first 10 s
        assert pipe.extractor.stats.early_samples == 0
        assert len(pipe.advance(25.0)) > 0  # the rest is released
    said = [r.getMessage() for r in caplog.records if "arrived after" in r.getMessage()]
    assert said
    assert len(said) <= 4  # not once per block: when the count doubles
    assert "--speed 1" in said[0]
