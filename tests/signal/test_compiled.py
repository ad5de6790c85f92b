"""The compiled passes (:mod:`gazeguard.signal.compiled`, numba) against the numpy reference: the
same event rows bit for bit (``tobytes``), the same counters and the same ``finish`` events,
for random recordings (blinks, dropouts, noise, 30-500 Hz, jitter; long fixations, invalid runs
and sweeps cut at the grid), random block splits and several detector settings (the stream's
declared rate or another one); the same feature vectors and counters from ``push`` (pupils in and
out of range or missing), also in a fleet worker's pattern (many sessions, blocks decoded from
the wire). Skipped where numba is not installed."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal import compiled, events, features, rawgaze
from gazeguard.signal.compiled import Kernels, load_kernels
from gazeguard.signal.events import EventDetector, Row
from gazeguard.signal.features import NAMES, FeatureExtractor
from gazeguard.signal.rawgaze import decode_many, encode_gaze
from tests.signal.test_feature_properties import (
    SIZES,
    WINDOWS,
    Recorded,
    Windows,
    long_runs,
    pieces,
    recordings,
)

pytest.importorskip("numba")

# Detector settings; without "rate_hz" the stream's declared rate. 200 Hz declares the gap
# threshold 20 ms (and h = 1) whatever the stream's rate; 120 Hz another rate than the samples'.
DETECTORS = st.sampled_from(
    [
        {},
        {"rate_hz": 200.0},
        {"velocity_threshold_deg_s": 80.0},
        {"velocity_halfwidth_s": 0.02, "min_blink_s": 0.02},
        {"rate_hz": 120.0, "min_fixation_s": 0.1},
    ]
)


def passes(on: bool) -> Kernels | None:
    """The compiled passes (``on``) or ``None`` (numpy), as a fleet worker chooses them."""
    kernels = load_kernels(on)
    assert (kernels is not None) is on
    return kernels


def detector(rate: float, kw: dict[str, float], kernels: Kernels | None) -> EventDetector:
    """A detector with settings ``kw`` for a stream declared at ``rate`` Hz, running
    ``kernels``."""
    return EventDetector(**{"rate_hz": rate, **kw}, kernels=kernels)


def detect(blocks: list[GazeSamples], rate: float, kw: dict[str, float], on: bool) -> tuple[
    list[Row], dict[str, object], events.Events
]:  # fmt: skip
    det = detector(rate, kw, passes(on))
    rows: list[Row] = []
    for block in blocks:
        rows += det._push_rows(block)
    return rows, dataclasses.asdict(det.stats), det.finish()


def same_events(a: events.Events, b: events.Events) -> None:
    assert len(a) == len(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), f.name


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(rec=recordings(), sizes=SIZES, kw=DETECTORS)
def test_compiled_pass_gives_the_numpy_rows_bit_for_bit(
    rec: Recorded, sizes: list[int], kw: dict[str, float]
) -> None:
    block, rate = rec
    blocks = pieces(block, sizes)
    ref_rows, ref_stats, ref_end = detect(blocks, rate, kw, on=False)
    rows, stats, end = detect(blocks, rate, kw, on=True)
    assert np.array(rows).tobytes() == np.array(ref_rows).tobytes()
    assert [len(r) for r in rows] == [len(r) for r in ref_rows]
    assert stats == ref_stats
    same_events(end, ref_end)


@pytest.mark.slow
@pytest.mark.parametrize("rate", [20.0, 30.0, 120.0, 300.0, 500.0, 1000.0])
@pytest.mark.parametrize("t0", [100.0, 100.0137, 99.5])
@pytest.mark.parametrize("sizes", [[1], [7, 1, 50], [100000]])
def test_compiled_pass_cuts_long_runs_like_numpy(rate: float, t0: float, sizes: list[int]) -> None:
    """Long fixations, invalid runs and sweeps cut at the grid (samples on the grid points,
    off them, half an interval ahead; cuts at block boundaries, the open run's anchor packed
    and unpacked between pushes): the same rows, counters and ``finish`` events."""
    blocks = pieces(long_runs(rate, t0, int(rate)), sizes)
    for kw in ({}, {"velocity_halfwidth_s": 0.02}):
        ref_rows, ref_stats, ref_end = detect(blocks, rate, kw, on=False)
        rows, stats, end = detect(blocks, rate, kw, on=True)
        assert np.array(rows).tobytes() == np.array(ref_rows).tobytes()
        assert stats == ref_stats
        same_events(end, ref_end)
        t_end = np.array([*(r[4] for r in rows), *end.t_end.tolist()])
        assert np.count_nonzero(t_end % events.SPLIT_GRID_S == 0) >= 5  # cut 5 times or more


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
    rec: Recorded, sizes: list[int], ws: Windows, seed: int, share_out: float
) -> None:
    block, rate = rec
    blocks = pieces(with_pupils(block, seed, share_out), sizes)
    out = {}
    for on in (False, True):
        fx = FeatureExtractor(ws[0], ws[1], hold_limit_s=ws[2], rate_hz=rate, kernels=passes(on))
        got = [fx.push(b) for b in blocks]
        out[on] = (
            [(x.tobytes(), t.tobytes()) for x, t in got],
            dataclasses.asdict(fx.stats),
            dataclasses.asdict(fx.detector.stats),
        )
    assert out[True] == out[False]


def test_compiled_fleet_pattern_gives_the_same_vectors() -> None:
    """A fleet worker's path: 40 s of 120 Hz gaze in 1-s blocks for 6 sessions, decoded from
    the wire one at a time (read-only arrays, as :func:`~gazeguard.signal.rawgaze.decode_many` gives
    a lone block) and pushed session by session in turn, compiled against numpy: the same
    vectors and counters, bit for bit (and the sessions do have fixations, saccades and
    blinks)."""
    gazes = [simulate_gaze(40.0, 120.0, seed) for seed in range(1, 7)]
    wire = [[encode_gaze(g.slice(120 * j, 120 * (j + 1))) for g in gazes] for j in range(40)]
    out = {}
    for on in (False, True):
        kernels = passes(on)
        fxs = [FeatureExtractor(10.0, 0.5, rate_hz=120.0, kernels=kernels) for _ in gazes]
        xs: list[bytes] = []
        for payloads in wire:
            blocks = [decode_many([p], kernels).blocks[0] for p in payloads]  # as a worker gets one
            assert not blocks[0].timestamps.flags.writeable  # type: ignore[union-attr]
            for fx, block in zip(fxs, blocks, strict=True):
                assert not isinstance(block, Exception)
                X, t = fx.push(block)
                xs += [X.tobytes(), t.tobytes()]
        out[on] = xs, [dataclasses.asdict(fx.detector.stats) for fx in fxs]
    assert out[True] == out[False]
    kinds = out[True][1][0]["events"]
    assert min(kinds[events.EventKind.FIXATION], kinds[events.EventKind.SACCADE]) > 20
    assert kinds[events.EventKind.BLINK] > 0


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 1100),
    pad=st.integers(0, 20),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 1.0, 1e3, 1e8]),
)
def test_pairwise_sum_is_numpys_sum_bit_for_bit(n: int, pad: int, seed: int, scale: float) -> None:
    """:func:`compiled._pairwise_sum` (as Python; the kernels run the same code) against
    ``np.add.reduce`` of a slice, 1-D and as a row of a 2-D reduction (what the feature
    extractor calls): the same bits, in one block (<= 128) and split in halves (> 128)."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((3, n + 2 * pad)) * scale ** rng.uniform(0, 1, (3, n + 2 * pad))
    lo = pad
    rows = np.add.reduce(m[:, lo : lo + n], axis=1)
    for r in range(3):
        got = compiled._pairwise_sum(m[r], lo, n)
        assert got == float(np.add.reduce(m[r, lo : lo + n])) == rows[r]
        assert math.copysign(1.0, got) == math.copysign(1.0, float(rows[r]))


