"""The egress contract: every field of every message gazeguard publishes, classified in one place.

Only the release plan's releases may depend on the user's gaze samples. Everything else that
leaves the process — on the broker, in a retained message — is **public**: a function of the
settings, the stream's declared metadata and a public clock, and of the ledger's state, which is
itself a function of those and of the public release schedule (``../shared/DESIGN.md``, "What
may depend on the gaze"). So each field of each published message is one of:

- **public** (:data:`PUBLIC`), with its basis (:data:`PublicBasis`): ``constant`` (the same in
  every message of its kind), ``settings`` (configuration, the release plan and the public
  feature registry), ``stream`` (what the stream declares: its source id, name, rate),
  ``schedule`` (the release schedule: indices and times on the public grid of the stream's
  clock), ``clock`` (a public clock read when the message was made, or the host's clock
  offset), ``lifetime`` (the session's open and close as the stream declares them) or
  ``ledger`` (the ledger's state: charges, caps, withholds and delivery, all of them functions of
  the public schedule and the settings);
- **released** (:data:`RELEASED`), with its basis (:data:`ReleasedBasis`): ``mechanism`` (the
  output of a charged mechanism of the plan) or ``post-processing`` (a function of such outputs
  and public values only).

A counter computed from the samples (how many arrived, were invalid, were dropped) is neither,
so no published message may carry one: it stays on the device, in the log and ``gazeguard
ledger show``. The operator metrics endpoint (:mod:`gazeguard.runtime.metrics`) is egress too
(Prometheus scrapes it from another host and keeps it): it serves counts of releases and of the
ledger's decisions, the outbox, the broker connection and the release path's latencies, never
a count of samples. ``public`` is what the contract *requires*: the neighbour harness holds the
code to it (every published field outside the released ones byte-identical on neighbouring
streams).

:data:`CONTRACT` maps each message kind (its ``schema`` id) to its topic, whether it is retained,
its shipped JSON Schema and its fields' rules, keyed by dotted path (``ledger.epsilon``; a list
of objects adds ``[]``: ``features[].mean``; a list of numbers is one field). ``tests/
test_egress.py`` walks the shipped schemas (:func:`field_paths`) and fails on a field the contract
does not classify and on a classified field that no longer exists. :func:`public_view` masks a
payload's released fields, so that tests can compare everything else byte for byte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Kind = Literal["public", "released"]
PUBLIC: Final = "public"
RELEASED: Final = "released"
PublicBasis = Literal["constant", "settings", "stream", "schedule", "clock", "lifetime", "ledger"]
ReleasedBasis = Literal["mechanism", "post-processing"]
#: What :func:`public_view` puts in place of a released value.
MASK: Final = "<released>"


@dataclass(frozen=True, slots=True)
class Rule:
    """One field's classification: ``kind``, the ``basis`` it is computed from, and a note."""

    kind: Kind
    basis: PublicBasis | ReleasedBasis
    note: str = ""


def public(basis: PublicBasis, note: str = "") -> Rule:
    """A public field computed from ``basis``."""
    return Rule(PUBLIC, basis, note)


def released(basis: ReleasedBasis, note: str = "") -> Rule:
    """A released field: out of a charged mechanism (``mechanism``) or post-processed from one."""
    return Rule(RELEASED, basis, note)


@dataclass(frozen=True, slots=True)
class Egress:
    """One kind of published message.

    Attributes:
        schema: its ``schema`` id, e.g. ``gazeguard.chunk/2``.
        topic: its MQTT topic pattern (``{prefix}`` is ``broker.topic_prefix``; ``{device}``,
            ``{session}`` and ``{cohort}`` are public names: settings or the stream's source id).
        retained: whether the broker keeps the latest one for new subscribers.
        schema_file: its JSON Schema in ``gazeguard/data``.
        fields: the rule of each field, by dotted path.
    """

    schema: str
    topic: str
    retained: bool
    schema_file: str
    fields: Mapping[str, Rule]


