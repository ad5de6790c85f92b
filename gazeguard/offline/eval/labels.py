"""Private labels, measured: clean and released accuracy, and re-identification from label
sequences: the label side of ``gazeguard eval --frontier`` and of ``bench/eval_labels.py``.

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
4. **Held labels on a clock** (:func:`evaluate_sessions`): a held-out person's gaze chained
   into hour-long sessions whose activity changes every 5–10 min, labels released by the
   sidecar's own :class:`~gazeguard.runtime.labels.LabelStream` (randomized response at the
   plan's ε, charged to a real ledger), the consumer holding the last label; per-window
   accuracy against the same release without noise, for each block length.
5. **The retired change trigger's power** (:func:`trigger_power`): how often its detection
   round fired with and without a change.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.ensemble import RandomForestClassifier
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from gazeguard.config import FeatureSettings, LabelSettings
from gazeguard.ledger import Ledger
from gazeguard.offline.eval.datasets import Dataset, Synthetic
from gazeguard.offline.eval.runner import select_features
from gazeguard.plan import labels_alone, releases_per_hour
from gazeguard.plan.labels import LabelPlan, decision_epsilon
from gazeguard.privacy.accounting import RandomizedResponseEvent, compose
from gazeguard.privacy.mechanisms.randomness import OsRandom, RandomSource, random_source
from gazeguard.runtime.labels import LabelStats, LabelStream
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES as FEATURE_NAMES
from gazeguard.signal.features import extract_features
from gazeguard.signal.labels import (
    LabelModel,
    RandomizedResponse,
    lopo_probabilities,
    released_accuracy,
    survival_probability,
    train_model,
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


# ============================================================================ held labels
# Held labels on a clock, over hour-long sessions in which the activity changes: see
# :func:`evaluate_sessions`.

#: One session, s of gaze.
SESSION_S = 3600.0
#: Each activity lasts between these many seconds (uniform) before the next one starts.
SEGMENT_S = (300.0, 600.0)

#: Dataset task → the portable model's common activity (``activity-portable``: browse, read,
#: watch, write). GazeGraph as the model was trained (search is browsing, play is left out);
#: the simulator's free viewing and visual search explore a static scene (browse, like
#: Andersson's free viewing of photographs in the model's training data).
COMMON_ACTIVITY: dict[str, dict[str, str]] = {
    "gazegraph": {
        "browse": "browse", "search": "browse", "read": "read", "watch": "watch",
        "write": "write",
    },
    "synthetic": {"free": "browse", "search": "browse", "reading": "read", "watching": "watch"},
}  # fmt: skip

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Mode:
    """One way of releasing labels: the sidecar's clock at a block length.

    Attributes:
        name: ``clock`` (the shipped default) or ``clock-<decision_s>``.
        decision_s: gaze per label, s.
        release: ``clock``, the only way (a change trigger was retired).
    """

    name: str
    decision_s: float = LabelSettings().decision_s
    release: str = "clock"

    def settings(self, model: str = "activity-portable") -> LabelSettings:
        """The sidecar's ``labels`` settings for this mode."""
        return LabelSettings(enabled=True, model=model, decision_s=self.decision_s)


#: The shipped clock, and a clock of 30 s blocks (many weak labels).
MODES = (Mode("clock"), Mode("clock-30", decision_s=30.0))
#: The block lengths compared to choose the shipped one (the retired change
#: trigger was compared with them too: ``bench/results/labels/selection``).
CANDIDATES = tuple(Mode(f"clock-{d:g}", decision_s=d) for d in (30.0, 60.0, 120.0, 180.0))


