"""Train and evaluate the portable activity label model (issue 34): one model for any headset.

What it does (all build time, on public data only):

1. Reads every public activity-labelled dataset it is given (``bench/label_data.py``:
   GazeGraph, Andersson 2017, the pymovements toy reading data) and maps their tasks onto the
   common activities ``browse, play, read, watch, write``.
2. Augments each person's gaze with ``--variants`` simulated devices (one per person and
   variant, shared by all of that person's activities: rate 30–1000 Hz, gain ¼–4 with
   anisotropy, white noise, calibration offset) and extracts features from the perturbed raw
   gaze with the real ``extract_features`` at the declared rate.
3. Evaluates candidate configurations (feature transform, per-session standardisation,
   regularisation) by

   - **leave one person out** on GazeGraph (train on every other person and every other
     dataset, all devices; test the held-out person's native recordings, their augmented
     copies, and four fixed *headset changes* at 30 Hz that lie at or beyond the augmentation's
     edges);
   - **leave one dataset out** (train on the other datasets; test the held-out one's native
     recordings; accuracy over the activities the training data has, and per activity).

   Per-session models are tested twice: with the person's recordings as one session (their
   activities one after another, in a random order: a headset worn through several
   activities) and with each recording as its own session (one activity per session, the
   worst case for running statistics).
4. Picks the configuration by a rule fixed here (``choose``), trains it on everything and
   writes the model JSON, its evaluation (``bench/results/labels/portable.{json,md}``).

Get the data (nothing is committed; see ``label_data.SOURCES`` for licences)::

    # GazeGraph: ../shared/data/gazegraph_desktop_activity (or --data-dir)
    git clone https://github.com/richardandersson/EyeMovementDetectorEvaluation /tmp/andersson
    git clone https://github.com/aeye-lab/pymovements-toy-dataset /tmp/toyreading
    OMP_NUM_THREADS=1 python bench/train_label_model.py --andersson /tmp/andersson \\
        --toyreading /tmp/toyreading --out gazeguard/data/models/activity-portable.json

About 10 minutes on one core (feature extraction of every variant is cached under
``--cache``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import label_data as ld

from gazeguard import __version__
from gazeguard.dataset import FeatureTable
from gazeguard.features import NAMES
from gazeguard.labels import LabelModel, SessionSpec, train_model

RESULTS = Path(__file__).resolve().parent / "results" / "labels"

#: The features the model reads: every feature of gazeguard's extractor except blinks, pupil
#: and data quality (device-specific: they say which tracker, not what the person does; the
#: 30 Hz and preprocessed datasets have none).
FEATURES: tuple[str, ...] = tuple(
    n for n in NAMES if not n.startswith(("blink", "pupil")) and n != "valid_fraction"
)
#: Read through ln(x + 0.01): every feature with a unit or a count (scale changes become
#: shifts); the direction and size ratios stay linear.
LOG_FEATURES: tuple[str, ...] = tuple(f for f in FEATURES if not f.endswith("_ratio"))

#: Fixed headset changes for the leave-one-person-out test, all at 30 Hz (the rate of the
#: head-mounted trackers the model is meant for): gain at and beyond the augmentation's edges,
#: anisotropic gain, heavy noise.
HEADSETS: dict[str, ld.Device] = {
    "gain ×0.3": ld.Device(30.0, 0.3, 0.3, 0.1),
    "gain ×3, noise 0.3°": ld.Device(30.0, 3.0, 3.0, 0.3),
    "gain 0.6×0.5, noise 0.4°": ld.Device(30.0, 0.6, 0.5, 0.4),
    "gain 2×1.2, noise 0.2°": ld.Device(30.0, 2.0, 1.2, 0.2),
}


@dataclass(frozen=True)
class Config:
    """A candidate: per-session standardisation (None: population only), L2 strength."""

    name: str
    session: SessionSpec | None
    regularization: float
    log: bool = True


CANDIDATES: tuple[Config, ...] = (
    Config("population, log, C=1", None, 1.0),
    Config("population, log, C=0.05", None, 0.05),
    Config("population, linear, C=1", None, 1.0, log=False),
    Config("session n0=120 + population, log, C=1", SessionSpec(prior_windows=120.0), 1.0),
    Config("session n0=600 + population, log, C=1", SessionSpec(prior_windows=600.0), 1.0),
    Config(
        "session n0=120 only, log, C=1",
        SessionSpec(prior_windows=120.0, combine="replace"),
        1.0,
    ),
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- tables
def session_order(tab: ld.Table, seed: int) -> npt.NDArray[np.intp]:
    """Row order with each session's recordings one after another in a random order (rows of a
    recording stay in time order): how a per-session model meets them."""
    rng = np.random.default_rng(seed)
    order: list[npt.NDArray[np.intp]] = []
    for rows in ld.iter_sessions(tab.session):
        recs = list(dict.fromkeys(tab.recording[rows].tolist()))
        rng.shuffle(recs)
        order += [rows[tab.recording[rows] == r] for r in recs]
    return np.concatenate(order)


def feature_table(tab: ld.Table) -> FeatureTable:
    """The rows as a :class:`FeatureTable` (recording ids unique across sessions)."""
    rec = np.char.add(np.char.add(tab.session, "|"), tab.recording)
    return FeatureTable(tab.X, tab.t, tab.person, tab.activity, rec, tuple(NAMES))


def weights(tab: ld.Table) -> npt.NDArray[np.float64]:
    """Each (dataset, activity) pair weighs as much in total as any other: the small datasets
    count, and no activity dominates because one dataset has more of it."""
    keys = np.char.add(np.char.add(tab.dataset, "/"), tab.activity)
    _, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inv]
    return np.asarray(w * w.size / w.sum(), np.float64)


def fit(cfg: Config, tab: ld.Table, every: int, name: str = "portable") -> LabelModel:
    """Train ``cfg`` on ``tab`` (sessions in :func:`session_order`, every n-th window)."""
    order = session_order(tab, 0)
    sub = ld.Table(*(getattr(tab, f)[order] for f in ld.Table.__dataclass_fields__))
    return train_model(
        feature_table(sub),
        FEATURES,
        name=name,
        regularization=cfg.regularization,
        every=every,
        labels=sub.activity,
        log_features=LOG_FEATURES if cfg.log else (),
        session=cfg.session,
        sessions=sub.session,
        sample_weight=weights(sub),
    )


def predict(
    model: LabelModel, X: npt.NDArray[np.float64], sessions: npt.NDArray[np.str_]
) -> npt.NDArray[np.str_]:
    """Per-window predicted activity, each session's rows fed in their order through
    :meth:`LabelModel.predict_proba` with that session's state (the deployed path)."""
    cols = np.array([NAMES.index(f) for f in model.features], dtype=np.intp)
    out = np.empty(len(X), dtype=object)
    for rows in ld.iter_sessions(sessions):
        p = model.predict_proba(X[np.ix_(rows, cols)], session=model.new_session())
        out[rows] = np.asarray(model.classes)[p.argmax(axis=1)]
    return out.astype(str)