_SCHEMA = public("constant", "the message kind and version")
_SESSION = public("stream", "the session id: settings.session or the stream's source id")
_DEVICE = public("settings", "the device id (settings, or the forwarding headset's id)")
_RANDOMNESS = public("settings", "os-csprng, or INSECURE-seeded with mechanism.insecure_seed")
_COHORT = public("settings", "cohort.name")
_WORKER = public("settings", "fleet.worker_id (or host and process id)")
_BUCKET = public("schedule", "⌊t/bucket_s⌋: the bucket on the public clock")
_BUCKET_EDGE = public("schedule", "the bucket's edges, Unix s")
_COHORT_BUDGET = public("settings", "the cohort plan's calibration")
#: What a cohort's message of one bucket opens with (``wire.cohort.BucketMessage``).
_BUCKET_FIELDS: dict[str, Rule] = {
    "schema": _SCHEMA,
    "cohort": _COHORT,
    "worker": _WORKER,
    "bucket": _BUCKET,
    "bucket_start": _BUCKET_EDGE,
    "bucket_end": _BUCKET_EDGE,
}
#: The Gaussian noise and budget figures of the aggregate and attention messages.
_GAUSSIAN_BUDGET: dict[str, Rule] = {
    "sigma": _COHORT_BUDGET,
    "sensitivity_l2": _COHORT_BUDGET,
    "epsilon_per_hour": _COHORT_BUDGET,
    "delta": _COHORT_BUDGET,
    "mechanism": public("constant", "gaussian"),
}

_MECHANISM: dict[str, Rule] = {
    f"mechanism.{name}": public("settings", "the plan's mechanism and the public bounds")
    for name in (
        "name", "noise", "transform", "n", "k", "m", "epsilon", "noise_scale", "sensitivity",
        "noise_multiplier", "value_noise_sd", "value_noise_range", "lower", "upper",
    )
} | {"mechanism.randomness": _RANDOMNESS}  # fmt: skip

_LEDGER: dict[str, Rule] = {
    f"ledger.{name}": public("ledger", "the session's ledger right after this charge")
    for name in (
        "epsilon", "delta", "epsilon_window", "window_s", "chunk_epsilon", "session_spent",
        "per_chunk_max", "remaining", "session_cap", "window_cap",
    )
} | {
    "ledger.raw_event_epsilon": public("settings", "the plan's ε per raw gaze sample"),
    "ledger.chunks_reached": public("settings", "the plan's reach of one raw gaze sample"),
}  # fmt: skip

CHUNK: Final = Egress(
    "gazeguard.chunk/2",
    "{prefix}/{device}/{session}/chunks",
    retained=False,
    schema_file="chunk.schema.json",
    fields={
        "schema": _SCHEMA,
        "session": _SESSION,
        "device": _DEVICE,
        "chunk_index": public("schedule", "the chunk's number on the public grid"),
        "timestamps": public("schedule", "the chunk's step times: multiples of s on the grid"),
        "unix_start": public("schedule", "the first step time plus the host's clock offset"),
        "unix_end": public("schedule", "the last step time plus the host's clock offset"),
        "carries": public("settings", "what the mechanism's values carry, in words"),
        "profile": public("settings", "mechanism.profile"),
        "features": public("settings", "the plan's features"),
        "units": public("settings", "the feature registry's units"),
        "values": released("mechanism", "the chunk's privatized values [F][n]"),
        **_MECHANISM,
        **_LEDGER,
        "summary.mean": released("post-processing", "the mean of the published values"),
        "summary.last": released("post-processing", "the last published value"),
    },
)

LABEL: Final = Egress(
    "gazeguard.label/1",
    "{prefix}/{device}/{session}/labels",
    retained=False,
    schema_file="label.schema.json",
    fields={
        "schema": _SCHEMA,
        "session": _SESSION,
        "device": _DEVICE,
        "decision_index": public(
            "schedule",
            "the decision block's number on the public clock within the session: every "
            "block takes the next, released, withheld or dropped",
        ),
        "window_start": public("schedule", "the decision block's start on the public grid"),
        "window_end": public("schedule", "the decision block's end on the public grid"),
        "unix_end": public("schedule", "window_end plus the host's clock offset"),
        "label": released("mechanism", "randomized response"),
        "classes": public("settings", "the label model's classes"),
        "epsilon": public("settings", "the plan's ε per label"),
        "mechanism": public("constant", "randomized_response"),
        "survival_probability": public("settings", "e^ε/(e^ε + C − 1)"),
        "model.name": public("settings", "the label model's file"),
        "model.version": public("settings", "the label model's file"),
        "profile": public("settings", "the label model's profile"),
        "noise": _RANDOMNESS,
        "release": public("constant", "clock"),
        "clean_accuracy": public("settings", "the label model's file"),
    },
)

