"""``gazeguard profile``: build, inspect and use release profiles and label models.

``configure(parser)`` declares the arguments and ``run(args)`` executes (registered in
:data:`gazeguard.cli.COMMANDS`).

Subcommands:

``build``
    Select a release profile for a task from labelled public recordings
    (:func:`gazeguard.offline.profiles.build_profile`) and write it as JSON.
``show``
    Validate a profile (shipped name or path) and print it.
``train-model``
    Train the label model of a profile on labelled public recordings (scikit-learn), report its
    leave-one-person-out accuracy and write it in the JSON model format
    (:mod:`gazeguard.signal.labels`).
``labels-budget``
    Print the private-label budget arithmetic (what the sidecar prints at startup).

:mod:`gazeguard.offline.eval` is imported inside the functions that need it: that package imports
scikit-learn (the ``eval`` extra), which ``show`` and ``labels-budget`` do not need.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from gazeguard.cli._common import (
    add_feature_arguments,
    epsilon_list,
    kept_coefficients,
    positive_int,
)
from gazeguard.config import FeatureSettings, LabelSettings
from gazeguard.core.errors import ConfigError
from gazeguard.core.words import counted
from gazeguard.offline.profiles import (
    BuildSettings,
    build_profile,
    candidate_columns,
    check_stream_mechanism,
)
from gazeguard.plan import ReleasePlan, label_cadence
from gazeguard.signal.labels import (
    epsilon_for_survival,
    load_model,
    lopo_probabilities,
    train_model,
)
from gazeguard.signal.profiles import load_profile

DESCRIPTION = """\
Release profiles and private labels.

A release profile lists the few features a consumer's task needs: ranked by how much task and how
little identity they carry under the release noise, sized by the frontier they give (task accuracy
leave-one-person-out against re-identification first half -> second half, as `gazeguard eval`
measures it), chosen as the best task accuracy with re-identification within --tolerance of
chance. Built from labelled PUBLIC recordings only, never from a user's data.
"""

EPILOG = """\
examples:
  gazeguard profile build --dataset gazegraph --name activity --out activity.json
  gazeguard profile show activity
  gazeguard profile train-model --profile activity --dataset gazegraph --out model.json
  gazeguard profile labels-budget --model activity --budget 10 --decision-s 300
"""


_floats = epsilon_list("2.4,4.8")


def _pair(text: str) -> tuple[float, float]:
    try:
        a, b = (float(p) for p in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected two numbers like 90,60") from exc
    return a, b


def _data_arguments(p: argparse.ArgumentParser) -> None:
    """Where the labelled recordings come from and how features are extracted (window, step: s)."""
    d = p.add_argument_group("labelled public recordings")
    d.add_argument(
        "--dataset",
        default="gazegraph",
        metavar="NAME",
        help="gazegraph (default), synthetic, csv:PATH or table:PATH (task and person labelled)",
    )
    d.add_argument(
        "--data-dir",
        type=Path,
        help="recorded datasets (default: $GAZEGUARD_DATA, ./data or ../shared/data)",
    )
    add_feature_arguments(d, "feature cache, shared with `gazeguard eval`")
    d.add_argument("--synthetic-people", type=positive_int, default=8, help="(8)")
    d.add_argument("--synthetic-duration", type=float, default=300.0, help="s per recording (300)")
    d.add_argument("--synthetic-rate", type=float, default=60.0, help="Hz (60)")
    d.add_argument("--csv-units", choices=("deg", "norm"), default="deg")
    d.add_argument("--fov", type=_pair, metavar="H,V", help="field of view for --csv-units norm")


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard profile``."""
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    _build_command(sub)
    _show_command(sub)
    _train_command(sub)
    _labels_budget_command(sub)


