"""The egress contract (`gazeguard.wire.egress`, issue 46): every field of every published message
is classified public or released, checked against the shipped JSON Schemas, field by field."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gazeguard.cli.schemas import SCHEMAS
from gazeguard.wire import message
from gazeguard.wire.egress import (
    CONTRACT,
    MASK,
    PUBLIC,
    RELEASED,
    field_paths,
    public_view,
    released_paths,
)
from gazeguard.wire.message import ChunkMessage, LedgerSnapshot, MechanismParams


def test_every_shipped_schema_is_in_the_contract_and_every_kind_has_one() -> None:
    files = {e.schema_file: e for e in CONTRACT.values()}
    assert set(files) == set(SCHEMAS), "a published kind without a contract, or the reverse"
    for name, model in SCHEMAS.items():
        assert model.model_fields["schema_"].default == files[name].schema


@pytest.mark.parametrize("schema_id", sorted(CONTRACT))
def test_every_field_of_the_shipped_schema_is_classified(schema_id: str) -> None:
    """A field the contract does not classify fails, and so does a classified field that no
    longer exists: the contract and the wire change together."""
    egress = CONTRACT[schema_id]
    shipped = field_paths(message.shipped_schema(egress.schema_file))
    model = field_paths(message.json_schema(SCHEMAS[egress.schema_file]))
    assert shipped == model, f"{egress.schema_file} is stale: gazeguard schemas --write"
    classified = set(egress.fields)
    unclassified = sorted(shipped - classified)
    gone = sorted(classified - shipped)
    assert not unclassified, f"{schema_id}: unclassified fields {unclassified}"
    assert not gone, f"{schema_id}: classified fields that no longer exist {gone}"
    for path, rule in egress.fields.items():
        assert rule.kind in (PUBLIC, RELEASED), path
        public_bases = ("constant", "settings", "stream", "schedule", "clock", "lifetime", "ledger")
        bases = public_bases if rule.kind == PUBLIC else ("mechanism", "post-processing")
        assert rule.basis in bases, (path, rule)


@pytest.mark.parametrize("schema_id", ["gazeguard.status/2", "gazeguard.cohort-receipt/1"])
def test_status_and_receipts_release_nothing(schema_id: str) -> None:
    """What is not a release is public through and through: the retained status and the
    cohort receipts carry no field out of a mechanism, and no count of samples."""
    egress = CONTRACT[schema_id]
    assert released_paths(schema_id) == frozenset()
    assert egress.retained == (schema_id == "gazeguard.status/2")
    words = {"samples", "invalid", "ingest", "duplicates", "lost", "resyncs", "tail_steps"}
    assert not {p for p in egress.fields if any(w in p for w in words)}


def test_every_release_has_a_mechanism_field() -> None:
    for schema_id in ("gazeguard.chunk/2", "gazeguard.label/1", "gazeguard.cohort/1"):
        rules = CONTRACT[schema_id].fields.values()
        assert any(r.kind == RELEASED and r.basis == "mechanism" for r in rules), schema_id


def test_field_paths_follow_refs_lists_and_nullable_objects() -> None:
    schema: dict[str, Any] = {
        "$defs": {
            "Inner": {"type": "object", "properties": {"a": {"type": "number"}}},
        },
        "type": "object",
        "properties": {
            "plain": {"type": "string"},
            "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            "inner": {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}]},
            "many": {"type": "array", "items": {"$ref": "#/$defs/Inner"}},
            "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
    }
    assert field_paths(schema) == {"plain", "matrix", "inner.a", "many[].a", "maybe"}


def _chunk(values: np.ndarray) -> bytes:
    mech = MechanismParams(
        name="lpa", transform=None, n=2, k=None, m=2, epsilon=[1.0], noise_scale=[2.0],
        sensitivity=[2.0], noise_multiplier=[1.0], randomness="INSECURE-seeded",
        value_noise_sd=[2.0], value_noise_range=[0.2], lower=[0.0], upper=[10.0],
    )  # fmt: skip
    led = LedgerSnapshot(
        epsilon=1.0, delta=1e-6, epsilon_window=1.0, window_s=3600.0, chunk_epsilon=1.0,
        session_spent=1.0, per_chunk_max=1.0, remaining=None, session_cap=None, window_cap=None,
    )  # fmt: skip
    return ChunkMessage.build(
        session="s", device="d", chunk_index=0, timestamps=[1.0, 1.5], features=["pupil_mean"],
        units=["mm"], values=values, mechanism=mech, ledger=led, unix_offset=0.0,
    ).to_payload()  # fmt: skip


def test_public_view_masks_the_released_fields_only() -> None:
    a, b = _chunk(np.array([[3.0, 4.0]])), _chunk(np.array([[5.0, 6.0]]))
    assert a != b
    assert public_view(a) == public_view(b)
    view = json.loads(public_view(a))
    assert view["values"] == MASK
    assert view["mechanism"]["epsilon"] == [1.0]
    assert view["ledger"]["epsilon"] == 1.0
    other = json.loads(a) | {"chunk_index": 1}
    assert public_view(json.dumps(other)) != public_view(a)
    with pytest.raises(KeyError):
        public_view(b'{"schema": "gazeguard.unknown/1"}')
