"""k-same-select sequence (David-John et al., ETRA 2022, Sec. 3.3): k-anonymity for a dataset of
feature-vector sequences.

For each task separately:

1. The task's people are put in a random order (OS CSPRNG shuffle by default) and cut into
   ``H = ⌊N/k⌋`` groups of exactly k — one grouping for the whole task sequence, so a person is
   averaged with the same k−1 others at every step.
2. Every person's sequence is padded to the task's longest sequence ``t_max`` by repeating its
   last feature vector (the paper's padding).
3. At each step i the group's average of the i-th vectors is released once per member, so the k
   members of a group release identical sequences of ``t_max`` vectors: nothing in the released
   values tells them apart, and a linking attack succeeds with probability at most 1/k.

Leftover people. When N is not a multiple of k, ``N mod k`` people remain after the groups of k
are formed. The paper forms groups "of size k" whose average "is then released k times", so by
default (``leftover="drop"``) the leftover people of that task are suppressed: none of their rows
is released, and the manifest counts them per task. ``leftover="merge"`` instead adds them, one
each, to randomly chosen groups (groups of k to 2k−1 people, as k-Same does for faces): nobody is
dropped, the guarantee is still ≥ k, but those groups average more than k vectors.

Released rows: for each member, ``t_max`` rows with the group's average values, the task label,
the step times of the task's longest sequence (the same for all members, so the time column does
not single anyone out either) and **no real id**: groups are numbered ``g01, g02, …`` across all
tasks in their random order, the member rows of a group are labelled ``g01-m1 … g01-mk`` as
``person`` (member numbers follow the random shuffle, so they say nothing about who), and the
recording label of a member's own row at that step (its last one on padded steps) becomes
``g01-m1-r1``, ``-r2``, … in order of appearance. Real ids would tell a reader who took part and
who was averaged with whom. The manifest counts groups, sizes and dropped people without naming
anyone; the mapping back to real ids (per task: the members of each group, the dropped people,
and the label maps) is returned in :attr:`Release.private`, which ``gazeguard release`` writes
to a separate local ``*.group-mapping.PRIVATE.json`` file that must not be published.

k-same is not differential privacy: it bounds re-identification by linking, not what the
averages reveal about a group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gazeguard.offline.release._common import (
    FloatArray,
    IndexArray,
    Params,
    Progress,
    Release,
    ReleaseRandom,
    concat_tables,
    no_progress,
    padded,
    require_finite,
    task_sequences,
)
from gazeguard.signal.dataset import FeatureTable

NAME = "ksame"
LEFTOVER_POLICIES = ("drop", "merge")
MAPPING_FORMAT = "gazeguard-ksame-group-mapping/1"
MAPPING_WARNING = (
    "PRIVATE: this file links the released group ids to real people and says who was averaged "
    "with whom. Keep it with the original data; never publish it with the release."
)


def form_groups(
    people: list[str], k: int, leftover: str, rng: ReleaseRandom
) -> tuple[list[list[str]], list[str]]:
    """Randomly partition ``people`` into groups of k.

    Returns:
        ``(groups, dropped)``: with ``leftover="drop"`` all groups have exactly k members and the
        ``len(people) mod k`` people left over are returned as dropped; with ``"merge"`` they are
        added one each to distinct random groups (cycling if there are more leftovers than
        groups) and nobody is dropped.
    """
    order = list(people)
    rng.shuffle(order)
    n_groups = len(order) // k
    groups = [order[g * k : (g + 1) * k] for g in range(n_groups)]
    rest = order[n_groups * k :]
    if leftover == "drop":
        return groups, rest
    # The shuffle already made the group order random: add leftovers to groups 0, 1, 2, ...
    for j, person in enumerate(rest):
        groups[j % n_groups].append(person)
    return groups, []


def _check_task_sizes(sequences: Mapping[str, Mapping[str, IndexArray]], k: int, p: Params) -> None:
    """Raise a :class:`ConfigError` naming ``k`` if a task has fewer than k people."""
    for task, seqs in sequences.items():
        if len(seqs) < k:
            raise p.error(
                "k",
                k,
                f"task {task!r} has only {len(seqs)} people ({', '.join(seqs)}); k-same needs at "
                f"least k people per task. Choose k <= {len(seqs)} or leave that task out",
            )


@dataclass
class _Output:
    """What the release accumulates over all tasks and groups.

    Attributes:
        parts: one table of ``t_max`` rows per released member, in release order.
        person_map: member label (``gNN-mM``) → real person id.
        recording_map: released recording label (``gNN-mM-rR``) → real recording id.
        per_task: the manifest's per-task counts (no real ids).
        private_tasks: per task, the real members of each group and the dropped people.
        number: groups numbered so far (across all tasks).
    """

    parts: list[FeatureTable] = field(default_factory=list)
    person_map: dict[str, str] = field(default_factory=dict)
    recording_map: dict[str, str] = field(default_factory=dict)
    per_task: dict[str, dict[str, Any]] = field(default_factory=dict)
    private_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    number: int = 0


def _release_group(
    out: _Output,
    table: FeatureTable,
    group: list[str],
    gid: str,
    *,
    task: str,
    seqs: Mapping[str, IndexArray],
    t_max: int,
    t_ref: FloatArray,
) -> None:
    """Release one group: its step-wise average once per member, labelled ``gid``.

    ``seqs`` maps each person to their row indices in ``table`` for ``task``; every member's
    sequence is padded to ``t_max`` steps, and ``t_ref`` is the (t_max,) step times (s) the
    members' rows all carry. Appends one (t_max, F) table per member to ``out.parts`` and records
    the member and recording labels in ``out``'s maps.
    """
    rows = np.stack([padded(seqs[person], t_max) for person in group])  # (g, t_max)
    mean: FloatArray = table.X[rows].mean(axis=0)  # (t_max, F)
    for j, (person, member_rows) in enumerate(zip(group, rows, strict=True)):
        member = f"{gid}-m{j + 1}"
        out.person_map[member] = person
        real_recordings = table.recording[member_rows]
        labels = {
            r: f"{member}-r{i + 1}" for i, r in enumerate(dict.fromkeys(real_recordings.tolist()))
        }
        out.recording_map.update({label: real for real, label in labels.items()})
        out.parts.append(
            FeatureTable(
                mean.copy(),
                t_ref.copy(),
                np.full(t_max, member),
                np.full(t_max, task),
                np.array([labels[r] for r in real_recordings.tolist()], dtype=str),
                table.feature_names,
                table.feature_units,
            )
        )


def _release_task(
    out: _Output,
    table: FeatureTable,
    task: str,
    seqs: Mapping[str, IndexArray],
    *,
    groups: list[list[str]],
    dropped: list[str],
    width: int,
) -> None:
    """Release one task's groups and add its manifest and private entries to ``out``.

    ``seqs`` maps each of the task's people to their row indices in ``table``; ``width`` is the
    number of digits of the group numbers.
    """
    kept = [person for g in groups for person in g]
    t_max = max(seqs[person].size for person in kept)
    longest = max(kept, key=lambda person: (seqs[person].size, person))
    t_ref = table.t[padded(seqs[longest], t_max)]
    group_ids = []
    for group in groups:
        out.number += 1
        gid = f"g{out.number:0{width}d}"
        group_ids.append(gid)
        _release_group(out, table, group, gid, task=task, seqs=seqs, t_max=t_max, t_ref=t_ref)
    out.per_task[task] = {
        "people": len(seqs),
        "groups": group_ids,
        "group_sizes": [len(g) for g in groups],
        "dropped_people": len(dropped),
        "t_max": int(t_max),
        "rows_released": int(t_max * len(kept)),
    }
    out.private_tasks[task] = {
        "groups": {gid: list(g) for gid, g in zip(group_ids, groups, strict=True)},
        "dropped_people": sorted(dropped),
    }


def _guarantee(k: int, leftover: str, per_task: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The manifest's k-anonymity guarantee: statement and numbers, from the per-task counts."""
    min_size = min((min(t["group_sizes"]) for t in per_task.values()), default=k)
    dropped_total = sum(t["dropped_people"] for t in per_task.values())
    statement = (
        f"k-anonymity with k={k}: within each task every released feature-vector sequence is the "
        f"step-wise average of a fixed group of {'exactly' if leftover == 'drop' else 'at least'} "
        f"{k} people and is released identically for each of them, so linking a released "
        f"sequence to a person succeeds with probability at most 1/{min_size}. Not differential "
        "privacy."
    )
    if leftover == "drop":
        statement += (
            f" People left over when a task's head count is not a multiple of k are not released "
            f"({dropped_total} person-task sequences dropped)."
        )
    return {
        "kind": "k-anonymity",
        "statement": statement,
        "numbers": {
            "k": k,
            "smallest_group": int(min_size),
            "max_reidentification_probability": 1.0 / min_size,
            "dropped_person_task_sequences": int(dropped_total),
        },
    }


