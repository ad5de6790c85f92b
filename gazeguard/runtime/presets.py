"""Channel presets and normalisation: what a gaze stream's channels mean, and turning them into
degrees, mm and validity.

- **Describe**: :class:`StreamMeta` is what an LSL stream says about itself (name, type, ids,
  rate, XDF channel metadata ``channels/channel/{label,eye,type,unit}``);
  :func:`gazeguard_stream_info` describes gazeguard's own outlets (:data:`GAZEGUARD_CHANNELS`:
  sample index, x and y in degrees, pupil in mm, validity).
- **Interpret**: :func:`build_layout` picks a preset (:data:`PRESETS`, or :func:`detect_preset`
  for ``auto``: from the stream's name, type and metadata) and checks the stream against it,
  giving a :class:`Layout` (channel indices per eye, coordinate system, geometry). A wrong
  channel count, an unknown unit or missing screen geometry is a
  :class:`~gazeguard.core.errors.StreamError` naming the setting to change.
- **Normalize**: :class:`Normalizer` turns raw ``(N, C)`` float64 blocks into
  :class:`~gazeguard.core.samples.GazeSamples` (vectorised): gaze direction in degrees of visual
  angle (positive right / up, via :func:`normalized_to_deg` / :func:`screen_to_deg` where the
  stream reports image or screen coordinates), pupil diameter in mm, a validity flag. Invalid
  samples become NaN + invalid, never zeros; absurd values (|angle| > 90°, pupil outside
  0.5–10 mm) become invalid. Samples whose timestamp (or sample index) does not increase, is not
  finite or is implausible (ahead of the clock, an index jump the rate cannot make) are dropped by
  :class:`~gazeguard.core.ordering.SampleOrder`, so the output is strictly increasing in time across
  blocks and one bad sample never stops the stream; :class:`IngestStats` counts all of it.

Importing this module also keeps liblsl's startup INFO lines off stderr unless the site
configured LSL itself (every gazeguard module that touches LSL imports it).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pylsl

from gazeguard.config import IngestSettings
from gazeguard.core.errors import StreamError
from gazeguard.core.ordering import MAX_SAMPLE_AGE_S, OrderStats, SampleOrder
from gazeguard.core.samples import BoolArray, FloatArray, GazeSamples

logger = logging.getLogger(__name__)


def _quiet_liblsl() -> None:
    """liblsl prints INFO lines to stderr at startup; keep only its warnings and errors.

    Only when the user has not configured LSL (``LSLAPICFG`` or an ``lsl_api.cfg`` in the places
    liblsl looks), so a site's own LSL configuration always wins.
    """
    places = [Path("lsl_api.cfg"), Path.home() / "lsl_api" / "lsl_api.cfg"]
    places.append(Path("/etc/lsl_api/lsl_api.cfg"))
    if os.environ.get("LSLAPICFG") or any(p.is_file() for p in places):
        return
    pylsl.set_config_content("[log]\nlevel = -1\n")


_quiet_liblsl()

PRESETS = ("gazeguard", "pupil_capture", "pupil_neon", "tobii", "eyelink", "generic")
MAX_ABS_ANGLE_DEG = 90.0  # beyond this a "gaze direction" is not an eye's
PUPIL_RANGE_MM = (0.5, 10.0)  # physiological pupil diameters (miosis .. full dilation)
EYELINK_MISSING = 1e7  # EyeLink marks missing gaze with 1e8 (float) or -32768 (int) codes

# The layout of gazeguard's own outlets (simulated headset, CSV replay): the sample index makes
# order and loss exactly observable. (label, eye, XDF type, unit)
GAZEGUARD_CHANNELS: tuple[tuple[str, str, str, str], ...] = (
    ("sample_index", "both", "FrameNumber", "count"),
    ("gaze_x", "both", "ScreenX", "degrees"),
    ("gaze_y", "both", "ScreenY", "degrees"),
    ("pupil_diameter", "both", "Diameter", "mm"),
    ("validity", "both", "Confidence", "normalized"),
)
NEON_IMAGE_PX = (1600.0, 1200.0)  # Neon scene camera, origin top-left
NEON_FOV_DEG = (103.0, 77.0)

_DEG_UNITS = {"deg", "degree", "degrees"}
_NORM_UNITS = {"normalized", "normalised", "norm"}
_PX_UNITS = {"px", "pixel", "pixels"}
_PUPIL_NOT_MM = {"px", "pixel", "pixels", "arbitrary", "a.u.", "au", "area"}


@dataclass(frozen=True, slots=True)
class ChannelDesc:
    """One channel's XDF metadata (empty strings where the stream does not say)."""

    label: str = ""
    eye: str = ""
    type: str = ""
    unit: str = ""


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """What a stream says about itself: the resolved LSL info plus its full description."""

    name: str
    type: str
    source_id: str
    nominal_srate: float
    channel_count: int
    hostname: str = ""
    uid: str = ""
    manufacturer: str = ""
    channels: tuple[ChannelDesc, ...] = ()

    @classmethod
    def from_lsl(cls, info: pylsl.StreamInfo) -> StreamMeta:
        """Read name, type, ids, rate and ``desc/channels`` from a (full) pylsl StreamInfo."""
        desc = info.desc()
        channels: list[ChannelDesc] = []
        ch = desc.child("channels").child("channel")
        while not ch.empty():
            channels.append(
                ChannelDesc(*(ch.child_value(k).strip() for k in ("label", "eye", "type", "unit")))
            )
            ch = ch.next_sibling("channel")
        return cls(
            name=info.name(),
            type=info.type(),
            source_id=info.source_id(),
            nominal_srate=float(info.nominal_srate()),
            channel_count=int(info.channel_count()),
            hostname=info.hostname(),
            uid=info.uid(),
            manufacturer=desc.child("acquisition").child_value("manufacturer").strip(),
            channels=tuple(channels),
        )


