"""A schema-valid :class:`MechanismParams` for the tests and benchmarks building chunk messages."""

from __future__ import annotations

from typing import Any

from gazeguard.wire.message import MechanismParams


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
