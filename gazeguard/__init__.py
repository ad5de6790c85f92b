"""gazeguard: a differential-privacy sidecar for eye-tracking streams.

LSL gaze in → events → sliding-window features → power-of-two chunks → DCFPA (or LPA/FPA/CFPA)
→ durable ε ledger → MQTT. Raw gaze never leaves the process.

The names a headset vendor's integration needs are importable from here
(``from gazeguard import ReleasePlan, Pipeline, Ledger``; ``docs/python-api.md``). They are
loaded on first use, so ``import gazeguard`` (and the CLI's start-up) does not load the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gazeguard.core.version import __version__

if TYPE_CHECKING:
    from gazeguard.config import FeatureSettings, MechanismSettings, Settings
    from gazeguard.core.samples import GazeSamples
    from gazeguard.ledger import Ledger
    from gazeguard.plan import ReleasePlan
    from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
    from gazeguard.runtime.service import serve
    from gazeguard.runtime.simulate import simulate_gaze


#: public name → the module that defines it
_HOME = {
    "FeatureSettings": "gazeguard.config",
    "GazeSamples": "gazeguard.core.samples",
    "Ledger": "gazeguard.ledger",
    "MechanismSettings": "gazeguard.config",
    "Pipeline": "gazeguard.runtime.pipeline",
    "ReleasePlan": "gazeguard.plan",
    "ReleasedChunk": "gazeguard.runtime.pipeline",
    "Settings": "gazeguard.config",
    "serve": "gazeguard.runtime.service",
    "simulate_gaze": "gazeguard.runtime.simulate",
}

__all__ = [
    "FeatureSettings",
    "GazeSamples",
    "Ledger",
    "MechanismSettings",
    "Pipeline",
    "ReleasePlan",
    "ReleasedChunk",
    "Settings",
    "__version__",
    "serve",
    "simulate_gaze",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'gazeguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