@dataclass(frozen=True, slots=True)
class EyeChannels:
    """Channel indices of one eye (or of a combined gaze): x, y and optionally pupil."""

    x: int
    y: int
    pupil: int | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """How to turn a raw ``(N, C)`` block into degrees, mm and validity.

    ``coords``: ``deg`` (already degrees, y up), ``fov`` (normalized image coordinates through a
    pinhole camera of field of view ``fov_deg``), ``screen`` (normalized screen coordinates,
    origin top-left, through the screen geometry) or ``ppd`` (screen pixels divided by the
    per-sample pixels-per-degree channels). ``image_px`` divides pixel coordinates into
    normalized ones first.
    """

    preset: str
    n_channels: int
    eyes: tuple[EyeChannels, ...]
    coords: Literal["deg", "fov", "screen", "ppd"]
    y_up: bool = False
    image_px: tuple[float, float] | None = None
    fov_deg: tuple[float, float] | None = None
    screen_mm: tuple[float, float] | None = None
    distance_mm: float | None = None
    ppd: tuple[int, int] | None = None
    gaze3d: tuple[int, int, int] | None = None
    pupil_scale: float | None = 1.0
    pupil_area: bool = False  # the pupil channel is an area: diameter = pupil_scale·√value
    confidence: int | None = None
    validity: int | None = None
    index: int | None = None
    zero_is_missing: bool = False


# ---------------------------------------------------------------------------------------------
# Coordinate conversions (vectorised; shared with gazeguard.offline.replay for recorded files)
# ---------------------------------------------------------------------------------------------
def normalized_to_deg(
    u: FloatArray, v: FloatArray, fov_deg: tuple[float, float], *, y_up: bool
) -> tuple[FloatArray, FloatArray]:
    """Normalized image coordinates (0..1) to degrees through a pinhole camera.

    ``x_deg = atan((2u − 1)·tan(fov_h/2))``; likewise for y, flipped if the image's y axis
    points down (``y_up=False``). Returns (x_deg, y_deg), positive right and up.
    """
    th = math.tan(math.radians(fov_deg[0]) / 2)
    tv = math.tan(math.radians(fov_deg[1]) / 2)
    x = np.degrees(np.arctan((2.0 * u - 1.0) * th))
    dv = (2.0 * v - 1.0) if y_up else (1.0 - 2.0 * v)
    y = np.degrees(np.arctan(dv * tv))
    return x, y


