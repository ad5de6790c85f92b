"""gazeguard.offline.recordings: the one CSV format and the vendor exports, read from real files.

The vendor examples in ``tests/data/recordings`` follow the documented layouts (see the README
there) and carry their expected result in ``truth.npz``; the shared recordings
(``../shared/data``) are read in gazeguard's CSV format too.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.offline.recordings import (
    ReadOptions,
    RecordingError,
    detect_format,
    parse_pair,
    read_recording,
    read_recordings,
)
from gazeguard.runtime.presets import normalized_to_deg

DATA = Path(__file__).resolve().parents[1] / "data" / "recordings"
TRUTH = np.load(DATA / "truth.npz")
GEOMETRY = json.loads((DATA / "geometry.json").read_text())
TOBII = ReadOptions(
    screen_mm=tuple(GEOMETRY["tobii"]["screen_mm"]),
    distance_mm=GEOMETRY["tobii"]["distance_mm"],
)
EYELINK = ReadOptions(
    screen_mm=tuple(GEOMETRY["eyelink"]["screen_mm"]),
    distance_mm=GEOMETRY["eyelink"]["distance_mm"],
    pupil_scale=GEOMETRY["eyelink_pupil_scale"],
)


def assert_truth(name: str, rec_samples: object, atol: float = 1e-6) -> None:
    s = rec_samples
    t, x, y, p = (TRUTH[f"{name}__{k}"] for k in ("t", "x", "y", "pupil"))
    assert len(s) == len(t)  # type: ignore[arg-type]
    np.testing.assert_allclose(s.timestamps, t, rtol=0, atol=1e-9)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(s.valid, np.isfinite(x))  # type: ignore[attr-defined]
    np.testing.assert_allclose(s.x_deg, x, rtol=0, atol=atol)  # type: ignore[attr-defined]
    np.testing.assert_allclose(s.y_deg, y, rtol=0, atol=atol)  # type: ignore[attr-defined]
    np.testing.assert_allclose(s.pupil_mm, p, rtol=0, atol=1e-9)  # type: ignore[attr-defined]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- the vendor examples, against their truth ------------------------------------------------
@pytest.mark.parametrize(
    ("file", "fmt", "opts", "names"),
    [
        ("gazeguard.csv", "csv", ReadOptions(), ["gazeguard_p01", "gazeguard_p02"]),
        ("pupil_core_3d", "pupil", ReadOptions(), ["pupil_core_3d"]),
        (
            "pupil_core_2d",
            "pupil",
            ReadOptions(fov_deg=tuple(GEOMETRY["pupil_fov_deg"])),
            ["pupil_core_2d"],
        ),
        ("tobii_pro_lab.tsv", "tobii", TOBII, ["tobii_P01", "tobii_P02"]),
        ("tobii_pro_lab_legacy.tsv", "tobii", TOBII, ["tobii_legacy"]),
        ("eyelink_mono_area.asc", "eyelink", EYELINK, ["eyelink_mono_area"]),
        (
            "eyelink_bino_diameter_res.asc",
            "eyelink",
            ReadOptions(pupil_scale=GEOMETRY["eyelink_pupil_scale"]),
            ["eyelink_bino_diameter_res"],
        ),
    ],
)
def test_example_recordings_read_as_their_truth(
    file: str, fmt: str, opts: ReadOptions, names: list[str]
) -> None:
    assert detect_format(DATA / file) == fmt
    recs = read_recordings(DATA / file, opts)
    assert [r.format for r in recs] == [fmt] * len(names)
    for rec, name in zip(recs, names, strict=True):
        assert_truth(name, rec.samples)
        assert rec.source.is_file()


def test_labels_and_ids_come_from_the_files() -> None:
    csv_recs = read_recordings(DATA / "gazeguard.csv")
    assert [(r.person, r.task, r.recording) for r in csv_recs] == [
        ("p01", "reading", "p01_reading"),
        ("p02", "reading", "p02_reading"),
    ]
    tobii = read_recordings(DATA / "tobii_pro_lab.tsv", TOBII)
    assert [(r.person, r.recording) for r in tobii] == [
        ("P01", "Recording1"),
        ("P02", "Recording2"),
    ]
    assert read_recording(DATA / "pupil_core_3d").recording == "pupil_core_3d"
    assert read_recording(DATA / "eyelink_mono_area.asc", EYELINK).recording == "eyelink_mono_area"


def test_format_is_detected_from_content_not_name(tmp_path: Path) -> None:
    for src, fmt in (
        ("tobii_pro_lab.tsv", "tobii"),
        ("eyelink_mono_area.asc", "eyelink"),
        ("pupil_core_3d/exports/000/gaze_positions.csv", "pupil"),
        ("gazeguard.csv", "csv"),
    ):
        dst = tmp_path / f"renamed-{fmt}.txt"
        shutil.copy(DATA / src, dst)
        assert detect_format(dst) == fmt
    # and a format can be forced: the Tobii file is no gazeguard CSV
    with pytest.raises(RecordingError, match="no time column"):
        read_recordings(DATA / "tobii_pro_lab.tsv", ReadOptions(format="csv"))


def test_pupil_export_found_from_the_recording_folder_newest_export(tmp_path: Path) -> None:
    rec = tmp_path / "2024_05_17" / "003"
    shutil.copytree(DATA / "pupil_core_3d" / "exports" / "000", rec / "exports" / "000")
    shutil.copytree(DATA / "pupil_core_3d" / "exports" / "000", rec / "exports" / "001")
    got = read_recording(rec)
    assert got.source == rec / "exports" / "001" / "gaze_positions.csv"
    assert got.recording == "003"
    assert any("read the newest, 001" in n for n in got.notes)
    assert_truth("pupil_core_3d", got.samples)
    # without pupil_positions.csv: gaze as before, no pupil, and a note says why
    (rec / "exports" / "001" / "pupil_positions.csv").unlink()
    got = read_recording(rec / "exports" / "001")
    assert np.isnan(got.samples.pupil_mm).all()
    assert any("no pupil_positions.csv" in n for n in got.notes)


def test_pupil_player_errors_name_the_column_and_what_to_do(tmp_path: Path) -> None:
    export = DATA / "pupil_core_2d" / "exports" / "000"
    with pytest.raises(RecordingError, match=r"line 2: 270 gaze samples have no 3D gaze point"):
        read_recording(export)  # a 2D mapper needs the world camera's field of view
    with pytest.raises(RecordingError, match=r"this is Pupil Player's pupil_positions\.csv"):
        read_recording(export / "pupil_positions.csv")
    text = (export / "gaze_positions.csv").read_text().replace("norm_pos_x", "norm_x", 1)
    bad = write(tmp_path / "gaze_positions.csv", text)
    with pytest.raises(RecordingError) as err:
        read_recording(bad, ReadOptions(format="pupil"))
    assert err.value.column == "norm_pos_x"
    assert err.value.line == 1
    assert "column 'norm_pos_x' missing" in str(err.value)
    assert "did you mean 'norm_x'?" in str(err.value)


def test_tobii_time_unit_is_inferred_and_can_be_stated(tmp_path: Path) -> None:
    rec = read_recording(DATA / "tobii_pro_lab_legacy.tsv", TOBII)
    assert any("read as ms from its median step" in n for n in rec.notes)
    forced = read_recording(DATA / "tobii_pro_lab_legacy.tsv", replace_opts(TOBII, time_unit="s"))
    np.testing.assert_allclose(forced.samples.timestamps, TRUTH["tobii_legacy__t"] * 1000)
    with pytest.raises(RecordingError, match=r"holds 2 recordings .*--recording ID"):
        read_recording(DATA / "tobii_pro_lab.tsv", TOBII)
    assert read_recording(DATA / "tobii_pro_lab.tsv", TOBII, "Recording2").person == "P02"
    with pytest.raises(RecordingError, match="gaze is in pixels: to turn it into degrees"):
        read_recordings(DATA / "tobii_pro_lab.tsv")
    lines = (DATA / "tobii_pro_lab_legacy.tsv").read_text().splitlines()
    lines[5] = lines[5].replace("\tValid\t", "\tValid-ish\t", 1)
    bad = write(tmp_path / "bad.tsv", "\n".join(lines))
    with pytest.raises(RecordingError, match="line 6: column 'Validity left': 'Valid-ish'"):
        read_recording(bad, TOBII)


def replace_opts(opts: ReadOptions, **kw: object) -> ReadOptions:
    from dataclasses import replace  # noqa: PLC0415

    return replace(opts, **kw)  # type: ignore[arg-type]


def test_eyelink_blinks_pupil_scale_and_geometry(tmp_path: Path) -> None:
    plain = read_recording(DATA / "eyelink_mono_area.asc", replace_opts(EYELINK, pupil_scale=None))
    assert np.isnan(plain.samples.pupil_mm).all()  # uncalibrated area: left out, not guessed
    assert any("--pupil-scale" in n for n in plain.notes)
    assert_truth(
        "eyelink_mono_area", read_recording(DATA / "eyelink_mono_area.asc", EYELINK).samples
    )
    with pytest.raises(RecordingError, match=r"--screen W,H in mm and --distance MM"):
        read_recording(DATA / "eyelink_mono_area.asc")
    # a sample inside SBLINK..EBLINK is invalid even if the tracker wrote coordinates
    text = (DATA / "eyelink_mono_area.asc").read_text().splitlines()
    k = next(i for i, ln in enumerate(text) if ln.startswith("SBLINK"))
    j = k + 1
    text[j] = text[j].split("\t")[0] + "\t  960.0\t  540.0\t 1200.0\t  127.0\t..."
    got = read_recording(write(tmp_path / "b.asc", "\n".join(text)), EYELINK)
    n = int(np.argmin(np.abs(got.samples.timestamps - float(text[j].split()[0]) / 1e3)))
    assert not got.samples.valid[n]
    # HREF samples cannot be placed on the screen
    href = (DATA / "eyelink_mono_area.asc").read_text().replace("SAMPLES\tGAZE", "SAMPLES\tHREF")
    with pytest.raises(RecordingError, match=r"line \d+: samples are in HREF .* edf2asc -sg"):
        read_recording(write(tmp_path / "h.asc", href), EYELINK)
    (tmp_path / "rec.edf").write_bytes(b"SR_RESEARCH\x00\x01binary")
    with pytest.raises(RecordingError, match="convert it with SR Research's edf2asc"):
        read_recording(tmp_path / "rec.edf")


# -- the one CSV format ------------------------------------------------------------------------
def test_header_is_case_insensitive_units_in_names_unknown_columns_ignored(tmp_path: Path) -> None:
    f = write(
        tmp_path / "r.csv",
        "# a comment\nTime_MS,Gaze_X [px],GAZE_Y [PX],Pupil_mm,Confidence,Notes,Person,Task\n"
        "1000,960,540,3.0,0.9,hello,P,T\n1004,1920,540,3.1,0.2,x,P,T\n"
        "1008,960,0,,0.95,,P,T\n",
    )
    opts = ReadOptions(screen_mm=(500.0, 300.0), distance_mm=500.0, resolution_px=(1920, 1080))
    s = read_recording(f, opts).samples
    np.testing.assert_allclose(s.timestamps, [1.0, 1.004, 1.008])
    assert s.valid.tolist() == [True, False, True]  # confidence 0.2 < 0.6
    np.testing.assert_allclose(s.x_deg[[0, 2]], [0.0, 0.0], atol=1e-12)
    # top edge of a 300 mm high screen at 500 mm: atan(150/500) up
    np.testing.assert_allclose(s.y_deg[2], math.degrees(math.atan(150 / 500)))
    assert s.pupil_mm[0] == 3.0
    assert math.isnan(s.pupil_mm[2])


def test_normalised_gaze_origin_top_left_and_pupil_labs_bottom_left(tmp_path: Path) -> None:
    top = write(tmp_path / "a.csv", "t,x_norm,y_norm\n0,1.0,0.0\n0.01,0.5,0.5\n")
    s = read_recording(top, ReadOptions(fov_deg=(90.0, 60.0))).samples
    np.testing.assert_allclose(s.x_deg, [45.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(s.y_deg, [30.0, 0.0], atol=1e-12)  # y = 0 is the top
    bottom = write(tmp_path / "b.csv", "t,norm_pos_x,norm_pos_y\n0,1.0,0.0\n0.01,0.5,0.5\n")
    s = read_recording(bottom, ReadOptions(fov_deg=(90.0, 60.0))).samples
    np.testing.assert_allclose(s.y_deg, [-30.0, 0.0], atol=1e-12)  # Pupil's y = 0 is the bottom
    plain = write(tmp_path / "c.csv", "t,x,y\n0,1.0,0.0\n0.01,0.5,0.5\n")
    s = read_recording(plain, ReadOptions(units="norm", fov_deg=(90.0, 60.0))).samples
    np.testing.assert_allclose(s.y_deg, [30.0, 0.0], atol=1e-12)
    with pytest.raises(RecordingError, match="states the unit norm but --units px"):
        read_recording(top, ReadOptions(units="px", fov_deg=(90.0, 60.0)))
    with pytest.raises(RecordingError, match=r"gaze is normalised .*\(--fov H,V"):
        read_recording(top)


def test_pupil_neon_style_header_uses_its_degree_columns(tmp_path: Path) -> None:
    f = write(
        tmp_path / "gaze.csv",
        "section id,recording id,timestamp [ns],gaze x [px],gaze y [px],worn,fixation id,"
        "blink id,azimuth [deg],elevation [deg]\n"
        "s,r,1700000000000000000,800,600,1,1,,0.5,-1.5\n"
        "s,r,1700000000005000000,810,600,1,1,,1.0,-1.0\n",
    )
    s = read_recording(f).samples  # no geometry needed: the degrees win over the pixels
    # ns since 1970 in float64 resolve 256 ns: plenty for gaze
    np.testing.assert_allclose(s.timestamps - s.timestamps[0], [0.0, 0.005], rtol=0, atol=1e-6)
    np.testing.assert_allclose(s.x_deg, [0.5, 1.0])
    np.testing.assert_allclose(s.y_deg, [-1.5, -1.0])


def test_interleaved_recordings_are_grouped_and_validity_parsed(tmp_path: Path) -> None:
    f = write(
        tmp_path / "r.csv",
        "t,x,y,valid,participant,activity,session\n0,1,2,1,a,read,s1\n0,3,4,true,b,read,s1\n"
        "0.01,1,2,0,a,read,s1\n0.01,3,4,yes,b,read,s1\n0,5,6,1,a,read,s2\n",
    )
    recs = read_recordings(f)
    assert [(r.person, r.task, r.recording, len(r.samples)) for r in recs] == [
        ("a", "read", "s1", 2),
        ("b", "read", "s1", 2),
        ("a", "read", "s2", 1),
    ]
    assert recs[0].samples.valid.tolist() == [True, False]
    with pytest.raises(RecordingError, match="choose one with --recording ID"):
        read_recording(f)


@pytest.mark.parametrize(
    ("body", "line", "column", "message"),
    [
        ("t,x,y\n", 1, None, "a header line but no samples"),
        ("# only a comment\n\n", None, None, "the file is empty"),
        ("time,gaze_x,gazey\n0,1,2\n", 1, None, "no gaze columns: .*did you mean 'gazey'"),
        ("tme,x,y\n0,1,2\n", 1, None, "no time column .*did you mean 'tme'"),
        ("t,x,y\n0,1,2\n0.01,1,abc\n", 3, "y", "not a number in column 'y': 'abc'"),
        ("t,x,y\n0,1,2\n0.01,1\n", 3, None, "2 fields, expected 3"),
        ("t,x,y\n0.02,1,2\n0.01,1,2\n", 3, "t", "time does not increase in column 't'"),
        ("t,x,y\n0,1,2\n,1,2\n", 3, "t", "no value in column 't'"),
        ("t,x,y\n0,1,2\n4,1,2\n8,1,2\n", 1, "t", "too long for seconds .*--time-unit ms"),
        ("t,x,y\n0,960,540\n0.01,961,540\n", 1, "x", "up to 961 .* cannot be degrees"),
        ("t,x,y,valid\n0,1,2,maybe\n", 2, "valid", "'maybe' is not a validity flag"),
        ("t,x,y,person\n0,1,2,\n", 2, "person", "empty 'person' cell"),
        ("1,2,3\n4,5,6\n", 1, None, "no header line; name the columns"),
        ("t,x_deg,y_px\n0,1,2\n", 1, "y_px", "state different units"),
    ],
)
def test_errors_name_file_line_and_column(
    tmp_path: Path, body: str, line: int | None, column: str | None, message: str
) -> None:
    f = write(tmp_path / "bad.csv", body)
    with pytest.raises(RecordingError, match=message) as err:
        read_recordings(f)
    assert err.value.path == f
    assert err.value.line == line
    assert err.value.column == column
    assert str(err.value).startswith(f"{f}, line {line}:" if line else f"{f}:")
    assert isinstance(err.value, DatasetError)


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"both the screen size .* and the eye-to-screen"):
        ReadOptions(screen_mm=(500.0, 300.0))
    with pytest.raises(ConfigError, match=r"either a screen .* or a field of view"):
        ReadOptions(screen_mm=(500.0, 300.0), distance_mm=600.0, fov_deg=(90.0, 60.0))
    with pytest.raises(ConfigError, match="'format'"):
        ReadOptions(format="smi")  # type: ignore[arg-type]
    assert parse_pair("90,70") == parse_pair(" 90 70 ") == (90.0, 70.0)
    with pytest.raises(ValueError, match="expected two numbers like 90,70"):
        parse_pair("90")


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 40),
    rate=st.sampled_from([30.0, 120.0, 500.0, 1000.0]),
    unit=st.sampled_from(["s", "ms", "us"]),
    style=st.sampled_from(["t_{u}", "time [{u}]", "Timestamp_{u}"]),
    seed=st.integers(0, 2**16),
)
def test_csv_round_trip_with_any_stated_time_unit(
    tmp_path_factory: pytest.TempPathFactory, n: int, rate: float, unit: str, style: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    t = 12.5 + np.arange(n) / rate
    x, y = rng.uniform(-40, 40, n), rng.uniform(-30, 30, n)
    pupil = rng.uniform(2, 8, n)
    x[rng.random(n) < 0.2] = np.nan
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    rows = [f"{style.format(u=unit)},X_deg,Y_deg,pupil_mm"]
    rows += [
        ",".join(repr(float(v)) for v in (a * scale, b, c, d))
        for a, b, c, d in zip(t, x, y, pupil, strict=True)
    ]
    f = tmp_path_factory.mktemp("rt") / "r.csv"
    f.write_text("\n".join(rows).replace("nan", ""))
    s = read_recording(f).samples
    np.testing.assert_allclose(s.timestamps, t, rtol=1e-12)
    assert s.valid.tolist() == np.isfinite(x).tolist()
    np.testing.assert_array_equal(s.x_deg[s.valid], x[s.valid])
    np.testing.assert_array_equal(s.y_deg[s.valid], y[s.valid])
    np.testing.assert_array_equal(s.pupil_mm[s.valid], pupil[s.valid])


# -- real recordings from ../shared/data, in gazeguard's CSV format -----------------------------
@pytest.mark.data
def test_gazegraph_member_reads_headerless_with_columns_and_rate(
    shared_data: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(shared_data / "gazegraph_desktop_activity" / "DesktopActivity.zip") as z:
        raw = z.read("DesktopActivity/P3/P3_READ.csv")
    f = tmp_path / "P3_READ.csv"
    f.write_bytes(raw)
    opts = ReadOptions(columns=("norm_pos_x", "norm_pos_y"), rate_hz=30.0, fov_deg=(99.0, 53.0))
    s = read_recording(f, opts).samples
    xy = np.loadtxt(io.BytesIO(raw), delimiter=",")
    assert len(s) == xy.shape[0] == 9000
    np.testing.assert_allclose(np.diff(s.timestamps), 1 / 30)
    want_x, want_y = normalized_to_deg(xy[:, 0], xy[:, 1], (99.0, 53.0), y_up=True)
    np.testing.assert_array_equal(s.x_deg, want_x)
    np.testing.assert_array_equal(s.y_deg, want_y)


@pytest.mark.data
def test_irf_recording_written_as_gazeguard_csv_reads_back(
    shared_data: Path, tmp_path: Path
) -> None:
    a = np.load(shared_data / "irf_lookAtPoint_EL" / "lookAtPoint_EL_S1.npy")
    f = tmp_path / "S1.csv"
    with f.open("w") as fh:
        fh.write("time_ms,x_deg,y_deg,valid,subject,task\n")
        for row in a:
            fh.write(
                f"{row['t'] * 1000:.3f},{float(row['x'])!r},{float(row['y'])!r},"
                f"{int(row['status'])},S1,lookAtPoint\n"
            )
    rec = read_recording(f)
    assert (rec.person, rec.task) == ("S1", "lookAtPoint")
    np.testing.assert_allclose(rec.samples.timestamps, a["t"], atol=1e-9)
    assert rec.samples.valid.tolist() == a["status"].tolist()
    ok = a["status"]
    np.testing.assert_array_equal(rec.samples.x_deg[ok], a["x"][ok].astype(np.float64))
    assert int((~rec.samples.valid).sum()) == 1862