STATUS: Final = Egress(
    "gazeguard.status/2",
    "{prefix}/{device}/{session}/status",
    retained=True,
    schema_file="status.schema.json",
    fields={
        "schema": _SCHEMA,
        "session": _SESSION,
        "device": _DEVICE,
        "state": public(
            "ledger",
            "starting/running/budget_exhausted from the ledger's charges and withholds on the "
            "public schedule; stopped and stream_lost from the session's lifetime (the stream "
            "ended, or its inlet reported it lost); never whether samples arrive",
        ),
        "time": public("clock", "the host's clock when the status was made"),
        "epsilon": public("ledger"),
        "delta": public("ledger"),
        "epsilon_window": public("ledger"),
        "window_s": public("ledger"),
        "window_cap": public("ledger"),
        "spent": public("ledger"),
        "remaining": public("ledger"),
        "session_cap": public("ledger"),
        "chunks_charged": public("ledger", "charges on the public schedule"),
        "chunks_delivered": public("ledger", "the outbox: the broker's acknowledgements"),
        "chunks_refused": public("ledger", "the outbox: the broker's refusals"),
        "chunks_withheld": public("ledger", "charges a cap refused: the ledger's state"),
        "chunks_dropped": public(
            "ledger",
            "due releases that failed in the mechanism or the ledger (fail closed, recorded in "
            "the ledger); each also leaves a gap in chunk_index, so the count says no more than "
            "the chunks topic does",
        ),
        "reason": public(
            "ledger",
            "fixed words: a cap's refusal with the ledger's figures, a dropped chunk's index, "
            "the stream's end; never an error's text or type, never a count of samples",
        ),
    },
)

COHORT: Final = Egress(
    "gazeguard.cohort/1",
    "{prefix}/cohort/{cohort}/aggregates",
    retained=False,
    schema_file="cohort.schema.json",
    fields={
        **_BUCKET_FIELDS,
        "noisy_count": released("mechanism", "the noisy count coordinate of the Gaussian sum"),
        "count": released("post-processing", "max(1, round(noisy_count))"),
        "features[].name": public("settings", "the plan's features"),
        "features[].unit": public("settings", "the feature registry's units"),
        "features[].noisy_sum": released("mechanism", "the noisy sum"),
        "features[].mean": released("post-processing", "from noisy_sum and count"),
        "features[].sd": released("post-processing", "from σ and the released count"),
        "classes": public("settings", "the label model's classes"),
        "noisy_histogram": released("mechanism", "the noisy histogram"),
        "shares": released("post-processing", "the histogram's positive part, normalised"),
        **_GAUSSIAN_BUDGET,
        "profile": public("settings", "mechanism.profile"),
        "model": public("settings", "cohort.model"),
        "noise": _RANDOMNESS,
    },
)

ATTENTION: Final = Egress(
    "gazeguard.attention/1",
    "{prefix}/cohort/{cohort}/attention",
    retained=False,
    schema_file="attention.schema.json",
    fields={
        **_BUCKET_FIELDS,
        "rows": public("settings", "cohort.attention_grid"),
        "cols": public("settings", "cohort.attention_grid"),
        "fov_deg": public("settings", "the grid's field of view"),
        "grid": released("mechanism", "the noisy dwell sums per cell"),
        "heatmap": released("post-processing", "the grid's positive part, normalised"),
        "noisy_count": released("post-processing", "the noisy grid's (or AOI dwells') total"),
        "aois[].name": public("settings", "the AOI file's names, then elsewhere"),
        "aois[].noisy_dwell": released("mechanism", "the noisy AOI dwell sums"),
        "aois[].share": released("post-processing", "the dwells' positive part, normalised"),
        "aoi_file": public("settings", "cohort.attention_aois"),
        "dwell": public("constant", "valid-samples"),
        **_GAUSSIAN_BUDGET,
        "noise": _RANDOMNESS,
    },
)

