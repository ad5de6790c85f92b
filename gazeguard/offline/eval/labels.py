"""Private labels, measured: clean and released accuracy, and re-identification from label
sequences (issue 14, point 2) — the label side of ``gazeguard eval --frontier`` and of
``bench/eval_labels.py``.

1. **Clean accuracy** of the label model (standardiser + multinomial logistic regression on the
   profile's features): leave one person out, per window and per decision — a decision averages
   the class probabilities of the ``decision_s / step_s`` consecutive windows of a block
   (non-overlapping blocks, incomplete tail dropped) and takes the argmax.
2. **Released accuracy** after randomized response at the ε per decision that a user-level
   budget per hour allows (``D = ⌈3600/decision_s⌉ + 1`` releases composed by the PLD
   accountant), mean over repetitions, next to the prediction ``p·acc + (1 − p)(1 − acc)/(C − 1)``.
3. **Re-identification from label sequences**: the attacker sees the released labels of every
   recording. Each recording's decisions are cut in half; a half becomes one sample — its label
   histogram (C) and its label-transition frequencies (C²). The attacker trains on first halves
   (label: person) and identifies the second halves (1-NN, RBF SVM and a 100-tree random forest,
   features standardised; the best is reported). Chance is 1/people.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.ensemble import RandomForestClassifier
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from gazeguard.config import FeatureSettings
from gazeguard.offline.eval.runner import select_features
from gazeguard.plan import releases_per_hour
from gazeguard.plan.labels import decision_epsilon
from gazeguard.privacy.accounting import RandomizedResponseEvent, compose
from gazeguard.privacy.mechanisms.randomness import OsRandom, RandomSource, random_source
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.labels import (
    RandomizedResponse,
    lopo_probabilities,
    released_accuracy,
    survival_probability,
)


def _quiet(_msg: str) -> None:
    """No progress output."""


#: User-level budgets per hour of gaze (ε at DELTA), all of it spent on labels.
BUDGETS = (1.0, 10.0, 100.0)
DELTA = 1e-6
DECISIONS_S = {"gazegraph": (10.0, 30.0, 60.0, 120.0), "synthetic": (10.0, 30.0, 60.0, 300.0)}


def epsilon_per_decision(
    budget: float, decision_s: float, classes: int, features: FeatureSettings | None = None
) -> tuple[float, int]:
    """The largest ε per decision whose ``D`` randomized-response releases — the decisions one
    hour of gaze can change, as the release plan counts them (:func:`gazeguard.plan.
    releases_per_hour`) — compose to at most ``budget`` at ``DELTA`` (the PLD accountant, as
    the sidecar's :func:`gazeguard.plan.labels.decision_epsilon`); and ``D``."""
    f = features or FeatureSettings()
    per_hour = releases_per_hour(f, decision_s, decision_s - f.step_s)
    return decision_epsilon(budget, per_hour, classes, DELTA), per_hour


IntArray = npt.NDArray[np.intp]


# ----------------------------------------------------------------------------- decisions
def decisions(
    table: FeatureTable, probs: npt.NDArray[np.float64], steps: int
) -> dict[str, tuple[IntArray, str, str]]:
    """Per recording: clean decision indices (argmax of the mean probability over each block of
    ``steps`` consecutive windows), its person and task."""
    out: dict[str, tuple[IntArray, str, str]] = {}
    for rec, rows in table.recordings():
        n = rows.size // steps
        if n == 0:
            continue
        blocks = probs[rows[: n * steps]].reshape(n, steps, -1).mean(axis=1)
        out[rec] = (
            np.argmax(blocks, axis=1).astype(np.intp),
            str(table.person[rows[0]]),
            str(table.task[rows[0]]),
        )
    return out


# ----------------------------------------------------------------------------- the attack
def sequence_features(labels: IntArray, classes: int) -> npt.NDArray[np.float64]:
    """Label histogram (C) and transition frequencies (C²) of one half-sequence."""
    hist = np.bincount(labels, minlength=classes) / max(labels.size, 1)
    trans = np.zeros((classes, classes))
    if labels.size > 1:
        np.add.at(trans, (labels[:-1], labels[1:]), 1.0)
        trans /= labels.size - 1
    return np.concatenate([hist, trans.ravel()])


ATTACKERS = ("1nn", "svm", "rf")


def attack(
    seqs: dict[str, tuple[IntArray, str, str]], classes: int, seed: int
) -> dict[str, float] | None:
    """Re-identification accuracy per attacker: train on first halves, test on second halves."""
    Xtr, ytr, Xte, yte = [], [], [], []
    for labels, person, _ in seqs.values():
        if labels.size < 2:
            return None
        cut = labels.size // 2
        Xtr.append(sequence_features(labels[:cut], classes))
        Xte.append(sequence_features(labels[cut:], classes))
        ytr.append(person)
        yte.append(person)
    Xa, Xb = np.array(Xtr), np.array(Xte)
    out: dict[str, float] = {}
    for name in ATTACKERS:
        if name == "1nn":
            clf: Any = make_pipeline(StandardScaler(), KNeighborsClassifier(n_neighbors=1))
        elif name == "svm":
            clf = make_pipeline(StandardScaler(), SVC(C=1.0, gamma="scale"))
        else:
            clf = RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=1)
        clf.fit(Xa, ytr)
        out[name] = float(np.mean(clf.predict(Xb) == np.array(yte)))
    return out


