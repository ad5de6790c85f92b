"""Schema-valid message parts for the tests and benchmarks: chunk mechanism parameters, statuses."""

from __future__ import annotations

import time
from typing import Any

from gazeguard.wire.message import MechanismParams, StatusMessage


def mechanism_params(features: int, steps: int, **over: Any) -> MechanismParams:
    """DCFPA parameters (DFT, Laplace noise, the OS CSPRNG) of ``features`` features over ``steps``
    time steps per chunk, bounds ``[0, 10]``, every per-feature figure the same (lists of length
    ``features``); ``over`` replaces any field."""
    fields: dict[str, Any] = {
        "name": "dcfpa",
        "transform": "dft",
        "n": steps,
        "k": 3,
        "m": 5,
        "epsilon": [0.5] * features,
        "noise_scale": [1.0] * features,
        "sensitivity": [0.3] * features,
        "noise_multiplier": [2.0] * features,
        "noise": "laplace",
        "randomness": "os-csprng",
        "value_noise_sd": [1.0] * features,
        "value_noise_range": [0.1] * features,
        "lower": [0.0] * features,
        "upper": [10.0] * features,
    }
    fields.update(over)
    return MechanismParams.model_validate(fields)


def status_message(session: str, device: str, **over: Any) -> StatusMessage:
    """The status of ``device``'s ``session``: running now (Unix s), nothing spent or charged, no
    remaining budget or session cap stated; ``over`` replaces any field."""
    fields: dict[str, Any] = {
        "session": session,
        "device": device,
        "state": "running",
        "time": time.time(),
        "spent": 0.0,
        "remaining": None,
        "session_cap": None,
        "chunks_charged": 0,
        "chunks_withheld": 0,
        "chunks_dropped": 0,
    }
    fields.update(over)
    return StatusMessage.model_validate(fields)
