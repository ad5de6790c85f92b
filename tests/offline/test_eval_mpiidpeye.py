"""MPIIDPEye (the dataset of Bozkir et al. 2021's tables): its reader and its dataset, on a small
slice generated here in the dataset's own layout (CI has no ../shared/data), and on the real
folder when it is there."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gazeguard.core.errors import DatasetError
from gazeguard.offline.eval.datasets import (
    PUBLIC_DATASETS,
    DataNotFoundError,
    MpiiDpEye,
    open_dataset,
)
from gazeguard.offline.recordings import ReadOptions, detect_format, read_recording
from gazeguard.offline.recordings import mpiidpeye as mpii

GENDERS = {1: "female", 2: "male", 3: "male"}


def _recording(rng: np.random.Generator, seconds: float, person: int) -> str:
    """Reading-like eye-camera data: fixations along lines, small saccades, confidence dips."""
    n = int(seconds * 30.4)
    t = 4970.6 + np.arange(n) * (1 / 30.4)
    x = 0.40 + 0.1 * ((np.arange(n) // 9) % 12) / 12 + rng.normal(0, 0.002, n) + 0.01 * person
    y = 0.35 - 0.02 * ((np.arange(n) // 108) % 10) + rng.normal(0, 0.002, n)
    conf = np.where(rng.random(n) < 0.1, rng.uniform(0.0, 0.59, n), rng.uniform(0.6, 1.0, n))
    diam = 80.0 + 10 * np.sin(np.arange(n) / 300) + rng.normal(0, 1, n)
    return "".join(
        f"{a:.6f};{b:.6f};{c:.6f};{d:.6f};{e:.6f}\n"
        for a, b, c, d, e in zip(x, y, t, conf, diam, strict=True)
    )


def write_slice(root: Path, people: int = 3, seconds: float = 45.0, seed: int = 1) -> Path:
    """A folder laid out as MPIIDPEye's raw data: ``Data_P{n}_R{1,2,3}.csv`` and
    ``Ground_Truth.csv``."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for p in range(1, people + 1):
        for r in (1, 2, 3):
            (root / f"Data_P{p}_R{r}.csv").write_text(_recording(rng, seconds, p))
    lines = ["Participant,Gender"] + [f"{p},{GENDERS[p]}" for p in range(1, people + 1)]
    (root / "Ground_Truth.csv").write_text("\n".join(lines) + "\n")
    return root


def test_one_file_is_read_with_its_rate_validity_degrees_and_labels(tmp_path: Path) -> None:
    f = tmp_path / "Data_P7_R2.csv"
    f.write_text(
        "0.500000;0.500000;100.000000;0.900000;90.000000\n"
        "0.600000;0.400000;100.032900;0.590000;91.000000\n"  # below Pupil's 0.6 cut: invalid
        "0.600000;0.400000;100.065800;0.600000;92.000000\n"
    )
    assert detect_format(f) == "mpiidpeye"
    rec = read_recording(f)
    assert rec.format == "mpiidpeye"
    assert (rec.person, rec.task, rec.rate_hz) == ("P7", "newspaper", 30.0)
    s = rec.samples
    assert s.valid.tolist() == [True, False, True]
    assert math.isnan(s.x_deg[1])
    # The stated geometry by hand: f = 670.8 px, eye centre 35 mm, pupil 10.392 mm from it.
    mm_per_px = (35.0 - 10.392) / 670.8
    deg_x = math.degrees(640 * mm_per_px / 10.392)
    deg_y = math.degrees(480 * mm_per_px / 10.392)
    assert (deg_x, deg_y) == pytest.approx((129.45, 97.08), abs=0.01)
    assert s.x_deg[[0, 2]].tolist() == pytest.approx([0.0, 0.1 * deg_x])
    assert s.y_deg[[0, 2]].tolist() == pytest.approx([0.0, -0.1 * deg_y])
    assert s.pupil_mm[[0, 2]].tolist() == pytest.approx([90 * mm_per_px, 92 * mm_per_px])
    assert any("Pupil Labs' public eye-camera" in n for n in rec.notes)
    # Pupil's cut is an option like every reader's; a declared rate overrides the dataset's.
    loose = read_recording(f, ReadOptions(min_confidence=0.5, rate_hz=120.0))
    assert loose.samples.valid.all()
    assert loose.rate_hz == 120.0


