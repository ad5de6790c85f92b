"""``gazeguard eval``: the privacy–utility evaluation (:mod:`gazeguard.offline.eval`) from the
command line.

Needs the ``eval`` extra (scikit-learn, scipy, matplotlib): ``pip install -e '.[eval]' (in the
gazeguard checkout)``; without it the command says so in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gazeguard.cli._common import (
    ExitCode,
    add_feature_arguments,
    epsilon_list,
    get_console,
    kept_coefficients,
    stdout,
)
from gazeguard.cli._recordings import (
    PairAction,
    PairHelpFormatter,
    add_reading_arguments,
    read_options,
)
from gazeguard.core.errors import ConfigError
from gazeguard.offline.eval.attacks import CLASSIFIERS
from gazeguard.offline.eval.cohort import DEFAULT_BUCKET_S
from gazeguard.offline.eval.datasets import (
    PUBLIC_DATASETS,
    DataNotFoundError,
    Dataset,
    MpiiDpEye,
    open_dataset,
)
from gazeguard.offline.eval.frontier import (
    ReleasePoint,
    evaluate_frontier,
    frontier_figure,
    frontier_table,
)
from gazeguard.offline.eval.grid import (
    FULL_MECHANISMS,
    PAPER_EPSILONS,
    QUICK_EPSILONS,
    QUICK_MECHANISMS,
    MechanismSpec,
    parse_mechanism,
)
from gazeguard.offline.eval.harness import EvalSettings
from gazeguard.offline.eval.paper import NOT_PRIVATE
from gazeguard.offline.eval.paper_tables import (
    PAPER_EPS,
    PAPER_MECHANISMS,
    headline,
    run_paper_tables,
    write_results,
)
from gazeguard.offline.eval.paper_tables import render as render_paper_tables
from gazeguard.offline.eval.report import (
    markdown,
    read_json,
    write_json,
    write_markdown,
    write_plots,
)
from gazeguard.offline.eval.runner import GridConfig, evaluate_dataset
from gazeguard.offline.recordings import FORMAT_HELP
from gazeguard.signal.profiles import load_profile

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

Datasets: gazegraph, irf and mpiidpeye (public recordings, below; mpiidpeye-gender makes the
reader's gender the task), synthetic (gazeguard's simulated
headset), csv:PATH (your recordings: a file or a folder of them in any format below; each needs a
person and a task, from its columns or from its path with --labels) and table:PATH (a
precomputed feature table, CSV/NPZ/Parquet). Without --dataset: gazegraph and synthetic, or
synthetic alone (with a note) where the gazegraph files are not found.

Output in --out: results.json (every number), results.md (tables in the paper's layout: rows
mechanism, columns k-NN|SVM|DT|RF per epsilon; best configuration by "re-identification at chance
(within --tolerance of 1/people) with the highest task accuracy"), and PNG plots per dataset
(utility vs epsilon; re-identification and task accuracy vs epsilon with chance marked;
correlation).

Noise comes from the OS CSPRNG unless --insecure-seed is given (reproducible, NOT private).
"""


