"""Synthetic gaze: a simulated person and a simulated headset (a real LSL outlet).

The person model (:class:`Person`, drawn from a seed) fixes the oculomotor traits that make real
people identifiable: fixation-duration distribution, saccade-amplitude distribution and direction
bias, main-sequence constants, microsaccade rate and size, drift, blink rate and duration, pupil
size and its slow variation. :class:`GazeGenerator` turns a person (and optionally a task:
``reading``, ``search``, ``watching``) into samples:

- **fixations** with drift (a random walk), microsaccades that mostly correct it, and
  measurement noise;
- **saccades** on the main sequence: peak velocity ``Vp = Vmax·(1 − exp(−A/C))`` for amplitude
  ``A``, a cycloidal position profile ``A·(τ − sin 2πτ / 2π)`` whose peak velocity is ``2A/D``,
  so the duration is ``D = 2A/Vp`` (≈ 20 ms for small saccades, growing ~linearly beyond C);
- **blinks** as a Poisson process (gaze and pupil NaN, invalid);
- **pupil** diameter with slow variation and a task-dependent level.

All randomness is at the event level or keyed by absolute sample index, so the output is
deterministic per (seed, task, session) and does not depend on how it is chunked:
``simulate_gaze(10, 250, seed=3)`` equals ten one-second ``take()`` calls.

:class:`SimulatedHeadset` streams a generator as a real pylsl outlet (preset ``gazeguard``) on a
real-time schedule in a background thread; ``gazeguard simulate`` (:mod:`gazeguard.cli.simulate`)
runs one from the command line.
Recorded files are streamed by :mod:`gazeguard.offline.replay`, which shares this module's real-time
pusher thread.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pylsl

from gazeguard.config import IngestSettings
from gazeguard.core.errors import ConfigError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.runtime.presets import gazeguard_stream_info

logger = logging.getLogger(__name__)

TASKS = ("free", "reading", "search", "watching")
RATE_RANGE_HZ = (30.0, 2000.0)
FIELD_DEG = (25.0, 18.0)  # saccade targets stay within ±x, ±y (a VR headset's comfortable range)
_NOISE_BLOCK = 4096  # measurement noise is drawn per block of absolute sample indices


@dataclass(frozen=True)
class Person:
    """Oculomotor traits of one simulated person (all drawn from ``seed``).

    Attributes:
        fixation_mean_s: mean fixation duration, s; ``fixation_shape`` its gamma shape.
        amplitude_mean_deg: mean saccade amplitude, deg; ``amplitude_shape`` its gamma shape.
        horizontal_bias: probability that a saccade is near-horizontal.
        rightward_bias: probability that a near-horizontal saccade goes right.
        vmax_deg_s, c_deg: main sequence ``Vp = vmax·(1 − exp(−A/c))``, deg/s and deg.
        microsaccade_rate_hz, microsaccade_amp_deg: per fixation second; mean amplitude, deg.
        drift_deg_sqrt_s: drift random-walk scale, deg/√s.
        noise_deg: measurement noise (tracker precision), deg RMS per axis.
        blink_rate_hz: blinks per second; ``blink_duration_s`` their mean length, s.
        pupil_mm: mean pupil diameter, mm; ``pupil_variation_mm`` amplitude of slow changes, mm.
    """

    seed: int
    fixation_mean_s: float
    fixation_shape: float
    amplitude_mean_deg: float
    amplitude_shape: float
    horizontal_bias: float
    rightward_bias: float
    vmax_deg_s: float
    c_deg: float
    microsaccade_rate_hz: float
    microsaccade_amp_deg: float
    drift_deg_sqrt_s: float
    noise_deg: float
    blink_rate_hz: float
    blink_duration_s: float
    pupil_mm: float
    pupil_variation_mm: float

    @classmethod
    def from_seed(cls, seed: int) -> Person:
        """The person of ``seed`` (>= 0); ranges follow the eye-movement literature."""
        u = np.random.default_rng(_seed_seq(seed, 0)).uniform
        return cls(
            seed=seed,
            fixation_mean_s=u(0.19, 0.33),
            fixation_shape=u(2.5, 6.0),
            amplitude_mean_deg=u(3.5, 9.0),
            amplitude_shape=u(1.5, 3.0),
            horizontal_bias=u(0.3, 0.8),
            rightward_bias=u(0.4, 0.6),
            vmax_deg_s=u(420.0, 650.0),
            c_deg=u(4.0, 9.0),
            microsaccade_rate_hz=u(0.6, 2.2),
            microsaccade_amp_deg=u(0.15, 0.5),
            drift_deg_sqrt_s=u(0.05, 0.2),
            noise_deg=u(0.003, 0.008),
            blink_rate_hz=u(0.1, 0.45),
            blink_duration_s=u(0.1, 0.22),
            pupil_mm=u(2.8, 5.5),
            pupil_variation_mm=u(0.1, 0.45),
        )

    def peak_velocity(self, amplitude_deg: float) -> float:
        """Main-sequence peak velocity of a saccade of ``amplitude_deg``, deg/s."""
        return self.vmax_deg_s * -math.expm1(-amplitude_deg / self.c_deg)

    def saccade_duration(self, amplitude_deg: float) -> float:
        """Duration of a cycloidal saccade with main-sequence peak velocity, s (``2A/Vp``)."""
        return 2.0 * amplitude_deg / self.peak_velocity(max(amplitude_deg, 1e-6))


@dataclass(frozen=True)
class TaskStyle:
    """How a task changes a person's behaviour (multipliers and offsets)."""

    fixation: float = 1.0  # × fixation duration
    amplitude: float = 1.0  # × saccade amplitude
    blink: float = 1.0  # × blink rate
    pupil_mm: float = 0.0  # + pupil diameter, mm (cognitive load)
    centre_pull: float = 0.1  # tendency to return towards the centre