def accuracy(pred: npt.NDArray[np.str_], true: npt.NDArray[np.str_]) -> dict[str, Any]:
    """Overall and per-activity accuracy (fraction of windows)."""
    per = {a: float((pred[true == a] == a).mean()) for a in sorted(set(true.tolist()))}
    conf = {a: dict(collections.Counter(pred[true == a].tolist())) for a in per}
    return {"accuracy": float((pred == true).mean()), "per_activity": per, "predicted": conf}


# ----------------------------------------------------------------------------- evaluation
def headset_rows(
    recs: list[ld.Recording], seed: int
) -> dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.str_], npt.NDArray[np.str_]]]:
    """Features of ``recs`` (one person) under every :data:`HEADSETS` device:
    ``{headset: (X, activity, recording)}``."""
    rng = np.random.default_rng(seed)
    out = {}
    for hname, dev in HEADSETS.items():
        xs, acts, rids = [], [], []
        for r in recs:
            X, _ = ld._features(ld.apply_device(r, dev, rng))
            xs.append(X)
            acts.append(np.full(len(X), ld.ACTIVITY[("gazegraph", r.task)]))
            rids.append(np.full(len(X), f"{hname}|{r.recording}"))
        out[hname] = (np.vstack(xs), np.concatenate(acts), np.concatenate(rids))
    return out