MODE: Final = Egress(
    "gazeguard.mode/1",
    "{prefix}/cohort/{cohort}/mode",
    retained=False,
    schema_file="mode.schema.json",
    fields={
        **_BUCKET_FIELDS,
        "classes": public("settings", "the label model's classes"),
        "mode": released("mechanism", "permute-and-flip's choice among the classes"),
        "mode_index": released("post-processing", "the chosen class's index in classes"),
        "epsilon": _COHORT_BUDGET,
        "lead_for_90": public("settings", "a function of ε per bucket and the classes' number"),
        "epsilon_per_hour": _COHORT_BUDGET,
        "delta": _COHORT_BUDGET,
        "mechanism": public("constant", "permute-and-flip"),
        "profile": public("settings", "mechanism.profile"),
        "model": public("settings", "cohort.model"),
        "noise": _RANDOMNESS,
    },
)

RECEIPT: Final = Egress(
    "gazeguard.cohort-receipt/1",
    "{prefix}/{device}/{session}/cohort",
    retained=False,
    schema_file="cohort-receipt.schema.json",
    fields={
        "schema": _SCHEMA,
        "session": _SESSION,
        "cohort": _COHORT,
        "worker": _WORKER,
        "bucket": _BUCKET,
        "release": public("settings", "the part of the cohort plan charged"),
        "mechanism": public("settings", "the part's mechanism: gaussian or permute-and-flip"),
        "noise_multiplier": _COHORT_BUDGET,
        "epsilon_per_hour": _COHORT_BUDGET,
        "delta": _COHORT_BUDGET,
    },
)

#: Every message kind gazeguard publishes, by its ``schema`` id.
CONTRACT: Final[Mapping[str, Egress]] = {
    e.schema: e for e in (CHUNK, LABEL, STATUS, COHORT, ATTENTION, MODE, RECEIPT)
}


def field_paths(schema: Mapping[str, Any]) -> frozenset[str]:
    """Every field of a JSON Schema as a dotted path (``$ref`` to ``$defs`` followed, a list of
    objects marked ``[]``, a list of numbers or strings one field, a nullable object its
    fields)."""
    defs: Mapping[str, Any] = schema.get("$defs", {})

    def walk(node: Mapping[str, Any], path: str, seen: tuple[str, ...]) -> set[str]:
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name in seen:
                msg = f"{path}: a recursive schema ({' → '.join((*seen, name))})"
                raise ValueError(msg)
            return walk({**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}, path,
                        (*seen, name))  # fmt: skip
        out: set[str] = set()
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, ()):
                if sub != {"type": "null"}:
                    out |= walk(sub, path, seen)
        for name, sub in node.get("properties", {}).items():
            out |= walk(sub, f"{path}.{name}" if path else name, seen)
        items = node.get("items")
        if isinstance(items, Mapping):
            out |= walk(items, f"{path}[]", seen)
        if not out:
            out = {re.sub(r"(\[\])+$", "", path)}
        return out

    return frozenset(walk(schema, "", ()))


def released_paths(schema_id: str) -> frozenset[str]:
    """The released fields of a message kind (dotted paths).

    Raises:
        KeyError: ``schema_id`` is not a kind gazeguard publishes.
    """
    return frozenset(p for p, r in CONTRACT[schema_id].fields.items() if r.kind == RELEASED)


def public_view(payload: bytes | str) -> bytes:
    """``payload`` (a published JSON message) with every released value replaced by
    :data:`MASK`, as canonical JSON (sorted keys): equal for two messages exactly when all their
    public fields are.

    Raises:
        KeyError: the message's ``schema`` is not in :data:`CONTRACT`.
        ValueError: the payload is not a JSON object.
    """
    doc = json.loads(payload)
    if not isinstance(doc, dict):
        msg = "a published message is a JSON object"
        raise ValueError(msg)
    for path in released_paths(str(doc.get("schema"))):
        _mask(doc, path.split("."))
    return json.dumps(doc, sort_keys=True, ensure_ascii=False).encode()


def _mask(node: Any, parts: list[str]) -> None:
    if not parts or not isinstance(node, dict):
        return
    head, rest = parts[0], parts[1:]
    name, is_list = head.removesuffix("[]"), head.endswith("[]")
    if name not in node:
        return
    if not rest:
        node[name] = MASK
    elif is_list and isinstance(node[name], list):
        for item in node[name]:
            _mask(item, rest)
    else:
        _mask(node[name], rest)
