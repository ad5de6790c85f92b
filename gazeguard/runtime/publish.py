"""Publish: the ledger's outbox delivered to an MQTT broker, in order, at least once.

:class:`Publisher` is the ordered outbox drain (:class:`gazeguard.ledger.outbox.Drain`: ordering,
at-least-once delivery, refused items moved aside, retries, flush) delivering through the MQTT
sink (:class:`gazeguard.runtime.mqtt.sink.MqttSink`: QoS 1 publishes and their PUBACKs, connecting,
TLS, login, the MQTT 3.1.1 fallback), plus the sessions' retained status messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gazeguard.config import BrokerSettings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger.outbox import Drain, Outbox, OutboxEntry
from gazeguard.runtime.mqtt.sink import MqttSink
from gazeguard.wire.message import StatusMessage
from gazeguard.wire.topics import status_topic

log = logging.getLogger(__name__)


class Publisher(Drain):
    """Deliver the ledger's outbox and the sessions' retained status to an MQTT broker.

    An async context manager owning one named task (``{name}.connection``, which runs
    ``{name}.drain`` and ``{name}.watch`` per connection) in a TaskGroup; it logs to
    ``gazeguard.runtime.publish``.

    Args:
        settings: broker address, TLS, credentials, protocol, keepalive, backoff cap, prefix.
        outbox: the ledger; ``pending`` and ``mark_delivered`` run in worker threads, or on
            the event loop with ``inline``.
        connect_timeout: if set, entering waits up to this many seconds for the first
            connection and raises :class:`~gazeguard.core.errors.PublishError` if there is none
            (fail fast at startup).
        poll_interval_s: look at the outbox at least this often even without :meth:`notify`
            (picks up items charged by another process or before a restart), s.
        batch: outbox items fetched per query.
        on_acked: called on the event loop with each outbox item right after its positive
            PUBACK (before ``mark_delivered`` commits), e.g. to measure latency; must not raise.
        on_sent: called on the event loop with each outbox item as its PUBLISH is started;
            must not raise.
        name: prefix of the task names.
        inline: see :class:`~gazeguard.ledger.outbox.Drain`.

    Raises:
        ConfigError: no broker host, inconsistent TLS or credential settings, unreadable
            certificate files.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        outbox: Outbox,
        *,
        connect_timeout: float | None = None,
        poll_interval_s: float = 1.0,
        batch: int = 64,
        on_acked: Callable[[OutboxEntry], None] | None = None,
        on_sent: Callable[[OutboxEntry], None] | None = None,
        name: str = "gazeguard.runtime.publish",
        inline: bool = False,
    ) -> None:
        if settings.host is None:
            raise ConfigError(
                "broker.host",
                None,
                "the publisher needs a broker; start "
                "gazeguard.runtime.mqtt.broker.EmbeddedBroker and "
                "use its settings(), or set broker.host",
            )
        super().__init__(
            outbox,
            MqttSink(settings),
            connect_timeout=connect_timeout,
            poll_interval_s=poll_interval_s,
            batch=batch,
            reconnect_max_s=settings.reconnect_max_s,
            on_acked=on_acked,
            on_sent=on_sent,
            name=name,
            logger=log,
            inline=inline,
        )
        self.settings = settings
        self.host: str = settings.host
        self.port = settings.port

    @property
    def endpoint(self) -> str:
        """``host:port`` of the broker."""
        return f"{self.host}:{self.port}"

    def publish_status(self, status: StatusMessage) -> None:
        """Queue ``status`` as the retained status of its session; a newer one replaces it.

        Not durable: it is sent after the outbox is drained, and again after each reconnect.
        """
        topic = status_topic(self.settings.topic_prefix, status.device, status.session)
        self.put_latest(topic, status.to_payload())
