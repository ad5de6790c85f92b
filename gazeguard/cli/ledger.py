"""``gazeguard ledger show``: the accounts of a ledger (:class:`gazeguard.ledger.Ledger`), for
people (text) and scripts (``--json``), on stdout."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from gazeguard.cli._common import ExitCode, gaze_window, stdout
from gazeguard.config import load_settings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger, is_url
from gazeguard.wire.kinds import KINDS


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard ledger``."""
    sub = parser.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="per-session ε spent, remaining, chunks, pending outbox")
    show.add_argument(
        "--path",
        help="ledger SQLite file or postgresql:// URL (default: from --config / environment)",
    )
    show.add_argument("--config", type=Path, help="configuration file (TOML) naming the ledger")
    show.add_argument("--session", help="only this session")
    show.add_argument("--chunks", action="store_true", help="list every chunk's ε per feature")
    show.add_argument("--json", action="store_true", help="machine-readable JSON")


def run(args: argparse.Namespace) -> int:
    """``gazeguard ledger show``: print the accounts; exit 1 if the session is unknown."""
    if args.path is not None:
        location: str | Path = args.path if is_url(args.path) else Path(args.path)
    else:
        settings = load_settings(args.config).ledger
        location = settings.url if settings.url is not None else settings.path
    with Ledger(location, create=False, read_only=True) as ledger:
        names = ledger.sessions()
        if args.session is not None:
            if args.session not in names:
                known = ", ".join(repr(n) for n in names[:10]) or "none"
                raise ConfigError(
                    "--session", args.session, f"not in ledger {location}; sessions: {known}"
                )
            names = [args.session]
        report = [_session_report(ledger, name, chunks=args.chunks) for name in names]
        pending = [
            {"id": p.id, "session": p.session, "chunk_index": p.chunk_index, "topic": p.topic,
             "bytes": len(p.payload), "created": p.created}
            for p in ledger.pending(session=args.session)
        ]  # fmt: skip
        where = ledger.backend.location
    if args.json:
        doc = {"ledger": where, "sessions": report, "pending": pending}
        stdout(json.dumps(doc, indent=2))
        return ExitCode.OK
    stdout(_format(where, report, pending))
    return ExitCode.OK


def _session_report(ledger: Ledger, session: str, *, chunks: bool) -> dict[str, Any]:
    history = ledger.charges(session)
    doc = ledger.state(session).as_dict()
    per_feature = [e for c in history for e in c.epsilon.values() if e != float("inf")]
    doc["max_feature_eps"] = max(per_feature, default=0.0)
    doc["withheld_chunks"] = [
        {"chunk_index": i, "requested": r, "reason": why} for i, r, why in ledger.withheld(session)
    ]
    doc["refused_chunks"] = [
        {"chunk_index": r.chunk_index, "stream": r.stream, "topic": r.topic, "reason": r.reason}
        for r in ledger.refused(session)
    ]
    if chunks:
        doc["charges"] = [asdict(c) for c in history]
    for kind in KINDS:
        section = SECTIONS.get(kind.name)
        if section is not None and kind.stream is not None:
            doc[kind.name] = section.report(ledger, session, kind.stream)
    return doc


def _label_report(ledger: Ledger, session: str, stream: str) -> dict[str, Any]:
    """The labels of one session: how many were released and withheld, their ε, their gaze."""
    labels = ledger.charges(session, stream)
    return {
        "released": len(labels),
        "withheld": len(ledger.withheld(session, stream)),
        "epsilon_label": sorted({c.epsilon.get("label", 0.0) for c in labels}),
        "pure_epsilon": sum(c.total for c in labels),
        "first_gaze": min((c.gaze_start for c in labels), default=None),
        "last_gaze": max((c.gaze_end for c in labels), default=None),
    }