def _build_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``profile build``: the profile, its data, the noise level and the selection."""
    b = sub.add_parser(
        "build",
        help="select a release profile for a task from labelled public recordings",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("--name", required=True, help="profile name (letters, digits, _ . -)")
    b.add_argument("--task", help="what the profile is for (default: the name)")
    b.add_argument("--out", type=Path, help="output file (default: ./NAME.json)")
    _data_arguments(b)
    _noise_level(b)
    _selection(b)


def _noise_level(p: argparse.ArgumentParser) -> None:
    """The mechanism and ε (per feature per chunk) a profile is built for."""
    n = p.add_argument_group("noise level the profile is built for")
    n.add_argument(
        "--mechanism",
        default="cfpa-32-dct",
        help="stream mechanism: none, lpa-N, cfpa-N-dft|dct, dcfpa-N-dft|dct (cfpa-32-dct)",
    )
    n.add_argument(
        "--epsilons",
        type=_floats,
        default=[2.4, 4.8, 9.6],
        metavar="LIST",
        help="ε per feature per chunk to consider, comma-separated (2.4,4.8,9.6)",
    )
    n.add_argument(
        "--k", type=kept_coefficients, default="auto", help="kept coefficients: auto or an integer"
    )


def _selection(p: argparse.ArgumentParser) -> None:
    """How the profile is chosen: ranking, repetitions, tolerances (accuracy fractions)."""
    s = p.add_argument_group("selection")
    s.add_argument(
        "--criterion",
        choices=("info-ratio", "f-ratio"),
        default="info-ratio",
        help="ranking: info-ratio (task over identity information under the noise; default) "
        "or f-ratio (clean ANOVA F of task over F of person)",
    )
    s.add_argument("--max-size", type=positive_int, help="largest profile evaluated (default: all)")
    s.add_argument(
        "--reps", type=positive_int, default=3, help="noisy releases per frontier point (3)"
    )
    s.add_argument(
        "--confirm-reps",
        type=positive_int,
        default=5,
        help="fresh releases confirming the pick (5)",
    )
    s.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="re-identification at chance: <= 1/people + this (0.02)",
    )
    s.add_argument(
        "--margin",
        type=float,
        default=0.01,
        help="task accuracies within this of the best are equal; the cheapest wins (0.01)",
    )
    s.add_argument("--classifiers", default="knn,svm,dt,rf", help="subset of knn,svm,dt,rf")
    s.add_argument("--every-task", type=positive_int, default=10, help="(10)")
    s.add_argument("--every-reid", type=positive_int, default=5, help="(5)")
    s.add_argument(
        "--insecure-seed",
        type=int,
        metavar="SEED",
        help="INSECURE: reproducible noise (tests); the profile records it",
    )


def _show_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``profile show``."""
    sh = sub.add_parser("show", help="validate a profile and print it")
    sh.add_argument("profile", help="shipped name (e.g. activity) or path to a .json file")
    sh.add_argument("--json", action="store_true", help="print the whole file")


def _train_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``profile train-model``: the model, what it reads, decision lengths (s), then the data."""
    t = sub.add_parser(
        "train-model",
        help="train a profile's label model on labelled public recordings (JSON format)",
    )
    t.add_argument("--profile", required=True, help="profile name or path")
    t.add_argument("--out", type=Path, help="output file (default: ./PROFILE.json)")
    t.add_argument("--model-name", help="model name (default: the profile's name)")
    t.add_argument("--model-version", help="model version (default: today's date)")
    t.add_argument(
        "--regularization",
        type=float,
        default=1.0,
        help="inverse L2 strength C of the logistic regression (1.0)",
    )
    t.add_argument("--every", type=positive_int, default=1, help="train on every n-th window")
    t.add_argument(
        "--features",
        choices=("profile", "usable"),
        default="profile",
        help="what the model reads: the profile's released features (default), or every "
        "feature that varies in the build data (labels are released, not features: the model "
        "may read more than the chunk stream releases)",
    )
    t.add_argument(
        "--decision-s",
        type=_floats,
        default=[30.0, 60.0, 120.0, 240.0],
        metavar="S,S,...",
        help="decision lengths, s, whose leave-one-person-out accuracy is recorded in the file "
        "(blocks of S/step consecutive windows; 30,60,120,240)",
    )
    _data_arguments(t)


def _labels_budget_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``profile labels-budget``: budget (ε per hour), classes or model, cadence or survival."""
    lb = sub.add_parser(
        "labels-budget", help="print the private-label budget arithmetic (as at startup)"
    )
    lb.add_argument(
        "--budget", type=float, required=True, help="ε per hour of gaze (ledger.budget_per_hour)"
    )
    lb.add_argument(
        "--model",
        default=LabelSettings().model,
        help="label model name or path (default: %(default)s)",
    )
    lb.add_argument(
        "--share",
        type=float,
        default=LabelSettings().budget_share,
        help="labels.budget_share: the labels' share of the budget (default %(default)s)",
    )
    lb.add_argument("--delta", type=float, default=1e-6, help="δ of the budget (1e-6)")
    g = lb.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--decision-s", type=float, help="seconds of gaze per decision (as labels.decision_s)"
    )
    g.add_argument(
        "--survival", type=float, help="target survival probability: the cadence it allows"
    )


