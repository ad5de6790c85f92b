"""Bozkir et al. 2021's MPIIDPEye tables, reproduced on the paper's own data with its values beside
ours in every cell.

The paper (PLOS ONE 2021, ``../shared/papers/``) reports on MPIIDPEye (Steil et al. 2019: 20
people reading a comic, a newspaper and a textbook in VR) the accuracy of k-NN | SVM | DT | RF on
privatized features for three targets, each with a majority vote per recording (Tables 1–3) and
per window (Tables 6–8, its S1–S3):

* **document type** (3 classes) and **gender** (2 classes), leave one person out, every 10th
  window of each recording;
* **person identification** (20 classes), the first half of each recording trains and the second
  half tests, every 5th window.

:func:`evaluate_targets` scores one (mechanism, ε) for all three targets on the *same* release
of each noisy repetition (the release is per recording and does not depend on the target), with
the classifiers and protocols of :mod:`gazeguard.offline.eval.attacks`; :func:`run_paper_tables`
runs the grid through :func:`gazeguard.offline.eval.runner.run_jobs` (worker processes, progress
with ETA) with gazeguard's public bounds or, with ``--sensitivity paper``, the paper's
data-dependent sensitivity and oracle k (:mod:`gazeguard.offline.eval.paper`; NOT private).
:func:`paper_tables_markdown` writes one table per paper table: rows are mechanism × classifier,
columns the paper's ε, each cell ``ours (paper)``, then the differences summarised.

:data:`PAPER` holds the paper's numbers as printed (its "≈0" is 0). It reports no clean baseline
and no LPA row; ours has both (paper cells "–").
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.offline.eval.attacks import (
    CLASSIFIER_LABELS,
    CLASSIFIERS,
    reidentification,
    task_recognition,
)
from gazeguard.offline.eval.datasets import MpiiDpEye
from gazeguard.offline.eval.grid import MechanismSpec, parse_mechanism
from gazeguard.offline.eval.harness import (
    EvalSettings,
    FeatureBounds,
    IntArray,
    MechanismFactory,
    ScoreLists,
    collect_scores,
    configuration_head,
    configuration_mechanisms,
    gazeguard_factory,
    release_table,
    summarise_scores,
)
from gazeguard.offline.eval.paper import NOT_PRIVATE, paper_factory
from gazeguard.offline.eval.report import json_rows, json_safe
from gazeguard.offline.eval.runner import (
    GridConfig,
    Progress,
    print_progress,
    public_bounds,
    run_jobs,
    select_features,
)
from gazeguard.signal.dataset import FeatureTable

#: The paper's grid: LPA (not in its classification tables), FPA, CFPA and DCFPA with the DFT.
PAPER_MECHANISMS: tuple[str, ...] = (
    "lpa-32",
    "fpa-dft",
    *(f"{m}-{n}-dft" for m in ("cfpa", "dcfpa") for n in (32, 64, 128)),
)
#: The three targets, in the paper's order.
TARGETS: tuple[str, ...] = ("document", "gender", "person")
#: Paper table number → (target, ``vote`` or ``window``).
TABLES: dict[int, tuple[str, str]] = {
    1: ("document", "vote"),
    2: ("gender", "vote"),
    3: ("person", "vote"),
    6: ("document", "window"),
    7: ("gender", "window"),
    8: ("person", "window"),
}
_TITLES = {
    "document": "Document type (comic, newspaper, textbook; chance 0.33), leave one person out",
    "gender": "Gender (chance 0.50), leave one person out",
    "person": "Person identification (20 people; chance 0.05), first half trains, second tests",
}
#: The paper's ε grid (per feature per chunk) in the order its columns print.
PAPER_EPS: tuple[float, ...] = (0.48, 2.4, 4.8, 24.0, 48.0)

# The paper's cells as printed: per mechanism, 20 values: five ε groups (0.48, 2.4, 4.8, 24, 48)
# of k-NN SVM DT RF.
_PAPER_TEXT: dict[int, str] = {
    1: """
