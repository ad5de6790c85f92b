"""The evaluation pipeline end to end on simulated people: real features, real mechanisms, real
classifiers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gazeguard.cli import main
from gazeguard.offline.eval.datasets import Synthetic
from gazeguard.offline.eval.grid import MechanismSpec, parse_mechanism
from gazeguard.offline.eval.harness import (
    EvalSettings,
    FeatureBounds,
    Releaser,
    evaluate_configuration,
    gazeguard_factory,
)
from gazeguard.offline.eval.runner import best_configuration, public_bounds, select_features
from gazeguard.privacy.accounting import compose
from gazeguard.privacy.mechanisms import Bounds, make_mechanism
from gazeguard.signal.dataset import FeatureTable
from tests.offline._eval_cli import SyntheticEval

PEOPLE = 6
# 30 s window + 256 steps of 0.5 s: every recording fills exactly 8 chunks of 32 steps.
DURATION_S = 30.0 + 0.5 * 256


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> FeatureTable:
    """6 simulated people × 4 tasks, 158 s each at 60 Hz, through the service's extraction."""
    cache = tmp_path_factory.mktemp("features")
    return Synthetic(PEOPLE, None, DURATION_S, 60.0, seed=11).features(30.0, 0.5, cache)


def _bounds(table: FeatureTable) -> tuple[np.ndarray, FeatureBounds]:
    cols, _ = select_features(table)
    b = public_bounds(table.feature_names, 30.0, 0.5)
    return cols, FeatureBounds(b.lo[cols], b.hi[cols], b.max_step[cols])


def _acc(row: dict[str, Any], what: str, view: str, mode: str = "window") -> dict[str, float]:
    return {c: d[mode]["mean"] for c, d in row[what][view].items()}


class _NoiseFree:
    """The real CFPA with every coefficient kept and its noise step left out
    (``Mechanism.nonprivate_projection``): the "noise disabled" configuration."""

    def __init__(self, bounds: FeatureBounds, n: int) -> None:
        b = Bounds(lo=bounds.lo, hi=bounds.hi, max_step=bounds.max_step)
        self.mech = make_mechanism("cfpa", n=n, k=n, epsilon=1.0, bounds=b, transform="dct", seed=0)

    def release(self, x: np.ndarray) -> np.ndarray:
        return self.mech.nonprivate_projection(x)


def test_table_has_every_recording_in_full_chunks(table: FeatureTable) -> None:
    assert sorted(set(table.person.tolist())) == [f"sim{i:02d}" for i in range(1, PEOPLE + 1)]
    assert len(set(table.task.tolist())) == 4
    for _, rows in table.recordings():
        assert rows.size == 256
        assert np.all(np.diff(table.t[rows]) == pytest.approx(0.5))


def test_noise_disabled_privatized_scores_coincide_with_clean(table: FeatureTable) -> None:
    cols, bounds = _bounds(table)
    settings = EvalSettings(utility_reps=1, clf_reps=1, insecure_seed=None)

    def factory(spec: MechanismSpec, n: int, eps: float, seed: int | None) -> Releaser:
        return _NoiseFree(bounds, n)

    clean = evaluate_configuration(
        table,
        cols,
        parse_mechanism("none"),
        None,
        factory=factory,
        settings=settings,
        bounds=bounds,
        job_seed=3,
    )
    quiet = evaluate_configuration(
        table,
        cols,
        parse_mechanism("cfpa-32-dct"),
        1.0,
        factory=factory,
        settings=settings,
        bounds=bounds,
        job_seed=3,
    )
    assert quiet["rows_released"] == table.n_rows  # 8 full chunks per recording, nothing dropped
    assert quiet["chunks_per_recording"] == {"min": 8, "max": 8}
    assert quiet["utility"]["rmse_over_range"] < 1e-9
    for what in ("task", "task_half", "reid"):
        for mode in ("window", "vote"):
            expected = _acc(clean, what, "release", mode)
            assert _acc(quiet, what, "release", mode) == pytest.approx(expected, abs=1e-12)
            assert _acc(quiet, what, "raw", mode) == pytest.approx(expected, abs=1e-12)
    # The clean baseline is informative, so "coincide" is not trivially "both at chance".
    assert max(_acc(clean, "reid", "release").values()) > 0.6


@pytest.mark.slow
def test_tiny_epsilon_pushes_reidentification_to_chance(table: FeatureTable) -> None:
    cols, bounds = _bounds(table)
    reps = 4
    settings = EvalSettings(utility_reps=1, clf_reps=reps, insecure_seed=20240607)
    row = evaluate_configuration(
        table,
        cols,
        parse_mechanism("dcfpa-32-dft"),
        0.01,
        factory=gazeguard_factory(bounds, "auto"),
        settings=settings,
        bounds=bounds,
    )
    chance = 1.0 / PEOPLE
    # At ε = 0.01 a released chunk is (almost) independent of its input, so predictions are
    # independent across chunks (not across the windows of one chunk). The second halves hold
    # 4 chunks per recording: 24 recordings × 4 chunks × 4 repetitions independent trials.
    trials = 24 * 4 * reps
    sigma = math.sqrt(chance * (1 - chance) / trials)
    acc = _acc(row, "reid", "release")
    assert np.mean(list(acc.values())) <= chance + 4 * sigma, acc
    assert max(acc.values()) <= chance + 5 * sigma, acc
    assert min(acc.values()) >= chance - 5 * sigma, acc
    # The honest user-level ε: the accountant's composition of every feature of the 8 chunks
    # of a recording (at δ 1e-6; the sequential sum ε × features × 8 is its pure bound).
    mech = gazeguard_factory(bounds, "auto")(parse_mechanism("dcfpa-32-dft"), 32, 0.01, None)
    events = mech.events()  # type: ignore[attr-defined]
    want = compose({e: c * 8 for e, c in events.items()}, 1e-6).epsilon
    assert row["epsilon_user"]["max"] == pytest.approx(want)
    assert want < 0.01 * cols.size * 8 * 1.001


