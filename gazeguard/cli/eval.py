"""``gazeguard eval``: the privacy–utility evaluation (:mod:`gazeguard.eval`) from the command line.

Needs the ``eval`` extra (scikit-learn, scipy, matplotlib): ``pip install 'gazeguard[eval]'``;
without it the command says so in one line.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gazeguard.cli._common import ExitCode, get_console, stdout
from gazeguard.errors import ConfigError
from gazeguard.eval.attacks import CLASSIFIERS
from gazeguard.eval.datasets import open_dataset
from gazeguard.eval.grid import (
    FULL_MECHANISMS,
    PAPER_EPSILONS,
    QUICK_EPSILONS,
    QUICK_MECHANISMS,
    MechanismSpec,
    parse_mechanism,
)
from gazeguard.eval.harness import EvalSettings
from gazeguard.eval.paper import NOT_PRIVATE
from gazeguard.eval.report import markdown, read_json, write_json, write_markdown, write_plots
from gazeguard.eval.runner import GridConfig, evaluate_dataset

DESCRIPTION = """\
Privacy-utility evaluation of gazeguard's mechanisms on recorded and simulated gaze, following
Bozkir et al. (PLOS ONE 2021) and David-John et al. (ETRA 2022).

Pipeline per dataset: raw gaze -> the service's own feature extraction (window W, step s; cached)
-> each mechanism applied per recording (LPA/CFPA/DCFPA on consecutive chunks of n steps, the
incomplete tail dropped as the live service does; FPA on the whole recording), or to the whole
table for the dataset releases of David-John et al. (k-same-select, plausible-deniability
Marginals, Exponential-DP) -> utility and attacks:
  * utility: NMSE and 1/|NMSE| per feature (paper eqs 4-6), averaged over recordings and noisy
    repetitions, then over features; also RMSE as a fraction of each feature's public range;
  * task recognition, leave one person out (utility), and person re-identification, first half
    of every recording trains and the second half tests (the attack), each with k-NN (k=11),
    SVM (RBF, C=1), decision tree and random forest (10 trees), features standardised on the
    training rows, scored per window and after a majority vote per recording;
  * re-identification also under David-John et al.'s protocol: train on the release, test on raw;
  * temporal correlation of raw vs first-difference feature signals (paper Figs 3-6).
epsilon is per feature per chunk; every row also reports the honest user-level epsilon of one
whole released recording (epsilon x features x chunks, sequential composition).

