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

Trust: the file decides what the plan calibrates and what the ledger believes was spent, so no
entry is believed because it is well formed. Each entry carries an HMAC-SHA256, under a secret
key, of the file's tag, the entry's key and its value; an entry whose code does not match
(changed after it was written, moved to another key, copied from another file, another key's or
another library version's) is refused with a warning naming the file and computed anew, as in
an empty cache. The key (32 random bytes, hex) is made on first use in its own file,
``$GAZEGUARD_CACHE_KEY`` if set, else ``$XDG_STATE_HOME/gazeguard/cache-key``, else
``~/.local/state/gazeguard/cache-key`` — never in the cache directory, which is disposable and
may be shared or mounted. It is used only as a regular file (not a symlink) of this process's
user that no one else may read or write (``0600``); otherwise, or when it cannot be made, the
disk cache is not used (a warning, or a note when the directory is unwritable) and everything
is computed. So lowering a charge or the noise through the cache takes the key: the service
user's own state, like the ledger, not write access to a cache directory. A kept ratio is
also used only after its composition is checked against the budget
(:func:`~gazeguard.privacy.accounting.calibrate.calibrate`).

Thread-safe (one lock); no import of anything heavy.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import hmac
import importlib.metadata
import json
import logging
import math
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeAlias

from gazeguard.privacy.accounting.loss import Event

__all__ = [
    "ENV",
    "KEY_ENV",
    "clear",
    "directory",
    "file",
    "flush",
    "forget",
    "key_file",
    "lookup",
    "lookup_ratio",
    "ratio_key",
    "store",
    "store_ratio",
]

log = logging.getLogger("gazeguard.privacy.accounting")

#: Environment variable naming the cache directory (``off`` or empty: no disk cache).
ENV = "GAZEGUARD_CACHE_DIR"
#: Environment variable naming the key file that authenticates the entries.
KEY_ENV = "GAZEGUARD_CACHE_KEY"
#: Version of the file format, of the key's meaning and of how values are computed: bump when
#: any changes (2: Laplace PMFs built in NumPy, ε moved by ~1e-12 relative; 3: each entry
#: authenticated).
FORMAT = 3
#: Most entries kept (oldest dropped first): a few hundred bytes each.
MAX_ENTRIES = 50_000
#: Seconds between two writes of the file (pending entries are written at exit).
FLUSH_EVERY_S = 1.0
#: Bytes of the secret key.
KEY_BYTES = 32
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


def key_file() -> Path:
    """The file of the secret key that authenticates the entries (see the module docstring)."""
    value = (os.environ.get(KEY_ENV) or "").strip()
    if value:
        return Path(value)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "gazeguard" / "cache-key"


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


# ------------------------------------------------------------------------------------ the key
def _private(fd: int) -> str | None:
    """Why the open key file ``fd`` cannot be trusted, or ``None``."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this process's user ({os.geteuid()})"
    if st.st_mode & 0o077:
        return f"others may read or write it (mode {stat.S_IMODE(st.st_mode):04o}, not 0600)"
    return None


def _make_key(path: Path) -> None:
    """Make the key file, whole or not at all (a racing process's key wins)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".cache-key-", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _secret(path: Path) -> bytes | None:
    """The secret key in ``path`` (made if there is none), or ``None`` (logged) when there is
    none this process can make or trust."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(2):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if attempt:
                break
            try:
                _make_key(path)
            except OSError as exc:
                log.info(
                    "composition cache not used: no key file %s could be made (%s); "
                    "compositions are computed anew", path, exc,
                )  # fmt: skip
                return None
            continue
        except OSError as exc:  # a symlink (ELOOP), a directory, no permission, …
            log.warning(
                "composition cache not used: its key file %s cannot be opened as a file (%s); "
                "compositions are computed anew", path, exc,
            )  # fmt: skip
            return None
        with os.fdopen(fd, "rb") as f:
            why = _private(f.fileno())
            text = f.read(4 * KEY_BYTES).strip()
        if why is None:
            try:
                value = bytes.fromhex(text.decode("ascii"))
            except ValueError:
                value = b""
            if len(value) != KEY_BYTES:
                why = f"it does not hold {2 * KEY_BYTES} hex digits"
            else:
                return value
        log.warning(
            "composition cache not used: its key file %s cannot be trusted (%s); compositions "
            "are computed anew (remove the file to have a new key made)", path, why,
        )  # fmt: skip
        return None
    return None


def _code(secret: bytes, k: str, value: list[Any]) -> str:
    """The entry's authentication code: HMAC-SHA256 of the file's tag, its key and its value."""
    message = json.dumps([_tag(), k, value], separators=(",", ":")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _form(k: str, entry: Entry) -> list[Any]:
    """An entry's value as stored (without its code)."""
    return [entry[0]] if k.startswith(_RATIO) else list(entry)


def _authentic(secret: bytes, k: str, entry: Entry, code: Any) -> bool:
    """Whether ``code`` is the entry's authentication code under ``secret``."""
    if not (isinstance(code, str) and code.isascii()):  # compare_digest takes ASCII str only
        return False
    return hmac.compare_digest(code, _code(secret, k, _form(k, entry)))


# -------------------------------------------------------------------------------- the file
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


def _read(path: Path, secret: bytes, key_path: Path, *, quiet: bool = False) -> dict[str, Entry]:
    """The entries of ``path`` that are well formed and authenticated under ``secret`` (read
    from ``key_path``); ``quiet``: what is refused is not logged again (a merge before a
    write)."""
    say = log.debug if quiet else log.warning
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        say("composition cache %s unreadable (%s): computing anew", path, exc)
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or data.get("format") != FORMAT:
        say("composition cache %s is not a format-%d cache: ignored", path, FORMAT)
        return {}
    out: dict[str, Entry] = {}
    malformed = refused = 0
    for k, v in entries.items():
        stored = v[:-1] if isinstance(v, list) and v else None
        entry = _valid(k, stored) if isinstance(k, str) else None
        if entry is None:
            malformed += 1
        elif not _authentic(secret, k, entry, v[-1]):
            refused += 1
        else:
            out[k] = entry
    if refused:
        say(
            "composition cache %s: %d of %d entries REFUSED: their authentication code does not "
            "match (changed after they were written, moved or copied in, or written under "
            "another key than %s); each is computed anew when needed",
            path, refused, len(entries), key_path,
        )  # fmt: skip
    if malformed:
        say("composition cache %s: %d malformed entries ignored", path, malformed)
    return out


class _Store:
    """The process's view of the file: loaded on first use, written when new entries wait.
    Without a trusted key (``secret`` is ``None``) nothing is read from or written to disk."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: Path | None = None
        self.key_path: Path | None = None
        self.secret: bytes | None = None
        self.entries: dict[str, Entry] | None = None
        self.pending: dict[str, Entry] = {}
        self.flushed_at = 0.0

    def _load(self) -> dict[str, Entry]:
        path = file()
        key_path = None if path is None else key_file()
        if self.entries is None or path != self.path or key_path != self.key_path:
            self.path, self.key_path, self.entries, self.pending = path, key_path, {}, {}
            self.secret = None if key_path is None else _secret(key_path)
            if path is not None and key_path is not None and self.secret is not None:
                self.entries = _read(path, self.secret, key_path)
        assert self.entries is not None
        return self.entries

    def get(self, k: str) -> Entry | None:
        with self.lock:
            return self._load().get(k)

    def put(self, k: str, entry: Entry) -> None:
        with self.lock:
            self._load()[k] = entry
            if self.path is None or self.secret is None:
                return
            self.pending[k] = entry
            if time.monotonic() - self.flushed_at >= FLUSH_EVERY_S:
                self._write()

    def flush(self) -> None:
        with self.lock:
            self._write()

    def _write(self) -> None:
        path, key_path, secret, pending = self.path, self.key_path, self.secret, self.pending
        if path is None or key_path is None or secret is None or not pending:
            return
        self.flushed_at = time.monotonic()
        self.pending = {}
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            merged = _read(path, secret, key_path, quiet=True)
            merged.update(pending)
            if len(merged) > MAX_ENTRIES:
                merged = dict(list(merged.items())[-MAX_ENTRIES:])
            out = {}
            for k, v in merged.items():
                value = _form(k, v)
                out[k] = [*value, _code(secret, k, value)]
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
            self.entries, self.pending = None, {}  # the next use reads the key again
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