def privatize(
    seqs: dict[str, tuple[IntArray, str, str]], rr: RandomizedResponse, source: RandomSource
) -> dict[str, tuple[IntArray, str, str]]:
    """The same sequences after randomized response on every decision."""
    return {
        rec: (np.array([rr.release(int(v), source) for v in labels], np.intp), p, t)
        for rec, (labels, p, t) in seqs.items()
    }


def _mean_best(runs: list[dict[str, float]]) -> dict[str, Any]:
    means = {a: float(np.mean([r[a] for r in runs])) for a in ATTACKERS}
    best = max(means, key=lambda a: means[a])
    return {
        "best": best,
        "accuracy": round(means[best], 4),
        "sd": round(float(np.std([r[best] for r in runs])), 4),
        "per_attacker": {a: round(v, 4) for a, v in means.items()},
        "reps": len(runs),
    }


# ----------------------------------------------------------------------------- one dataset
Sequences = dict[str, tuple[IntArray, str, str]]


@dataclass(frozen=True, slots=True)
class _Repetitions:
    """How each cadence's released labels are drawn and attacked.

    Attributes:
        reps: randomized-response repetitions scored for accuracy.
        attack_reps: how many of them are attacked (re-identification).
        source: the noise source (the OS CSPRNG, or an INSECURE reproducible one).
        att_seed: attacker seed of the clean labels; repetition r uses ``att_seed + r``.
        budgets: user-level budgets per hour (ε at :data:`DELTA`).
    """

    reps: int
    attack_reps: int
    source: RandomSource
    att_seed: int
    budgets: tuple[float, ...]


def _usable_features(table: FeatureTable, features: list[str]) -> list[str]:
    """The requested ``features`` the table has and that vary (by :func:`select_features`)."""
    usable = [f for f in features if f in table.feature_names]
    cols, _ = select_features(table)
    varying = {table.feature_names[int(c)] for c in cols}
    return [f for f in usable if f in varying]


def _released_row(
    seqs: Sequences,
    classes: list[str],
    budget: float,
    *,
    decision_s: float,
    clean_acc: float,
    rep: _Repetitions,
) -> dict[str, Any]:
    """Randomized response at one user-level ``budget`` per hour, for decisions every
    ``decision_s`` s: accuracy (fraction of decisions right) against ``clean_acc`` and the
    re-identification attack on the released label sequences, JSON-ready."""
    C = len(classes)
    eps, per_hour = epsilon_per_decision(budget, decision_s, C)
    rr = RandomizedResponse(C, eps)
    accs, runs = [], []
    for r in range(max(rep.reps, rep.attack_reps)):
        priv = privatize(seqs, rr, rep.source)
        if r < rep.reps:
            hits = np.concatenate(
                [labels == classes.index(task) for labels, _, task in priv.values()]
            )
            accs.append(float(np.mean(hits)))
        if r < rep.attack_reps:
            a = attack(priv, C, rep.att_seed + r)
            if a is not None:
                runs.append(a)
    p = survival_probability(eps, C)
    acc = float(np.mean(accs))
    return {
        "budget_per_hour": budget,
        "decisions_in_an_hour": per_hour,
        "epsilon_per_decision": round(eps, 5),
        "hour_epsilon_at_delta": round(
            compose({RandomizedResponseEvent(eps, C): per_hour}, DELTA).epsilon, 4
        ),
        "survival": round(p, 4),
        "accuracy": round(acc, 4),
        "accuracy_sd": round(float(np.std(accs)), 4),
        "predicted": round(released_accuracy(clean_acc, p, C), 4),
        "kept_fraction_of_clean": round(acc / clean_acc, 4) if clean_acc else None,
        "reid": _mean_best(runs) if runs else None,
    }


