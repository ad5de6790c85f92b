"""``gazeguard release``: privatize a recorded feature dataset and write it with a manifest.

Examples::

    gazeguard release ksame features.csv -o released.csv --k 4
    gazeguard release marginals features.npz -o synth.npz --k 5 --gamma 2 --range data
    gazeguard release expdp --dataset gazegraph -o gg_expdp.parquet --epsilon 2

The released table has the input's format (by the output suffix: .csv, .npz or .parquet; Parquet
needs the ``parquet`` extra) and a manifest JSON next to it (``released.manifest.json`` unless
``--manifest`` says otherwise); k-same also writes ``released.group-mapping.PRIVATE.json``, the
mapping from group ids back to real people, which stays local (a warning says so). The files are
written by :func:`gazeguard.offline.release.output.write_release`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gazeguard.cli._common import ExitCode, get_console, require, stdout
from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.offline.recordings import ReadOptions
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.offline.release.output import check_output, write_release
from gazeguard.signal.dataset import FeatureTable, file_sha256

#: CLI option dest → mechanism parameter name; only options given on the command line are passed.
_PARAM_OPTIONS = (
    "k",
    "leftover",
    "gamma",
    "bins",
    "omega",
    "max_attempts",
    "epsilon",
    "range",
    "n",
    "keep",
    "transform",
    "tail",
)


def _keep(text: str) -> int | str:
    return text if text == "auto" else int(text)


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of ``gazeguard release``."""
    parser.add_argument("mechanism", choices=sorted(RELEASE_MECHANISMS), help="release mechanism")
    parser.add_argument(
        "input", nargs="?", type=Path, help="feature table to privatize (.csv, .npz or .parquet)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="released table (.csv, .npz, .parquet)"
    )
    parser.add_argument(
        "--manifest", type=Path, help="manifest path (default: OUTPUT.manifest.json)"
    )
    src = parser.add_argument_group("raw recordings instead of a feature table")
    src.add_argument(
        "--dataset",
        metavar="SPEC",
        help="extract features first from gazegraph, irf, synthetic or csv:PATH",
    )
    src.add_argument("--data-dir", type=Path, help="where gazegraph/irf live (default: auto)")
    src.add_argument(
        "--rate",
        type=float,
        metavar="HZ",
        help="csv:PATH: the tracker's nominal sampling rate (the event detector is built for "
        "it; files other than EyeLink ASC declare none)",
    )
    src.add_argument(
        "--window-s",
        type=float,
        default=30.0,
        help="feature window W, s (also selects the registry's public bounds)",
    )
    src.add_argument(
        "--step-s",
        type=float,
        default=0.5,
        help="feature step, s (also selects the registry's public bounds)",
    )
    mech = parser.add_argument_group("mechanism parameters (each applies to the mechanisms named)")
    mech.add_argument("--k", type=int, help="ksame: group size; marginals: plausible seeds")
    mech.add_argument("--leftover", choices=("drop", "merge"), help="ksame: leftover people")
    mech.add_argument("--gamma", type=float, help="marginals: plausibility factor γ > 1")
    mech.add_argument("--bins", type=int, help="marginals: bins per feature (default 30)")
    mech.add_argument("--omega", type=int, help="marginals: features re-drawn (default all)")
    mech.add_argument("--max-attempts", type=int, help="marginals: candidates per row")
    mech.add_argument(
        "--epsilon",
        type=float,
        help="expdp: per-feature ε; lpa/fpa/cfpa/dcfpa: per feature per chunk",
    )
    mech.add_argument("--n", type=int, help="lpa/cfpa/dcfpa: chunk steps (default 32)")
    mech.add_argument(
        "--keep", type=_keep, help="fpa/cfpa/dcfpa: kept frequencies, an int or 'auto' (default)"
    )
    mech.add_argument("--transform", choices=("dft", "dct"), help="fpa/cfpa/dcfpa: basis")
    mech.add_argument(
        "--tail", choices=("drop", "pad"), help="lpa/cfpa/dcfpa: steps after the last full chunk"
    )
    mech.add_argument(
        "--range",
        choices=("public", "data"),
        help="expdp, marginals: feature ranges from public bounds (default) or from the data",
    )
    mech.add_argument(
        "--bounds",
        type=Path,
        metavar="FILE.json",
        help='public bounds {"feature": [lo, hi, max_step], ...} (default: gazeguard registry)',
    )
    parser.add_argument(
        "--insecure-seed",
        type=int,
        metavar="N",
        help="reproducible NON-cryptographic randomness (experiments only; never for a release)",
    )