def test_a_malformed_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "Data_P1_R1.csv"
    f.write_text("0.5;0.5;1.0;0.9;80\n0.5;0.5;1.033;0.9\n")
    with pytest.raises(DatasetError, match="4 fields, expected 5") as info:
        read_recording(f, ReadOptions(format="mpiidpeye"))
    assert info.value.line == 2
    f.write_text("0.5;0.5;1.0;0.9;80\n0.5;0.5;0.9;0.9;80\n")
    with pytest.raises(DatasetError, match="time does not increase"):
        read_recording(f, ReadOptions(format="mpiidpeye"))


def test_the_dataset_labels_document_gender_and_person(tmp_path: Path) -> None:
    root = write_slice(tmp_path / "mpiidpeye_vr_reading")
    ds = open_dataset(f"mpiidpeye:{root}")
    assert isinstance(ds, MpiiDpEye)
    recs = list(ds.recordings())
    assert [(r.person, r.task) for r in recs[:4]] == [
        ("P1", "comic"), ("P1", "newspaper"), ("P1", "textbook"), ("P2", "comic"),
    ]  # fmt: skip
    assert {r.rate_hz for r in recs} == {30.0}
    assert recs[0].recording == "P1_comic"
    assert 0.8 < float(np.mean(recs[0].samples.valid)) < 0.95
    gender = open_dataset(f"mpiidpeye-gender:{root}")
    assert [r.task for r in gender.recordings()][::3] == ["female", "male", "male"]
    assert gender.name == "mpiidpeye-gender"
    # Found under a data folder like the other public datasets.
    assert open_dataset("mpiidpeye", tmp_path).path == root
    with pytest.raises(DataNotFoundError, match=r"perceptualui\.org"):
        open_dataset("mpiidpeye", tmp_path / "elsewhere")
    assert "non-commercial" in PUBLIC_DATASETS["mpiidpeye"].licence


def test_features_once_for_both_targets(tmp_path: Path) -> None:
    root = write_slice(tmp_path / "data", people=2, seconds=40.0)
    cache = tmp_path / "cache"
    doc = open_dataset(f"mpiidpeye:{root}").features(10.0, 0.5, cache)
    lines: list[str] = []
    gender = open_dataset(f"mpiidpeye-gender:{root}").features(10.0, 0.5, cache, lines.append)
    assert any("from cache" in ln for ln in lines)  # extracted once, relabelled
    np.testing.assert_array_equal(doc.X, gender.X)
    assert sorted(set(doc.task.tolist())) == ["comic", "newspaper", "textbook"]
    assert sorted(set(gender.task.tolist())) == ["female", "male"]
    assert set(gender.task[doc.person == "P1"].tolist()) == {"female"}
    # pupil in mm inside the features' 1.5..9 mm range: the pupil features are defined
    j = doc.feature_names.index("pupil_mean")
    assert 2.5 < float(np.median(doc.X[:, j])) < 3.5


def test_ground_truth_must_name_every_reader(tmp_path: Path) -> None:
    root = write_slice(tmp_path / "d", people=2, seconds=2.0)
    (root / "Ground_Truth.csv").write_text("Participant,Gender\n1,female\n")
    with pytest.raises(DatasetError, match="no gender for P2"):
        MpiiDpEye(root)
    (root / "Ground_Truth.csv").write_text("Participant,Gender\n1,female\n2,unknown\n")
    with pytest.raises(DatasetError, match="expected 'participant,gender'") as info:
        MpiiDpEye(root)
    assert info.value.line == 3
    (root / "Ground_Truth.csv").unlink()
    with pytest.raises(DatasetError, match=r"Ground_Truth\.csv"):
        MpiiDpEye(root)


@pytest.mark.data
def test_the_real_folder(shared_data: Path) -> None:
    ds = MpiiDpEye(shared_data / "mpiidpeye_vr_reading")
    assert len(ds.files) == 60
    assert sorted(ds.genders.values()).count("female") == 10
    first = next(ds.recordings())
    assert (first.person, first.task, len(first.samples)) == ("P1", "comic", 19125)
    assert np.median(np.diff(first.samples.timestamps)) == pytest.approx(1 / 30.4, abs=2e-4)
    # Eye rotation stays within the eye's range: 99% of samples inside ±45°.
    assert np.nanpercentile(np.abs(first.samples.x_deg), 99) < 45
    assert 2.0 < np.nanmedian(first.samples.pupil_mm) < 5.0
    assert mpii.RATE_HZ == 30.0