def trigger_power(
    epsilon: float,
    *,
    checks: int = 10,
    threshold: float = 0.1,
    trials: int = 20_000,
    seed: int | None = 1,
) -> dict[str, float]:
    """How well the retired change trigger's detection round (the sparse vector technique,
    :class:`~gazeguard.privacy.mechanisms.svt.AboveThreshold` at ``epsilon`` per round, query
    range 2 as the label stream asks it) tells a change from none: the probability that a round
    fires within ``checks`` checks when every query says "certainly changed" (``+1``: another
    class has all the probability, the held label none) and when every query says "certainly
    not" (``−1``). Every query the stream can ask lies in ``[−1, 1]`` and a round fires more
    often the larger its queries, so no activity, model or query of that range separates the
    two better than these extremes: this is the trigger's best case.

    Args:
        epsilon: ε of one detection round.
        checks: checks per round (blocks asked before the round is cut off).
        threshold: the margin that counts as a change.
        trials: rounds per case.
        seed: an INSECURE reproducible source (None: the OS CSPRNG).

    Returns:
        ``{"epsilon", "checks", "fire_if_change", "fire_if_none", "first_check_if_change",
        "first_check_if_none", "se"}`` (``se``: the largest Monte Carlo standard error).
    """
    from gazeguard.privacy.mechanisms.svt import AboveThreshold  # noqa: PLC0415

    source: RandomSource = OsRandom() if seed is None else random_source(seed)
    out: dict[str, float] = {"epsilon": epsilon, "checks": checks}
    for name, q in (("change", 1.0), ("none", -1.0)):
        first = within = 0
        for _ in range(trials):
            svt = AboveThreshold(epsilon, 2.0, threshold, source)
            svt.start()
            for k in range(checks):
                if svt.query(q):
                    first += k == 0
                    within += 1
                    break
        out[f"fire_if_{name}"] = within / trials
        out[f"first_check_if_{name}"] = first / trials
    out["se"] = 0.5 / math.sqrt(trials)
    return out


@dataclass(frozen=True)
class HeldOutSession:
    """One hour of a held-out person's gaze, activities chained, as feature vectors.

    Attributes:
        person: who (the model never saw them).
        index: which session of that person.
        X: (T, F) clean feature vectors, columns ``model.features``.
        t: (T,) window end times, s from the session's first sample.
        truth: (T,) index in ``model.classes`` of the activity at each window's end.
        segments: ``(activity, start_s, end_s)`` in order.
        model: a label model that was not trained on this person.
    """

    person: str
    index: int
    X: FloatArray
    t: FloatArray
    truth: IntArray
    segments: tuple[tuple[str, float, float], ...]
    model: LabelModel


def plan_segments(
    activities: list[str],
    rng: np.random.Generator,
    session_s: float = SESSION_S,
    segment_s: tuple[float, float] = SEGMENT_S,
) -> list[tuple[str, float]]:
    """``(activity, duration_s)`` filling ``session_s``: activities drawn uniformly, never the
    same twice in a row, each lasting uniform in ``segment_s`` (the last one cut at the end).
    Public randomness: it never reads anyone's gaze."""
    out: list[tuple[str, float]] = []
    total = 0.0
    while total < session_s:
        choices = [a for a in activities if not out or a != out[-1][0]] or activities
        act = choices[int(rng.integers(len(choices)))]
        d = min(float(rng.uniform(*segment_s)), session_s - total)
        out.append((act, d))
        total += d
    return out


class GazeSource:
    """Raw gaze of one person doing one task for a while (degrees; NaN: invalid).

    Recorded datasets: the person's recording of the task, looped from a random offset (a
    GazeGraph recording is 5 minutes: a longer segment repeats it). The synthetic dataset:
    the simulator's person in that task, a fresh realisation per segment.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.synthetic = dataset if isinstance(dataset, Synthetic) else None
        self.recorded: dict[tuple[str, str], list[tuple[FloatArray, FloatArray]]] = {}
        rates: set[float] = set()
        if self.synthetic is not None:
            self.rate_hz = float(self.synthetic.rate_hz)
            return
        for rec in dataset.recordings():
            s = rec.samples
            x = np.where(s.valid, s.x_deg, np.nan)
            y = np.where(s.valid, s.y_deg, np.nan)
            self.recorded.setdefault((rec.person, rec.task), []).append((x, y))
            rates.add(float(rec.rate_hz))
        if len(rates) != 1:
            msg = f"{dataset.name}: sessions need one sampling rate, got {sorted(rates)}"
            raise ValueError(msg)
        self.rate_hz = rates.pop()

    def tasks(self, person: str) -> set[str]:
        """The tasks recorded for ``person``."""
        if self.synthetic is not None:
            return set(self.synthetic.tasks)
        return {task for who, task in self.recorded if who == person}

    def gaze(
        self, person: str, task: str, duration_s: float, segment: int, rng: np.random.Generator
    ) -> tuple[FloatArray, FloatArray]:
        """``(x, y)`` (n,) each, deg, ``n = round(duration_s · rate)``; ``segment`` numbers the
        person's segments (the simulator's session: 0 is the dataset's own recording)."""
        n = round(duration_s * self.rate_hz)
        if self.synthetic is not None:
            from gazeguard.runtime.simulate import simulate_gaze  # noqa: PLC0415 - heavy import

            p = int(person.removeprefix("sim")) - 1
            s = simulate_gaze(
                n / self.rate_hz, self.rate_hz, self.synthetic.seed + p, task=task,
                session=segment + 1,
            )  # fmt: skip
            x = np.where(s.valid, s.x_deg, np.nan)[:n]
            y = np.where(s.valid, s.y_deg, np.nan)[:n]
            return np.pad(x, (0, n - x.size), constant_values=np.nan), np.pad(
                y, (0, n - y.size), constant_values=np.nan
            )
        pieces = self.recorded[(person, task)]
        x, y = pieces[int(rng.integers(len(pieces)))]
        at = (int(rng.integers(x.size)) + np.arange(n)) % x.size
        return x[at], y[at]


