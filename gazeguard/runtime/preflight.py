"""Preflight: every check of a configuration that the schema cannot make, run before anything
is opened — by ``gazeguard config check`` (all problems, each with its source) and by every
``gazeguard run`` (:func:`require_valid`: the first problem, as a :class:`ConfigError`).

The checks build what the run would build, read-only: the release plan (:mod:`gazeguard.plan`:
mechanism, label model, cohort, the split of the budget), the broker's TLS context and login,
and the caps stored with the session in the ledger (a restart may tighten them, never loosen).
The schema itself (types, ranges, choices, "did you mean") is :mod:`gazeguard.config`'s; it
takes these checks as a callable (:func:`gazeguard.config.check_with`), so configuration never
imports what it configures.
"""

from __future__ import annotations

import os
import secrets
import ssl
from pathlib import Path
from typing import Any

from gazeguard.config import (
    ConfigProblem,
    IngestSettings,
    MechanismSettings,
    Settings,
    check_with,
    closest,
)
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import LedgerError, not_writable, stored_caps
from gazeguard.ledger.policy import Caps, loosened, looser_reason
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.mqtt.client import credentials, tls_context
from gazeguard.signal.features import NAMES
from gazeguard.wire.topics import session_id_for

__all__ = [
    "PROCESS_TAG",
    "check_settings",
    "expected_session",
    "require_valid",
    "simulated_source_id",
    "validate_settings",
]

#: This process's part of the simulated headset's default source_id (random, 6 hex digits).
PROCESS_TAG = secrets.token_hex(3)


def check_settings(
    path: Path | str | None = None, **overrides: Any
) -> tuple[Settings | None, list[ConfigProblem]]:
    """Every problem of a configuration, each with its source, as ``gazeguard run`` would meet
    it: the schema's and :func:`validate_settings`'s (:func:`gazeguard.config.check_with`).

    Returns:
        ``(settings, problems)``; ``settings`` is ``None`` when the schema refused a value.
        Nothing is written.
    """
    return check_with(validate_settings, path, **overrides)


def simulated_source_id(settings: IngestSettings) -> str:
    """The LSL source_id of the simulated headset: ``ingest.source_id``, else
    ``gazeguard-sim-SEED-TAG`` with this process's random :data:`PROCESS_TAG`, so that two runs
    (on one host or two) never share a session, a topic and a stream by accident."""
    return settings.source_id or f"gazeguard-sim-{settings.simulated_seed}-{PROCESS_TAG}"


def expected_session(settings: Settings) -> str | None:
    """The session id ``serve`` will use, when it is known before the stream is: ``session``,
    an ``ingest.source_id`` to resolve, or the simulated headset's; ``None`` otherwise (it comes
    from whichever stream is found, or from each device in fleet mode)."""
    if settings.fleet.enabled:
        return None
    if settings.session:
        return settings.session
    ingest = settings.ingest
    if ingest.source == "simulated":
        return session_id_for(simulated_source_id(ingest), "")
    if ingest.source in ("lsl", "auto") and ingest.source_id:
        return session_id_for(ingest.source_id, "")
    return None


def require_valid(settings: Settings) -> ReleasePlan:
    """Refuse a configuration :func:`validate_settings` finds a problem in;
    the release plan of one it accepts.

    Raises:
        ConfigError: the first problem (``gazeguard config check`` lists all of them).
    """
    problems = validate_settings(settings)
    if problems:
        first = problems[0].error()
        if len(problems) > 1:
            more = f" (and {len(problems) - 1} more: `gazeguard config check` lists them)"
            raise ConfigError(first.field, first.value, first.reason + more, first.source)
        raise first
    return ReleasePlan.from_settings(settings)


def validate_settings(settings: Settings) -> list[ConfigProblem]:
    """What the schema cannot see but ``gazeguard run`` would refuse, all at once.

    Checks: release-profile and per-feature-ε names (with the closest known name), the window
    and step, the mechanism's parameters (built exactly as the pipeline builds it: k against n
    and the transform, ε), the preset's screen geometry, fleet mode against the source, broker
    TLS files and login, the caps' range, and — when the SQLite ledger file exists and the
    session id is known before the stream is (``session``, ``ingest.source_id``, or the
    simulated headset) — the caps against those stored with that session, which a restart may
    tighten but never loosen. The ledger is opened read-only. :func:`require_valid` (every
    ``gazeguard run``) calls this at startup.

    Returns:
        The problems, without ``source`` (:func:`check_settings` fills it in); empty if none.
    """
    problems = _profile_problems(settings.mechanism)
    f = settings.features
    if f.step_s > f.window_s:
        problems.append(
            ConfigProblem("features.step_s", f.step_s, f"must be <= features.window_s={f.window_s}")
        )
    problems += _cohort_problems(settings)
    window_s: float | None = None
    if not problems:
        window_s, found = _plan_problems(settings)
        problems += found
    problems += _ingest_problems(settings)
    problems += _broker_problems(settings)
    problems += _file_problems(settings)
    if window_s is not None:
        problems += _ledger_problems(settings, window_s)
    return problems


