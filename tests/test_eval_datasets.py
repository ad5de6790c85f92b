"""Dataset loaders of ``gazeguard eval``: real recordings, generic CSV, clear errors."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gazeguard.errors import DatasetError
from gazeguard.eval.datasets import (
    CsvGaze,
    GazeGraph,
    Irf,
    fov_to_degrees,
    open_dataset,
    screen_to_degrees,
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_screen_geometry_conversion_by_hand() -> None:
    # Centre → 0°; right edge of a 800 mm wide screen at 400 mm → atan(400/400) = 45°.
    x, y = screen_to_degrees([0.5, 1.0, 0.5], [0.5, 0.5, 1.0], (800.0, 400.0), 400.0)
    assert x.tolist() == pytest.approx([0.0, 45.0, 0.0])
    # Top edge: 200 mm up at 400 mm → atan(0.5) (y up is positive).
    assert y.tolist() == pytest.approx([0.0, 0.0, math.degrees(math.atan(0.5))])
    fx, fy = fov_to_degrees([1.0, 0.0], [0.5, 1.0], (90.0, 60.0))
    assert fx.tolist() == pytest.approx([45.0, -45.0])
    assert fy.tolist() == pytest.approx([0.0, 30.0])


def test_csv_loader_groups_recordings_and_marks_invalid(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "rec.csv",
        "# exported by hand\n"
        "t,x,y,pupil,person,task\n"
        "0.0,1.0,2.0,3.1,alice,read\n"
        "0.1,1.5,nan,3.2,alice,read\n"
        "0.0,-1.0,0.5,,bob,read\n"
        "0.2,1.6,2.1,3.3,alice,read\n",
    )
    recs = list(CsvGaze(f).recordings())
    assert [(r.person, r.task, r.recording) for r in recs] == [
        ("alice", "read", "alice_read"),
        ("bob", "read", "bob_read"),
    ]
    a = recs[0].samples
    assert a.timestamps.tolist() == [0.0, 0.1, 0.2]
    assert a.valid.tolist() == [True, False, True]
    assert math.isnan(a.x_deg[1])  # invalid gaze is NaN, never zero
    assert a.pupil_mm[0] == pytest.approx(3.1)


def test_csv_loader_converts_normalised_gaze_with_a_field_of_view(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "n.csv", "time,gaze_x,gaze_y,subject,activity\n0,1.0,0.5,p,t\n1,0.5,0,p,t\n"
    )
    rec = next(iter(CsvGaze(f, units="norm", fov_deg=(90.0, 60.0)).recordings()))
    assert rec.samples.x_deg.tolist() == pytest.approx([45.0, 0.0])
    assert rec.samples.y_deg.tolist() == pytest.approx([0.0, -30.0])
    with pytest.raises(DatasetError, match="needs a field of view"):
        CsvGaze(f, units="norm")


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("t,x,y,person,task\n0,1,2,p,t\n0.1,1,oops,p,t\n", 3, "column 'y': 'oops' is not a number"),
        ("t,x,y,person,task\n0,1,2,p,t\n0.1,1,2,p\n", 3, "expected 5 fields, found 4"),
        ("t,x,y,person,task\n0,1,2,p,t\n0,1,2,p,t\n", 3, "timestamp 0.0 is not after"),
        ("# c\nt,x,y,person\n0,1,2,p\n", 2, "lacks column\\(s\\) task"),
        ("t,x,y,person,task\n0,1,2,,t\n", 2, "empty person or task"),
        ("t,x,y,person,task\nnan,1,2,p,t\n", 2, "column 't': 'nan' must be a finite number"),
    ],
)
def test_malformed_csv_names_file_and_line(
    tmp_path: Path, body: str, line: int, message: str
) -> None:
    f = _write(tmp_path / "bad.csv", body)
    with pytest.raises(DatasetError, match=message) as info:
        list(CsvGaze(f).recordings())
    assert info.value.path == f
    assert info.value.line == line
    assert f"bad.csv, line {line}:" in str(info.value)


def test_csv_directory_and_missing_path(tmp_path: Path) -> None:
    _write(tmp_path / "a.csv", "t,x,y,person,task\n0,1,2,p1,t\n1,1,2,p1,t\n")
    _write(tmp_path / "b.csv", "t,x,y,person,task\n0,1,2,p2,t\n1,1,2,p2,t\n")
    recs = list(open_dataset(f"csv:{tmp_path}").recordings())
    assert [r.person for r in recs] == ["p1", "p2"]
    with pytest.raises(DatasetError, match="no such file or directory"):
        open_dataset(f"csv:{tmp_path / 'nope.csv'}")
    with pytest.raises(DatasetError, match="unknown dataset"):
        open_dataset("mpiidpeye")


def test_gazegraph_zip_with_a_malformed_line_names_member_and_line(tmp_path: Path) -> None:
    z = tmp_path / "DesktopActivity.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("DesktopActivity/P1/P1_READ.csv", "0.5,0.5\n0.4,0.6\n0.3;0.7\n")
    with pytest.raises(DatasetError, match="expected 2 comma-separated values") as info:
        list(GazeGraph(tmp_path).recordings())
    assert info.value.line == 3
    assert "P1_READ.csv" in str(info.value.path)


@pytest.mark.data
def test_gazegraph_real_recordings(shared_data: Path) -> None:
    ds = GazeGraph(shared_data / "gazegraph_desktop_activity")
    recs = list(ds.recordings())
    assert len(recs) == 48
    assert sorted({r.person for r in recs}) == [f"P{i}" for i in range(1, 9)]
    assert sorted({r.task for r in recs}) == ["browse", "play", "read", "search", "watch", "write"]
    s = recs[0].samples
    assert len(s) == 9000
    assert np.diff(s.timestamps) == pytest.approx(np.full(8999, 1 / 30))
    # Degrees on a 797 mm screen at 500 mm: the screen spans ±38.6°; gaze stays near it.
    assert np.nanpercentile(np.abs(np.concatenate([r.samples.x_deg for r in recs])), 99) < 45


@pytest.mark.data
def test_irf_real_recordings(shared_data: Path) -> None:
    recs = list(Irf(shared_data / "irf_lookAtPoint_EL").recordings())
    assert [r.person for r in recs] == [f"S{i}" for i in range(1, 7)]
    assert {r.task for r in recs} == {"lookAtPoint"}
    s = recs[0].samples
    assert len(s) > 80_000
    assert np.median(np.diff(s.timestamps)) == pytest.approx(0.001)
    # S1 has 1862 samples with status False (track loss): invalid and NaN, never zeros.
    assert int((~s.valid).sum()) == 1862
    assert np.isnan(s.x_deg[~s.valid]).all()