def build_session(
    source: GazeSource,
    person: str,
    index: int,
    *,
    model: LabelModel,
    activity: Mapping[str, str],
    rng: np.random.Generator,
    window_s: float = 30.0,
    step_s: float = 0.5,
) -> HeldOutSession:
    """One hour of ``person``: :func:`plan_segments` over the model's classes the person has
    tasks for (``activity``: task → class; tasks without a class are left out), their gaze
    chained at the dataset's rate and its features extracted by the sidecar's
    ``extract_features`` (windows straddling a change mix both activities, as in a real
    session); each window's truth is the activity at its end."""
    by_class: dict[str, list[str]] = {}
    for task in sorted(source.tasks(person)):
        cls = activity.get(task)
        if cls is not None and cls in model.classes:
            by_class.setdefault(cls, []).append(task)
    if len(by_class) < 2:
        msg = f"{person}: fewer than two of the model's activities recorded"
        raise ValueError(msg)
    xs, ys, segments = [], [], []
    start = 0.0
    for k, (cls, duration) in enumerate(plan_segments(sorted(by_class), rng)):
        tasks = by_class[cls]
        x, y = source.gaze(person, tasks[int(rng.integers(len(tasks)))], duration, k, rng)
        xs.append(x)
        ys.append(y)
        end = start + x.size / source.rate_hz
        segments.append((cls, start, end))
        start = end
    x, y = np.concatenate(xs), np.concatenate(ys)
    t = np.arange(x.size, dtype=np.float64) / source.rate_hz
    X, tw = extract_features(t, x, y, None, window_s, step_s, rate_hz=source.rate_hz)
    cols = [FEATURE_NAMES.index(f) for f in model.features]
    ends = np.array([s[2] for s in segments])
    seg = np.minimum(np.searchsorted(ends, tw, side="left"), len(segments) - 1)
    truth = np.array([model.classes.index(segments[i][0]) for i in seg], dtype=np.intp)
    return HeldOutSession(
        person, index, np.ascontiguousarray(X[:, cols]), tw, truth, tuple(segments), model
    )


def lopo_models(
    table: FeatureTable,
    features: Sequence[str],
    *,
    activity: Mapping[str, str] | None = None,
    log_features: Sequence[str] = (),
    log_offset: float = 0.01,
    regularization: float = 1.0,
    balance: bool = False,
    hidden_layers: Sequence[int] = (),
    every: int = 2,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, LabelModel]:
    """Per person, a label model trained on everyone else (:func:`gazeguard.signal.labels.
    train_model`, every ``every``-th window): ``activity`` maps tasks to classes (rows of
    unmapped tasks are left out; None: the tasks are the classes); ``balance`` weighs every
    class the same in total; ``hidden_layers``: an MLP's hidden widths (empty: logistic
    regression)."""
    task = table.task.astype(str)
    y = task if activity is None else np.array([activity.get(v, "") for v in task])
    keep = y != ""
    out: dict[str, LabelModel] = {}
    for who in sorted(set(table.person.tolist())):
        rows = np.flatnonzero(keep & (table.person != who))
        sub = table.take(rows)
        weight = None
        if balance:
            _, inv, counts = np.unique(y[rows], return_inverse=True, return_counts=True)
            weight = (rows.size / counts.size) / counts[inv]
        out[who] = train_model(
            sub, features, name=f"lopo-{who}", regularization=regularization, every=every,
            labels=y[rows], log_features=log_features, log_offset=log_offset,
            sample_weight=weight, hidden_layers=hidden_layers, provenance={"left_out": who},
        )  # fmt: skip
        progress(f"leave-one-person-out model without {who}")
    return out