def ksame_release(
    table: FeatureTable,
    params: Mapping[str, object],
    seed: int | None = None,
    progress: Progress = no_progress,
) -> Release:
    """Release ``table`` with k-same-select sequence.

    Args:
        table: N feature vectors with person, task and recording labels.
        params: ``k`` (int ≥ 2, default 2), ``leftover`` (``"drop"`` default, or ``"merge"``).
        seed: ``None`` for the OS CSPRNG; an int only for reproducible experiments (insecure).
        progress: called once per task.

    Returns:
        The release: the table labelled with group ids only, the manifest (counts, no real
        ids) and, in ``private``, the mapping back to real ids (never to be released).

    Raises:
        ConfigError: naming ``k`` when a task has fewer than k people (that task cannot be made
            k-anonymous: lower k or remove the task), or for a bad parameter.
    """
    p = Params(NAME, params)
    k = p.integer("k", 2, minimum=2)
    leftover = p.choice("leftover", "drop", LEFTOVER_POLICIES)
    effective = p.finish()
    require_finite(table, p)
    rng = ReleaseRandom(seed)

    sequences = task_sequences(table)
    _check_task_sizes(sequences, k, p)

    grouped = {task: form_groups(list(seqs), k, leftover, rng) for task, seqs in sequences.items()}
    width = len(str(sum(len(groups) for groups, _ in grouped.values())))
    out = _Output()
    for n_done, (task, (groups, dropped)) in enumerate(grouped.items()):
        _release_task(
            out, table, task, sequences[task], groups=groups, dropped=dropped, width=width
        )
        progress(n_done + 1, len(sequences), f"task {task!r}: {len(groups)} groups")

    return Release(
        concat_tables(out.parts, table),
        {
            "mechanism": NAME,
            "parameters": effective,
            "guarantee": _guarantee(k, leftover, out.per_task),
            "seed_policy": rng.policy,
            "details": {
                "tasks": out.per_task,
                "ids": "group ids (gNN-mM); the real ids are not released",
            },
        },
        private={
            "format": MAPPING_FORMAT,
            "warning": MAPPING_WARNING,
            "person": out.person_map,
            "recording": out.recording_map,
            "tasks": out.private_tasks,
        },
    )
