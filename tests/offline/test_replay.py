"""`gazeguard replay` of recorded files: every supported format, streamed through a real LSL
outlet (a separate `gazeguard replay` process) and received by gazeguard's own ingest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gazeguard.cli import build_parser
from gazeguard.config import IngestSettings
from gazeguard.core.samples import GazeSamples
from tests.runtime.test_simulate import read_blocks

DATA = Path(__file__).resolve().parents[1] / "data" / "recordings"
TRUTH = np.load(DATA / "truth.npz")
GEOMETRY = json.loads((DATA / "geometry.json").read_text())


def replay(args: list[str], source_id: str, n: int) -> tuple[GazeSamples, str, str]:
    """Run `gazeguard replay ARGS` in its own process; what ingest received, stdout, stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gazeguard", "replay", *args, "--source-id", source_id,
         "--speed", "4", "--wait", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "replaying" in first, proc.stderr.read() if proc.stderr else first
        # dejitter off: the test checks the spacing the outlet sent, not the smoothed one
        got = read_blocks(IngestSettings(source_id=source_id, dejitter=False), n, timeout=30.0)
        assert proc.wait(20) == 0
        out, err = proc.communicate()
    finally:
        proc.kill()
        proc.wait()
    return got, first + out, err


def assert_received(got: GazeSamples, name: str, atol: float = 1e-6) -> None:
    t, x, y, p = (TRUTH[f"{name}__{k}"] for k in ("t", "x", "y", "pupil"))
    assert len(got) == len(t)
    np.testing.assert_array_equal(got.valid, np.isfinite(x))
    np.testing.assert_allclose(got.x_deg, x, rtol=0, atol=atol)
    np.testing.assert_allclose(got.y_deg, y, rtol=0, atol=atol)
    np.testing.assert_allclose(got.pupil_mm, p, rtol=0, atol=1e-9)
    # the outlet keeps the recording's own spacing (here pushed at 4x real time)
    np.testing.assert_allclose(np.diff(got.timestamps), np.diff(t), rtol=0, atol=2e-6)


def pair(v: list[float]) -> str:
    return f"{v[0]:g},{v[1]:g}"


def screen_args(device: str) -> list[str]:
    """``--screen W,H --distance D`` (mm) of ``device``'s recording geometry."""
    geometry = GEOMETRY[device]
    return ["--screen", pair(geometry["screen_mm"]), "--distance", str(geometry["distance_mm"])]


@pytest.mark.network
@pytest.mark.parametrize(
    ("file", "args", "name"),
    [
        ("gazeguard.csv", ["--recording", "p02_reading"], "gazeguard_p02"),
        ("pupil_core_3d", [], "pupil_core_3d"),
        ("pupil_core_2d/exports/000", ["--fov", pair(GEOMETRY["pupil_fov_deg"])], "pupil_core_2d"),
        (
            "tobii_pro_lab.tsv",
            ["--recording", "Recording2", *screen_args("tobii")],
            "tobii_P02",
        ),
        (
            "eyelink_mono_area.asc",
            [*screen_args("eyelink"), "--pupil-scale", str(GEOMETRY["eyelink_pupil_scale"])],
            "eyelink_mono_area",
        ),
        (
            "eyelink_bino_diameter_res.asc",
            ["--pupil-scale", str(GEOMETRY["eyelink_pupil_scale"])],
            "eyelink_bino_diameter_res",
        ),
    ],
)
@pytest.mark.slow
def test_replay_streams_each_format_in_degrees(
    file: str, args: list[str], name: str, unique_id: str
) -> None:
    n = len(TRUTH[f"{name}__t"])
    got, out, _ = replay([str(DATA / file), *args], unique_id, n)
    assert_received(got, name)
    assert f"sent {n} samples" in out