@pytest.mark.slow
def test_eval_and_release_accept_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gazeguard.cli import main  # noqa: PLC0415 - the CLI's heavy imports, this test only
    from gazeguard.signal.dataset import FeatureTable  # noqa: PLC0415

    root = write_slice(tmp_path / "mpii", people=3, seconds=40.0)
    out = tmp_path / "out"
    args = [
        "eval", "--dataset", f"mpiidpeye:{root}", "--per-chunk", "--mechanisms", "none,lpa-8",
        "--epsilons", "4.8", "--window", "10", "--classifiers", "dt", "--utility-reps", "1",
        "--clf-reps", "1", "--every-task", "1", "--every-reid", "1", "--no-cache",
        "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "mpiidpeye: 3 people, 3 tasks, 9 recordings" in text
    assert "[2/2] mpiidpeye: LPA-8 ε=4.8" in text
    released = tmp_path / "released.npz"
    rel = ["release", "ksame", "--dataset", f"mpiidpeye:{root}", "--window-s", "10"]
    assert main([*rel, "--k", "2", "-o", str(released)]) == 0
    assert set(FeatureTable.load(released).task.tolist()) == {"comic", "newspaper", "textbook"}


def test_the_paper_values_are_transcribed_whole() -> None:
    from gazeguard.offline.eval.paper_tables import PAPER, PAPER_EPS  # noqa: PLC0415

    assert sorted(PAPER) == [1, 2, 3, 6, 7, 8]
    for rows in PAPER.values():
        assert sorted(rows) == sorted(
            ["fpa", *(f"{m}-{n}" for m in ("cfpa", "dcfpa") for n in (32, 64, 128))]
        )
        for by_eps in rows.values():
            assert list(by_eps) == list(PAPER_EPS)
            assert all(0.0 <= v <= 1.0 for cell in by_eps.values() for v in cell.values())
    # spot checks against the paper's text: Table 1 DCFPA-128 at ε 4.8, Table 8 FPA at ε 48
    assert PAPER[1]["dcfpa-128"][4.8] == {"knn": 0.69, "svm": 0.50, "dt": 0.44, "rf": 0.46}
    assert PAPER[8]["fpa"][48.0] == {"knn": 1.0, "svm": 1.0, "dt": 0.95, "rf": 1.0}
    assert PAPER[2]["dcfpa-64"][48.0] == {"knn": 0.03, "svm": 0.0, "dt": 0.30, "rf": 0.34}


@pytest.mark.slow
def test_paper_tables_on_a_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json  # noqa: PLC0415

    from gazeguard.cli import main  # noqa: PLC0415

    root = write_slice(tmp_path / "mpii", people=3, seconds=50.0)
    out = tmp_path / "out"
    args = [
        "eval", "--paper-tables", "--dataset", f"mpiidpeye:{root}", "--mechanisms",
        "dcfpa-8-dft", "--epsilons", "4.8", "--window", "10", "--classifiers", "knn,dt",
        "--clf-reps", "2", "--every-task", "1", "--every-reid", "1", "--no-cache",
        "--insecure-seed", "3", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    assert "Clean document type with majority voting: k-NN" in capsys.readouterr().out
    doc = json.loads((out / "paper-tables.json").read_text())
    (run,) = doc["runs"]
    assert [r["mechanism"] for r in run["rows"]] == ["none", "dcfpa-8-dft"]
    row = run["rows"][1]
    assert row["reps"] == {"clf": 2}
    assert set(row) >= {"task", "gender", "reid"}
    assert set(row["gender"]["release"]) == {"knn", "dt"}
    md = (out / "paper-tables.md").read_text()
    for n in (1, 2, 3, 6, 7, 8):
        assert f"### Table {n}:" in md
    assert "| DCFPA-8 (dft) | k-NN |" in md  # not in the paper: no value beside ours
    # A second run of the other sensitivity is added beside the first, not over it.
    assert main([*args[:-2], "--sensitivity", "paper", "--out", str(out)]) == 0
    runs = json.loads((out / "paper-tables.json").read_text())["runs"]
    assert [r["meta"]["sensitivity"] == "public" for r in runs] == [True, False]
    assert (out / "paper-tables.md").read_text().count("### Table 1:") == 2