fpa       .50 .63 .82 .87 .51 .63 .81 .87 .50 .61 .81 .87 .52 .63 .82 .87 .52 .64 .83 .88
cfpa-32   .39 .37 .45 .44 .40 .38 .45 .44 .40 .44 .46 .44 .58 .58 .55 .60 .71 .69 .66 .66
cfpa-64   .41 .36 .45 .45 .40 .37 .44 .45 .40 .41 .44 .45 .57 .59 .55 .59 .70 .70 .66 .66
cfpa-128  .36 .33 .45 .45 .36 .33 .44 .44 .37 .35 .44 .45 .52 .56 .52 .57 .69 .68 .64 .66
dcfpa-32  .51 .37 .46 .44 .51 .36 .47 .42 .47 .35 .47 .43 .49 .37 .46 .44 .48 .36 .47 .45
dcfpa-64  .61 .45 .43 .41 .55 .35 .43 .41 .56 .41 .43 .41 .60 .43 .45 .42 .59 .40 .44 .43
dcfpa-128 .64 .45 .46 .48 .62 .42 .45 .46 .69 .50 .44 .46 .57 .45 .45 .46 .60 .42 .45 .46
""",
    2: """
fpa       .44 .30 .43 .38 .45 .30 .41 .37 .44 .28 .41 .39 .43 .27 .43 .38 .44 .31 .42 .39
cfpa-32   .04 .01 .26 .24 .05 .01 .27 .25 .05 .02 .28 .27 .36 .30 .50 .45 .62 .50 .67 .53
cfpa-64   .08 .05 .27 .26 .08 .04 .28 .27 .10 .06 .31 .27 .38 .34 .52 .47 .62 .51 .68 .54
cfpa-128  .18 .15 .32 .30 .16 .12 .31 .30 .18 .10 .32 .31 .36 .30 .50 .46 .60 .47 .68 .54
dcfpa-32  .03   0 .22 .31 .04   0 .23 .32 .04   0 .22 .32 .04   0 .23 .31 .04   0 .23 .32
dcfpa-64  .04   0 .30 .33 .04   0 .30 .34 .04   0 .30 .32 .04   0 .29 .34 .03   0 .30 .34
dcfpa-128 .09 .01 .34 .35 .08   0 .32 .34 .08 .01 .32 .35 .07   0 .33 .34 .07 .01 .34 .34
""",
    3: """
fpa         1   1   1   1   1   1   1   1   1   1   1   1   1   1   1   1   1   1   1   1
cfpa-32   .15 .08 .44 .37 .13 .08 .46 .39 .11 .08 .48 .41 .40 .11 .64 .70 .72 .16 .87 .92
cfpa-64   .14 .08 .42 .34 .13 .08 .44 .37 .12 .08 .45 .38 .39 .11 .63 .71 .70 .17 .85 .92
cfpa-128  .16 .05 .39 .36 .15 .05 .41 .36 .17 .05 .43 .39 .45 .07 .55 .63 .70 .16 .74 .88
dcfpa-32  .06 .10 .39 .37 .06 .10 .39 .36 .08 .10 .39 .36 .10 .10 .39 .37 .10 .10 .40 .38
dcfpa-64  .10 .10 .33 .35 .10 .10 .32 .34 .10 .10 .32 .33 .13 .10 .31 .34 .13 .10 .32 .33
dcfpa-128 .09 .05 .24 .28 .09 .05 .25 .27 .10 .05 .23 .27 .10 .06 .24 .26 .10 .05 .22 .25
""",
    6: """
