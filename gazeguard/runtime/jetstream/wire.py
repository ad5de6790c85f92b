"""JetStream wire of the fleet: subjects, the stream and its partition consumers, connection
options and the headers devices set (see :mod:`gazeguard.runtime.jetstream`)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import ssl
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import (
    StorageType,
    StreamConfig,
    SubjectTransform,
)

from gazeguard.core.errors import ConfigError, StreamError

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

    from gazeguard.config import NatsSettings


log = logging.getLogger(__name__)

#: Headers a device may set on a block (see the module docstring).
UNIX_OFFSET_HEADER = "Gazeguard-Unix-Offset"
#: The device's declared sampling rate, Hz (the LSL stream's nominal_srate): a worker builds the
#: session's event detector for it (``ingest.rate_hz`` on the worker overrides it).
RATE_HEADER = "Gazeguard-Rate-Hz"


NOW_HEADER = "Gazeguard-Now"


#: A worker's pull request: at most this many blocks, expiring after this long (ns).
PULL_BATCH = 64
PULL_EXPIRES_NS = 500_000_000

#: One subject token: a device or session id.
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def gaze_subject(prefix: str, device: str, session: str) -> str:
    """The subject a device publishes ``session``'s gaze on.

    Raises:
        StreamError: ``device`` or ``session`` is not one subject token (letters, digits,
            ``_``, ``-``).
    """
    for name, value in (("device", device), ("session", session)):
        if not _TOKEN.match(value):
            msg = f"{name} {value!r} is not one NATS subject token (letters, digits, _ and -)"
            raise StreamError(msg)
    return f"{prefix}.{device}.{session}"


def partition_subject(prefix: str, partition: int | str) -> str:
    """The stored subjects of one partition (``"*"``: of all), as consumers filter them."""
    return f"{prefix}.part.{partition}.>"


def stream_config(nats_settings: NatsSettings) -> StreamConfig:
    """The raw gaze stream: ``{prefix}.*.*`` kept ``max_age_s``, partitioned by the server."""
    prefix, p = nats_settings.subject_prefix, nats_settings.partitions
    return StreamConfig(
        name=nats_settings.stream,
        subjects=[f"{prefix}.*.*"],
        storage=StorageType.FILE,
        max_age=nats_settings.max_age_s,
        num_replicas=nats_settings.replicas,
        subject_transform=SubjectTransform(
            src=f"{prefix}.*.*",
            dest=f"{prefix}.part.{{{{partition({p},1,2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}",
        ),
    )


def consumer_name(partition: int) -> str:
    """The durable consumer of ``partition``."""
    return f"part-{partition}"


def connect_options(nats_settings: NatsSettings, name: str) -> dict[str, Any]:
    """Keyword arguments of :func:`nats.connect` for ``fleet.nats`` (login, TLS, reconnects).

    Raises:
        ConfigError: a TLS file that cannot be loaded.
    """

    async def on_error(exc: Exception) -> None:
        # nats-py's default logs every error with its traceback at ERROR: a server outage wrote
        # one per reconnect attempt (two a second). One line each; failed attempts at DEBUG.
        attempt = isinstance(exc, ConnectionRefusedError | TimeoutError)
        level = logging.DEBUG if attempt else logging.WARNING
        log.log(level, "%s: NATS: %s", name, str(exc) or type(exc).__name__)

    async def on_reconnect() -> None:
        log.info("%s: reconnected to NATS", name)

    opts: dict[str, Any] = {
        "servers": list(nats_settings.servers),
        "name": name,
        "max_reconnect_attempts": -1,  # forever: an outage is waited out, blocks buffered
        "reconnect_time_wait": 0.5,
        "connect_timeout": 2,
        "error_cb": on_error,
        "reconnected_cb": on_reconnect,
    }
    if nats_settings.creds_file is not None:
        opts["user_credentials"] = str(nats_settings.creds_file)
    if nats_settings.user is not None:
        opts["user"] = nats_settings.user
        if nats_settings.password is not None:
            opts["password"] = nats_settings.password.get_secret_value()
    tls_wanted = nats_settings.tls_ca_file is not None or nats_settings.tls_cert_file is not None
    if tls_wanted or any(s.startswith("tls://") for s in nats_settings.servers):
        try:
            ctx = ssl.create_default_context(
                cafile=None if nats_settings.tls_ca_file is None else str(nats_settings.tls_ca_file)
            )
            if nats_settings.tls_cert_file is not None:
                ctx.load_cert_chain(
                    str(nats_settings.tls_cert_file),
                    None if nats_settings.tls_key_file is None else str(nats_settings.tls_key_file),
                )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                "fleet.nats.tls_ca_file", None, f"cannot load TLS files: {exc}"
            ) from exc
        opts["tls"] = ctx
    return opts


async def cancel_connect(task: asyncio.Future[Any], every_s: float = 0.1) -> None:
    """Cancel a ``nats.connect`` (or what awaits one) and wait until it has ended, cancelling
    again every ``every_s`` seconds; its outcome is dropped.

    One cancellation can be lost: on Python 3.11, ``asyncio.wait_for`` (nats-py's connect
    timeout) drops a cancellation that arrives as the connection attempt fails, and nats-py
    then tries the next attempt as if nothing happened; awaiting the task once would wait for
    ever (seen: a ``gazeguard forward`` stopped by Ctrl-C while NATS was down did not exit).
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    if not task.cancelled():
        task.exception()  # retrieved: the caller is leaving; nothing to report