def recipe_of(model: LabelModel) -> dict[str, Any]:
    """The training recipe of a shipped model, for :func:`lopo_models`: its features, which
    are read through the log, the log offset, ``C``, class balancing and the hidden layers'
    widths (an MLP; none for logistic regression)."""
    std = model.spec.standardizer
    logs = [f for f, tr in zip(model.features, std.transform or (), strict=False) if tr == "log"]
    c = model.spec.trained.get("regularization_C", 1.0)
    return {
        "features": list(model.features),
        "log_features": logs,
        "log_offset": float(std.log_offset),
        "regularization": float(c) if isinstance(c, int | float) else 1.0,
        "balance": "sample_weight" in model.spec.trained,
        "hidden_layers": [len(h.intercept) for h in model.spec.classifier.hidden],
    }


def held_accuracy(
    t: FloatArray, truth: IntArray, release_t: FloatArray, release_label: IntArray
) -> float:
    """The fraction of windows (times ``t``, true class ``truth``) at which the label the
    consumer holds — the latest released at or before the window (released at its block's
    last window time ``release_t``, in order) — is the true one; no label yet counts wrong."""
    labels = np.asarray(release_label, dtype=np.intp)
    if labels.size == 0:
        return 0.0
    idx = np.searchsorted(release_t, t, side="right") - 1
    held = np.where(idx >= 0, labels[np.maximum(idx, 0)], -1)
    return float(np.mean(held == truth))


def block_probabilities(session: HeldOutSession, steps: int) -> tuple[FloatArray, FloatArray]:
    """``(P, ends)``: (B, C) the model's mean class probabilities over each block of ``steps``
    consecutive windows (as :class:`gazeguard.runtime.labels.LabelStream` cuts them, the
    incomplete tail dropped) and (B,) each block's last window time, s."""
    n = session.t.size // steps
    p = session.model.predict_proba(session.X[: n * steps])
    return p.reshape(n, steps, -1).mean(axis=1), session.t[steps - 1 : n * steps : steps]


def clean_releases(
    session: HeldOutSession, mode: Mode, step_s: float = 0.5
) -> tuple[FloatArray, IntArray]:
    """The labels ``mode`` releases without noise (randomized response at ε = ∞, same blocks):
    release times and class indices."""
    P, ends = block_probabilities(session, round(mode.decision_s / step_s))
    return ends, np.argmax(P, axis=1).astype(np.intp)


def private_releases(
    session: HeldOutSession, plan: LabelPlan, ledger: Ledger, account: str, seed: int | None
) -> tuple[FloatArray, IntArray, LabelStats]:
    """The labels the sidecar's :class:`~gazeguard.runtime.labels.LabelStream` releases on this
    session with ``plan`` (randomized response, each label charged to ``ledger`` under
    ``account``; ``seed``: INSECURE reproducible
    noise, None: the OS CSPRNG): release times, class indices and the stream's counters."""
    ledger.open_session(account)
    stream = LabelStream(
        ledger, plan, session=account, device="eval", input_features=plan.model.features,
        insecure_seed=seed,
    )  # fmt: skip
    times, labels = [], []
    for block, bt in stream.add(session.X, session.t):
        out = stream.release(block, bt, offset=0.0)
        if out is not None:
            times.append(out.message.window_end)
            labels.append(plan.model.classes.index(out.message.label))
    return np.array(times), np.array(labels, dtype=np.intp), stream.stats


def _session_se(accs: list[float], sessions: int) -> float | None:
    """Standard error of the mean accuracy with each session as one sample (its mean over the
    repetitions, ``accs`` in repetition-major order): repetitions of one session share its
    activities and its clean errors, so they are not independent; ``None`` for one session)."""
    if sessions < 2:
        return None
    per = np.asarray(accs).reshape(-1, sessions).mean(axis=0)
    return round(float(np.std(per, ddof=1) / math.sqrt(sessions)), 4)


