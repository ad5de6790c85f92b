"""The settings schema: one pydantic-settings model (:class:`Settings`) and its sections, with the
types, ranges, choices and defaults of every setting and a description of each.

Sources, highest priority last: a TOML file < ``GAZEGUARD_…`` environment variables < CLI flags
(init arguments). Nested sections map to environment variables with ``__``:
``GAZEGUARD_MECHANISM__EPSILON=0.5``. The TOML file is the ``toml_file`` of the model's
configuration: :mod:`gazeguard.config.problems` reads a file through a subclass that names it, so
this module holds no state. Reading the sources and reporting what they get wrong is
:mod:`gazeguard.config.problems`'s.
"""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting.loss import PrivacyLoss
from gazeguard.privacy.mechanisms.registry import (
    NOISE,
    ONLINE_MECHANISMS,
    mechanism_kind,
    noise_kind,
)
from gazeguard.signal.profiles import load_profile
from gazeguard.wire.topics import check_prefix, name_problem

Preset = Literal["auto", "gazeguard", "pupil_capture", "pupil_neon", "tobii", "eyelink", "generic"]
Transform = Literal["dft", "dct"]
CohortRelease = Literal["means", "shares", "attention", "aois", "mode"]


def _epsilon(value: float) -> float:
    """An ε setting, checked as :class:`~gazeguard.privacy.accounting.loss.PrivacyLoss` checks
    it."""
    try:
        PrivacyLoss.pure(value)
    except ConfigError:
        raise ValueError("must be a finite number > 0") from None
    return value


#: ε (per feature per chunk, a cap, a budget): finite and > 0.
Epsilon = Annotated[float, AfterValidator(_epsilon)]