def _cohort_problems(settings: Settings) -> list[ConfigProblem]:
    c = settings.cohort
    if not c.enabled:
        return []
    if not settings.fleet.enabled:
        why = "cohort aggregates are made over a fleet worker's sessions; add --fleet"
        return [ConfigProblem("cohort.enabled", True, why)]
    if settings.ledger.budget_per_hour is None:
        why = "cohort aggregates are calibrated to ledger.budget_per_hour; set one"
        return [ConfigProblem("cohort.enabled", True, why)]
    return []


def _plan_problems(settings: Settings) -> tuple[float | None, list[ConfigProblem]]:
    """What the release plan refuses: it is built exactly as ``gazeguard run`` builds it
    (mechanism, label model and share, cohort share, the split of the budget); and the
    ledger window it needs (``None`` when refused)."""
    try:
        plan = ReleasePlan.from_settings(settings)
    except ConfigError as exc:
        # the mechanism's own parameters are named bare by the mechanisms (k, epsilon, …)
        bare = exc.field in MechanismSettings.model_fields or exc.field in {"n", "epsilon"}
        field = f"mechanism.{exc.field}" if bare and "." not in exc.field else exc.field
        return None, [ConfigProblem(field, exc.value, exc.reason)]
    return plan.window_s, []


def _profile_problems(m: MechanismSettings) -> list[ConfigProblem]:
    problems = [
        ConfigProblem(
            "mechanism.features",
            name,
            "unknown feature name (`gazeguard config features` lists all of them)",
            suggestion=closest(name, NAMES),
        )
        for name in (m.features or [])
        if name not in NAMES
    ]
    problems += [
        ConfigProblem(
            "mechanism.epsilon_per_feature",
            name,
            "unknown feature name",
            suggestion=closest(name, NAMES),
        )
        for name in m.epsilon_per_feature
        if name not in NAMES
    ]
    if m.features is not None and not m.features:
        problems.append(
            ConfigProblem("mechanism.features", [], "the release profile is empty: name features")
        )
    return problems


def _nats_installed() -> bool:
    """Whether nats-py (the ``fleet`` extra) imports: :mod:`gazeguard.runtime.jetstream` needs
    it."""
    try:
        import nats  # noqa: F401, PLC0415 - the fleet extra (nats-py)
    except ImportError:
        return False
    return True


