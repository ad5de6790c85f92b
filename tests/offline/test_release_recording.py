"""gazeguard's DP mechanisms (LPA/FPA/CFPA/DCFPA) applied per recording to a dataset."""

from __future__ import annotations

import numpy as np
import pytest

from gazeguard.core.errors import ConfigError
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.privacy.accounting import LaplaceEvent, compose
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES, feature_bounds

FEATS = tuple(NAMES[:4])
LO, HI, STEP = feature_bounds(FEATS)


def _table(lengths: dict[str, int]) -> FeatureTable:
    """One recording per person, a smooth walk inside the public bounds."""
    rng = np.random.default_rng(4)
    parts = []
    for person, n in lengths.items():
        walk = np.cumsum(rng.uniform(-1, 1, size=(n, len(FEATS))) * STEP * 0.5, axis=0)
        parts.append((person, np.clip((LO + HI) / 2 + walk, LO, HI)))
    X = np.concatenate([x for _, x in parts])
    person = np.concatenate([[p] * len(x) for p, x in parts])
    t = np.concatenate([np.arange(len(x)) * 0.5 for _, x in parts])
    return FeatureTable(X, t, person, np.full(len(X), "task"), np.char.add(person, "-rec"), FEATS)


def test_dcfpa_drops_tails_and_charges_every_chunk() -> None:
    table = _table({"a": 37, "b": 16})
    rel = RELEASE_MECHANISMS["dcfpa"](table, {"epsilon": 2.0, "n": 8})
    out = rel.table
    # a: 4 chunks of 8 (5 tail steps dropped), b: 2 chunks.
    assert [int((out.person == p).sum()) for p in ("a", "b")] == [32, 16]
    np.testing.assert_array_equal(out.t[out.person == "a"], table.t[table.person == "a"][:32])
    assert np.all((out.X >= LO) & (out.X <= HI))
    assert not np.allclose(out.X, table.X[np.r_[0:32, 37:53]])  # noise was added
    numbers = rel.manifest["guarantee"]["numbers"]
    assert numbers["epsilon_per_chunk"] == pytest.approx(2.0 * 4)
    assert numbers["epsilon_per_person"] == pytest.approx(2.0 * 4 * 4)
    # the accountant: person a's 16 releases (4 chunks × 4 features, ε 2 each: noise
    # multiplier 1/2) composed at δ 1e-6
    events = {LaplaceEvent(0.5): 16}
    assert numbers["delta"] == 1e-6
    assert numbers["epsilon_per_person_at_delta"] < numbers["epsilon_per_person"]
    assert numbers["epsilon_per_person_at_delta"] == pytest.approx(
        compose(events, 1e-6).epsilon, rel=1e-3
    )
    assert rel.manifest["details"]["recordings"]["a-rec"] == {
        "steps": 37,
        "chunks": 4,
        "steps_released": 32,
    }
    assert "5 steps not released" in rel.manifest["guarantee"]["statement"]


def test_tail_pad_releases_every_step_at_the_cost_of_one_more_chunk() -> None:
    table = _table({"a": 37})
    rel = RELEASE_MECHANISMS["cfpa"](table, {"epsilon": 1.0, "n": 8, "tail": "pad", "keep": 2})
    assert rel.table.n_rows == 37
    assert rel.manifest["guarantee"]["numbers"]["max_chunks_per_person"] == 5
    assert rel.manifest["details"]["kept_frequencies"] == [2]


def test_fpa_releases_each_recording_whole_and_lpa_every_value() -> None:
    table = _table({"a": 21, "b": 10})
    fpa = RELEASE_MECHANISMS["fpa"](table, {"epsilon": 1.0, "keep": 3, "transform": "dct"})
    assert fpa.table.n_rows == 31
    assert fpa.manifest["guarantee"]["numbers"]["max_chunks_per_person"] == 1
    assert sorted(fpa.manifest["details"]["noise_scale"]) == ["10", "21"]
    lpa = RELEASE_MECHANISMS["lpa"](table, {"epsilon": 1.0, "n": 5})
    assert lpa.table.n_rows == 30  # 4 + 2 chunks of 5
    assert lpa.manifest["details"]["kept_frequencies"] is None


def test_releases_draw_fresh_noise_from_the_os_csprng() -> None:
    table = _table({"a": 32})
    a = RELEASE_MECHANISMS["dcfpa"](table, {"epsilon": 1.0, "n": 16})
    b = RELEASE_MECHANISMS["dcfpa"](table, {"epsilon": 1.0, "n": 16})
    assert not np.array_equal(a.table.X, b.table.X)
    assert a.manifest["seed_policy"].startswith("OS CSPRNG")
    c = RELEASE_MECHANISMS["dcfpa"](table, {"epsilon": 1.0, "n": 16}, seed=3)
    d = RELEASE_MECHANISMS["dcfpa"](table, {"epsilon": 1.0, "n": 16}, seed=3)
    np.testing.assert_array_equal(c.table.X, d.table.X)
    assert c.manifest["seed_policy"].startswith("INSECURE")


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("cfpa", {"epsilon": 1.0, "n": 12}, "n"),
        ("dcfpa", {"epsilon": 1.0, "n": 8, "keep": 5}, "keep"),
        ("dcfpa", {"epsilon": 0.0}, "epsilon"),
        ("lpa", {"epsilon": 1.0, "keep": 2}, "keep"),
        ("fpa", {"epsilon": 1.0, "n": 8}, "n"),
        ("dcfpa", {"epsilon": 1.0, "range": "data"}, "range"),
        ("dcfpa", {"epsilon": 1.0, "bounds": dict.fromkeys(FEATS, (0.0, 1.0))}, "bounds"),
    ],
)
def test_bad_parameters_name_the_parameter(
    name: str, params: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        RELEASE_MECHANISMS[name](_table({"a": 32}), params)
    assert info.value.field == field
