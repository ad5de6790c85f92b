"""Accounting policy: caps, composition and windows over gaze time — plain code, no storage.

What a session has spent is a multiset of *accounting events* (an event key → how many releases
of it were charged; see :mod:`gazeguard.privacy.accounting`). The policy turns those counts into the
user-level figures a person cares about and decides whether one more release fits:

* ``epsilon`` — the session's ε at the ledger's δ: the best valid bound among the accountant's
  composition (privacy loss distributions, or RDP) and pure sequential composition. Both are
  upper bounds on the true privacy loss, so their minimum is one too.
* ``pure`` — sequential pure ε (the sum; infinite once anything without a pure guarantee, such as
  Gaussian noise, was released): the conservative view.
* ``window`` — ε at δ of the releases whose gaze lies in the trailing ``window_s`` seconds of gaze
  time (default one hour: the *per hour of gaze* figure).

Caps (all ε at the ledger's δ): a session cap over everything, and a window cap over *any*
``window_s`` seconds of gaze time (the w-event idea of Kellaris et al. 2014, counted in gaze time
rather than in chunk indexes, because one gaze sample reaches several chunks). A release that
would exceed a cap is refused with :class:`~gazeguard.core.errors.BudgetExhaustedError`.

Which window must be checked: a release whose gaze ends at ``t`` belongs to every window
``(a, a + W]`` with ``a < t ≤ a + W``. When releases are charged in gaze order (the normal case:
``t`` is the latest gaze time of the session) only the window ending at ``t`` can have grown: any
other window containing ``t`` ends later and its other members are charged later, when that window
is checked. Out of order (a fleet may charge late chunks), every window ending at an already
charged gaze time in ``[t, t + W)`` is checked too (:func:`windows_to_check`).

Cap changes on restart: caps are stored with the session; a configuration that is *stricter*
(lower caps, a longer window at the same or lower cap, a smaller δ) is adopted, a *looser* one would
refill the budget and is refused unless explicitly allowed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger._model import to_units_down
from gazeguard.privacy.accounting import Measure, PrivacyLoss

Counts = Mapping[str, int]
"""Accounting-event key (canonical JSON) → number of releases charged."""

DEFAULT_DELTA = 1e-6
#: One hour of gaze, s: the unit of the budget per hour and the default window (an int, so
#: that the plan's exact arithmetic on fractions of a second stays exact).
HOUR_S = 3600


class Composer(Protocol):
    """Composes counted accounting events (:class:`gazeguard.ledger.LedgerComposer`)."""

    def epsilon(self, counts: Counts, delta: float, *, exact: bool = False) -> float:
        """A valid upper bound on ε at ``delta`` of all releases in ``counts`` (never above the
        pure sequential ε); may round counts up to cache results unless ``exact``."""
        ...

    def fits(self, before: Counts, cost: Counts, cap: float, delta: float) -> bool:
        """Whether ``before`` plus ``cost`` stays within ``cap`` (ε at ``delta``), decided with
        the tightest bound available (no rounding up)."""
        ...

    def pure(self, counts: Counts) -> float:
        """Sequential pure ε of ``counts`` (``inf`` when an event has no pure guarantee)."""
        ...

    def pure_units(self, counts: Counts) -> int | None:
        """Exact sequential pure ε in micro-ε (``None`` when an event has no pure guarantee)."""
        ...


#: How a session's releases are composed against its caps.
COMPOSITIONS = ("pld", "sequential")


@dataclass(frozen=True, slots=True)
class Caps:
    """The caps of a session (ε at ``delta``).

    Build them from typed losses with :meth:`of` (what
    :meth:`gazeguard.plan.ReleasePlan.ledger_caps` does); the fields are their stored form
    (:meth:`to_json`), which the policy compares figures with.

    Attributes:
        session: cap on the session's ε, or ``None``.
        window: cap on the ε of any ``window_s`` seconds of gaze, or ``None``.
        window_s: the window's length in seconds of gaze time (default one hour).
        delta: the δ every ε here is stated at.
        composition: ``"pld"`` or ``"sequential"``.
        wall_clock: the window cap also binds any ``window_s`` seconds of wall-clock (charging)
            time, so no input — a backlog stamped in the past, a replay — can spend more than
            ``window`` per real hour, whatever its gaze time says.
    """

    session: float | None = None
    window: float | None = None
    window_s: float = float(HOUR_S)
    delta: float = DEFAULT_DELTA
    composition: str = "pld"
    wall_clock: bool = False

    def __post_init__(self) -> None:
        if self.composition not in COMPOSITIONS:
            raise ConfigError(
                "ledger.composition", self.composition, f"must be one of {', '.join(COMPOSITIONS)}"
            )
        for field, value in (
            ("ledger.session_cap", self.session),
            ("ledger.window_cap", self.window),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(field, value, "must be a finite number > 0 (ε at ledger.delta)")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigError(
                "ledger.window_s", self.window_s, "must be a finite number of seconds > 0"
            )
        if not (0.0 < self.delta < 1.0):
            raise ConfigError("ledger.delta", self.delta, "must lie in (0, 1), e.g. 1e-6")

    @classmethod
    def of(
        cls,
        *,
        session: PrivacyLoss | None = None,
        window: PrivacyLoss | None = None,
        window_s: float = float(HOUR_S),
        delta: float = DEFAULT_DELTA,
        composition: str = "pld",
        wall_clock: bool = False,
    ) -> Caps:
        """Caps from typed losses: each cap an (ε, δ) loss at ``delta`` (a cap on pure ε under
        ``composition = "sequential"`` is stated so too, and compared with the pure ε).

        Raises:
            ConfigError: a cap in another measure or at another δ, or any check of the caps.
        """

        def epsilon(field: str, loss: PrivacyLoss | None) -> float | None:
            if loss is None:
                return None
            if loss.measure is not Measure.APPROX or loss.delta != delta or loss.epsilon is None:
                raise ConfigError(field, str(loss), f"must be an (ε, δ) loss at δ = {delta:g}")
            return loss.epsilon

        return cls(
            epsilon("ledger.session_cap", session), epsilon("ledger.window_cap", window),
            float(window_s), float(delta), composition, bool(wall_clock),
        )  # fmt: skip

    def describe(self) -> str:
        """One line for messages."""
        s = "none" if self.session is None else f"ε {self.session:g}"
        w = "none" if self.window is None else f"ε {self.window:g} per {self.window_s:g} s of gaze"
        if self.window is not None and self.wall_clock:
            w += " and of wall-clock time"
        how = ", pure sequential composition" if self.sequential else ""
        return f"session cap {s}, window cap {w}, at δ {self.delta:g}{how}"

    @property
    def sequential(self) -> bool:
        """Caps on pure sequential ε (the conservative view) instead of ε at δ."""
        return self.composition == "sequential"

    def to_json(self) -> str:
        """Canonical JSON, as stored with the session."""
        return json.dumps(
            {"session": self.session, "window": self.window, "window_s": self.window_s,
             "delta": self.delta, "composition": self.composition,
             "wall_clock": self.wall_clock},
            sort_keys=True,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Caps:
        """Inverse of :meth:`to_json`."""
        d = json.loads(text)
        return cls(
            d["session"], d["window"], float(d["window_s"]), float(d["delta"]),
            str(d.get("composition", "pld")), bool(d.get("wall_clock", False)),
        )  # fmt: skip

    def at_least_as_strict_as(self, other: Caps) -> bool:
        """True when every release these caps allow, ``other`` allows too."""
        session_ok = other.session is None or (
            self.session is not None and self.session <= other.session
        )
        window_ok = other.window is None or (
            self.window is not None
            and self.window <= other.window
            and self.window_s >= other.window_s
        )
        composition_ok = self.sequential or not other.sequential
        wall_ok = other.window is None or self.wall_clock or not other.wall_clock
        return session_ok and window_ok and wall_ok and self.delta <= other.delta and composition_ok


def loosened(stored: Caps, wanted: Caps) -> list[tuple[str, object]]:
    """The settings (field, requested value) in which ``wanted`` is looser than ``stored``."""
    out: list[tuple[str, object]] = []
    if stored.session is not None and (wanted.session is None or wanted.session > stored.session):
        out.append(("ledger.session_cap", wanted.session))
    if stored.window is not None and (wanted.window is None or wanted.window > stored.window):
        out.append(("ledger.window_cap", wanted.window))
    if stored.window is not None and wanted.window_s < stored.window_s:
        out.append(("ledger.window_s", wanted.window_s))
    if wanted.delta > stored.delta:
        out.append(("ledger.delta", wanted.delta))
    if stored.sequential and not wanted.sequential:
        out.append(("ledger.composition", wanted.composition))
    if stored.window is not None and stored.wall_clock and not wanted.wall_clock:
        out.append(("ledger.wall_clock", wanted.wall_clock))
    return out


def looser_reason(stored: Caps, wanted: Caps, where: str) -> str:
    """Why a looser configuration is refused, naming the stored and the requested caps."""
    return (
        f"{where} was opened with {stored.describe()}; the requested {wanted.describe()} is "
        "looser and would refill its budget. Configure caps at least as strict, use a new session "
        "id, or open the ledger with allow_cap_increase=True to raise them deliberately"
    )


def reconcile(stored: Caps, wanted: Caps, *, allow_increase: bool, where: str) -> Caps:
    """The caps that bind from now on: stricter configured caps win; looser ones are refused.

    Raises:
        ConfigError: naming the stored and the requested caps, when ``wanted`` is looser than
            ``stored`` and ``allow_increase`` is false.
    """
    loose = loosened(stored, wanted)
    if not loose or allow_increase:
        return wanted
    field, value = loose[0]
    raise ConfigError(field, value, looser_reason(stored, wanted, where))


def merged(*parts: Counts) -> dict[str, int]:
    """The sum of event counts."""
    out: dict[str, int] = {}
    for part in parts:
        for key, n in part.items():
            out[key] = out.get(key, 0) + int(n)
    return out


def windows_to_check(
    new_end: float, window_s: float, later_ends: Iterable[float]
) -> list[tuple[float, float]]:
    """The gaze-time windows ``(start, end]`` that a release ending at ``new_end`` may overfill.

    ``later_ends``: gaze end times of already charged releases in ``[new_end, new_end + W)``.
    """
    ends = sorted({new_end, *(e for e in later_ends if new_end <= e < new_end + window_s)})
    return [(e - window_s, e) for e in ends]


@dataclass(frozen=True, slots=True)
class Figures:
    """What a session has spent, at the caps' δ.

    Attributes:
        epsilon: the session's ε at δ (composition, never above pure sequential).
        pure: sequential pure ε (``inf`` without a pure guarantee).
        window: ε at δ of the trailing window of gaze time.
    """

    epsilon: float
    pure: float
    window: float


def spent(composer: Composer, caps: Caps, counts: Counts, cap: float | None = None) -> float:
    """ε of ``counts`` as the caps measure it: ε at δ, or pure ε under sequential caps.

    A rounded-up report that would exceed ``cap`` is recomputed on exact counts, so a figure
    never shows more than a cap that admission (always exact) kept."""
    if not counts:
        return 0.0
    if caps.sequential:
        return composer.pure(counts)
    eps = composer.epsilon(counts, caps.delta)
    if cap is not None and eps > cap:
        eps = composer.epsilon(counts, caps.delta, exact=True)
    return eps


def fits(composer: Composer, caps: Caps, before: Counts, cost: Counts, cap: float) -> bool:
    """Whether ``before + cost`` stays within ``cap`` as the caps measure it (exact counts;
    under sequential caps an exact comparison of integer micro-ε)."""
    if not caps.sequential:
        return composer.fits(before, cost, cap, caps.delta)
    units = composer.pure_units(merged(before, cost))
    return units is not None and units <= to_units_down(cap, "cap")


def figures(composer: Composer, caps: Caps, session: Counts, window: Counts) -> Figures:
    """The session's figures from its event counts and those of its trailing window."""
    return Figures(
        spent(composer, caps, session, caps.session),
        composer.pure(session) if session else 0.0,
        spent(composer, caps, window, caps.window),
    )


