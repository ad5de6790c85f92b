"""Configuration: one pydantic-settings model, from a TOML file, ``GAZEGUARD_…`` environment
variables and CLI flags (highest priority last: file < environment < flags).

Nested sections map to environment variables with ``__``: ``GAZEGUARD_MECHANISM__EPSILON=0.5``.
Every invalid value is refused at startup with a :class:`~gazeguard.errors.ConfigError` that names
the field, the value and where it came from.

``gazeguard config check FILE`` validates a file and prints the effective configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gazeguard.errors import ConfigError

Preset = Literal["auto", "gazeguard", "pupil_capture", "pupil_neon", "tobii", "eyelink", "generic"]
MechanismName = Literal["lpa", "cfpa", "dcfpa"]
Transform = Literal["dft", "dct"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IngestSettings(_Section):
    """Where the gaze comes from and how its channels are read."""

    source: Literal["auto", "lsl", "simulated", "mqtt"] = Field(
        "auto",
        description="'lsl': wait for a headset stream; 'simulated': built-in simulated headset; "
        "'mqtt': raw gaze from an MQTT topic inside a trusted network (fleet mode only); "
        "'auto': resolve an LSL stream and, if none appears and no stream name or source_id is "
        "configured, start the simulated headset (with a warning)",
    )
    simulated_rate_hz: float = Field(120.0, gt=0, description="rate of the simulated headset, Hz")
    simulated_seed: int = Field(1, description="which simulated person")

    stream_type: str = Field("Gaze", description="LSL stream type to resolve ('Gaze' is XDF's)")
    stream_name: str | None = Field(None, description="LSL stream name to resolve")
    source_id: str | None = Field(None, description="LSL source_id to resolve")
    preset: Preset = Field(
        "auto", description="channel layout; 'auto' picks by stream name/type and XDF metadata"
    )
    resolve_timeout_s: float = Field(10.0, gt=0, description="give up resolving after this, s")
    field_of_view_deg: tuple[float, float] = Field(
        (100.0, 90.0), description="horizontal, vertical FOV for normalised coordinates, deg"
    )
    screen_size_mm: tuple[float, float] | None = Field(
        None, description="screen width, height for pixel/mm coordinates (desktop trackers), mm"
    )
    screen_resolution_px: tuple[int, int] | None = Field(None, description="width, height, px")
    screen_distance_mm: float | None = Field(None, gt=0, description="eye-screen distance, mm")
    confidence_threshold: float = Field(
        0.6, ge=0, le=1, description="samples below this confidence are invalid"
    )
    pupil_area_scale_mm: float | None = Field(
        None,
        gt=0,
        description="EyeLink: pupil diameter = this × √(pupil area), mm per √unit; calibrate "
        "once per setup with an artificial pupil of known size (unset: pupil is NaN)",
    )
    future_tolerance_s: float = Field(
        0.5,
        gt=0,
        allow_inf_nan=False,
        description="samples stamped more than this ahead of the local LSL clock are "
        "implausible: dropped and counted (ingest.future), never adopted, s",
    )
    resync_after_s: float = Field(
        2.0,
        gt=0,
        allow_inf_nan=False,
        description="after this long of consistently rejected samples (a sender's clock jump, "
        "a restarted sample counter) the order follows the new timeline, s",
    )
    dejitter: bool = Field(
        True,
        description="smooth timestamps of regular-rate streams (lower envelope of the nominal "
        "rate's line); off: use the sender's timestamps as they are",
    )
    stream_lost_after_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="the status turns 'stream_lost' when no usable sample arrived for this "
        "long, and back when samples resume, s",
    )


class FeatureSettings(_Section):
    """Sliding-window feature extraction."""

    window_s: float = Field(30.0, gt=0, description="window length W, s")
    step_s: float = Field(0.5, gt=0, description="step s between feature vectors, s")
    saccade_threshold_deg_s: float = Field(
        30.0, gt=0, description="I-VT angular velocity threshold, deg/s"
    )
    min_valid_fraction: float = Field(
        0.5, ge=0, le=1, description="windows with less valid data repeat the previous vector"
    )
    hold_limit_s: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="a value repeated for a low-quality window or an undefined value repeats "
        "for at most this long; then the feature's public default is released (None: window_s)",
    )

    @field_validator("step_s")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class MechanismSettings(_Section):
    """How each chunk is privatized and what a consumer receives (the release profile)."""

    name: MechanismName = Field("dcfpa", description="lpa | cfpa | dcfpa (fpa is offline only)")
    transform: Transform = Field("dft", description="dft | dct")
    chunk_steps: int = Field(32, description="n, steps per chunk; a power of two")
    k: int | Literal["auto"] = Field("auto", description="kept frequencies, or 'auto'")
    epsilon: float = Field(1.0, description="ε per feature per chunk")
    features: list[str] | None = Field(
        None, description="release profile: feature names to release (default: all)"
    )
    epsilon_per_feature: dict[str, float] = Field(
        default_factory=dict, description="per-feature ε overrides"
    )
    insecure_seed: int | None = Field(
        None,
        description="INSECURE: seed a reproducible generator instead of the OS CSPRNG "
        "(experiments and tests only)",
    )

    @field_validator("chunk_steps")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v < 2 or v & (v - 1):
            raise ValueError("must be a power of two >= 2 (e.g. 32, 64, 128)")
        return v

    @field_validator("epsilon")
    @classmethod
    def _positive_eps(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError("must be a finite number > 0")
        return v

    @field_validator("epsilon_per_feature")
    @classmethod
    def _positive_eps_map(cls, v: dict[str, float]) -> dict[str, float]:
        for name, e in v.items():
            if not (math.isfinite(e) and e > 0):
                raise ValueError(f"epsilon for feature {name!r} must be a finite number > 0")
        return v


class LedgerSettings(_Section):
    """The durable per-session ε ledger."""

    path: Path = Field(Path("gazeguard-ledger.sqlite"), description="SQLite file")
    url: str | None = Field(
        None, description="PostgreSQL URL (postgresql://…) for fleets; when set, replaces path"
    )
    session_cap: float | None = Field(None, description="max total ε per session (None: no cap)")
    w_event: int | None = Field(None, ge=1, description="w for the w-event cap, chunks")
    w_event_cap: float | None = Field(None, description="max ε over any w consecutive chunks")
    synchronous: Literal["FULL", "EXTRA"] = Field("FULL", description="SQLite synchronous mode")

    @field_validator("session_cap", "w_event_cap")
    @classmethod
    def _positive_cap(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError("must be a finite number > 0")
        return v


class BrokerSettings(_Section):
    """The MQTT broker. With no ``host``, an embedded local broker is started."""

    host: str | None = Field(None, description="broker host; unset: start an embedded broker")
    port: int = Field(1883, ge=0, le=65535, description="broker port (0: any free, embedded)")
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = Field(False, description="connect with TLS")
    ca_file: Path | None = Field(None, description="CA bundle to verify the broker")
    cert_file: Path | None = Field(None, description="client certificate (mutual TLS)")
    key_file: Path | None = Field(None, description="client key (mutual TLS)")
    client_id: str | None = None
    protocol: Literal["auto", "5", "3.1.1"] = Field("auto", description="MQTT protocol version")
    keepalive_s: int = Field(30, ge=5)
    reconnect_max_s: float = Field(30.0, gt=0, description="cap of the jittered backoff, s")
    topic_prefix: str = Field("gazeguard/v1", description="topics: {prefix}/{device}/{session}/…")


class FleetSettings(_Section):
    """One process serving many sessions; many processes sharing one (PostgreSQL) ledger."""

    enabled: bool = Field(False, description="serve every stream found, one session each")
    worker_id: str | None = Field(
        None,
        pattern=r"^[^/+#\s]+$",
        description="this worker's id, one MQTT topic level (default: host-pid)",
    )
    raw_broker: BrokerSettings | None = Field(
        None,
        description="broker carrying raw gaze (trusted network) for ingest.source='mqtt'; "
        "default: the publishing broker",
    )
    raw_prefix: str = Field("gazeguard/raw/v1", description="raw gaze topics: {prefix}/…")
    share_group: str = Field(
        "gazeguard", description="MQTT v5 shared-subscription group of the workers"
    )
    idle_timeout_s: float = Field(10.0, gt=0, description="close a silent session after, s")
    max_sessions: int = Field(1000, ge=1, description="sessions one process accepts")
    discover_every_s: float = Field(2.0, gt=0, description="LSL stream discovery period, s")


class Settings(BaseSettings):
    """Everything ``gazeguard run`` needs. Defaults run out of the box."""

    model_config = SettingsConfigDict(
        env_prefix="GAZEGUARD_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    device: str = Field(default_factory=socket.gethostname, description="device id in topics")
    session: str | None = Field(None, description="session id (default: one per stream)")
    max_queued_chunks: int = Field(64, ge=1, description="bound of in-memory chunk queues")
    ingest: IngestSettings = IngestSettings()
    features: FeatureSettings = FeatureSettings()
    mechanism: MechanismSettings = MechanismSettings()
    ledger: LedgerSettings = LedgerSettings()
    broker: BrokerSettings = BrokerSettings()
    fleet: FleetSettings = FleetSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Priority: CLI/init arguments > environment > TOML file (``_toml_file``)."""
        toml = _TOML_FILE.get("path")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)