def screen_to_deg(
    u: FloatArray, v: FloatArray, screen_mm: tuple[float, float], distance_mm: float
) -> tuple[FloatArray, FloatArray]:
    """Normalized screen coordinates (0..1, origin top-left) to degrees from the screen centre.

    With offsets ``dx, dy`` in mm from the centre (dy positive up) and eye distance ``D``:
    ``x = atan2(dx, D)``, ``y = atan2(dy, √(D² + dx²))``.
    """
    dx = (u - 0.5) * screen_mm[0]
    dy = (0.5 - v) * screen_mm[1]
    x = np.degrees(np.arctan2(dx, distance_mm))
    y = np.degrees(np.arctan2(dy, np.hypot(distance_mm, dx)))
    return x, y


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------
def _fail_count(meta: StreamMeta, preset: str, expected: Sequence[int]) -> StreamError:
    want = " or ".join(str(n) for n in expected)
    return StreamError(
        f"LSL stream {meta.name!r} (type {meta.type!r}) has {meta.channel_count} channels, but "
        f"preset {preset!r} expects {want}: set ingest.preset to the stream's real layout, or "
        "'generic' if the stream describes its channels (XDF channel metadata)"
    )


def _screen_geometry(
    meta: StreamMeta, preset: str, s: IngestSettings
) -> tuple[tuple[float, float], float]:
    if s.screen_size_mm is None or s.screen_distance_mm is None:
        raise StreamError(
            f"LSL stream {meta.name!r} (preset {preset!r}) reports screen coordinates; set "
            "ingest.screen_size_mm (width, height in mm) and ingest.screen_distance_mm (eye to "
            f"screen, mm) to convert them to degrees (got screen_size_mm={s.screen_size_mm}, "
            f"screen_distance_mm={s.screen_distance_mm})"
        )
    return s.screen_size_mm, s.screen_distance_mm


def _layout_for(meta: StreamMeta, preset: str, s: IngestSettings) -> Layout:
    n = meta.channel_count
    if preset == "gazeguard":
        if n != len(GAZEGUARD_CHANNELS):
            raise _fail_count(meta, preset, [len(GAZEGUARD_CHANNELS)])
        return Layout(preset, n, (EyeChannels(1, 2, 3),), "deg", y_up=True, validity=4, index=0)
    if preset == "pupil_capture":
        # labstreaminglayer/App-PupilLabs relay: confidence, norm_pos_x/y, gaze_point_3d_x/y/z,
        # eye_center{0,1}_3d_x/y/z, gaze_normal{0,1}_x/y/z, diameter{0,1}_2d (px),
        # diameter{0,1}_3d (mm). norm_pos has its origin bottom-left.
        if n != 22:
            raise _fail_count(meta, preset, [22])
        return Layout(
            preset,
            n,
            (EyeChannels(1, 2, 20), EyeChannels(1, 2, 21)),
            "fov",
            y_up=True,
            fov_deg=s.field_of_view_deg,
            gaze3d=(3, 4, 5),
            confidence=0,
        )
    if preset == "pupil_neon":
        return _layout_neon(meta, s)
    if preset == "tobii":
        # labstreaminglayer/App-TobiiPro: left_x, left_y, left_pupil, right_x, right_y,
        # right_pupil; display-area coordinates (0..1, origin top-left), NaN when invalid.
        if n != 6:
            raise _fail_count(meta, preset, [6])
        mm, dist = _screen_geometry(meta, preset, s)
        eyes = (EyeChannels(0, 1, 2), EyeChannels(3, 4, 5))
        return Layout(preset, n, eyes, "screen", screen_mm=mm, distance_mm=dist)
    if preset == "eyelink":
        return _layout_eyelink(meta, s)
    if preset == "generic":
        return _layout_generic(meta, s)
    raise StreamError(f"unknown ingest.preset {preset!r}; choose one of auto, {', '.join(PRESETS)}")