def _ingest_problems(settings: Settings) -> list[ConfigProblem]:
    ing = settings.ingest
    problems = []
    if settings.fleet.enabled and ing.source not in ("lsl", "jetstream"):
        problems.append(
            ConfigProblem(
                "ingest.source",
                ing.source,
                "fleet mode serves real streams: set ingest.source to 'lsl' or 'jetstream'",
            )
        )
    if ing.source == "jetstream":
        if not _nats_installed():
            problems.append(
                ConfigProblem(
                    "ingest.source",
                    ing.source,
                    "raw gaze over NATS JetStream needs nats-py, which is not installed: "
                    "pip install -e '.[fleet]' (in the gazeguard checkout)",
                )
            )
        if not settings.fleet.enabled:
            problems.append(
                ConfigProblem(
                    "ingest.source",
                    ing.source,
                    "raw gaze over NATS JetStream is read in fleet mode only: set fleet.enabled "
                    "(--fleet)",
                )
            )
        nats = settings.fleet.nats
        if nats.max_age_s < settings.features.window_s:
            problems.append(
                ConfigProblem(
                    "fleet.nats.max_age_s",
                    nats.max_age_s,
                    f"the stream must retain at least the feature window "
                    f"({settings.features.window_s:g} s): a worker taking a partition over "
                    "rebuilds each session's window from it",
                )
            )
        if (nats.tls_cert_file is None) != (nats.tls_key_file is None):
            problems.append(
                ConfigProblem(
                    "fleet.nats.tls_cert_file",
                    None if nats.tls_cert_file is None else str(nats.tls_cert_file),
                    "mutual TLS needs both fleet.nats.tls_cert_file and fleet.nats.tls_key_file",
                )
            )
        if nats.creds_file is not None and nats.user is not None:
            problems.append(
                ConfigProblem(
                    "fleet.nats.user",
                    nats.user,
                    "give either fleet.nats.creds_file or fleet.nats.user/password, not both",
                )
            )
    if ing.source in ("lsl", "auto"):
        if ing.preset == "tobii" and (ing.screen_size_mm is None or ing.screen_distance_mm is None):
            problems.append(
                ConfigProblem(
                    "ingest.screen_size_mm",
                    ing.screen_size_mm,
                    "preset 'tobii' reports screen coordinates: set ingest.screen_size_mm "
                    "(width, height, mm) and ingest.screen_distance_mm (eye to screen, mm)",
                )
            )
        if ing.preset == "eyelink" and ing.screen_resolution_px is None:
            problems.append(
                ConfigProblem(
                    "ingest.screen_resolution_px",
                    None,
                    "preset 'eyelink' reports screen pixels: set ingest.screen_resolution_px "
                    "(width, height)",
                )
            )
    return problems


def _broker_problems(settings: Settings) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    broker = settings.broker
    if broker.host is None:
        return problems  # the embedded broker takes no TLS or login
    for check in (credentials, tls_context):
        try:
            check(broker)
        except ConfigError as exc:
            problems.append(ConfigProblem(exc.field, exc.value, exc.reason))
    return problems


def _ledger_problems(settings: Settings, window_s: float) -> list[ConfigProblem]:
    """Caps looser than those stored with the run's session (the ledger's own rule, read-only);
    ``window_s``: the release plan's ledger window."""
    led = settings.ledger
    try:
        wanted = Caps(
            led.session_cap, led.budget_per_hour, window_s, led.delta, led.composition,
            led.wall_clock,
        )  # fmt: skip
        session = None if led.url is not None else expected_session(settings)
        stored = None if session is None else stored_caps(led.path, session)
    except ConfigError as exc:
        return [ConfigProblem(exc.field, exc.value, exc.reason)]
    except LedgerError as exc:
        return [ConfigProblem("ledger.path", str(led.path), str(exc))]
    if stored is None:
        return []
    why = looser_reason(stored, wanted, f"session {session!r} in {led.path}")
    named = {"ledger.window_cap": "ledger.budget_per_hour"}  # the Ledger's name → the setting
    return [
        ConfigProblem(named.get(field, field), value, why)
        for field, value in loosened(stored, wanted)
    ]


def _file_problems(settings: Settings) -> list[ConfigProblem]:
    """The files ``gazeguard run`` would open and cannot: the SQLite ledger (its directory
    missing or not writable, the file or its -wal/-shm not writable: the ledger's own check, in
    its words) and, for a JetStream source, the NATS credentials and TLS files."""
    problems = []
    led = settings.ledger
    if led.url is None:
        path = Path(led.path)
        blocked = not_writable(path)
        if blocked is not None:
            why = f"cannot open ledger {str(path)!r}: {blocked}"
            problems.append(ConfigProblem("ledger.path", str(path), why))
    if settings.ingest.source == "jetstream":
        nats = settings.fleet.nats
        if nats.creds_file is not None and not os.access(nats.creds_file, os.R_OK):
            why = f"cannot read NATS credentials file {nats.creds_file}"
            problems.append(ConfigProblem("fleet.nats.creds_file", str(nats.creds_file), why))
        if nats.tls_ca_file is not None or nats.tls_cert_file is not None:
            try:  # as gazeguard.runtime.jetstream.wire loads them
                ctx = ssl.create_default_context(
                    cafile=None if nats.tls_ca_file is None else str(nats.tls_ca_file)
                )
                if nats.tls_cert_file is not None:
                    key = None if nats.tls_key_file is None else str(nats.tls_key_file)
                    ctx.load_cert_chain(str(nats.tls_cert_file), key)
            except (OSError, ssl.SSLError) as exc:
                why = f"cannot load TLS files: {exc}"
                problems.append(ConfigProblem("fleet.nats.tls_ca_file", None, why))
    return problems