def ring(values: np.ndarray, lo: int) -> features._Ring:
    """An event ring holding ``values`` (rows, n) from column ``lo`` on, all in the window."""
    r = features._Ring(values.shape[0])
    r.vals = np.concatenate([np.full((values.shape[0], lo), 99.0), values], axis=1)
    r.lo, r.hi = lo, lo + values.shape[1]
    return r


@settings(max_examples=200, deadline=None)
@given(
    counts=st.tuples(st.integers(0, 400), st.integers(0, 400), st.integers(0, 40)),
    lo=st.integers(0, 9),
    seed=st.integers(0, 2**16),
    w=st.sampled_from([2.0, 10.0, 30.0]),
)
def test_compiled_window_statistics_are_numpys_bit_for_bit(
    counts: tuple[int, int, int], lo: int, seed: int, w: float
) -> None:
    """The compiled event statistics of a window (:meth:`FeatureExtractor.
    _event_values_compiled`) against the numpy reference (:meth:`_event_values`), for windows
    of 0-400 fixations and saccades and 0-40 blinks (some over numpy's 128-value summation
    block) at any offset of their rings: the same values and NaNs, bit for bit."""
    rng = np.random.default_rng(seed)
    fx = FeatureExtractor(w, 0.5, rate_hz=120.0)
    nf, ns, nb = counts
    fx._fix = ring(rng.uniform(0.06, 2.0, (2, nf)), lo)
    fx._sac = ring(rng.uniform(0.0, 40.0, (3, ns)), lo)
    fx._blink = ring(rng.uniform(0.05, 0.5, (1, nb)), lo)
    fx._sac_count = rng.integers(0, ns + 1, 7).tolist()
    for n, book in fx._ns_books:  # the window's n-grams, as _slide would hold them
        for code in rng.integers(0, 16**n, max(0, ns - n + 1)).tolist():
            book.add(code)
    kernels = passes(True)
    assert kernels is not None
    got = fx._event_values_compiled(kernels, w)
    ref = np.array(fx._event_values(w))
    assert got.tobytes() == ref.tobytes()
    assert np.isnan(ref).sum() >= 5  # the pupil and the valid fraction: the caller's
    assert np.isfinite(ref[: NAMES.index("blink_rate")]).all() == (nf > 0 and ns > 0)


