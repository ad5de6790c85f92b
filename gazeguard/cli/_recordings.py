"""The command-line arguments of the commands that read recorded gaze files (``replay``,
``eval``): the geometry a recording may not state (``--fov``, ``--screen``, ...) and the
:class:`~gazeguard.offline.recordings.ReadOptions` they make.

Apart from :mod:`gazeguard.cli._common` because they need :mod:`gazeguard.offline.recordings`
(numpy, scipy, pyFFTW: most of a second), which ``gazeguard --help`` and the other commands
do not import.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from gazeguard.offline.recordings import FORMATS, GAZE_UNITS, TIME_UNITS, ReadOptions, parse_pair


class PairAction(argparse.Action):
    """``--fov H,V``, also the older ``--fov H V``: stores (H, V).

    ``keep_rest`` (a subclass sets it): tokens after the pair that argparse handed over
    (``--fov 90,70 rec.csv``) are kept in ``namespace.extra_files``; otherwise every token must
    belong to the pair."""

    keep_rest = False

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        tokens = [str(v) for v in (values if isinstance(values, list) else [values])]
        take = (1 if "," in tokens[0] else 2) if self.keep_rest else len(tokens)
        try:
            pair = parse_pair(" ".join(tokens[:take]).replace(",", " "))
        except ValueError as exc:
            why = f"{' '.join(tokens)!r}: expected two numbers H,V like 90,60"
            raise argparse.ArgumentError(self, f"{exc} (H,V)" if self.keep_rest else why) from None
        setattr(namespace, self.dest, pair)
        if self.keep_rest:
            namespace.extra_files = [
                *(getattr(namespace, "extra_files", None) or []),
                *tokens[take:],
            ]


class PairHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``--fov H,V`` (not ``H,V [H,V ...]``) for a :class:`PairAction`."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, PairAction):
            return str(action.metavar)
        return super()._format_args(action, default_metavar)


def add_reading_arguments(
    group: argparse._ArgumentGroup,
    fov: type[PairAction],
    one: str,
    formats: str,
    units_alias: str | None = None,
) -> None:
    """``--format`` (``formats``: its help), ``--units`` (also ``units_alias``), ``--time-unit``
    and :func:`add_geometry_arguments`' options: all :func:`read_options` reads (``fov``: the
    command's pair action; ``one``: "the file" or "a file", for the help)."""
    group.add_argument("--format", choices=FORMATS, default="auto", help=formats)
    group.add_argument(
        *("--units", *([units_alias] if units_alias else [])),
        choices=GAZE_UNITS,
        help=f"gaze units where {one} does not state them (default deg)",
    )
    group.add_argument(
        "--time-unit",
        choices=TIME_UNITS,
        help=f"time unit where {one} does not state it (default s)",
    )
    add_geometry_arguments(group, fov, one)


def add_geometry_arguments(group: argparse._ArgumentGroup, fov: type[PairAction], one: str) -> None:
    """``--fov``, ``--screen``, ``--distance``, ``--resolution``, ``--min-confidence`` and
    ``--pupil-scale``: what :mod:`gazeguard.offline.recordings` needs where a recording does not say
    (``fov``: the command's pair action; ``one``: "the file" or "a file", for the help)."""
    group.add_argument(
        "--fov",
        action=fov,
        nargs="+",
        metavar="H,V",
        help="field of view of the scene camera for normalised or pixel gaze, degrees "
        "(H V also accepted)",
    )
    group.add_argument(
        "--screen", type=pair, metavar="W,H", help="screen width, height for screen gaze, mm"
    )
    group.add_argument("--distance", type=float, metavar="MM", help="eye-to-screen distance, mm")
    group.add_argument(
        "--resolution",
        type=pair,
        metavar="W,H",
        help=f"screen width, height in pixels (pixel gaze, where {one} does not say)",
    )
    group.add_argument(
        "--min-confidence",
        type=float,
        default=0.6,
        help="samples below this confidence are invalid (default 0.6)",
    )
    group.add_argument(
        "--pupil-scale",
        type=float,
        metavar="MM",
        help="EyeLink: mm per sqrt(area unit) (PUPIL AREA) or per unit (PUPIL DIAMETER)",
    )
    group.add_argument(
        "--rate",
        type=float,
        metavar="HZ",
        help="the tracker's nominal sampling rate: the time base of a CSV without a time "
        "column, and the rate the event detector is built for where the file declares none "
        "(only EyeLink ASC files do)",
    )


def read_options(args: argparse.Namespace, **more: Any) -> ReadOptions:
    """The :class:`~gazeguard.offline.recordings.ReadOptions` of ``--format``, ``--units``,
    ``--time-unit`` and :func:`add_geometry_arguments`' options (``more``: other fields)."""
    return ReadOptions(
        format=args.format,
        units=args.units,
        time_unit=args.time_unit,
        fov_deg=args.fov,
        screen_mm=args.screen,
        distance_mm=args.distance,
        resolution_px=args.resolution,
        min_confidence=args.min_confidence,
        pupil_scale=args.pupil_scale,
        **{"rate_hz": args.rate, **more},
    )


def pair(text: str) -> tuple[float, float]:
    """``W,H`` as an argparse type (:func:`gazeguard.offline.recordings.parse_pair`)."""
    try:
        return parse_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
