"""The simulated person, the simulated headset (a real LSL outlet) and replay of recorded files.

Plausibility is checked with a deliberately simple velocity-threshold segmentation written here
(not gazeguard.signal.events), so the simulator is not validated by the code it feeds.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gazeguard.config import IngestSettings
from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.core.samples import GazeSamples
from gazeguard.offline.replay import Replay, load_csv, load_xdf
from gazeguard.runtime.ingest import GazeStream
from gazeguard.runtime.simulate import GazeGenerator, Person, simulate_gaze

FIELDS = ("timestamps", "x_deg", "y_deg", "pupil_mm", "valid")


def saccades(s: GazeSamples, thr: float = 30.0) -> np.ndarray[Any, Any]:
    """Rows (start, end, amplitude deg, peak velocity deg/s, duration s, dx, dy) of fast runs
    bounded by valid samples."""
    v = np.hypot(np.diff(s.x_deg), np.diff(s.y_deg)) / np.diff(s.timestamps)
    fast = np.nan_to_num(v, nan=0.0) > thr
    edges = np.diff(np.r_[0, fast.astype(int), 0])
    rows = []
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
        if a == 0 or b >= len(v) or np.isnan(v[a - 1]) or np.isnan(v[b]):
            continue
        dx, dy = s.x_deg[b] - s.x_deg[a], s.y_deg[b] - s.y_deg[a]
        rows.append(
            (a, b, np.hypot(dx, dy), v[a:b].max(), s.timestamps[b] - s.timestamps[a], dx, dy)
        )
    return np.array(rows)


def blinks(s: GazeSamples) -> tuple[int, float]:
    """Number of invalid runs and their mean duration, s."""
    e = np.diff(np.r_[0, (~s.valid).astype(int), 0])
    starts, ends = np.flatnonzero(e == 1), np.flatnonzero(e == -1)
    return len(starts), float(np.mean(ends - starts) / (1 / np.median(np.diff(s.timestamps))))


# -- the person model --------------------------------------------------------------------------
def test_deterministic_per_seed_and_distinct_across_seeds() -> None:
    a, b, c = simulate_gaze(20, 250, 7), simulate_gaze(20, 250, 7), simulate_gaze(20, 250, 8)
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert len(a) == 5000
    assert not np.array_equal(a.x_deg, c.x_deg, equal_nan=True)
    other_session = simulate_gaze(20, 250, 7, session=1)
    assert not np.array_equal(a.x_deg, other_session.x_deg, equal_nan=True)


@pytest.mark.parametrize("sizes", [[1, 999, 4000], [4096, 904], [7] * 714 + [2]])
def test_chunking_does_not_change_the_output(sizes: list[int]) -> None:
    whole = simulate_gaze(5000 / 1000, 1000, 3, task="reading")
    gen = GazeGenerator(1000, 3, task="reading")
    parts = [gen.take(n) for n in sizes]
    for f in FIELDS:
        np.testing.assert_array_equal(
            np.concatenate([getattr(p, f) for p in parts]), getattr(whole, f)
        )


def test_saccades_follow_the_main_sequence() -> None:
    s, p = simulate_gaze(120, 1000, 11), Person.from_seed(11)
    sac = saccades(s)
    big = sac[sac[:, 2] > 1.0]
    assert len(big) > 200
    predicted = np.array([p.peak_velocity(a) for a in big[:, 2]])
    ratio = big[:, 3] / predicted  # measured peak velocity vs Vmax·(1 − exp(−A/C))
    assert 0.97 < np.median(ratio) < 1.1
    # duration and peak velocity grow with amplitude (rank correlation), at human magnitudes
    amp_rank, dur_rank = np.argsort(np.argsort(big[:, 2])), np.argsort(np.argsort(big[:, 4]))
    assert np.corrcoef(amp_rank, dur_rank)[0, 1] > 0.95
    ten = big[(big[:, 2] > 8) & (big[:, 2] < 12)]
    assert 250 < np.median(ten[:, 3]) < 650  # deg/s for ~10° saccades
    assert 0.025 < np.median(ten[:, 4]) < 0.07  # s


@pytest.mark.parametrize("seed", [1, 4])
def test_fixations_blinks_and_pupil_are_plausible(seed: int) -> None:
    s, p = simulate_gaze(120, 250, seed), Person.from_seed(seed)
    sac = saccades(s)
    big = sac[sac[:, 2] > 1.0]
    intervals = np.diff(big[:, 0]) / 250  # fixation (+ the saccade itself) between saccades
    fixation = intervals.mean() - big[:, 4].mean()
    assert fixation == pytest.approx(p.fixation_mean_s, rel=0.3)
    assert 0.12 < np.median(intervals) < 0.45
    assert np.percentile(intervals, 2) > 0.06
    n_blinks, blink_dur = blinks(s)
    assert n_blinks / 120 == pytest.approx(p.blink_rate_hz, rel=0.5)
    assert blink_dur == pytest.approx(p.blink_duration_s, rel=0.3)
    assert np.isnan(s.x_deg[~s.valid]).all()
    assert np.isnan(s.pupil_mm[~s.valid]).all()
    assert np.nanmean(s.pupil_mm) == pytest.approx(p.pupil_mm, abs=0.3)
    assert np.nanmax(np.abs(s.x_deg)) < 30
    assert np.nanmax(np.abs(s.y_deg)) < 25


def test_people_are_distinguishable_by_oculomotor_traits() -> None:
    """1-NN re-identification from kinematics only (no pupil), session 1 against session 0."""

    def traits(s: GazeSamples) -> list[float]:
        sac = saccades(s)
        big = sac[sac[:, 2] > 1.0]
        horizontal = np.abs(big[:, 6]) < 0.36 * np.abs(big[:, 5])
        return [
            float(np.median(np.diff(big[:, 0]))),
            float(big[:, 2].mean()),
            float(horizontal.mean()),
            float((big[horizontal, 5] > 0).mean()),
            blinks(s)[0],
            float(np.median(big[:, 3] / big[:, 2])),
        ]

    seeds = range(20, 28)
    a = np.array([traits(simulate_gaze(60, 120, k, session=0)) for k in seeds])
    b = np.array([traits(simulate_gaze(60, 120, k, session=1)) for k in seeds])
    mu, sd = a.mean(0), a.std(0)
    d = ((((b - mu) / sd)[:, None, :] - ((a - mu) / sd)[None, :, :]) ** 2).sum(-1)
    assert (d.argmin(1) == np.arange(len(seeds))).mean() >= 5 / 8  # chance: 1/8


def test_tasks_change_behaviour() -> None:
    def horizontal_right(s: GazeSamples) -> float:
        sac = saccades(s)
        big = sac[sac[:, 2] > 1.0]
        return float(((big[:, 5] > 0) & (np.abs(big[:, 6]) < 0.36 * big[:, 5])).mean())

    def mean_amp(s: GazeSamples) -> float:
        sac = saccades(s)
        return float(sac[sac[:, 2] > 1.0, 2].mean())

    reading, search, watching = (
        simulate_gaze(60, 250, 5, task=t) for t in ("reading", "search", "watching")
    )
    assert horizontal_right(reading) > 0.6 > horizontal_right(search)
    assert mean_amp(search) > 1.5 * mean_amp(watching)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"'seed'.*-1.*must be >= 0"):
        simulate_gaze(1, 120, -1)
    with pytest.raises(ConfigError, match=r"'rate_hz'.*5000.*between 30 and 2000 Hz"):
        simulate_gaze(1, 5000, 1)
    with pytest.raises(ConfigError, match=r"'task'.*'juggling'.*reading"):
        simulate_gaze(1, 120, 1, task="juggling")


# -- the simulated headset over real LSL -------------------------------------------------------
def read_blocks(settings: IngestSettings, n: int, timeout: float = 20.0) -> GazeSamples:
    """The first ``n`` samples of the LSL stream ``settings`` resolves, through ingest."""

    async def run() -> GazeSamples:
        blocks: list[GazeSamples] = []
        async with GazeStream(settings, poll_interval_s=0.02) as stream:
            async with asyncio.timeout(timeout):
                async for block in stream:
                    blocks.append(block)
                    if sum(map(len, blocks)) >= n:
                        break
        return GazeSamples(*(np.concatenate([getattr(b, f) for b in blocks]) for f in FIELDS))

    return asyncio.run(run())


@pytest.mark.slow
@pytest.mark.network
def test_gazeguard_simulate_command_streams_the_offline_person(unique_id: str) -> None:
    """`gazeguard simulate` in its own process: what arrives over LSL is simulate_gaze's data."""
    rate, seed = 250.0, 6
    proc = subprocess.Popen(
        [sys.executable, "-m", "gazeguard", "simulate", "--rate", "250", "--seed", str(seed),
         "--task", "search", "--duration", "30", "--source-id", unique_id],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "streaming simulated person 6" in proc.stdout.readline()
        got = read_blocks(IngestSettings(source_id=unique_id), 500)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    truth = simulate_gaze(30, rate, seed, task="search")
    # which sample index came first: match the first valid sample's exact value
    k0 = int(np.flatnonzero(truth.x_deg == got.x_deg[np.flatnonzero(got.valid)[0]])[0])
    k0 -= int(np.flatnonzero(got.valid)[0])
    sl = slice(k0, k0 + len(got))
    for f in ("x_deg", "y_deg", "pupil_mm", "valid"):
        np.testing.assert_array_equal(getattr(got, f), getattr(truth, f)[sl])  # bit-exact
    np.testing.assert_allclose(np.diff(got.timestamps), 1 / rate, atol=1e-6)


# -- replay --------------------------------------------------------------------------------------
def write_csv(path: Path, s: GazeSamples, fov: tuple[float, float]) -> None:
    u = (np.tan(np.radians(s.x_deg)) / np.tan(np.radians(fov[0] / 2)) + 1) / 2
    v = (1 - np.tan(np.radians(s.y_deg)) / np.tan(np.radians(fov[1] / 2))) / 2
    lines = [
        "# a recording, normalized image coordinates (origin top-left)",
        "time_ms,x_norm,y_norm,pupil_mm",
    ]
    rows = zip(s.timestamps * 1000, u, v, s.pupil_mm, strict=True)
    lines += [",".join(f"{c:.17g}" for c in row) for row in rows]
    path.write_text("\n".join(lines).replace("nan", ""))


@pytest.mark.slow
@pytest.mark.network
def test_gazeguard_replay_csv_at_original_timing(tmp_path: Path, unique_id: str) -> None:
    truth = simulate_gaze(2, 120, 9)
    fov = (90.0, 70.0)
    write_csv(tmp_path / "rec.csv", truth, fov)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gazeguard", "replay", str(tmp_path / "rec.csv"),
         "--fov", "90", "70", "--source-id", unique_id, "--speed", "2", "--wait", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "replaying" in proc.stdout.readline()
        got = read_blocks(IngestSettings(source_id=unique_id), len(truth))
        assert proc.wait(10) == 0
        assert f"sent {len(truth)} samples" in proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    np.testing.assert_array_equal(got.valid, truth.valid)
    np.testing.assert_allclose(got.x_deg, truth.x_deg, atol=1e-9)
    np.testing.assert_allclose(got.y_deg, truth.y_deg, atol=1e-9)
    np.testing.assert_allclose(got.pupil_mm, truth.pupil_mm, atol=1e-12)
    np.testing.assert_allclose(np.diff(got.timestamps), np.diff(truth.timestamps), atol=1e-6)


def write_xdf(
    path: Path,
    name: str,
    type_: str,
    srate: float,
    data: np.ndarray[Any, Any],
    ts: np.ndarray[Any, Any],
) -> None:
    """A minimal XDF 1.0 file: one double64 stream (FileHeader, StreamHeader, Samples, Footer)."""

    def chunk(tag: int, content: bytes) -> bytes:
        body = struct.pack("<H", tag) + content
        return struct.pack("<BQ", 8, len(body)) + body

    hdr = (
        f'<?xml version="1.0"?><info><name>{name}</name><type>{type_}</type>'
        f"<channel_count>{data.shape[1]}</channel_count><nominal_srate>{srate}</nominal_srate>"
        "<channel_format>double64</channel_format><source_id>rec</source_id><desc/></info>"
    )
    samples = b"".join(
        struct.pack("<Bd", 8, t) + row.astype("<f8").tobytes()
        for t, row in zip(ts, data, strict=True)
    )
    foot = f'<?xml version="1.0"?><info><sample_count>{len(ts)}</sample_count></info>'
    path.write_bytes(
        b"XDF:"
        + chunk(1, b'<?xml version="1.0"?><info><version>1.0</version></info>')
        + chunk(2, struct.pack("<I", 1) + hdr.encode())
        + chunk(3, struct.pack("<I", 1) + struct.pack("<BI", 4, len(ts)) + samples)
        + chunk(6, struct.pack("<I", 1) + foot.encode())
    )


@pytest.mark.network
def test_replay_xdf_keeps_the_device_layout(tmp_path: Path, unique_id: str) -> None:
    """A recorded Tobii stream replays under its own name/type, so ingest's preset applies."""
    n, mm, dist = 120, (533.0, 301.0), 565.0
    x, y = np.linspace(-10, 10, n), np.linspace(5, -5, n)
    dx = dist * np.tan(np.radians(x))
    u, v = dx / mm[0] + 0.5, 0.5 - np.hypot(dist, dx) * np.tan(np.radians(y)) / mm[1]
    data = np.column_stack([u, v, np.full(n, 3.5), u, v, np.full(n, 3.5)])
    write_xdf(tmp_path / "rec.xdf", "Tobii", "Eyetracker", 120.0, data, 1000 + np.arange(n) / 120)
    rec = load_xdf(tmp_path / "rec.xdf")
    assert (rec.name, rec.type, rec.data.shape) == ("Tobii", "Eyetracker", (n, 6))
    settings = IngestSettings(source_id=unique_id, screen_size_mm=mm, screen_distance_mm=dist)
    with Replay(rec, source_id=unique_id, speed=2.0, wait_s=20):
        got = read_blocks(settings, n)
    np.testing.assert_allclose(got.x_deg, x, atol=1e-9)
    np.testing.assert_allclose(got.y_deg, y, atol=1e-9)
    np.testing.assert_allclose(got.pupil_mm, 3.5)


def test_load_csv_headerless_with_rate(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text("0.5,0.5\n0.75,0.5\n")  # GazeGraph style: Pupil norm_pos
    s = load_csv(
        tmp_path / "p.csv", columns=["norm_pos_x", "norm_pos_y"], rate_hz=30, fov_deg=(90, 90)
    )
    np.testing.assert_allclose(s.timestamps, [0, 1 / 30])
    np.testing.assert_allclose(s.x_deg, [0.0, np.degrees(np.arctan(0.5))])
    np.testing.assert_allclose(s.y_deg, [0.0, 0.0])


@pytest.mark.parametrize(
    ("text", "kw", "match"),
    [
        ("t,x_deg,y_deg\n0,1,2\n0.1,abc,2\n", {}, r"line 3: not a number"),
        ("t,x_deg,y_deg\n0,1,2\n0.1,1\n", {}, r"line 3: 2 fields, expected 3"),
        ("t,x_deg,y_deg\n0,1,2\n0,1,2\n", {}, r"line 3: time does not increase"),
        ("t,gx,gy\n0,1,2\n", {}, r"no gaze columns: expected one of x_deg,y_deg"),
        ("x_deg,y_deg\n1,2\n", {}, r"no time column .* and no rate given"),
        ("1,2\n3,4\n", {}, r"line 1: no header line; name the columns"),
    ],
)
def test_load_csv_errors_name_file_and_line(
    tmp_path: Path, text: str, kw: dict[str, Any], match: str
) -> None:
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(DatasetError, match=match) as err:
        load_csv(tmp_path / "bad.csv", **kw)
    assert err.value.path == tmp_path / "bad.csv"