def _layout_neon(meta: StreamMeta, s: IngestSettings) -> Layout:
    # Neon Companion app: "x", "y" in scene-camera pixels (1600x1200, origin top-left); with
    # eye state enabled, per eye PupilDiameter (mm), EyeballCenterX/Y/Z and OpticalAxisX/Y/Z.
    labels = [c.label.lower() for c in meta.channels]
    n = meta.channel_count
    if len(labels) == n and "x" in labels and "y" in labels:
        pupils = [
            i
            for i, c in enumerate(meta.channels)
            if "pupildiameter" in c.label.lower().replace("_", "")
        ]
        x, y = labels.index("x"), labels.index("y")
        eyes = tuple(EyeChannels(x, y, p) for p in pupils) or (EyeChannels(x, y),)
    elif n == 2:
        eyes = (EyeChannels(0, 1),)
    elif n == 16:  # x, y, then left and right: PupilDiameter, EyeballCenter xyz, OpticalAxis xyz
        eyes = (EyeChannels(0, 1, 2), EyeChannels(0, 1, 9))
    else:
        raise _fail_count(meta, "pupil_neon", [2, 16])
    return Layout(
        "pupil_neon", n, eyes, "fov", y_up=False, image_px=NEON_IMAGE_PX, fov_deg=NEON_FOV_DEG
    )


def _layout_eyelink(meta: StreamMeta, s: IngestSettings) -> Layout:
    # labstreaminglayer/App-EyeLink: leftEyeX, leftEyeY, rightEyeX, rightEyeY (screen px),
    # leftPupilArea, rightPupilArea (arbitrary units), pixelsPerDegreeX/Y, eyelink_timestamp,
    # LSL_timestamp; a missing eye is all zeros. Pupil *area* has no mm scale of its own: with
    # ingest.pupil_area_scale_mm (a per-setup calibration) the diameter is scale·√area, else
    # pupil_mm is NaN; area 0 still marks the eye missing.
    if meta.channel_count != 10:
        raise _fail_count(meta, "eyelink", [10])
    if s.screen_resolution_px is None:
        raise StreamError(
            f"LSL stream {meta.name!r} (preset 'eyelink') reports screen pixels; set "
            "ingest.screen_resolution_px (width, height) so that gaze can be measured from the "
            "screen centre"
        )
    res = (float(s.screen_resolution_px[0]), float(s.screen_resolution_px[1]))
    eyes = (EyeChannels(0, 1, 4), EyeChannels(2, 3, 5))
    if s.screen_size_mm is not None and s.screen_distance_mm is not None:
        return Layout(
            "eyelink",
            10,
            eyes,
            "screen",
            image_px=res,
            screen_mm=s.screen_size_mm,
            distance_mm=s.screen_distance_mm,
            pupil_scale=s.pupil_area_scale_mm,
            pupil_area=True,
            zero_is_missing=True,
        )
    return Layout(
        "eyelink",
        10,
        eyes,
        "ppd",
        image_px=res,
        ppd=(6, 7),
        pupil_scale=s.pupil_area_scale_mm,
        pupil_area=True,
        zero_is_missing=True,
    )


