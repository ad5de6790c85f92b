"""``gazeguard dashboard``: a live page of the cohort releases a fleet publishes.

One process, read-only: an MQTT subscription (:mod:`~gazeguard.runtime.dashboard.feed`) on
``{prefix}/cohort/+/aggregates``, ``…/attention`` and ``…/mode`` keeps the recent messages
(:mod:`~gazeguard.runtime.dashboard.board`), and a small asyncio HTTP server
(:mod:`~gazeguard.runtime.dashboard.server`) serves a plain HTML page that receives them as
Server-Sent Events. The page (``gazeguard/data/dashboard/``: HTML, vanilla JavaScript, CSS; no
build step) shows per cohort and worker the mode per bucket over time, the latest bucket's noisy
session count, class shares and feature means, each with its 95 % noise band, the ε per hour the
messages state, a short history, and the attention heatmap as a picture; every figure is marked
readable or too noisy with the sessions it would need
(:mod:`~gazeguard.runtime.dashboard.readability`).

The 95 % band is the value ± 1.96 × the noise's standard deviation as the message states it
(``features[].sd``; ``sigma`` for counts): where the noise-free aggregate lies with 95 %
probability, from the privacy noise alone.
"""

from __future__ import annotations

from gazeguard.runtime.dashboard.board import Board, Event
from gazeguard.runtime.dashboard.feed import follow
from gazeguard.runtime.dashboard.server import DEFAULT_PORT, DashboardServer, serve_dashboard

__all__ = [
    "DEFAULT_PORT",
    "Board",
    "DashboardServer",
    "Event",
    "follow",
    "serve_dashboard",
]
