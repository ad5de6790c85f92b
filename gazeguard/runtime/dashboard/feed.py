"""The dashboard's one MQTT subscription: ``{prefix}/cohort/+/aggregates``,
``{prefix}/cohort/+/attention`` and ``{prefix}/cohort/+/mode`` at QoS 1, fed into a
:class:`~gazeguard.runtime.dashboard.board.Board`.

Read-only: the client subscribes and never publishes (no will, no retained state of its own; a
clean session with an id the broker picks, so any number of dashboards can watch one broker).
It speaks MQTT 3.1.1, which every broker ``gazeguard run`` may be talking to accepts (the
embedded amqtt one included), and takes the broker's TLS and login from ``broker.*``
(:class:`~gazeguard.runtime.mqtt.client.ClientFactory`).

A broker that is not up yet, or goes away, is retried with a backoff up to
:data:`RETRY_MAX_S`; each outage is said once (``notice``), and so is each connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiomqtt

from gazeguard.config import BrokerSettings
from gazeguard.runtime.dashboard.board import Board
from gazeguard.runtime.mqtt.client import ClientFactory

#: First and longest wait between connection attempts, s.
RETRY_MIN_S = 0.5
RETRY_MAX_S = 5.0


def topics(prefix: str) -> list[str]:
    """The topic filters the dashboard subscribes to."""
    return [
        f"{prefix}/cohort/+/aggregates",
        f"{prefix}/cohort/+/attention",
        f"{prefix}/cohort/+/mode",
    ]


def _reason(exc: BaseException) -> str:
    """One line on why a connection failed or ended."""
    text = str(exc.__cause__ or exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


async def follow(
    board: Board,
    settings: BrokerSettings,
    notice: Callable[[str], None],
    factory: ClientFactory | None = None,
) -> None:
    """Subscribe and feed ``board`` until cancelled, reconnecting after every failure.

    Args:
        board: where messages go (and the broker's state, for the page).
        settings: the broker (``host`` unset: ``127.0.0.1``), its TLS, login and topic prefix.
        notice: called with one line when the broker cannot be reached (once per outage) and
            when the subscription is in place.
        factory: the clients' factory for ``settings`` (default: made here).

    Raises:
        ConfigError: inconsistent TLS or login settings (before any attempt).
    """
    factory = factory or ClientFactory(settings)
    address = f"{settings.host or '127.0.0.1'}:{settings.port}"
    filters = topics(settings.topic_prefix)
    delay = RETRY_MIN_S
    down = False  # the outage has been announced
    while True:
        board.set_broker("connecting", address)
        client = factory(None, protocol=aiomqtt.ProtocolVersion.V311)
        subscribed = False
        try:
            async with client:
                await client.subscribe([(f, 1) for f in filters])
                board.set_broker("connected", address)
                notice(f"subscribed to {' and '.join(filters)} on {address}")
                subscribed, down, delay = True, False, RETRY_MIN_S
                async for message in client.messages:
                    payload = message.payload
                    if isinstance(payload, bytes | bytearray):
                        board.receive(str(message.topic), bytes(payload))
            reason = "the broker closed the connection"
        except aiomqtt.MqttError as exc:
            reason = _reason(exc)
        board.set_broker("waiting", address, reason)
        if not down:
            what = "lost the connection to" if subscribed else "cannot reach"
            notice(
                f"{what} broker {address} ({reason}); retrying every {RETRY_MAX_S:g} s at most "
                "(Ctrl-C to stop)"
            )
            down = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)
