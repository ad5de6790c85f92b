"""The composition cache on disk: ε of a composition, kept across processes.

A composition's ε (and a noise ratio calibrated from compositions) is a function of public
inputs only — the multiset of accounting events (noise
ratios, counts), δ and the method — never of anyone's data. Computing one costs up to a second
of FFTs (and, with Gaussian noise in a PLD or the RDP fallback, importing dp-accounting: ~0.6 s,
~50 MB); a sidecar's plan needs a few dozen of them at startup and its ledger a few more per
release shape. This module keeps each result in one JSON file so that a restart (or a second
worker with the same settings) reads them instead.

Where: ``$GAZEGUARD_CACHE_DIR`` if set (``off`` or empty: no disk cache), else
``$XDG_CACHE_HOME/gazeguard``, else ``~/.cache/gazeguard``; the file is
``compositions-<tag>.json``, where the tag hashes this format's version and the installed
versions of dp-accounting, SciPy and NumPy (a different library computes anew). An unreadable,
malformed or foreign file is ignored (and replaced on the next write); an unwritable directory
only means nothing is kept. Writes go to a temporary file renamed over the old one (readers never
see a partial file), merged with what other processes wrote meanwhile; at most once a second,
and at exit.

Trust: the file decides what the ledger believes was spent, like the ledger file itself, so it
lives in the service user's own cache directory (created ``0700``). Every entry is checked on
load (finite or infinite ε ≥ 0, a known method, a positive interval; a finite positive ratio),
and a cached ratio is used only after its composition is checked against the budget
(:func:`~gazeguard.privacy.accounting.calibrate.calibrate`).

Thread-safe (one lock); no import of anything heavy.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeAlias

from gazeguard.privacy.accounting.loss import Event

__all__ = [
    "ENV",
    "clear",
    "directory",
    "file",
    "flush",
    "forget",
    "lookup",
    "lookup_ratio",
    "ratio_key",
    "store",
    "store_ratio",
]

log = logging.getLogger("gazeguard.privacy.accounting")

#: Environment variable naming the cache directory (``off`` or empty: no disk cache).
ENV = "GAZEGUARD_CACHE_DIR"
#: Version of the file format, of the key's meaning and of how values are computed: bump when
#: any changes (2: Laplace PMFs built in NumPy, ε moved by ~1e-12 relative).
FORMAT = 2
#: Most entries kept (oldest dropped first): a few hundred bytes each.
MAX_ENTRIES = 50_000
#: Seconds between two writes of the file (pending entries are written at exit).
FLUSH_EVERY_S = 1.0
_METHODS = frozenset({"none", "gaussian", "pld", "rdp"})
_RATIO = "ratio:"

#: (ε, method used, PLD interval or None).
Entry: TypeAlias = tuple[float, str, float | None]


def directory() -> Path | None:
    """The cache directory, or ``None`` when the disk cache is off."""
    value = os.environ.get(ENV)
    if value is not None:
        value = value.strip()
        return None if value in ("", "off") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gazeguard"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


@functools.cache
def _tag() -> str:
    parts = [str(FORMAT), *(f"{d}={_version(d)}" for d in ("dp-accounting", "scipy", "numpy"))]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]


def file() -> Path | None:
    """The cache file of the installed libraries, or ``None`` when the disk cache is off."""
    d = directory()
    return None if d is None else d / f"compositions-{_tag()}.json"


def key(counts: Iterable[tuple[Event, int]], delta: float, method: str) -> str:
    """The entry key: the canonical multiset, δ and the requested method, as exact JSON
    (floats by ``repr``, which round-trips)."""
    return json.dumps([events_form(counts), delta, method], separators=(",", ":"))


def events_form(counts: Iterable[tuple[Event, int]]) -> list[list[Any]]:
    """``(event, count)`` pairs as JSON-ready lists (each event's fields sorted), in order."""
    return [[sorted(e.to_dict().items()), c] for e, c in counts]


def _valid(k: str, value: Any) -> Entry | None:
    if k.startswith(_RATIO):
        ok = (
            isinstance(value, list)
            and len(value) == 1
            and isinstance(value[0], int | float)
            and not isinstance(value[0], bool)
            and math.isfinite(value[0])
            and value[0] > 0.0
        )
        return (float(value[0]), "none", None) if ok else None
    if not (isinstance(value, list) and len(value) == 3):
        return None
    eps, method, interval = value
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0.0:
        return None
    if method not in _METHODS:
        return None
    if interval is not None and (
        isinstance(interval, bool)
        or not isinstance(interval, int | float)
        or not (math.isfinite(interval) and interval > 0.0)
    ):
        return None
    return float(eps), str(method), None if interval is None else float(interval)


def _read(path: Path) -> dict[str, Entry]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("composition cache %s unreadable (%s): computing anew", path, exc)
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or data.get("format") != FORMAT:
        log.warning("composition cache %s is not a format-%d cache: ignored", path, FORMAT)
        return {}
    out: dict[str, Entry] = {}
    for k, v in entries.items():
        entry = _valid(k, v) if isinstance(k, str) else None
        if entry is not None:
            out[k] = entry
    if len(out) < len(entries):
        bad = len(entries) - len(out)
        log.warning("composition cache %s: %d invalid entries ignored", path, bad)
    return out


class _Store:
    """The process's view of the file: loaded on first use, written when new entries wait."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: Path | None = None
        self.entries: dict[str, Entry] | None = None
        self.pending: dict[str, Entry] = {}
        self.flushed_at = 0.0

    def _load(self) -> dict[str, Entry]:
        path = file()
        if self.entries is None or path != self.path:
            self.path, self.entries, self.pending = path, {}, {}
            if path is not None:
                self.entries = _read(path)
        assert self.entries is not None
        return self.entries

    def get(self, k: str) -> Entry | None:
        with self.lock:
            return self._load().get(k)

    def put(self, k: str, entry: Entry) -> None:
        with self.lock:
            self._load()[k] = entry
            if self.path is None:
                return
            self.pending[k] = entry
            if time.monotonic() - self.flushed_at >= FLUSH_EVERY_S:
                self._write()

    def flush(self) -> None:
        with self.lock:
            self._write()

    def _write(self) -> None:
        path, pending = self.path, self.pending
        if path is None or not pending:
            return
        self.flushed_at = time.monotonic()
        self.pending = {}
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            merged = _read(path)
            merged.update(pending)
            if len(merged) > MAX_ENTRIES:
                merged = dict(list(merged.items())[-MAX_ENTRIES:])
            out = {k: [v[0]] if k.startswith(_RATIO) else list(v) for k, v in merged.items()}
            body = json.dumps({"format": FORMAT, "entries": out}, separators=(",", ":"))
            fd, tmp = tempfile.mkstemp(prefix=".compositions-", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(body)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.info("composition cache %s not written (%s): kept in memory only", path, exc)

    def clear(self) -> None:
        with self.lock:
            path = file()
            self.path, self.entries, self.pending = path, {}, {}
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()


_store = _Store()
atexit.register(_store.flush)


def lookup(counts: Iterable[tuple[Event, int]], delta: float, method: str) -> Entry | None:
    """The cached (ε, method used, interval) of a composition, or ``None``."""
    return _store.get(key(counts, delta, method))


def store(
    counts: Iterable[tuple[Event, int]],
    delta: float,
    method: str,
    *,
    epsilon: float,
    used: str,
    interval: float | None,
) -> None:
    """Keep a computed composition (written to disk within :data:`FLUSH_EVERY_S`, or at exit)."""
    _store.put(key(counts, delta, method), (float(epsilon), used, interval))


def ratio_key(*parts: Any) -> str:
    """The key of a calibrated noise ratio: the calibration's public inputs, as exact JSON."""
    return _RATIO + json.dumps(parts, separators=(",", ":"))


def lookup_ratio(k: str) -> float | None:
    """A calibrated noise ratio kept under :func:`ratio_key` ``k``, or ``None``."""
    hit = _store.get(k)
    return None if hit is None else hit[0]


def store_ratio(k: str, ratio: float) -> None:
    """Keep a calibrated noise ratio under :func:`ratio_key` ``k``."""
    _store.put(k, (float(ratio), "none", None))


def flush() -> None:
    """Write pending entries now."""
    _store.flush()


def forget() -> None:
    """Forget what this process read (pending entries are written first): the next lookup reads
    the file again, as a new process would."""
    _store.flush()
    with _store.lock:
        _store.entries = None


def clear() -> None:
    """Forget every entry, in memory and on disk (cold-cache tests and benchmarks)."""
    _store.clear()