TASK_STYLES = {
    "free": TaskStyle(),
    "reading": TaskStyle(fixation=0.85, blink=0.6, pupil_mm=0.15),
    "search": TaskStyle(fixation=0.8, amplitude=1.4, blink=0.9, pupil_mm=0.35, centre_pull=0.05),
    "watching": TaskStyle(fixation=1.35, amplitude=0.7, blink=1.2, pupil_mm=-0.1, centre_pull=0.4),
}


def _seed_seq(seed: int, *keys: int) -> np.random.SeedSequence:
    if seed < 0:
        raise ConfigError("seed", seed, "must be >= 0", "argument")
    return np.random.SeedSequence([seed, *keys])


def _check_rate(rate_hz: float) -> None:
    if not (RATE_RANGE_HZ[0] <= rate_hz <= RATE_RANGE_HZ[1]):
        raise ConfigError(
            "rate_hz", rate_hz, f"must be between {RATE_RANGE_HZ[0]:g} and {RATE_RANGE_HZ[1]:g} Hz"
        )


def _cycloid(tau: FloatArray) -> FloatArray:
    """Normalized saccade position profile on τ ∈ [0, 1] (0 → 0, 1 → 1, peak slope 2)."""
    tau = np.clip(tau, 0.0, 1.0)
    return tau - np.sin(2 * np.pi * tau) / (2 * np.pi)


@dataclass
class _Event:
    """A fixation or saccade covering absolute samples ``s0 <= k < s1``."""

    kind: str  # "fix" | "sacc"
    t0: float
    t1: float
    s0: int
    s1: int
    p0: npt.NDArray[np.float64]
    p1: npt.NDArray[np.float64]
    offsets: npt.NDArray[np.float64] | None = None  # fixation: (s1 - s0, 2) drift + micro