@settings(max_examples=200, deadline=None)
@given(
    raw=st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=64) | st.just(-0.0),
        min_size=48,
        max_size=48,
    ),
)
def test_compiled_clip_is_numpys(raw: list[float]) -> None:
    """:func:`compiled._clip` (compiled) against ``np.minimum(np.maximum(raw, lo), hi)`` with
    the extractor's public bounds: the same values and count of clipped ones; -1 if any is
    NaN."""
    fx = FeatureExtractor(30.0, 0.5, rate_hz=120.0)
    kernels = passes(True)
    assert kernels is not None
    x = np.array(raw)
    out = np.empty_like(x)
    n = kernels.clip(x, fx.lo, fx.hi, out)
    if np.isnan(x).any():
        assert n == -1
        return
    ref = np.minimum(np.maximum(x, fx.lo), fx.hi)
    assert out.tobytes() == ref.tobytes()
    assert n == int(np.count_nonzero(ref != x))


def test_compiled_code_uses_the_detectors_codes_and_scales() -> None:
    assert (compiled._C_UNDEF, compiled._C_SLOW, compiled._C_FAST, compiled._C_INVALID) == (
        events._C_UNDEF, events._C_SLOW, events._C_FAST, events._C_INVALID,
    )  # fmt: skip
    kinds = (compiled._K_UNDEFINED, compiled._K_FIXATION, compiled._K_SACCADE, compiled._K_BLINK)
    assert (*kinds, compiled._K_LOSS) == tuple(events.EventKind)
    assert compiled._QUANTUM == events._QUANTUM

    def at(prefix: str, *names: str) -> tuple[int, ...]:
        return tuple(NAMES.index(f"{prefix}_{n}") for n in names)

    fix = at("fixation", "rate", "duration_mean", "duration_var", "duration_max", "dispersion_mean")
    sac = at("saccade", "rate", "amplitude_mean", "amplitude_var", "amplitude_max",
             "peak_velocity_mean", "peak_velocity_max", "duration_mean")  # fmt: skip
    assert (fix, sac, at("blink", "rate", "duration_mean", "duration_var")) == (
        compiled._V_FIX, compiled._V_SAC, compiled._V_BLINK,
    )  # fmt: skip
    assert at("saccade", "fixation_ratio") == (compiled._V_SAC_FIX_RATIO,)
    clip = np.array([-2e5, 2e5])
    lim = compiled._CLIP_DEG
    assert (events._quantise(clip) == np.rint(clip.clip(-lim, lim) * compiled._QUANTUM)).all()