def _open_table(args: argparse.Namespace, progress: Any) -> tuple[Any, Any]:
    from gazeguard.offline.eval.datasets import open_dataset  # noqa: PLC0415 - the eval extra

    ds = open_dataset(
        args.dataset,
        args.data_dir,
        synthetic_people=args.synthetic_people,
        synthetic_duration_s=args.synthetic_duration,
        synthetic_rate_hz=args.synthetic_rate,
        csv_units=args.csv_units,
        fov_deg=args.fov,
    )
    table = ds.features(args.window, args.step, None if args.no_cache else args.cache_dir, progress)
    return ds, table


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _data_command(args: argparse.Namespace) -> list[str]:
    parts = ["--dataset", args.dataset]
    if args.dataset == "synthetic":
        parts += [
            "--synthetic-people",
            str(args.synthetic_people),
            "--synthetic-duration",
            f"{args.synthetic_duration:g}",
            "--synthetic-rate",
            f"{args.synthetic_rate:g}",
        ]
    if args.window != 30.0 or args.step != 0.5:
        parts += ["--window", f"{args.window:g}", "--step", f"{args.step:g}"]
    return parts


def _build(args: argparse.Namespace) -> int:
    from gazeguard.offline.eval.grid import parse_mechanism  # noqa: PLC0415 - the eval extra

    classifiers = _checked_classifiers(args.classifiers)
    _check_fractions(args)
    spec = parse_mechanism(args.mechanism)
    check_stream_mechanism(spec)
    if args.insecure_seed is not None:
        print(
            f"WARNING: --insecure-seed {args.insecure_seed}: noise is reproducible and NOT "
            "private (for tests)",
            file=sys.stderr,
        )
    ds, table = _open_table(args, _progress)
    profile = build_profile(
        table,
        name=args.name,
        task=args.task or args.name,
        spec=spec,
        epsilons=args.epsilons,
        settings=_build_settings(args, classifiers),
        provenance={
            "dataset": ds.name,
            "dataset_fingerprint": ds.fingerprint(),
            "command": shlex.join(_build_command_line(args, spec.key, classifiers)),
        },
        progress=_progress,
    )
    out: Path = args.out or Path(f"{args.name}.json")
    profile.save(out)
    _print_profile(profile)
    print(f"wrote {out}")
    return 0


def _checked_classifiers(text: str) -> tuple[str, ...]:
    """The classifiers of ``--classifiers`` (comma-separated), each one the evaluation knows."""
    from gazeguard.offline.eval.attacks import CLASSIFIERS  # noqa: PLC0415 - the eval extra

    classifiers = tuple(c.strip() for c in text.split(",") if c.strip())
    if not classifiers or any(c not in CLASSIFIERS for c in classifiers):
        raise ConfigError("classifiers", text, f"choose from {','.join(CLASSIFIERS)}", "argument")
    return classifiers


def _check_fractions(args: argparse.Namespace) -> None:
    """``--tolerance`` and ``--margin`` are accuracy fractions in [0, 1)."""
    for name in ("tolerance", "margin"):
        v = getattr(args, name)
        if not 0 <= v < 1:
            raise ConfigError(name, v, "must be in [0, 1)", "argument")


#: The BuildSettings fields that the ``profile build`` option of the same name gives as it is.
_SAME_NAMED = (
    "criterion",
    "max_size",
    "reps",
    "confirm_reps",
    "tolerance",
    "margin",
    "every_task",
    "every_reid",
    "k",
    "insecure_seed",
)


def _build_settings(args: argparse.Namespace, classifiers: tuple[str, ...]) -> Any:
    """The selection settings of ``profile build``
    (:class:`gazeguard.offline.profiles.BuildSettings`)."""
    same = {name: getattr(args, name) for name in _SAME_NAMED}
    return BuildSettings(classifiers=classifiers, window_s=args.window, step_s=args.step, **same)