def shuffled_session(rids: npt.NDArray[np.str_], seed: int) -> npt.NDArray[np.intp]:
    """Row order putting one person's recordings one after another in a random order."""
    rng = np.random.default_rng(seed)
    recs = list(dict.fromkeys(rids.tolist()))
    rng.shuffle(recs)
    return np.concatenate([np.flatnonzero(rids == r) for r in recs])


Heads = dict[str, dict[str, tuple[Any, Any, Any]]]


def evaluate_lopo(
    cfg: Config, tab: ld.Table, heads: Heads, every: int, seed: int
) -> dict[str, Any]:
    """Leave one GazeGraph person out (see the module docstring); ``heads`` holds each
    person's :func:`headset_rows`."""
    gg = tab.dataset == "gazegraph"
    people = sorted(set(tab.person[gg].tolist()))
    res: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: {"multi": []})
    per_person: dict[str, dict[str, float]] = {}
    preds: dict[str, tuple[list[Any], list[Any]]] = collections.defaultdict(lambda: ([], []))
    for i, who in enumerate(people):
        held = gg & (tab.person == who)
        model = fit(cfg, tab.rows(~held), every)
        tests: dict[str, tuple[Any, Any, Any]] = {}
        nat = held & (tab.variant == ld.NATIVE)
        rec_nat = np.char.add(np.char.add(tab.session[nat], "|"), tab.recording[nat])
        tests["native"] = (tab.X[nat], tab.activity[nat], rec_nat)
        aug = held & (tab.variant != ld.NATIVE)
        rec_aug = np.char.add(np.char.add(tab.session[aug], "|"), tab.recording[aug])
        tests["augmented devices"] = (tab.X[aug], tab.activity[aug], rec_aug)
        tests.update(heads[who])
        per_person[who] = {}
        for tname, (X0, y0, rid0) in tests.items():
            # one session per device copy: the person's recordings one after another
            key0 = np.array([r.split("|")[0] for r in rid0])
            order = np.concatenate(
                [idx[shuffled_session(rid0[idx], seed + i)] for idx in ld.iter_sessions(key0)]
            )
            X, y, rid, sess_key = X0[order], y0[order], rid0[order], key0[order]
            pred = predict(model, X, sess_key)
            acc = float((pred == y).mean())
            preds[tname][0].append(pred)
            preds[tname][1].append(y)
            res[tname]["multi"].append(acc)
            per_person[who][tname] = acc
            if cfg.session is not None:
                single = float((predict(model, X, rid) == y).mean())
                res[tname].setdefault("single", []).append(single)
                per_person[who][tname + " (one recording per session)"] = single
        log(f"  {cfg.name}: LOPO {who}: {per_person[who]}")
    return {
        "mean": {t: {k: float(np.mean(v)) for k, v in d.items()} for t, d in res.items()},
        "per_person": per_person,
        "pooled": {  # every held-out person's windows together, activities one session
            t: accuracy(np.concatenate(p), np.concatenate(y)) for t, (p, y) in preds.items()
        },
    }


def evaluate_lodo(cfg: Config, tab: ld.Table, every: int) -> dict[str, Any]:
    """Leave one dataset out (see the module docstring)."""
    out: dict[str, Any] = {}
    for d in sorted(set(tab.dataset.tolist())):
        held = tab.dataset == d
        model = fit(cfg, tab.rows(~held), every)
        nat = held & (tab.variant == ld.NATIVE)
        X, y = tab.X[nat], tab.activity[nat]
        known = np.isin(y, list(model.classes))
        entry: dict[str, Any] = {"trained_on": sorted(set(tab.dataset[~held].tolist()))}
        entry["classes_known"] = sorted(set(y[known].tolist()))
        entry["classes_unknown"] = sorted(set(y[~known].tolist()))
        for mode, sess in (("multi", tab.session[nat]), ("single", tab.recording[nat])):
            if mode == "single" and cfg.session is None:
                continue
            pred = predict(model, X, sess)
            a = accuracy(pred[known], y[known])
            a["accuracy_all_windows"] = float((pred == y).mean())
            entry[mode] = a
        out[d] = entry
        log(f"  {cfg.name}: LODO {d}: {entry['multi']['accuracy']:.3f} on {entry['classes_known']}")
    return out