fpa       .46 .52 .68 .73 .46 .52 .67 .73 .45 .51 .67 .73 .46 .52 .68 .73 .47 .52 .68 .74
cfpa-32   .34 .35 .36 .38 .34 .35 .36 .38 .34 .36 .36 .38 .39 .44 .38 .42 .47 .53 .44 .49
cfpa-64   .34 .35 .36 .38 .34 .35 .36 .38 .34 .36 .36 .38 .39 .44 .38 .42 .47 .53 .44 .49
cfpa-128  .34 .34 .36 .39 .34 .34 .36 .39 .34 .34 .36 .39 .38 .42 .37 .42 .46 .51 .43 .48
dcfpa-32  .36 .35 .36 .37 .36 .34 .35 .37 .35 .34 .36 .37 .36 .35 .35 .37 .35 .34 .36 .38
dcfpa-64  .38 .37 .35 .37 .37 .35 .35 .37 .37 .36 .35 .37 .37 .36 .35 .37 .37 .36 .35 .37
dcfpa-128 .40 .38 .36 .38 .39 .37 .35 .37 .41 .39 .35 .38 .38 .37 .35 .38 .39 .37 .35 .38
""",
    7: """
fpa       .48 .42 .48 .45 .48 .42 .47 .44 .47 .41 .47 .45 .47 .41 .48 .44 .48 .43 .48 .45
cfpa-32   .43 .31 .44 .40 .43 .31 .45 .41 .43 .32 .46 .41 .46 .42 .49 .47 .51 .47 .53 .53
cfpa-64   .44 .35 .45 .40 .44 .35 .45 .41 .44 .35 .46 .42 .46 .43 .49 .47 .51 .48 .54 .53
cfpa-128  .45 .39 .46 .42 .45 .38 .46 .42 .45 .38 .46 .42 .46 .43 .49 .47 .51 .47 .53 .53
dcfpa-32  .44 .27 .45 .42 .44 .27 .45 .42 .44 .27 .45 .42 .44 .27 .45 .42 .44 .27 .46 .42
dcfpa-64  .44 .30 .46 .43 .43 .29 .46 .43 .44 .30 .46 .43 .43 .30 .46 .43 .43 .30 .46 .43
dcfpa-128 .44 .32 .46 .43 .44 .32 .46 .43 .44 .32 .47 .43 .44 .31 .46 .43 .44 .32 .47 .43
""",
    8: """