def _layout_generic(meta: StreamMeta, s: IngestSettings) -> Layout:  # noqa: PLR0912 - one branch per channel convention of an undescribed stream
    chans = meta.channels
    if len(chans) != meta.channel_count or not any(c.type for c in chans):
        raise StreamError(
            f"LSL stream {meta.name!r} has {meta.channel_count} channels but describes "
            f"{len(chans)} in desc/channels; preset 'generic' needs label/eye/type/unit for "
            "every channel (XDF Gaze meta-data), or choose a preset with ingest.preset"
        )
    by_eye: dict[str, dict[str, int]] = {}
    confidence = index = None
    pupil_unit = ""
    for i, c in enumerate(chans):
        kind, eye = c.type.lower(), (c.eye.lower() or "both")
        if kind in {"screenx", "screeny", "diameter", "radius"}:
            by_eye.setdefault(eye, {})[kind] = i
        elif kind == "confidence":
            if c.unit.lower() not in _NORM_UNITS | {""}:
                raise _unit_error(meta, c, "normalized (0..1)")
            confidence = i
        elif kind == "framenumber":
            index = i
    eyes_found = {e: d for e, d in by_eye.items() if "screenx" in d and "screeny" in d}
    if "both" in eyes_found:  # a combined gaze channel pair wins over per-eye ones
        eyes_found = {"both": eyes_found["both"]}
    if not eyes_found:
        types = sorted({c.type for c in chans if c.type})
        raise StreamError(
            f"LSL stream {meta.name!r}: no ScreenX/ScreenY channel pair in its metadata (types "
            f"found: {types}); preset 'generic' needs them"
        )
    units = {chans[d[k]].unit.lower() for d in eyes_found.values() for k in ("screenx", "screeny")}
    if len(units) != 1:
        raise StreamError(
            f"LSL stream {meta.name!r}: gaze channels mix units {sorted(units)}; expected one "
            "of degrees, normalized or pixels"
        )
    unit = units.pop()
    eyes: list[EyeChannels] = []
    scale: float | None = 1.0
    for d in eyes_found.values():
        p = d.get("diameter", d.get("radius"))
        if p is not None:
            pupil_unit = chans[p].unit.lower()
            if pupil_unit in _PUPIL_NOT_MM:
                scale = None
            elif pupil_unit != "mm":
                raise _unit_error(meta, chans[p], "mm (or pixels / arbitrary, then ignored)")
            elif "diameter" not in d:
                scale = 2.0
        eyes.append(EyeChannels(d["screenx"], d["screeny"], p))
    common = {
        "pupil_scale": scale,
        "confidence": confidence,
        "index": index,
        "preset": "generic",
        "n_channels": meta.channel_count,
        "eyes": tuple(eyes),
    }
    if scale is None:
        logger.warning(
            "stream %r: pupil unit %r has no mm scale; pupil diameter will be NaN",
            meta.name,
            pupil_unit,
        )
    if unit in _DEG_UNITS:
        return Layout(coords="deg", y_up=True, **common)  # type: ignore[arg-type]
    if unit in _NORM_UNITS:
        return Layout(coords="fov", fov_deg=s.field_of_view_deg, **common)  # type: ignore[arg-type]
    if unit in _PX_UNITS:
        if s.screen_resolution_px is None:
            raise StreamError(
                f"LSL stream {meta.name!r} reports gaze in pixels; set "
                "ingest.screen_resolution_px, ingest.screen_size_mm and ingest.screen_distance_mm"
            )
        mm, dist = _screen_geometry(meta, "generic", s)
        res = (float(s.screen_resolution_px[0]), float(s.screen_resolution_px[1]))
        return Layout(
            coords="screen",
            image_px=res,
            screen_mm=mm,
            distance_mm=dist,
            **common,  # type: ignore[arg-type]
        )
    eye_chan = chans[next(iter(eyes_found.values()))["screenx"]]
    raise _unit_error(meta, eye_chan, "degrees, normalized or pixels")


def _unit_error(meta: StreamMeta, c: ChannelDesc, expected: str) -> StreamError:
    return StreamError(
        f"LSL stream {meta.name!r}: channel {c.label!r} (type {c.type!r}) has unknown unit "
        f"{c.unit!r}; expected {expected}. Fix the stream's metadata or choose a preset"
    )


