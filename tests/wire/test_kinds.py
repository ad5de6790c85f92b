"""The release-kind registry (`gazeguard.wire.kinds`): one description per published kind, in
agreement with the egress contract, the topic builders, the ledger streams and the CLI."""

from __future__ import annotations

import pytest

from gazeguard.cli import ledger as ledger_cli
from gazeguard.cli import watch
from gazeguard.plan import cohort as cohort_plan
from gazeguard.runtime import labels as label_stream
from gazeguard.wire import topics
from gazeguard.wire.egress import CONTRACT
from gazeguard.wire.kinds import (
    AGGREGATES,
    ATTENTION,
    CHUNKS,
    KINDS,
    LABELS,
    MODE,
    RECEIPTS,
    SCHEMA_FILES,
    STATUS,
    ReleaseKind,
    kind_of_topic,
)


def test_one_description_per_kind_names_and_levels_distinct() -> None:
    assert len({k.name for k in KINDS}) == len(KINDS)
    assert len({k.level for k in KINDS}) == len(KINDS), "a topic level names one kind"
    assert len(SCHEMA_FILES) == len(KINDS)


def test_every_kind_has_its_contract_and_every_contract_a_kind() -> None:
    assert {k.contract.schema: k.contract for k in KINDS} == dict(CONTRACT)
    for kind in KINDS:
        assert kind.model.model_fields["schema_"].default == kind.contract.schema


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_topic_is_the_contracts_and_names_the_kind(kind: ReleaseKind) -> None:
    names = ("hmd", "s1") if kind.scope == "session" else ("lab",)
    topic = kind.topic("gazeguard/v1", *names)
    want = kind.contract.topic.format(
        prefix="gazeguard/v1", device="hmd", session="s1", cohort="lab"
    )
    assert topic == want
    assert kind_of_topic(topic) is kind


def test_the_named_topic_builders_agree() -> None:
    p = "gazeguard/v1"
    assert topics.chunk_topic(p, "d", "s") == CHUNKS.topic(p, "d", "s")
    assert topics.status_topic(p, "d", "s") == STATUS.topic(p, "d", "s")
    assert topics.label_topic(p, "d", "s") == LABELS.topic(p, "d", "s")
    assert topics.receipt_topic(p, "d", "s") == RECEIPTS.topic(p, "d", "s")
    assert topics.cohort_topic(p, "c") == AGGREGATES.topic(p, "c")
    assert topics.attention_topic(p, "c") == ATTENTION.topic(p, "c")
    assert topics.mode_topic(p, "c") == MODE.topic(p, "c")
    with pytest.raises(ValueError, match="one topic level"):
        MODE.topic(p, "a/b")
    assert kind_of_topic("elsewhere/x") is None


def test_the_streams_are_the_ones_charged() -> None:
    assert CHUNKS.stream == "chunks"
    assert LABELS.stream == label_stream.STREAM
    assert AGGREGATES.stream == cohort_plan.STREAM
    assert ATTENTION.stream == cohort_plan.ATTENTION_STREAM
    assert MODE.stream == cohort_plan.MODE_STREAM
    assert STATUS.stream is None
    assert RECEIPTS.stream is None


def test_the_cli_renders_every_kind() -> None:
    assert set(watch.RENDER) == {k.name for k in KINDS}
    assert set(ledger_cli.SECTIONS) <= {k.name for k in KINDS if k.stream is not None}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_one_to_payload_and_from_payload_for_every_kind(kind: ReleaseKind) -> None:
    """The models inherit the one implementation of ``WireModel``; none has its own."""
    for name in ("to_payload", "from_payload"):
        assert name not in vars(kind.model), f"{kind.model.__name__} defines its own {name}"
