"""Moved to :mod:`gazeguard.mqtt.topics`; this name stays until ``gazeguard.fleet`` and
``gazeguard.forward`` import it from there."""

from gazeguard.mqtt.topics import session_id_for

__all__ = ["session_id_for"]
