"""Everything MQTT-specific, behind the transport-neutral outbox (:mod:`gazeguard.ledger.outbox`).

* :mod:`gazeguard.runtime.mqtt.client` — :class:`~gazeguard.runtime.mqtt.client.MqttClient`
(aiomqtt's client
  with its socket kept watched and the PUBACK reason code kept), and building one from
  :class:`~gazeguard.config.BrokerSettings` (TLS context, credentials).
* :mod:`gazeguard.runtime.mqtt.sink` — :class:`~gazeguard.runtime.mqtt.sink.MqttSink`, the outbox's
sink over
  MQTT: connecting (MQTT 5, the 3.1.1 fallback and its limit), QoS 1 publishes, PUBACK reasons,
  failures explained.
* :mod:`gazeguard.wire.topics` — the rule for names in topics, and the prefix check.
* :mod:`gazeguard.runtime.mqtt.broker` — the embedded broker (amqtt) and the probe of a port.

Importing this package imports none of them: :mod:`gazeguard.wire.topics` is used by the
configuration and the message models, which must not pull in aiomqtt.
"""
