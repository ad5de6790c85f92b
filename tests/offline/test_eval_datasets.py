"""Dataset loaders of ``gazeguard eval``: real recordings as published, your recordings in any
supported format, the fallback when data is missing, clear errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gazeguard.core.errors import DatasetError
from gazeguard.offline.eval.datasets import (
    PUBLIC_DATASETS,
    CsvGaze,
    DataNotFoundError,
    GazeGraph,
    Irf,
    fov_to_degrees,
    open_dataset,
    screen_to_degrees,
)
from gazeguard.offline.recordings import ReadOptions

DATA = Path(__file__).resolve().parents[1] / "data" / "recordings"


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
    recs = list(CsvGaze(f, options=ReadOptions(rate_hz=10.0)).recordings())  # the file's rate
    assert [(r.person, r.task, r.recording) for r in recs] == [
        ("alice", "read", "alice_read"),
        ("bob", "read", "bob_read"),
    ]
    assert [r.rate_hz for r in recs] == [10.0, 10.0]
    a = recs[0].samples
    assert a.timestamps.tolist() == [0.0, 0.1, 0.2]
    assert a.valid.tolist() == [True, False, True]
    assert math.isnan(a.x_deg[1])  # invalid gaze is NaN, never zero
    assert a.pupil_mm[0] == pytest.approx(3.1)


def test_csv_loader_converts_normalised_gaze_with_a_field_of_view(tmp_path: Path) -> None:
    # normalised gaze has one convention everywhere: 0..1, origin top-left (y = 0 is the top)
    f = _write(
        tmp_path / "n.csv",
        "time,gaze_x,gaze_y,subject,activity\n0,1.0,0.5,p,t\n0.01,0.5,0,p,t\n",
    )
    opts = ReadOptions(rate_hz=100.0)
    rec = next(iter(CsvGaze(f, units="norm", fov_deg=(90.0, 60.0), options=opts).recordings()))
    assert rec.samples.x_deg.tolist() == pytest.approx([45.0, 0.0])
    assert rec.samples.y_deg.tolist() == pytest.approx([0.0, 30.0])
    with pytest.raises(DatasetError, match="needs a field of view"):
        CsvGaze(f, units="norm")


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("t,x,y,person,task\n0,1,2,p,t\n0.1,1,oops,p,t\n", 3, "not a number in column 'y': 'oops'"),
        ("t,x,y,person,task\n0,1,2,p,t\n0.1,1,2,p\n", 3, "4 fields, expected 5"),
        ("t,x,y,person,task\n0,1,2,p,t\n0,1,2,p,t\n", 3, "time does not increase in column 't'"),
        ("t,x,y,person,task\n0,1,2,,t\n", 2, "empty 'person' cell"),
        ("t,x,y,person,task\nnan,1,2,p,t\n", 2, "no value in column 't'"),
        ("t,x,y,person,task\n", 1, "a header line but no samples"),
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


def test_csv_without_person_or_task_says_how_to_label(tmp_path: Path) -> None:
    f = _write(tmp_path / "rec.csv", "t,x,y,person\n0,1,2,p\n0.01,1,2,p\n")
    with pytest.raises(DatasetError, match="has no task label: add a 'task' column") as info:
        list(CsvGaze(f).recordings())
    assert info.value.path == f
    assert "--labels '{person}_{task}'" in str(info.value)


def test_csv_directory_and_missing_path(tmp_path: Path) -> None:
    _write(tmp_path / "a.csv", "t,x,y,person,task\n0,1,2,p1,t\n0.01,1,2,p1,t\n")
    _write(tmp_path / "b.csv", "t,x,y,person,task\n0,1,2,p2,t\n0.01,1,2,p2,t\n")
    recs = list(
        open_dataset(f"csv:{tmp_path}", read_options=ReadOptions(rate_hz=100.0)).recordings()
    )
    assert [r.person for r in recs] == ["p1", "p2"]
    with pytest.raises(DatasetError, match="no such file or directory"):
        open_dataset(f"csv:{tmp_path / 'nope.csv'}")
    with pytest.raises(DatasetError, match="unknown dataset"):
        open_dataset("mpiiprivaceye")


def test_a_recording_without_a_declared_rate_is_refused(tmp_path: Path) -> None:
    """The event detector is built for a declared rate, never one measured from the timestamps:
    a CSV declares none, so without ``--rate`` (ReadOptions.rate_hz) it is refused by name."""
    f = _write(tmp_path / "a.csv", "t,x,y,person,task\n0,1,2,p1,t\n0.01,1,2,p1,t\n")
    with pytest.raises(DatasetError, match=r"declares no sampling rate.*--rate HZ") as info:
        list(CsvGaze(f).recordings())
    assert info.value.path == f


def test_a_folder_of_vendor_exports_is_one_dataset(tmp_path: Path) -> None:
    """Pupil Player, Tobii Pro Lab and EyeLink files side by side; labels from file names where
    the files carry none, from the files where they do."""
    root = tmp_path / "study"
    shutil.copytree(DATA / "pupil_core_3d", root / "P07_reading")
    shutil.copy(DATA / "eyelink_mono_area.asc", root / "P08_search.asc")
    shutil.copy(DATA / "tobii_pro_lab_legacy.tsv", root / "Anna_watching.tsv")
    (root / "notes.txt").write_text("not a recording")
    geometry = json.loads((DATA / "geometry.json").read_text())
    opts = ReadOptions(
        screen_mm=tuple(geometry["eyelink"]["screen_mm"]),
        distance_mm=geometry["eyelink"]["distance_mm"],
        rate_hz=200.0,  # --rate: one for the files that declare none (Pupil Core's 200 Hz)
    )
    ds = open_dataset(f"csv:{root}", read_options=opts, labels="{person}_{task}")
    recs = list(ds.recordings())
    assert [(r.person, r.task, r.recording) for r in recs] == [
        ("Anna", "watching", "Rec 3"),
        ("P07", "reading", "P07_reading"),
        ("P08", "search", "P08_search"),
    ]
    # the EyeLink file declares its own rate (SAMPLES ... RATE 500.00); the others take --rate
    assert [r.rate_hz for r in recs] == [200.0, 200.0, 500.0]
    assert len(recs[1].samples) == len(np.load(DATA / "truth.npz")["pupil_core_3d__t"])
    before = ds.fingerprint()
    assert open_dataset(f"csv:{root}", read_options=opts).fingerprint() != before
    with pytest.raises(DatasetError, match=r"does not match --labels '\{person\}/\{task\}'"):
        list(open_dataset(f"csv:{root}", read_options=opts, labels="{person}/{task}").recordings())


def test_public_datasets_name_source_and_licence() -> None:
    assert PUBLIC_DATASETS["gazegraph"].url == "https://github.com/GazeGraphResource/GazeGraph"
    assert "SenSys 2020" in PUBLIC_DATASETS["gazegraph"].title
    assert PUBLIC_DATASETS["irf"].licence == "MIT"
    assert PUBLIC_DATASETS["andersson2017"].licence == "GPL-3.0"
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "eval", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    text = " ".join(out.stdout.split())
    for d in PUBLIC_DATASETS.values():
        assert d.url in text
        assert f"Licence: {d.licence}" in text
    assert "gazeguard CSV: a header line" in out.stdout
    assert "t,x_deg,y_deg,pupil_mm,person,task" in out.stdout


@pytest.mark.slow
def test_eval_quick_without_data_falls_back_to_synthetic_with_a_note(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GAZEGUARD_DATA"}
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "eval", "--quick", "--mechanisms", "lpa-32",
         "--epsilons", "4.8", "--synthetic-people", "2", "--synthetic-duration", "30",
         "--window", "10", "--step", "0.25", "--classifiers", "dt", "--utility-reps", "1",
         "--every-task", "1", "--every-reid", "1", "--jobs", "1", "--no-cache",
         "--out", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = [ln for ln in out.stderr.splitlines() if "note:" in ln]
    assert len(notes) == 1
    assert notes[0].startswith("gazeguard eval: note: gazegraph recordings not found")
    assert "evaluating synthetic only" in notes[0]
    assert "https://github.com/GazeGraphResource/GazeGraph" in notes[0]
    assert "--data-dir" in notes[0]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [d["dataset"] for d in results["datasets"]] == ["synthetic"]


@pytest.mark.slow
def test_a_dataset_asked_for_by_name_is_an_error_where_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GAZEGUARD_DATA"}
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "eval", "--dataset", "irf", "--out", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "recordings for 'irf' not found" in out.stderr
    assert "https://github.com/r-zemblys/irf (MIT)" in out.stderr
    with pytest.raises(DataNotFoundError) as info:
        open_dataset("gazegraph", tmp_path)
    assert info.value.looked == [tmp_path.resolve()]


def _gazegraph_zip(path: Path, prefix: str = "DesktopActivity/") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for p in (1, 2):
            for task in ("READ", "WATCH"):
                zf.writestr(f"{prefix}P{p}/P{p}_{task}.csv", "0.5,0.5\n0.4,0.6\n0.45,0.55\n")
    return path


def test_gazegraph_accepted_as_downloaded(tmp_path: Path) -> None:
    # the dataset zip itself, in the data folder
    (tmp_path / "a").mkdir()
    _gazegraph_zip(tmp_path / "a" / "DesktopActivity.zip")
    # the repository's zip as GitHub serves it: GazeGraph-master/DesktopActivity.zip inside
    (tmp_path / "b").mkdir()
    inner = _gazegraph_zip(tmp_path / "inner.zip")
    with zipfile.ZipFile(tmp_path / "b" / "GazeGraph-master.zip", "w") as zf:
        zf.writestr("GazeGraph-master/README.md", "# GazeGraph")
        zf.write(inner, "GazeGraph-master/DesktopActivity.zip")
    # a clone, and the unpacked folder
    (tmp_path / "c" / "GazeGraph").mkdir(parents=True)
    _gazegraph_zip(tmp_path / "c" / "GazeGraph" / "DesktopActivity.zip")
    with zipfile.ZipFile(inner) as zf:
        zf.extractall(tmp_path / "d")
    for root in ("a", "b", "c", "d"):
        recs = list(open_dataset("gazegraph", tmp_path / root).recordings())
        assert [r.recording for r in recs] == ["P1_read", "P1_watch", "P2_read", "P2_watch"]
        assert len(recs[0].samples) == 3
        assert {r.rate_hz for r in recs} == {30.0}  # the dataset's documented rate


@pytest.mark.data
def test_upstream_archives_of_the_real_datasets(shared_data: Path, tmp_path: Path) -> None:
    """The real files, packed as their repositories' zips download from GitHub."""
    with zipfile.ZipFile(tmp_path / "GazeGraph-master.zip", "w") as zf:
        zf.write(
            shared_data / "gazegraph_desktop_activity" / "DesktopActivity.zip",
            "GazeGraph-master/DesktopActivity.zip",
        )
    with zipfile.ZipFile(tmp_path / "irf-master.zip", "w") as zf:
        for f in sorted((shared_data / "irf_lookAtPoint_EL").iterdir()):
            zf.write(f, f"irf-master/etdata/lookAtPoint_EL/{f.name}")
    gg = list(open_dataset("gazegraph", tmp_path).recordings())
    assert len(gg) == 48
    assert len(gg[0].samples) == 9000
    want = list(GazeGraph(shared_data / "gazegraph_desktop_activity").recordings())
    np.testing.assert_array_equal(gg[5].samples.x_deg, want[5].samples.x_deg)
    irf = list(open_dataset("irf", tmp_path).recordings())
    assert [r.person for r in irf] == [f"S{i}" for i in range(1, 7)]
    assert int((~irf[0].samples.valid).sum()) == 1862
    assert {r.rate_hz for r in gg} == {30.0}
    assert {r.rate_hz for r in irf} == {1000.0}  # EyeLink 1000 Plus


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