def _sources() -> str:
    lines = [
        "public recordings (looked for in --data-dir, else $GAZEGUARD_DATA, else ., ./data and",
        "../shared/data; put the download there as it is, zip or folder):",
    ]
    for d in PUBLIC_DATASETS.values():
        lines += textwrap.wrap(
            f"{d.name}: {d.title}. Get {d.download} from {d.url}. Licence: {d.licence}.",
            width=94,
            initial_indent="  ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
    return "\n".join(lines) + "\n"


EPILOG = """\
examples:
  gazeguard eval --quick                                  # small grid, a few minutes
  gazeguard eval --dataset gazegraph --jobs 2 --out bench/results/eval
  gazeguard eval --dataset synthetic --mechanisms dcfpa-64-dft,dcfpa-64-dct --epsilons 0.48,4.8
  gazeguard eval --dataset csv:my_recordings/ --units norm --fov 90,60
  gazeguard eval --dataset csv:exports/ --screen 527,296 --distance 650 --labels '{person}_{task}'
"""


_floats = epsilon_list("0.48,2.4")


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers like 10,100") from exc
    if not vals or any(v < 2 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: every cohort needs at least 2 sessions")
    return vals


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard eval``."""
    parser.description = DESCRIPTION
    parser.epilog = f"{_sources()}\n{FORMAT_HELP}\n{EPILOG}"
    parser.formatter_class = PairHelpFormatter
    _what_to_evaluate(parser)
    _protocol(parser)
    _data(parser)
    _csv_reading(parser)
    _output(parser)


def _what_to_evaluate(parser: argparse.ArgumentParser) -> None:
    """What is evaluated: datasets, mechanisms, the ε grid, the frontier."""
    g = parser.add_argument_group("what to evaluate")
    g.add_argument(
        "--dataset",
        action="append",
        metavar="NAME",
        help="gazegraph, irf, mpiidpeye[:PATH] (document type as the task), "
        "mpiidpeye-gender[:PATH] (gender as the task), synthetic, csv:PATH (your recordings: a "
        "file or folder, formats below) or table:PATH; repeat for several (default: gazegraph "
        "and synthetic; synthetic alone, with a note, where gazegraph is not found)",
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
        help="the ε grid, comma-separated: user-level ε per hour of gaze (default 1,10,100,1000)"
        ", or with --per-chunk ε per feature per chunk (default: "
        f"{','.join(f'{e:g}' for e in PAPER_EPSILONS)})",
    )
    g.add_argument(
        "--per-hour",
        choices=("laplace", "gaussian"),
        help="the noise family calibrated to each user-level ε per hour of gaze at δ 1e-6 by "
        "the accountant, as `gazeguard run` does (default laplace); rows report it and a "
        "recording's user-level ε",
    )
    g.add_argument(
        "--per-chunk",
        action="store_true",
        help="the paper's axis instead: ε per feature per chunk (Bozkir et al.'s tables). Not a "
        "unit a person cares about: one raw sample reaches several chunks and an hour ~230 "
        "(implied by --sensitivity paper)",
    )
    g.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="release only this release profile's features (e.g. activity; gazeguard profile "
        "list), as `gazeguard run --profile` does (default: every feature that varies)",
    )
    g.add_argument(
        "--frontier",
        action="store_true",
        help="every release kind on one privacy-utility plane per dataset: feature streams of "
        "all features and of --profile (default activity), and private labels from the "
        "profile's label model at several decision cadences, and cohort aggregates of the "
        "dataset's recorded people's buckets (--cohort-sessions, --cohort-bucket-s; datasets "
        "with 2+ people and tasks), all at user-level ε per hour "
        "(--per-hour, default laplace; --epsilons, default 1,10,100); writes frontier.md, "
        "frontier.json and DATASET-frontier.png",
    )
    g.add_argument(
        "--cohort-sessions",
        metavar="N,N,...",
        type=_int_list,
        help="--frontier: cohort sizes whose aggregates are measured, members drawn from the "
        "dataset's (person, recording, bucket) units, distinct people first, repeated beyond "
        "the head count (default 10,30,100,1000; with --quick 10,30); a dataset that cannot "
        "hold cohorts (one task or one person) is refused",
    )
    g.add_argument(
        "--cohort-bucket-s",
        metavar="S",
        type=float,
        help="--frontier: cohort bucket length, s of gaze (default 300: fewer buckets per hour, "
        "more ε each; bench/results/eval_cohort.md)",
    )
    g.add_argument(
        "--paper-tables",
        action="store_true",
        help="Bozkir et al. 2021's MPIIDPEye tables (1-3 with majority voting, 6-8 without: "
        "document type, gender, person identification) on --dataset mpiidpeye, each cell ours "
        "(paper), ε per feature per chunk; default grid lpa-32, fpa-dft, cfpa/dcfpa-{32,64,128}"
        "-dft at the paper's ε, 3 noisy repetitions (--clf-reps). Adds its run to "
        "paper-tables.json in --out (replacing one of the same sensitivity) and rewrites "
        "paper-tables.md",
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
        type=kept_coefficients,
        default="auto",
        help="kept frequency coefficients: 'auto' (from the package's public prior spectrum, "
        "never from the data; default) or an integer <= n/2",
    )


def _protocol(parser: argparse.ArgumentParser) -> None:
    """Repetitions, classifiers and the attack protocol."""
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


def _data(parser: argparse.ArgumentParser) -> None:
    """Where recordings are and how features are computed."""
    d = parser.add_argument_group("data and features")
    d.add_argument(
        "--data-dir",
        type=Path,
        help="where the public recordings are (default: $GAZEGUARD_DATA, else ., ./data and "
        "../shared/data)",
    )
    add_feature_arguments(d, "feature cache")
    d.add_argument("--synthetic-people", type=int, help="simulated people (8; quick 6)")
    d.add_argument(
        "--synthetic-duration", type=float, help="seconds per simulated recording (300; quick 150)"
    )
    d.add_argument("--synthetic-rate", type=float, default=60.0, help="simulated rate, Hz (60)")


def _csv_reading(parser: argparse.ArgumentParser) -> None:
    """How ``csv:PATH`` recordings are read."""
    c = parser.add_argument_group("reading csv:PATH recordings (formats below)")
    add_reading_arguments(
        c,
        PairAction,
        "a file",
        "auto (default: from each file's content), csv, pupil, tobii, eyelink or mpiidpeye",
        units_alias="--csv-units",
    )
    c.add_argument(
        "--labels",
        metavar="PATTERN",
        help="person and task from each recording's path where its columns do not give them, "
        "e.g. '{person}_{task}' (file P01_reading.asc) or '{person}/{task}' (P01/reading.csv)",
    )


def _output(parser: argparse.ArgumentParser) -> None:
    """Worker processes, caching and the output directory."""
    o = parser.add_argument_group("running and output")
    o.add_argument("--out", type=Path, default=Path("gazeguard-eval"), help="output directory")
    o.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="no evaluation: rewrite results.md and the plots in --out from an existing "
        "results.json (or paper-tables.md from a paper-tables.json)",
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


def _profile_features(name: str | None) -> tuple[tuple[str, ...] | None, str | None]:
    """The features to release and the profile's name (``None, None``: all features)."""
    if name is None:
        return None, None

    profile = load_profile(name)
    return tuple(profile.features), profile.name


def run_frontier(
    datasets: Sequence[Dataset],
    grid: GridConfig,
    profile: str,
    out: Path,
    *,
    quick: bool,
    cohort_sizes: Sequence[int] | None = None,
    cohort_bucket_s: float | None = None,
) -> int:
    """``gazeguard eval --frontier``: every release kind per dataset on one plane; writes
    ``frontier.json``, ``frontier.md`` and ``DATASET-frontier.png`` in ``out``."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    md: list[str] = ["# Privacy-utility frontier: every release kind at user-level ε per hour", ""]
    for ds in datasets:
        res = evaluate_frontier(
            ds, grid, profile, quick=quick, cohort_sizes=cohort_sizes,
            cohort_bucket_s=cohort_bucket_s or DEFAULT_BUCKET_S,
        )  # fmt: skip
        done.append(res)
        pts = [
            ReleasePoint(**{k: v for k, v in p.items() if k != "kept_above_chance"})
            for p in res["points"]
        ]
        meta = res["meta"]
        common = {
            "chance_task": meta["chance_task"],
            "chance_reid": meta["chance_reid"],
            "tolerance": meta["tolerance"],
        }
        limits = {float(b): v for b, v in res["label_limits"].items()}
        md += [*frontier_table(ds.name, pts, limits=limits, cohort=res["cohort"], **common), ""]
        frontier_figure(ds.name, pts, path=out / f"{ds.name}-frontier.png", **common)
        # written after every dataset so a long run leaves usable partial output
        (out / "frontier.json").write_text(json.dumps(done, indent=1, default=str) + "\n")
        (out / "frontier.md").write_text("\n".join(md) + "\n")
    stdout("\n".join(md))
    stdout(
        f"\nwrote {out / 'frontier.json'}, {out / 'frontier.md'} and "
        + ", ".join(f"{d['dataset']}-frontier.png" for d in done)
        + f" in {out} ({time.perf_counter() - t0:.0f} s)"
    )
    return ExitCode.OK


def _render(source: Path, out: Path) -> int:
    if not source.is_file():
        raise ConfigError("render", str(source), "file not found", "argument")
    if '"runs"' in source.read_text()[:20]:  # --paper-tables output
        stdout(f"rendered {render_paper_tables(source, out)} from {source}")
        return ExitCode.OK
    results = read_json(source)
    write_markdown(results, out / "results.md")
    for res in results:
        write_plots(res, out)
    stdout(f"rendered {out / 'results.md'} and plots in {out} from {source}")
    return ExitCode.OK


def _axis(args: argparse.Namespace) -> str | None:
    """The noise family calibrated per hour of gaze (the honest axis, the default), or ``None``
    for the paper's per-chunk axis (``--per-chunk``, or implied by ``--sensitivity paper``,
    which is defined per chunk)."""
    if args.per_chunk and args.per_hour:
        raise ConfigError(
            "--per-chunk", True, f"is the paper's axis; --per-hour {args.per_hour} is the "
            "honest one: give one of them", "argument"
        )  # fmt: skip
    if args.frontier:
        if args.sensitivity != "public":
            raise ConfigError("frontier", "--sensitivity paper", "the frontier is honest-only")
        if args.per_chunk:
            raise ConfigError("--per-chunk", True, "the frontier is per hour only", "argument")
    per_chunk = bool(args.per_chunk) or args.sensitivity == "paper"
    return None if per_chunk else str(args.per_hour or "laplace")


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; write JSON, Markdown and PNGs to ``--out``; return 0."""
    if args.render is not None:
        return _render(args.render, args.out)
    quick = bool(args.quick)
    settings = _eval_settings(args, quick)
    if not args.frontier:
        for flag in ("cohort_sessions", "cohort_bucket_s"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise ConfigError(name, getattr(args, flag), "needs --frontier", "argument")
    elif args.cohort_bucket_s is not None and not args.cohort_bucket_s > 0:
        raise ConfigError("--cohort-bucket-s", args.cohort_bucket_s, "must be > 0", "argument")
    if args.paper_tables:
        return _paper_tables(args, settings)
    args.per_hour = _axis(args)
    grid = _grid(args, settings, quick)
    datasets = _datasets(args, quick)
    _warn_not_private(args)
    if args.frontier:
        return run_frontier(
            datasets,
            grid,
            args.profile or "activity",
            args.out,
            quick=quick,
            cohort_sizes=args.cohort_sessions,
            cohort_bucket_s=args.cohort_bucket_s,
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


def _warn_not_private(args: argparse.Namespace) -> None:
    """Warn where ``--sensitivity paper`` or ``--insecure-seed`` makes the releases not private."""
    console = get_console()
    if args.sensitivity == "paper":
        console.warn(f"WARNING: --sensitivity paper: {NOT_PRIVATE}")
    if args.insecure_seed is not None:
        console.warn(
            f"WARNING: --insecure-seed {args.insecure_seed}: noise is reproducible and NOT private"
        )


def _paper_tables(args: argparse.Namespace, settings: EvalSettings) -> int:
    """``--paper-tables``: Bozkir et al.'s MPIIDPEye tables, ours beside the paper's."""
    if args.frontier or args.per_hour:
        raise ConfigError(
            "--paper-tables", True, "the paper's tables are per chunk: drop --frontier and "
            "--per-hour", "argument",
        )  # fmt: skip
    datasets = (
        _datasets(args, False) if args.dataset else [open_dataset("mpiidpeye", args.data_dir)]
    )
    _warn_not_private(args)
    for ds in datasets:
        if not isinstance(ds, MpiiDpEye):
            raise ConfigError(
                "--paper-tables", ds.name, "the paper's tables are MPIIDPEye's: --dataset "
                "mpiidpeye[:PATH]", "argument",
            )  # fmt: skip
        result = run_paper_tables(
            ds,
            [m.key for m in _mechanisms(args.mechanisms, False)]
            if args.mechanisms
            else PAPER_MECHANISMS,
            args.epsilons or PAPER_EPS,
            settings=settings,
            sensitivity=args.sensitivity,
            k=args.k,
            jobs=args.jobs or 1,
            cache_dir=None if args.no_cache else args.cache_dir,
            window_s=args.window,
            step_s=args.step,
        )
        path, md = write_results(result, args.out)
        stdout("\n".join(headline(result)))
        stdout(f"\nwrote {path} and {md}")
    return ExitCode.OK


def _eval_settings(args: argparse.Namespace, quick: bool) -> EvalSettings:
    """The evaluation protocol from ``--classifiers``, ``--*-reps``, ``--every-*``."""
    classifiers = tuple(c.strip() for c in args.classifiers.split(",") if c.strip())
    unknown = [c for c in classifiers if c not in CLASSIFIERS]
    if unknown or not classifiers:
        raise ConfigError("classifiers", args.classifiers, f"choose from {','.join(CLASSIFIERS)}")
    for name in ("utility_reps", "clf_reps", "jobs", "every_task", "every_reid"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(name.replace("_", "-"), v, "must be >= 1", "argument")
    return EvalSettings(
        utility_reps=args.utility_reps or (10 if quick else 100),
        clf_reps=args.clf_reps or (1 if quick and not args.paper_tables else 3),
        classifiers=classifiers,
        every_task=args.every_task,
        every_reid=args.every_reid,
        insecure_seed=args.insecure_seed,
    )


def _grid(args: argparse.Namespace, settings: EvalSettings, quick: bool) -> GridConfig:
    """The mechanisms × ε grid (ε per hour unless ``--per-chunk``)."""
    features, profile = (None, None) if args.frontier else _profile_features(args.profile)
    per_hour_grid = [1.0, 10.0, 100.0] if args.frontier else [1.0, 10.0, 100.0, 1000.0]
    default_grid = list(QUICK_EPSILONS if quick else PAPER_EPSILONS)
    return GridConfig(
        mechanisms=_mechanisms(args.mechanisms, quick),
        epsilons=args.epsilons or (per_hour_grid if args.per_hour else default_grid),
        k=args.k,
        settings=settings,
        window_s=args.window,
        step_s=args.step,
        jobs=args.jobs or (2 if quick else 1),
        cache_dir=None if args.no_cache else args.cache_dir,
        tolerance=args.tolerance,
        sensitivity=args.sensitivity,
        per_hour_noise=args.per_hour,
        features=features,
        profile=profile,
    )


def _datasets(args: argparse.Namespace, quick: bool) -> list[Dataset]:
    """The datasets to evaluate (``--dataset``, default gazegraph and synthetic); a default one
    whose recordings are missing is skipped with a note saying where to get them."""
    reading = read_options(args)
    datasets: list[Dataset] = []
    for spec in args.dataset or ["gazegraph", "synthetic"]:
        try:
            datasets.append(
                open_dataset(
                    spec,
                    args.data_dir,
                    synthetic_people=args.synthetic_people or (6 if quick else 8),
                    synthetic_duration_s=args.synthetic_duration or (150.0 if quick else 300.0),
                    synthetic_rate_hz=args.synthetic_rate,
                    read_options=reading,
                    labels=args.labels,
                )
            )
        except DataNotFoundError as exc:
            if args.dataset:  # asked for by name: say so and stop
                raise
            info = PUBLIC_DATASETS[exc.dataset]
            looked = ", ".join(str(p) for p in exc.looked) or "no data folder"
            print(
                f"gazeguard eval: note: {exc.dataset} recordings not found ({looked}), so "
                f"evaluating synthetic only; for the real data download {info.download} from "
                f"{info.url} and pass --data-dir FOLDER",
                file=sys.stderr,
            )
    return datasets
