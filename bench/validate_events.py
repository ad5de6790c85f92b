"""Event detection against human coders, and the feature registry's step bounds on recordings.

Tracks two things, on the real recordings in ``../shared/data``:

1. **Sample-level Cohen's kappa** of fixation and saccade labels versus each human coder, for
   gazeguard's incremental I-VT (``gazeguard.signal.events``, defaults: 30 deg/s, 5 ms velocity
   half-width, 40 ms minimum fixation, 10 ms minimum saccade) and, in the same run, for
   pymovements' I-VT (``pymovements.events.ivt`` on ``pos2vel(method="smooth")`` velocities,
   same 30 deg/s threshold and 40 ms minimum fixation). pymovements' I-VT returns fixations only;
   its saccade samples are the I-VT complement: valid samples at or above the threshold. Kappa
   is binary per event type (the type vs. everything else) over all samples of a dataset pooled.
   pymovements' default five-point differentiator spans ±2 samples whatever the rate; at
   1000 Hz noise then exceeds 30 deg/s often enough to break up fixations (irf S5 keeps 4% of
   its samples as fixation against the coder's 93%); gazeguard smooths over ±5 ms instead.

   - ``andersson2017_annotated`` (Andersson et al. 2017; 500 Hz SMI HiSpeed; coders MN and RA;
     pixels → degrees with the screen size, resolution and viewing distance stored in each file;
     x = y = 0 marks lost samples), per stimulus type (img, dots, video) and pooled. Humans
     label smooth pursuit separately; I-VT calls it fixation, which caps fixation kappa on
     ``dots`` and ``video``.
   - ``irf_lookAtPoint_EL`` (Zemblys et al. 2018; EyeLink 1000 Hz; one coder), without S3 whose
     saccades and blinks were only coded approximately (see its upstream README).

2. **Step-bound exceedance**: for each feature, the fraction of consecutive steps whose change
   exceeds the registry's ``max_step`` (W = 30 s, s = 0.5 s), on irf, GazeGraph (30 Hz, read
   through ``gazeguard.offline.eval.datasets``) and simulated people
   (``gazeguard.runtime.simulate``). Larger
   changes are clipped in the difference domain by DCFPA; this shows how often that happens.

Run: ``python bench/validate_events.py [--no-bounds]``; prints the tables and writes
``bench/results/event_validation.json``. ``tests/signal/test_event_validation.py`` imports
:func:`kappa_table` from this file, so the test and the benchmark measure the same thing.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.signal.events import EventDetector, EventKind, detect_events

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results" / "event_validation.json"
THRESHOLD_DEG_S = 30.0
MIN_FIXATION_S = 0.04
IRF_RATE_HZ = 1000.0  # EyeLink 1000 Plus, declared (as gazeguard.offline.eval.datasets.IRF_RATE_HZ)
FIX, SAC = 1, 2  # label codes shared by both datasets and gazeguard.signal.events.EventKind
assert int(EventKind.FIXATION) == FIX
assert int(EventKind.SACCADE) == SAC

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Labelled:
    """One recording with one coder's per-sample labels (1 fixation, 2 saccade, other: other)."""

    dataset: str
    category: str
    name: str
    coder: str
    t: FloatArray  # s
    x: FloatArray  # deg, NaN where invalid
    y: FloatArray
    labels: IntArray
    rate: float  # the tracker's declared sampling rate, Hz (the detector is built for it)


def cohen_kappa(a: npt.NDArray[np.bool_], b: npt.NDArray[np.bool_]) -> float:
    """Cohen's kappa of two binary labelings of the same samples."""
    po = float(np.mean(a == b))
    pa, pb = float(np.mean(a)), float(np.mean(b))
    pe = pa * pb + (1 - pa) * (1 - pb)
    return 1.0 if pe == 1.0 else (po - pe) / (1 - pe)


def andersson_gaze(path: Path) -> tuple[npt.NDArray[Any], FloatArray, FloatArray, float]:
    """One Andersson et al. 2017 ``.mat`` file: its sample rows (``ETdata.pos``), the gaze in
    degrees from the stored screen geometry (NaN where lost) and the sampling rate, Hz."""
    import scipy.io  # noqa: PLC0415 - only this loader needs it

    et = scipy.io.loadmat(path)["ETdata"]
    pos = et["pos"][0, 0]
    width_m, height_m = et["screenDim"][0, 0].ravel()
    res_x, res_y = et["screenRes"][0, 0].ravel()
    dist_m = float(et["viewDist"][0, 0].ravel()[0])
    rate = float(et["sampFreq"][0, 0].ravel()[0])
    lost = (pos[:, 3] == 0) & (pos[:, 4] == 0)
    x = np.degrees(np.arctan((pos[:, 3] - res_x / 2) * (width_m / res_x) / dist_m))
    y = -np.degrees(np.arctan((pos[:, 4] - res_y / 2) * (height_m / res_y) / dist_m))
    x[lost] = np.nan
    y[lost] = np.nan
    return pos, x, y, rate