def _mode_row(
    sessions: list[HeldOutSession],
    mode: Mode,
    budgets: tuple[float, ...],
    *,
    reps: int,
    attack_reps: int,
    seed: int | None,
    ledger_dir: Path,
    features: FeatureSettings,
) -> dict[str, Any]:
    """One mode over every session: clean, then at each budget (JSON-ready)."""
    C = len(sessions[0].model.classes)
    cleans = [clean_releases(s, mode, features.step_s) for s in sessions]
    clean = [held_accuracy(s.t, s.truth, *c) for s, c in zip(sessions, cleans, strict=True)]
    clean_labels = [c[1].size for c in cleans]
    row: dict[str, Any] = {
        "mode": mode.name,
        "settings": asdict(mode),
        "clean": round(float(np.mean(clean)), 4),
        "clean_labels_per_session": round(float(np.mean(clean_labels)), 2),
        "released": [],
    }
    for b, budget in enumerate(budgets):
        cell: dict[str, Any] = {"budget_per_hour": budget}
        accs: list[float] = []
        n_labels: list[int] = []
        withheld = 0
        runs: list[dict[str, float]] = []
        plans: dict[int, LabelPlan] = {}
        window = 0.0
        for s in sessions:
            if id(s.model) not in plans:
                plans[id(s.model)], window = labels_alone(
                    mode.settings(), features, share=budget, delta=DELTA, model=s.model
                )
        # the ledger caps every window of gaze at the budget: a label the plan did not count
        # would be withheld (and counted)
        path = ledger_dir / f"{mode.name}-{budget:g}.sqlite"
        with Ledger(path, "NORMAL", window_cap=budget, window_s=window, delta=DELTA) as ledger:
            for r in range(max(reps, attack_reps)):
                seqs: Sequences = {}
                for i, s in enumerate(sessions):
                    plan = plans[id(s.model)]
                    run_seed = None if seed is None else seed + 7919 * (b * 1000 + r) + i
                    rt, rl, stats = private_releases(s, plan, ledger, f"{i}-{r}", run_seed)
                    withheld += stats.withheld
                    if r < reps:
                        accs.append(held_accuracy(s.t, s.truth, rt, rl))
                        n_labels.append(rl.size)
                    seqs[f"{s.person}#{s.index}"] = (rl, s.person, "")
                if r < attack_reps:
                    a = attack(seqs, C, r if seed is None else seed + r)
                    if a is not None:
                        runs.append(a)
        plan = next(iter(plans.values()))
        acc = float(np.mean(accs))
        chance = 1.0 / C
        room = row["clean"] - chance
        cell |= {
            "epsilon_per_label": round(plan.epsilon, 5),
            "labels_in_an_hour": plan.per_window,
            "hour_epsilon_at_delta": round(plan.hour_epsilon, 4),
            "survival": round(plan.survival, 4),
            "accuracy": round(acc, 4),
            "accuracy_se": _session_se(accs, len(sessions)),
            "kept_above_chance": round((acc - chance) / room, 4) if room > 0 else None,
            "labels_per_session": round(float(np.mean(n_labels)), 2),
            "withheld": withheld,
            "reid": _mean_best(runs) if runs else None,
        }
        row["released"].append(cell)
    return row


