"""Fixtures shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._nats_cluster import NatsNode, single_node


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsNode]:
    """One standalone NATS server (:func:`~tests._nats_cluster.single_node`), stopped after
    the test."""
    server = single_node(tmp_path)
    try:
        yield server
    finally:
        server.stop()