class GazeGenerator:
    """Incremental sample source for one simulated person, task and session.

    Args:
        rate_hz: sampling rate, Hz (30–2000).
        seed: which person (>= 0).
        task: one of :data:`TASKS`.
        session: which recording of that person and task (another realisation).
    """

    def __init__(self, rate_hz: float, seed: int, task: str = "free", session: int = 0) -> None:
        _check_rate(rate_hz)
        if task not in TASK_STYLES:
            raise ConfigError("task", task, f"must be one of {', '.join(TASKS)}")
        self.rate_hz = float(rate_hz)
        self.person = Person.from_seed(seed)
        self.task = task
        self.style = TASK_STYLES[task]
        self._keys = (seed, TASKS.index(task), session)
        # Separate generators for events and blinks: they are extended independently, so
        # sharing one would make the output depend on how take() is chunked.
        self._rng = np.random.default_rng(_seed_seq(*self._keys, 1))
        self._blink_rng = np.random.default_rng(_seed_seq(*self._keys, 4))
        self._k = 0  # next absolute sample index
        self._events: deque[_Event] = deque()
        self._t_end = 0.0  # events cover [0, _t_end)
        self._pos = np.zeros(2)
        self._line_left = -11.0  # reading: current line's left margin and height
        self._line_y = 8.0
        self._blinks: deque[tuple[float, float]] = deque()
        self._blink_t = self._next_blink_gap()
        prng = np.random.default_rng(_seed_seq(*self._keys, 2))
        self._pupil_f = prng.uniform(0.01, 0.15, 3)
        self._pupil_phase = prng.uniform(0, 2 * np.pi, 3)
        self._noise_block = -1
        self._noise = np.zeros((_NOISE_BLOCK, 3))

    # -- events ---------------------------------------------------------------------------
    def _next_blink_gap(self) -> float:
        rate = self.person.blink_rate_hz * self.style.blink
        return float(self._blink_rng.exponential(1.0 / rate))

    def _sample_index(self, t: float) -> int:
        return math.ceil(t * self.rate_hz - 1e-9)

    def _add_fixation(self) -> None:
        p, rng, rate = self.person, self._rng, self.rate_hz
        mean = p.fixation_mean_s * self.style.fixation
        dur = float(np.clip(rng.gamma(p.fixation_shape, mean / p.fixation_shape), 0.06, 2.5))
        t0, t1 = self._t_end, self._t_end + dur
        s0, s1 = self._sample_index(t0), self._sample_index(t1)
        n = s1 - s0
        times = np.arange(s0, s1) / rate - t0
        off = np.cumsum(rng.normal(0.0, p.drift_deg_sqrt_s / math.sqrt(rate), (n, 2)), axis=0)
        n_micro = int(rng.poisson(p.microsaccade_rate_hz * dur))
        for tm in np.sort(rng.uniform(0.05, max(dur - 0.05, 0.051), n_micro)):
            j = min(int(tm * rate), n - 1) if n else 0
            amp = float(rng.gamma(4.0, p.microsaccade_amp_deg / 4.0))
            back = -off[j] if n else np.zeros(2)
            theta = (
                math.atan2(back[1], back[0]) + rng.normal(0, 0.5)
                if np.hypot(*back) > 0.05
                else rng.uniform(0, 2 * np.pi)
            )
            step = amp * np.array([math.cos(theta), math.sin(theta)])
            prof = _cycloid((times - tm) / p.saccade_duration(amp))
            off += prof[:, None] * step
        start = self._pos.copy()
        self._events.append(_Event("fix", t0, t1, s0, s1, start, start, off))
        if n:
            self._pos = start + off[-1]
        self._t_end = t1

    def _saccade_vector(self) -> npt.NDArray[np.float64]:
        p, rng, st, pos = self.person, self._rng, self.style, self._pos
        if self.task == "reading":
            if pos[0] > self._line_left + 22.0:  # return sweep to the next line
                self._line_y = self._line_y - 1.2 if self._line_y > -8.0 else 8.0
                target = np.array([self._line_left + rng.normal(0.5, 0.4), self._line_y])
                return target - pos
            scale = math.sqrt(p.amplitude_mean_deg / 6.0)
            if rng.random() < 0.12:  # regression
                return np.array([-rng.gamma(3.0, 0.6 * scale / 3.0), rng.normal(0, 0.08)])
            dy = self._line_y - pos[1] + rng.normal(0, 0.1)
            return np.array([rng.gamma(4.0, 1.8 * scale / 4.0), dy])
        amp = rng.gamma(p.amplitude_shape, p.amplitude_mean_deg * st.amplitude / p.amplitude_shape)
        dist = float(np.hypot(*pos))
        if rng.random() < min(1.0, st.centre_pull * dist / 10.0):
            theta = math.atan2(-pos[1], -pos[0]) + rng.normal(0, 0.35)
            amp = min(amp, dist * rng.uniform(0.5, 1.1))
        elif rng.random() < p.horizontal_bias:
            theta = (0.0 if rng.random() < p.rightward_bias else math.pi) + rng.normal(0, 0.17)
        else:
            theta = rng.uniform(0, 2 * np.pi)
        vec = amp * np.array([math.cos(theta), math.sin(theta)])
        target = pos + vec
        if abs(target[0]) > FIELD_DEG[0] or abs(target[1]) > FIELD_DEG[1]:
            vec = -vec  # bounce back into the field
            target = np.clip(pos + vec, [-FIELD_DEG[0], -FIELD_DEG[1]], list(FIELD_DEG))
            vec = target - pos
        return vec

    def _add_saccade(self) -> None:
        vec = self._saccade_vector()
        amp = float(np.hypot(*vec))
        if amp < 0.05:
            vec = np.array([0.05, 0.0])
            amp = 0.05
        t0 = self._t_end
        t1 = t0 + self.person.saccade_duration(amp)
        start = self._pos.copy()
        self._pos = start + vec
        ev = _Event(
            "sacc", t0, t1, self._sample_index(t0), self._sample_index(t1), start, self._pos
        )
        self._events.append(ev)
        self._t_end = t1

    def _extend(self, t: float) -> None:
        """Generate events (and blinks) until time ``t`` is covered."""
        while self._t_end <= t:
            if self._events and self._events[-1].kind == "fix":
                self._add_saccade()
            else:
                self._add_fixation()
        while self._blink_t <= t:
            dur = float(self._blink_rng.lognormal(math.log(self.person.blink_duration_s), 0.25))
            self._blinks.append((self._blink_t, self._blink_t + dur))
            self._blink_t += dur + self._next_blink_gap()

    # -- samples --------------------------------------------------------------------------
    def _noise_for(self, k0: int, k1: int) -> npt.NDArray[np.float64]:
        out = np.empty((k1 - k0, 3))
        k = k0
        while k < k1:
            b = k // _NOISE_BLOCK
            if b != self._noise_block:
                rng = np.random.default_rng(_seed_seq(*self._keys, 3, b))
                self._noise = rng.standard_normal((_NOISE_BLOCK, 3))
                self._noise_block = b
            stop = min(k1, (b + 1) * _NOISE_BLOCK)
            out[k - k0 : stop - k0] = self._noise[k - b * _NOISE_BLOCK : stop - b * _NOISE_BLOCK]
            k = stop
        return out

    def take(self, n: int) -> GazeSamples:
        """The next ``n`` samples; timestamps ``k / rate_hz`` s for absolute sample index k."""
        k0, k1 = self._k, self._k + n
        t = np.arange(k0, k1) / self.rate_hz
        self._extend(k1 / self.rate_hz)
        xy = np.empty((n, 2))
        for ev in self._events:
            a, b = max(ev.s0, k0), min(ev.s1, k1)
            if a >= b:
                continue
            if ev.kind == "fix":
                assert ev.offsets is not None
                xy[a - k0 : b - k0] = ev.p0 + ev.offsets[a - ev.s0 : b - ev.s0]
            else:
                tau = (t[a - k0 : b - k0] - ev.t0) / (ev.t1 - ev.t0)
                xy[a - k0 : b - k0] = ev.p0 + _cycloid(tau)[:, None] * (ev.p1 - ev.p0)
        while self._events and self._events[0].s1 <= k1:
            self._events.popleft()
        p = self.person
        noise = self._noise_for(k0, k1)
        xy += noise[:, :2] * p.noise_deg
        slow = np.sin(2 * np.pi * self._pupil_f * t[:, None] + self._pupil_phase).sum(axis=1)
        pupil = p.pupil_mm + self.style.pupil_mm + p.pupil_variation_mm / 1.7 * slow
        pupil += 0.02 * noise[:, 2]
        valid = np.ones(n, bool)
        for b0, b1 in self._blinks:
            valid[(t >= b0) & (t < b1)] = False
        while n and self._blinks and self._blinks[0][1] <= t[-1]:
            self._blinks.popleft()
        self._k = k1
        x, y = xy[:, 0], xy[:, 1]
        x[~valid] = np.nan
        y[~valid] = np.nan
        pupil[~valid] = np.nan
        return GazeSamples(t, np.ascontiguousarray(x), np.ascontiguousarray(y), pupil, valid)