def score(ev: dict[str, Any], sessions: bool) -> float:
    """The selection score: the mean, over the leave-one-person-out tests (native, augmented
    devices and the four headset changes) and the leave-one-dataset-out tests, of the
    accuracy; for per-session models the *worse* of the two session readings (one person's
    activities as one session, or one recording per session) counts, since the deployment
    cannot choose."""
    vals = [min(d.values()) if sessions else d["multi"] for d in ev["lopo"]["mean"].values()]
    for d in ev["lodo"].values():
        accs = [d["multi"]["accuracy"]] + ([d["single"]["accuracy"]] if "single" in d else [])
        vals.append(min(accs))
    return float(np.mean(vals))


# ----------------------------------------------------------------------------- report
def markdown(res: dict[str, Any]) -> str:
    """The tables of ``res`` as markdown."""
    lines = [
        "# Portable activity label model: evaluation",
        "",
        f"gazeguard {res['gazeguard_version']}, {res['date']}; {res['variants']} simulated "
        f"devices per person (seed {res['seed']}); training on every {res['every']}th window. "
        "Accuracy is the fraction of 30 s windows (0.5 s step) labelled right, clean (before "
        "randomized response). Chance: 1/5 over five activities, 1/3 over three, 1/2 over two.",
        "",
        "## Candidates (selection score: mean over the tests below; per-session models count "
        "the worse of their two session readings)",
        "",
        "| configuration | score |",
        "|---|---|",
    ]
    for name, ev in res["candidates"].items():
        star = " **(shipped)**" if name == res["chosen"] else ""
        lines.append(f"| {name}{star} | {ev['score']:.3f} |")
    for name, ev in res["candidates"].items():
        lines += ["", f"## {name}", "", "Leave one GazeGraph person out (mean of 8 people):", ""]
        lines += ["| test | person's activities as one session | one recording per session |"]
        lines += ["|---|---|---|"]
        for t, d in ev["lopo"]["mean"].items():
            single = f"{d['single']:.3f}" if "single" in d else "= left (population only)"
            lines.append(f"| {t} | {d['multi']:.3f} | {single} |")
        lines += ["", "Per activity (every held-out person's windows pooled):", ""]
        header = " | ".join(ld.CLASSES) + " |"
        rule = "|---" * (len(ld.CLASSES) + 1) + "|"
        lines += ["| test | " + header, rule]
        for t, a in ev["lopo"]["pooled"].items():
            cells = [f"{a['per_activity'].get(c, float('nan')):.2f}" for c in ld.CLASSES]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        nat = ev["lopo"]["pooled"]["native"]["predicted"]
        lines += ["", "Native windows, what each activity is labelled (rows: truth):", ""]
        lines += ["| truth | " + header, rule]
        for a in ld.CLASSES:
            row = nat.get(a, {})
            lines.append(f"| {a} | " + " | ".join(str(row.get(c, 0)) for c in ld.CLASSES) + " |")
        lines += ["", "Leave one dataset out (native recordings of the held-out dataset):", ""]
        lines += ["| held out | trained on | activities | accuracy | per activity | predicted |"]
        lines += ["|---|---|---|---|---|---|"]
        for d, e in ev["lodo"].items():
            for mode in ("multi", "single"):
                if mode not in e:
                    continue
                a = e[mode]
                per = ", ".join(f"{k} {v:.2f}" for k, v in a["per_activity"].items())
                pr = "; ".join(
                    f"{k}→" + ",".join(f"{c}:{n}" for c, n in sorted(v.items()))
                    for k, v in a["predicted"].items()
                )
                tag = "" if mode == "multi" else " (one recording per session)"
                lines.append(
                    f"| {d}{tag} | {', '.join(e['trained_on'])} | "
                    f"{', '.join(e['classes_known'])} | {a['accuracy']:.3f} | {per} | {pr} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=None, help="where GazeGraph is")
    ap.add_argument("--andersson", type=Path, default=Path("/work/data-cache/andersson"))
    ap.add_argument("--toyreading", type=Path, default=Path("/work/data-cache/toyreading"))
    ap.add_argument("--cache", type=Path, default=Path("/work/data-cache/labels"))
    ap.add_argument("--variants", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--candidates", default="all", help="comma-separated indices or 'all'")
    ap.add_argument("--out", type=Path, default=None, help="write the chosen model here")
    args = ap.parse_args(argv)

    t0 = time.time()
    sources = {"gazegraph": ld.gazegraph(args.data_dir)}
    if (args.andersson / "annotated_data").is_dir():
        sources["andersson2017"] = ld.andersson2017(args.andersson)
    if (args.toyreading / "data").is_dir():
        sources["toyreading"] = ld.toyreading(args.toyreading)
    log(f"datasets: {sorted(sources)}")
    tab = ld.build_table(sources, args.variants, args.seed, args.cache, log)
    log(f"{len(tab.X)} windows in {time.time() - t0:.0f} s")
    picked = (
        CANDIDATES
        if args.candidates == "all"
        else tuple(CANDIDATES[int(i)] for i in args.candidates.split(","))
    )
    res: dict[str, Any] = {
        "gazeguard_version": __version__,
        "date": time.strftime("%Y-%m-%d"),
        "variants": args.variants,
        "seed": args.seed,
        "every": args.every,
        "datasets": {n: vars(ld.SOURCES[n]) for n in sources},
        "windows": {
            f"{d}/{a}": int(((tab.dataset == d) & (tab.activity == a)).sum())
            for d in sorted(set(tab.dataset.tolist()))
            for a in ld.CLASSES
            if ((tab.dataset == d) & (tab.activity == a)).any()
        },
        "mapping": {f"{d}/{t}": a for (d, t), a in ld.ACTIVITY.items() if d in sources},
        "candidates": {},
    }
    gg = sources["gazegraph"]
    heads = {
        who: headset_rows([r for r in gg if r.person == who], args.seed + i)
        for i, who in enumerate(sorted({r.person for r in gg}))
    }
    log(f"headset changes extracted ({time.time() - t0:.0f} s)")
    for cfg in picked:
        ev = {
            "lopo": evaluate_lopo(cfg, tab, heads, args.every, args.seed),
            "lodo": evaluate_lodo(cfg, tab, args.every),
        }
        ev["score"] = score(ev, cfg.session is not None)
        res["candidates"][cfg.name] = ev
        log(f"{cfg.name}: score {ev['score']:.3f} ({time.time() - t0:.0f} s)")
    chosen = max(picked, key=lambda c: res["candidates"][c.name]["score"])
    res["chosen"] = chosen.name
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "portable.json").write_text(json.dumps(res, indent=1) + "\n")
    (RESULTS / "portable.md").write_text(markdown(res))
    log(f"chosen: {chosen.name}; tables in {RESULTS / 'portable.md'}")
    if args.out is not None:
        model = fit(chosen, tab, args.every, name="activity-portable")
        ev = res["candidates"][chosen.name]
        spec = model.spec.model_copy(
            update={
                "version": "1.0",
                "profile": "activity",
                "trained": {
                    **model.spec.trained,
                    "configuration": chosen.name,
                    "datasets": {n: vars(ld.SOURCES[n]) for n in sources},
                    "activity_mapping": res["mapping"],
                    "augmentation": f"{args.variants} simulated devices per person (seed "
                    f"{args.seed}): rate 30-1000 Hz (at most 8x the source rate), gain "
                    "log-uniform 1/4-4 with +-15 % anisotropy, white noise up to "
                    "0.5*sqrt(30/rate) deg, offset +-3 deg; features re-extracted",
                    "sample_weight": "each (dataset, activity) pair weighs the same in total",
                    "lopo_window_accuracy": ev["lopo"]["mean"]["native"]["multi"],
                    "lopo": ev["lopo"]["mean"],
                    "lodo": {
                        d: {k: e[k]["accuracy"] for k in ("multi", "single") if k in e}
                        | {"activities": e["classes_known"]}
                        for d, e in ev["lodo"].items()
                    },
                    "script": "bench/train_label_model.py",
                },
            }
        )
        LabelModel(spec).save(args.out)
        log(f"model written to {args.out}")
    log(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