def _progress_printer(name: str, quiet: bool) -> Any:
    console = get_console()

    def progress(done: int, total: int, what: str) -> None:
        if not quiet:
            console.progress(
                "progress", f"release {name}: [{done}/{total}] {what}", done=done, total=total
            )

    return progress


def _load_input(
    args: argparse.Namespace, progress: Any
) -> tuple[FeatureTable, str, dict[str, str]]:
    """(table, source description, checksum for the manifest)."""
    if (args.input is None) == (args.dataset is None):
        raise ConfigError("input", args.input, "give either an INPUT feature table or --dataset")
    if args.input is not None:
        path = Path(args.input)
        table = FeatureTable.load(path)
        return table, str(path), {"sha256": file_sha256(path)}
    require(
        "gazeguard release --dataset", "sklearn"
    )  # gazeguard.offline.eval needs the 'eval' extra
    from gazeguard.offline.eval.datasets import open_dataset  # noqa: PLC0415 - the eval extra

    dataset = open_dataset(args.dataset, args.data_dir, read_options=ReadOptions(rate_hz=args.rate))
    table = dataset.features(
        window_s=args.window_s,
        step_s=args.step_s,
        progress=lambda line: progress(0, 1, line),
    )
    source = f"dataset {args.dataset} (window {args.window_s} s, step {args.step_s} s)"
    return table, source, {"fingerprint": dataset.fingerprint()}


def _params(args: argparse.Namespace) -> dict[str, object]:
    params: dict[str, object] = {
        name: getattr(args, name) for name in _PARAM_OPTIONS if getattr(args, name) is not None
    }
    if args.mechanism != "ksame" and args.range != "data" and args.bounds is None:
        # Public bounds from the feature registry depend on the window and step.
        params["window_s"] = args.window_s
        params["step_s"] = args.step_s
    if args.bounds is not None:
        try:
            params["bounds"] = json.loads(Path(args.bounds).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DatasetError(args.bounds, f"cannot read bounds JSON: {exc}") from exc
    return params


def run(args: argparse.Namespace) -> int:
    """Run ``gazeguard release``; returns the exit status."""
    out = Path(args.output)
    check_output(out, None if args.input is None else Path(args.input))
    if ".parquet" in (out.suffix.lower(), Path(args.input or "").suffix.lower()):
        require("gazeguard release with Parquet files", "pyarrow")
    console = get_console()
    progress = _progress_printer(args.mechanism, console.quiet)
    table, source, checksum = _load_input(args, progress)
    files = write_release(
        args.mechanism,
        table,
        _params(args),
        out,
        input_source=source,
        input_checksum=checksum,
        manifest_path=args.manifest,
        seed=args.insecure_seed,
        progress=progress,
    )
    manifest = files.manifest
    stdout(
        f"released {files.result.table.n_rows} rows (input {table.n_rows}) with {args.mechanism} "
        f"in {manifest['duration_s']:.2f} s -> {out}\nmanifest: {files.manifest_path}\n"
        f"guarantee: {manifest['guarantee']['statement']}"
    )
    if files.private_path is not None:
        console.warn(
            f"WARNING: {files.private_path} maps the released group ids to real people: keep it "
            "with the original data and never publish it with the release",
            private_file=str(files.private_path),
        )
    if args.insecure_seed is not None:
        console.warn(
            "WARNING: --insecure-seed makes the randomness reproducible; do not publish this."
        )
    return ExitCode.OK