@pytest.mark.network
def test_fov_is_h_comma_v_anywhere_and_h_space_v_still_works(
    tmp_path: Path, unique_id: str
) -> None:
    # normalised gaze, origin top-left, through a 90 x 70 degree camera
    t = np.arange(60) / 60.0
    u, v = 0.5 + 0.3 * np.sin(t * 3), 0.5 - 0.2 * np.cos(t * 2)
    f = tmp_path / "rec.csv"
    f.write_text("t,x_norm,y_norm\n" + "".join(f"{a!r},{b!r},{c!r}\n" for a, b, c in zip(
        t.tolist(), u.tolist(), v.tolist(), strict=True)))  # fmt: skip
    want_x = np.degrees(np.arctan((2 * u - 1) * np.tan(np.radians(45))))
    want_y = np.degrees(np.arctan((1 - 2 * v) * np.tan(np.radians(35))))
    got, _, _ = replay(["--fov", "90,70", str(f)], unique_id, 60)  # the option first
    np.testing.assert_allclose(got.x_deg, want_x, atol=1e-12)
    np.testing.assert_allclose(got.y_deg, want_y, atol=1e-12)
    parser = build_parser("replay")
    for argv in (
        ["replay", str(f), "--fov", "90", "70"],
        ["replay", str(f), "--fov", "90,70"],
        ["replay", "--fov", "90", "70", str(f)],
    ):
        args = parser.parse_args(argv)
        assert args.fov == (90.0, 70.0)
        files = [p for p in [args.file] if p is not None]
        assert files + [Path(p) for p in getattr(args, "extra_files", [])] == [f]
    eval_parser = build_parser("eval")
    for fov in (["90,60"], ["90", "60"]):
        assert eval_parser.parse_args(["eval", "--fov", *fov]).fov == (90.0, 60.0)


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ("t,x_deg,y_deg\n", "rec.csv, line 1: a header line but no samples"),
        ("t,x_deg,y_deg\n0,1,2\n0.01,1,x\n", "rec.csv, line 3: not a number in column 'y_deg'"),
        ("t,x_deg,y_deg\n0.01,1,2\n0.01,1,3\n", "rec.csv, line 3: time does not increase"),
        ("time,gaze-x,gaze-y\n0,1,2\n", "no gaze columns: .* did you mean 'gaze-x'"),
    ],
)
def test_bad_recordings_give_one_clear_line_and_no_traceback(
    tmp_path: Path, body: str, expect: str
) -> None:
    (tmp_path / "rec.csv").write_text(body)
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "replay", str(tmp_path / "rec.csv"), "--wait", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("gazeguard replay: error: ")
    assert re.search(expect, lines[0]), lines[0]


def test_help_documents_the_one_format() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "replay", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    for needle in (
        "gazeguard CSV: a header line",
        "t,x_deg,y_deg,pupil_mm,person,task",
        "--fov H,V",
        "Pupil Player",
        "Tobii Pro Lab",
        "EyeLink",
        "unknown columns are ignored",
    ):
        assert needle in out.stdout


@pytest.mark.network
@pytest.mark.data
def test_replay_of_a_real_recording_in_gazeguard_csv(
    shared_data: Path, tmp_path: Path, unique_id: str
) -> None:
    """IRF S1 (EyeLink 1000 Hz, degrees), 2.5 s around its first track loss, as gazeguard CSV."""
    a = np.load(shared_data / "irf_lookAtPoint_EL" / "lookAtPoint_EL_S1.npy")
    t0 = float(a["t"][np.flatnonzero(~a["status"])[0]]) - 1.0
    a = a[(a["t"] >= t0) & (a["t"] < t0 + 2.5)]  # around the first track loss
    f = tmp_path / "S1.csv"
    f.write_text(
        "Time [ms],X [deg],Y [deg],Validity\n"
        + "".join(
            f"{r['t'] * 1000:.3f},{float(r['x'])!r},{float(r['y'])!r},{int(r['status'])}\n"
            for r in a
        )
    )
    got, _, _ = replay([str(f)], unique_id, len(a))
    ok = a["status"]
    assert not ok.all()
    np.testing.assert_array_equal(got.valid, ok)
    np.testing.assert_array_equal(got.x_deg[ok], a["x"][ok].astype(np.float64))
    np.testing.assert_array_equal(got.y_deg[ok], a["y"][ok].astype(np.float64))
    np.testing.assert_allclose(np.diff(got.timestamps), np.diff(a["t"]), atol=2e-6)