def _label_lines(lab: dict[str, Any]) -> list[str]:
    """The label lines of one session (none when it has no label charged or withheld)."""
    if not lab["released"] and not lab["withheld"]:
        return []
    each = "/".join(f"{e:.4g}" for e in lab["epsilon_label"]) or "-"
    lines = [
        f"  labels released      {lab['released']} on a clock   withheld {lab['withheld']}",
        f"  labels' ε            {lab['pure_epsilon']:.4g} pure sum ({each} per label; the "
        "user-level ε above composes them with every other release)",
    ]
    if lab["first_gaze"] is not None:
        lines.append(
            f"  labels' gaze         {_when(lab['first_gaze'])} – {_when(lab['last_gaze'])}"
        )
    return lines


class Section(NamedTuple):
    """What ``ledger show`` says of a release kind's own stream, beside the chunks: ``report``
    (ledger, session, stream) → its JSON, ``lines`` (that JSON) → its text lines."""

    report: Callable[[Ledger, str, str], dict[str, Any]]
    lines: Callable[[dict[str, Any]], list[str]]


#: The sections of ``ledger show`` by release kind name (:data:`gazeguard.wire.kinds.KINDS`),
#: for the kinds charged to a stream of their own that it reports.
SECTIONS: dict[str, Section] = {"labels": Section(_label_report, _label_lines)}


def _when(unix: float) -> str:
    """A Unix time in local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))


def _format(where: str, report: list[dict[str, Any]], pending: list[dict[str, Any]]) -> str:
    lines = [f"ledger {where}: {len(report)} session(s), {len(pending)} outbox item(s) pending"]
    for s in report:
        cap = "none" if s["session_cap"] is None else f"{s['session_cap']:g}"
        pure = "unbounded (Gaussian noise)" if s["spent"] is None else f"{s['spent']:g}"
        hours = s["window_s"] / 3600.0
        per = "hour" if hours == 1 else f"{s['window_s']:g} s"
        lines += [
            "",
            f"session {s['session']}",
            f"  chunks released      {s['chunks']}   withheld {s['withheld']}   "
            f"refused {s['refused']}   pending delivery {s['pending']}",
            f"  user-level ε         {s['epsilon']:.4g} at δ {s['delta']:g}   (composition of "
            "every release: the honest total)",
            f"  per {per} of gaze    {s['epsilon_window']:.4g} at δ {s['delta']:g}   (the latest "
            f"{gaze_window(s['window_s'])})",
            f"  pure sequential ε    {pure}   (the conservative view: sum of every feature's ε)",
            f"  session cap          {cap}   remaining "
            + ("unlimited" if s["remaining"] is None else f"{s['remaining']:.4g}"),
            f"  per-chunk ε          {s['max_chunk_eps']:g} per chunk, {s['max_feature_eps']:g} "
            "per feature   (parallel-composition view: NOT a user-level guarantee)",
        ]
        for kind in KINDS:
            if kind.name in SECTIONS and kind.name in s:
                lines += SECTIONS[kind.name].lines(s[kind.name])
        if s["window_cap"] is not None:
            lines.append(
                f"  window cap           {s['window_cap']:g} over any "
                f"{gaze_window(s['window_s'])}: "
                f"latest window spent {s['epsilon_window']:.4g}, "
                f"remaining {s['window_remaining']:.4g}"
            )
        lines += [
            f"  withheld chunk {w['chunk_index']}: requested ε {w['requested']:g}: {w['reason']}"
            for w in s["withheld_chunks"][-5:]
        ]
        lines += [
            f"  refused chunk {r['chunk_index']} ({r['stream']}) -> {r['topic']}: {r['reason']}"
            for r in s["refused_chunks"][-5:]
        ]
        for c in s.get("charges", []):
            eps = ", ".join(f"{k}={v:g}" for k, v in c["epsilon"].items())
            lines.append(f"  chunk {c['chunk_index']:>6}  ε {c['total']:g}  ({eps})")
    for p in pending[:20]:
        lines.append(
            f"pending #{p['id']}: session {p['session']} chunk {p['chunk_index']} -> "
            f"{p['topic']} ({p['bytes']} bytes)"
        )
    if len(pending) > 20:
        lines.append(f"... and {len(pending) - 20} more pending")
    return "\n".join(lines)
