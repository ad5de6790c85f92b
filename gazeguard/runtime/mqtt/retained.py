"""Read one topic's retained message from a broker, once (``gazeguard run`` reads its session's
retained status at startup to refuse a session another process is serving).

The broker sends a topic's retained message right after the SUBACK of a subscription to it, and
handles one client's SUBSCRIBE packets in order (Mosquitto and amqtt alike: amqtt sends the
retained messages of one subscription before it reads the next packet). So :func:`read_retained`
subscribes twice to the topic: once the second SUBACK is in, the retained message of the first
subscription, if the topic has one, has arrived already — no waiting for one that may never come.
"""

from __future__ import annotations

import asyncio
import logging

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.reasoncodes import ReasonCode

from gazeguard.config import BrokerSettings
from gazeguard.runtime.mqtt.client import ClientFactory

log = logging.getLogger(__name__)

#: CONNACK codes meaning "this protocol version is not spoken here" (3.1.1: 1; v5: 0x84).
_UNSUPPORTED_PROTOCOL = {1, 0x84}


async def read_retained(
    settings: BrokerSettings, topic: str, *, within_s: float = 5.0
) -> bytes | None:
    """The retained message of ``topic`` on the broker of ``settings`` (its host, port, login
    and TLS; MQTT 5, or 3.1.1 where ``broker.protocol`` says so or ``auto`` must fall back).

    ``None`` when the topic has no retained message, and also when it cannot be read: no
    connection within ``within_s`` seconds, the login refused, the subscription refused (an
    ACL). Those are logged at DEBUG: the caller goes on without the answer (the publisher reports
    its own connection problems).
    """
    factory = ClientFactory(settings)
    v5, v311 = aiomqtt.ProtocolVersion.V5, aiomqtt.ProtocolVersion.V311
    if settings.protocol == "3.1.1":
        protocols = [v311]
    else:
        protocols = [v5, v311] if settings.protocol == "auto" else [v5]
    for protocol in protocols:
        try:
            async with asyncio.timeout(within_s):
                return await _read(factory, protocol, topic, within_s)
        except MqttConnectError as exc:
            code = exc.rc.value if isinstance(exc.rc, ReasonCode) else exc.rc
            if code in _UNSUPPORTED_PROTOCOL and protocol is not protocols[-1]:
                continue
            log.debug("retained message of %s not read: %s", topic, exc)
        except (aiomqtt.MqttError, OSError, TimeoutError) as exc:
            log.debug("retained message of %s not read: %s", topic, str(exc) or type(exc).__name__)
        return None
    return None


async def _read(
    factory: ClientFactory, protocol: aiomqtt.ProtocolVersion, topic: str, timeout_s: float
) -> bytes | None:
    client = factory(None, protocol=protocol, timeout=timeout_s)
    async with client:
        granted = await client.subscribe(topic, qos=0)
        if any(isinstance(g, ReasonCode) and g.is_failure for g in granted) or any(
            isinstance(g, int) and g >= 0x80 for g in granted
        ):
            log.debug("retained message of %s not read: subscription refused (%s)", topic, granted)
            return None
        await client.subscribe(topic, qos=0)  # the barrier: see the module docstring
        while len(client.messages) > 0:
            message = await anext(aiter(client.messages))
            payload = message.payload
            if message.retain and isinstance(payload, bytes | bytearray):
                return bytes(payload)
        return None
