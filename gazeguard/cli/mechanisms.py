"""``gazeguard mechanisms {show,model,estimate}``: inspect or regenerate the
public prior
that ``k="auto"`` optimises against (:mod:`gazeguard.privacy.mechanisms.prior`)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gazeguard.cli._common import ExitCode, stdout
from gazeguard.config import FeatureSettings, MechanismSettings
from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.core.words import counted
from gazeguard.plan import chunk_counter
from gazeguard.plan.chunks import rank_mechanisms
from gazeguard.privacy.mechanisms.auto_k import choose_k
from gazeguard.privacy.mechanisms.bounds import Bounds
from gazeguard.privacy.mechanisms.prior import (
    DEFAULT_PATH,
    TABLE_SIZES,
    FloatArray,
    PriorSpectrum,
    estimate_prior,
    model_prior,
)
from gazeguard.privacy.mechanisms.registry import MECHANISMS, TRANSFORMS
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES, feature_bounds

OUT_HELP = (
    f"where to write the prior (default ./{DEFAULT_PATH.name}: never the installed one, which "
    "k='auto' reads)"
)
REPLACE_HELP = (
    "overwrite the prior installed with gazeguard, which every k='auto' and mechanism='auto' "
    "reads. Only with public or simulated features: a prior estimated from users' features "
    "makes k depend on their data"
)
#: ε per feature per chunk of the ``show`` table (the paper's grid).
EPSILON_GRID = (0.48, 2.4, 4.8, 24.0, 48.0)


def load_bounds(path: Path, names: Sequence[str]) -> tuple[FloatArray, FloatArray]:
    """``(lo, hi)`` per feature of ``names`` from a JSON file ``{"feat": {"lo":, "hi":}}``."""
    try:
        doc = json.loads(path.read_text())
        lo = np.array([float(doc[n]["lo"]) for n in names])
        hi = np.array([float(doc[n]["hi"]) for n in names])
    except FileNotFoundError as exc:
        raise DatasetError(path, "bounds file not found") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(
            path, f'needs {{"<feature>": {{"lo": .., "hi": ..}}}} for every feature: {exc}'
        ) from exc
    return lo, hi


def show(prior: PriorSpectrum) -> None:
    """Print a prior's summary and the k that ``k="auto"`` picks per mechanism, n and ε."""
    stdout(f"source: {prior.source}")
    stdout(f"mean {prior.mean:.4g}, std {math.sqrt(prior.variance):.4g} (units of R), lags")
    stdout(f"{prior.autocorrelation.size}; r(1) = {prior.autocorrelation[1]:.4f}")
    stdout("k chosen by k='auto' (R = 1, max_step = R/30):")
    stdout(f"{'mechanism':>9} {'tr':>3} {'n':>4} " + " ".join(f"eps={e:<5g}" for e in EPSILON_GRID))
    bounds = Bounds(0.0, 1.0, 1.0 / 30)
    for name in (k for k, v in MECHANISMS.items() if v.online and v.transformed):
        for tr in TRANSFORMS:
            for n in TABLE_SIZES:
                ks = [
                    choose_k(name, n, tr, bounds, np.array([e]), prior=prior) for e in EPSILON_GRID
                ]
                stdout(f"{name:>9} {tr:>3} {n:>4} " + " ".join(f"{k:<9d}" for k in ks))