def simulate_gaze(
    duration_s: float, rate_hz: float, seed: int, task: str = "free", session: int = 0
) -> GazeSamples:
    """``duration_s`` of one simulated person's gaze at ``rate_hz`` (offline, deterministic).

    Returns GazeSamples with timestamps from 0 s; degrees, mm, validity (blinks invalid).
    """
    return GazeGenerator(rate_hz, seed, task, session).take(round(duration_s * rate_hz))


#: Where each task's content sits in the scene, (x, y) deg: :func:`simulate_scene_gaze` shifts a
#: task's gaze there, so people doing different tasks look at different places (attention
#: evaluations; the oculomotor traits and every feature are unchanged by a shift).
TASK_SCENES: dict[str, tuple[float, float]] = {
    "free": (0.0, 0.0),
    "reading": (-6.0, 2.0),  # a text column left of centre
    "search": (4.0, -4.0),  # a search display below and right
    "watching": (9.0, 4.0),  # a video panel up and right
}


def simulate_scene_gaze(
    duration_s: float, rate_hz: float, seed: int, task: str = "free", session: int = 0
) -> GazeSamples:
    """:func:`simulate_gaze` shifted to the task's place in the scene (:data:`TASK_SCENES`),
    degrees of gaze angle: the same person and task, looking where that task's content is."""
    g = simulate_gaze(duration_s, rate_hz, seed, task, session)
    dx, dy = TASK_SCENES[task]
    return GazeSamples(g.timestamps, g.x_deg + dx, g.y_deg + dy, g.pupil_mm, g.valid)