def detect_preset(meta: StreamMeta) -> str:
    """The preset ``auto`` picks for a stream, from its name, type and metadata."""
    name, labels = meta.name.lower(), [c.label.lower() for c in meta.channels]
    if meta.manufacturer.lower() == "gazeguard" or name.startswith("gazeguard"):
        return "gazeguard"
    if name == "pupil_capture" or labels[:3] == ["confidence", "norm_pos_x", "norm_pos_y"]:
        return "pupil_capture"
    if name.endswith("neon gaze"):
        return "pupil_neon"
    if meta.type.lower() == "eyetracker" or "tobii" in name or "tobii" in meta.manufacturer.lower():
        return "tobii"
    if name == "eyelink" or labels[:2] == ["lefteyex", "lefteyey"]:
        return "eyelink"
    if meta.channels and any(c.type for c in meta.channels):
        return "generic"
    raise StreamError(
        f"cannot tell the channel layout of LSL stream {meta.name!r} (type {meta.type!r}, "
        f"{meta.channel_count} channels, no channel metadata); set ingest.preset to one of "
        f"{', '.join(PRESETS)}"
    )


def build_layout(meta: StreamMeta, settings: IngestSettings) -> Layout:
    """Choose and check the channel layout for a stream; StreamError if it does not fit."""
    preset = detect_preset(meta) if settings.preset == "auto" else settings.preset
    return _layout_for(meta, preset, settings)


# ---------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class IngestStats(OrderStats):
    """Counters of one stream (samples unless said otherwise).

    The order's counters (:class:`~gazeguard.core.ordering.OrderStats`: ``duplicates``,
    ``out_of_order``, ``implausible``, ``future``, ``nonfinite``, ``nonfinite_index``, ``lost``,
    ``resyncs``) plus those of normalisation and hand-off.
    """

    samples: int = 0  # delivered downstream
    invalid: int = 0  # delivered with valid=False (NaN, codes, low confidence, absurd, blinks)
    nan: int = 0  # delivered without any finite gaze coordinate from the source
    absurd: int = 0  # made invalid because |angle| > 90° or pupil outside 0.5–10 mm
    overflow: int = 0  # dropped because the consumer fell behind (bounded queue full)
    stalls: int = 0  # times the stream delivered nothing for longer than stall_after_s
    reconnects: int = 0  # times a new outlet with the same source_id took over

    @property
    def dropped(self) -> int:
        """Samples that never reached the consumer: refused by the order, or overflow."""
        return self.refused + self.overflow


