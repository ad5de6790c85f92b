"""Everything MQTT-specific, behind the transport-neutral outbox (:mod:`gazeguard.outbox`).

* :mod:`gazeguard.mqtt.client` — :class:`~gazeguard.mqtt.client.MqttClient` (aiomqtt's client
  with its socket kept watched and the PUBACK reason code kept), and building one from
  :class:`~gazeguard.config.BrokerSettings` (TLS context, credentials).
* :mod:`gazeguard.mqtt.sink` — :class:`~gazeguard.mqtt.sink.MqttSink`, the outbox's sink over
  MQTT: connecting (MQTT 5, the 3.1.1 fallback and its limit), QoS 1 publishes, PUBACK reasons,
  failures explained.
* :mod:`gazeguard.mqtt.topics` — the rule for names in topics, and the prefix check.
* :mod:`gazeguard.mqtt.broker` — the embedded broker (amqtt) and the probe of a port.

Importing this package imports none of them: :mod:`gazeguard.mqtt.topics` is used by the
configuration and the message models, which must not pull in aiomqtt.
"""