def load_andersson(path: Path) -> Labelled:
    """One ``*_labelled_{coder}.mat`` file; time from the sample index (the stored timestamps
    are NaN or wrap in some files), gaze in degrees from the stored screen geometry."""
    pos, x, y, rate = andersson_gaze(path)
    stem = path.stem  # e.g. TH34_img_Europe_labelled_MN
    return Labelled(
        "andersson2017",
        path.parent.name,
        stem.rsplit("_labelled_", 1)[0],
        stem.rsplit("_", 1)[1],
        np.arange(len(pos)) / rate,
        x,
        y,
        pos[:, 5].astype(np.int64),
        rate,  # the file's sampFreq: 500 Hz (SMI HiSpeed)
    )


def load_irf(path: Path) -> Labelled:
    """One ``lookAtPoint_EL_S*.npy`` (or an excerpt array with the same dtype)."""
    return irf_labelled(np.load(path), path.stem)


def irf_labelled(a: npt.NDArray[Any], name: str) -> Labelled:
    """Wrap an irf structured array (t, x, y, status, evt); ``status == False`` is invalid."""
    x = a["x"].astype(np.float64)
    y = a["y"].astype(np.float64)
    x[~a["status"]] = np.nan
    y[~a["status"]] = np.nan
    labels = a["evt"].astype(np.int64)
    return Labelled("irf", "lookAtPoint", name, "coder", a["t"], x, y, labels, IRF_RATE_HZ)


def gazeguard_labels(rec: Labelled) -> IntArray:
    """Per-sample labels from gazeguard's incremental detector (defaults, at the declared rate)."""
    _, labels = detect_events(rec.t, rec.x, rec.y, detector=EventDetector(rate_hz=rec.rate))
    return labels.astype(np.int64)


def pymovements_labels(rec: Labelled) -> IntArray:
    """Per-sample labels from pymovements' I-VT (fixations) and its velocity (saccades)."""
    import pymovements as pm  # noqa: PLC0415 - test-only dependency
    from pymovements.transforms.numpy import pos2vel  # noqa: PLC0415

    rate = 1.0 / float(np.median(np.diff(rec.t)))
    vel = pos2vel(np.column_stack((rec.x, rec.y)), sampling_rate=rate, method="smooth")
    events = pm.events.ivt(
        vel,
        minimum_duration=round(MIN_FIXATION_S * rate),
        velocity_threshold=THRESHOLD_DEG_S,
    )
    labels = np.zeros(len(rec.t), dtype=np.int64)
    speed = np.hypot(vel[:, 0], vel[:, 1])
    labels[np.isfinite(speed) & (speed >= THRESHOLD_DEG_S)] = SAC
    frame = events.frame
    for on, off in zip(frame["onset"].to_list(), frame["offset"].to_list(), strict=True):
        labels[on : off + 1] = FIX  # onset and offset are inclusive sample indices
    return labels


def kappa_table(recordings: list[Labelled]) -> list[dict[str, Any]]:
    """Rows (dataset, category, coder, detector, event, kappa, samples), pooled per category
    and over all categories of a dataset (category ``all``)."""
    groups: dict[tuple[str, str, str], list[tuple[IntArray, IntArray, IntArray]]] = {}
    for rec in recordings:  # each coder's file (their lengths differ by a few samples)
        part = (rec.labels, gazeguard_labels(rec), pymovements_labels(rec))
        for cat in (rec.category, "all"):
            groups.setdefault((rec.dataset, cat, rec.coder), []).append(part)
    cats: dict[str, set[str]] = {}
    for dataset, cat, _ in groups:
        cats.setdefault(dataset, set()).add(cat)
    rows = []
    for (dataset, cat, coder), parts in sorted(groups.items()):
        if cat == "all" and len(cats[dataset]) == 2:  # one category: "all" would repeat it
            continue
        human = np.concatenate([p[0] for p in parts])
        for det, j in (("gazeguard", 1), ("pymovements", 2)):
            pred = np.concatenate([p[j] for p in parts])
            for event, code in (("fixation", FIX), ("saccade", SAC)):
                rows.append(
                    {
                        "dataset": dataset,
                        "category": cat,
                        "coder": coder,
                        "detector": det,
                        "event": event,
                        "kappa": round(cohen_kappa(pred == code, human == code), 4),
                        "samples": int(human.size),
                    }
                )
    return rows