# The TOML file for the next Settings() construction; set only inside load_settings.
_TOML_FILE: dict[str, Path | None] = {"path": None}


def _source_of(loc: tuple[str | int, ...], overrides: dict[str, Any], path: Path | None) -> str:
    node: Any = overrides
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            break
    else:
        return "command-line argument"
    env = "GAZEGUARD_" + "__".join(str(p).upper() for p in loc)
    import os  # noqa: PLC0415 - only needed on the error path

    if env in os.environ:
        return f"environment variable {env}"
    return f"file {path}" if path is not None else "defaults"


def broker_address(text: str) -> dict[str, str]:
    """``HOST[:PORT]`` (a ``--broker`` flag) as ``broker`` settings overrides."""
    host, sep, port = text.rpartition(":")
    return {"host": host, "port": port} if sep else {"host": text}


def load_settings(path: Path | str | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (TOML), the environment and ``overrides``.

    Raises:
        ConfigError: naming the first invalid field, its value and its source.
    """
    toml = Path(path) if path is not None else None
    if toml is not None and not toml.is_file():
        raise ConfigError("config", str(toml), "file not found")
    _TOML_FILE["path"] = toml
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc)
        raise ConfigError(
            field, err.get("input"), err["msg"], _source_of(loc, overrides, toml)
        ) from exc
    except ValueError as exc:  # TOML syntax errors
        raise ConfigError("config", str(toml), str(exc), f"file {toml}") from exc
    finally:
        _TOML_FILE["path"] = None


def configure_config(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard config``."""
    sub = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate a TOML configuration file and print it")
    check.add_argument("file", type=Path, help="configuration file (TOML)")


def run_config(args: argparse.Namespace) -> int:
    """``gazeguard config check FILE``: exit 0 and print the effective settings if valid."""
    settings = load_settings(args.file)
    print(json.dumps(settings.model_dump(mode="json"), indent=2))  # noqa: T201
    print(f"{args.file}: OK", flush=True)  # noqa: T201
    return 0
