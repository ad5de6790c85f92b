"""Moved to :mod:`gazeguard.mqtt.client`; this name stays until ``gazeguard.fleet`` imports it
from there."""

from gazeguard.mqtt.client import MqttClient

__all__ = ["MqttClient"]