def _build_command_line(
    args: argparse.Namespace, mechanism: str, classifiers: tuple[str, ...]
) -> list[str]:
    """The ``gazeguard profile build`` command that builds this profile again (its provenance):
    the choices that shape it, defaults left out where they are the usual ones."""
    return [
        "gazeguard",
        "profile",
        "build",
        "--name",
        args.name,
        *(["--task", args.task] if args.task else []),
        *_data_command(args),
        "--mechanism",
        mechanism,
        "--epsilons",
        ",".join(f"{e:g}" for e in args.epsilons),
        "--criterion",
        args.criterion,
        "--reps",
        str(args.reps),
        "--confirm-reps",
        str(args.confirm_reps),
        *(["--max-size", str(args.max_size)] if args.max_size else []),
        *(["--classifiers", ",".join(classifiers)] if len(classifiers) != 4 else []),
        *(["--insecure-seed", str(args.insecure_seed)] if args.insecure_seed is not None else []),
    ]


def _print_profile(profile: Any) -> None:
    b = profile.built
    print(
        f"profile {profile.name!r} for task {profile.task!r} "
        f"({counted(len(profile.features), 'feature')}): " + ", ".join(profile.features)
    )
    if profile.classes:
        print(f"  classes: {', '.join(profile.classes)}")
    if profile.suggested_budget is not None:
        sb = profile.suggested_budget
        print(
            f"  built for {sb.mechanism} at ε {sb.epsilon_per_feature_per_chunk:g} per feature per "
            f"chunk: {sb.per_hour:.6g} per hour of gaze ({sb.composition}; "
            f"{sb.chunks_per_hour:g} chunks/h)"
        )
    ch, cf = b.get("chosen"), b.get("confirmation")
    if ch and cf:
        chance = b.get("chance", {})
        print(
            f"  frontier pick: task {ch['task']:.3f}, re-id {ch['reid']:.3f}; confirmed on "
            f"{cf['reps']} fresh releases: task {cf['task']:.3f} ({cf['task_classifier']}), "
            f"re-id {cf['reid']:.3f} ({cf['reid_classifier']}); chance task "
            f"{chance.get('task', float('nan')):.3f}, re-id {chance.get('reid', float('nan')):.3f}"
        )
    if "dataset" in b:
        print(
            f"  from {b['dataset']} ({b.get('people')} people, {b.get('rows')} windows), criterion "
            f"{b.get('criterion')}, {b.get('date')}, gazeguard {b.get('gazeguard_version')}"
        )
    if "command" in b:
        print(f"  command: {b['command']}")