Datasets: gazegraph (8 people x 6 desktop activities, Pupil Core 30 Hz), irf (6 people, EyeLink
1000 Hz, one task: re-identification only), synthetic (gazeguard's simulated headset), csv:PATH
(a CSV file or directory: t,x,y[,pupil],person,task[,recording]; degrees, or normalised with
--csv-units norm --fov H,V) and table:PATH (a precomputed feature table, CSV/NPZ/Parquet).

Output in --out: results.json (every number), results.md (tables in the paper's layout: rows
mechanism, columns k-NN|SVM|DT|RF per epsilon; best configuration by "re-identification at chance
(within --tolerance of 1/people) with the highest task accuracy"), and PNG plots per dataset
(utility vs epsilon; re-identification and task accuracy vs epsilon with chance marked;
correlation).

Noise comes from the OS CSPRNG unless --insecure-seed is given (reproducible, NOT private).
"""

EPILOG = """\
examples:
  gazeguard eval --quick                                  # small grid, a few minutes
  gazeguard eval --dataset gazegraph --jobs 2 --out bench/results/eval
  gazeguard eval --dataset synthetic --mechanisms dcfpa-64-dft,dcfpa-64-dct --epsilons 0.48,4.8
  gazeguard eval --dataset csv:my_recordings/ --csv-units norm --fov 90,60
"""


def _floats(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 0.48,2.4") from exc
    if not vals or any(not (v > 0 and v < float("inf")) for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: every epsilon must be a finite number > 0")
    return vals


def _pair(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        a, b = (float(p) for p in parts)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected two numbers like 90,60") from exc
    return a, b


def _k(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        k = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 'auto' or an integer") from exc
    if k < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: k must be >= 1")
    return k


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard eval``."""
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    g = parser.add_argument_group("what to evaluate")
    g.add_argument(
        "--dataset",
        action="append",
        metavar="NAME",
        help="gazegraph, irf, synthetic, csv:PATH or table:PATH; repeat for several "
        "(default: gazegraph and synthetic)",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help=f"small grid ({', '.join(QUICK_MECHANISMS)}; epsilon "
        f"{','.join(f'{e:g}' for e in QUICK_EPSILONS)}), 10 utility and 1 classification "
        "repetitions, a shorter synthetic dataset; a few minutes on 2 cores",
    )
    g.add_argument(
        "--mechanisms",
        metavar="LIST",
        help="comma-separated: none, lpa[-N], fpa[-dft|-dct], cfpa-N[-dft|-dct], "
        "dcfpa-N[-dft|-dct] (stream mechanisms, per recording) and the dataset releases "
        "ksame-K, marginals-K-GAMMA, expdp (default: none, lpa-32, fpa and cfpa/dcfpa-"
        "{32,64,128} each with dft and dct, ksame-{2,4,8}, marginals-{2,4,8}-{2,4}, expdp)",
    )
    g.add_argument(
        "--epsilons",
        type=_floats,
        metavar="LIST",
        help="epsilon per feature per chunk, comma-separated (default: "
        f"{','.join(f'{e:g}' for e in PAPER_EPSILONS)})",
    )
    g.add_argument(
        "--sensitivity",
        choices=("public", "paper"),
        default="public",
        help="public: sensitivities from the registry's public bounds (the product's "
        "guarantee; default). paper: Bozkir et al.'s eq. 7 sensitivity and per-chunk 'optimal "
        "k', both read off the data being released (CFPA/DCFPA only) -- NOT differentially "
        "private, to test whether they explain the paper's results",
    )
    g.add_argument(
        "--k",
        type=_k,
        default="auto",
        help="kept frequency coefficients: 'auto' (from the package's public prior spectrum, "
        "never from the data; default) or an integer <= n/2",
    )
    r = parser.add_argument_group("repetitions and protocol")
    r.add_argument(
        "--utility-reps",
        type=int,
        metavar="N",
        help="noisy repetitions for utility (100; quick 10)",
    )
    r.add_argument(
        "--clf-reps",
        type=int,
        metavar="N",
        help="noisy repetitions for the classification protocols (3; quick 1)",
    )
    r.add_argument(
        "--classifiers",
        default=",".join(CLASSIFIERS),
        help=f"subset of {','.join(CLASSIFIERS)} (default: all)",
    )
    r.add_argument(
        "--every-task",
        type=int,
        default=10,
        metavar="N",
        help="task recognition trains/tests on every N-th window (paper: 10)",
    )
    r.add_argument(
        "--every-reid",
        type=int,
        default=5,
        metavar="N",
        help="re-identification trains/tests on every N-th window (paper: 5)",
    )
    r.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="'at chance' means re-identification <= 1/people + this (default 0.02)",
    )
    r.add_argument(
        "--insecure-seed",
        type=int,
        metavar="SEED",
        help="INSECURE: reproducible noise from this seed instead of the OS CSPRNG",
    )
    d = parser.add_argument_group("data and features")
    d.add_argument(
        "--data-dir",
        type=Path,
        help="recorded datasets (default: $GAZEGUARD_DATA, ./data or ../shared/data)",
    )
    d.add_argument("--window", type=float, default=30.0, help="feature window W, s (30)")
    d.add_argument("--step", type=float, default=0.5, help="feature step, s (0.5)")
    d.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "gazeguard" / "eval",
        help="feature cache (default ~/.cache/gazeguard/eval)",
    )
    d.add_argument("--no-cache", action="store_true", help="always extract features afresh")
    d.add_argument("--synthetic-people", type=int, help="simulated people (8; quick 6)")
    d.add_argument(
        "--synthetic-duration", type=float, help="seconds per simulated recording (300; quick 150)"
    )
    d.add_argument("--synthetic-rate", type=float, default=60.0, help="simulated rate, Hz (60)")
    d.add_argument("--csv-units", choices=("deg", "norm"), default="deg", help="units of csv:PATH")
    d.add_argument(
        "--fov", type=_pair, metavar="H,V", help="field of view for --csv-units norm, deg"
    )
    o = parser.add_argument_group("running and output")
    o.add_argument("--out", type=Path, default=Path("gazeguard-eval"), help="output directory")
    o.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="no evaluation: rewrite results.md and the plots in --out from an existing "
        "results.json",
    )
    o.add_argument(
        "--jobs", type=int, help="worker processes, one configuration each (default 1; quick 2)"
    )


