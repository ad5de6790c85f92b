"""Exponential-DP (Steil et al. 2019 as described by David-John et al. 2022)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from gazeguard.core.errors import ConfigError
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.offline.release._common import ReleaseRandom
from gazeguard.offline.release.expdp import expdp_lambda, expdp_noise
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES, feature_bounds


def formula_cdf(r: np.ndarray, epsilon: float, t_max: int, delta: float) -> np.ndarray:
    """CDF of r = S·ln(y)/(λ·t_max), S = ±1 fair, y ~ Exponential(mean 1/λ), λ = ε/(2·t_max·δ).

    With c = λ·t_max: P(r ≤ z) = ½·P(ln y ≤ cz) + ½·P(ln y ≥ −cz)
                                = ½·(1 − exp(−λ·e^{cz})) + ½·exp(−λ·e^{−cz}).
    """
    lam = epsilon / (2 * t_max * delta)
    c = lam * t_max
    return 0.5 * (1 - np.exp(-lam * np.exp(c * r))) + 0.5 * np.exp(-lam * np.exp(-c * r))


def test_lambda_is_the_papers_formula() -> None:
    np.testing.assert_allclose(
        expdp_lambda(2.0, 40, np.array([0.5, 10.0])), [2.0 / (2 * 40 * 0.5), 2.0 / (2 * 40 * 10)]
    )


@pytest.mark.parametrize(("epsilon", "t_max", "delta"), [(2.0, 600, 3.0), (48.0, 32, 0.25)])
def test_noise_distribution_matches_its_formula(epsilon: float, t_max: int, delta: float) -> None:
    r = expdp_noise(epsilon, t_max, np.array([delta]), 100_000, ReleaseRandom(11))[:, 0]
    assert stats.kstest(r, lambda z: formula_cdf(z, epsilon, t_max, delta)).pvalue > 1e-3
    # The same sample is far from the formula at twice the range: the check has teeth.
    assert stats.kstest(r, lambda z: formula_cdf(z, epsilon, t_max, 2 * delta)).pvalue < 1e-6
    # Second moment: E[r²] = (2δ/ε)²·E[ln² y], E[ln² y] = π²/6 + (γ_E + ln λ)².
    lam = epsilon / (2 * t_max * delta)
    expected = (2 * delta / epsilon) ** 2 * (np.pi**2 / 6 + (np.euler_gamma + np.log(lam)) ** 2)
    assert np.mean(r**2) == pytest.approx(expected, rel=0.03)


def _two_tasks(n_short: int = 50, n_long: int = 200) -> FeatureTable:
    rows = []
    for person in ("a", "b", "c"):
        rows += [(person, "short", i) for i in range(n_short)]
        rows += [(person, "long", i) for i in range(n_long - (person == "c") * 20)]
    person = np.array([r[0] for r in rows])
    task = np.array([r[1] for r in rows])
    rec = np.char.add(np.char.add(person, "-"), task)
    X = np.column_stack([np.full(len(rows), 1.0), np.full(len(rows), 5.0)])
    return FeatureTable(X, np.array([r[2] * 0.5 for r in rows]), person, task, rec, ("u", "v"))


def test_release_uses_each_tasks_t_max_and_public_ranges() -> None:
    table = _two_tasks()
    bounds = {"u": (0.0, 2.0), "v": (0.0, 10.0)}
    rel = RELEASE_MECHANISMS["expdp"](table, {"epsilon": 4.0, "bounds": bounds}, seed=5)
    assert rel.table.n_rows == table.n_rows  # padded rows are never released
    np.testing.assert_array_equal(rel.table.person, table.person)
    noise = rel.table.X - table.X
    assert rel.manifest["details"]["t_max"] == {"long": 200, "short": 50}
    for task, t_max in (("long", 200), ("short", 50)):
        for j, delta in enumerate((2.0, 10.0)):
            r = noise[table.task == task, j]
            assert (
                stats.kstest(r, lambda z, t=t_max, d=delta: formula_cdf(z, 4.0, t, d)).pvalue > 1e-3
            )


def test_composed_epsilon_is_reported_alongside_the_per_feature_one() -> None:
    table = _two_tasks()
    rel = RELEASE_MECHANISMS["expdp"](table, {"epsilon": 0.5, "range": "data"})
    numbers = rel.manifest["guarantee"]["numbers"]
    assert numbers["epsilon_per_feature"] == 0.5
    assert numbers["epsilon_per_person_task"] == pytest.approx(2 * 0.5)
    assert numbers["epsilon_per_person"] == pytest.approx(2 * 0.5 * 2)
    assert "from the data itself" in rel.manifest["guarantee"]["statement"]
    # Constant features have data range 0: the formula's limit is no noise at all.
    np.testing.assert_array_equal(rel.table.X, table.X)
    assert rel.manifest["seed_policy"].startswith("OS CSPRNG")


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan"), float("inf"), "1", None])
def test_bad_epsilon_is_refused_naming_it(epsilon: object) -> None:
    params = {"range": "data"} if epsilon is None else {"range": "data", "epsilon": epsilon}
    with pytest.raises(ConfigError, match="'epsilon'") as info:
        RELEASE_MECHANISMS["expdp"](_two_tasks(), params)
    assert info.value.field == "epsilon"


def test_public_range_needs_declared_bounds() -> None:
    with pytest.raises(ConfigError, match=r"'bounds'.*--bounds") as info:
        RELEASE_MECHANISMS["expdp"](_two_tasks(), {"epsilon": 1.0})
    assert info.value.field == "bounds"


def test_public_range_from_the_feature_registry() -> None:
    names = tuple(NAMES[:3])
    lo, hi, _ = feature_bounds(names)
    X = np.tile((lo + hi) / 2, (40, 1))
    labels = np.array(["p"] * 20 + ["q"] * 20)
    table = FeatureTable(X, np.arange(40.0), labels, labels, labels, names)
    rel = RELEASE_MECHANISMS["expdp"](table, {"epsilon": 1.0}, seed=2)
    assert rel.manifest["details"]["range_source"] == "public"
    assert list(rel.manifest["details"]["delta"].values()) == pytest.approx(list(hi - lo))