def _show(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if args.json:
        print(profile.to_json(), end="")
    else:
        _print_profile(profile)
        print(f"  source: {profile.source}")
    return 0


def _train(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if not args.regularization > 0:
        raise ConfigError("regularization", args.regularization, "must be > 0", "argument")
    ds, table = _open_table(args, _progress)
    classes = sorted(set(table.task.tolist()))
    if profile.classes and sorted(profile.classes) != classes:
        _progress(
            f"note: profile {profile.name!r} lists classes {profile.classes}; {ds.name} has "
            f"{classes}"
        )
    features = _model_features(args.features, profile, table)
    lopo, per_decision = _lopo_accuracy(args, table, features, classes)
    model = train_model(
        table,
        features,
        name=args.model_name or profile.name,
        version=args.model_version,
        profile=profile.name,
        regularization=args.regularization,
        window_s=args.window,
        step_s=args.step,
        every=args.every,
        provenance={
            "dataset": ds.name,
            "dataset_fingerprint": ds.fingerprint(),
            "lopo_window_accuracy": round(lopo, 4),
            "lopo_decision_accuracy": per_decision,
            "features_chosen": args.features,
            "chance": round(1.0 / len(classes), 4),
            "command": shlex.join(_train_command_line(args, profile.name)),
        },
    )
    out: Path = args.out or Path(f"{profile.name}.json")
    model.save(out)
    print(
        f"model {model.name!r} v{model.version}: {counted(len(model.classes), 'class')} "
        f"({', '.join(model.classes)}), {counted(len(model.features), 'feature')}; "
        "leave-one-person-out "
        f"accuracy per window {lopo:.3f} (chance {1 / len(classes):.3f}); per decision "
        f"{', '.join(f'{k} s: {v:.3f}' for k, v in per_decision.items())}\nwrote {out}"
    )
    return 0


def _model_features(chosen: str, profile: Any, table: Any) -> list[str]:
    """What the model reads (``--features``): the profile's released features (``profile``), or
    every feature that varies in the build data (``usable``)."""
    if chosen == "usable":
        cols, _excluded = candidate_columns(table)
        return [table.feature_names[i] for i in cols]
    return list(profile.features)


def _lopo_accuracy(
    args: argparse.Namespace, table: Any, features: list[str], classes: list[str]
) -> tuple[float, dict[str, float]]:
    """Leave-one-person-out accuracy of the model: per window, and per decision length of
    ``--decision-s`` (keyed ``"{s:g}"``, rounded to 4 places; lengths under one step left out)."""

    probs = lopo_probabilities(
        table, features, regularization=args.regularization, every=args.every
    )
    pred = np.asarray(classes)[np.argmax(probs, axis=1)]
    lopo = float(np.mean(pred == table.task))
    per_decision = {
        f"{d:g}": round(block_accuracy(probs, table, classes, round(d / args.step)), 4)
        for d in args.decision_s
        if round(d / args.step) >= 1
    }
    return lopo, per_decision


def _train_command_line(args: argparse.Namespace, profile: str) -> list[str]:
    """The ``gazeguard profile train-model`` command that trains this model again (provenance)."""
    return [
        "gazeguard",
        "profile",
        "train-model",
        "--profile",
        profile,
        *_data_command(args),
        "--regularization",
        f"{args.regularization:g}",
        *(["--every", str(args.every)] if args.every != 1 else []),
        *(["--features", args.features] if args.features != "profile" else []),
    ]


def block_accuracy(probs: Any, table: Any, classes: list[str], steps: int) -> float:
    """Accuracy of decisions over blocks of ``steps`` consecutive windows of each recording
    (non-overlapping, incomplete tail dropped): argmax of the mean probability, as the sidecar
    decides. ``nan`` when no recording is that long."""
    hits: list[bool] = []
    for rec in np.unique(table.recording):
        idx = np.flatnonzero(table.recording == rec)
        for s in range(0, idx.size - steps + 1, steps):
            b = idx[s : s + steps]
            hits.append(classes[int(np.argmax(probs[b].mean(axis=0)))] == table.task[b[0]])
    return float(np.mean(hits)) if hits else float("nan")


def _labels_budget(args: argparse.Namespace) -> int:
    """The sidecar's label plan for these settings (the release plan's own figures), or the
    cadence a target survival allows."""

    if args.decision_s is not None:
        labels = LabelSettings(
            enabled=True, model=args.model, decision_s=args.decision_s,
            budget_share=args.share,
        )  # fmt: skip
        plan = ReleasePlan.build(budget=args.budget, delta=args.delta, labels=labels)
        assert plan.label_plan is not None
        print(plan.label_plan.text())
        print(plan.text())
        return 0
    model = load_model(args.model)
    classes = len(model.classes)
    eps = epsilon_for_survival(args.survival, classes)
    share = args.share * args.budget
    got = label_cadence(share, classes, eps, delta=args.delta, features=FeatureSettings())
    if got is None:
        print(
            f"survival {args.survival:g} needs ε {eps:.4g} per decision: not even two decisions "
            f"per hour of gaze fit the labels' share ε {share:g}"
        )
        return 1
    decisions, cadence = got
    print(
        f"survival {args.survival:g} ({classes} classes): ε {eps:.4g} per decision; the labels' "
        f"share ε {share:g} per hour at δ {args.delta:g} fits {decisions} decisions that an "
        f"hour of gaze can change: one decision per {cadence:g} s of gaze or longer "
        f"(--decision-s {cadence:g})"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``gazeguard profile SUBCOMMAND``; returns the exit status."""
    cmd = getattr(args, "profile_command", None)
    if cmd == "build":
        return _build(args)
    if cmd == "show":
        return _show(args)
    if cmd == "train-model":
        return _train(args)
    if cmd == "labels-budget":
        return _labels_budget(args)
    print(
        "gazeguard profile: choose a subcommand: build, show, train-model, labels-budget "
        "(gazeguard profile --help)",
        file=sys.stderr,
    )
    return 2