def evaluate_sessions(
    name: str,
    dataset: Dataset,
    models: Mapping[str, LabelModel] | LabelModel,
    *,
    activity: Mapping[str, str] | None = None,
    sessions: int = 2,
    reps: int = 10,
    attack_reps: int = 0,
    modes: Sequence[Mode] = MODES,
    budgets: tuple[float, ...] = BUDGETS,
    seed: int | None = None,
    session_seed: int = 1,
    people: Sequence[str] | None = None,
    features: FeatureSettings | None = None,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """Labels on a clock, held by the consumer, over hour-long sessions.

    Per person (``people``, default: every person with a model), ``sessions`` hours of their
    gaze with the activity changing every 5–10 min (:func:`build_session`; ``session_seed``
    fixes the order and lengths — public randomness); the label model is ``models[person]``
    (one that never saw them: leave one person out) or one ``LabelModel`` for everyone (a
    model not trained on this dataset). Each mode runs the sidecar's own
    :class:`~gazeguard.runtime.labels.LabelStream` with the plan's ε for labels alone at each
    user-level budget per hour (:func:`gazeguard.plan.labels_alone`; a real SQLite ledger with
    the plan's counts, ``reps`` noise repetitions per session); the consumer holds the last
    label. Per-window accuracy: the fraction of windows whose held label is the activity at
    the window's end; clean: the same mode without noise; kept: ``(acc − 1/C)/(clean − 1/C)``.
    ``attack_reps`` repetitions also attack the released label sequences (re-identification,
    first half of each session → second half). Returns the JSON-ready result.
    """
    feats = features or FeatureSettings()
    t0 = time.perf_counter()
    source = GazeSource(dataset)
    mapping = activity or {}
    rng = np.random.default_rng(session_seed)
    who = list(people) if people is not None else (
        sorted(models) if isinstance(models, Mapping) else sorted(
            {p for p, _ in source.recorded} if source.synthetic is None
            else {f"sim{p + 1:02d}" for p in range(source.synthetic.people)}
        )
    )  # fmt: skip
    held: list[HeldOutSession] = []
    for person in who:
        model = models[person] if isinstance(models, Mapping) else models
        act = mapping or {c: c for c in model.classes}
        held += [
            build_session(
                source,
                person,
                k,
                model=model,
                activity=act,
                rng=rng,
                window_s=feats.window_s,
                step_s=feats.step_s,
            )
            for k in range(sessions)
        ]
    classes = list(held[0].model.classes)
    changes = [len(s.segments) - 1 for s in held]
    progress(
        f"{name}: {len(held)} sessions of {SESSION_S / 60:g} min ({len(who)} people), "
        f"{np.mean(changes):.1f} activity changes each [{time.perf_counter() - t0:.0f} s]"
    )
    res: dict[str, Any] = {
        "dataset": name,
        "people": len(who),
        "sessions": len(held),
        "classes": classes,
        "chance": 1.0 / len(classes),
        "delta": DELTA,
        "session_s": SESSION_S,
        "segment_s": list(SEGMENT_S),
        "changes_per_session": round(float(np.mean(changes)), 2),
        "windows": int(sum(s.t.size for s in held)),
        "reps": reps,
        "attack_reps": attack_reps,
        "noise": "os-csprng" if seed is None else "INSECURE-seeded",
        "modes": [],
    }
    with tempfile.TemporaryDirectory(prefix="gazeguard-labels-") as tmp:
        for mode in modes:
            row = _mode_row(
                held, mode, budgets, reps=reps, attack_reps=attack_reps, seed=seed,
                ledger_dir=Path(tmp), features=feats,
            )  # fmt: skip
            res["modes"].append(row)
            progress(
                f"{name}: {mode.name}: clean {row['clean']:.3f}; "
                + ", ".join(
                    f"{c['budget_per_hour']:g} ε/h → {c['accuracy']:.3f}" for c in row["released"]
                )
                + f" [{time.perf_counter() - t0:.0f} s]"
            )
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return res


def frontier_sessions(
    dataset: Dataset,
    table: FeatureTable,
    features: Sequence[str],
    *,
    budgets: tuple[float, ...],
    quick: bool,
    seed: int | None,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any] | None:
    """The frontier's held labels (``gazeguard eval --frontier``): on the shipped clock and on
    a 30 s clock over hour-long sessions of each held-out person (:func:`evaluate_sessions`),
    leave-one-person-out models on ``features`` (those the table has and that vary) with the
    dataset's tasks as classes, the released label sequences attacked; ``None`` (and why, to
    ``progress``) when the dataset cannot make such sessions (one task, mixed sampling rates)."""
    tasks = sorted(set(table.task.tolist()))
    if len(tasks) < 2 or len(set(table.person.tolist())) < 2:
        progress(f"{dataset.name}: held labels need two people and two tasks: none")
        return None
    models = lopo_models(table, _usable_features(table, list(features)), every=2)
    try:
        return evaluate_sessions(
            dataset.name, dataset, models, sessions=1 if quick else 2,
            reps=3 if quick else 10, attack_reps=3 if quick else 10,
            modes=MODES, budgets=budgets, seed=seed, progress=progress,
        )  # fmt: skip
    except ValueError as exc:
        progress(f"{dataset.name}: no held-label sessions: {exc}")
        return None