def shared_recordings(data: Path) -> list[Labelled]:
    """Every labelled recording of both datasets under ``data``."""
    recs = [load_andersson(p) for p in sorted((data / "andersson2017_annotated").glob("*/*.mat"))]
    irf = sorted((data / "irf_lookAtPoint_EL").glob("lookAtPoint_EL_S*.npy"))
    recs += [load_irf(p) for p in irf if not p.stem.endswith("S3")]
    return recs


def bound_exceedance(data: Path) -> list[dict[str, Any]]:
    """Per feature and dataset: fraction of consecutive steps changing by more than max_step."""
    from gazeguard.offline.eval.datasets import open_dataset  # noqa: PLC0415 - bench-only helper
    from gazeguard.signal.features import FEATURES, extract_features, feature_bounds  # noqa: PLC0415

    _, _, max_step = feature_bounds()
    rows = []
    for spec in ("irf", "gazegraph", "synthetic"):
        ds = open_dataset(spec, data, synthetic_people=6, synthetic_duration_s=240.0)
        diffs = []
        for rec in ds.recordings():
            s = rec.samples
            pupil = s.pupil_mm if np.isfinite(s.pupil_mm).any() else None
            X, _ = extract_features(s.timestamps, s.x_deg, s.y_deg, pupil, rate_hz=rec.rate_hz)
            if len(X) > 1:
                diffs.append(np.abs(np.diff(X, axis=0)))
        d = np.vstack(diffs)
        for i, f in enumerate(FEATURES):
            rows.append(
                {
                    "dataset": spec,
                    "feature": f.name,
                    "max_step": float(max_step[i]),
                    "exceed_fraction": round(float(np.mean(d[:, i] > max_step[i] * (1 + 1e-9))), 5),
                    "p999_over_max_step": round(
                        float(np.quantile(d[:, i], 0.999) / max_step[i]), 4
                    ),
                    "steps": int(d.shape[0]),
                }
            )
    return rows


def _print_kappa(rows: list[dict[str, Any]]) -> None:
    print("Sample-level Cohen's kappa vs human coders (I-VT 30 deg/s, min fixation 40 ms)")
    print(f"{'dataset':14s} {'category':12s} {'coder':6s} {'event':9s} "
          f"{'gazeguard':>9s} {'pymovements':>11s} {'diff':>6s} {'samples':>8s}")  # fmt: skip
    by = {(r["dataset"], r["category"], r["coder"], r["event"], r["detector"]): r for r in rows}
    for (ds, cat, coder, event, det), r in by.items():
        if det != "gazeguard":
            continue
        pm = by[(ds, cat, coder, event, "pymovements")]["kappa"]
        print(f"{ds:14s} {cat:12s} {coder:6s} {event:9s} {r['kappa']:9.3f} {pm:11.3f} "
              f"{r['kappa'] - pm:+6.3f} {r['samples']:8d}")  # fmt: skip


def _print_bounds(rows: list[dict[str, Any]]) -> None:
    print("\nSteps whose change exceeds max_step (W = 30 s, s = 0.5 s); shown if any exceed")
    print(f"{'feature':28s} {'dataset':10s} {'max_step':>9s} {'exceed':>8s} {'p99.9/max':>9s}")
    for r in rows:
        if r["exceed_fraction"] > 0:
            print(f"{r['feature']:28s} {r['dataset']:10s} {r['max_step']:9.4g} "
                  f"{r['exceed_fraction']:8.4f} {r['p999_over_max_step']:9.3f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the shared recordings")
    parser.add_argument("--no-bounds", action="store_true", help="skip the step-bound table")
    args = parser.parse_args()
    for sub in ("andersson2017_annotated", "irf_lookAtPoint_EL"):
        if not (args.data / sub).is_dir():
            print(f"recordings not found: {args.data / sub}", file=sys.stderr)
            return 2
    import pymovements  # noqa: PLC0415

    t0 = time.perf_counter()
    kappa = kappa_table(shared_recordings(args.data))
    _print_kappa(kappa)
    bounds = [] if args.no_bounds else bound_exceedance(args.data)
    if bounds:
        _print_bounds(bounds)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "validate_events",
                "python": platform.python_version(),
                "pymovements": pymovements.__version__,
                "parameters": {
                    "velocity_threshold_deg_s": THRESHOLD_DEG_S,
                    "min_fixation_s": MIN_FIXATION_S,
                },
                "kappa": kappa,
                "step_bounds": bounds,
                "seconds": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
