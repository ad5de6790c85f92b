"""The release kinds: every kind of message gazeguard publishes, described once.

A :class:`ReleaseKind` holds the wire-level facts of one kind: its name, its message model, its
egress contract (:mod:`gazeguard.wire.egress`: schema id, topic pattern, whether retained,
shipped JSON Schema file, the rule of every field) and the ledger stream its releases are charged
to; its topic (a session's or a cohort's, and the last level) is read from the contract's
pattern and built by :mod:`gazeguard.wire.topics`. Whatever handles messages by
kind iterates over :data:`KINDS` instead of listing them: ``gazeguard schemas``
(:data:`SCHEMA_FILES`), ``gazeguard watch`` (:func:`kind_of_topic`, then its rendering by kind
name in :mod:`gazeguard.cli.watch`) and ``gazeguard ledger show`` (its sections by kind name in
:mod:`gazeguard.cli.ledger`). The renderings are keyed by name from the CLI layer because it sits
above this one. docs/design.md ("Release kinds") lists the files a new kind touches.

Every kind's topic level is distinct (a received message's kind is its topic's last level), and
every kind has a contract and a shipped schema (``tests/wire/test_kinds.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from gazeguard.wire import egress, message, topics
from gazeguard.wire.cohort import AttentionMessage, CohortMessage, CohortReceipt, ModeMessage
from gazeguard.wire.label import LabelMessage
from gazeguard.wire.message import ChunkMessage, StatusMessage, WireModel

Scope = Literal["session", "cohort"]


@dataclass(frozen=True, slots=True)
class ReleaseKind:
    """One kind of published message.

    Attributes:
        name: the kind's name (``watch`` prints it; the CLI's renderings are keyed by it).
        model: its pydantic message model.
        contract: its egress contract: schema id, topic pattern, retained, schema file, rules.
        stream: the ledger stream its releases are charged to, or ``None`` (not a charge of
            its own: the status, and the receipts of cohort buckets charged as their part).
    """

    name: str
    model: type[WireModel]
    contract: egress.Egress
    stream: str | None = None

    @property
    def scope(self) -> Scope:
        """``session`` (``{prefix}/{device}/{session}/{level}``) or ``cohort``
        (``{prefix}/cohort/{cohort}/{level}``), from the contract's topic pattern."""
        return "cohort" if self.contract.topic.startswith(_COHORT) else "session"

    @property
    def level(self) -> str:
        """Its topic's last level (what names the kind of a received message)."""
        return self.contract.topic.rsplit("/", 1)[-1]

    def topic(self, prefix: str, *names: str) -> str:
        """Its topic: ``names`` are ``(device, session)`` or ``(cohort,)`` by :attr:`scope`.

        Raises:
            ConfigError, ValueError: a name or the prefix is not topic-safe
                (:mod:`gazeguard.wire.topics`).
        """
        if self.scope == "session":
            device, session = names
            return topics.session_topic(prefix, device, session, self.level)
        (cohort,) = names
        return topics.cohort_level_topic(prefix, cohort, self.level)

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema (draft 2020-12) of its model, as it should be shipped."""
        return message.json_schema(self.model)

    def shipped_schema(self) -> dict[str, Any]:
        """Its JSON Schema as shipped in ``gazeguard/data``."""
        return message.shipped_schema(self.contract.schema_file)


_COHORT: Final = "{prefix}/cohort/{cohort}/"

CHUNKS: Final = ReleaseKind("chunks", ChunkMessage, egress.CHUNK, "chunks")
STATUS: Final = ReleaseKind("status", StatusMessage, egress.STATUS)
LABELS: Final = ReleaseKind("labels", LabelMessage, egress.LABEL, "labels")
AGGREGATES: Final = ReleaseKind("aggregates", CohortMessage, egress.COHORT, "cohort")
ATTENTION: Final = ReleaseKind("attention", AttentionMessage, egress.ATTENTION, "attention")
RECEIPTS: Final = ReleaseKind("receipts", CohortReceipt, egress.RECEIPT)
MODE: Final = ReleaseKind("mode", ModeMessage, egress.MODE, "mode")

#: Every kind gazeguard publishes, in the order ``gazeguard schemas`` lists them.
KINDS: Final = (CHUNKS, STATUS, LABELS, AGGREGATES, ATTENTION, RECEIPTS, MODE)

#: Every shipped payload schema: file name → model.
SCHEMA_FILES: Final[Mapping[str, type[WireModel]]] = {
    k.contract.schema_file: k.model for k in KINDS
}

_BY_LEVEL: Final = {k.level: k for k in KINDS}


def kind_of_topic(topic: str) -> ReleaseKind | None:
    """The kind a message on ``topic`` is (by the topic's last level), or ``None``."""
    return _BY_LEVEL.get(topic.rsplit("/", 1)[-1])
