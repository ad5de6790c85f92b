"""MQTT topics: every topic gazeguard publishes on, and the one rule for the names it puts into
them (config validates names at startup with the same checks).

**Topic-safe names** (``device``, ``session``, a cohort name): 1 to :data:`MAX_NAME_CHARS`
characters, no leading or trailing whitespace, none of ``/ + #``, and no character of Unicode
category "C" — control characters (U+0000–U+001F, U+007F–U+009F such as U+0085), format
characters, lone surrogates (not encodable as UTF-8), private-use and unassigned code points
(which include the non-characters U+FFFE/U+FFFF and U+FDD0–U+FDEF). MQTT brokers reject such a
topic as a malformed packet and drop the connection, so one bad name would stall every chunk
queued after it; refusing it at startup means no chunk is ever charged under an undeliverable
topic.
"""

from __future__ import annotations

import re
import unicodedata

from gazeguard.core.errors import ConfigError

#: Longest device or session name, characters (a topic holds both, the prefix and a suffix).
MAX_NAME_CHARS = 128
#: Characters MQTT gives a meaning in topics.
RESERVED = "/+#"


def session_id_for(source_id: str, name: str) -> str:
    """A topic-safe session id derived from an LSL stream's identity (stable across restarts):
    its ``source_id``, else its name, else ``"gaze"``, with every run of characters outside
    ``A–Z a–z 0–9 _ . : -`` replaced by ``_`` and at most 120 characters kept."""
    raw = source_id or name or "gaze"
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", raw)[:120]


def name_problem(value: object) -> str | None:
    """Why ``value`` is not a topic-safe name (see the module docstring), or ``None``."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > MAX_NAME_CHARS:
        return f"is {len(value)} characters long; at most {MAX_NAME_CHARS}"
    if value != value.strip():
        return "must not start or end with whitespace"
    for i, c in enumerate(value):
        if c in RESERVED:
            return f"contains {c!r} at position {i} (MQTT topic separators and wildcards)"
        if unicodedata.category(c).startswith("C"):
            return (
                f"contains U+{ord(c):04X} at position {i} (a control, format, surrogate, "
                "private-use or non-character code point that brokers refuse in topics)"
            )
    return None


def check_name(field: str, value: str) -> str:
    """``value`` if it is a topic-safe name, else ConfigError naming ``field``."""
    why = name_problem(value)
    if why is not None:
        shown = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
        raise ConfigError(field, shown, f"{why}; choose another id")
    return value


def check_prefix(prefix: str) -> str:
    """The topic prefix: topic-safe levels separated by single ``/`` (e.g. ``gazeguard/v1``)."""
    levels = prefix.split("/") if isinstance(prefix, str) else [""]
    bad = [lv for lv in levels if name_problem(lv) is not None]
    if bad:
        raise ConfigError(
            "broker.topic_prefix",
            prefix,
            "must be topic-safe levels separated by single '/', without wildcards ('+', '#'), "
            "control characters or a leading/trailing '/' (default 'gazeguard/v1')",
        )
    return prefix


# ---------------------------------------------------------------------------------------------
# The topics: a session's, ``{prefix}/{device}/{session}/{level}``, and a cohort's,
# ``{prefix}/cohort/{cohort}/{level}`` (each kind's level: gazeguard.wire.kinds)


def session_topic(prefix: str, device: str, session: str, level: str) -> str:
    """``{prefix}/{device}/{session}/{level}``.

    Raises:
        ConfigError: a part is empty or contains MQTT wildcards or separators.
    """
    check_prefix(prefix)
    check_name("device", device)
    check_name("session", session)
    return f"{prefix}/{device}/{session}/{level}"


def cohort_level_topic(prefix: str, cohort: str, level: str) -> str:
    """``{prefix}/cohort/{cohort}/{level}``.

    Raises:
        ConfigError: the prefix is not topic-safe.
        ValueError: the cohort name is empty or not one topic level.
    """
    check_prefix(prefix)
    if not cohort or any(c in cohort for c in RESERVED):
        msg = f"cohort name {cohort!r} must be one topic level (no '/', '+' or '#')"
        raise ValueError(msg)
    return f"{prefix}/cohort/{cohort}/{level}"


def chunk_topic(prefix: str, device: str, session: str) -> str:
    """``{prefix}/{device}/{session}/chunks``: one privatized chunk per message, QoS 1."""
    return session_topic(prefix, device, session, "chunks")


def status_topic(prefix: str, device: str, session: str) -> str:
    """``{prefix}/{device}/{session}/status``: the retained session status."""
    return session_topic(prefix, device, session, "status")


def label_topic(prefix: str, device: str, session: str) -> str:
    """``{prefix}/{device}/{session}/labels``: one private label per message, QoS 1."""
    return session_topic(prefix, device, session, "labels")


def receipt_topic(prefix: str, device: str, session: str) -> str:
    """``{prefix}/{device}/{session}/cohort``: the session's cohort receipts."""
    return session_topic(prefix, device, session, "cohort")


def cohort_topic(prefix: str, cohort: str) -> str:
    """``{prefix}/cohort/{cohort}/aggregates``."""
    return cohort_level_topic(prefix, cohort, "aggregates")


def attention_topic(prefix: str, cohort: str) -> str:
    """``{prefix}/cohort/{cohort}/attention``."""
    return cohort_level_topic(prefix, cohort, "attention")


def mode_topic(prefix: str, cohort: str) -> str:
    """``{prefix}/cohort/{cohort}/mode``."""
    return cohort_level_topic(prefix, cohort, "mode")
