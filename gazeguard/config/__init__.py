"""Configuration: one pydantic-settings model, from a TOML file, ``GAZEGUARD_…`` environment
variables and CLI flags (highest priority last: file < environment < flags).

Nested sections map to environment variables with ``__``: ``GAZEGUARD_MECHANISM__EPSILON=0.5``.
Every invalid value is refused at startup with a :class:`~gazeguard.core.errors.ConfigError` that
names the field, the value and where it came from.

:func:`load_settings` refuses the first invalid value; :func:`check_with` collects every
problem — the schema's and those of a validator (:func:`gazeguard.runtime.preflight.
validate_settings`), which checks what only shows when
``gazeguard run`` builds its stages (release-profile feature names, window and step, the
mechanism's parameters, the preset's geometry, broker TLS and login, fleet mode, and the caps
against the session already stored in the ledger) — each with a "did you mean" where one fits.
``gazeguard config check FILE`` prints them; ``gazeguard run`` refuses the same things at startup.

Modules: :mod:`~gazeguard.config.settings` (the schema: every setting's type, range, default and
description) and :mod:`~gazeguard.config.problems` (reading the file, the environment and the
flags into :class:`Settings`, and reporting every problem with its source).
"""

from gazeguard.config.problems import (
    ConfigProblem,
    Validator,
    check_with,
    closest,
    load_settings,
)
from gazeguard.config.settings import (
    BrokerSettings,
    CohortRelease,
    CohortSettings,
    Epsilon,
    FeatureSettings,
    FleetSettings,
    IngestSettings,
    LabelSettings,
    LedgerSettings,
    MechanismSettings,
    MetricsSettings,
    NatsSettings,
    Preset,
    Settings,
    Transform,
    broker_address,
)

__all__ = [
    "BrokerSettings",
    "CohortRelease",
    "CohortSettings",
    "ConfigProblem",
    "Epsilon",
    "FeatureSettings",
    "FleetSettings",
    "IngestSettings",
    "LabelSettings",
    "LedgerSettings",
    "MechanismSettings",
    "MetricsSettings",
    "NatsSettings",
    "Preset",
    "Settings",
    "Transform",
    "Validator",
    "broker_address",
    "check_with",
    "closest",
    "load_settings",
]
