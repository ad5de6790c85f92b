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
from typing import Any

import numpy as np

from gazeguard.dataset import FeatureTable
from gazeguard.release._common import (
    FloatArray,
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
    for task, seqs in sequences.items():
        if len(seqs) < k:
            raise p.error(
                "k",
                k,
                f"task {task!r} has only {len(seqs)} people ({', '.join(seqs)}); k-same needs at "
                f"least k people per task. Choose k <= {len(seqs)} or leave that task out",
            )

    grouped = {task: form_groups(list(seqs), k, leftover, rng) for task, seqs in sequences.items()}
    width = len(str(sum(len(groups) for groups, _ in grouped.values())))
    parts: list[FeatureTable] = []
    per_task: dict[str, dict[str, Any]] = {}
    private_tasks: dict[str, dict[str, Any]] = {}
    person_map: dict[str, str] = {}
    recording_map: dict[str, str] = {}
    number = 0
    for n_done, (task, (groups, dropped)) in enumerate(grouped.items()):
        seqs = sequences[task]
        kept = [person for g in groups for person in g]
        t_max = max(seqs[person].size for person in kept)
        longest = max(kept, key=lambda person: (seqs[person].size, person))
        t_ref = table.t[padded(seqs[longest], t_max)]
        group_ids = []
        for group in groups:
            number += 1
            gid = f"g{number:0{width}d}"
            group_ids.append(gid)
            rows = np.stack([padded(seqs[person], t_max) for person in group])  # (g, t_max)
            mean: FloatArray = table.X[rows].mean(axis=0)  # (t_max, F)
            for j, (person, member_rows) in enumerate(zip(group, rows, strict=True)):
                member = f"{gid}-m{j + 1}"
                person_map[member] = person
                real_recordings = table.recording[member_rows]
                labels = {
                    r: f"{member}-r{i + 1}"
                    for i, r in enumerate(dict.fromkeys(real_recordings.tolist()))
                }
                recording_map.update({label: real for real, label in labels.items()})
                parts.append(
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
        per_task[task] = {
            "people": len(seqs),
            "groups": group_ids,
            "group_sizes": [len(g) for g in groups],
            "dropped_people": len(dropped),
            "t_max": int(t_max),
            "rows_released": int(t_max * len(kept)),
        }
        private_tasks[task] = {
            "groups": {gid: list(g) for gid, g in zip(group_ids, groups, strict=True)},
            "dropped_people": sorted(dropped),
        }
        progress(n_done + 1, len(sequences), f"task {task!r}: {len(groups)} groups")

    out = concat_tables(parts, table)
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
    return Release(
        out,
        {
            "mechanism": NAME,
            "parameters": effective,
            "guarantee": {
                "kind": "k-anonymity",
                "statement": statement,
                "numbers": {
                    "k": k,
                    "smallest_group": int(min_size),
                    "max_reidentification_probability": 1.0 / min_size,
                    "dropped_person_task_sequences": int(dropped_total),
                },
            },
            "seed_policy": rng.policy,
            "details": {
                "tasks": per_task,
                "ids": "group ids (gNN-mM); the real ids are not released",
            },
        },
        private={
            "format": MAPPING_FORMAT,
            "warning": MAPPING_WARNING,
            "person": person_map,
            "recording": recording_map,
            "tasks": private_tasks,
        },
    )
