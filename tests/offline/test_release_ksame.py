"""k-same-select sequence: every released vector is the mean of exactly k people's vectors."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from gazeguard.cli import main
from gazeguard.core.errors import ConfigError
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.offline.release._common import padded, task_sequences
from gazeguard.offline.release.manifest import manifest_path_for
from gazeguard.signal.dataset import FeatureTable


def make_table(
    lengths: dict[tuple[str, str], int], n_features: int = 3, seed: int = 0
) -> FeatureTable:
    """One recording per (person, task) with ``lengths`` steps of distinct random values."""
    rng = np.random.default_rng(seed)
    X, t, person, task, rec = [], [], [], [], []
    for (p, k), n in lengths.items():
        X.append(rng.normal(size=(n, n_features)) * 10)
        t.append(np.arange(n) * 0.5 + 30.0)
        person += [p] * n
        task += [k] * n
        rec += [f"{p}-{k}"] * n
    return FeatureTable(
        np.concatenate(X),
        np.concatenate(t),
        np.array(person),
        np.array(task),
        np.array(rec),
        tuple(f"f{j}" for j in range(n_features)),
    )


def released_clusters(out: FeatureTable, task: str) -> dict[bytes, list[str]]:
    """People of ``task`` grouped by their released sequence (identical bytes = one group)."""
    clusters: dict[bytes, list[str]] = defaultdict(list)
    for person, rows in task_sequences(out)[task].items():
        clusters[out.X[rows].tobytes()].append(person)
    return clusters


def check_means(table: FeatureTable, out: FeatureTable, task: str, sizes: set[int]) -> int:
    """Each released sequence is the step-wise mean of the padded inputs of the people sharing
    it, and the groups have sizes in ``sizes``. Returns the number of people released."""
    seqs_in = task_sequences(table)[task]
    seqs_out = task_sequences(out)[task]
    t_max = max(seqs_in[p].size for p in seqs_out)
    released = 0
    for group in released_clusters(out, task).values():
        assert len(group) in sizes
        expected = np.mean([table.X[padded(seqs_in[p], t_max)] for p in group], axis=0)
        for p in group:
            assert seqs_out[p].size == t_max
            np.testing.assert_allclose(out.X[seqs_out[p]], expected, rtol=0, atol=1e-12)
            released += 1
    return released


LENGTHS = {
    **{(f"p{i}", "read"): 6 + i % 3 for i in range(7)},
    **{(f"p{i}", "write"): 5 for i in range(4)},
}


def test_every_released_vector_is_the_mean_of_exactly_k_people() -> None:
    table = make_table(LENGTHS)
    rel = RELEASE_MECHANISMS["ksame"](table, {"k": 3})
    out = rel.oracle_table()  # the release with the real ids put back from the private mapping
    # read: 7 people → 2 groups of 3, 1 left over; write: 4 people → 1 group of 3, 1 left over.
    assert check_means(table, out, "read", {3}) == 6
    assert check_means(table, out, "write", {3}) == 3
    tasks = rel.manifest["details"]["tasks"]
    assert [tasks["read"]["dropped_people"], tasks["write"]["dropped_people"]] == [1, 1]
    private = rel.private["tasks"]
    for task, info in private.items():
        released = set(out.person[out.task == task])
        assert len(info["dropped_people"]) == 1
        assert not released & set(info["dropped_people"])
        assert all(len(g) == 3 for g in info["groups"].values())
        assert tasks[task]["group_sizes"] == [3] * len(info["groups"])
    assert rel.manifest["guarantee"]["numbers"]["max_reidentification_probability"] == 1 / 3


def test_merge_releases_everyone_in_groups_of_k_to_2k_minus_1() -> None:
    table = make_table(LENGTHS)
    rel = RELEASE_MECHANISMS["ksame"](table, {"k": 3, "leftover": "merge"})
    assert check_means(table, rel.oracle_table(), "read", {3, 4}) == 7
    assert check_means(table, rel.oracle_table(), "write", {4}) == 4
    assert rel.manifest["guarantee"]["numbers"]["dropped_person_task_sequences"] == 0


def test_short_sequences_are_padded_with_their_last_vector_and_share_the_time_axis() -> None:
    table = make_table({("a", "x"): 2, ("b", "x"): 5})
    out = RELEASE_MECHANISMS["ksame"](table, {"k": 2}).oracle_table()
    a_in = table.X[table.person == "a"]
    b_in = table.X[table.person == "b"]
    a_pad = np.vstack([a_in, np.repeat(a_in[-1:], 3, axis=0)])
    np.testing.assert_allclose(out.X[out.person == "a"], (a_pad + b_in) / 2)
    np.testing.assert_array_equal(out.t[out.person == "a"], out.t[out.person == "b"])
    assert list(out.recording[out.person == "a"]) == ["a-x"] * 5


# Real ids that cannot appear by accident in numbers, hashes or English text.
REAL = {
    **{(f"PERSON-{c}", "reading"): 6 + i % 3 for i, c in enumerate("ABCDEFG")},
    **{(f"PERSON-{c}", "writing"): 5 for c in "ABCD"},
}


@pytest.mark.parametrize("leftover", ["drop", "merge"])
def test_the_release_names_groups_not_people(leftover: str) -> None:
    table = make_table(REAL)
    rel = RELEASE_MECHANISMS["ksame"](table, {"k": 3, "leftover": leftover})
    out = rel.table
    released_text = " ".join(
        [*out.person.tolist(), *out.recording.tolist(), json.dumps(rel.manifest)]
    )
    assert "PERSON-" not in released_text
    # Labels are group ids: gNN-mM (person) and gNN-mM-rR (recording), unique across tasks.
    assert all(re.fullmatch(r"g\d+-m\d+", p) for p in out.person.tolist())
    assert all(re.fullmatch(r"g\d+-m\d+-r\d+", r) for r in out.recording.tolist())
    for task in ("reading", "writing"):
        assert not set(out.person[out.task == "reading"]) & set(out.person[out.task == "writing"])
        assert rel.manifest["details"]["tasks"][task]["groups"] == sorted(
            {p.split("-")[0] for p in out.person[out.task == task].tolist()}
        )
    # The mapping (kept private) leads back to the real people, group by group.
    mapping = rel.private
    assert mapping["warning"].startswith("PRIVATE")
    for task, info in mapping["tasks"].items():
        for gid, members in info["groups"].items():
            released = sorted(p for p in set(out.person[out.task == task]) if p.startswith(gid))
            assert sorted(mapping["person"][p] for p in released) == sorted(members)
    assert set(mapping["recording"].values()) <= set(table.recording.tolist())


def test_fewer_people_than_k_is_refused_naming_k_and_the_task() -> None:
    table = make_table(LENGTHS)
    with pytest.raises(ConfigError, match=r"'k'.*task 'write' has only 4 people") as info:
        RELEASE_MECHANISMS["ksame"](table, {"k": 5})
    assert info.value.field == "k"
    assert info.value.value == 5


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"k": 1}, "k"),
        ({"k": True}, "k"),
        ({"k": 2.5}, "k"),
        ({"k": 2, "leftover": "x"}, "leftover"),
    ],
)
def test_bad_parameters_name_the_parameter(params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RELEASE_MECHANISMS["ksame"](make_table(LENGTHS), params)
    assert info.value.field == field


def test_a_parameter_of_another_mechanism_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'gamma'.*not a parameter of ksame"):
        RELEASE_MECHANISMS["ksame"](make_table(LENGTHS), {"k": 2, "gamma": 2.0})


def test_nan_input_is_refused_naming_the_feature() -> None:
    table = make_table(LENGTHS)
    X = table.X.copy()
    X[3, 1] = np.nan
    with pytest.raises(ConfigError, match="feature 'f1': 1 non-finite"):
        RELEASE_MECHANISMS["ksame"](table.with_values(X), {"k": 2})


def test_seed_policy_and_reproducibility() -> None:
    table = make_table(LENGTHS)
    secure = RELEASE_MECHANISMS["ksame"](table, {"k": 2})
    assert secure.manifest["seed_policy"].startswith("OS CSPRNG")
    a = RELEASE_MECHANISMS["ksame"](table, {"k": 2}, seed=7)
    b = RELEASE_MECHANISMS["ksame"](table, {"k": 2}, seed=7)
    assert a.manifest["seed_policy"].startswith("INSECURE")
    np.testing.assert_array_equal(a.table.X, b.table.X)


def test_cli_keeps_the_mapping_out_of_the_released_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gazeguard release ksame`: no real id in the released table or manifest; the mapping goes
    to a separate, clearly named local file, with a warning."""
    table = make_table(REAL)
    src = tmp_path / "features.csv"
    table.save(src)
    out = tmp_path / "released.csv"
    assert main(["release", "ksame", str(src), "-o", str(out), "--k", "3"]) == 0
    err = capsys.readouterr().err
    private = tmp_path / "released.group-mapping.PRIVATE.json"
    assert f"WARNING: {private}" in err
    assert "never publish" in err
    released = [out, manifest_path_for(out)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [src.name, private.name, *(p.name for p in released)]
    )
    for path in released:
        text = path.read_text()
        for person in {p for p, _ in REAL}:
            assert person not in text, f"{person} named in {path.name}"
        assert "-reading" not in text
        assert "group-mapping" not in text
    mapping = json.loads(private.read_text())
    assert set(mapping["person"].values()) <= {p for p, _ in REAL}
    assert private.stat().st_mode & 0o077 == 0