fpa         1   1 .98   1   1   1 .98   1   1   1 .98   1   1   1 .97   1   1   1 .95   1
cfpa-32   .09 .11 .16 .16 .08 .11 .16 .17 .09 .11 .17 .17 .12 .15 .18 .21 .18 .21 .23 .27
cfpa-64   .09 .11 .17 .17 .09 .11 .17 .17 .09 .11 .17 .17 .12 .15 .19 .21 .17 .21 .23 .27
cfpa-128  .11 .13 .17 .18 .11 .13 .17 .18 .11 .13 .17 .18 .13 .16 .18 .20 .18 .20 .21 .25
dcfpa-32  .09 .10 .15 .16 .09 .11 .14 .16 .09 .11 .14 .16 .09 .11 .14 .16 .09 .11 .15 .16
dcfpa-64  .09 .10 .13 .15 .09 .10 .13 .15 .09 .10 .13 .15 .09 .10 .13 .15 .09 .10 .13 .15
dcfpa-128 .08 .09 .12 .13 .08 .09 .11 .13 .08 .09 .11 .13 .08 .09 .12 .13 .08 .09 .11 .13
""",
}


def _parse_paper() -> dict[int, dict[str, dict[float, dict[str, float]]]]:
    out: dict[int, dict[str, dict[float, dict[str, float]]]] = {}
    n = len(CLASSIFIERS)
    for table, text in _PAPER_TEXT.items():
        out[table] = {}
        for line in text.strip().splitlines():
            mech, *cells = line.split()
            vals = [float(v) for v in cells]
            assert len(vals) == n * len(PAPER_EPS), line
            out[table][mech] = {
                eps: dict(zip(CLASSIFIERS, vals[i * n : (i + 1) * n], strict=True))
                for i, eps in enumerate(PAPER_EPS)
            }
    return out


#: ``PAPER[table][mechanism][ε][classifier]``: the paper's accuracy (mechanism keys ``fpa``,
#: ``cfpa-32``, …, ``dcfpa-128``; all with the DFT).
PAPER: dict[int, dict[str, dict[float, dict[str, float]]]] = _parse_paper()


def paper_key(spec: MechanismSpec) -> str | None:
    """The paper's name of a mechanism (``fpa``, ``cfpa-64``, …) when it used it: the DFT
    variants of FPA, CFPA and DCFPA; else None."""
    if spec.transform not in (None, "dft") or spec.family not in ("fpa", "cfpa", "dcfpa"):
        return None
    key = spec.family if spec.n is None else f"{spec.family}-{spec.n}"
    return key if key in PAPER[1] else None


def evaluate_targets(
    table: FeatureTable,
    cols: IntArray,
    spec: MechanismSpec,
    epsilon: float | None,
    *,
    factory: MechanismFactory,
    settings: EvalSettings,
    bounds: FeatureBounds,
    job_seed: int = 0,
    labels: Mapping[str, npt.NDArray[Any]] | None = None,
) -> dict[str, Any]:
    """The paper's three classifications of one (mechanism, ε), JSON-ready.

    Each of ``settings.clf_reps`` repetitions releases every recording once and scores, on that
    release (train and test: Bozkir et al.'s protocol): the task (``table.task``) and every
    extra target of ``labels`` (``{name: (N,) label per row}``, e.g. gender) leave one person
    out on every ``settings.every_task``-th window, and the person on the first/second halves
    of every ``settings.every_reid``-th window (cut between released chunks). ``bounds`` is
    unused (the factory holds the bounds); it is accepted for
    :func:`gazeguard.offline.eval.runner.run_jobs`.

    Returns:
        the row: mechanism, ε, the user-level ε of a recording, repetitions, and
        ``task``/each extra target/``reid``: ``{"release": {classifier: {"window"|"vote":
        {"mean", "std"}}}}`` (the harness's layout, so its headline and tables read it).
    """
    del bounds
    t0 = time.perf_counter()
    eps, mechanisms = configuration_mechanisms(spec, epsilon, factory, settings, job_seed)
    extra = dict(labels or {})
    acc: dict[str, ScoreLists] = {name: {} for name in ("task", *extra, "reid")}
    chunks: list[int] = []
    released = 0
    reps = 0
    for rep in range(settings.clf_reps):
        rel = release_table(table, cols, spec, mechanisms)
        chunks, released = rel.chunks, int(rel.rows.size)
        if rel.rows.size == 0:
            break
        reps += 1
        views = {"release": rel.values}
        person, rec = table.person[rel.rows], table.recording[rel.rows]
        rep_seed = job_seed * 1000 + rep
        for name, y in (("task", table.task), *extra.items()):
            scores = task_recognition(
                rel.values, views, np.asarray(y)[rel.rows], person, rec,
                classifiers=settings.classifiers, every=settings.every_task, seed=rep_seed,
            )  # fmt: skip
            collect_scores(acc[name], scores)
        block = table.n_rows if spec.whole else int(spec.n or 1)
        scores = reidentification(
            rel.values, views, person, rec, classifiers=settings.classifiers,
            every=settings.every_reid, seed=rep_seed, block=block,
        )  # fmt: skip
        collect_scores(acc["reid"], scores)
    return {
        **configuration_head(spec, eps, mechanisms, int(cols.size), chunks),
        "rows_released": released,
        "k": None if mechanisms is None else mechanisms.k(),
        "reps": {"clf": reps},
        **{name: summarise_scores(a) for name, a in acc.items()},
        "elapsed_s": time.perf_counter() - t0,
    }


def run_paper_tables(
    dataset: MpiiDpEye,
    mechanisms: Sequence[str] = PAPER_MECHANISMS,
    epsilons: Sequence[float] = PAPER_EPS,
    *,
    settings: EvalSettings | None = None,
    sensitivity: str = "public",
    k: int | str = "auto",
    jobs: int = 1,
    cache_dir: Path | None = None,
    window_s: float = 30.0,
    step_s: float = 0.5,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Bozkir et al.'s MPIIDPEye grid on ``dataset`` (an
    :class:`~gazeguard.offline.eval.datasets.MpiiDpEye`; its ``genders`` give the gender
    target), JSON-ready: ``{"dataset", "meta", "rows"}``.

    ``sensitivity="paper"`` uses the paper's data-dependent sensitivity and oracle k for CFPA
    and DCFPA (NOT private; its other mechanisms' rows carry an ``error``).
    """
    say = progress or print_progress
    settings = settings or EvalSettings(clf_reps=3)
    t0 = time.perf_counter()
    table = dataset.features(window_s, step_s, cache_dir, say)
    gender = np.array([dataset.genders[str(p)] for p in table.person.tolist()], dtype=str)
    bounds = public_bounds(table.feature_names, window_s, step_s)
    cols, excluded = select_features(table)
    sub = FeatureBounds(bounds.lo[cols], bounds.hi[cols], bounds.max_step[cols])
    specs = [parse_mechanism(m) for m in mechanisms]
    grid = GridConfig(
        mechanisms=specs, epsilons=list(epsilons), k=k, settings=settings, window_s=window_s,
        step_s=step_s, jobs=jobs, cache_dir=cache_dir,
    )  # fmt: skip
    factory = (
        paper_factory(table, cols, sub, k) if sensitivity == "paper" else gazeguard_factory(sub, k)
    )
    people = sorted(set(table.person.tolist()))
    say(
        f"{dataset.name}: Bozkir et al.'s tables: {len(people)} people, {table.n_rows} windows, "
        f"{cols.size} features, {len(specs)} mechanisms x {len(epsilons)} ε, "
        f"{settings.clf_reps} noisy repetitions each; sensitivity {sensitivity}"
    )
    rows = run_jobs(
        table, cols, sub, grid, progress=say, factory=factory, label=f"{dataset.name}: ",
        evaluate=evaluate_targets, extra={"labels": {"gender": gender}},
    )  # fmt: skip
    return {
        "dataset": dataset.name,
        "meta": {
            "fingerprint": dataset.fingerprint(),
            "people": people,
            "windows": table.n_rows,
            "window_s": window_s,
            "step_s": step_s,
            "features_released": [table.feature_names[int(c)] for c in cols],
            "features_excluded": excluded,
            "epsilons": list(epsilons),
            "mechanisms": [s.key for s in specs],
            "clf_reps": settings.clf_reps,
            "classifiers": list(settings.classifiers),
            "every_task": settings.every_task,
            "every_reid": settings.every_reid,
            "k": k,
            "sensitivity": "public" if sensitivity == "public" else NOT_PRIVATE,
            "noise": "OS CSPRNG"
            if settings.insecure_seed is None
            else f"INSECURE reproducible seed {settings.insecure_seed}",
            "elapsed_s": time.perf_counter() - t0,
        },
        "rows": rows,
    }


# ------------------------------------------------------------------ tables
_ROW_KEY = {"document": "task", "gender": "gender", "person": "reid"}


def score(row: Mapping[str, Any], target: str, mode: str, clf: str) -> tuple[float, float] | None:
    """(mean, std over repetitions) of one classifier's accuracy in a result row, or None."""
    per = (row.get(_ROW_KEY[target]) or {}).get("release", {}).get(clf)
    if not per:
        return None
    mean, std = per[mode]["mean"], per[mode]["std"]
    if mean is None or not math.isfinite(mean):
        return None
    return float(mean), float(std or 0.0)


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _by_mechanism(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[float | None, Any]]:
    out: dict[str, dict[float | None, Any]] = {}
    for r in rows:
        if "error" in r:
            continue
        out.setdefault(r["mechanism"], {})[r["epsilon"]] = r
    return out


def compare(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every cell with a paper value: ``{table, mechanism, epsilon, classifier, ours, std,
    paper, diff}`` (``diff`` = ours − paper)."""
    cells = []
    for mech, by_eps in _by_mechanism(result["rows"]).items():
        key = paper_key(parse_mechanism(mech))
        if key is None:
            continue
        for table, (target, mode) in TABLES.items():
            for eps, row in by_eps.items():
                if eps is None or float(eps) not in PAPER[table][key]:
                    continue
                for clf, theirs in PAPER[table][key][float(eps)].items():
                    got = score(row, target, mode, clf)
                    if got is None:
                        continue
                    cells.append({
                        "table": table, "mechanism": mech, "epsilon": float(eps),
                        "classifier": clf, "ours": got[0], "std": got[1], "paper": theirs,
                        "diff": got[0] - theirs,
                    })  # fmt: skip
    return cells


def _table_lines(result: Mapping[str, Any], table: int) -> list[str]:
    target, mode = TABLES[table]
    eps = [float(e) for e in result["meta"]["epsilons"]]
    by = _by_mechanism(result["rows"])
    clfs = result["meta"]["classifiers"]
    how = "with majority voting" if mode == "vote" else "without majority voting (per window)"
    lines = [
        f"### Table {table}: {_TITLES[target]}, {how}",
        "",
        "| mechanism | classifier | " + " | ".join(f"ε={e:g}" for e in eps) + " |",
        "|---|---|" + "---|" * len(eps),
    ]
    for mech, rows in by.items():
        spec = parse_mechanism(mech)
        key = paper_key(spec)
        label = spec.label
        for clf in clfs:
            cells = []
            for e in eps:
                row = rows.get(None) if mech == "none" else rows.get(e)
                got = None if row is None else score(row, target, mode, clf)
                theirs = None if key is None else PAPER[table][key].get(e, {}).get(clf)
                ours = _fmt(None if got is None else got[0])
                cells.append(ours if theirs is None else f"{ours} ({theirs:.2f})")
            lines.append(f"| {label} | {CLASSIFIER_LABELS[clf]} | " + " | ".join(cells) + " |")
    diffs = [c["diff"] for c in compare(result) if c["table"] == table]
    if diffs:
        d = np.asarray(diffs)
        lines += [
            "",
            f"Ours − paper over the {d.size} cells with a paper value: mean {d.mean():+.2f}, "
            f"mean |difference| {np.abs(d).mean():.2f}, within 0.1 in "
            f"{int((np.abs(d) <= 0.1).sum())} ({np.mean(np.abs(d) <= 0.1):.0%}).",
        ]
    return [*lines, ""]


def headline(result: Mapping[str, Any]) -> list[str]:
    """The clean document type with majority voting per classifier, and DCFPA-128's document
    type at each ε beside the paper's (Table 1)."""
    by = _by_mechanism(result["rows"])
    clfs = result["meta"]["classifiers"]
    lines: list[str] = []
    clean = by.get("none", {}).get(None)
    if clean is not None:
        got = [score(clean, "document", "vote", c) for c in clfs]
        lines.append(
            "Clean document type with majority voting: "
            + ", ".join(
                f"{CLASSIFIER_LABELS[c]} {_fmt(None if g is None else g[0])}"
                for c, g in zip(clfs, got, strict=True)
            )
            + "."
        )
    dc = by.get("dcfpa-128-dft", {})
    if dc:
        parts = []
        for e, row in sorted((k, v) for k, v in dc.items() if k is not None):
            best = [(score(row, "document", "vote", c), PAPER[1]["dcfpa-128"][e][c]) for c in clfs]
            cells = ", ".join(
                f"{CLASSIFIER_LABELS[c]} {_fmt(None if g is None else g[0])} ({p:.2f})"
                for c, (g, p) in zip(clfs, best, strict=True)
            )
            parts.append(f"ε={e:g}: {cells}")
        lines.append("DCFPA-128 (dft) document type with majority voting, ours (paper): ")
        lines += [f"- {p}" for p in parts]
    return lines


def paper_tables_markdown(results: Sequence[Mapping[str, Any]]) -> str:
    """One section per run (sensitivity), each with Tables 1–3 and 6–8, ``ours (paper)``."""
    out = [
        "# Bozkir et al. 2021's MPIIDPEye tables on the paper's own data",
        "",
        "Each cell: ours (paper). Accuracy on the release (train and test privatized), mean over",
        "the noisy repetitions; ε per feature per chunk. The paper prints no clean row and no LPA",
        "row (–). Regenerate: see docs/evaluation.md (MPIIDPEye).",
        "",
    ]
    for res in results:
        meta = res["meta"]
        stds = [
            got[1]
            for row in res["rows"]
            if "error" not in row and row["family"] != "none"
            for target, mode in TABLES.values()
            for clf in meta["classifiers"]
            if (got := score(row, target, mode, clf)) is not None
        ]
        spread = (
            f"spread over repetitions (std of one cell): median {np.median(stds):.3f}, "
            f"max {np.max(stds):.3f}"
            if stds
            else "no spread (one repetition)"
        )
        out += [
            f"## {res['dataset']}: sensitivity {meta['sensitivity']}",
            "",
            f"{len(meta['people'])} people, {meta['windows']} windows of {meta['window_s']:g} s "
            f"every {meta['step_s']:g} s, {len(meta['features_released'])} features released, "
            f"k {meta['k']}; {meta['clf_reps']} noisy repetitions per cell ({spread}); 1 in "
            f"{meta['every_task']} windows for document type and gender, 1 in "
            f"{meta['every_reid']} for person identification; noise {meta['noise']}; "
            f"{meta['elapsed_s'] / 60:.0f} min.",
            "",
            *headline(res),
            "",
        ]
        for table in TABLES:
            out += _table_lines(res, table)
        errors = sorted({f"{r['label']}: {r['error']}" for r in res["rows"] if "error" in r})
        if errors:
            out += ["Not evaluated in this run:", "", *[f"- {e}" for e in errors], ""]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ files
JSON_NAME = "paper-tables.json"
MD_NAME = "paper-tables.md"


def read_results(path: Path) -> list[dict[str, Any]]:
    """The runs of a ``paper-tables.json`` (empty when the file does not exist)."""
    if not path.is_file():
        return []
    return list(json.loads(path.read_text())["runs"])


def render(path: Path, out: Path) -> Path:
    """Rewrite ``out/paper-tables.md`` from a ``paper-tables.json``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / MD_NAME
    md.write_text(paper_tables_markdown(read_results(path)))
    return md


def write_results(result: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """Add ``result`` to ``out/paper-tables.json`` — replacing a run of the same dataset and
    sensitivity, keeping the others — and rewrite ``out/paper-tables.md`` from the file.
    Returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / JSON_NAME
    new = json_safe(dict(result))
    same = (new["dataset"], new["meta"]["sensitivity"])
    runs = [r for r in read_results(path) if (r["dataset"], r["meta"]["sensitivity"]) != same]
    runs.append(new)
    runs.sort(key=lambda r: (r["dataset"], r["meta"]["sensitivity"] != "public"))
    lines = ['{"runs": [']
    for i, run in enumerate(runs):
        head = {k: v for k, v in run.items() if k != "rows"}
        lines.append(json.dumps(head, ensure_ascii=False)[:-1] + ', "rows": [')
        lines += json_rows(run["rows"])
        lines.append("]}" + ("," if i < len(runs) - 1 else ""))
    lines.append("]}")
    path.write_text("\n".join(lines) + "\n")
    return path, render(path, out)