class JetStreamNotReadyError(StreamError):
    """JetStream did not answer, or answered that it is unavailable for now (no server
    reachable, JetStream still starting, a cluster without a meta leader): worth retrying."""


#: The JetStream API's "temporarily unavailable" answers (no meta leader, JetStream starting).
_UNAVAILABLE = 503


async def ensure_stream(js: JetStreamContext, nats_settings: NatsSettings) -> None:
    """Create the raw gaze stream, or bring an existing one to this configuration.

    Raises:
        JetStreamNotReadyError: no answer, or JetStream unavailable for now (retry later).
        nats.js.errors.APIError: the server refused the configuration.
    """
    config = stream_config(nats_settings)
    try:
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:  # exists with another configuration
            await js.update_stream(config)
    except nats.js.errors.ServiceUnavailableError as exc:
        msg = f"JetStream unavailable: {exc.description or exc}"
        raise JetStreamNotReadyError(msg) from exc
    except nats.js.errors.APIError:
        raise
    except (nats.errors.Error, TimeoutError) as exc:  # no responders, timeout, reconnecting
        msg = f"creating stream {nats_settings.stream}: {str(exc) or type(exc).__name__}"
        raise JetStreamNotReadyError(msg) from exc


async def ensure_consumers(nc: Client, nats_settings: NatsSettings) -> None:
    """Create (or update) the durable pinned-client consumer of every partition.

    Raises:
        JetStreamNotReadyError: no answer, or JetStream unavailable for now (retry later).
        StreamError: the server refused one (e.g. older than 2.11: no priority groups).
    """
    for p in range(nats_settings.partitions):
        name = consumer_name(p)
        config = {
            "durable_name": name,
            "filter_subject": partition_subject(nats_settings.subject_prefix, p),
            "ack_policy": "explicit",
            "ack_wait": int(nats_settings.ack_wait_s * 1e9),
            "max_ack_pending": 1000,
            "deliver_policy": "all",
            "num_replicas": nats_settings.replicas,
            "priority_groups": [nats_settings.group],
            "priority_policy": "pinned_client",
            "priority_timeout": int(nats_settings.pin_timeout_s * 1e9),
        }
        try:
            reply = await nc.request(
                f"$JS.API.CONSUMER.CREATE.{nats_settings.stream}.{name}",
                json.dumps({"stream_name": nats_settings.stream, "config": config}).encode(),
                timeout=5,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            msg = f"creating consumer {name}: {str(exc) or type(exc).__name__}"
            raise JetStreamNotReadyError(msg) from exc
        answer = json.loads(reply.data)
        if (answer.get("error") or {}).get("code") == _UNAVAILABLE:
            msg = f"JetStream unavailable: {answer['error'].get('description', answer['error'])}"
            raise JetStreamNotReadyError(msg)
        if "error" in answer:
            msg = f"JetStream refused consumer {name}: {answer['error']}"
            raise StreamError(msg)
        if answer.get("config", {}).get("priority_policy") != "pinned_client":
            msg = f"consumer {name}: the server ignores priority groups (needs nats-server ≥ 2.11)"
            raise StreamError(msg)


#: Tokens of a JetStream ack subject without domain and account hash.
_ACK_TOKENS = 9


def header_float(msg: Msg, name: str) -> float | None:
    """A finite float header, else ``None`` (absent or malformed: ignored)."""
    raw = (msg.headers or {}).get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def stream_position(msg: Msg) -> tuple[int, float]:
    """``(stream sequence, server receipt time in Unix s)`` of a JetStream message, read from
    its ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
    seq>.<ns>.<pending>``) as ``msg.metadata`` reads it, without building its objects (the
    worker reads this for every block); other forms of the subject go through ``msg.metadata``.

    Raises:
        nats.js.errors.NotJSMessageError: not a JetStream message.
    """
    tokens = (msg.reply or "").split(".")
    if len(tokens) == _ACK_TOKENS and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5]), int(tokens[7]) / 1e9
    meta = msg.metadata
    return meta.sequence.stream, meta.timestamp.timestamp()