@dataclass(slots=True)
class Normalizer:
    """Turns raw ``(N, C)`` blocks into GazeSamples for one layout, keeping order state.

    Stateful across blocks through its :class:`~gazeguard.core.ordering.SampleOrder` (``order``):
    the
    output is strictly increasing in time across calls, and timestamps that are not finite, run
    ahead of the clock or whose sample index jumps implausibly are dropped and counted, never
    adopted. ``reset_index()`` forgets the sample index (a restarted source counts from 0 again).

    Args:
        layout: how to read the channels.
        confidence_threshold: samples below it are invalid (layouts with a confidence channel).
        stats: counters to update.
        nominal_rate_hz, future_tolerance_s, resync_after_s, max_age_s, dejitter: see
            :class:`~gazeguard.core.ordering.SampleOrder`.
        name: the stream's name, for log lines.
    """

    layout: Layout
    confidence_threshold: float = 0.6
    stats: IngestStats = field(default_factory=IngestStats)
    nominal_rate_hz: float = 0.0
    future_tolerance_s: float | None = 0.5
    resync_after_s: float = 2.0
    max_age_s: float | None = None
    dejitter: bool = False
    name: str = "gaze stream"
    order: SampleOrder = field(init=False)

    def __post_init__(self) -> None:
        self.order = SampleOrder(
            nominal_rate_hz=self.nominal_rate_hz,
            future_tolerance_s=self.future_tolerance_s,
            resync_after_s=self.resync_after_s,
            max_age_s=self.max_age_s,
            dejitter=self.dejitter,
            stats=self.stats,
            name=f"LSL stream {self.name!r}",
        )

    @classmethod
    def for_stream(
        cls, layout: Layout, meta: StreamMeta, settings: IngestSettings, stats: IngestStats
    ) -> Normalizer:
        """The normalizer of an LSL stream, configured from ``ingest`` settings."""
        return cls(
            layout,
            settings.confidence_threshold,
            stats,
            nominal_rate_hz=meta.nominal_srate if meta.nominal_srate > 0 else 0.0,
            future_tolerance_s=settings.future_tolerance_s,
            resync_after_s=settings.resync_after_s,
            max_age_s=MAX_SAMPLE_AGE_S,
            dejitter=settings.dejitter,
            name=meta.name,
        )

    @property
    def last_t(self) -> float:
        """Last kept timestamp (before dejittering), s; -inf before the first."""
        return self.order.last_t

    @property
    def last_index(self) -> float:
        """Last kept finite sample index; -inf before the first or after ``reset_index``."""
        return self.order.last_index

    def reset_index(self) -> None:
        """Forget the last sample index (a new outlet took over)."""
        self.order.reset_index()

    def gaze(
        self, raw: npt.NDArray[np.float64]
    ) -> tuple[FloatArray, FloatArray, FloatArray, BoolArray, BoolArray]:
        """Convert ``raw`` (N, C) float64 to (x_deg, y_deg, pupil_mm, valid, source_nan)."""
        lay = self.layout
        n = raw.shape[0]
        eyes: list[tuple[FloatArray, FloatArray, BoolArray, FloatArray, BoolArray]] = []
        any_finite = np.zeros(n, bool)
        zp = np.zeros(n, bool)  # some eye reports a zero/negative pupil: pupil loss
        no_pupil = np.full(n, np.nan)
        for eye in lay.eyes:
            rx, ry = raw[:, eye.x], raw[:, eye.y]
            ok = np.isfinite(rx) & np.isfinite(ry)
            if lay.zero_is_missing:  # EyeLink: a missing eye is all zeros or a missing code
                ok &= ~((rx == 0) & (ry == 0))
                ok &= (np.abs(rx) < EYELINK_MISSING) & (np.abs(ry) < EYELINK_MISSING)
                ok &= (rx != -32768) & (ry != -32768)
                if eye.pupil is not None:
                    ok &= raw[:, eye.pupil] != 0
            any_finite |= ok
            x, y = self._to_deg(raw, rx, ry)
            ok &= np.isfinite(x) & np.isfinite(y)
            p, pok = no_pupil, np.zeros(n, bool)
            if eye.pupil is not None and lay.pupil_scale is not None:
                p = raw[:, eye.pupil]
                if lay.pupil_area:
                    p = np.sqrt(np.where(p > 0, p, 0.0))  # NaN stays NaN; ≤ 0 is pupil loss
                p = p * lay.pupil_scale
                pok = ok & (p > 0)  # NaN compares False
                zp |= ok & (p <= 0)
            eyes.append((x, y, ok, p, pok))
        if len(eyes) == 1:
            x, y, valid, pupil, pok = eyes[0]
            pupil = np.where(pok, pupil, np.nan)
        else:  # mean over the eyes that are valid in each sample
            cnt = np.sum([e[2] for e in eyes], axis=0)
            cp = np.sum([e[4] for e in eyes], axis=0)
            valid = cnt > 0
            with np.errstate(invalid="ignore", divide="ignore"):
                x = np.sum([np.where(e[2], e[0], 0.0) for e in eyes], axis=0) / cnt
                y = np.sum([np.where(e[2], e[1], 0.0) for e in eyes], axis=0) / cnt
                pupil = np.sum([np.where(e[4], e[3], 0.0) for e in eyes], axis=0) / cp
            pok = cp > 0
        if lay.confidence is not None:
            valid &= raw[:, lay.confidence] >= self.confidence_threshold  # NaN compares False
        if lay.validity is not None:
            valid &= raw[:, lay.validity] >= 0.5
        valid &= ~(zp & ~pok)  # a zero pupil is pupil loss (a blink), never a value
        with np.errstate(invalid="ignore"):
            absurd = valid & (
                (np.abs(x) > MAX_ABS_ANGLE_DEG)
                | (np.abs(y) > MAX_ABS_ANGLE_DEG)
                | (pupil < PUPIL_RANGE_MM[0])
                | (pupil > PUPIL_RANGE_MM[1])
            )
        if absurd.any():
            self.stats.absurd += int(np.count_nonzero(absurd))
            valid &= ~absurd
        # np.where copies: x and y may be views of the pull buffer
        x, y = np.where(valid, x, np.nan), np.where(valid, y, np.nan)
        return x, y, np.where(valid, pupil, np.nan), valid, ~any_finite

    def _to_deg(
        self, raw: npt.NDArray[np.float64], rx: FloatArray, ry: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        lay = self.layout
        if lay.coords == "deg":
            return (rx, ry) if lay.y_up else (rx, -ry)
        if lay.coords == "ppd":
            assert lay.ppd is not None
            assert lay.image_px is not None
            with np.errstate(invalid="ignore", divide="ignore"):
                x = (rx - lay.image_px[0] / 2) / raw[:, lay.ppd[0]]
                y = (lay.image_px[1] / 2 - ry) / raw[:, lay.ppd[1]]
            return x, y
        u, v = (rx / lay.image_px[0], ry / lay.image_px[1]) if lay.image_px else (rx, ry)
        if lay.coords == "screen":
            assert lay.screen_mm is not None
            assert lay.distance_mm is not None
            return screen_to_deg(u, v, lay.screen_mm, lay.distance_mm)
        assert lay.fov_deg is not None
        x, y = normalized_to_deg(u, v, lay.fov_deg, y_up=lay.y_up)
        if lay.gaze3d is not None:  # Pupil Capture's 3d mapper: a gaze vector (x right, y down)
            gx, gy, gz = (raw[:, i] for i in lay.gaze3d)
            use = np.isfinite(gx) & np.isfinite(gy) & (gz > 0)
            if use.any():
                x = np.where(use, np.degrees(np.arctan2(gx, gz)), x)
                y = np.where(use, np.degrees(np.arctan2(-gy, np.hypot(gx, gz))), y)
        return x, y

    def __call__(
        self, raw: npt.NDArray[np.float64], t: FloatArray, now: float | None = None
    ) -> GazeSamples | None:
        """Normalize one pulled block; None if every sample was dropped.

        Args:
            raw: (N, C) float64 samples as pulled (may be a view of the pull buffer).
            t: (N,) timestamps on the local LSL clock, s.
            now: ``pylsl.local_clock()`` when the block was pulled (default: now), s.
        """
        index = raw[:, self.layout.index] if self.layout.index is not None else None
        keep, ts = self.order(t, index, pylsl.local_clock() if now is None else now)
        if not keep.all():
            raw = raw[keep]
        if ts.shape[0] == 0:
            return None
        x, y, pupil, valid, nan = self.gaze(raw)
        st = self.stats
        st.samples += ts.shape[0]
        st.invalid += int(ts.shape[0] - np.count_nonzero(valid))
        st.nan += int(np.count_nonzero(nan))
        return GazeSamples(np.ascontiguousarray(ts, np.float64), x, y, pupil, valid)


# ---------------------------------------------------------------------------------------------
# Outlet description
# ---------------------------------------------------------------------------------------------
def gazeguard_stream_info(
    name: str, source_id: str, rate_hz: float, stream_type: str = "Gaze"
) -> pylsl.StreamInfo:
    """StreamInfo of gazeguard's own outlets (preset ``gazeguard``, type ``Gaze`` unless given,
    float64).

    Channels: sample index, x (deg, positive right), y (deg, positive up), pupil diameter (mm),
    validity (1 valid, 0 invalid); with XDF channel metadata, so ``generic`` reads it too.
    """
    info = pylsl.StreamInfo(
        name, stream_type, len(GAZEGUARD_CHANNELS), rate_hz, pylsl.cf_double64, source_id
    )
    desc = info.desc()
    desc.append_child("acquisition").append_child_value("manufacturer", "gazeguard")
    chans = desc.append_child("channels")
    for label, eye, kind, unit in GAZEGUARD_CHANNELS:
        ch = chans.append_child("channel")
        ch.append_child_value("label", label)
        ch.append_child_value("eye", eye)
        ch.append_child_value("type", kind)
        ch.append_child_value("unit", unit)
    return info
