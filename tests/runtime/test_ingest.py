"""LSL ingest against real outlets in a subprocess (tests/lsl_outlet.py) and the real simulator.

Every stream is resolved by a unique source_id, so parallel runs do not see each other. Outlets
encode known gaze (degrees, mm) in each bridge's real channel layout; the test checks what comes
out of GazeStream against the truth.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gazeguard.config import IngestSettings
from gazeguard.core.errors import ConfigError, StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.ingest import GazeStream, declared_rate
from gazeguard.runtime.presets import (
    GAZEGUARD_CHANNELS,
    EyeChannels,
    IngestStats,
    Layout,
    Normalizer,
    normalized_to_deg,
    screen_to_deg,
)
from gazeguard.runtime.simulate import SimulatedHeadset, simulate_gaze
from gazeguard.signal.features import FeatureExtractor, extract_features

pytestmark = pytest.mark.network

OUTLET = Path(__file__).resolve().parents[1] / "lsl_outlet.py"
N = 40
X_TRUE = np.linspace(-20.0, 20.0, N)
Y_TRUE = np.linspace(12.0, -12.0, N)
P_TRUE = np.linspace(3.0, 5.0, N)
INVALID = np.zeros(N, bool)
INVALID[[5, 6, 30]] = True  # rows each preset encodes as "invalid" in its own way
GG_META = [dict(zip(("label", "eye", "type", "unit"), c, strict=True)) for c in GAZEGUARD_CHANNELS]


class Outlets:
    """Starts tests/lsl_outlet.py processes and kills them at the end of the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self,
        source_id: str,
        data: np.ndarray[Any, Any],
        meta: dict[str, Any],
        rel_t: np.ndarray[Any, Any] | None = None,
        linger: float = 30.0,
    ) -> subprocess.Popen[str]:
        n = data.shape[0]
        rate = meta.get("srate") or 250.0
        rel = np.arange(n) / rate if rel_t is None else rel_t
        spec = self.tmp / f"spec{len(self.procs)}.npz"
        np.savez(spec, data=data, rel_t=rel, meta=json.dumps(meta))
        proc = subprocess.Popen(
            [
                sys.executable,
                str(OUTLET),
                str(spec),
                "--source-id",
                source_id,
                "--linger",
                str(linger),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.procs.append(proc)  # closed by close() even if it never gets ready (no leaked pipe)
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        assert ready == "READY", f"outlet {source_id!r} did not start: {ready!r}"
        return proc

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


@pytest.fixture
def outlets(tmp_path: Path) -> Iterator[Outlets]:
    o = Outlets(tmp_path)
    yield o
    o.close()


def collect(
    settings: IngestSettings,
    until: Callable[[GazeSamples], bool],
    timeout: float = 15.0,
    **kw: Any,
) -> tuple[GazeSamples, IngestStats, str]:
    """Read blocks until ``until(all samples so far)``; return them, the stats and the preset."""

    async def run() -> tuple[GazeSamples, IngestStats, str]:
        blocks: list[GazeSamples] = []
        async with GazeStream(settings, poll_interval_s=0.02, **kw) as stream:
            async with asyncio.timeout(timeout):
                async for block in stream:
                    blocks.append(block)
                    if until(_cat(blocks)):
                        break
            return _cat(blocks), stream.stats, stream.info.preset

    return asyncio.run(run())


def _cat(blocks: list[GazeSamples]) -> GazeSamples:
    if not blocks:
        e = np.zeros(0)
        return GazeSamples(e, e, e, e, np.zeros(0, bool))
    return GazeSamples(
        np.concatenate([b.timestamps for b in blocks]),
        np.concatenate([b.x_deg for b in blocks]),
        np.concatenate([b.y_deg for b in blocks]),
        np.concatenate([b.pupil_mm for b in blocks]),
        np.concatenate([b.valid for b in blocks]),
    )


def has(n: int) -> Callable[[GazeSamples], bool]:
    return lambda s: len(s) >= n


# -- encoders: ground truth (deg, mm) in each bridge's channel layout --------------------------
FOV = (100.0, 90.0)
SCREEN_MM, DIST_MM, RES = (533.0, 301.0), 565.0, (1920, 1080)


def inv_fov(x: np.ndarray, y: np.ndarray, fov: tuple[float, float], y_up: bool) -> tuple[Any, Any]:
    u = (np.tan(np.radians(x)) / math.tan(math.radians(fov[0] / 2)) + 1) / 2
    dv = np.tan(np.radians(y)) / math.tan(math.radians(fov[1] / 2))
    v = (dv + 1) / 2 if y_up else (1 - dv) / 2
    return u, v


def inv_screen(x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    dx = DIST_MM * np.tan(np.radians(x))
    dy = np.hypot(DIST_MM, dx) * np.tan(np.radians(y))
    return dx / SCREEN_MM[0] + 0.5, 0.5 - dy / SCREEN_MM[1]


def enc_gazeguard() -> tuple[np.ndarray, dict[str, Any], IngestSettings]:
    data = np.column_stack([np.arange(N), X_TRUE, Y_TRUE, P_TRUE, ~INVALID])
    meta = {
        "name": "gazeguard-test",
        "type": "Gaze",
        "srate": 250.0,
        "manufacturer": "gazeguard",
        "channels": GG_META,
    }
    return data, meta, IngestSettings()


def enc_pupil_capture() -> tuple[np.ndarray, dict[str, Any], IngestSettings]:
    data = np.full((N, 22), np.nan)
    data[:, 0] = np.where(INVALID, 0.3, 0.95)  # confidence below the 0.6 threshold → invalid
    data[:, 1], data[:, 2] = inv_fov(X_TRUE, Y_TRUE, FOV, y_up=True)
    three_d = np.arange(N) % 2 == 0  # 3d mapper rows carry gaze_point_3d (x right, y down), mm
    gz = 500.0
    gx = gz * np.tan(np.radians(X_TRUE))
    gy = -np.hypot(gx, gz) * np.tan(np.radians(Y_TRUE))
    data[three_d, 3], data[three_d, 4], data[three_d, 5] = gx[three_d], gy[three_d], gz
    data[:, 18:20] = 40.0  # 2d diameters in pixels: not used
    data[:, 20] = P_TRUE
    data[:, 21] = np.where(np.arange(N) % 3 == 0, np.nan, P_TRUE)  # monocular rows
    meta = {"name": "pupil_capture", "type": "Gaze", "srate": 0.0}
    return data, meta, IngestSettings(field_of_view_deg=FOV)


def enc_pupil_neon() -> tuple[np.ndarray, dict[str, Any], IngestSettings]:
    u, v = inv_fov(X_TRUE, Y_TRUE, (103.0, 77.0), y_up=False)
    data = np.zeros((N, 16))
    data[:, 0], data[:, 1] = u * 1600, v * 1200
    data[INVALID, :2] = np.nan
    data[:, 2], data[:, 9] = P_TRUE - 0.1, P_TRUE + 0.1  # left / right PupilDiameter, mm
    meta = {"name": "Neon Companion_Neon Gaze", "type": "Gaze", "srate": 200.0}
    return data, meta, IngestSettings()


def enc_tobii() -> tuple[np.ndarray, dict[str, Any], IngestSettings]:
    u, v = inv_screen(X_TRUE, Y_TRUE)
    data = np.column_stack([u, v, P_TRUE, u, v, P_TRUE])
    data[INVALID] = np.nan  # both eyes invalid
    data[10, :3] = np.nan  # left eye lost, right eye still valid
    meta = {"name": "Tobii", "type": "Eyetracker", "srate": 600.0, "format": "float32"}
    return data, meta, IngestSettings(screen_size_mm=SCREEN_MM, screen_distance_mm=DIST_MM)


def enc_eyelink() -> tuple[np.ndarray, dict[str, Any], IngestSettings]:
    ppd = 35.0
    px, py = RES[0] / 2 + X_TRUE * ppd, RES[1] / 2 - Y_TRUE * ppd
    data = np.column_stack(
        [
            px,
            py,
            px,
            py,
            np.full(N, 900.0),
            np.full(N, 900.0),
            np.full(N, ppd),
            np.full(N, ppd),
            np.arange(N),
            np.arange(N),
        ]
    )
    data[INVALID, :6] = 0.0  # both eyes missing
    data[10, [0, 1, 4]] = 0.0  # left eye missing only
    meta = {"name": "EyeLink", "type": "Gaze", "srate": 500.0}
    return data, meta, IngestSettings(screen_resolution_px=RES)


def enc_generic() -> tuple[np.ndarray, dict[str, Any], IngestSettings]:
    u, v = inv_fov(X_TRUE, Y_TRUE, FOV, y_up=False)
    data = np.column_stack([u, v, P_TRUE / 2, np.where(INVALID, 0.1, 0.9)])
    chans = [
        {"label": "gx", "eye": "both", "type": "ScreenX", "unit": "normalized"},
        {"label": "gy", "eye": "both", "type": "ScreenY", "unit": "normalized"},
        {"label": "pr", "eye": "both", "type": "Radius", "unit": "mm"},
        {"label": "conf", "eye": "both", "type": "Confidence", "unit": "normalized"},
    ]
    meta = {"name": "SomeTracker", "type": "Gaze", "srate": 120.0, "channels": chans}
    return data, meta, IngestSettings(field_of_view_deg=FOV)


ENCODERS = {
    "gazeguard": (enc_gazeguard, 1e-9, True),
    "pupil_capture": (enc_pupil_capture, 1e-9, True),
    "pupil_neon": (enc_pupil_neon, 1e-9, True),
    "tobii": (enc_tobii, 2e-3, True),  # float32 channels
    "eyelink": (enc_eyelink, 1e-9, False),  # pupil area has no mm scale
    "generic": (enc_generic, 1e-9, True),
}


@pytest.mark.parametrize("preset", list(ENCODERS))
def test_preset_normalises_real_layout(preset: str, outlets: Outlets, unique_id: str) -> None:
    encode, tol, has_pupil = ENCODERS[preset]
    data, meta, settings = encode()
    outlets.start(unique_id, data, meta)
    s, stats, detected = collect(settings.model_copy(update={"source_id": unique_id}), has(N))
    assert detected == preset  # chosen by `auto` from name, type and metadata
    assert len(s) == N
    np.testing.assert_array_equal(s.valid, ~INVALID)
    assert np.isnan(s.x_deg[INVALID]).all()
    assert np.isnan(s.y_deg[INVALID]).all()
    assert np.isnan(s.pupil_mm[INVALID]).all()
    np.testing.assert_allclose(s.x_deg[~INVALID], X_TRUE[~INVALID], atol=tol)
    np.testing.assert_allclose(s.y_deg[~INVALID], Y_TRUE[~INVALID], atol=tol)
    if has_pupil:
        np.testing.assert_allclose(s.pupil_mm[~INVALID], P_TRUE[~INVALID], atol=tol)
    else:
        assert np.isnan(s.pupil_mm).all()
    assert stats.samples == N
    assert stats.invalid == INVALID.sum()
    assert np.all(np.diff(s.timestamps) > 0)


def test_eyelink_with_screen_geometry(outlets: Outlets, unique_id: str) -> None:
    u, v = inv_screen(X_TRUE, Y_TRUE)
    data = np.zeros((N, 10))
    data[:, 0], data[:, 1] = u * RES[0], v * RES[1]
    data[:, 4], data[:, 6:8] = 900.0, 1.0  # a wrong ppd: geometry must win when it is configured
    outlets.start(unique_id, data, {"name": "EyeLink", "type": "Gaze", "srate": 500.0})
    settings = IngestSettings(
        source_id=unique_id,
        screen_resolution_px=RES,
        screen_size_mm=SCREEN_MM,
        screen_distance_mm=DIST_MM,
    )
    s, _, _ = collect(settings, has(N))
    np.testing.assert_allclose(s.x_deg, X_TRUE, atol=1e-9)
    np.testing.assert_allclose(s.y_deg, Y_TRUE, atol=1e-9)
    assert s.valid.all()  # the right eye is all zeros (missing), the left eye carries the gaze


def test_eyelink_pupil_area_becomes_mm_with_a_calibration(outlets: Outlets, unique_id: str) -> None:
    data, meta, settings = enc_eyelink()
    scale = 0.2  # mm per √(area unit), as measured with an artificial pupil
    area = (P_TRUE / scale) ** 2
    for col in (4, 5):
        data[:, col] = np.where(data[:, col] == 0.0, 0.0, area)  # missing eyes stay missing
    outlets.start(unique_id, data, meta)
    settings = settings.model_copy(update={"source_id": unique_id, "pupil_area_scale_mm": scale})
    s, _, _ = collect(settings, has(N))
    np.testing.assert_array_equal(s.valid, ~INVALID)
    np.testing.assert_allclose(s.pupil_mm[~INVALID], P_TRUE[~INVALID], atol=1e-9)
    assert np.isnan(s.pupil_mm[INVALID]).all()


def test_absurd_values_become_invalid_and_are_counted(outlets: Outlets, unique_id: str) -> None:
    data, meta, _ = enc_gazeguard()
    data[:, 4] = 1.0
    data[3, 1] = 150.0  # beyond 90°: not a gaze direction
    data[8, 2] = -95.0
    data[12, 3] = 25.0  # pupil of 25 mm
    data[13, 3] = 0.2  # pupil of 0.2 mm
    data[14, 3] = 0.0  # pupil loss (a blink): invalid, but not "absurd"
    outlets.start(unique_id, data, meta)
    s, stats, _ = collect(IngestSettings(source_id=unique_id), has(N))
    bad = [3, 8, 12, 13, 14]
    assert not s.valid[bad].any()
    assert s.valid.sum() == N - len(bad)
    assert np.isnan(s.x_deg[bad]).all()
    assert stats.absurd == 4
    assert stats.invalid == 5


@pytest.mark.slow
def test_nan_storm_is_survived_and_counted(
    outlets: Outlets, unique_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    n = 500
    data = np.full((n, 5), np.nan)
    data[:, 0] = np.arange(n)
    data[:, 4] = 0.0
    data[-10:, 1:5] = [1.0, 2.0, 4.0, 1.0]  # the stream recovers at the end
    _, meta, _ = enc_gazeguard()
    meta["srate"] = 500.0
    outlets.start(unique_id, data, meta)
    caplog.set_level(logging.WARNING, "gazeguard.runtime.ingest")
    # end_after_s: after the last sample the outlet lingers silently; iteration then ends.
    s, stats, _ = collect(
        IngestSettings(source_id=unique_id), lambda s: False, stall_after_s=0.3, end_after_s=0.8
    )
    assert len(s) == n
    assert stats.nan == n - 10
    assert stats.invalid == n - 10
    np.testing.assert_array_equal(s.x_deg[-10:], 1.0)
    assert "sent nothing for" in caplog.text  # the stall is logged ...
    assert "ending the stream" in caplog.text  # ... and so is the end


def test_wrong_channel_count_is_a_startup_error(outlets: Outlets, unique_id: str) -> None:
    outlets.start(unique_id, np.zeros((5, 20)), {"name": "pupil_capture", "type": "Gaze"})
    with pytest.raises(
        StreamError, match=r"has 20 channels, but preset 'pupil_capture' expects 22"
    ):
        collect(IngestSettings(source_id=unique_id), has(1))


def test_unknown_unit_is_a_startup_error(outlets: Outlets, unique_id: str) -> None:
    data, meta, _ = enc_generic()
    meta["channels"][0]["unit"] = meta["channels"][1]["unit"] = "furlongs"
    outlets.start(unique_id, data, meta)
    with pytest.raises(
        StreamError, match=r"channel 'gx' \(type 'ScreenX'\) has unknown unit 'furlongs'"
    ):
        collect(IngestSettings(source_id=unique_id), has(1))


def test_resolve_timeout_says_what_was_looked_for(unique_id: str) -> None:
    settings = IngestSettings(source_id=unique_id, resolve_timeout_s=0.3)
    with pytest.raises(
        StreamError, match=rf"no LSL stream with source_id='{unique_id}' appeared within 0.3 s"
    ) as err:
        collect(settings, has(1))
    assert "ingest.source_id" in str(err.value)  # and what to check


def test_duplicate_and_out_of_order_timestamps_are_dropped(
    outlets: Outlets, unique_id: str
) -> None:
    # An irregular-rate stream (no dejitter): liblsl's monotonize turns an earlier timestamp into
    # a copy of the previous one, so both arrive as duplicates; they are dropped and counted.
    rel = np.array([0, 1, 2, 2, 3, 5, 4, 6, 7, 7, 8, 9, *list(range(10, 30))], float) * 0.01
    data, meta, _ = enc_generic()
    data = data[: len(rel)]
    meta["srate"] = 0.0
    outlets.start(unique_id, data, meta, rel_t=rel)
    s, stats, _ = collect(
        IngestSettings(source_id=unique_id, field_of_view_deg=FOV), has(len(rel) - 3)
    )
    assert np.all(np.diff(s.timestamps) > 0)
    assert stats.duplicates + stats.out_of_order == 3
    assert stats.samples == len(rel) - 3
    np.testing.assert_allclose(s.x_deg[:3], X_TRUE[:3], atol=1e-9)  # the first of each pair stays


def test_duplicated_and_reordered_sample_indices_are_dropped(
    outlets: Outlets, unique_id: str
) -> None:
    idx = np.array([0, 1, 2, 2, 3, 4, 6, 5, 7, *list(range(8, 20))], float)
    data = np.column_stack(
        [idx, idx * 0.1, np.zeros_like(idx), np.full_like(idx, 3.0), np.ones_like(idx)]
    )
    _, meta, _ = enc_gazeguard()
    meta["srate"] = 0.0
    rel = np.arange(len(idx)) * 0.004  # timestamps all increase: only the index tells
    outlets.start(unique_id, data, meta, rel_t=rel)
    s, stats, _ = collect(
        IngestSettings(source_id=unique_id), lambda s: len(s) > 0 and s.x_deg[-1] >= 1.9 - 1e-9
    )
    np.testing.assert_allclose(s.x_deg, np.r_[0:5, 6:20] * 0.1, atol=1e-12)
    assert (stats.duplicates, stats.out_of_order, stats.lost) == (1, 1, 1)


@pytest.mark.slow
def test_outlet_killed_and_restarted_resumes_without_duplicates(
    outlets: Outlets, unique_id: str
) -> None:
    _rate, n_a, n_b = 250.0, 5000, 250
    _, meta, _ = enc_gazeguard()

    def rows(n: int, x0: float) -> np.ndarray:
        i = np.arange(
            n, dtype=float
        )  # the index restarts at 0 in the new outlet, like a rebooted headset
        return np.column_stack([i, x0 + i * 1e-3, np.zeros(n), np.full(n, 3.0), np.ones(n)])

    first = outlets.start(unique_id, rows(n_a, 0.0), meta)

    async def run() -> tuple[GazeSamples, IngestStats]:
        blocks: list[GazeSamples] = []
        async with GazeStream(
            IngestSettings(source_id=unique_id), poll_interval_s=0.02, stall_after_s=0.4
        ) as stream:
            async with asyncio.timeout(30):
                restarted = False
                async for block in stream:
                    blocks.append(block)
                    got = _cat(blocks)
                    if not restarted and len(got) >= 250:
                        first.kill()  # the headset dies mid-stream ...
                        first.wait()
                        await asyncio.sleep(1.0)
                        outlets.start(unique_id, rows(n_b, 10.0), meta)  # ... and comes back
                        restarted = True
                    if got.x_deg[-1] >= 10.0 + (n_b - 1) * 1e-3 - 1e-9:
                        break
            return _cat(blocks), stream.stats

    s, stats = asyncio.run(run())
    assert np.all(np.diff(s.timestamps) > 0)
    a, b = s.x_deg[s.x_deg < 10], s.x_deg[s.x_deg >= 10]
    np.testing.assert_allclose(np.diff(a), 1e-3, atol=1e-9)  # old outlet: contiguous until killed
    np.testing.assert_allclose(b, 10.0 + np.arange(n_b) * 1e-3, atol=1e-9)  # new one: all, once
    assert stats.reconnects == 1
    assert stats.stalls >= 1
    assert stats.duplicates == stats.out_of_order == 0


@pytest.mark.slow
def test_live_lsl_and_offline_extract_features_agree(unique_id: str) -> None:
    """The same recording through a real LSL outlet (blocks as they arrive, FeatureExtractor.push)
    and offline through extract_features gives the same feature vectors."""
    rate, seed, window, step = 250.0, 12, 3.0, 0.5
    live_x: list[np.ndarray[Any, Any]] = []
    blocks: list[GazeSamples] = []

    async def run() -> None:
        async with GazeStream(IngestSettings(source_id=unique_id), poll_interval_s=0.05) as stream:
            # the detector is built for the rate the outlet declares, as the service does
            rate_hz = declared_rate(None, stream.info.nominal_srate, stream.info.name)
            assert rate_hz == rate
            fx = FeatureExtractor(window, step, rate_hz=rate_hz)
            async with asyncio.timeout(20):
                async for block in stream:
                    blocks.append(block)
                    live_x.append(fx.push(block)[0])
                    if sum(map(len, live_x)) >= 8:
                        break

    with SimulatedHeadset(rate, seed, source_id=unique_id, duration_s=30):
        asyncio.run(run())
    live = np.concatenate(live_x)
    got = _cat(blocks)
    # The recording: simulate_gaze's samples (bit-exact what the outlet sent) at the LSL clock's
    # timestamps (offline timestamps k/rate would move window edges by float rounding).
    truth = simulate_gaze(30, rate, seed)
    k0 = int(np.flatnonzero(truth.x_deg == got.x_deg[np.flatnonzero(got.valid)[0]])[0])
    k0 -= int(np.flatnonzero(got.valid)[0])
    rec = truth.slice(k0, k0 + len(got))
    for f in ("x_deg", "y_deg", "pupil_mm", "valid"):
        np.testing.assert_array_equal(getattr(got, f), getattr(rec, f))
    offline, _ = extract_features(
        got.timestamps, rec.x_deg, rec.y_deg, rec.pupil_mm, window, step, rate_hz=rate
    )
    assert len(live) >= 8
    np.testing.assert_array_equal(live, offline[: len(live)])  # identical, however it was cut


# -- without LSL: conversions and the ordering filter ------------------------------------------
def test_the_detector_rate_is_declared_never_measured() -> None:
    """``ingest.rate_hz`` when set, else the stream's nominal_srate; an irregular stream (0)
    without the setting, or a rate the detector does not accept, is refused naming the
    setting."""
    assert declared_rate(None, 250.0, "s") == 250.0
    assert declared_rate(120.0, 250.0, "s") == 120.0  # the setting overrides the declaration
    assert declared_rate(90.0, 0.0, "s") == 90.0
    with pytest.raises(ConfigError, match=r"ingest\.rate_hz.*'pupil'.*declares no sampling rate"):
        declared_rate(None, 0.0, "pupil")
    for configured, nominal in ((None, 5000.0), (10.0, 250.0)):
        with pytest.raises(ConfigError, match=r"ingest\.rate_hz") as exc:
            declared_rate(configured, nominal, "s")
        assert exc.value.field.startswith("ingest.rate_hz")


def test_conversions_invert_the_encoders() -> None:
    u, v = inv_fov(X_TRUE, Y_TRUE, FOV, y_up=True)
    x, y = normalized_to_deg(u, v, FOV, y_up=True)
    np.testing.assert_allclose((x, y), (X_TRUE, Y_TRUE), atol=1e-9)
    x, y = screen_to_deg(*inv_screen(X_TRUE, Y_TRUE), SCREEN_MM, DIST_MM)
    np.testing.assert_allclose((x, y), (X_TRUE, Y_TRUE), atol=1e-9)
    # a point 1/4 screen width right of centre at eye level: atan(533/4 / 565)
    x, y = screen_to_deg(np.array([0.75]), np.array([0.5]), SCREEN_MM, DIST_MM)
    assert x[0] == pytest.approx(math.degrees(math.atan(533 / 4 / 565)))
    assert y[0] == 0


def test_order_state_carries_across_blocks() -> None:
    norm = Normalizer(Layout("t", 2, (EyeChannels(0, 1),), "deg", y_up=True))
    raw = np.zeros((3, 2))
    assert len(norm(raw, np.array([1.0, 2.0, 3.0])) or []) == 3
    assert norm(raw[:2], np.array([2.5, 3.0])) is None  # both before/at the last delivered time
    out = norm(raw, np.array([3.0, 4.0, 3.5]))
    assert out is not None
    assert out.timestamps.tolist() == [4.0]
    assert (norm.stats.duplicates, norm.stats.out_of_order) == (2, 2)


def test_pulls_come_at_most_every_half_of_the_lost_interval() -> None:
    """A live stream looks idle for up to a pull interval between pulls: a pull interval over
    half of ``stream_lost_after_s`` would report a live stream lost, so it is refused."""
    assert IngestSettings().pull_every_s == 1.0
    assert GazeStream(IngestSettings(pull_every_s=0.5)).poll_interval_s == 0.5
    assert GazeStream(IngestSettings(), poll_interval_s=0.02).poll_interval_s == 0.02
    # one empty pull is not a stall
    assert GazeStream(IngestSettings()).stall_after_s == 2.0
    assert GazeStream(IngestSettings(pull_every_s=0.25)).stall_after_s == 1.0
    IngestSettings(pull_every_s=2.5, stream_lost_after_s=5.0)
    with pytest.raises(ValueError, match="at most half of stream_lost_after_s"):
        IngestSettings(pull_every_s=3.0, stream_lost_after_s=5.0)