def _finite(why: str) -> AfterValidator:
    """A check, after the field's own, that refuses an infinite float setting with ``why``."""

    def check(value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(why)
        return value

    return AfterValidator(check)


class Section(BaseModel):
    """A section of :class:`Settings`: unknown keys are refused, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class IngestSettings(Section):
    """Where the gaze comes from and how its channels are read."""

    source: Literal["auto", "lsl", "simulated", "jetstream"] = Field(
        "auto",
        description="'lsl': wait for a headset stream; 'simulated': built-in simulated headset; "
        "'jetstream': raw gaze from a NATS JetStream stream, partitions pinned to workers "
        "(fleet mode only, trusted network; the 'fleet' extra); "
        "'auto': the one LSL stream of stream_type on this host that is not a gazeguard "
        "simulated headset (several: refused with a list; --source-id chooses), and if there is "
        "none and no stream name or source_id is configured, this run's own simulated headset",
    )
    simulated_rate_hz: float = Field(120.0, gt=0, description="rate of the simulated headset, Hz")
    rate_hz: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="the gaze stream's declared sampling rate, Hz; unset: the stream's own "
        "declaration (LSL nominal_srate; a fleet device's forwarder sends it). The event "
        "detector's parameters come from it, never from measured timestamps: a stream that "
        "declares no rate (irregular) is refused unless this is set",
    )
    simulated_seed: int = Field(1, description="which simulated person")

    stream_type: str = Field("Gaze", description="LSL stream type to resolve ('Gaze' is XDF's)")
    stream_name: str | None = Field(None, description="LSL stream name to resolve")
    source_id: str | None = Field(
        None, description="LSL source_id to resolve (fleet mode: a glob pattern, e.g. 'lab-*')"
    )
    stream_host: str | None = Field(
        None,
        description="LSL host name (a glob) whose streams 'auto' and a fleet worker may serve; "
        "unset: this host only ('*': any host)",
    )
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
        False,
        description="smooth timestamps of regular-rate streams (lower envelope of the nominal "
        "rate's line, re-anchored every second of the stream's clock: one sample moves at "
        "most its second's timestamps, which the release plan adds to the reach); off: the "
        "sender's timestamps as they are",
    )
    stream_lost_after_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="the local log says so when no usable sample arrived for this long, and "
        "again when samples resume, s (never the status: whether gaze arrives is the user's)",
    )
    late_after_s: float = Field(
        3.0,
        gt=0,
        allow_inf_nan=False,
        description="the sidecar releases a window this long after it ends on the stream's "
        "clock, gaze or not (the schedule is the clock's, never the samples'); a sample that "
        "arrives later than that behind the clock is dropped, s (more than pull_every_s)",
    )
    pull_every_s: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="how often the LSL pull thread drains liblsl's buffer, s: each pull wakes "
        "three threads, so on a headset fewer pulls cost less CPU; a chunk is released up to "
        "this much later (at most half of stream_lost_after_s)",
    )

    @model_validator(mode="after")
    def _pulls_see_a_lost_stream(self) -> Self:
        if self.pull_every_s > self.stream_lost_after_s / 2:
            msg = (
                f"pull_every_s = {self.pull_every_s:g} must be at most half of "
                f"stream_lost_after_s = {self.stream_lost_after_s:g}: a live stream looks idle "
                "for up to a pull interval between pulls"
            )
            raise ValueError(msg)
        if self.late_after_s <= self.pull_every_s:
            msg = (
                f"late_after_s = {self.late_after_s:g} must exceed pull_every_s = "
                f"{self.pull_every_s:g}: a window is released only after its samples were pulled"
            )
            raise ValueError(msg)
        return self


class FeatureSettings(Section):
    """Sliding-window feature extraction."""

    window_s: float = Field(30.0, gt=0, description="window length W, s")
    step_s: Annotated[float, _finite("must be finite")] = Field(
        0.5, gt=0, description="step s between feature vectors, s"
    )
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


class MechanismSettings(Section):
    """How each chunk is privatized and what a consumer receives (the release profile)."""

    name: str = Field(
        "dcfpa",
        description=f"{' | '.join(ONLINE_MECHANISMS)} | auto (the lowest expected error for "
        "ledger.budget_per_hour under the public prior, chunk_steps at most as configured; fpa "
        "needs whole recordings: offline only)",
    )
    noise: str = Field("laplace", description=f"noise family: {' | '.join(NOISE)}")
    transform: Transform = Field(
        "dft",
        description="the orthonormal transform whose k lowest frequencies cfpa and dcfpa keep "
        "and noise: 'dft' (discrete Fourier) or 'dct' (discrete cosine); lpa has none",
    )
    chunk_steps: int = Field(32, description="n, steps per chunk; a power of two")
    k: int | Literal["auto"] = Field(
        "auto",
        description="k, the lowest frequencies kept per feature and chunk, or 'auto': picked "
        "from the public prior (`gazeguard mechanisms` lists the picks)",
    )
    epsilon: Epsilon | None = Field(
        None,
        description="fixed ε per feature per chunk; unset (default): the noise is calibrated "
        "to ledger.budget_per_hour",
    )
    features: list[str] | None = Field(
        None,
        description="release profile: the feature names to release (`gazeguard config "
        "features` lists them; default: all), or in a file the name (or .json path) of a "
        "profile file, e.g. features = 'activity', as mechanism.profile takes it",
    )
    profile: str | None = Field(
        None,
        description="a release profile file by name (e.g. 'activity'; `gazeguard profile show "
        "NAME`) or .json path: its features are released and the chunk message names it (also "
        "set by mechanism.features = 'NAME')",
    )
    epsilon_per_feature: dict[str, Epsilon] = Field(
        default_factory=dict, description="per-feature ε overrides"
    )
    insecure_seed: int | None = Field(
        None,
        description="INSECURE: seed a reproducible generator instead of the OS CSPRNG "
        "(experiments and tests only)",
    )

    @model_validator(mode="before")
    @classmethod
    def _named_profile(cls, data: Any) -> Any:
        """``features = "activity"`` (or ``profile = "activity"``): the profile file's features,
        and its name in ``profile``."""
        if not isinstance(data, dict):
            return data
        named = data.get("features") if isinstance(data.get("features"), str) else None
        ref = named if named is not None else data.get("profile")
        if not isinstance(ref, str):
            return data

        try:
            profile = load_profile(ref)
        except ConfigError as exc:
            raise ValueError(f"profile {ref!r}: {exc.reason}") from None
        listed = None if named is not None else data.get("features")
        if listed is not None and list(listed) != profile.features:
            raise ValueError(
                f"mechanism.features {list(listed)} differ from profile {profile.name!r}'s "
                f"{profile.features}: give one of them"
            )
        return {**data, "features": list(profile.features), "profile": profile.name}

    @field_validator("name")
    @classmethod
    def _known_mechanism(cls, v: str) -> str:
        if v == "auto":
            return v
        try:
            return mechanism_kind(v, online=True).name
        except ConfigError as exc:
            raise ValueError(exc.reason) from exc

    @field_validator("noise")
    @classmethod
    def _known_noise(cls, v: str) -> str:
        try:
            return noise_kind(v).name
        except ConfigError as exc:
            raise ValueError(exc.reason) from exc

    @field_validator("chunk_steps")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v < 2 or v & (v - 1):
            raise ValueError("must be a power of two >= 2 (e.g. 32, 64, 128)")
        return v


class LedgerSettings(Section):
    """The durable per-session privacy ledger: caps in ε at ``delta``, windows in gaze time
    (and, with ``wall_clock``, in wall-clock time too)."""

    path: Path = Field(Path("gazeguard-ledger.sqlite"), description="SQLite file")
    url: str | None = Field(
        None, description="PostgreSQL URL (postgresql://…) for fleets; when set, replaces path"
    )
    delta: float = Field(
        1e-6,
        description="δ of every user-level (ε, δ) figure and cap; keep it far below 1/people",
    )
    budget_per_hour: Epsilon | None = Field(
        10.0,
        description="user-level ε (at delta) per hour of gaze: caps every hour of gaze time and, "
        "unless mechanism.epsilon is set, calibrates the noise (unset: no hourly cap)",
    )
    session_cap: Epsilon | None = Field(
        None, description="max user-level ε (at delta) per session (unset: no cap)"
    )
    composition: Literal["pld", "sequential"] = Field(
        "pld",
        description="pld: caps bound the accountant's ε at delta (privacy loss distributions); "
        "sequential: caps bound pure sequential ε (conservative)",
    )
    wall_clock: bool = Field(
        True,
        description="budget_per_hour also caps every hour of wall-clock time, so no input (a "
        "backlog stamped in the past, a replay) spends more than it per real hour; a session "
        "opened with it refuses a later false as looser",
    )
    synchronous: Literal["FULL", "EXTRA"] = Field("FULL", description="SQLite synchronous mode")

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not (0.0 < v < 1e-2):
            raise ValueError("must lie in (0, 0.01); 1e-6 is the usual choice")
        return v


class LabelSettings(Section):
    """Private labels: a classifier runs on the clean features inside the sidecar and only its
    randomized-response label is published, charged to the same ledger and budget as the
    chunks (:mod:`gazeguard.runtime.labels`): one label per ``decision_s`` of gaze, which the
    consumer holds until the next. A label "when the activity changes" was retired (its
    detection rounds fired as often without a change as with one): ``release = "change"`` is
    refused with a message."""

    enabled: bool = Field(False, description="publish private labels on {prefix}/…/labels")
    model: str = Field(
        "activity-portable",
        description="label model: a shipped name (gazeguard/data/models: 'activity-portable', "
        "4 activities, trained for a change of headset; 'activity', GazeGraph's 6 desktop "
        "activities) or a .json path in the gazeguard.label-model/1 format; its classes are the "
        "labels",
    )
    release: Literal["clock"] = Field(
        "clock",
        description="clock: one label per decision_s (the only way; 'change' was retired)",
    )
    decision_s: Annotated[float, _finite("must be a finite number of seconds > 0")] = Field(
        120.0,
        gt=0,
        description="seconds of gaze per label: each label decides on that block and holds "
        "until the next (120 s: the best of 30, 60, 120 and 180 s on held-out people, "
        "docs/labels.md)",
    )
    epsilon: Epsilon | None = Field(
        None,
        description="ε per label (pure); unset: budget_share of ledger.budget_per_hour over the "
        "labels an hour of gaze can change",
    )
    budget_share: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="share of ledger.budget_per_hour reserved for labels when epsilon is unset",
    )

    @field_validator("release", mode="before")
    @classmethod
    def _no_change(cls, v: Any) -> Any:
        if v == "change":
            raise ValueError(
                "'change' was retired (at the shipped budget its detection rounds "
                "fired as often without a change as with one, a jittered clock that spent a "
                "quarter of each label's ε on noise); use 'clock' (one label per decision_s, "
                "the default) or remove the setting"
            )
        return v


class BrokerSettings(Section):
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
    allow_311_with_login: bool = Field(
        False,
        description="allow MQTT 3.1.1 with a login: a 3.1.1 broker cannot report a refused "
        "publish (e.g. an ACL), so refused chunks would be marked delivered",
    )

    @model_validator(mode="after")
    def _refusals_visible(self) -> Self:
        if self.protocol == "3.1.1" and self.username is not None and not self.allow_311_with_login:
            raise ValueError(
                "broker.protocol = '3.1.1' with a login: MQTT 3.1.1 brokers cannot report a "
                "refused publish (an ACL drops it silently and it would be marked delivered); "
                "use protocol '5' or 'auto', or set broker.allow_311_with_login = true to accept "
                "that"
            )
        return self

    @field_validator("topic_prefix")
    @classmethod
    def _topic_safe_prefix(cls, v: str) -> str:
        try:
            return check_prefix(v)
        except ConfigError as exc:
            raise ValueError(exc.reason) from exc


class NatsSettings(Section):
    """NATS JetStream carrying raw gaze for ``ingest.source = 'jetstream'``.

    Raw gaze is on this wire: run it inside the fleet's trusted network, with TLS and one
    credential per device (publish on its own subjects only) and per worker.
    """

    servers: list[str] = Field(
        default_factory=lambda: ["nats://127.0.0.1:4222"],
        min_length=1,
        description="NATS server URLs (nats:// or tls://)",
    )
    stream: str = Field(
        "GAZE", pattern=r"^[A-Za-z0-9_-]+$", description="JetStream stream holding raw gaze"
    )
    subject_prefix: str = Field(
        "gaze.raw",
        pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        description="devices publish on {prefix}.{device}.{session}",
    )
    partitions: int = Field(
        8, ge=1, le=1024, description="P: sessions are hashed into P partitions, one worker each"
    )
    max_age_s: float = Field(
        120.0,
        gt=0,
        description="raw gaze retained by the stream, s; at least the feature window (a worker "
        "taking a partition over rebuilds the windows from it)",
    )
    group: str = Field(
        "workers", pattern=r"^[A-Za-z0-9_-]+$", description="priority group of the consumers"
    )
    pin_timeout_s: float = Field(
        5.0,
        gt=0,
        description="a pinned worker that has not pulled for this long loses its partitions, s: "
        "the failover time when a worker dies",
    )
    ack_wait_s: float = Field(
        10.0,
        gt=0,
        description="an unacknowledged block is delivered again after, s (a takeover reads the "
        "dead worker's unacknowledged blocks from its replay; what comes again is skipped)",
    )
    replicas: int = Field(1, ge=1, le=5, description="stream replicas (3 on a 3-node cluster)")
    block_s: float = Field(
        1.0,
        gt=0,
        le=5.0,
        description="gazeguard forward sends one raw block per this many s of gaze (one LSL "
        "pull): larger blocks are fewer messages and less worker CPU per session (bench_fleet: "
        "1 s vs 250 ms), and each sample waits up to this long on the device (a chunk spans "
        "16 s or more); keep it well under fleet.idle_timeout_s",
    )
    balance: bool = Field(
        True,
        description="spread the partitions evenly over the live workers (announced on core NATS "
        "subject gazeguard.workers.{stream}): a worker pinned on a partition another live worker "
        "is assigned hands it back; off: the server's first-come pins stay where they fall",
    )
    heartbeat_s: float = Field(
        1.0,
        gt=0,
        description="balance: a worker announces itself every this many s; another worker counts "
        "once heard twice and is dropped after 3 heartbeats unheard (keep 3 × heartbeat_s ≤ "
        "pin_timeout_s, or failover waits for the drop)",
    )
    creds_file: Path | None = Field(None, description="NATS credentials file (JWT + nkey)")
    user: str | None = None
    password: SecretStr | None = None
    tls_ca_file: Path | None = Field(None, description="CA bundle to verify the servers")
    tls_cert_file: Path | None = Field(None, description="client certificate (mutual TLS)")
    tls_key_file: Path | None = Field(None, description="client key (mutual TLS)")


class FleetSettings(Section):
    """One process serving many sessions; many processes sharing one (PostgreSQL) ledger."""

    enabled: bool = Field(
        False,
        description="serve every LSL stream of the selection (ingest.stream_type, stream_name "
        "prefix, source_id pattern, stream_host; default this host's 'Gaze' streams) or of a "
        "pinned JetStream partition (ingest.source = 'jetstream'), one session each",
    )
    worker_id: str | None = Field(
        None,
        pattern=r"^[^/+#\s]+$",
        description="this worker's id, one MQTT topic level (default: host-pid)",
    )
    nats: NatsSettings = Field(
        default_factory=NatsSettings,
        description="NATS JetStream carrying raw gaze for ingest.source='jetstream'",
    )
    idle_timeout_s: float = Field(10.0, gt=0, description="close a silent session after, s")
    max_sessions: int = Field(1000, ge=1, description="sessions one process accepts")
    discover_every_s: float = Field(2.0, gt=0, description="LSL stream discovery period, s")
    ledger_calls: Literal["auto", "loop", "thread"] = Field(
        "auto",
        description="where a worker makes its chunks' ledger calls (charges, outbox; a cohort "
        "bucket is always charged in a worker thread): 'loop' on its "
        "event loop (no waits for the GIL behind the features; a release stops the loop for "
        "its fsync), 'thread' in worker threads (for a disk whose fsync can stall for seconds), "
        "'auto': 'loop' for a local SQLite ledger, 'thread' for PostgreSQL",
    )
    compiled: bool = Field(
        True,
        description="run the raw blocks' decode, the event detector's passes, the sample "
        "binning and the window statistics compiled (numba, from the 'fleet' extra): the "
        "same blocks, events and features "
        "bit for bit for less CPU per session; costs ~0.7 s and ~100 MB per worker to load "
        "(ignored where numba is not installed)",
    )


class CohortSettings(Section):
    """Cohort aggregates, fleet mode: DP aggregates over the sessions a worker serves
    (:mod:`gazeguard.runtime.cohort`), published per bucket on ``{prefix}/cohort/{name}/…``.

    The defaults release what the evaluation showed useful at an honest budget on people never
    seen (``bench/results/eval_cohort.md``, ``docs/privacy.md``): the group's dominant activity
    (``mode``, by the shipped ``activity-portable`` label model, the labels' default, made to
    survive a change of headset) per 300 s bucket."""

    enabled: bool = Field(False, description="publish cohort aggregates (fleet mode only)")
    name: str = Field(
        "default", pattern=r"^[^/+#\s]+$", description="cohort name, one MQTT topic level"
    )
    bucket_s: float = Field(
        300.0,
        gt=0,
        description="seconds of gaze per aggregate (longer buckets: fewer per hour, more ε "
        "each; 300 s keeps a cohort of 30's dominant activity at 10 ε/h, "
        "bench/results/eval_cohort.md)",
    )
    budget_share: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="share of ledger.budget_per_hour the aggregates cost each person (ε at "
        "ledger.delta; the chunks are calibrated last so that all releases fit the budget)",
    )
    model: str | None = Field(
        "activity-portable",
        description="label model whose classes the shares and the mode are over (a shipped "
        "name or a .json path; needs its window and step; unset: features only)",
    )
    grace_s: float = Field(5.0, ge=0, description="late vectors accepted after a bucket, s")
    release: list[CohortRelease] | None = Field(
        None,
        description="what the cohort releases, any of 'mode' (the group's dominant activity "
        "by cohort.model, permute-and-flip, on …/mode), 'means' (feature means), 'shares' (label "
        "class shares, needs cohort.model), 'attention' (a dwell heatmap over "
        "cohort.attention_grid) and 'aois' (dwell shares of cohort.attention_aois); each Gaussian "
        "one is a block of the contribution (Δ2 = √blocks, 'means' two: with the count). Unset: "
        "the mode when cohort.model is set (the default), else means",
    )
    attention_grid: tuple[int, int] = Field(
        (9, 16), description="heatmap cells (rows, cols) over the gaze field"
    )
    attention_fov_deg: tuple[float, float] = Field(
        (48.0, 27.0),
        description="the gaze field the heatmap grid covers (width, height), degrees of gaze "
        "angle, centred on straight ahead",
    )
    attention_aois: str | None = Field(
        None,
        description="JSON file of named areas of interest (rectangles or polygons, degrees of "
        "gaze angle; format in gazeguard/signal/attention.py) whose dwell shares 'aois' releases",
    )

    @field_validator("release")
    @classmethod
    def _distinct(cls, v: list[CohortRelease] | None) -> list[CohortRelease] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(
                "name each of 'mode', 'means', 'shares', 'attention', 'aois' at most once"
            )
        return v


class MetricsSettings(Section):
    """Local operator metrics: a Prometheus text endpoint, ``http://HOST:PORT/metrics``
    (:mod:`gazeguard.runtime.metrics`), on the sidecar and on fleet workers. Off unless ``port``
    is set. Only figures that are public under the egress contract (releases, charges,
    refusals, the outbox, the broker connection, open sessions, latencies of the release
    path); never a count of samples."""

    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve local operator metrics for Prometheus on "
        "http://{metrics.host}:PORT/metrics (0: any free port, named in the log); unset: no "
        "endpoint",
    )
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="address the endpoint binds: loopback by default (a Prometheus on this "
        "host); '0.0.0.0' serves every network this host is on, without a login",
    )
    tail: bool = Field(
        False,
        description="a fleet worker also serves how long its batches, garbage collections and "
        "event-loop stalls take (gazeguard_batch_seconds, gazeguard_gc_pause_seconds, "
        "gazeguard_loop_stall_seconds): for diagnosing the latency tail. Off by default: "
        "how long a batch takes depends on how much gaze it carried, so these are a timing "
        "side channel on the gaze, for a trusted operator's eyes only",
    )


class Settings(BaseSettings):
    """Everything ``gazeguard run`` needs. Defaults run out of the box."""

    model_config = SettingsConfigDict(
        env_prefix="GAZEGUARD_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    device: str = Field(
        default_factory=socket.gethostname,
        description="device id, one level of the MQTT topics (default: this host's name)",
    )
    session: str | None = Field(
        None, description="session id (default: one per stream, from its LSL source_id)"
    )
    ingest: IngestSettings = IngestSettings()
    features: FeatureSettings = FeatureSettings()
    mechanism: MechanismSettings = MechanismSettings()
    ledger: LedgerSettings = LedgerSettings()
    broker: BrokerSettings = BrokerSettings()
    fleet: FleetSettings = FleetSettings()
    labels: LabelSettings = LabelSettings()
    cohort: CohortSettings = CohortSettings()
    metrics: MetricsSettings = MetricsSettings()

    @field_validator("device", "session")
    @classmethod
    def _topic_safe(cls, v: str | None) -> str | None:
        why = None if v is None else name_problem(v)
        if why is not None:
            raise ValueError(f"{why}; the rule is in gazeguard/wire/topics.py (docs/consumer.md)")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Priority: CLI/init arguments > environment > the TOML file that ``settings_cls``'s
        configuration names (``toml_file``; none for :class:`Settings` itself: see
        :func:`gazeguard.config.problems.load_settings`)."""
        toml = settings_cls.model_config.get("toml_file")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
        return tuple(sources)


def broker_address(text: str) -> dict[str, str]:
    """``HOST[:PORT]`` (a ``--broker`` flag) as ``broker`` settings overrides."""
    host, sep, port = text.rpartition(":")
    return {"host": host, "port": port} if sep else {"host": text}