def test_best_configuration_picks_the_best_task_at_chance() -> None:
    def row(key: str, family: str, task: float, reid: float) -> dict[str, Any]:
        per = {"window": {"mean": reid}, "vote": {"mean": reid}}
        t = {"window": {"mean": task}, "vote": {"mean": task}}
        return {
            "mechanism": key,
            "label": key,
            "family": family,
            "epsilon": 1.0,
            "epsilon_user": None,
            "task": {"release": {"svm": t}},
            "task_half": {"raw": {"svm": t}},
            "reid": {"release": {"svm": per, "knn": per}, "raw": {"svm": per}},
        }

    rows = [
        row("none", "none", 0.9, 0.9),
        row("a", "dcfpa", 0.60, 0.140),  # at chance (0.125 + 0.02), best task
        row("b", "cfpa", 0.80, 0.150),  # best task but re-identifiable
        row("c", "lpa", 0.40, 0.100),
        row("d", "ksame", 0.95, 0.100),  # release rows only count in the David-John protocol
    ]
    best = best_configuration(rows, 8, 0.02)
    assert best is not None
    assert best["mechanism"] == "a"
    assert best["task"] == ("svm", 0.60)
    dj = best_configuration(rows, 8, 0.02, protocol="david-john")
    assert dj is not None
    assert dj["mechanism"] == "d"
    assert best_configuration(rows[:1] + rows[2:3], 8, 0.02) is None
    # With 4 tasks (chance 0.25) a task 0.275 is at chance too: never the best, "none useful".
    at_chance = [rows[0], row("e", "dcfpa", 0.275, 0.100)]
    assert best_configuration(at_chance, 8, 0.02) is not None  # (no task chance given)
    assert best_configuration(at_chance, 8, 0.02, n_tasks=4) is None
    above = best_configuration([*at_chance, rows[3]], 8, 0.02, n_tasks=4)
    assert above is not None
    assert above["mechanism"] == "c"


@pytest.mark.slow
def test_cli_writes_json_markdown_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], synthetic_eval: SyntheticEval
) -> None:
    run = synthetic_eval(
        "none,dcfpa-32-dct,ksame-2,expdp",
        "--per-chunk",  # the paper's axis: ε per feature per chunk
        "--utility-reps",
        "2",
        "--insecure-seed",
        "5",
    )
    out = run.out
    assert "[1/4] synthetic: clean (no privacy)" in run.stdout
    assert "ETA" in run.stdout
    assert "NOT private" in run.stderr
    doc = json.loads((out / "results.json").read_text())
    (res,) = doc["datasets"]
    assert res["meta"]["people"] == ["sim01", "sim02", "sim03"]
    keys = [r["mechanism"] for r in res["rows"]]
    assert keys == ["none", "dcfpa-32-dct", "ksame-2", "expdp"]
    dcfpa = res["rows"][1]
    assert dcfpa["epsilon"] == 2.4
    # composed by the accountant: more than one chunk's ε, less than the sequential sum
    assert 2.4 < dcfpa["epsilon_user"]["max"] < 2.4 * dcfpa["features_released"] * 2
    assert set(dcfpa["reid"]) == {"release", "raw"}
    md = (out / "results.md").read_text()
    assert "| Method | ε=2.4 | ε_user/ε |" in md
    assert "| DCFPA-32 (dct) |" in md
    assert "k-same-select (k=2)" in md
    for png in ("utility", "reid", "reid-raw", "task", "tradeoff", "correlation"):
        assert (out / f"synthetic-{png}.png").stat().st_size > 10_000
    # The tables and plots can be re-rendered from the JSON alone.
    again = tmp_path / "rendered"
    assert main(["eval", "--render", str(out / "results.json"), "--out", str(again)]) == 0
    assert (again / "results.md").read_text() == md
    assert (again / "synthetic-reid.png").stat().st_size > 10_000
    # Second run: features come from the cache.
    assert main([*run.args[:-2], "--out", str(tmp_path / "again"), "--mechanisms", "none"]) == 0
    assert "features from cache" in capsys.readouterr().out


def test_cli_help_explains_the_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    for needle in (
        "--quick",
        "--dataset",
        "--mechanisms",
        "--epsilons",
        "--jobs",
        "--out",
        "user-level",
        "k-NN",
        "majority vote",
        "leave one person out",
        "David-John",
    ):
        assert needle in text
