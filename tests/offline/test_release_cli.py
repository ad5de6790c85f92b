"""``gazeguard release`` end to end: files in, released table and manifest out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from gazeguard import __version__
from gazeguard.cli import main
from gazeguard.offline.release.manifest import REQUIRED_KEYS, manifest_path_for
from gazeguard.offline.release.output import private_path_for
from gazeguard.signal.dataset import FeatureTable, file_sha256


def _write_csv(path: Path, people: int = 4, tasks: int = 2, steps: int = 12) -> FeatureTable:
    rng = np.random.default_rng(8)
    n = people * tasks * steps
    person = np.repeat([f"p{i}" for i in range(people)], tasks * steps)
    task = np.tile(np.repeat([f"t{j}" for j in range(tasks)], steps), people)
    table = FeatureTable(
        rng.uniform(0, 10, size=(n, 3)),
        np.tile(np.arange(steps) * 0.5, people * tasks),
        person,
        task,
        np.char.add(np.char.add(person, "_"), task),
        ("fix_rate", "sac_amp", "blink_rate"),
    )
    table.save(path)
    return table


def test_ksame_csv_end_to_end_with_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "features.csv"
    table = _write_csv(src)
    out = tmp_path / "released.csv"
    assert main(["release", "ksame", str(src), "-o", str(out), "--k", "2"]) == 0
    released = FeatureTable.load(out)
    assert released.n_rows == table.n_rows
    assert released.feature_names == table.feature_names
    captured = capsys.readouterr()
    assert "k-anonymity with k=2" in captured.out
    assert "[2/2] task 't1'" in captured.err  # progress

    manifest = json.loads(manifest_path_for(out).read_text())
    assert set(REQUIRED_KEYS) <= set(manifest)
    assert manifest["mechanism"] == "ksame"
    assert manifest["parameters"] == {"k": 2, "leftover": "drop"}
    assert manifest["gazeguard_version"] == __version__
    assert manifest["input"]["sha256"] == file_sha256(src)
    assert manifest["input"]["rows"] == table.n_rows
    assert manifest["input"]["people"] == 4
    assert manifest["output"]["sha256"] == file_sha256(out)
    assert manifest["guarantee"]["kind"] == "k-anonymity"
    assert manifest["guarantee"]["numbers"]["k"] == 2
    assert manifest["seed_policy"].startswith("OS CSPRNG")
    started = datetime.fromisoformat(manifest["started_utc"])
    finished = datetime.fromisoformat(manifest["finished_utc"])
    assert started <= finished
    assert started.utcoffset() is not None


def test_expdp_with_bounds_file_and_insecure_seed_is_reproducible(tmp_path: Path) -> None:
    src = tmp_path / "features.npz"
    _write_csv(src)
    bounds = tmp_path / "bounds.json"
    bounds.write_text(json.dumps({n: [0, 10, 1] for n in ("fix_rate", "sac_amp", "blink_rate")}))
    outs = []
    for i in range(2):
        out = tmp_path / f"r{i}.parquet"
        args = ["release", "expdp", str(src), "-o", str(out), "--epsilon", "3", "-q"]
        assert main([*args, "--bounds", str(bounds), "--insecure-seed", "5"]) == 0
        outs.append(FeatureTable.load(out))
        manifest = json.loads(manifest_path_for(out).read_text())
        assert manifest["seed_policy"].startswith("INSECURE reproducible seed 5")
        assert manifest["guarantee"]["numbers"]["epsilon_per_person_task"] == 9.0
    np.testing.assert_array_equal(outs[0].X, outs[1].X)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ksame", "--k", "5"], "'k'"),
        (["ksame", "--gamma", "2"], "'gamma'.*not a parameter of ksame"),
        (["marginals", "--gamma", "1", "--range", "data"], "'gamma'"),
        (["expdp", "--epsilon", "0", "--range", "data"], "'epsilon'"),
        (["expdp", "--epsilon", "1"], "'bounds'"),
    ],
)
def test_errors_exit_1_and_name_the_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    src = tmp_path / "features.csv"
    _write_csv(src)
    out = tmp_path / "released.csv"
    assert main(["release", args[0], str(src), "-o", str(out), *args[1:]]) == 1
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_output_must_not_overwrite_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "features.csv"
    _write_csv(src)
    assert main(["release", "ksame", str(src), "-o", str(src), "--k", "2"]) == 1
    assert "must differ from the input" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_releases_raw_gaze_via_dataset(tmp_path: Path) -> None:
    """A real subprocess: raw gaze CSV → features → k-same release + manifest."""
    rng = np.random.default_rng(1)
    lines = ["t,x,y,person,task"]
    for person in ("a", "b"):
        t = np.arange(0, 24, 1 / 60)
        jumps = np.repeat(rng.normal(0, 5, size=(t.size // 20 + 1, 2)), 20, axis=0)[: t.size]
        xy = jumps + rng.normal(0, 0.05, size=(t.size, 2))
        lines += [
            f"{ti:.4f},{x:.3f},{y:.3f},{person},reading" for ti, (x, y) in zip(t, xy, strict=True)
        ]
    raw = tmp_path / "gaze.csv"
    raw.write_text("\n".join(lines) + "\n")
    out = tmp_path / "released.npz"
    cmd = [sys.executable, "-m", "gazeguard", "release", "ksame", "--dataset", f"csv:{raw}"]
    cmd += ["--window-s", "10", "--step-s", "2", "--rate", "60", "-o", str(out), "--k", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    released = FeatureTable.load(out)
    assert released.n_rows > 0
    # The release names groups; the private mapping next to it says who is who.
    person = json.loads(private_path_for(out).read_text())["person"]
    real = np.array([person[p] for p in released.person.tolist()])
    assert (real == "a").any()
    assert np.array_equal(released.X[real == "a"], released.X[real == "b"])
    manifest = json.loads(manifest_path_for(out).read_text())
    assert manifest["input"]["source"].startswith(f"dataset csv:{raw}")
    assert manifest["input"]["fingerprint"]
    assert "sha256" not in manifest["input"]
