"""``gazeguard replay FILE``: stream a recorded gaze file once as a real LSL outlet at its own
timing (:class:`gazeguard.offline.replay.Replay`), then exit."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gazeguard.cli._recordings import (
    PairAction,
    PairHelpFormatter,
    add_reading_arguments,
    read_options,
)
from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.core.samples import GazeSamples
from gazeguard.core.words import counted
from gazeguard.offline.recordings import (
    FORMAT_HELP,
    ReadOptions,
    read_recording,
)
from gazeguard.offline.replay import Replay, XdfStream, load_xdf

REPLAY_EPILOG = f"""\
{FORMAT_HELP}
XDF: a .xdf file's gaze stream (of type Gaze or Eyetracker, or --stream NAME) is replayed with its
own name, type and channel metadata, so ingest's presets apply to it as to the live device.

examples:
  gazeguard replay rec.csv                                   # t, x, y in degrees
  gazeguard replay rec.csv --units norm --fov 90,70          # normalised scene-camera gaze
  gazeguard replay 000/exports/000 --fov 99,53               # a Pupil Player export
  gazeguard replay export.tsv --screen 527,296 --distance 650 --recording Recording1
  gazeguard replay s01.asc --screen 533,301 --distance 565 --pupil-scale 0.05
  gazeguard replay session.xdf
"""


class _PairAction(PairAction):
    keep_rest = True  # ``--fov 90,70 rec.csv``: the file is not part of the pair


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard replay``."""
    parser.description = (
        "Stream a recorded gaze file as a real LSL outlet at its own timing (stream type Gaze,\n"
        "gazeguard's channel layout: gaze in degrees, pupil in mm, validity), so `gazeguard run`\n"
        "or any LSL consumer receives it as it would from a headset."
    )
    parser.epilog = REPLAY_EPILOG
    parser.formatter_class = PairHelpFormatter
    parser.add_argument(
        "file",
        type=Path,
        nargs="?",
        help="the recording: gazeguard CSV, a Pupil Player export, a Tobii Pro Lab .tsv, an "
        "EyeLink .asc or an .xdf",
    )
    r = parser.add_argument_group("reading the recording (see below)")
    add_reading_arguments(
        r, _PairAction, "the file", "auto (default: from the content), csv, pupil, tobii or eyelink"
    )
    r.add_argument("--recording", metavar="ID", help="which recording of a file that holds several")
    r.add_argument(
        "--columns",
        default=None,
        help="CSV without a header line: the column names, comma-separated (e.g. t,x,y)",
    )
    r.add_argument("--stream", default=None, help="XDF: name of the stream to replay")
    o = parser.add_argument_group("the LSL outlet")
    o.add_argument("--name", default=None, help="LSL stream name")
    o.add_argument("--source-id", default=None, help="LSL source_id (default: unique)")
    o.add_argument("--speed", type=float, default=1.0, help="push speed vs real time")
    o.add_argument("--wait", type=float, default=60.0, help="wait for a consumer, s")


def _read_options(args: argparse.Namespace) -> ReadOptions:
    columns = (
        tuple(c.strip() for c in args.columns.split(",") if c.strip()) if args.columns else None
    )
    return read_options(args, columns=columns)


def run(args: argparse.Namespace) -> int:
    """``gazeguard replay FILE``: stream the recording once at its timing, then exit."""
    files = ([args.file] if args.file is not None else []) + [
        Path(f) for f in getattr(args, "extra_files", None) or []
    ]
    if len(files) != 1:
        raise ConfigError(
            "file",
            [str(f) for f in files],
            "give exactly one recording: gazeguard replay FILE [--fov H,V ...]",
            "argument",
        )
    file = files[0]
    rec: GazeSamples | XdfStream
    what = ""
    if file.suffix.lower() in {".xdf", ".xdfz"}:
        rec = load_xdf(file, args.stream)
    else:
        recording = read_recording(file, _read_options(args), args.recording)
        rec = recording.samples
        if len(rec) < 2:
            raise DatasetError(file, f"only {len(rec)} sample: nothing to replay")
        what = f"{recording.format} recording {recording.recording!r}, "
        for note in recording.notes:
            print(f"gazeguard replay: note: {note}", file=sys.stderr)
    with Replay(
        rec, source_id=args.source_id, name=args.name, speed=args.speed, wait_s=args.wait
    ) as rp:
        print(
            f"replaying {file} ({what}{rp.rows.shape[0]} samples, {rp.rel_t[-1]:.1f} s) as LSL "
            f"stream {rp.name!r}, source_id {rp.source_id!r}",
            flush=True,
        )
        rp.wait()
        time.sleep(0.5)  # let the last samples reach the inlets before the outlet goes away
    print(f"sent {counted(rp.samples_sent, 'sample')}", flush=True)
    return 0