# ---------------------------------------------------------------------------------------------
# Real-time LSL outlets
# ---------------------------------------------------------------------------------------------
class Pusher(ABC):
    """Background thread that pushes rows into an outlet on a real-time schedule."""

    def __init__(self, outlet: pylsl.StreamOutlet, name: str, push_interval_s: float) -> None:
        self.outlet = outlet
        self.push_interval_s = push_interval_s
        self.samples_sent = 0
        self.done = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported by stop()
            logger.exception("%s failed", self._thread.name)
            self._error = exc
        finally:
            self.done.set()

    @abstractmethod
    def run(self) -> None:
        """Push until done or stopped (in the thread)."""


class SimulatedHeadset:
    """A simulated person's gaze as a real LSL outlet (preset ``gazeguard``), in real time.

    ``with SimulatedHeadset(250, seed=3, source_id="x") as headset:`` creates the outlet and
    starts a thread that, every ``push_interval_s``, pushes the samples that fell due since the
    start, timestamped on the LSL clock at exactly ``1/rate_hz`` spacing. The sample-index
    channel counts from 0 per outlet. With ``duration_s`` it stops after that much gaze
    (``headset.done`` is set); the outlet lives until the context exits.

    Args:
        rate_hz: sampling rate, Hz (30–2000; real headsets: 60–1200).
        seed: which simulated person; ``task`` and ``session`` as in :class:`GazeGenerator`.
        source_id: LSL source_id (default: a fresh unique one); name: LSL stream name.
        duration_s: seconds of gaze to stream (None: until stopped).
        push_interval_s: how often due samples are pushed, s (vendor bridges push every sample:
            ``1 / rate_hz``).
        stream_type: LSL stream type (``from_settings``: ``ingest.stream_type``).
    """

    def __init__(
        self,
        rate_hz: float = 120.0,
        seed: int = 1,
        *,
        task: str = "free",
        session: int = 0,
        source_id: str | None = None,
        name: str = "gazeguard-sim",
        duration_s: float | None = None,
        push_interval_s: float = 0.01,
        stream_type: str = "Gaze",
    ) -> None:
        self.generator = GazeGenerator(rate_hz, seed, task, session)
        self.rate_hz = float(rate_hz)
        self.source_id = source_id or f"gazeguard-sim-{uuid.uuid4().hex[:12]}"
        self.name = name
        self.stream_type = stream_type
        self.total = None if duration_s is None else round(duration_s * rate_hz)
        self.push_interval_s = push_interval_s
        self._pusher: _HeadsetPusher | None = None
        self._sent = 0  # samples pushed by outlets that were stopped

    @classmethod
    def from_settings(
        cls,
        settings: IngestSettings,
        *,
        source_id: str | None = None,
        duration_s: float | None = None,
    ) -> SimulatedHeadset:
        """The headset ``ingest.source = "simulated"`` asks for (rate and seed from settings)."""
        return cls(
            settings.simulated_rate_hz,
            settings.simulated_seed,
            source_id=source_id,
            duration_s=duration_s,
            stream_type=settings.stream_type,
        )

    @property
    def samples_sent(self) -> int:
        """Samples pushed so far."""
        return self._sent + (self._pusher.samples_sent if self._pusher is not None else 0)

    @property
    def done(self) -> threading.Event:
        """Set when ``duration_s`` of gaze has been pushed (or the thread failed)."""
        if self._pusher is None:
            raise RuntimeError("SimulatedHeadset is not started; use `with SimulatedHeadset(...)`")
        return self._pusher.done

    def start(self) -> None:
        """Create the outlet and start pushing."""
        info = gazeguard_stream_info(self.name, self.source_id, self.rate_hz, self.stream_type)
        outlet = pylsl.StreamOutlet(info, 0, 60)
        self._pusher = _HeadsetPusher(self, outlet)
        self._pusher.start()
        logger.info(
            "simulated headset: person %d, task %r, %g Hz as LSL stream %r (source_id %r)",
            self.generator.person.seed,
            self.generator.task,
            self.rate_hz,
            self.name,
            self.source_id,
        )

    def stop(self) -> None:
        """Stop pushing and destroy the outlet (inlets see the stream vanish)."""
        if self._pusher is not None:
            pusher, self._pusher = self._pusher, None
            self._sent += pusher.samples_sent
            pusher.stop()  # the outlet goes with the pusher

    def __enter__(self) -> SimulatedHeadset:
        self.start()
        return self

    def __exit__(
        self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _HeadsetPusher(Pusher):
    def __init__(self, headset: SimulatedHeadset, outlet: pylsl.StreamOutlet) -> None:
        super().__init__(
            outlet, f"gazeguard.runtime.simulate[{headset.name}]", headset.push_interval_s
        )
        self.headset = headset

    def run(self) -> None:
        h, gen = self.headset, self.headset.generator
        rows = np.empty((0, 5))
        t_start = pylsl.local_clock()
        while not self._stop.is_set():
            due = math.floor((pylsl.local_clock() - t_start) * h.rate_hz)
            if h.total is not None:
                due = min(due, h.total)
            n = due - self.samples_sent
            if n > 0:
                block = gen.take(n)
                if rows.shape[0] < n:
                    rows = np.empty((n, 5))
                out = rows[:n]
                out[:, 0] = np.arange(self.samples_sent, due)
                out[:, 1], out[:, 2], out[:, 3] = block.x_deg, block.y_deg, block.pupil_mm
                out[:, 4] = block.valid
                # One timestamp for the chunk: liblsl back-fills the others at 1/rate spacing.
                self.outlet.push_chunk(out, t_start + (due - 1) / h.rate_hz)
                self.samples_sent = due
            if h.total is not None and self.samples_sent >= h.total:
                return
            self._stop.wait(self.push_interval_s)