def _cadence_message(
    name: str, decision_s: float, clean_acc: float, row: dict[str, Any], t0: float
) -> str:
    """The progress line of one cadence (``decision_s`` s); ``t0``: start (perf_counter, s)."""
    return (
        f"{name}: {decision_s:g} s decisions: clean {clean_acc:.3f}, re-id on clean labels "
        f"{(row['reid_clean_labels'] or {}).get('accuracy')}; "
        + ", ".join(
            f"B{d['budget_per_hour']:g}: ε {d['epsilon_per_decision']:.3g} → "
            f"{d['accuracy']:.3f} (re-id {(d['reid'] or {}).get('accuracy')})"
            for d in row["released"]
        )
        + f" [{time.perf_counter() - t0:.0f} s]"
    )


def _cadence_row(
    name: str,
    table: FeatureTable,
    probs: npt.NDArray[np.float64],
    classes: list[str],
    *,
    decision_s: float,
    step_s: float,
    rep: _Repetitions,
    t0: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Clean and released decisions every ``decision_s`` s (``probs``: (N, C) per-window class
    probabilities, ``step_s``: s between feature vectors), JSON-ready; reports progress."""
    steps = round(decision_s / step_s)
    seqs = decisions(table, probs, steps)
    row: dict[str, Any] = {
        "decision_s": decision_s,
        "windows_per_decision": steps,
        "decisions_per_hour": round(3600.0 / decision_s, 2),
    }
    if not seqs or min(v[0].size for v in seqs.values()) < 2:
        row["unavailable"] = (
            f"recordings hold fewer than two decisions of {steps} feature vectors "
            f"({decision_s:g} s)"
        )
        progress(f"{name}: {decision_s:g} s decisions: unavailable")
        return row
    n_dec = sum(v[0].size for v in seqs.values())
    correct = np.concatenate([labels == classes.index(task) for labels, _, task in seqs.values()])
    clean_acc = float(np.mean(correct))
    clean_att = attack(seqs, len(classes), rep.att_seed)
    row.update(
        decisions=n_dec,
        decisions_per_recording=round(n_dec / len(seqs), 2),
        clean_decision_accuracy=round(clean_acc, 4),
        reid_clean_labels=None if clean_att is None else _mean_best([clean_att]),
        released=[],
    )
    for budget in rep.budgets:
        row["released"].append(
            _released_row(
                seqs, classes, budget, decision_s=decision_s, clean_acc=clean_acc, rep=rep
            )
        )
    progress(_cadence_message(name, decision_s, clean_acc, row, t0))
    return row


def evaluate(
    name: str,
    table: FeatureTable,
    features: list[str],
    cadences: tuple[float, ...],
    *,
    reps: int,
    attack_reps: int,
    seed: int | None,
    every: int,
    budgets: tuple[float, ...] = BUDGETS,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """Private labels of one dataset, measured (see the module docstring): clean accuracy
    (leave one person out), released accuracy and re-identification from label sequences at
    each decision cadence (s) and user-level budget per hour (ε at :data:`DELTA`); ``reps``
    randomized-response repetitions, ``attack_reps`` of them attacked; ``seed`` selects an
    INSECURE reproducible source (None: the OS CSPRNG); ``every``: train on every n-th window.
    Returns the JSON-ready result."""
    classes = sorted(set(table.task.tolist()))
    C = len(classes)
    people = sorted(set(table.person.tolist()))
    step_s = float(np.median(np.diff(table.t[: min(50, table.n_rows)])))
    source: RandomSource = OsRandom() if seed is None else random_source(seed)
    t0 = time.perf_counter()
    usable = _usable_features(table, features)
    probs = lopo_probabilities(table, usable, every=every)
    truth = np.array([classes.index(t) for t in table.task])
    window_acc = float(np.mean(np.argmax(probs, axis=1) == truth))
    progress(
        f"{name}: LOPO per-window accuracy {window_acc:.3f} with {len(usable)} features "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    res: dict[str, Any] = {
        "dataset": name,
        "people": len(people),
        "classes": classes,
        "features": usable,
        "step_s": step_s,
        "delta": DELTA,
        "chance": {"task": 1 / C, "reid": 1 / len(people)},
        "clean_window_accuracy": round(window_acc, 4),
        "cadences": [],
    }
    rep = _Repetitions(reps, attack_reps, source, 0 if seed is None else seed, budgets)
    for decision_s in cadences:
        res["cadences"].append(
            _cadence_row(
                name,
                table,
                probs,
                classes,
                decision_s=decision_s,
                step_s=step_s,
                rep=rep,
                t0=t0,
                progress=progress,
            )
        )
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return res