def _mechanisms(text: str | None, quick: bool) -> list[MechanismSpec]:
    names = text.split(",") if text else list(QUICK_MECHANISMS if quick else FULL_MECHANISMS)
    specs = [parse_mechanism(n) for n in names if n.strip()]
    if not specs:
        raise ConfigError("mechanisms", text, "no mechanism given", "argument")
    return specs


def _render(source: Path, out: Path) -> int:
    if not source.is_file():
        raise ConfigError("render", str(source), "file not found", "argument")
    results = read_json(source)
    write_markdown(results, out / "results.md")
    for res in results:
        write_plots(res, out)
    stdout(f"rendered {out / 'results.md'} and plots in {out} from {source}")
    return ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; write JSON, Markdown and PNGs to ``--out``; return 0."""
    if args.render is not None:
        return _render(args.render, args.out)
    quick = bool(args.quick)
    classifiers = tuple(c.strip() for c in args.classifiers.split(",") if c.strip())
    unknown = [c for c in classifiers if c not in CLASSIFIERS]
    if unknown or not classifiers:
        raise ConfigError("classifiers", args.classifiers, f"choose from {','.join(CLASSIFIERS)}")
    for name in ("utility_reps", "clf_reps", "jobs", "every_task", "every_reid"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(name.replace("_", "-"), v, "must be >= 1", "argument")
    settings = EvalSettings(
        utility_reps=args.utility_reps or (10 if quick else 100),
        clf_reps=args.clf_reps or (1 if quick else 3),
        classifiers=classifiers,
        every_task=args.every_task,
        every_reid=args.every_reid,
        insecure_seed=args.insecure_seed,
    )
    grid = GridConfig(
        mechanisms=_mechanisms(args.mechanisms, quick),
        epsilons=args.epsilons or list(QUICK_EPSILONS if quick else PAPER_EPSILONS),
        k=args.k,
        settings=settings,
        window_s=args.window,
        step_s=args.step,
        jobs=args.jobs or (2 if quick else 1),
        cache_dir=None if args.no_cache else args.cache_dir,
        tolerance=args.tolerance,
        sensitivity=args.sensitivity,
    )
    datasets = [
        open_dataset(
            spec,
            args.data_dir,
            synthetic_people=args.synthetic_people or (6 if quick else 8),
            synthetic_duration_s=args.synthetic_duration or (150.0 if quick else 300.0),
            synthetic_rate_hz=args.synthetic_rate,
            csv_units=args.csv_units,
            fov_deg=args.fov,
        )
        for spec in (args.dataset or ["gazegraph", "synthetic"])
    ]
    console = get_console()
    if args.sensitivity == "paper":
        console.warn(f"WARNING: --sensitivity paper: {NOT_PRIVATE}")
    if args.insecure_seed is not None:
        console.warn(
            f"WARNING: --insecure-seed {args.insecure_seed}: noise is reproducible and NOT private"
        )
    t0 = time.perf_counter()
    results = []
    out: Path = args.out
    written: list[dict[str, object]] = []
    for ds in datasets:
        results.append(evaluate_dataset(ds, grid))
        # Written after every dataset so a long run leaves usable partial output; tables and
        # plots are drawn from the JSON as written, so they show exactly its (rounded) numbers.
        written = read_json(write_json(results, out / "results.json"))
        write_markdown(written, out / "results.md")
        write_plots(written[-1], out)
    stdout(markdown(written))
    stdout(
        f"\nwrote {out / 'results.json'}, {out / 'results.md'} and plots in {out} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return ExitCode.OK