def show_budget(args: argparse.Namespace) -> None:
    """Rank every mechanism for a budget per hour and a release profile (``mechanism = "auto"``
    takes the first row)."""

    names = [f.strip() for f in args.features.split(",")] if args.features else list(NAMES)
    lo, hi, max_step = feature_bounds(names, args.window_s, args.step_s)
    counter = chunk_counter(
        FeatureSettings(window_s=args.window_s, step_s=args.step_s), args.max_chunk_steps or 128
    )
    ranked = rank_mechanisms(
        MechanismSettings(features=names), names, Bounds(lo=lo, hi=hi, max_step=max_step),
        args.step_s, budget=args.budget_per_hour, chunks_for=counter, delta=args.delta,
        max_chunk_steps=args.max_chunk_steps,
    )  # fmt: skip
    stdout(
        f"user-level ε {args.budget_per_hour:g} per hour of gaze at δ {args.delta:g}, "
        f"{counted(len(names), 'feature')}, W = {args.window_s:g} s, s = {args.step_s:g} s. "
        "Expected RMS error per value as a multiple of each feature's range (public prior, "
        "before clipping to [lo, hi]: above ~0.3 a value is mostly noise):"
    )
    for i, c in enumerate(ranked[: args.top]):
        stdout(f"{'auto →' if i == 0 else '':>6} {c.describe()}")


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard mechanisms``."""
    parser.description = "Inspect or regenerate the public prior; rank mechanisms for a budget."
    sub = parser.add_subparsers(dest="action", required=True)
    show_p = sub.add_parser("show", help="summarise a prior and the k that auto picks")
    show_p.add_argument("--prior", type=Path, default=DEFAULT_PATH)
    show_p.add_argument(
        "--budget-per-hour",
        type=float,
        help="rank mechanism, transform, n, k and noise family for this user-level ε per hour "
        "of gaze (what mechanism.name = 'auto' picks) instead of the prior's k table",
    )
    show_p.add_argument("--delta", type=float, default=1e-6, help="δ of the budget (1e-6)")
    show_p.add_argument("--features", help="comma-separated release profile (default: all 48)")
    show_p.add_argument("--window-s", type=float, default=30.0, help="feature window W, s")
    show_p.add_argument("--step-s", type=float, default=0.5, help="feature step s, s")
    show_p.add_argument(
        "--max-chunk-steps", type=int, default=128, help="longest chunk considered (steps)"
    )
    show_p.add_argument("--top", type=int, default=10, help="rows to print (10)")
    model = sub.add_parser("model", help="write the documented model prior")
    model.add_argument("--out", type=Path, default=Path(DEFAULT_PATH.name), help=OUT_HELP)
    model.add_argument("--replace-installed", action="store_true", help=REPLACE_HELP)
    est = sub.add_parser("estimate", help="estimate a prior from FeatureTable files")
    est.add_argument("tables", type=Path, nargs="+", help="FeatureTable files (.npz/.csv)")
    est.add_argument("--bounds", type=Path, required=True, help='JSON {"feat": {"lo":, "hi":}}')
    est.add_argument("--max-lag", type=int, default=2048)
    est.add_argument("--out", type=Path, default=Path(DEFAULT_PATH.name), help=OUT_HELP)
    est.add_argument("--replace-installed", action="store_true", help=REPLACE_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    """``gazeguard mechanisms`` with its own parser (tests and scripts)."""
    parser = argparse.ArgumentParser(prog="gazeguard mechanisms")
    configure(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """``gazeguard mechanisms {show,model,estimate}``: inspect or regenerate the prior."""
    if args.action == "show":
        if args.budget_per_hour is not None:
            show_budget(args)
        else:
            show(PriorSpectrum.load(args.prior))
        return ExitCode.OK
    if args.action == "model":
        prior = model_prior()
    else:
        recs: list[FloatArray] = []
        lo = hi = np.zeros(0)
        for path in args.tables:
            table = FeatureTable.load(path)
            lo, hi = load_bounds(args.bounds, table.feature_names)
            recs.extend(table.X[rows].T for _, rows in table.recordings())
        names = ", ".join(p.name for p in args.tables)
        prior = estimate_prior(recs, lo, hi, args.max_lag, source=f"estimated from {names}")
    out = DEFAULT_PATH if args.replace_installed else args.out
    if not args.replace_installed and out.resolve() == DEFAULT_PATH.resolve():
        raise ConfigError(
            "--out",
            str(out),
            "is the installed prior that k='auto' reads; pass --replace-installed to overwrite "
            "it deliberately (public or simulated features only), or choose another path",
        )
    stdout(f"wrote {prior.save(out)}: {prior.source}")
    if out != DEFAULT_PATH:
        stdout(f"use it with: gazeguard mechanisms show --prior {out}")
    return ExitCode.OK