def test_compiled_pass_can_be_turned_off_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``GAZEGUARD_COMPILED=0``: numpy passes even where numba is installed (a load that
    the environment declined is not remembered)."""
    monkeypatch.setenv("GAZEGUARD_COMPILED", "0")
    assert load_kernels() is None
    monkeypatch.delenv("GAZEGUARD_COMPILED")
    assert load_kernels() is not None


@st.composite
def payloads(draw: st.DrawFn) -> list[bytes]:
    """Raw gaze blocks (:mod:`gazeguard.signal.rawgaze`), some of one size (numpy decodes those
    together), with NaN, inf and any NaN bit pattern in any column, timestamps that may fall
    back or stop being finite, and some malformed (short, wrong magic, wrong length)."""
    sizes = draw(st.lists(st.sampled_from([0, 1, 2, 7, 120]), min_size=1, max_size=6))
    out = []
    value = st.floats(width=64) | st.sampled_from([math.nan, -math.nan, math.inf, -0.0])
    for n in sizes:
        t = np.cumsum(draw(st.lists(st.floats(-0.01, 0.05), min_size=n, max_size=n)) or [0.0])
        cols = [draw(st.lists(value, min_size=n, max_size=n)) for _ in range(3)]
        a = np.array([t[:n], *cols], dtype="<f8").reshape(4, n)
        if n and draw(st.booleans()):
            a[0, draw(st.integers(0, n - 1))] = draw(st.sampled_from([math.nan, math.inf]))
        raw = rawgaze._HEADER.pack(rawgaze.RAW_MAGIC, n) + a.tobytes()
        fault = draw(st.sampled_from(["", "", "", "short", "magic", "length"]))
        if fault == "short":
            raw = raw[:5]
        elif fault == "magic":
            raw = b"GGR0" + raw[4:]
        elif fault == "length":
            raw += bytes(8)
        out.append(raw)
    return out


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(batch=payloads())
def test_compiled_decode_gives_the_numpy_blocks_bit_for_bit(batch: list[bytes]) -> None:
    """:func:`~gazeguard.signal.rawgaze.decode_many` with the compiled decode against numpy: the
    same arrays (bit for bit, NaN patterns included), the same errors, first and last
    timestamps and increasing flags."""
    got = {}
    for on in (False, True):
        d = rawgaze.decode_many(batch, passes(on))
        blocks = [
            str(b)
            if isinstance(b, Exception)
            else [getattr(b, f).tobytes() for f in ("timestamps", "x_deg", "y_deg", "pupil_mm")]
            + [b.valid.tobytes()]
            for b in d.blocks
        ]
        got[on] = (blocks, np.array(d.first).tobytes(), np.array(d.last).tobytes(), d.increasing)
    assert got[True] == got[False]