def check(
    composer: Composer,
    caps: Caps,
    session_name: str,
    *,
    session: Counts,
    windows: Iterable[Counts],
    cost: Counts,
    wall: Counts | None = None,
) -> None:
    """Refuse ``cost`` if it would take the session or any given window over its cap.

    Args:
        composer: the accountant.
        caps: the binding caps.
        session_name: for the error message.
        session: the session's counts before this release.
        windows: the counts of every window the release falls in (before it).
        cost: the release's own counts.
        wall: the counts charged in the trailing ``window_s`` of wall-clock time, checked
            against the window cap when ``caps.wall_clock`` (``None``: not checked).

    Raises:
        BudgetExhaustedError: the release does not fit; nothing about it may be written.
    """
    if caps.session is not None and not fits(composer, caps, session, cost, caps.session):
        before = spent(composer, caps, session)
        alone = spent(composer, caps, cost)
        raise BudgetExhaustedError(session_name, alone, caps.session - before, "session")
    if caps.window is not None:
        for counts in windows:
            if not fits(composer, caps, counts, cost, caps.window):
                before = spent(composer, caps, counts)
                alone = spent(composer, caps, cost)
                raise BudgetExhaustedError(
                    session_name, alone, caps.window - before, f"per-{caps.window_s:g}-s-of-gaze"
                )
        if (
            caps.wall_clock
            and wall is not None
            and not fits(composer, caps, wall, cost, caps.window)
        ):
            before = spent(composer, caps, wall)
            alone = spent(composer, caps, cost)
            raise BudgetExhaustedError(
                session_name, alone, caps.window - before, f"per-{caps.window_s:g}-s-of-wall-clock"
            )
