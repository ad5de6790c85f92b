"""The compiled passes (:mod:`gazeguard.compiled`, numba) against the numpy reference: the
same event rows bit for bit (``tobytes``), the same counters and the same ``finish`` events,
for random recordings (blinks, dropouts, noise, 30-500 Hz, jitter), random block splits and
several detector settings; the same feature vectors and counters from ``push`` (pupils in and
out of range or missing) and from ``push_many`` (a fleet worker's path). Skipped where numba
is not installed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_feature_properties import SIZES, WINDOWS, Windows, pieces, recordings

from gazeguard import compiled, events
from gazeguard.compiled import use_compiled
from gazeguard.events import EventDetector, Row
from gazeguard.features import FeatureExtractor, push_many
from gazeguard.rawgaze import decode_many, encode_gaze
from gazeguard.samples import GazeSamples
from gazeguard.simulate import simulate_gaze

pytest.importorskip("numba")

DETECTORS = st.sampled_from(
    [
        {},
        {"max_gap_s": 0.02},
        {"velocity_threshold_deg_s": 80.0},
        {"velocity_halfwidth_s": 0.02, "min_blink_s": 0.02},
        {"sampling_rate_hz": 120.0, "min_fixation_s": 0.1},
    ]
)


def detect(blocks: list[GazeSamples], kw: dict[str, float], on: bool) -> tuple[
    list[Row], dict[str, object], events.Events
]:  # fmt: skip
    assert use_compiled(on) is on
    det = EventDetector(**kw)
    rows: list[Row] = []
    for block in blocks:
        rows += det._push_rows(block)
    return rows, dataclasses.asdict(det.stats), det.finish()


def same_events(a: events.Events, b: events.Events) -> None:
    assert len(a) == len(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), f.name


@settings(max_examples=150, deadline=None)
@given(rec=recordings(), sizes=SIZES, kw=DETECTORS)
def test_compiled_pass_gives_the_numpy_rows_bit_for_bit(
    rec: GazeSamples, sizes: list[int], kw: dict[str, float]
) -> None:
    blocks = pieces(rec, sizes)
    ref_rows, ref_stats, ref_end = detect(blocks, kw, on=False)
    rows, stats, end = detect(blocks, kw, on=True)
    assert np.array(rows).tobytes() == np.array(ref_rows).tobytes()
    assert [len(r) for r in rows] == [len(r) for r in ref_rows]
    assert stats == ref_stats
    same_events(end, ref_end)


def with_pupils(rec: GazeSamples, seed: int, share_out: float) -> GazeSamples:
    """``rec`` with a share of its pupils (where it has any) moved out of range or to NaN."""
    rng = np.random.default_rng(seed)
    p = rec.pupil_mm.copy()
    hit = rng.uniform(size=len(p)) < share_out
    p[hit] = rng.choice([0.5, 12.0, np.nan, np.inf], size=int(hit.sum()))
    return GazeSamples(rec.timestamps, rec.x_deg, rec.y_deg, p, rec.valid)


@settings(max_examples=60, deadline=None)
@given(
    rec=recordings(),
    sizes=SIZES,
    ws=WINDOWS,
    seed=st.integers(0, 2**16),
    share_out=st.sampled_from([0.0, 0.01, 0.3]),
)
def test_compiled_passes_give_the_numpy_vectors_bit_for_bit(
    rec: GazeSamples, sizes: list[int], ws: Windows, seed: int, share_out: float
) -> None:
    blocks = pieces(with_pupils(rec, seed, share_out), sizes)
    out = {}
    for on in (False, True):
        assert use_compiled(on) is on
        fx = FeatureExtractor(ws[0], ws[1], hold_limit_s=ws[2])
        got = [fx.push(b) for b in blocks]
        out[on] = (
            [(x.tobytes(), t.tobytes()) for x, t in got],
            dataclasses.asdict(fx.stats),
            dataclasses.asdict(fx.detector.stats),
        )
    assert out[True] == out[False]


def test_compiled_push_many_gives_the_same_vectors() -> None:
    """A fleet worker's path: 40 s of 120 Hz gaze in 1-s blocks for 6 sessions, decoded from
    the wire one at a time (read-only arrays, as :func:`~gazeguard.rawgaze.decode_many` gives
    a lone block) and
    through ``push_many``, compiled against numpy: the same vectors and counters, bit for bit
    (and the sessions do have fixations, saccades and blinks)."""
    gazes = [simulate_gaze(40.0, 120.0, seed) for seed in range(1, 7)]
    wire = [[encode_gaze(g.slice(120 * j, 120 * (j + 1))) for g in gazes] for j in range(40)]
    out = {}
    for on in (False, True):
        assert use_compiled(on) is on
        fxs = [FeatureExtractor(10.0, 0.5) for _ in gazes]
        xs: list[bytes] = []
        for payloads in wire:
            blocks = [decode_many([p]).blocks[0] for p in payloads]  # as a worker gets one
            assert not blocks[0].timestamps.flags.writeable  # type: ignore[union-attr]
            got = push_many(list(zip(fxs, blocks, strict=True)))  # type: ignore[arg-type]
            for res in got:
                assert not isinstance(res, Exception)
                xs += [res[0].tobytes(), res[1].tobytes()]
        out[on] = xs, [dataclasses.asdict(fx.detector.stats) for fx in fxs]
    assert out[True] == out[False]
    kinds = out[True][1][0]["events"]
    assert min(kinds[events.EventKind.FIXATION], kinds[events.EventKind.SACCADE]) > 20
    assert kinds[events.EventKind.BLINK] > 0


def test_compiled_code_uses_the_detectors_codes_and_scales() -> None:
    assert (compiled._C_UNDEF, compiled._C_SLOW, compiled._C_FAST, compiled._C_INVALID) == (
        events._C_UNDEF, events._C_SLOW, events._C_FAST, events._C_INVALID,
    )  # fmt: skip
    kinds = (compiled._K_UNDEFINED, compiled._K_FIXATION, compiled._K_SACCADE, compiled._K_BLINK)
    assert (*kinds, compiled._K_LOSS) == tuple(events.EventKind)
    assert compiled._QUANTUM == events._QUANTUM
    clip = np.array([-2e5, 2e5])
    lim = compiled._CLIP_DEG
    assert (events._quantise(clip) == np.rint(clip.clip(-lim, lim) * compiled._QUANTUM)).all()


def test_compiled_pass_can_be_turned_off_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``GAZEGUARD_COMPILED=0``: numpy passes even where numba is installed (a load that
    the environment declined is not remembered)."""
    monkeypatch.setenv("GAZEGUARD_COMPILED", "0")
    assert use_compiled() is False
    assert compiled.active is None
    monkeypatch.delenv("GAZEGUARD_COMPILED")
    assert use_compiled() is True
    assert compiled.active is not None
